"""Operators profiled on the device at the shapes the operator model prices, then scored against
that model held out (issue 40 item 2): the model's error on a family of measurements it never saw.

    python benchmarks/gpu_operators.py measure --device cuda --model llama-3.1-8b --out FILE.json [--quick]
                                              [--budget SECONDS]
    python benchmarks/gpu_operators.py score FILE.json [--system h200] [--json]

``measure`` needs torch only (and numpy; draftsim's catalog is read from this source tree, installed
or not). In the device's dtype (bfloat16 on CUDA; float32 on a CPU, whose numbers only walk the
code), with random weights at the shapes of a dense catalog model at tp 1:

* **gemm** -- the layer's GEMMs as :func:`draftsim.sim.cost.efficiency.gemm_shapes` names them
  (QKV, O, gate+up, down, then the LM head), ``torch.mm(x, W.t(), out=y)`` (the kernel of
  ``torch.nn.functional.linear``, AIConfigurator's GEMM collector's op), at m = 1, 2, 4, ...,
  4096 tokens;
* **decode attention** -- one query per sequence over ``kv_len`` cached keys, batch 1, 4, 16, 64 x
  kv_len 256, 1024, 4096 (table steps kv_len - 1, all measured points of AIConfigurator's
  generation table), each through every stock ``scaled_dot_product_attention`` backend (flash,
  memory-efficient, cuDNN) in two layouts: ``gqa-packed`` (a KV head's query group as a 'sequence'
  of G queries over that head: the KV cache read once, as FlashAttention-3 tiles it) and
  ``enable_gqa`` (the query heads as they are); the KV cache stored [batch, tokens, KV heads,
  head_dim] as vLLM's paged cache; the fastest variant of a shape is its ``primary`` row (the
  one scored), every other kept beside it;
* **prefill attention** -- causal prompts (batch, tokens) (1, 128) ... (1, 8192), (4, 1024),
  (16, 256), (4, 4096), ``enable_gqa``, every backend, the fastest primary;
* **layer** -- one whole decoder layer of the model built from torch ops (RMSNorm, fused QKV,
  RoPE, the new token's K and V written into a static cache, the fastest decode attention variant
  measured above, O, residual, RMSNorm, fused gate+up, SiLU x up, down, residual), at decode
  shapes (batch, kv_len) (1, 1024), (16, 1024), (64, 1024), (16, 4096), (64, 4096), timed
  **eager** (the forwards launched back to back, as an engine without CUDA graphs runs them) and
  **graph** (the same forwards captured once in a ``torch.cuda.CUDAGraph`` and replayed); its
  kernels per forward are counted with ``torch.profiler``, so (eager - graph) / kernels is the
  launch cost of a kernel outside a graph.

Method: each time is the median over ``repeats`` (7; 5 with ``--quick``) of one timed run of R
launches (R >= 8) divided by R, timed with CUDA events around a CUDA graph of the R launches
(every op but the eager layer), after an eager warm-up (and a side-stream one) of the same R;
the inputs rotate through enough copies (weights for a GEMM, the KV cache for decode attention,
Q/K/V for prefill) that R launches touch at least max(256 MB, 4 x L2) before reusing one, so a
small weight is read from memory as a model's layers read theirs, not from the L2 cache (60 MB on
an H200). A CUDA graph capture that fails falls back to eager launches and says so in the row.
Every kind runs in its own ``try``: a failure is recorded (``errors``, the kind's ``status``) and
the next kind runs; the JSON is rewritten (atomically) after every kind, ``complete`` true at the
end. On a CPU (``--device cpu``) the wall clock replaces the events and nothing is rotated.

Budget: ``--budget`` seconds from start (default 75; 20 with ``--quick``), torch's import and the
CUDA start included; each kind stops at its share of it (cumulative: GEMMs by 45%, decode
attention by 62%, prefill by 75%, the layer by 97%) and records what it skipped. The full grid is
65 GEMMs, 12 decode x 6 variants, 7 prefill x 3 backends and 5 x 2 layer timings: under 30 s of
GPU work on an H200 by the roofline (the LM head at m = 4096, 4.3 TFLOP, the longest, about 5 ms
a launch), the rest graph captures and Python. ``--quick``: m 1, 16, 256, 4096, decode (1, 1024)
and (64, 4096), prefill (1, 2048), the layer at (1, 1024) and (64, 4096). On a CPU the grid is
tiny (m 1 and 8; decode (1, 256), (2, 256); prefill (1, 128); the layer at (1, 256)), for tests.

``score`` (here, on the CPU; needs the ``operators`` extra) prices every primary row with
:class:`~draftsim.sim.cost.operators.OperatorModel` of ``--system`` (a catalog GPU with
AIConfigurator tables; default: the measured device's) and the vLLM tables, **not refitted** on the
measurements: a GEMM as :class:`~draftsim.sim.cost.operators.MeasuredGemm` (the layers' table
lookup, or the efficiency-curve fallback outside it), attention as the attention part of
:meth:`~draftsim.sim.cost.operators.OperatorModel.breakdown` of a one-layer copy of the model
(batch, 1 new token, kv_len - 1 cached; a prefill: tokens new, 0 cached), the layer **graphed** as
the breakdown of a two-layer copy minus a one-layer copy (GEMMs, attention and the estimated
elementwise kernels of one layer; the embedding, LM head and host time cancel), **eager** as that
plus the measured kernels x the model's cost of a kernel launched without a graph
(:attr:`~draftsim.sim.cost.efficiency.Curves.eager_launch`). It prints each row's predicted and
measured time and whether the prediction came from a table or its fallback, then per kind the
median and worst |predicted / measured - 1| and the table / fallback split.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_START = time.perf_counter()


def _import_draftsim() -> None:
    """Make ``draftsim.sim`` importable from this source tree when draftsim is not installed (the
    device machine gets the tree alone): pyproject's package-dir maps ``draftsim.sim`` to ``sim/``."""
    try:
        import draftsim.sim.cost.catalog  # noqa: F401
    except ModuleNotFoundError:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        import draftsim

        if str(ROOT) not in list(draftsim.__path__):
            draftsim.__path__.append(str(ROOT))


