"""Operator cost model: a dense model's forward priced operator by operator from kernel times
measured on real GPUs (``--cost-model operators``).

The tables are NVIDIA AIConfigurator's silicon measurements, shipped in the PyPI package
``aiconfigurator-core`` (Apache-2.0), pinned at :data:`PINNED_VERSION` and installed with the
``operators`` extra (``pip install 'draftsim[operators]'``). They are read directly with pyarrow
from the installed package's ``systems/data/<gpu>/<op>/<engine>/<engine version>/*.parquet``; the
package itself is never imported (its query API is private). Every table is named by that path in
:meth:`OperatorModel.describe` and :meth:`OperatorModel.breakdown`.

A call of N new tokens over B sequences (contexts c_i) on one of ``tp`` devices costs:

* **GEMMs**, per layer: QKV (n = (heads/tp + 2·⌈kv_heads/tp⌉)·head_dim, k = hidden), the output
  projection (n = hidden, k = heads/tp·head_dim), gate+up (n = 2·intermediate/tp; a plain MLP's
  up n = intermediate/tp) and down (n = hidden, k = intermediate/tp); once per call the LM head
  (n = vocab/tp, k = hidden) over the logit rows the call keeps. Each is ``gemm_perf.parquet``'s
  bfloat16 latency at (m = tokens, n, k), **multilinear**: linear in m between the measured token
  counts and bilinear in (n, k) between the measured widths (exact at measured shapes; exact for
  any time affine in m, n, k and n·k, the memory-bound form; holding out each measured H100 width
  and interpolating it from its neighbours errs by 2.6% at the median linearly, 3.0% log-log). With
  an engine's CUDA graphs m is the padded token count (the graph computes its padding).
* **Attention**, per layer: decoding and verification (≤ :data:`DECODE_QUERIES` new tokens per
  sequence) from ``generation_attention_perf.parquet`` at (batch B, cached tokens), **bilinear**
  in batch and context (a head layout between two measured query-head counts with the same KV
  heads and head_dim: linear between them); the table's ``step`` is the tokens cached before the new one
  (AIConfigurator's collector: ``isl = 1``, KV length step + 1). A sequence verifying n tokens is
  priced as one query over c + n − 1 cached tokens: its KV cache read once (FlashAttention-3 packs
  a sequence's queries and a GQA group into one tile) — exact at n = 1, estimated above and said
  so; an engine that verifies by batch expansion reads it once per query (N sequences).
  Prefill chunks from ``context_attention_perf.parquet`` at (B, isl = new tokens per sequence),
  scaled by the call's query–key pairs over the table's B·n(n+1)/2 when the chunk follows cached
  tokens (exact for a whole prompt). Mixed batches are priced at their means (B, N/B, Σc/B).
* **All-reduces** at tp > 1: two per layer and one after the vocabulary-parallel embedding
  (AIConfigurator's Llama model), each of N·hidden elements, from ``custom_allreduce_perf.parquet``
  at the tp size — the CUDA-graph rows (the kernel alone) unless the engine runs the step eagerly
  (more tokens than its largest captured size), then the eager ones — linear between measured
  message sizes.
* **Estimated, not measured**: residual-add+RMSNorm (twice per layer) and the MLP activation, and
  the embedding lookup, by AIConfigurator's own analytic memory-op formula (bytes / (memory
  bandwidth · ``mem_bw_empirical_scaling_factor``) + ``mem_empirical_constant_latency``, from
  ``systems/<gpu>.yaml``; its ``ElementWise``/``Embedding`` ops have no table); at tp > 1 the logits'
  all-gather and at pp > 1 the stage hand-offs by the roofline's interconnect terms.

Outside a table (more tokens than measured, a width beyond the grid such as a 128K-vocabulary LM
head, a batch × context hole, an unmeasured tp size or head layout) an operator falls back to the
roofline with **efficiency curves fitted on the same GPU's and engine's tables**
(:mod:`~draftsim.sim.cost.efficiency`: GEMM efficiency against m, n and k, decode attention against
batch × context, prefill attention against batch × tokens, the all-reduce against message size, each
with a fixed cost per kernel) — for a GEMM scaled at the nearest measured shape
(t_table(clamped) · curve(shape) / curve(clamped)), for attention and collectives the curve itself
(the constant-efficiency catalog roofline only where a GPU has no table of that kind) — and the model records it
(:attr:`OperatorModel.fallbacks`, :meth:`~OperatorModel.breakdown`). Nothing is extrapolated
silently. A mixture of experts or latent attention (MoE, MLA) is priced by the roofline whole in
this first version, and said so.

Engine overheads (``sim/data/engines.json``) stay the engine's and go on top of the operators'
GPU time: the per-step host time (added, or with an overlapped scheduler a floor), per draft
forward, CUDA-graph padding. The engine's ``forward_overlap`` (memory and compute time added, a
reading of a roofline fit) is **not** applied: the tables measure whole kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DraftsimError
from .base import BatchStats, CostModel
from .catalog import HardwareSpec, ModelSpec
from .efficiency import Curves, Roofs, fit_curves, gemm_shapes
from .kernel_tables import (
    FRAMEWORKS,
    PACKAGE,
    PINNED_VERSION,
    SYSTEMS,
    allreduce_rows,
    attention_rows,
    gemm_rows,
    mem_op_constants,
    newest_table,
    systems_root,
)
from .overheads import pad_tokens
from .roofline import RooflineModel

__all__ = ["COST_MODELS", "DECODE_QUERIES", "FRAMEWORKS", "PACKAGE", "PINNED_VERSION", "SYSTEMS", "MeasuredGemm", "OperatorModel", "Part",
           "systems_root"]

#: ``--cost-model`` choices: the catalog roofline (default) or the measured operators.
COST_MODELS = ("roofline", "operators")
#: The most new tokens per sequence priced from the generation (decode) table; more: the context table.
DECODE_QUERIES = 16


class _Grid2D:
    """A table t(x, y) on a grid (NaN where not measured), bilinear between the measured points;
    a point whose four corners are not all measured (or outside the grid) is outside."""

    def __init__(self, x, y, values):
        self.x, self.y, self.v = np.asarray(x, np.float64), np.asarray(y, np.float64), np.asarray(values, np.float64)

    @classmethod
    def from_frame(cls, df, xcol: str, ycol: str, value: str = "latency", scale: float = 1e-3) -> "_Grid2D":
        table = df.pivot_table(index=xcol, columns=ycol, values=value, aggfunc="median")
        return cls(table.index.to_numpy(), table.columns.to_numpy(), table.to_numpy() * scale)

    def __call__(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        x, y = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(y, np.float64))
        inside = (x >= self.x[0]) & (x <= self.x[-1]) & (y >= self.y[0]) & (y <= self.y[-1])
        i = np.clip(np.searchsorted(self.x, x, side="right") - 1, 0, max(len(self.x) - 2, 0))
        j = np.clip(np.searchsorted(self.y, y, side="right") - 1, 0, max(len(self.y) - 2, 0))
        i1, j1 = np.minimum(i + 1, len(self.x) - 1), np.minimum(j + 1, len(self.y) - 1)
        dx = np.where(self.x[i1] > self.x[i], self.x[i1] - self.x[i], 1.0)
        dy = np.where(self.y[j1] > self.y[j], self.y[j1] - self.y[j], 1.0)
        fx, fy = np.clip((x - self.x[i]) / dx, 0, 1), np.clip((y - self.y[j]) / dy, 0, 1)
        v00, v01, v10, v11 = self.v[i, j], self.v[i, j1], self.v[i1, j], self.v[i1, j1]
        # a corner with zero weight may be unmeasured
        corners = [(v00, (1 - fx) * (1 - fy)), (v01, (1 - fx) * fy), (v10, fx * (1 - fy)), (v11, fx * fy)]
        out = np.zeros(x.shape)
        for v, w in corners:
            bad = np.isnan(v) & (w > 0)
            inside &= ~bad
            out += np.where(w > 0, np.nan_to_num(v), 0.0) * w
        return np.where(inside, out, np.nan), inside


class _GemmTable:
    """bfloat16 GEMM latencies on the grid m × n × k (seconds), multilinear between measured shapes."""

    def __init__(self, path: Path):
        self.kernel, df = gemm_rows(path)
        self.m, self.n, self.k = (np.sort(df[c].unique()).astype(np.float64) for c in ("m", "n", "k"))
        cube = df.pivot_table(index=["n", "k"], columns="m", values="latency", aggfunc="median")
        self.t = np.full((len(self.n), len(self.k), len(self.m)), np.nan)
        ni = np.searchsorted(self.n, cube.index.get_level_values(0).to_numpy())
        ki = np.searchsorted(self.k, cube.index.get_level_values(1).to_numpy())
        mi = np.searchsorted(self.m, cube.columns.to_numpy().astype(np.float64))
        self.t[ni[:, None], ki[:, None], mi[None, :]] = cube.to_numpy() * 1e-3

    def curve(self, n: float, k: float) -> np.ndarray | None:
        """Seconds at every measured m for width (n, k), bilinear in (n, k); None outside the grid
        or where a corner's curve is incomplete."""
        if not (self.n[0] <= n <= self.n[-1] and self.k[0] <= k <= self.k[-1]):
            return None
        i = min(int(np.searchsorted(self.n, n, side="right")) - 1, len(self.n) - 2)
        j = min(int(np.searchsorted(self.k, k, side="right")) - 1, len(self.k) - 2)
        fn = (n - self.n[i]) / (self.n[i + 1] - self.n[i])
        fk = (k - self.k[j]) / (self.k[j + 1] - self.k[j])
        out = np.zeros(len(self.m))
        for di, wn in ((0, 1 - fn), (1, fn)):
            for dj, wk in ((0, 1 - fk), (1, fk)):
                if wn * wk == 0:
                    continue
                c = self.t[i + di, j + dj]
                if np.isnan(c).any():
                    return None
                out += wn * wk * c
        return out


