"""Measuring forward times of real models on this machine (``draftsim profile``).

:func:`profile_model` times a model's forward call over a grid of batch sizes × new tokens
per sequence × context lengths (the KV cache is filled once per (batch, context) and cropped
back after every timed call), with warm-up calls, repeats, the median and the spread (half the
inter-quartile range), and returns a :class:`draftsim.sim.cost.ProfileCost`. :func:`drafter_seconds`
times Max-Gram's and a bigram table's proposals per token. :func:`probe_hardware` measures
this machine's memory bandwidth (streaming reads and matrix–vector products) and matmul
FLOP/s per dtype: a ``local-cpu`` hardware entry for the roofline.

Time is wall-clock (``time.perf_counter``) around each call; on a machine shared with other
work the medians absorb short interruptions, the spread shows how noisy it was.
"""

from __future__ import annotations

import os
import platform
import time
from datetime import datetime, timezone
from typing import Callable, Sequence

import numpy as np

from ..sim.cost.catalog import HardwareSpec, ModelSpec
from ..sim.cost.profile import PATHS, ProfileCost
from ..sim.errors import DraftsimError, as_count
from .models import cache_arg, sync

__all__ = ["PATHS", "check_path_grid", "machine_fingerprint", "model_fingerprint", "model_spec", "profile_model", "drafter_seconds", "probe_hardware"]


def _torch():
    import torch

    return torch


def machine_fingerprint(device: str = "cpu") -> dict:
    """What identifies this machine for a profile: processor model, cores, device."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    fp = {"cpu": cpu, "cores": os.cpu_count(), "device": device.split(":")[0], "threads": _torch().get_num_threads()}
    if device.startswith("cuda"):
        torch = _torch()
        fp["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return fp


def model_spec(loaded) -> ModelSpec:
    """The roofline's :class:`ModelSpec` of a loaded HF model (read from its config)."""
    cfg = loaded.model.config
    heads = cfg.num_attention_heads
    return ModelSpec(
        name=loaded.name, layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads, head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        vocab=cfg.vocab_size, tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        max_context=int(getattr(cfg, "max_position_embeddings", 0) or 0), source=loaded.source,
    )


def model_fingerprint(loaded) -> dict:
    """What identifies a model for a profile: its name, dtype and architecture."""
    return {"name": loaded.name, "dtype": loaded.dtype, "architecture": model_spec(loaded).architecture}


def _stats(samples: Sequence[float]) -> tuple[float, float]:
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return float(med), float((q3 - q1) / 2)


def _check_grid(name: str, values, minimum: int) -> list[int]:
    arr = np.unique(as_count(name, list(values), minimum=minimum))
    if arr.size == 0:
        raise DraftsimError(f"{name} needs at least one value")
    return [int(v) for v in arr]


#: What a profile times: :data:`draftsim.sim.cost.profile.PATHS` (defined beside the profile file, whose
#: fingerprint records it, so that the command line names them without importing this module).


class _ModelPath:
    """The model's forward on a ``DynamicCache`` filled with ``c`` tokens per row; each timed
    call is cropped away after it."""

    def __init__(self, loaded, b: int, ids_c):
        from transformers import DynamicCache

        self.loaded, self.model, self.cache = loaded, loaded.model, None
        if ids_c is not None:
            self.cache = DynamicCache()
            with _torch().inference_mode():
                self.model(ids_c, use_cache=True, **{cache_arg(self.model): self.cache})

    def feed(self, ids):
        return ids

    def call(self, ids, last_row: bool) -> None:
        extra = {"logits_to_keep": 1} if last_row else {}
        with _torch().inference_mode():
            self.model(ids, use_cache=self.cache is not None, **{cache_arg(self.model): self.cache}, **extra)

    def undo(self, n: int) -> "_ModelPath":
        if self.cache is not None:
            self.cache.crop(-n)  # drop the n tokens just added (transformers 5: a negative count)
        return self

    def grow(self, ids) -> "_ModelPath":
        """Extend the context by ``ids`` (b × more tokens): one untimed call."""
        if self.cache is None:
            return _ModelPath(self.loaded, ids.shape[0], ids)
        with _torch().inference_mode():
            self.model(ids, use_cache=True, **{cache_arg(self.model): self.cache})
        return self

    def release(self) -> None:
        self.cache = None