_import_draftsim()

from draftsim.sim.cost.catalog import ModelSpec, default_catalog  # noqa: E402
from draftsim.sim.cost.efficiency import gemm_shapes  # noqa: E402
from draftsim.sim.errors import DraftsimError  # noqa: E402
from draftsim.sim.files import atomic_write_json  # noqa: E402

SCHEMA = "draftsim gpu_operators 1"
KINDS = ("gemm", "decode attention", "prefill attention", "layer")
#: the share of --budget by which each kind stops (cumulative, from the script's start)
DEADLINES = {"gemm": 0.45, "decode attention": 0.62, "prefill attention": 0.75, "layer": 0.97}
#: bytes the R launches of one timing touch before reusing an input (at least; 4 x L2 where larger)
ROTATE_BYTES = 256 << 20
MIN_OPS = 8

GRIDS = {
    # (device kind, quick) -> grid
    ("cuda", False): {"m": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
                      "decode": [(b, s) for b in (1, 4, 16, 64) for s in (256, 1024, 4096)],
                      "prefill": [(1, 128), (1, 512), (1, 2048), (1, 8192), (4, 1024), (16, 256), (4, 4096)],
                      "layer": [(1, 1024), (16, 1024), (64, 1024), (16, 4096), (64, 4096)], "repeats": 7},
    ("cuda", True): {"m": (1, 16, 256, 4096), "decode": [(1, 1024), (64, 4096)], "prefill": [(1, 2048)],
                     "layer": [(1, 1024), (64, 4096)], "repeats": 5},
    ("cpu", False): {"m": (1, 8), "decode": [(1, 256), (2, 256)], "prefill": [(1, 128)], "layer": [(1, 256)], "repeats": 3},
}
GRIDS[("cpu", True)] = GRIDS[("cpu", False)]


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _START:6.1f}s] {msg}", flush=True)


def dense_model(name: str) -> ModelSpec:
    """The catalog model ``name``; one this script measures (dense, full attention)."""
    model = default_catalog().model(name)
    if model.experts or model.kv_lora_rank:
        raise DraftsimError(f"--model {name} is a mixture of experts or has latent attention; measure profiles a dense model's "
                            "operators (e.g. llama-3.1-8b, qwen2.5-7b)")
    return model


# -- timing ---------------------------------------------------------------------------------------
class Timer:
    """Seconds per launch of an op: R launches timed together, the median of ``repeats`` timings
    (CUDA: events around a CUDA graph of the R launches, or eager ones; CPU: the wall clock)."""

    def __init__(self, torch, device, repeats: int):
        self.torch, self.device, self.repeats = torch, device, int(repeats)
        self.cuda = device.type == "cuda"

    def measure(self, launch, count: int, graph: bool = True) -> dict:
        """``launch(i)`` issues the i-th op (i < count); its time per launch (ms), every timing and how."""
        torch = self.torch
        for i in range(count):  # eager warm-up: lazy init, autotuning, and any error before a capture
            launch(i)
        if not self.cuda:
            times = []
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                for i in range(count):
                    launch(i)
                times.append((time.perf_counter() - t0) * 1e3 / count)
            return {"ms": statistics.median(times), "ms_all": times, "ops": count, "method": f"wall clock over {count} launches (CPU)"}
        torch.cuda.synchronize()

        def eager():
            for i in range(count):
                launch(i)

        run, how, g = eager, f"CUDA events around {count} eager launches back to back", None
        if graph:
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    eager()
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    eager()
                run, how = g.replay, f"CUDA events around a CUDA graph of {count} launches"
            except Exception as exc:  # noqa: BLE001 - recorded in the row; eager launches instead
                g = None
                torch.cuda.synchronize()
                how += f" (CUDA graph capture failed: {type(exc).__name__}: {str(exc)[:200]})"
        run()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(self.repeats):
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / count)
        del g
        return {"ms": statistics.median(times), "ms_all": times, "ops": count, "method": how}


def copies_for(nbytes: int, rotate: int) -> int:
    """Copies of an input of ``nbytes`` that rotate through at least ``rotate`` bytes."""
    return max(1, math.ceil(rotate / max(nbytes, 1))) if rotate else 1