class _Blend:
    """Two measured grids weighted (1 − w, w): a layout between two measured ones."""

    def __init__(self, a: _Grid2D, b: _Grid2D, w: float):
        self.a, self.b, self.w = a, b, float(w)

    def __call__(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        (va, ia), (vb, ib) = self.a(x, y), self.b(x, y)
        return (1 - self.w) * va + self.w * vb, ia & ib


@dataclass(frozen=True)
class Part:
    """One operator kind's share of a priced call: seconds, whether a table measured it (at or between
    measured shapes), and where it comes from (a table's path under systems/data, or the formula that
    estimates it); ``note`` says why a part left its table."""

    part: str
    seconds: float
    measured: bool
    source: str
    note: str = ""

    @property
    def basis(self) -> str:
        """``measured`` (a table), ``engine`` (the engine's cited host time) or ``estimated``."""
        return "measured" if self.measured else "engine" if self.part == "host" else "estimated"

    def to_dict(self) -> dict:
        return {"part": self.part, "seconds": self.seconds, "measured": self.measured, "basis": self.basis, "source": self.source,
                "note": self.note}


class OperatorModel(RooflineModel):
    """Seconds of a forward call of ``model`` on ``tp × pp`` devices of ``hardware`` from measured
    operator tables (see the module docstring); the roofline's arguments, plus ``engine``: the
    draftsim engine whose kernels' tables are read (vllm, sglang; ``none``: vLLM's) and
    ``systems``: the tables' root (default: the installed package's).

    ``overlap`` (an engine's forward_overlap) is kept for the roofline fallback of a MoE/MLA model
    only; measured operators are never overlapped. :attr:`fallbacks` collects, per operator, why a
    call left its table (each reason once); :meth:`breakdown` prices one shape part by part.
    """

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, dtype: str = "bfloat16", tp: int = 1, pp: int = 1, *,
                 engine: str = "vllm", systems: str | Path | None = None, qkv_inputs: int | None = None, **kwargs):
        super().__init__(model, hardware, dtype, tp, pp, **kwargs)
        #: the QKV projection's input width (None: the hidden size; EAGLE-3's layer: 2 x hidden, sim/cost/methods.py)
        self.qkv_inputs = None if qkv_inputs is None else int(qkv_inputs)
        if hardware.name not in SYSTEMS:
            raise DraftsimError(f"--cost-model operators has measured tables for {', '.join(SYSTEMS)}; not for {hardware.name} "
                                "(use --cost-model roofline)")
        if dtype != "bfloat16":
            raise DraftsimError(f"--cost-model operators prices bfloat16 (its tables' GEMMs and attention in this version); got "
                                f"--dtype {dtype} (use --cost-model roofline)")
        if engine not in FRAMEWORKS:
            raise DraftsimError(f"--cost-model operators reads tables of the engines {', '.join(FRAMEWORKS)}; not {engine}")
        self.engine = engine
        self.root = Path(systems) if systems is not None else systems_root()
        self.system = SYSTEMS[hardware.name]
        self.framework = FRAMEWORKS[engine]
        #: operator → reasons a priced call left its table (filled as calls are priced)
        self.fallbacks: dict[str, set[str]] = {}
        self._local: dict[str, set[str]] | None = None  # the notes of the call breakdown() prices
        self.whole_roofline = bool(model.experts or model.kv_lora_rank)
        self.name = (f"{model.name} on {self.devices}x {hardware.name} ({dtype}" + (f", tp {self.tp}" if self.tp > 1 else "") +
                     (f", pp {self.pp}" if self.pp > 1 else "") + f"), operators measured by {PACKAGE} {PINNED_VERSION} "
                     f"({self.system}, {self.framework} tables)")
        if self.whole_roofline:
            self.name += "; MoE/MLA priced by the roofline"
            self._sources = {"whole call": "roofline (a mixture of experts or latent attention is not priced from the tables in "
                                           "this version)"}
            return
        self._load_tables()

    # -- tables -----------------------------------------------------------------------------------
    def _rel(self, path: Path | None) -> str:
        return "(none)" if path is None else str(path.relative_to(self.root / "data"))

    def _table(self, op: str, filename: str) -> Path | None:
        return newest_table(self.root, self.system, op, self.framework, filename)

    def _load_tables(self) -> None:
        m, t = self.model, self.tp
        hd, L = m.head_dim, m.layers
        q_heads, kv_heads = m.heads // t, int(np.ceil(m.kv_heads / t))
        self._sources: dict[str, str] = {}
        self._layout = (q_heads, kv_heads, hd)
        # the catalog roofline of attention (where no table of its kind exists): seconds per KV entry read, per new token, per query-key pair
        bw, peak = self.hardware.memory_bandwidth * self.mbu, self.peak * self.mfu
        self._roof_attention = (2 * kv_heads * hd * self.bytes * L / bw, 2 * q_heads * hd * self.bytes * L / bw, 4 * q_heads * hd * L / peak)
        # GEMMs: (name, n, k, times per call) at the call's tokens; the LM head apart (its rows)
        gemm_path = self._table("gemm", "gemm_perf.parquet")
        if gemm_path is None:
            raise DraftsimError(f"{PACKAGE} {PINNED_VERSION} holds no {self.framework} GEMM table for {self.system}; use --cost-model roofline")
        self._gemm = _GemmTable(gemm_path)
        #: the efficiency curves fitted on this GPU's and engine's tables (sim/cost/efficiency.py): the fallback outside a table
        self.curves: Curves = fit_curves(self.root, self.system, self.framework, Roofs.of(self.hardware))
        *layer, head = gemm_shapes(m, t, self.qkv_inputs)
        shapes = [(name, n, k, L) for name, n, k in layer]
        self._layer_curve = np.zeros(len(self._gemm.m))
        self._gemm_parts: list[tuple[str, bool, str]] = []
        for name, n, k, mult in shapes:
            c, measured, note = self._gemm_curve(name, n, k)
            self._layer_curve += mult * c
            self._gemm_parts.append((name, measured, note))
        self._head_curve, measured, note = self._gemm_curve("lm_head", head[1], head[2])
        self._gemm_parts.append(("lm_head", measured, note))
        self._gemm_shapes = shapes + [(*head, 1)]
        self._sources["gemm"] = f"{self._rel(gemm_path)} ({self._gemm.kernel}, bfloat16): " + "; ".join(
            f"{name} {'measured' if meas else 'estimated'}{' (' + note + ')' if note else ''}" for name, meas, note in self._gemm_parts)
        # attention
        self._attn = self._attn_ctx = None
        gen_path = self._table("attention", "generation_attention_perf.parquet")
        ctx_path = self._table("attention", "context_attention_perf.parquet")
        self._attn_kernel = heads_note = ""
        if gen_path is not None:
            self._attn, self._attn_kernel, heads_note = self._attention_grid(gen_path, "step", q_heads, kv_heads, hd)
        if ctx_path is not None:
            self._attn_ctx, _, _ = self._attention_grid(ctx_path, "isl", q_heads, kv_heads, hd)
        self._gen_path, self._ctx_path = gen_path, ctx_path
        layout = f"{q_heads} query / {kv_heads} KV heads x {hd}, bfloat16 KV cache"
        self._sources["attention"] = (f"decode: {self._rel(gen_path) if self._attn else 'estimated (no rows for ' + layout + '; the efficiency curve below)'}; "
                                      f"prefill: {self._rel(ctx_path) if self._attn_ctx else 'estimated (no rows for ' + layout + '; the efficiency curve below)'}"
                                      + (f" ({self._attn_kernel}, {layout}" + (f"; {heads_note}" if heads_note else "") + ")"
                                         if self._attn_kernel else ""))
        # all-reduce
        self._ar_tables = None
        if t > 1:
            ar_path = self._table("comm", "custom_allreduce_perf.parquet")
            self._ar_path = ar_path
            if ar_path is not None:
                df = allreduce_rows(ar_path)
                df = df[df.num_gpus == t]
                graph = df[df.kernel_source.str.contains("graph")]
                eager = df[~df.kernel_source.str.contains("graph")]
                tabs = {}
                for kind, d in (("graph", graph), ("eager", eager)):
                    if not d.empty:
                        d = d.groupby("message_size").latency.median()
                        tabs[kind] = (d.index.to_numpy(np.float64), d.to_numpy() * 1e-3)
                if tabs:
                    self._ar_tables = tabs
            self._sources["allreduce"] = (f"{self._rel(ar_path)} at {t} GPUs ({', '.join(self._ar_tables)} rows), {2 * L + 1} per call"
                                          if self._ar_tables else f"roofline (no measured all-reduce at {t} GPUs)")
        bw, scale, const = mem_op_constants(self.root, self.system)
        self._mem_op = (bw * scale, const)
        self._sources["elementwise"] = (f"estimated: AIConfigurator's memory-op formula, bytes / ({bw / 1e9:.0f} GB/s x {scale:g}) + "
                                        f"{const * 1e6:g} us per kernel (systems/{self.system}.yaml): residual add + RMSNorm x2 and the "
                                        f"MLP activation per layer, the embedding lookup")
        if t > 1 or self.pp > 1:
            self._sources["other collectives"] = "estimated: roofline (logits all-gather at tp > 1, stage hand-offs at pp > 1)"

    def _attention_grid(self, path: Path, axis: str, q_heads: int, kv_heads: int, hd: int):
        """The table's grid (batch × ``axis``) for this head layout, its kernel and how it was found:
        the layout's own rows, or between the two measured query-head counts around it (same KV heads
        and head_dim: linear in query heads); (None, "", "") where neither exists."""
        kernel, df = attention_rows(path)
        df = df[(df.num_key_value_heads == kv_heads) & (df.head_dim == hd)]
        if df.empty:
            return None, "", ""
        heads = np.sort(df.num_heads.unique())
        if q_heads in heads:
            return _Grid2D.from_frame(df[df.num_heads == q_heads], "batch_size", axis), kernel, ""
        lo, hi = heads[heads < q_heads], heads[heads > q_heads]
        if not len(lo) or not len(hi):
            return None, "", ""
        lo, hi = int(lo[-1]), int(hi[0])
        grids = [_Grid2D.from_frame(df[df.num_heads == h], "batch_size", axis) for h in (lo, hi)]
        return _Blend(*grids, (q_heads - lo) / (hi - lo)), kernel, f"query heads interpolated between {lo} and {hi}"

    def _estimated_gemm(self, m, n: float, k: float) -> np.ndarray:
        """One GEMM of m tokens by the roofline with the efficiency curve fitted on the GEMM table."""
        return self.curves.gemm_seconds(np.asarray(m, np.float64), n, k)

    def _gemm_curve(self, name: str, n: int, k: int) -> tuple[np.ndarray, bool, str]:
        """Seconds at the table's token counts for width (n, k): the table's, or outside its widths the
        roofline scaled at the nearest measured width."""
        g = self._gemm
        c = g.curve(n, k)
        if c is not None:
            return c, True, ""
        nc, kc = float(np.clip(n, g.n[0], g.n[-1])), float(np.clip(k, g.k[0], g.k[-1]))
        anchor = g.curve(nc, kc)
        if anchor is None:
            note = f"n={n}, k={k}: no measured neighbour; roofline with the efficiency curve fitted on the GEMM table"
            self._note(f"gemm {name}", note)
            return self._estimated_gemm(g.m, n, k), False, note
        note = (f"n={n}, k={k} beyond the measured widths: the table at n={nc:g}, k={kc:g} scaled by the roofline with the "
                "efficiency curve fitted on the GEMM table")
        self._note(f"gemm {name}", note)
        return anchor * self._estimated_gemm(g.m, n, k) / self._estimated_gemm(g.m, nc, kc), False, note

    def _note(self, part: str, reason: str) -> None:
        self.fallbacks.setdefault(part, set()).add(reason)
        if self._local is not None:
            self._local.setdefault(part, set()).add(reason)

    # -- pricing ---------------------------------------------------------------------------------
    def _gemm_seconds(self, tokens: np.ndarray, curve: np.ndarray, what: str, shapes=None) -> np.ndarray:
        """A curve over the table's m at ``tokens``: linear between measured m; above the largest
        the roofline scaled at it (recorded). ``shapes`` ((name, n, k, times) of the GEMMs the curve
        sums; default: the layers', or the LM head's for ``gemm lm_head``) scale it there."""
        g = self._gemm
        tokens = np.asarray(tokens, np.float64)
        out = np.array(np.interp(tokens, g.m, curve), dtype=np.float64)
        over = tokens > g.m[-1]
        if np.any(over):
            self._note(what, f"more than {g.m[-1]:.0f} tokens: the curve at m={g.m[-1]:.0f} scaled by the roofline with the efficiency "
                             "curve fitted on the GEMM table")
            if shapes is None:
                shapes = self._gemm_shapes[-1:] if what == "gemm lm_head" else self._gemm_shapes[:-1]
            ratio_num = sum(mult * self._estimated_gemm(tokens[over], n, k) for _, n, k, mult in shapes)
            ratio_den = sum(mult * self._estimated_gemm(g.m[-1], n, k) for _, n, k, mult in shapes)
            out[over] = curve[-1] * ratio_num / ratio_den
        return out

    def _attention_seconds(self, B, N, cached, pairs) -> np.ndarray:
        L = self.model.layers
        nbar = N / B
        cbar = cached / B
        decode = nbar <= DECODE_QUERIES
        out = np.full(B.shape, np.nan)
        if self._attn is not None and np.any(decode):
            if self.kv_per_query:  # batch expansion: every query a sequence over its own context
                t, ok = self._attn(N, cbar + (nbar - 1) / 2)
            else:
                t, ok = self._attn(B, cbar + nbar - 1)
            use = decode & ok
            out[use] = t[use] * L
            if np.any(decode & ok & (nbar > 1)):
                self._note("attention", f"{'batch expansion: one query per sequence' if self.kv_per_query else 'several new tokens per sequence priced as one query over their context (KV read once)'}")
        if self._attn_ctx is not None and np.any(~decode):
            t, ok = self._attn_ctx(B, nbar)
            use = ~decode & ok
            scale = pairs / (B * nbar * (nbar + 1) / 2)
            out[use] = (t * scale)[use] * L
            if np.any(use & (cbar > 0)):
                self._note("attention", "prefill after cached tokens scaled by query-key pairs from a whole-prompt measurement")
        miss = np.isnan(out)
        c = self.curves
        for sel, curve, kind in ((miss & decode, c.decode, "decode"), (miss & ~decode, c.prefill, "prefill")):
            if not np.any(sel):
                continue
            if curve is None:  # no table of this kind for this GPU and engine
                self._note("attention", f"no {kind} attention table: catalog roofline")
                read = pairs if self.kv_per_query else cached + N
                kv_s, q_s, pair_s = self._roof_attention
                out[sel] = np.maximum(read * kv_s + N * q_s, pairs * pair_s)[sel]
                continue
            what = "batch x context" if (self._attn if kind == "decode" else self._attn_ctx) is not None else "head layout"
            self._note("attention", f"{what} outside the measured table: roofline with the efficiency curve fitted on the {kind} "
                                    "attention table")
            if kind == "decode":  # the table's lookup: (sequences, cached tokens before the new one); KV length one more
                t = (c.decode_seconds(N, cbar + (nbar - 1) / 2 + 1, *self._layout) if self.kv_per_query else
                     c.decode_seconds(B, cbar + nbar, *self._layout))
            else:
                t = c.prefill_seconds(B, nbar, *self._layout) * pairs / (B * nbar * (nbar + 1) / 2)
            out[sel] = (t * L)[sel]
        return out

    def _measured_allreduce_seconds(self, Np) -> np.ndarray | float:
        """The tp all-reduces (2 per layer + the embedding's) at their measured times."""
        if self.tp == 1:
            return 0.0
        m, L = self.model, self.model.layers
        count = 2 * L + 1
        msg = np.asarray(Np, np.float64) * m.hidden
        ring = 2 * (self.tp - 1) / self.tp
        bw = self.hardware.interconnect_bandwidth * self.ici_efficiency
        roof = self.hardware.interconnect_latency + ring * msg * self.bytes / bw
        graphed = np.asarray(Np) <= (self.graph_tokens[-1] if self.graph_tokens else np.inf)
        curve = self.curves.allreduce
        if curve is not None:  # the roofline with the efficiency curve fitted on the all-reduce table (eager: + a launch)
            roof = np.where(graphed, self.curves.allreduce_seconds(msg, self.tp), self.curves.allreduce_seconds(msg, self.tp, eager=True))
        how = "roofline with the efficiency curve fitted on the all-reduce table" if curve is not None else "catalog roofline"
        if self._ar_tables is None:
            self._note("allreduce", f"no measured all-reduce at {self.tp} GPUs: {how}")
            return count * roof
        # kernel time alone (the graph rows) unless the engine runs this step eagerly: beyond its largest
        # captured size; without captured sizes (engine none, or graphs not modelled) the kernels alone
        out = np.zeros(np.shape(msg))
        for kind, sel in (("graph", graphed), ("eager", ~graphed)):
            if not np.any(sel):
                continue
            sizes, secs = self._ar_tables.get(kind) or next(iter(self._ar_tables.values()))
            t = np.interp(msg, sizes, secs)
            outside = sel & ((msg < sizes[0]) | (msg > sizes[-1]))
            if np.any(outside):
                self._note("allreduce", f"message outside {sizes[0]:.0f}..{sizes[-1]:.0f} elements: {how}")
                t = np.where(outside, roof, t)
            out = np.where(sel, t, out)
        return count * out

    def _elementwise_seconds(self, Np) -> np.ndarray:
        m, t = self.model, self.tp
        bw, const = self._mem_op
        per_token_layer = (2 * (2 * m.hidden + 2 * m.hidden) + m.mlp_matrices * m.intermediate // t) * self.bytes
        kernels = 3 * m.layers + 1
        return np.asarray(Np, np.float64) * (per_token_layer * m.layers + 2 * m.hidden * self.bytes) / bw + kernels * const

    def _other_comm_seconds(self, N) -> np.ndarray | float:
        """Logits all-gather (tp > 1) and pipeline hand-offs (pp > 1): the roofline's terms."""
        m = self.model
        lat, bw = self.hardware.interconnect_latency, self.hardware.interconnect_bandwidth * self.ici_efficiency
        out = 0.0
        if self.tp > 1:
            out = out + lat + (self.tp - 1) / self.tp * m.vocab * self.bytes * np.asarray(N, np.float64) / bw
        if self.pp > 1:
            out = out + (self.pp - 1) * (lat + m.hidden * self.bytes * np.asarray(N, np.float64) / bw)
        return out

    def _parts_seconds(self, stats: BatchStats) -> dict[str, np.ndarray]:
        """Seconds per operator kind (arrays of the calls' shape); active calls only are meaningful."""
        B = np.maximum(np.asarray(stats.sequences, np.float64), 1.0)
        N = np.maximum(np.asarray(stats.tokens, np.float64), 1.0)
        rows = N if stats.rows is None else np.maximum(np.asarray(stats.rows, np.float64), 1.0)
        Np = N if self.graph_tokens is None else pad_tokens(N, self.graph_tokens)
        Nr = rows if self.graph_tokens is None else pad_tokens(rows, self.graph_tokens)
        return {
            "gemm layers": self._gemm_seconds(Np, self._layer_curve, "gemm layers"),
            "gemm lm_head": self._gemm_seconds(Nr, self._head_curve, "gemm lm_head"),
            "attention": self._attention_seconds(B, N, np.asarray(stats.cached, np.float64), np.asarray(stats.pairs, np.float64)),
            "allreduce": np.broadcast_to(self._measured_allreduce_seconds(Np), N.shape),
            "elementwise": self._elementwise_seconds(Np),
            "other collectives": np.broadcast_to(self._other_comm_seconds(N), N.shape),
            "host": np.full(N.shape, self.overhead + self.overhead_per_layer * self.model.layers),
        }

    def _time(self, stats: BatchStats) -> np.ndarray:
        if self.whole_roofline:
            return super()._time(stats)
        out = sum(self._parts_seconds(stats).values())
        if self.floor:
            out = np.maximum(out, self.floor)
        return out

    def shape_time(self, batch, new_tokens, context=0) -> np.ndarray:
        """:meth:`CostModel.shape_time` through the batch sums (the roofline's shortcut is its own)."""
        if self.whole_roofline:
            return super().shape_time(batch, new_tokens, context)
        return CostModel.shape_time(self, batch, new_tokens, context)

    # -- what was measured -----------------------------------------------------------------------
    def breakdown(self, batch: int, new_tokens: int = 1, context: int = 0) -> list[Part]:
        """One uniform call (``batch`` sequences of ``new_tokens`` on ``context`` cached tokens each),
        part by part: seconds, measured or estimated, and the table or formula behind it."""
        stats = BatchStats.of_shape(batch, new_tokens, context)
        if self.whole_roofline:
            return [Part("whole call", float(super()._time(stats)), False, self._sources["whole call"])]
        self._local = {}
        try:
            secs = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in self._parts_seconds(stats).items()}
            notes = self._local
        finally:
            self._local = None
        said = lambda key: "; ".join(sorted(notes.get(key, ())))  # noqa: E731
        layers = [(name, meas, note) for name, meas, note in self._gemm_parts if name != "lm_head"]
        head = self._gemm_parts[-1]
        out = [Part("gemm layers", secs["gemm layers"], all(meas for _, meas, _ in layers) and not said("gemm layers"),
                    self._sources["gemm"].split(":")[0] + ": " + ", ".join(name for name, _, _ in layers),
                    "; ".join(filter(None, [note for _, _, note in layers] + [said("gemm layers")]))),
               Part("gemm lm_head", secs["gemm lm_head"], head[1] and not said("gemm lm_head"), self._sources["gemm"].split(":")[0],
                    "; ".join(filter(None, [head[2], said("gemm lm_head")]))),
               Part("attention", secs["attention"], not said("attention"), self._sources["attention"], said("attention"))]
        if self.tp > 1:
            out.append(Part("allreduce", secs["allreduce"], not said("allreduce"), self._sources["allreduce"], said("allreduce")))
        out.append(Part("elementwise", secs["elementwise"], False, self._sources["elementwise"]))
        if self.tp > 1 or self.pp > 1:
            out.append(Part("other collectives", secs["other collectives"], False, self._sources["other collectives"]))
        out.append(Part("host", secs["host"], False, "the engine's per-step host time and the hardware's fixed overhead (sim/data/engines.json, "
                                                    "sim/data/hardware.json)" + (f"; the call takes at least {self.floor * 1e3:.3f} ms "
                                                                                 "(host work overlapped)" if self.floor else "")))
        return out

    @property
    def sources(self) -> dict[str, str]:
        """Where each operator kind's price comes from (table file and rows, or the estimate)."""
        return dict(self._sources)

    def describe(self) -> str:
        """Where each operator kind's price comes from (tables under systems/data, or estimates)."""
        lines = [f"operators: {PACKAGE} {PINNED_VERSION}, {self.system}, {self.framework} tables (under {self.root / 'data'})"]
        lines += [f"  {k}: {v}" for k, v in self._sources.items()]
        if not self.whole_roofline:
            lines.append("  engine: host time and CUDA-graph padding on top; its forward_overlap is not applied to measured kernels")
            lines += [f"  outside a table, {c}" for c in self.curves.describe()]
        return "\n".join(lines)

    def with_overhead(self, overhead: float, overhead_per_layer: float = 0.0) -> "OperatorModel":
        """The same operator model with another fixed overhead per call."""
        return OperatorModel(self.model, self.hardware, self.dtype, self.tp, self.pp, engine=self.engine, systems=self.root,
                             mfu=self.mfu, mbu=self.mbu, ici_efficiency=self.ici_efficiency, overhead=overhead,
                             overhead_per_layer=overhead_per_layer, check_memory=False, graph_tokens=self.graph_tokens,
                             overlap=self.overlap, allreduce=self.allreduce, floor=self.floor, expert_parallel=self.expert_parallel,
                             kv_per_query=self.kv_per_query, kv_dtype=self.kv_dtype, qkv_inputs=self.qkv_inputs)