class _ServerPath:
    """The serving loop's forward (:class:`draftsim.realrun.kvcache.BatchKV`) on rows holding ``c``
    tokens each; each timed call is rolled back and trimmed as the server does after a
    rejection. Without a context every call gets a fresh cache, as the server's prefills do."""

    #: CUDA graphs for the cache's shapes: None, the model's setting (graphs on a CUDA device); False, eager
    graphs: bool | None = None

    def __init__(self, loaded, b: int, ids_c):
        from .kvcache import make_kv

        self.loaded, self.b, self.held = loaded, b, None
        self.kv = make_kv(loaded, b, graphs=self.graphs)  # a static cache when the model has static_tokens (path server-static)
        self.kv.add_rows(b)
        if ids_c is not None:
            self.held = ids_c.tolist()
            self._fill(self.held)

    def _fill(self, feeds) -> None:
        """Feed context tokens, untimed; through a static cache eagerly (no CUDA graph captured
        for a shape met once)."""
        from .statickv import StaticKV

        if isinstance(self.kv, StaticKV):
            self.kv.forward(feeds, [0] * self.b, graph=False)
        else:
            self.kv.forward(feeds, [0] * self.b)

    def grow(self, ids) -> "_ServerPath":
        """Extend the context by ``ids`` (b × more tokens): the rows keep what they hold and
        compute only the new tokens, so a grid's contexts cost one fill of the longest per batch
        size and one cache (its buffers and CUDA graphs) serves them all, where a fresh cache
        per context refilled it and captured its fill as a graph: on an H200 in float32, 378
        grid points did not finish in 537 s."""
        if self.held is None:
            self.release()
            return type(self)(self.loaded, self.b, ids)
        more = ids.tolist()
        self._fill(more)
        self.held = [h + m for h, m in zip(self.held, more)]
        return self

    def feed(self, ids):
        return ids.tolist()  # the server's feeds are token lists

    def call(self, feeds, last_row: bool) -> None:
        self.kv.forward(feeds, [1 if last_row else len(feeds[0])] * self.b)

    def undo(self, n: int) -> "_ServerPath":
        if self.held is None:
            self.release()
            return type(self)(self.loaded, self.b, None)
        for r, held in enumerate(self.held):
            self.kv.rollback(r, held, len(held))
        self.kv.trim()
        return self

    def release(self) -> None:
        """Hand the cache back (a static one is reused by the next caller of its batch size)."""
        from .kvcache import release_kv

        release_kv(self.kv)


def check_path_grid(path: str, batch: Sequence[int], context: Sequence[int]) -> None:
    """Refuse a grid the path cannot time: ``server-prefill`` is one prompt at context 0."""
    if path == "server-prefill" and (list(batch) != [1] or list(context) != [0]):
        raise DraftsimError(f"--path server-prefill times a joiner's prefill, one prompt at context 0: give --batch 1 --context 0 "
                            f"(got --batch {','.join(map(str, batch))} --context {','.join(map(str, context))})")


class _PrefillPath(_ServerPath):
    """Path ``server-prefill``: every call a fresh one-row static cache, run eagerly, as the
    server prefills a joiner (:meth:`draftsim.realrun.serving.Server._prefill`)."""

    graphs = False