# -- the measurements -------------------------------------------------------------------------------
class Measure:
    """One run of ``measure``: the document, written after every kind."""

    def __init__(self, args, model: ModelSpec):
        import torch

        self.torch, self.args, self.model = torch, args, model
        self.device = torch.device(args.device)
        if self.device.type == "cuda" and self.device.index is None:  # "cuda": the current device, named by its index
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.kind = self.device.type
        self.dtype = torch.bfloat16 if self.kind == "cuda" else torch.float32
        self.es = 2 if self.dtype == torch.bfloat16 else 4
        self.grid = GRIDS[(self.kind, bool(args.quick))]
        self.timer = Timer(torch, self.device, self.grid["repeats"])
        self.budget = float(args.budget if args.budget is not None else (20.0 if args.quick else 75.0))
        l2 = 0
        if self.kind == "cuda":
            torch.cuda.set_device(self.device)  # streams, graphs and synchronize act on the current device
            props = torch.cuda.get_device_properties(self.device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0)
            name, memory = torch.cuda.get_device_name(self.device), int(props.total_memory)
        else:
            name, memory = platform.processor() or platform.machine(), 0
        self.rotate = max(ROTATE_BYTES, 4 * l2) if self.kind == "cuda" else 0
        self.best_decode: dict[tuple[int, int], dict] = {}
        m = model
        self.doc = {
            "schema": SCHEMA, "complete": False, "model": m.name,
            "shape": {"hidden": m.hidden, "intermediate": m.intermediate, "heads": m.heads, "kv_heads": m.kv_heads,
                      "head_dim": m.head_dim, "vocab": m.vocab, "mlp": m.mlp, "tp": 1},
            "device": name, "device_type": self.kind, "memory_bytes": memory, "l2_bytes": l2,
            "torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
            "cudnn": (torch.backends.cudnn.version() if self.kind == "cuda" else None),
            "dtype": str(self.dtype).replace("torch.", ""), "quick": bool(args.quick), "budget_s": self.budget,
            "command": " ".join(["python", "benchmarks/gpu_operators.py", *sys.argv[1:]]),
            "method": {"timing": "median over repeats of (one timing of R launches) / R; CUDA events around a CUDA graph of the R "
                                 "launches after eager and side-stream warm-ups (the eager layer: the R forwards launched back to back); "
                                 "CPU: wall clock",
                       "repeats": self.grid["repeats"], "min_ops": MIN_OPS, "rotate_bytes": self.rotate,
                       "rotation": "inputs rotate through enough copies that R launches read at least rotate_bytes before reusing "
                                   "one (weights for a GEMM, the KV cache for decode, Q/K/V for prefill): not L2-resident",
                       "weights": "random (normal, std 0.02)", "kv_cache_layout": "[batch, tokens, kv_heads, head_dim] (vLLM's)"},
            "kinds": {}, "rows": [], "errors": [],
        }
        self.rows, self.errors = self.doc["rows"], self.doc["errors"]

    # helpers
    def left(self, kind: str) -> float:
        return DEADLINES[kind] * self.budget - (time.perf_counter() - _START)

    def randn(self, *shape):
        return self.torch.randn(*shape, device=self.device, dtype=self.dtype) * 0.02

    def write(self) -> None:
        self.doc["seconds"] = round(time.perf_counter() - _START, 2)
        atomic_write_json(self.args.out, self.doc)

    def add(self, row: dict) -> None:
        """Keep a row and rewrite the file (a run cut short keeps every row it timed)."""
        self.rows.append(row)
        self.write()

    def fail(self, kind: str, shape: dict, exc: BaseException) -> None:
        self.errors.append({"kind": kind, **shape, "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
        log(f"{kind} {shape}: FAILED {type(exc).__name__}: {str(exc)[:160]}")
        self.write()

    def run(self) -> None:
        import warnings

        torch = self.torch
        self.write()
        # a backend refusing a shape warns before it raises; the error is recorded in the file
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\..*")
        with torch.inference_mode():
            for kind, fn in zip(KINDS, (self.gemm, self.decode, self.prefill, self.layer)):
                t0 = time.perf_counter()
                status = {"status": "done", "skipped": []}
                self.doc["kinds"][kind] = status
                try:
                    fn(status)
                except Exception as exc:  # noqa: BLE001 - recorded; the next kind runs
                    status["status"] = "error"
                    self.fail(kind, {}, exc)
                if status["skipped"] and status["status"] == "done":
                    status["status"] = "partial"
                status["seconds"] = round(time.perf_counter() - t0, 2)
                self.free()
                self.write()
        self.doc["complete"] = True
        self.write()
        log(f"wrote {self.args.out}: {len(self.rows)} rows, {len(self.errors)} errors")

    def free(self) -> None:
        if self.kind == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()

    def sdpa_backends(self):
        """(name, backend) of the stock SDPA backends to try; (``default``, None) on a CPU."""
        if self.kind != "cuda":
            return [("default", None)]
        from torch.nn.attention import SDPBackend

        return [(n, getattr(SDPBackend, n)) for n in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION") if hasattr(SDPBackend, n)]

    def with_backend(self, backend):
        import contextlib

        if backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel([backend])

    # kinds
    def gemm(self, status: dict) -> None:
        torch = self.torch
        for name, n, k in gemm_shapes(self.model, 1):
            copies = copies_for(n * k * self.es, self.rotate)
            try:
                W = self.randn(copies, n, k)
            except Exception as exc:  # noqa: BLE001
                self.fail("gemm", {"name": name, "n": n, "k": k}, exc)
                continue
            wt = [W[c].t() for c in range(copies)]
            count = max(MIN_OPS, copies)
            for m in self.grid["m"]:
                shape = {"name": name, "m": m, "n": n, "k": k}
                if self.left("gemm") <= 0:
                    status["skipped"].append(shape)
                    continue
                try:
                    x, y = self.randn(m, k), torch.empty(m, n, device=self.device, dtype=self.dtype)
                    r = self.timer.measure(lambda i, x=x, y=y, wt=wt: torch.mm(x, wt[i % len(wt)], out=y), count)
                    self.add({"kind": "gemm", **shape, **r, "copies": copies, "op": "torch.mm(x, W.t(), out=y)", "primary": True})
                    log(f"gemm {name} m={m} n={n} k={k}: {r['ms']:.4f} ms")
                except Exception as exc:  # noqa: BLE001
                    self.fail("gemm", shape, exc)
                finally:
                    x = y = None
            W = wt = None
            self.free()

    def _attention_variants(self, kind: str, shape: dict, inputs: dict[str, tuple], count: int, extra: dict) -> None:
        """Time every (layout, backend) of one attention shape; mark the fastest primary."""
        torch = self.torch
        F = torch.nn.functional
        timed = []
        for layout, (q, k, v, kw) in inputs.items():
            for bname, backend in self.sdpa_backends():
                variant = {"layout": layout, "backend": bname}
                try:
                    with self.with_backend(backend):
                        r = self.timer.measure(lambda i, q=q, k=k, v=v, kw=kw: F.scaled_dot_product_attention(
                            q[i % len(q)], k[i % len(k)], v[i % len(v)], **kw), count)
                    row = {"kind": kind, **shape, **variant, **r, **extra, "op": f"torch.nn.functional.scaled_dot_product_attention({kw})",
                           "primary": False}
                    timed.append(row)
                    self.add(row)
                    log(f"{kind} {shape} {layout} {bname}: {r['ms']:.4f} ms")
                except Exception as exc:  # noqa: BLE001
                    self.fail(kind, {**shape, **variant}, exc)
        if timed:
            best = min(timed, key=lambda row: row["ms"])
            best["primary"] = True
            self.write()
            return best
        return None

    def decode(self, status: dict) -> None:
        m = self.model
        H, KV, D = m.heads, m.kv_heads, m.head_dim
        G = H // KV
        for B, S in self.grid["decode"]:
            shape = {"batch": B, "kv_len": S, "heads": H, "kv_heads": KV, "head_dim": D}
            if self.left("decode attention") <= 0:
                status["skipped"].append(shape)
                continue
            try:
                copies = copies_for(2 * B * S * KV * D * self.es, self.rotate)
                cache = self.randn(2, copies, B, S, KV, D)  # [k|v, copy, batch, tokens, kv heads, head_dim]
                ks = [cache[0, c].transpose(1, 2) for c in range(copies)]  # [B, KV, S, D] views of the vLLM layout
                vs = [cache[1, c].transpose(1, 2) for c in range(copies)]
                packed = [self.randn(B, G, KV, D).transpose(1, 2)]  # a KV head's query group as G queries: [B, KV, G, D]
                plain = [self.randn(B, 1, H, D).transpose(1, 2)]  # [B, H, 1, D]
                inputs = {"gqa-packed": (packed, ks, vs, {}), "enable_gqa": (plain, ks, vs, {"enable_gqa": True})}
                best = self._attention_variants("decode attention", shape, inputs, max(MIN_OPS, copies), {"copies": copies})
                if best is not None:
                    self.best_decode[(B, S)] = best
            except Exception as exc:  # noqa: BLE001
                self.fail("decode attention", shape, exc)
            cache = ks = vs = packed = plain = inputs = None
            self.free()

    def prefill(self, status: dict) -> None:
        m = self.model
        H, KV, D = m.heads, m.kv_heads, m.head_dim
        for B, N in self.grid["prefill"]:
            shape = {"batch": B, "tokens": N, "heads": H, "kv_heads": KV, "head_dim": D}
            if self.left("prefill attention") <= 0:
                status["skipped"].append(shape)
                continue
            try:
                copies = copies_for(B * N * (2 * H + 2 * KV) * D * self.es, self.rotate)
                q = [self.randn(B, N, H, D).transpose(1, 2) for _ in range(copies)]
                kv = self.randn(2, copies, B, N, KV, D)
                k = [kv[0, c].transpose(1, 2) for c in range(copies)]
                v = [kv[1, c].transpose(1, 2) for c in range(copies)]
                inputs = {"enable_gqa": (q, k, v, {"is_causal": True, "enable_gqa": True})}
                self._attention_variants("prefill attention", shape, inputs, max(MIN_OPS, copies), {"copies": copies})
            except Exception as exc:  # noqa: BLE001
                self.fail("prefill attention", shape, exc)
            q = kv = k = v = inputs = None
            self.free()

    def layer(self, status: dict) -> None:
        torch = self.torch
        backends = dict(self.sdpa_backends())
        for B, S in self.grid["layer"]:
            shape = {"batch": B, "kv_len": S}
            if self.left("layer") <= 0:
                status["skipped"].append(shape)
                continue
            try:
                best = self.best_decode.get((B, S))
                layout, bname = (best["layout"], best["backend"]) if best else ("gqa-packed", next(iter(backends)))
                layer = DecodeLayer(torch, self, B, S, layout)
                kernels, how = self.count_kernels(layer)
                common = {"kind": "layer", **shape, "attention": {"layout": layout, "backend": bname}, "kernels": kernels,
                          "kernels_method": how, "primary": True,
                          "op": "one decoder layer from torch ops: rms_norm, fused QKV, RoPE, K/V written into a static cache, "
                                "SDPA, O, residual, rms_norm, fused gate+up, SiLU x up, down, residual"}
                with self.with_backend(backends.get(bname)):
                    for mode in ("eager", "graph"):
                        if self.kind != "cuda" and mode == "graph":
                            continue
                        try:
                            r = self.timer.measure(lambda i, layer=layer: layer(), MIN_OPS, graph=(mode == "graph"))
                            self.add({**common, "mode": mode, **r})
                            log(f"layer {shape} {mode}: {r['ms']:.4f} ms ({kernels} kernels)")
                        except Exception as exc:  # noqa: BLE001
                            self.fail("layer", {**shape, "mode": mode}, exc)
            except Exception as exc:  # noqa: BLE001
                self.fail("layer", shape, exc)
            layer = None
            self.free()

    def count_kernels(self, layer) -> tuple[int | None, str]:
        """Kernels (CUDA) or top-level operators (CPU) one forward launches, by torch.profiler."""
        torch = self.torch
        try:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.kind == "cuda" else [])
            forwards = 3
            layer()
            with profile(activities=acts) as prof:
                for _ in range(forwards):
                    layer()
                if self.kind == "cuda":
                    torch.cuda.synchronize()
            events = prof.events()
            if self.kind == "cuda":
                n = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
                what = "CUDA kernels and memory ops per forward (torch.profiler)"
            else:
                n = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.cpu_parent is None
                        and e.name.startswith("aten::"))
                what = "top-level aten operators per forward (torch.profiler, CPU)"
            if n <= 0 or n % forwards:
                return (None if n <= 0 else round(n / forwards)), what + f" ({n} over {forwards} forwards)"
            return n // forwards, what
        except Exception as exc:  # noqa: BLE001 - the count is optional
            return None, f"not counted: {type(exc).__name__}: {str(exc)[:200]}"


class DecodeLayer:
    """One dense decoder layer's decode step (B sequences, one new token each over S - 1 cached),
    from torch ops on preallocated tensors (so a CUDA graph can replay it): the KV cache
    [B, S, KV, D] with the new token's slot S - 1 written each call."""

    def __init__(self, torch, ms: Measure, B: int, S: int, layout: str):
        m = ms.model
        self.torch, self.F = torch, torch.nn.functional
        self.B, self.S, self.layout = B, S, layout
        self.h, self.H, self.KV, self.D = m.hidden, m.heads, m.kv_heads, m.head_dim
        up = (m.mlp_matrices - 1) * m.intermediate
        self.gated = m.mlp == "gated"
        self.I = m.intermediate
        self.w_qkv = ms.randn((self.H + 2 * self.KV) * self.D, self.h)
        self.w_o = ms.randn(self.h, self.H * self.D)
        self.w_up = ms.randn(up, self.h)
        self.w_down = ms.randn(self.h, m.intermediate)
        self.n1 = torch.ones(self.h, device=ms.device, dtype=ms.dtype)
        self.n2 = torch.ones(self.h, device=ms.device, dtype=ms.dtype)
        self.cache = ms.randn(2, B, S, self.KV, self.D)
        self.x = ms.randn(B, self.h)
        pos = S - 1
        inv = 1.0 / (500000.0 ** (torch.arange(0, self.D, 2, device=ms.device, dtype=torch.float32) / self.D))
        ang = torch.cat([pos * inv, pos * inv])
        self.cos, self.sin = ang.cos().to(ms.dtype), ang.sin().to(ms.dtype)
        self.eps = 1e-5

    def norm(self, x, w):
        F = self.F
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (self.h,), w, self.eps)
        v = x.float()
        return (v * self.torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def __call__(self):
        torch, F = self.torch, self.F
        B, H, KV, D = self.B, self.H, self.KV, self.D
        x = self.x
        qkv = F.linear(self.norm(x, self.n1), self.w_qkv)
        qk = qkv[:, : (H + KV) * D].reshape(B, H + KV, D)
        half = D // 2
        rot = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
        qk = qk * self.cos + rot * self.sin
        q, k = qk[:, :H], qk[:, H:]
        v = qkv[:, (H + KV) * D:].view(B, KV, D)
        self.cache[0, :, self.S - 1].copy_(k)
        self.cache[1, :, self.S - 1].copy_(v)
        keys, values = self.cache[0].transpose(1, 2), self.cache[1].transpose(1, 2)  # [B, KV, S, D]
        if self.layout == "gqa-packed":
            a = F.scaled_dot_product_attention(q.reshape(B, KV, H // KV, D), keys, values)
        else:
            a = F.scaled_dot_product_attention(q.reshape(B, H, 1, D), keys, values, enable_gqa=True)
        x = x + F.linear(a.reshape(B, H * D), self.w_o)
        u = F.linear(self.norm(x, self.n2), self.w_up)
        if self.gated:
            g, u = u.chunk(2, dim=-1)
            u = F.silu(g) * u
        else:
            u = F.gelu(u)
        return x + F.linear(u, self.w_down)


# -- command line -------------------------------------------------------------------------------------
def _measure(args) -> int:
    model = dense_model(args.model)
    dev = args.device
    if not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise DraftsimError(f"--device {dev!r}: use cpu, cuda or cuda:N")
    if args.budget is not None and not (math.isfinite(args.budget) and args.budget > 0):
        raise DraftsimError(f"--budget {args.budget}: seconds, a number > 0")
    out = Path(args.out)
    if out.exists() and out.is_dir():
        raise DraftsimError(f"--out {out} is a folder; name the JSON file to write")
    try:
        import torch
    except ImportError:
        raise DraftsimError("measure needs torch (pip install 'draftsim[real]')") from None
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise DraftsimError(f"--device {dev}: torch {torch.__version__} sees no CUDA device; use --device cpu")
    if dev.startswith("cuda:") and int(dev[5:]) >= torch.cuda.device_count():
        raise DraftsimError(f"--device {dev}: {torch.cuda.device_count()} CUDA devices")
    log(f"measure {model.name} on {dev} (torch {torch.__version__}), budget {args.budget or ('20' if args.quick else '75')} s")
    Measure(args, model).run()
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="profile the operators on a device (torch)")
    m.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    m.add_argument("--model", default="llama-3.1-8b", help="a dense catalog model (default llama-3.1-8b)")
    m.add_argument("--out", required=True, help="the JSON file to write")
    m.add_argument("--quick", action="store_true", help="a smaller grid (about 20 s on an H200)")
    m.add_argument("--budget", type=float, help="seconds from start (default 75; 20 with --quick)")
    s = sub.add_parser("score", help="the operator model's error on a measured file (not refitted)")
    s.add_argument("file", help="a JSON file written by measure")
    s.add_argument("--system", help="catalog GPU whose tables price the rows (h100-sxm, h200, a100-80g; default: the measured device's)")
    s.add_argument("--json", action="store_true", help="print the scores as JSON")
    s.add_argument("--figure", metavar="OUT.png", help="also draw predicted against measured time, one panel per kind")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _measure(args) if args.command == "measure" else _score(args)
    except DraftsimError as e:
        print(f"gpu_operators: {e}", file=sys.stderr)
        return 2


# -- score ----------------------------------------------------------------------------------------------
#: a measured device's name -> the catalog GPU whose tables price it
DEVICE_SYSTEMS = (("H200", "h200"), ("H100", "h100-sxm"), ("A100", "a100-80g"))
#: the layer's kernels per forward the operator model itself counts (4 GEMMs, attention, 2 add+RMSNorm
#: and the activation: sim/cost/operators.py), where the file has no count of its own
MODEL_LAYER_KERNELS = 8
SCORED = ("gemm", "decode attention", "prefill attention", "layer eager", "layer graph")


def load_measured(path: str) -> dict:
    """A file ``measure`` wrote (validated: its schema, model and rows)."""
    import json

    p = Path(path)
    if not p.is_file():
        raise DraftsimError(f"{path}: no such file (a JSON file written by gpu_operators.py measure)")
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftsimError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise DraftsimError(f"{path}: not a file of gpu_operators.py measure (schema {SCHEMA!r})")
    if not isinstance(doc.get("rows"), list) or not any(isinstance(r, dict) and r.get("primary") for r in doc["rows"]):
        raise DraftsimError(f"{path} holds no measured rows (see its 'errors': {len(doc.get('errors') or [])})")
    return doc


def system_for(doc: dict, system: str | None, systems) -> str:
    """The catalog GPU that prices the file: ``--system``, else the one its device name says."""
    from draftsim.sim.errors import unknown

    if system is None:
        name = str(doc.get("device", "")).upper()
        system = next((s for key, s in DEVICE_SYSTEMS if key in name), None)
        if system is None:
            raise DraftsimError(f"the file's device {doc.get('device')!r} has no AIConfigurator tables of its own; name --system "
                                f"({', '.join(systems)})")
    if system not in systems:
        raise unknown("system", system, list(systems))
    return system


class Predictor:
    """The operator model's price of each measured row, not refitted: the code paths of
    sim/cost/operators.py (see the module docstring)."""

    def __init__(self, model: ModelSpec, system: str):
        from dataclasses import replace

        from draftsim.sim.cost.operators import MeasuredGemm, OperatorModel

        hw = default_catalog().hardware_spec(system)
        kw = {"overhead": 0.0, "overhead_per_layer": 0.0, "check_memory": False}
        self.model = model
        self.one = OperatorModel(replace(model, layers=1), hw, **kw)
        self.two = OperatorModel(replace(model, layers=2), hw, **kw)
        self.gemm_class = MeasuredGemm
        self.shapes = {(name, n, k) for name, n, k in gemm_shapes(model, 1)}
        #: seconds the model adds to a kernel launched without a CUDA graph (efficiency.Curves.eager_launch)
        self.eager_launch = float(self.one.curves.eager_launch)
        self.name = self.one.name

    def gemm(self, row: dict) -> tuple[float, bool, str]:
        name, m, n, k = row["name"], int(row["m"]), int(row["n"]), int(row["k"])
        part = self.gemm_class(name, k, n, self.one, lm_head=(name == "lm_head")).part(m)
        note = part.note if (name, n, k) in self.shapes else f"not {self.model.name}'s {name} shape; " + part.note
        return part.seconds, part.measured, note

    def attention(self, row: dict) -> tuple[float, bool, str]:
        if row["kind"] == "decode attention":  # one new token over kv_len - 1 cached (the table's step)
            part = self._part(self.one, int(row["batch"]), 1, int(row["kv_len"]) - 1, "attention")
        else:
            part = self._part(self.one, int(row["batch"]), int(row["tokens"]), 0, "attention")
        return part.seconds, part.measured, part.note

    def layer(self, row: dict) -> tuple[float, float, bool, str]:
        """(graphed, eager) seconds of one layer: two layers' GEMMs, attention and elementwise minus one's."""
        B, ctx = int(row["batch"]), int(row["kv_len"]) - 1
        keys = ("gemm layers", "attention", "elementwise")
        two = {p.part: p for p in self.two.breakdown(B, 1, ctx) if p.part in keys}
        one = {p.part: p for p in self.one.breakdown(B, 1, ctx) if p.part in keys}
        graphed = sum(two[k].seconds - one[k].seconds for k in keys)
        measured = two["gemm layers"].measured and two["attention"].measured
        notes = [f"{k}: {two[k].note}" for k in keys[:2] if two[k].note] + ["elementwise estimated (AIConfigurator's memory-op formula)"]
        kernels = row.get("kernels")
        if not isinstance(kernels, int) or kernels <= 0:
            kernels = MODEL_LAYER_KERNELS
            notes.append(f"kernels not counted: the model's {MODEL_LAYER_KERNELS}")
        eager = graphed + kernels * self.eager_launch
        return graphed, eager, measured, "; ".join(notes)

    @staticmethod
    def _part(model, batch: int, new: int, context: int, part: str):
        return next(p for p in model.breakdown(batch, new, context) if p.part == part)


def _shape_text(row: dict) -> str:
    if row["kind"] == "gemm":
        return f"{row['name']} m={row['m']} n={row['n']} k={row['k']}"
    if row["kind"] == "prefill attention":
        return f"B={row['batch']} tokens={row['tokens']} {row.get('backend', '')}"
    if row["kind"] == "decode attention":
        return f"B={row['batch']} kv={row['kv_len']} {row.get('layout', '')} {row.get('backend', '')}"
    return f"B={row['batch']} kv={row['kv_len']} {row.get('kernels')} kernels"


def score_rows(doc: dict, predictor: Predictor) -> list[dict]:
    """Every primary row with its prediction: kind (layer rows as ``layer eager`` / ``layer graph``),
    shape, measured and predicted ms, their ratio, table or fallback, and why."""
    out = []
    for row in doc["rows"]:
        if not isinstance(row, dict) or not row.get("primary"):
            continue
        kind = row.get("kind")
        try:
            if kind == "gemm":
                sec, measured, note = predictor.gemm(row)
            elif kind in ("decode attention", "prefill attention"):
                sec, measured, note = predictor.attention(row)
            elif kind == "layer":
                graphed, eager, measured, note = predictor.layer(row)
                sec = graphed if row.get("mode") == "graph" else eager
                kind = f"layer {row.get('mode')}"
            else:
                continue
        except (KeyError, TypeError, ValueError) as exc:
            raise DraftsimError(f"a {kind} row of the file lacks a field or holds a bad value ({type(exc).__name__}: {exc})") from None
        ms, pred = float(row["ms"]), sec * 1e3
        out.append({"kind": kind, "shape": _shape_text(row), "measured_ms": ms, "predicted_ms": pred,
                    "ratio": pred / ms if ms > 0 else float("nan"), "source": "table" if measured else "fallback", "note": note,
                    "row": {k: v for k, v in row.items() if k not in ("ms_all", "op", "method", "kernels_method")}})
    return out


def summarise(scored: list[dict]) -> list[dict]:
    """Per kind: rows, median and worst |predicted / measured - 1|, and the same for its table and fallback rows."""
    import numpy as np

    def stats(rows):
        err = np.array([abs(r["ratio"] - 1) for r in rows if np.isfinite(r["ratio"])])
        return {"rows": len(rows), "median": float(np.median(err)) if len(err) else None, "worst": float(err.max()) if len(err) else None}

    out = []
    for kind in SCORED:
        rows = [r for r in scored if r["kind"] == kind]
        if not rows:
            continue
        out.append({"kind": kind, **stats(rows), "table": stats([r for r in rows if r["source"] == "table"]),
                    "fallback": stats([r for r in rows if r["source"] == "fallback"])})
    return out


def launch_costs(doc: dict) -> list[dict]:
    """Per layer shape measured in both modes: (eager - graph) / kernels, the measured cost of a kernel
    launched outside a CUDA graph."""
    by = {}
    for r in doc["rows"]:
        if isinstance(r, dict) and r.get("kind") == "layer":
            by.setdefault((r["batch"], r["kv_len"]), {})[r.get("mode")] = r
    out = []
    for (B, S), modes in sorted(by.items()):
        if "eager" in modes and "graph" in modes and isinstance(modes["eager"].get("kernels"), int) and modes["eager"]["kernels"] > 0:
            e, g, n = modes["eager"]["ms"], modes["graph"]["ms"], modes["eager"]["kernels"]
            out.append({"batch": B, "kv_len": S, "eager_ms": e, "graph_ms": g, "kernels": n, "us_per_kernel": (e - g) * 1e3 / n})
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _score(args) -> int:
    import json

    doc = load_measured(args.file)
    model = dense_model(str(doc.get("model")))
    try:
        from draftsim.sim.cost.operators import SYSTEMS
    except ImportError as exc:
        raise DraftsimError(f"score needs the operators extra (pip install 'draftsim[operators]'): {exc}") from None
    system = system_for(doc, args.system, SYSTEMS)
    predictor = Predictor(model, system)
    scored = score_rows(doc, predictor)
    summary = summarise(scored)
    launches = launch_costs(doc)
    result = {"file": str(args.file), "device": doc.get("device"), "torch": doc.get("torch"), "dtype": doc.get("dtype"),
              "model": model.name, "system": system, "operator_model": predictor.name, "refitted": False,
              "assumed_us_per_eager_kernel": predictor.eager_launch * 1e6, "measured_launch": launches, "summary": summary,
              "rows": scored, "errors": doc.get("errors") or [], "complete": bool(doc.get("complete"))}
    if args.figure:
        figure(result, args.figure)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{model.name}: measured on {doc.get('device')} (torch {doc.get('torch')}, {doc.get('dtype')}"
          f"{'' if doc.get('complete') else ', INCOMPLETE run'}; {len(doc.get('errors') or [])} errors in the file)")
    print(f"predicted by {predictor.name}; not refitted on these measurements")
    print(f"\n{'kind':<18} {'shape':<44} {'measured ms':>12} {'predicted ms':>13} {'pred/meas':>9}  source")
    for r in scored:
        print(f"{r['kind']:<18} {r['shape']:<44} {r['measured_ms']:>12.4f} {r['predicted_ms']:>13.4f} {r['ratio']:>9.3f}  {r['source']}")
    print(f"\n{'kind':<18} {'rows':>4} {'median |p/m-1|':>15} {'worst':>8}   {'table rows: n, median':<24} fallback rows: n, median")
    for s in summary:
        t, f = s["table"], s["fallback"]
        print(f"{s['kind']:<18} {s['rows']:>4} {_pct(s['median']):>15} {_pct(s['worst']):>8}   {t['rows']:>3}, {_pct(t['median']):<19} "
              f"{f['rows']:>3}, {_pct(f['median'])}")
    print(f"\na kernel launched without a CUDA graph: the model assumes +{predictor.eager_launch * 1e6:.2f} us "
          "(the all-reduce's eager rows over its graph rows)")
    for x in launches:
        print(f"  measured at B={x['batch']} kv={x['kv_len']}: (eager {x['eager_ms']:.4f} - graph {x['graph_ms']:.4f} ms) / "
              f"{x['kernels']} kernels = {x['us_per_kernel']:.2f} us")
    notes = sorted({r["note"] for r in scored if r["source"] == "fallback" and r["note"]})
    if notes:
        print("\nwhy rows left their table:")
        for n in notes:
            print(f"  {n}")
    return 0


def figure(result: dict, path) -> None:
    """Predicted against measured time per operator (log-log, the diagonal where they agree), a
    panel per kind with its median |error|; table rows filled, fallback rows hollow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [s["kind"] for s in result["summary"]]
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.3 * len(kinds), 3.4), squeeze=False)
    for ax, s in zip(axes[0], result["summary"]):
        rows = [r for r in result["rows"] if r["kind"] == s["kind"]]
        for source, face in (("table", "C0"), ("fallback", "none")):
            pts = [(r["measured_ms"], r["predicted_ms"]) for r in rows if r["source"] == source]
            if pts:
                m, q = zip(*pts)
                ax.scatter(m, q, s=14, facecolors=face, edgecolors="C0", label=source)
        lo = min(min(r["measured_ms"], r["predicted_ms"]) for r in rows)
        hi = max(max(r["measured_ms"], r["predicted_ms"]) for r in rows)
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{s['kind']}: median {_pct(s['median'])}", fontsize=9)
        ax.set_xlabel("measured (ms)")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("operator model (ms)")
    fig.suptitle(f"{result['model']} operators on {result['device']}: {result['operator_model']}, not refitted", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