class MeasuredGemm(CostModel):
    """One weight matrix (``inputs`` → ``outputs``, output columns split over ``split`` devices)
    applied to every new token of a call (or, as an LM head, to the logit rows it keeps), priced by
    ``probe``'s GEMM table with the same lookups as its own layers: the table's latency at (m, n =
    outputs / split, k = inputs), linear in m and bilinear in (n, k) between measured shapes, m the
    CUDA-graph-padded token count where the probe's engine captures graphs; outside the table the
    roofline scaled at its edge, recorded in ``probe.fallbacks`` under ``gemm <name>``. A drafting
    head's GEMMs beyond a decoder layer (EAGLE's fc, an MTP projection, Medusa's blocks and LM
    heads: :mod:`draftsim.sim.cost.methods`) are priced so."""

    def __init__(self, name: str, inputs: int, outputs: int, probe: OperatorModel, split: int = 1, lm_head: bool = False):
        if probe.whole_roofline:
            raise DraftsimError(f"{probe.model.name} is priced by the roofline whole; its GEMM table was not read")  # pragma: no cover
        self.probe, self.lm_head = probe, bool(lm_head)
        self.label = name
        self.inputs, self.outputs = int(inputs), int(outputs) // int(split)
        self.weights = self.inputs * self.outputs
        self.name = f"{name} ({self.inputs}x{self.outputs}), operators measured ({probe.system}, {probe.framework} tables)"
        self.curve, self.measured, self.note = probe._gemm_curve(name, self.outputs, self.inputs)
        self._shapes = [(name, self.outputs, self.inputs, 1)]

    def _tokens(self, stats: BatchStats) -> np.ndarray:
        N = np.maximum(np.asarray(stats.tokens if not self.lm_head or stats.rows is None else stats.rows, np.float64), 1.0)
        return N if self.probe.graph_tokens is None else pad_tokens(N, self.probe.graph_tokens)

    def _time(self, stats: BatchStats) -> np.ndarray:
        return self.probe._gemm_seconds(self._tokens(stats), self.curve, f"gemm {self.label}", self._shapes)

    def _bound(self, stats: BatchStats) -> np.ndarray:
        p, m = self.probe, np.asarray(stats.tokens, np.float64)
        mem = (self.weights + (self.inputs + self.outputs) * m) * p.bytes / (p.hardware.memory_bandwidth * p.mbu)
        return np.where(mem >= 2 * m * self.weights / (p.peak * p.mfu), 2, 3)

    def part(self, batch: int, new_tokens: int = 1, context: int = 0) -> Part:
        """This GEMM's :class:`Part` of one uniform call (``gemm lm_head`` for an LM head, else ``gemm layers``)."""
        stats = BatchStats.of_shape(batch, new_tokens, context)
        self.probe._local = {}
        try:
            seconds = float(np.asarray(self._time(stats)).reshape(-1)[0])
            said = "; ".join(sorted(self.probe._local.get(f"gemm {self.label}", ())))
        finally:
            self.probe._local = None
        gemm = self.probe._sources["gemm"].split(":")[0]
        return Part("gemm lm_head" if self.lm_head else "gemm layers", seconds, self.measured and not said, f"{gemm}: {self.label}",
                    "; ".join(filter(None, [self.note, said])))