def profile_model(loaded, batch: Sequence[int], new_tokens: Sequence[int], context: Sequence[int], *, repeats: int = 5,
                  warmup: int = 1, seed: int = 0, progress: Callable[[int], None] | None = None, path: str = "model",
                  last_row: bool = True) -> ProfileCost:
    """Median forward seconds of ``loaded`` over the grid batch × new tokens × context.

    For each (batch, context) the KV cache is filled once with random tokens; each timed call
    feeds ``new_tokens`` more random tokens per sequence on top of it and is then cropped
    away; then, when the batch axis starts at 1, the batch-1 calls again keeping the last
    row's logits only (the last-row table, see :class:`draftsim.sim.cost.ProfileCost`; ``last_row``
    False leaves it out, for callers that price only calls keeping every row). ``path``
    says which forward is timed (:data:`PATHS`); the profile's fingerprint records it.
    ``progress(1)`` is called after each grid point.
    """
    torch = _torch()

    if path not in PATHS:
        raise DraftsimError(f"the forward path to profile is one of {', '.join(PATHS)}; got {path!r}")
    batch = _check_grid("batch", batch, 1)
    new_tokens = _check_grid("new_tokens", new_tokens, 1)
    context = _check_grid("context", context, 0)
    repeats = int(as_count("repeats", repeats, minimum=1, maximum=10_000))
    warmup = int(as_count("warmup", warmup, minimum=0, maximum=10_000))
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    if limit and context[-1] + new_tokens[-1] > limit:
        raise DraftsimError(f"context {context[-1]} + new tokens {new_tokens[-1]} exceeds {loaded.name}'s {limit} positions")
    gen = torch.Generator().manual_seed(seed)
    vocab = loaded.vocab_size
    dev = loaded.device
    seconds = np.zeros((len(batch), len(new_tokens), len(context)))
    spread = np.zeros_like(seconds)
    model = loaded.model
    check_path_grid(path, batch, context)
    Caller = _PrefillPath if path == "server-prefill" else _ServerPath if path.startswith("server") else _ModelPath

    def grid(b: int, last_row: bool = False) -> np.ndarray:
        """(median, spread) seconds of ``b`` sequences × every new tokens × every context:
        the cache filled once per context, each timed call undone after it. The repeats go
        round the new-token sizes (1, 2, …, 1, 2, …), so a machine whose speed changes during
        the profile slows every size alike instead of the sizes timed last."""
        out = np.zeros((len(new_tokens), len(context), 2))
        # the contexts are prefixes of one random sequence per row, grown in turn (one fill of the longest)
        full = torch.randint(vocab, (b, context[-1]), generator=gen).to(dev) if context[-1] > 0 else None
        caller = None
        for k, c in enumerate(context):
            if caller is None:  # the grid's contexts are sorted: only the first starts a caller
                caller = Caller(loaded, b, full[:, :c] if c > 0 else None)
            else:
                caller = caller.grow(full[:, context[k - 1]:c])
            feeds = [caller.feed(torch.randint(vocab, (b, n), generator=gen).to(dev)) for n in new_tokens]
            samples = [[] for _ in new_tokens]
            for r in range(warmup + repeats):
                for j, n in enumerate(new_tokens):
                    sync(dev)
                    t0 = time.perf_counter()
                    caller.call(feeds[j], last_row)
                    sync(dev)
                    dt = time.perf_counter() - t0
                    caller = caller.undo(n)
                    if r >= warmup:
                        samples[j].append(dt)
            for j in range(len(new_tokens)):
                out[j, k] = _stats(samples[j])
                if progress and not last_row:
                    progress(1)
        caller.release()
        return out

    with torch.inference_mode():
        for _ in range(2):  # first calls of a process are slow (allocations, kernel selection)
            model(torch.randint(vocab, (batch[0], new_tokens[0]), generator=gen).to(dev))
    # each path enters inference mode where its caller does (the server's masks and cache
    # bookkeeping are ordinary tensors)
    static_before = loaded.static_tokens  # path server-static: the calls go through a static cache of the grid's longest row
    loaded.static_tokens = context[-1] + new_tokens[-1] + 16 if path in ("server-static", "server-prefill") else None
    try:
        for i, b in enumerate(batch):
            timed = grid(b)
            seconds[i], spread[i] = timed[..., 0], timed[..., 1]
        # batch 1 again with the last row's logits only (a prefill's, a drafter's catch-up):
        # callers that keep fewer rows than they feed are priced without the rest
        last = grid(1, last_row=True)[..., 0] if batch[0] == 1 and last_row else None
    finally:
        loaded.static_tokens = static_before
    return ProfileCost(
        model=loaded.name, batch=tuple(batch), new_tokens=tuple(new_tokens), context=tuple(context), seconds=seconds, spread=spread,
        repeats=repeats, dtype=loaded.dtype, device=dev,
        fingerprint={"model": model_fingerprint(loaded), "machine": machine_fingerprint(dev), "path": path},
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        last_row_seconds=last,
    )


def drafter_seconds(names: Sequence[str], vocab: int, context: int = 512, k: int = 8, repeats: int = 20, seed: int = 0) -> dict:
    """Median seconds per proposed token of the lookup drafters (:data:`~draftsim.realrun.drafters.STATISTICAL_DRAFTERS`)
    on a random-but-repetitive text of ``context`` tokens (so lookups find matches)."""
    from .drafters import STATISTICAL_DRAFTERS, Bigram, lookup_drafter

    unknown = [n for n in names if n not in STATISTICAL_DRAFTERS]
    if unknown:
        raise DraftsimError(f"proposal timing knows {', '.join(STATISTICAL_DRAFTERS)}; got {unknown[0]!r}")
    rng = np.random.default_rng(seed)
    motif = rng.integers(vocab, size=max(8, context // 8))
    text = np.tile(motif, context // len(motif) + 1)[:context].tolist()
    bigram = Bigram.fit([text], vocab)
    out = {}
    for name in names:
        drafter = lookup_drafter(name, vocab, bigram)
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            drafter.propose(text, k)
            samples.append((time.perf_counter() - t0) / k)
        med, spr = _stats(samples)
        out[name] = {"seconds_per_token": med, "spread": spr, "context": context, "k": k}
    return out


def _best_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def probe_hardware(dtypes: Sequence[str] = ("float32", "bfloat16"), size_mb: int = 512, matmul: int = 2048, repeats: int = 5,
                   name: str = "local-cpu") -> HardwareSpec:
    """Measure this CPU: streaming-read bandwidth (torch sum over ``size_mb`` MB), matrix–vector
    bandwidth per dtype (the weight reads of a one-token forward) and matmul FLOP/s per dtype.

    The entry's memory bandwidth is the float32 matrix–vector rate (what decoding sees), its
    peak FLOP/s the measured matmul rates; since both are achieved rates, MFU and MBU are 1.
    """
    torch = _torch()
    n = size_mb * (1 << 20) // 4
    x = torch.ones(n, dtype=torch.float32)
    t = _best_time(lambda x=x: x.sum(), repeats)
    stream = n * 4 / t
    del x
    peak, gemv = {}, {}
    for dt in dtypes:
        tdt = getattr(torch, dt)
        rows = size_mb * (1 << 20) // (4096 * torch.finfo(tdt).bits // 8)
        W = torch.randn(rows, 4096).to(tdt)
        v = torch.randn(1, 4096).to(tdt)
        t = _best_time(lambda v=v, W=W: torch.nn.functional.linear(v, W), repeats)
        gemv[dt] = W.numel() * W.element_size() / t
        del W
        a = torch.randn(matmul, matmul).to(tdt)
        b = torch.randn(matmul, matmul).to(tdt)
        t = _best_time(lambda a=a, b=b: a @ b, repeats)
        peak[dt] = 2 * matmul**3 / t
    mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    measured = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_fingerprint("cpu"),
        "threads": torch.get_num_threads(),
        "stream_read_gbs": round(stream / 1e9, 2),
        "gemv_gbs": {k: round(v / 1e9, 2) for k, v in gemv.items()},
        "matmul_tflops": {k: round(v / 1e12, 4) for k, v in peak.items()},
        "load_average": list(os.getloadavg()),
    }
    return HardwareSpec(
        name=name, kind="cpu", peak_flops=peak, memory_bandwidth=gemv.get("float32", stream), memory=float(mem_total),
        mfu=1.0, mbu=1.0, usable_memory=0.8,
        source=f"measured by draftsim profile --probe ({size_mb} MB streaming read and matrix-vector products, {matmul}^3 matmuls; "
               f"torch {torch.__version__}, {torch.get_num_threads()} threads)",
        measured=measured,
    )
