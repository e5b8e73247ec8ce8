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
  Prefill chunks from ``context_attention_perf.parquet`` at (B, isl = the whole prompt with the
  call's query–key pairs per sequence, n(n + 1)/2 = pairs / B: :func:`equal_work_prompt`; exact
  for whole prompts of one length). A chunk after cached tokens is so priced as the prompt of its
  work, its fixed cost once (scaling a short prompt's time by the pairs, as before, multiplied the
  fixed cost too: 64 tokens after 3,072 cached came out 1.17 ms on an A100 where Vidur's profile
  measures 0.042 ms). A chunk never costs less than its last :data:`DECODE_QUERIES` tokens would as
  a verification over everything before them (the cache and the chunk's earlier tokens): the decode
  path's price of B sequences of 16 new tokens on c + n − 16 cached, which reads the whole cache
  (the equal-work prompt reads only its own short prompt's KV: 8 sequences on 32,768 cached tokens
  came out 7.4 ms for 17 new tokens, 11.8 ms for 16, below the 10.3 ms of reading their KV on an
  H100). Mixed batches are priced at their means (B, N/B, Σc/B).
* **Measured tables made non-decreasing**: every table read here (GEMM along m, n and k; attention
  along batch and context or prompt; the MLA blocks; the fused MoE and the all-reduce along tokens or
  message size) is first cleaned by :func:`~draftsim.sim.cost.efficiency.monotone_table`: an isolated
  spike (a cell more than 2x both neighbours along an axis that agree within 30%) replaced by their
  interpolation, then isotonic regression along each axis (a falling run pooled to its mean; not the
  running maximum a profile's few medians get, which reads the top of a dense table's noise: see the
  function); interpolation then never prices a bigger call below a smaller one. "Exact at measured
  shapes" holds at the cells cleaning leaves alone.
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
(t_table(clamped) · curve(shape) / curve(clamped)), attention likewise where its table ends, row by row
(each measured batch row at its own last measured context scaled by the curve, non-decreasing over the
rows, linear in the batch between them; the ratio held ≥ 1 beyond the table and ≤ 1 below it:
:func:`_anchored`), the curve itself for a head layout or collective no table holds (the
constant-efficiency catalog roofline only where a GPU has no table of that kind), latent attention at
the MLA tables' edge scaled by the catalog roofline's latent attention by the same row rule (vLLM's
module tables; SGLang's parts with the tokens clamped into their tables) — and the model records it
(:attr:`OperatorModel.fallbacks`, :meth:`~OperatorModel.breakdown`). Nothing is extrapolated
silently. A mixture of experts or latent attention (DeepSeek-V3/R1, Qwen3-MoE, Mixtral, GPT-OSS,
GLM-4.5) adds its routed experts from the fused-MoE tables, its latent attention as the engine runs it
(vLLM: the MLA module tables' whole block; SGLang: part by part from its own GEMM, absorbed-BMM and MLA
kernel tables, as :func:`~draftsim.sim.cost.moe_tables.decode_step` composes SGLang's layer, at SGLang's
default bfloat16 KV cache) and, with ``expert_parallel``, data-parallel attention and the all-to-all from
DeepEP's tables (:mod:`~draftsim.sim.cost.moe_operators`); its attention projections (GQA), first dense
layers' MLP, shared experts (SGLang at EP 1: fused into the routed call instead) and router are GEMMs as
above (float8 weights: the per-tensor FP8 table), an MTP module one such block
(:mod:`~draftsim.sim.cost.methods`).

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
from .catalog import HardwareSpec, ModelSpec, kv_auto_dtype
from .efficiency import BYTES as CURVE_BYTES
from .efficiency import Curves, Roofs, fit_curves, gemm_shapes, grid_edge, monotone_table
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
    read_columns,
    systems_root,
)
from .moe_operators import A2A_LOW_LATENCY_MAX, a2a_table, attention_params, mla_grid
from .moe_tables import (
    GranularMLA,
    fused_shared_expert_seconds,
    fused_shared_expert_source,
    kv_table_dtype,
    measured_experts,
    sglang_fuses_shared_expert,
)
from .overheads import pad_tokens
from .roofline import RooflineModel

__all__ = ["COST_MODELS", "DECODE_QUERIES", "FRAMEWORKS", "PACKAGE", "PINNED_VERSION", "SYSTEMS", "MeasuredGemm", "OperatorModel", "Part",
           "equal_work_prompt", "prices_dtype",
           "systems_root"]

#: ``--cost-model`` choices: the catalog roofline (default) or the measured operators.
COST_MODELS = ("roofline", "operators")
#: The most new tokens per sequence priced from the generation (decode) table; more: the context table.
DECODE_QUERIES = 16


def prices_dtype(model: ModelSpec, dtype: str) -> bool:
    """Whether the operator model prices ``model`` in ``dtype``: bfloat16 (its tables' GEMMs and
    attention), or float8 for a mixture of experts (whose tables measure block-FP8 experts)."""
    return dtype == "bfloat16" or (dtype == "float8" and bool(model.experts))


def equal_work_prompt(B, pairs) -> np.ndarray:
    """The whole-prompt length n whose causal attention has ``pairs / B`` query–key pairs,
    n(n + 1)/2 = pairs / B: what a prefill chunk after cached tokens is priced as (its queries
    against the cache and one another are that much work). Exact for B whole prompts of n tokens
    (the square root of a perfect square is exact)."""
    return (np.sqrt(1.0 + 8.0 * np.asarray(pairs, np.float64) / np.asarray(B, np.float64)) - 1.0) / 2.0


def _granular_mla(model: ModelSpec, hardware: HardwareSpec, engine: str, systems) -> bool:
    """Whether ``engine``'s own tables price ``model``'s latent attention part by part (SGLang's MLA kernel
    and BMM tables, sim/cost/moe_tables.py GranularMLA; vLLM's hold the whole block)."""
    fw = FRAMEWORKS.get(engine)
    if not model.kv_lora_rank or fw in (None, "vllm") or hardware.name not in SYSTEMS:
        return False
    root = Path(systems) if systems is not None else systems_root()
    return GranularMLA.available(model, root, SYSTEMS[hardware.name], fw) is not None


def _busiest_rank(B, N, cached, pairs, ranks: int):
    """The busiest data-parallel rank's share of a call of B sequences: ⌈B / ranks⌉ of them, and the
    tokens, cached tokens and query–key pairs in proportion. Multiplied before dividing (N · B_d / B): the
    share taken first, ⌈B / ranks⌉ / B, rounds (51 · 7/51 = 7.000000000000001, whose ceiling is 8)."""
    Bd = np.ceil(B / ranks)
    return Bd, np.maximum(np.ceil(N * Bd / B), 1.0), cached * Bd / B, pairs * Bd / B


class _Grid2D:
    """A table t(x, y) on a grid (NaN where not measured), made non-decreasing along both axes
    (:func:`~draftsim.sim.cost.efficiency.monotone_table`: isolated spikes removed, then isotonic
    regression; :attr:`raw` keeps the measured values, :attr:`cleaning` what changed), bilinear between
    the measured points; a point whose four corners are not all measured (or outside the grid) is
    outside, and :meth:`edge` the measured point it is anchored at."""

    def __init__(self, x, y, values):
        self.x, self.y, self.raw = np.asarray(x, np.float64), np.asarray(y, np.float64), np.asarray(values, np.float64)
        self.cleaning = monotone_table(self.raw, (self.x, self.y))
        self.v = self.cleaning.values

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

    @property
    def rows(self) -> np.ndarray:
        """The measured x of the grid (:func:`_anchored` anchors each at its own edge)."""
        return self.x

    def edge(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        """The measured point a shape outside the table is anchored at (:func:`~draftsim.sim.cost.efficiency.grid_edge`)."""
        return grid_edge(self.x, self.y, self.v, x, y)


def _anchored(grid, x, y, curve) -> tuple[np.ndarray, np.ndarray]:
    """``grid`` at (x, y) where it measured the shape, else anchored where it ends, as GEMMs are, row by row:
    each measured row x_r of the grid priced at y as its own edge there (the row's value at y clamped into the
    columns it measured, :meth:`~_Grid2D.edge`) × curve(x_r, y) / curve(edge), made non-decreasing over the rows
    (a row never below a smaller one's price), then linear in x between the two rows around x (bilinear
    interpolation wherever both rows measured y: the table's own value) and beyond the first or last row scaled by
    curve(x, y_ref) / curve(row, y_ref), y_ref that row's longest measured column (one y, so the price keeps the row's
    rise with y). Every ratio is held ≥ 1 beyond the edge and ≤ 1 below it (so a call outside never costs less than a
    smaller measured one, nor more than a bigger one, whatever the fitted curve does between the two). A table
    whose later row measures more columns than an earlier one would need its measured cells held up too: none of
    the tables read has that shape. Anchoring each row at its own edge keeps the price continuous where a row's measured columns end: a
    shape anchored at the edge of the rows around it jumped where x crossed a row measuring a longer context
    (Llama-3.1-8B on the H100: 22.8698 ms at 507 sequences over 464 cached tokens, 22.8661 ms at 513).
    Returns the seconds (NaN where no row's edge is measured) and where the table measured the shape."""
    t, ok = grid(x, y)
    if np.all(ok):
        return t, ok
    x, y = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(y, np.float64))
    out = np.array(t, dtype=np.float64)
    out[~ok] = _row_anchored(grid, x[~ok], y[~ok], curve)
    return out, ok


def _held(ratio, above, below) -> np.ndarray:
    """A curve's ratio held ≥ 1 where the shape lies ``above`` its anchor and ≤ 1 where ``below`` it."""
    return np.where(above, np.maximum(ratio, 1.0), np.where(below, np.minimum(ratio, 1.0), ratio))


def _table_at(sizes, seconds, x, roof) -> tuple[np.ndarray, np.ndarray]:
    """A one-dimensional measured table (``seconds`` at ``sizes``) at ``x``: linear between measured sizes, beyond
    either end that end's value scaled by roof(x) / roof(end), the ratio held ≥ 1 beyond and ≤ 1 below
    (:func:`_anchored`'s rule on one axis). Returns the seconds and where ``x`` lay outside the table."""
    x = np.asarray(x, np.float64)
    edge = np.clip(x, sizes[0], sizes[-1])
    t = np.interp(edge, sizes, seconds)
    outside = x != edge
    if np.any(outside):
        t = np.where(outside, t * _held(np.asarray(roof(x), np.float64) / np.asarray(roof(edge), np.float64), x >= edge, x <= edge), t)
    return t, outside


def _row_anchored(grid, x, y, curve) -> np.ndarray:
    """:func:`_anchored`'s price of shapes (1-D) outside the measured table: every row up to the highest
    one a shape needs, all at once ((rows, shapes) arrays: one call of the curve for them all)."""
    rows = grid.rows
    xc = np.clip(x, rows[0], rows[-1])
    i = np.clip(np.searchsorted(rows, xc, side="right") - 1, 0, len(rows) - 1)
    i1 = np.minimum(i + 1, len(rows) - 1)
    span = rows[i1] - rows[i]
    fx = np.where(span > 0, (xc - rows[i]) / np.where(span > 0, span, 1.0), 0.0)
    xr, yr = np.broadcast_arrays(rows[: int(i1.max()) + 1, None], y[None, :])
    xe, ye = grid.edge(xr, yr)
    te, oke = grid(xe, ye)
    ratio = np.asarray(curve(xr, yr), np.float64) / np.asarray(curve(xe, ye), np.float64)
    # each row at its own edge (x too where a blend's other grid clamps it), then never below a smaller row (a row with
    # no measured edge passes the smaller rows' price on)
    held = _held(ratio, (xr >= xe) & (yr >= ye), (xr <= xe) & (yr <= ye))
    run = np.fmax.accumulate(np.where(oke, te * held, np.nan), axis=0)
    at = np.arange(len(x))
    lo, hi = run[i, at], run[i1, at]
    out = np.where(fx > 0, (1 - fx) * lo + fx * hi, lo)
    if np.any(x != xc):  # before the first row or after the last: scaled along x by the curve at that row's longest
        # measured column, one y for every shape (a ratio taken at each shape's own y could shrink faster than the row rises)
        _, yref = grid.edge(xc, np.full(xc.shape, np.inf))
        ratio = np.asarray(curve(x, yref), np.float64) / np.asarray(curve(xc, yref), np.float64)
        out = out * _held(ratio, x >= xc, x <= xc)
    return out


class _PartsAt:
    """An MLA module's parts (sim/cost/moe_tables.py GranularMLA) summed over ``layers`` at fixed call tokens, as a
    grid in the kernel's (sequences, cached or prompt tokens) for :func:`_row_anchored`: the kernel table's rows and edge."""

    def __init__(self, mla, tokens, layers: int):
        self.mla, self.tokens, self.layers = mla, tokens, layers
        self.rows = mla.kernel.b

    def __call__(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        t = sum(self.layers * np.asarray(self.mla.seconds(p, self.tokens, x, y), np.float64) for p in self.mla.parts)
        t = np.broadcast_to(t, np.shape(x))
        return t, ~np.isnan(t)

    def edge(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        return self.mla.kernel.edge(x, y)


class _GemmTable:
    """bfloat16 GEMM latencies on the grid m × n × k (seconds), multilinear between measured shapes.
    ``dtype`` ``"fp8"``: the per-tensor FP8 kernel's (CUTLASS in vLLM, sgl-kernel in SGLang), the one FP8
    kernel measured on the whole grid, standing in for the block-FP8 layers of a MoE checkpoint (the
    same weight bytes; the block-scaled kernels' rows cover part of the grid: sim/cost/moe_tables.py)."""

    def __init__(self, path: Path, dtype: str = "bfloat16"):
        if dtype == "bfloat16":
            self.kernel, df = gemm_rows(path)
        else:
            df = read_columns(str(path), ("kernel_source", "gemm_dtype", "m", "n", "k", "latency"))
            df = df[df.gemm_dtype == dtype]
            if df.empty:
                raise DraftsimError(f"{path} holds no {dtype} GEMMs")
            self.kernel = df.groupby("kernel_source").size().idxmax()
            df = df[df.kernel_source == self.kernel]
        self.m, self.n, self.k = (np.sort(df[c].unique()).astype(np.float64) for c in ("m", "n", "k"))
        cube = df.pivot_table(index=["n", "k"], columns="m", values="latency", aggfunc="median")
        self.t = np.full((len(self.n), len(self.k), len(self.m)), np.nan)
        ni = np.searchsorted(self.n, cube.index.get_level_values(0).to_numpy())
        ki = np.searchsorted(self.k, cube.index.get_level_values(1).to_numpy())
        mi = np.searchsorted(self.m, cube.columns.to_numpy().astype(np.float64))
        self.t[ni[:, None], ki[:, None], mi[None, :]] = cube.to_numpy() * 1e-3
        #: the measured latencies; :attr:`t` each width's made non-decreasing in m (efficiency.monotone_table; a call's
        #: tokens are its size axis: the widths are a model's fixed shapes, each measured by its own tiling)
        self.raw = self.t.copy()
        self.cleaning = monotone_table(self.raw, (self.n, self.k, self.m), axes=(2,))
        self.t = self.cleaning.values

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

    @property
    def rows(self) -> np.ndarray:
        """Both grids' measured x."""
        return np.union1d(self.a.rows, self.b.rows)

    def edge(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        """Clamped into both grids' measured region (one's edge, then the other's)."""
        return self.b.edge(*self.a.edge(x, y))


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

    ``overlap`` (an engine's forward_overlap) is kept for the roofline's fallbacks only; measured
    operators are never overlapped. ``expert_parallel`` at tp > 1: data-parallel attention with the
    routed experts split whole over the devices (:mod:`~draftsim.sim.cost.moe_operators`). :attr:`fallbacks` collects, per operator, why a
    call left its table (each reason once); :meth:`breakdown` prices one shape part by part, and
    :meth:`mla_parts` its latent attention where the engine's tables price it part by part (SGLang's).
    """

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, dtype: str = "bfloat16", tp: int = 1, pp: int = 1, *,
                 engine: str = "vllm", systems: str | Path | None = None, qkv_inputs: int | None = None, **kwargs):
        #: a mixture of experts or latent attention: the routed experts, MLA and all-to-all of sim/cost/moe_operators.py
        self.moe = bool(model.experts or model.kv_lora_rank)
        #: data-parallel attention with the experts split whole over the devices (sim/cost/moe_operators.py)
        self.dp_attention = bool(kwargs.get("expert_parallel")) and int(tp) > 1
        #: latent attention priced part by part from the engine's own tables (SGLang's: sim/cost/moe_tables.py GranularMLA)
        self.granular_mla = _granular_mla(model, hardware, engine, systems)
        kwargs.setdefault("kernel_fixed", {})  # the measured kernels hold their own fixed times
        super().__init__(model, hardware, dtype, tp, pp, **kwargs)
        #: the QKV projection's input width (None: the hidden size; EAGLE-3's layer: 2 x hidden, sim/cost/methods.py)
        self.qkv_inputs = None if qkv_inputs is None else int(qkv_inputs)
        if hardware.name not in SYSTEMS:
            raise DraftsimError(f"--cost-model operators has measured tables for {', '.join(SYSTEMS)}; not for {hardware.name} "
                                "(use --cost-model roofline)")
        if not prices_dtype(model, dtype):
            raise DraftsimError(f"--cost-model operators prices bfloat16 (its tables' GEMMs and attention in this version; float8 for a "
                                f"mixture of experts, whose tables measure block-FP8 experts); got --dtype {dtype} for {model.name} "
                                "(use --cost-model roofline)")
        if engine not in FRAMEWORKS:
            raise DraftsimError(f"--cost-model operators reads tables of the engines {', '.join(FRAMEWORKS)}; not {engine}")
        self.engine = engine
        self.root = Path(systems) if systems is not None else systems_root()
        self.system = SYSTEMS[hardware.name]
        self.framework = FRAMEWORKS[engine]
        #: operator → reasons a priced call left its table (filled as calls are priced)
        self.fallbacks: dict[str, set[str]] = {}
        self._local: dict[str, set[str]] | None = None  # the notes of the call breakdown() prices
        #: every part is priced from the tables or their fallbacks (kept for callers that asked whether a call was the roofline's whole)
        self.whole_roofline = False
        self.name = (f"{model.name} on {self.devices}x {hardware.name} ({dtype}" + (f", kv {self.kv_dtype}" if self.granular_mla or self.kv_dtype != kv_auto_dtype(dtype) else "")
                     + (f", tp {self.tp}" if self.tp > 1 else "") +
                     (f", pp {self.pp}" if self.pp > 1 else "") + f"), operators measured by {PACKAGE} {PINNED_VERSION} "
                     f"({self.system}, {self.framework} tables)" + (f"; attention data-parallel over {self.tp} devices, experts "
                                                                   "split whole (all-to-all)" if self.dp_attention else ""))
        self._load_tables()

    # -- tables -----------------------------------------------------------------------------------
    def _rel(self, path: Path | None) -> str:
        return "(none)" if path is None else str(path.relative_to(self.root / "data"))

    def _table(self, op: str, filename: str) -> Path | None:
        return newest_table(self.root, self.system, op, self.framework, filename)

    def _load_tables(self) -> None:
        m, t = self.model, self.tp
        at = 1 if self.dp_attention else t  # the devices attention and the dense layers are split over
        hd, L = m.head_dim, m.layers
        q_heads, kv_heads = m.heads // at, int(np.ceil(m.kv_heads / at))
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
        #: the layers' FP8 GEMMs (float8 weights of a mixture of experts): the per-tensor FP8 kernel's table (see _GemmTable)
        self._gemm8 = _GemmTable(gemm_path, "fp8") if self.dtype == "float8" else None
        #: the efficiency curves fitted on this GPU's and engine's tables (sim/cost/efficiency.py): the fallback outside a table
        self.curves: Curves = fit_curves(self.root, self.system, self.framework, Roofs.of(self.hardware))
        *_, head = gemm_shapes(m, t, self.qkv_inputs)
        #: SGLang runs DeepSeek-V3/R1's shared expert inside the fused-MoE call (sim/cost/moe_tables.py sglang_fuses_shared_expert)
        self.fused_shared_expert = self.framework == "sglang" and bool(m.experts) and sglang_fuses_shared_expert(m, self.expert_parallel)
        shapes = self._layer_gemm_shapes(at)
        self._layer_curve = np.zeros(len(self._gemm.m))
        self._gemm_parts: list[tuple[str, bool, str]] = []
        for name, n, k, mult, fp8 in shapes:
            c, measured, note = self._gemm_curve(name, n, k, self._gemm8 if fp8 else None)
            self._layer_curve += mult * c
            self._gemm_parts.append((name, measured, note))
        self._head_curve, measured, note = self._gemm_curve("lm_head", head[1], head[2])
        self._gemm_parts.append(("lm_head", measured, note))
        self._gemm_shapes = [s[:4] for s in shapes] + [(*head, 1)]
        kinds = f"{self._gemm.kernel}, bfloat16" + (f"; {self._gemm8.kernel}, per-tensor FP8, for the block-FP8 layers" if self._gemm8 else "")
        self._sources["gemm"] = f"{self._rel(gemm_path)} ({kinds}): " + "; ".join(
            f"{name} {'measured' if meas else 'estimated'}{' (' + note + ')' if note else ''}" for name, meas, note in self._gemm_parts)
        # attention
        self._attn = self._attn_ctx = self._mla = self._mla_ctx = self._granular = None
        if m.kv_lora_rank:
            self._load_mla(m.heads // at)
        else:
            gen_path = self._table("attention", "generation_attention_perf.parquet")
            ctx_path = self._table("attention", "context_attention_perf.parquet")
            self._attn_kernel = heads_note = ""
            if gen_path is not None:
                self._attn, self._attn_kernel, heads_note = self._attention_grid(gen_path, "step", q_heads, kv_heads, hd)
            if ctx_path is not None:
                self._attn_ctx, _, _ = self._attention_grid(ctx_path, "isl", q_heads, kv_heads, hd)
            self._gen_path, self._ctx_path = gen_path, ctx_path
            layout = f"{q_heads} query / {kv_heads} KV heads x {hd}, {self.kv_dtype} KV cache"
            fallback = "; the efficiency curve below" if self.kv_bytes == CURVE_BYTES else f"; the catalog roofline at {self.kv_dtype} KV"
            self._sources["attention"] = (f"decode: {self._rel(gen_path) if self._attn else 'estimated (no rows for ' + layout + fallback + ')'}; "
                                          f"prefill: {self._rel(ctx_path) if self._attn_ctx else 'estimated (no rows for ' + layout + fallback + ')'}"
                                          + (f" ({self._attn_kernel}, {layout}" + (f"; {heads_note}" if heads_note else "") + ")"
                                             if self._attn_kernel else ""))
            if self.dp_attention:
                self._sources["attention"] += f"; data-parallel: each of {t} devices attends over its own sequences with every head"
        if m.experts:
            self._load_experts()
        # all-reduce (tensor-parallel attention); all-to-all (data-parallel attention with the experts split whole)
        self._ar_tables = self._a2a = None
        if t > 1 and not self.dp_attention:
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
                        sizes = d.index.to_numpy(np.float64)  # made non-decreasing in the message size (efficiency.monotone_table)
                        tabs[kind] = (sizes, monotone_table(d.to_numpy(np.float64) * 1e-3, (sizes,)).values)
                if tabs:
                    self._ar_tables = tabs
            self._sources["allreduce"] = (f"{self._rel(ar_path)} at {t} GPUs ({', '.join(self._ar_tables)} rows), {2 * L + 1} per call"
                                          if self._ar_tables else f"roofline (no measured all-reduce at {t} GPUs)")
        if self.dp_attention:
            a2a_path = newest_table(self.root, self.system, "comm", "vllm", "moe_a2a_perf.parquet")
            self._a2a = a2a_table(a2a_path, m, t)
            said = "" if self.framework == "vllm" else f" (vLLM's DeepEP table: {self.framework}'s runs the same kernels)"
            self._sources["all-to-all"] = (f"{self._rel(a2a_path)} (DeepEP dispatch + combine at {t} devices: "
                                           f"{', '.join(self._a2a)}){said}, per MoE layer" if self._a2a else
                                           f"estimated: roofline interconnect (no measured all-to-all of {m.name}'s widths at {t} devices)")
        bw, scale, const = mem_op_constants(self.root, self.system)
        self._mem_op = (bw * scale, const)
        self._sources["elementwise"] = (f"estimated: AIConfigurator's memory-op formula, bytes / ({bw / 1e9:.0f} GB/s x {scale:g}) + "
                                        f"{const * 1e6:g} us per kernel (systems/{self.system}.yaml): residual add + RMSNorm x2 and the "
                                        f"MLP activation per layer, the embedding lookup" + ("; the shared expert's activation inside "
                                                                                            "the fused-MoE kernel" if self.fused_shared_expert else ""))
        if t > 1 or self.pp > 1:
            self._sources["other collectives"] = "estimated: roofline (logits all-gather at tp > 1, stage hand-offs at pp > 1)"

    def _layer_gemm_shapes(self, at: int) -> list[tuple[str, int, int, int, bool]]:
        """(name, n, k, times per call, FP8 weights) of the layers' GEMMs: a dense model's QKV, output,
        MLP; a mixture of experts' attention projections (none with latent attention: the MLA block's
        table or its parts hold them), the first dense layers' MLP, the shared experts (not where SGLang
        fuses them into the routed call) and the router (bfloat16, as the checkpoints keep it), each split
        over ``at`` devices (1: data-parallel attention)."""
        m, L = self.model, self.model.layers
        if not self.moe:
            return [(name, n, k, L, False) for name, n, k in gemm_shapes(m, self.tp, self.qkv_inputs)[:-1]]
        fp8, h = self.dtype == "float8", m.hidden
        out = [] if m.kv_lora_rank else [(name, n, k, L, fp8) for name, n, k in gemm_shapes(m, at, self.qkv_inputs)[:2]]
        dense = L - m.moe_layers
        up = m.mlp_matrices - 1
        if dense:
            out += [("gate_up" if m.mlp == "gated" else "up", up * m.intermediate // at, h, dense, fp8), ("down", h, m.intermediate // at, dense, fp8)]
        s = m.shared_experts * m.expert_intermediate
        if s and m.moe_layers and not self.fused_shared_expert:
            out += [("shared expert gate_up", up * s // at, h, m.moe_layers, fp8), ("shared expert down", h, s // at, m.moe_layers, fp8)]
        if m.moe_layers:
            out.append(("router", m.experts, h, m.moe_layers, False))
        return out

    def _load_mla(self, heads: int) -> None:
        """The latent attention: part by part from the engine's own tables where they hold its parts
        (SGLang's, :meth:`_load_granular_mla`), else the whole-block tables (vLLM's; another engine
        without its own: vLLM's, said)."""
        self._granular = None
        if self.granular_mla:
            self._load_granular_mla(heads)
            return
        paths = [self._table("mla", f) for f in ("mla_generation_module_perf.parquet", "mla_context_module_perf.parquet")]
        said = ""
        if self.framework != "vllm" and paths[0] is None:
            paths = [newest_table(self.root, self.system, "mla", "vllm", f) for f in ("mla_generation_module_perf.parquet",
                                                                                    "mla_context_module_perf.parquet")]
            said = f"; vLLM's: {self.framework}'s MLA tables hold the attention kernel alone, not the block"
        grids = []
        for path, axis in zip(paths, ("step", "isl")):
            rows, what = mla_grid(path, self.model, heads, self.dtype, axis, kv_table_dtype(self.kv_dtype, self.dtype))
            grids.append((None if rows is None else _Grid2D.from_frame(rows, "batch_size", axis), what))
        (self._mla, gen_kernel), (self._mla_ctx, ctx_kernel) = grids
        self._sources["attention"] = (f"MLA block (projections + attention) at {heads} query heads: decode "
                                      + (f"{self._rel(paths[0])} ({gen_kernel})" if self._mla else f"estimated: roofline ({gen_kernel})")
                                      + "; prefill " + (f"{self._rel(paths[1])} ({ctx_kernel})" if self._mla_ctx else f"estimated: roofline ({ctx_kernel})")
                                      + said + ("; data-parallel: every head, each device's own sequences" if self.dp_attention else ""))

    def _load_granular_mla(self, heads: int) -> None:
        """The latent attention as the engine runs it, part by part from its own tables
        (sim/cost/moe_tables.py :class:`~draftsim.sim.cost.moe_tables.GranularMLA`, the same parts and
        lookups :func:`~draftsim.sim.cost.moe_tables.decode_step` prices SGLang's decode layer with): the
        projections from its GEMM table (block-FP8 kernels first for float8 weights), the absorbed BMMs and
        the MLA decode kernel (at the KV dtype's rows) decoding, the kv_b projection and the MLA prefill
        kernel prefilling."""
        kv = kv_table_dtype(self.kv_dtype, self.dtype)
        gen, ctx = (GranularMLA.of(self.model, self.root, self.system, self.framework, self.dtype, kv, heads, phase=phase)
                    for phase in ("generation", "context"))
        self._granular = (gen, ctx)

        def parts(mla: GranularMLA | None) -> str:
            if mla is None:
                return "the catalog roofline (no MLA context table)"
            gemms = [p.name.removeprefix("MLA ") for p in mla.parts if p.kind == "gemm"]
            kernels = ", ".join(mla.gemms.kernels) if mla.gemms is not None else "none"
            out = [f"{', '.join(gemms)} {self._rel(mla.gemm_path)} ({kernels}, the first that measured the shape)"]
            if mla.bmm:
                out.append("absorbed BMMs " + mla.source(next(p for p in mla.parts if p.kind == "bmm"), self._rel))
            out.append("kernel " + mla.source(next(p for p in mla.parts if p.kind == "kernel"), self._rel))
            return "; ".join(out)

        self._sources["attention"] = (f"MLA parts as {self.framework} runs them (AIConfigurator's granular composition, "
                                      f"sim/cost/moe_tables.py GranularMLA) at {heads} query heads: decode: {parts(gen)}; "
                                      f"prefill: {parts(ctx)}" + ("; data-parallel: every head, each device's own sequences"
                                                                  if self.dp_attention else ""))

    def _load_experts(self) -> None:
        m = self.model
        self._routed = measured_experts(m, self.hardware.name, self.engine, self.dtype, self.tp, self.expert_parallel)
        split = f"moe_tp {1 if self.expert_parallel else self.tp}, moe_ep {self.tp if self.expert_parallel else 1}"
        if self._routed is None:
            self._sources["routed experts"] = (f"estimated: roofline (no measured fused MoE of {m.experts} x {m.expert_intermediate}, top-"
                                               f"{m.experts_per_token}, hidden {m.hidden}, {self.dtype}, {split})")
        else:
            r = self._routed
            self._sources["routed experts"] = (f"{self._rel(Path(r.source))} ({r.kernel}, {r.moe_dtype}, {r.distribution} routing, {split}), "
                                               f"{m.moe_layers} MoE layers, {int(r.tokens[0])}..{int(r.tokens[-1])} tokens measured")
        if self.fused_shared_expert:
            self._sources["shared expert (fused)"] = "estimated: " + fused_shared_expert_source(m) + " (uniform routing's expected awake experts)"

    def _attention_grid(self, path: Path, axis: str, q_heads: int, kv_heads: int, hd: int):
        """The table's grid (batch × ``axis``) for this head layout, its kernel and how it was found:
        the layout's own rows, or between the two measured query-head counts around it (same KV heads
        and head_dim: linear in query heads); (None, "", "") where neither exists."""
        kernel, df = attention_rows(path, kv_table_dtype(self.kv_dtype, self.dtype))
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

    def _gemm_curve(self, name: str, n: int, k: int, table: "_GemmTable | None" = None) -> tuple[np.ndarray, bool, str]:
        """Seconds at the bfloat16 table's token counts for width (n, k): ``table``'s (default the bfloat16
        one), or outside its widths the roofline scaled at the nearest measured width."""
        if table is not None:  # another dtype's table: its curve at the bfloat16 table's token counts
            c, measured, note = self._gemm_curve_of(table, name, n, k)
            return np.interp(self._gemm.m, table.m, c), measured, note
        return self._gemm_curve_of(self._gemm, name, n, k)

    def _gemm_curve_of(self, g: "_GemmTable", name: str, n: int, k: int) -> tuple[np.ndarray, bool, str]:
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
        # the scaled curve made non-decreasing in m again (the running maximum: a cleaned row times a smooth ratio, no noise
        # to pool): the fitted curves' ratio at two widths varies with m
        scaled = anchor * self._estimated_gemm(g.m, n, k) / self._estimated_gemm(g.m, nc, kc)
        return monotone_table(scaled, (g.m,), envelope="upper").values, False, note

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
            out[over] = curve[-1] * np.maximum(ratio_num / ratio_den, 1.0)  # never below the table's largest m (as _anchored)
        return out

    def _attention_seconds(self, B, N, cached, pairs) -> np.ndarray:
        """Every layer's attention: decoding from the decode table, a prefill chunk from the prefill table at
        its equal-work prompt but never less than the decode path's price of the same call (reading the
        sequences' caches); each table anchored where it ends (:func:`_anchored`)."""
        nbar = N / B
        cbar = cached / B
        decode = nbar <= DECODE_QUERIES
        dec = self._decode_attention(B, N, cached, pairs, decode)
        if not np.any(~decode):
            return dec
        n_eq = np.maximum(equal_work_prompt(B, pairs), 1.0)  # (an empty call's pairs are 0, its B and N held at 1)
        pre = self._prefill_attention(B, N, cached, pairs, n_eq, ~decode)
        if self._attn_ctx is not None and np.any(~decode & (cbar > 0)):
            self._note("attention", "a prefill chunk after cached tokens priced as the whole prompt of its query-key pairs")
        # a chunk reads its sequences' caches: at least its last DECODE_QUERIES tokens' verification over everything before them
        # (the decode path's price); the equal-work prompt reads only its own short prompt's KV
        floor = self._decode_attention(*self._last_queries(B, cached, nbar), np.zeros(np.shape(B), dtype=bool))
        if np.any(~decode & (floor > pre)):
            self._note("attention", f"a prefill chunk priced at least as its last {DECODE_QUERIES} tokens' verification over the "
                                    "cache and the chunk before them (it reads their KV)")
        return np.where(decode, dec, np.maximum(pre, floor))

    @staticmethod
    def _last_queries(B, cached, nbar):
        """(B, N, cached, pairs) of the verification a chunk of ``nbar`` > DECODE_QUERIES new tokens per sequence
        ends with: its last DECODE_QUERIES tokens over the cache and the chunk's earlier tokens."""
        q = float(DECODE_QUERIES)
        c = cached / B + np.maximum(nbar - q, 0.0)
        return B, B * q, B * c, B * (q * c + q * (q + 1) / 2)

    def _decode_attention(self, B, N, cached, pairs, sel) -> np.ndarray:
        """The decode path's price of every call (notes for the ``sel`` calls): the decode table at (sequences,
        cached tokens before the new one) — a sequence verifying n tokens one query over c + n − 1, or under batch
        expansion n sequences over c + (n − 1)/2 — anchored where the table ends (the curve's KV length: step + 1)."""
        c = self.curves
        nbar, cbar = N / B, cached / B
        rows, step = (N, cbar + (nbar - 1) / 2) if self.kv_per_query else (B, cbar + nbar - 1)
        if np.any(sel & (nbar > 1)) and self._attn is not None:
            self._note("attention", f"{'batch expansion: one query per sequence' if self.kv_per_query else 'several new tokens per sequence priced as one query over their context (KV read once)'}")
        if c.decode is None or (self._attn is None and self.kv_bytes != CURVE_BYTES):  # no table, or no rows at this KV dtype
            if np.any(sel):
                self._note("attention", "no decode attention table: catalog roofline" if c.decode is None else
                           f"no {self.kv_dtype}-KV rows of this head layout (the curve is fitted on bfloat16-KV rows): catalog roofline")
            return self._roof_attention_seconds(N, cached, pairs)
        return self._table_or_curve(self._attn, lambda x, y: c.decode_seconds(x, y + 1, *self._layout), rows, step, "decode", sel)

    def _prefill_attention(self, B, N, cached, pairs, n_eq, sel) -> np.ndarray:
        """The prefill table at (B, the equal-work prompt), anchored where it ends (notes for the ``sel`` calls)."""
        c = self.curves
        if c.prefill is None or (self._attn_ctx is None and self.kv_bytes != CURVE_BYTES):
            if np.any(sel):
                self._note("attention", "no prefill attention table: catalog roofline" if c.prefill is None else
                           f"no {self.kv_dtype}-KV rows of this head layout (the curve is fitted on bfloat16-KV rows): catalog roofline")
            return self._roof_attention_seconds(N, cached, pairs)
        return self._table_or_curve(self._attn_ctx, lambda x, y: c.prefill_seconds(x, y, *self._layout), B, n_eq, "prefill", sel)

    def _table_or_curve(self, grid, curve, x, y, kind: str, sel) -> np.ndarray:
        """Every layer's attention from ``grid`` (the measured table of the model's head layout) at (x, y),
        anchored where it ends (:func:`_anchored`: the table at its edge × ``curve``(x, y) / ``curve``(edge)); the
        efficiency ``curve`` fitted on the ``kind`` attention table alone where the table holds no rows of the
        layout (notes for the ``sel`` calls)."""
        fitted = f"the efficiency curve fitted on the {kind} attention table"
        if grid is None:
            if np.any(sel):
                self._note("attention", f"head layout outside the measured table: roofline with {fitted}")
            return np.asarray(curve(x, y), np.float64) * self.model.layers
        t, ok = _anchored(grid, x, y, curve)
        if np.any(sel & ~ok):
            self._note("attention", f"batch x context outside the measured table: the table at its edge scaled by the roofline with {fitted}")
        return np.where(np.isnan(t), np.asarray(curve(x, y), np.float64), t) * self.model.layers

    def _roof_attention_seconds(self, N, cached, pairs) -> np.ndarray:
        """The catalog roofline of attention (no table of its kind): KV read, queries, query-key pairs."""
        read = pairs if self.kv_per_query else cached + N
        kv_s, q_s, pair_s = self._roof_attention
        return np.maximum(read * kv_s + N * q_s, pairs * pair_s)

    def _measured_allreduce_seconds(self, Np) -> np.ndarray | float:
        """The tp all-reduces (2 per layer + the embedding's) at their measured times."""
        if self.tp == 1:
            return 0.0
        m, L = self.model, self.model.layers
        count = 2 * L + 1
        msg = np.asarray(Np, np.float64) * m.hidden
        ring = 2 * (self.tp - 1) / self.tp
        bw = self.hardware.interconnect_bandwidth * self.ici_efficiency
        graphed = np.asarray(Np) <= (self.graph_tokens[-1] if self.graph_tokens else np.inf)
        curve = self.curves.allreduce

        def roof_at(elements):
            if curve is None:
                return self.hardware.interconnect_latency + ring * elements * self.bytes / bw
            # the roofline with the efficiency curve fitted on the all-reduce table (eager: + a launch)
            return np.where(graphed, self.curves.allreduce_seconds(elements, self.tp), self.curves.allreduce_seconds(elements, self.tp, eager=True))
        how = "roofline with the efficiency curve fitted on the all-reduce table" if curve is not None else "catalog roofline"
        if self._ar_tables is None:
            self._note("allreduce", f"no measured all-reduce at {self.tp} GPUs: {how}")
            return count * roof_at(msg)
        # kernel time alone (the graph rows) unless the engine runs this step eagerly: beyond its largest
        # captured size; without captured sizes (engine none, or graphs not modelled) the kernels alone
        out = np.zeros(np.shape(msg))
        for kind, sel in (("graph", graphed), ("eager", ~graphed)):
            if not np.any(sel):
                continue
            sizes, secs = self._ar_tables.get(kind) or next(iter(self._ar_tables.values()))
            t, outside = _table_at(sizes, secs, msg, roof_at)  # never below the largest measured message (as every table)
            if np.any(sel & outside):
                self._note("allreduce", f"message outside {sizes[0]:.0f}..{sizes[-1]:.0f} elements: the table at its edge scaled by the {how}")
            out = np.where(sel, t, out)
        return count * out

    def _parts_seconds(self, stats: BatchStats) -> dict[str, np.ndarray]:
        """Seconds per operator kind (arrays of the calls' shape); active calls only are meaningful."""
        B = np.maximum(np.asarray(stats.sequences, np.float64), 1.0)
        N = np.maximum(np.asarray(stats.tokens, np.float64), 1.0)
        rows = N if stats.rows is None else np.maximum(np.asarray(stats.rows, np.float64), 1.0)
        Np = N if self.graph_tokens is None else pad_tokens(N, self.graph_tokens)
        Nr = rows if self.graph_tokens is None else pad_tokens(rows, self.graph_tokens)
        cached, pairs = np.asarray(stats.cached, np.float64), np.asarray(stats.pairs, np.float64)
        # the layers' tokens and sequences on a device: all of them, or with data-parallel attention the busiest rank's share
        Bd, Nd, Ndp, cd, pd = B, N, Np, cached, pairs
        if self.dp_attention:
            Bd, Nd, cd, pd = _busiest_rank(B, N, cached, pairs, self.tp)
            Ndp = Nd if self.graph_tokens is None else pad_tokens(Nd, self.graph_tokens)
        out = {"gemm layers": self._gemm_seconds(Ndp, self._layer_curve, "gemm layers"),
               "gemm lm_head": self._gemm_seconds(Nr, self._head_curve, "gemm lm_head"),
               "attention": (self._mla_seconds(Bd, Nd, cd, pd, Ndp) if self.model.kv_lora_rank else self._attention_seconds(Bd, Nd, cd, pd))}
        if self.model.experts:
            out["routed experts"] = self._routed_seconds(Np)
            if self.fused_shared_expert:
                out["shared expert (fused)"] = fused_shared_expert_seconds(out["routed experts"], Np, self.model)
        if self.dp_attention:
            out["all-to-all"] = self._a2a_seconds(Ndp)
        else:
            out["allreduce"] = np.broadcast_to(self._measured_allreduce_seconds(Np), N.shape)
        out["elementwise"] = self._elementwise_seconds(Ndp)
        out["other collectives"] = np.broadcast_to(self._other_comm_seconds(N), N.shape)
        out["host"] = np.full(N.shape, self.overhead + self.overhead_per_layer * self.model.layers)
        return out

    def _mla_seconds(self, B, N, cached, pairs=None, Np=None) -> np.ndarray:
        """The latent attention of every layer: the engine's MLA parts summed (:meth:`_granular_total`), or the
        MLA module tables' blocks (module docstring of sim/cost/moe_operators.py); each anchored where its tables
        end (the tables at their edge scaled by the catalog roofline's latent attention, :func:`_anchored`), the
        roofline's latent attention itself where no edge is measured (recorded). A prefill chunk costs at least
        its last :data:`DECODE_QUERIES` tokens' verification over everything before them (as dense attention)."""
        B, N, cached = (np.asarray(x, np.float64) for x in (B, N, cached))
        shape = np.broadcast_shapes(B.shape, N.shape, cached.shape)
        B, N, cached = (np.broadcast_to(x, shape) for x in (B, N, cached))
        pairs = N * (cached / B + (N / B + 1) / 2) if pairs is None else np.broadcast_to(np.asarray(pairs, np.float64), shape)
        Np = N if Np is None else np.broadcast_to(np.asarray(Np, np.float64), shape)
        nbar = N / B
        decode = nbar <= DECODE_QUERIES
        if self._granular is not None:
            out = self._granular_total(B, N, cached, pairs, Np)
        else:
            out = np.where(decode, self._mla_decode(B, N, cached, decode), np.nan)
            if np.any(~decode):
                out = np.where(decode, out, self._mla_prefill(B, N, cached, ~decode))
        if np.any(~decode):
            Bf, Nf, cf, pf = self._last_queries(B, cached, nbar)
            Nfp = Nf if self.graph_tokens is None else pad_tokens(Nf, self.graph_tokens)
            none = np.zeros(shape, dtype=bool)
            floor = self._granular_total(Bf, Nf, cf, pf, Nfp, none) if self._granular is not None else self._mla_decode(Bf, Nf, cf, none)
            if np.any(~decode & (floor > out)):
                self._note("attention", f"a prefill chunk priced at least as its last {DECODE_QUERIES} tokens' verification over the "
                                        "cache and the chunk before them (it reads their latent cache)")
            out = np.where(decode, out, np.maximum(out, floor))
        return out

    def _latent_curve(self, x, y):
        """The catalog roofline's latent attention of x sequences of one query over y cached tokens each: the MLA
        decode table's anchor."""
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        return self.latent_attention_seconds(x, x, x * y)

    def _latent_prompt_curve(self, x, y):
        """The catalog roofline's latent attention of x whole prompts of y tokens: the MLA context table's anchor."""
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        return self.latent_attention_seconds(x, x * y, 0.0 * x)

    def _mla_decode(self, B, N, cached, sel) -> np.ndarray:
        """The MLA decode table's price (notes for the ``sel`` calls): a sequence verifying n tokens n rows over
        c + (n − 1)/2 cached tokens (each token's projections; the latent read per row)."""
        nbar, cbar = N / B, cached / B
        t, ok = self._mla_table(self._mla, np.where(nbar > 1, N, B), cbar + (nbar - 1) / 2, self._latent_curve, B, N, cached, sel,
                                "batch x context outside the MLA decode table")
        if np.any(sel & ok & (nbar > 1)):
            self._note("attention", "several new tokens per sequence priced as one row each of the MLA decode table (latent read per row)")
        return t

    def _mla_prefill(self, B, N, cached, sel) -> np.ndarray:
        """The MLA context table at (B, the chunk's length), anchored where it ends (notes for the ``sel`` calls)."""
        nbar, cbar = N / B, cached / B
        t, ok = self._mla_table(self._mla_ctx, B, nbar, self._latent_prompt_curve, B, N, cached, sel,
                                "batch x prompt outside the MLA context table")
        if np.any(sel & ok & (cbar > 0)):
            self._note("attention", "a prefill chunk after cached tokens priced as a whole prompt of its length (MLA context table)")
        return t

    def _mla_table(self, grid, x, y, curve, B, N, cached, sel, outside: str) -> tuple[np.ndarray, np.ndarray]:
        """Every layer's latent attention from an MLA module ``grid`` at (x, y), anchored where it ends by the catalog
        roofline's latent attention (``curve``), and whether the table held the call; the roofline's latent attention of
        the call itself where no table or edge is measured (notes for the ``sel`` calls; ``outside`` names the table)."""
        roof = np.broadcast_to(self.latent_attention_seconds(B, N, cached), np.shape(B))
        if grid is None:
            if np.any(sel):
                self._note("attention", "batch x context outside the MLA tables: the catalog roofline's latent attention")
            return np.array(roof, dtype=np.float64), np.zeros(np.shape(B), dtype=bool)
        t, ok = _anchored(grid, x, y, curve)
        if np.any(sel & ~ok):
            self._note("attention", f"{outside}: the table at its edge scaled by the catalog roofline's latent attention")
        return np.where(np.isnan(t), roof, t * self.model.layers), ok

    def _granular_total(self, B, N, cached, pairs, Np, sel=None) -> np.ndarray:
        """The engine's MLA parts summed (:meth:`_granular_seconds`); a call one part of which its tables do not
        hold anchored at the tables' edge (the tokens clamped into the range every part's table measured, the
        kernel's sequences and cached or prompt tokens anchored row by row of its measured grid) and scaled by the
        catalog roofline's latent attention (:func:`_anchored`'s rule); the roofline itself where no edge is measured."""
        local = self._local
        if sel is not None:  # a floor's parts: no notes of their own
            self._local = None
            saved = {k: set(v) for k, v in self.fallbacks.items()}
        try:
            parts = self._granular_seconds(B, N, cached, pairs, Np)
        finally:
            if sel is not None:
                self._local, self.fallbacks = local, saved
        shape = np.shape(B)
        out = np.array(sum(parts.values()), dtype=np.float64) if parts else np.full(shape, np.nan)
        miss = np.isnan(out)
        if not np.any(miss):
            return out
        roof = np.broadcast_to(self.latent_attention_seconds(B, N, cached), shape)
        nbar, cbar = N / B, cached / B
        decode = nbar <= DECODE_QUERIES
        L = self.model.layers
        for mla, sel_phase, seqs, axis, prefill in ((self._granular[0], decode, np.where(nbar > 1, N, B), cbar + (nbar - 1) / 2, False),
                                                    (self._granular[1], ~decode, B, np.maximum(equal_work_prompt(B, pairs), 1.0), True)):
            rows = miss & sel_phase
            if not np.any(rows) or mla is None or mla.kernel is None:
                continue
            lo, hi = mla.token_range()
            if lo > hi:
                continue
            # the parts at the tokens clamped into their tables, the kernel's (sequences, cached or prompt tokens)
            # anchored row by row (_anchored's rule), then scaled from the clamped tokens to the call's
            n, s, a = (np.broadcast_to(v, shape)[rows] for v in (Np, seqs, axis))
            te = np.clip(n, lo, hi)
            edge = _row_anchored(_PartsAt(mla, te, L), s, a, lambda x, y, te=te, pf=prefill: self._latent_curve_at(te, x, y, pf))
            ratio = _held(self._latent_curve_at(n, s, a, prefill) / self._latent_curve_at(te, s, a, prefill), n >= te, n <= te)
            out[rows] = np.where(np.isnan(edge), out[rows], edge * ratio)
        if sel is None and np.any(miss):
            self._note("attention", "outside the MLA parts' tables: the parts at the tables' edge scaled by the catalog roofline's latent attention")
        return np.where(np.isnan(out), roof, out)

    def _latent_curve_at(self, tokens, seqs, axis, prefill: bool = False):
        """The catalog roofline's latent attention at (tokens, sequences, cached tokens per sequence), or prefilling
        (``prefill``) of the sequences' whole prompts of ``axis`` tokens (at least the call's tokens)."""
        tokens, seqs, axis = (np.asarray(x, np.float64) for x in (tokens, seqs, axis))
        if prefill:
            return self.latent_attention_seconds(seqs, np.maximum(tokens, seqs * axis), 0.0 * seqs)
        return self.latent_attention_seconds(seqs, tokens, seqs * axis)

    def _granular_seconds(self, B, N, cached, pairs, Np) -> dict[str, np.ndarray]:
        """Each MLA part of every layer (sim/cost/moe_tables.py GranularMLA), NaN in every part of a call one
        part of which its table does not hold (recorded; :meth:`_mla_seconds` prices that call's attention by
        the roofline). Decoding (at most :data:`DECODE_QUERIES` new tokens a sequence), a sequence verifying
        n > 1 tokens keeps the MLA block's convention: the kernel at n rows over c + (n − 1)/2 cached tokens
        (the latent read per row, more than the kernel reads: estimated, said), the projections and BMMs at
        the call's tokens. Prefilling: the projections at the call's tokens, the prefill kernel at the whole
        prompt of the call's query-key pairs (:func:`equal_work_prompt`, as dense attention: exact for whole
        prompts; a chunk after cached tokens estimated, said). ``Np``: the tokens the engine's CUDA graphs run."""
        gen, ctx = self._granular
        L, shape = self.model.layers, np.shape(B)
        B, N, cached = (np.broadcast_to(np.asarray(x, np.float64), shape) for x in (B, N, cached))
        Np = np.broadcast_to(np.asarray(Np, np.float64), shape)
        pairs = np.zeros(shape) if pairs is None else np.broadcast_to(np.asarray(pairs, np.float64), shape)
        nbar, cbar = N / B, cached / B
        decode = nbar <= DECODE_QUERIES
        calls = {"decode": (gen, decode, np.where(nbar > 1, N, B), cbar + (nbar - 1) / 2),
                 "prefill": (ctx, ~decode, B, np.maximum(equal_work_prompt(B, pairs), 1.0))}
        out: dict[str, np.ndarray] = {}
        missing = np.zeros(shape, dtype=bool)
        for phase, (mla, sel, seqs, axis) in calls.items():
            if not np.any(sel):
                continue
            if mla is None:
                self._note("attention", f"no {self.framework} MLA {phase} table: the catalog roofline's latent attention")
                missing |= sel
                continue
            for p in mla.parts:
                t = L * mla.seconds(p, Np, seqs, axis)
                out[p.name] = np.where(sel, t, out.get(p.name, np.zeros(shape)))
                out_of = sel & np.isnan(t)
                if np.any(out_of):
                    self._note("attention", f"{p.name} outside {self.framework}'s {phase} tables: the catalog roofline's latent attention")
                    missing |= out_of
        if np.any(decode & (nbar > 1) & ~missing):
            self._note("attention", "several new tokens per sequence: the MLA kernel at one row per token over c + (n - 1)/2 cached tokens "
                                    "(latent read per row), the BMMs and projections at the call's tokens")
        if np.any(~decode & (cbar > 0) & ~missing):
            self._note("attention", "a prefill chunk after cached tokens: the MLA prefill kernel at the whole prompt of its query-key pairs")
        for name in out:
            out[name] = np.where(missing, np.nan, out[name])
        return out

    def mla_parts(self, batch: int, new_tokens: int = 1, context: int = 0) -> list[Part]:
        """The ``attention`` part of one uniform call (:meth:`breakdown`) split into the engine's MLA parts,
        each with the table that prices it; one part where the call leaves the tables (the parts at their edge
        scaled by the roofline) or a prefill chunk is priced at its last tokens' verification (or the engine
        prices latent attention as a whole block: [])."""
        if self._granular is None:
            return []
        stats = BatchStats.of_shape(batch, new_tokens, context)
        B = np.maximum(np.asarray(stats.sequences, np.float64), 1.0)
        N = np.maximum(np.asarray(stats.tokens, np.float64), 1.0)
        cached, pairs = np.asarray(stats.cached, np.float64), np.asarray(stats.pairs, np.float64)
        if self.dp_attention:  # the busiest rank's share, as _parts_seconds
            B, N, cached, pairs = _busiest_rank(B, N, cached, pairs, self.tp)
        Np = N if self.graph_tokens is None else pad_tokens(N, self.graph_tokens)
        self._local = {}
        try:
            secs = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in self._granular_seconds(B, N, cached, pairs, Np).items()}
            note = "; ".join(sorted(self._local.get("attention", ())))
        finally:
            self._local = None
        self._local = {}
        try:
            total = float(np.asarray(self._mla_seconds(B, N, cached, pairs, Np)).reshape(-1)[0])
            note = "; ".join(sorted(self._local.get("attention", ())))
        finally:
            self._local = None
        if not secs or any(np.isnan(v) for v in secs.values()) or not np.isclose(sum(secs.values()), total, rtol=1e-12, atol=0):
            # outside the parts' tables (anchored at their edge), or a prefill chunk at its verification floor: one part
            return [Part("attention", total, False, "the MLA parts at their tables' edge scaled by the catalog roofline's latent attention"
                         if "edge" in note else "the MLA decode parts of the chunk's last tokens" if "at least" in note else
                         "catalog roofline's latent attention", note)]
        mla = self._granular[0 if float((N / B).reshape(-1)[0]) <= DECODE_QUERIES else 1]
        return [Part(p.name, secs[p.name], not note, mla.source(p, self._rel), note) for p in mla.parts]

    def _routed_seconds(self, Np) -> np.ndarray:
        """The routed experts of every MoE layer: the fused-MoE table at the call's tokens; beyond its
        largest count that time scaled by the roofline's ratio; without a table the roofline (recorded)."""
        r, Np = self._routed, np.asarray(Np, np.float64)
        roof = self.expert_seconds
        if r is None:
            self._note("routed experts", "no measured fused MoE of this shape: roofline")
            return np.asarray(roof(Np), np.float64) * np.ones_like(Np)
        t, outside = _table_at(r.tokens, r.seconds, Np, roof)
        if np.any(outside):
            self._note("routed experts", f"outside {int(r.tokens[0])}..{int(r.tokens[-1])} tokens: the table at its edge scaled by the roofline")
        return self.model.moe_layers * t

    def _a2a_seconds(self, Nd) -> np.ndarray:
        """Dispatch and combine per MoE layer at the tokens on a device (module docstring of sim/cost/moe_operators.py);
        a count beyond a kernel's measured ones anchored at its last (first) row and scaled by the roofline interconnect
        (the ratio held ≥ 1 beyond, ≤ 1 below: as every table); the roofline itself where no kernel is measured."""
        m, Nd = self.model, np.asarray(Nd, np.float64)
        D, bw = self.tp, self.hardware.interconnect_bandwidth * self.ici_efficiency

        def roof(n):
            return 2 * (self.hardware.interconnect_latency + n * m.experts_per_token * m.hidden * self.bytes * (D - 1) / D / bw)
        out = np.full(Nd.shape, np.nan)
        if self._a2a:
            for kind, sel in (("low_latency", Nd <= A2A_LOW_LATENCY_MAX), ("normal", Nd > A2A_LOW_LATENCY_MAX)):
                tab = self._a2a.get(kind)
                if tab is None or not np.any(sel):
                    continue
                t, outside = _table_at(*tab, Nd, roof)
                out[sel] = t[sel]
                if np.any(sel & outside):
                    self._note("all-to-all", f"tokens a device outside the measured {kind.replace('_', '-')} all-to-all: the table at its "
                                             "edge scaled by the roofline interconnect")
        miss = np.isnan(out)
        if np.any(miss):
            self._note("all-to-all", "widths or devices outside the measured all-to-all: roofline interconnect" if not self._a2a else
                       "a DeepEP kernel the all-to-all table does not measure at these widths and devices: roofline interconnect")
            out[miss] = roof(Nd[miss])
        return m.moe_layers * out

    def _elementwise_seconds(self, Np) -> np.ndarray:
        m, t = self.model, (1 if self.dp_attention else self.tp)
        bw, const = self._mem_op
        # the MLP activation: every layer's of a dense model; a mixture of experts' dense layers and shared experts (the fused MoE kernel holds its own)
        act = (m.layers * (m.mlp_matrices * m.intermediate // t) if not self.moe else
               (m.layers - m.moe_layers) * m.mlp_matrices * m.intermediate // t
               + (0 if self.fused_shared_expert else m.moe_layers * m.mlp_matrices * m.shared_experts * m.expert_intermediate // t))
        per_token = (2 * (2 * m.hidden + 2 * m.hidden) * m.layers + act) * self.bytes
        kernels = 3 * m.layers + 1
        return np.asarray(Np, np.float64) * (per_token + 2 * m.hidden * self.bytes) / bw + kernels * const

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

    def _time(self, stats: BatchStats) -> np.ndarray:
        out = sum(self._parts_seconds(stats).values())
        if self.floor:
            out = np.maximum(out, self.floor)
        return out

    def shape_time(self, batch, new_tokens, context=0) -> np.ndarray:
        """:meth:`CostModel.shape_time` through the batch sums (the roofline's shortcut is its own)."""
        return CostModel.shape_time(self, batch, new_tokens, context)

    # -- memory with data-parallel attention -------------------------------------------------------
    def weight_bytes_per_device(self) -> float:
        """The roofline's, plus with data-parallel attention the attention weights every device holds whole."""
        out = super().weight_bytes_per_device()
        if getattr(self, "dp_attention", False):
            split, _ = attention_params(self.model)
            out += self.model.layers * split * (1 - 1 / self.tp) * self.weight_bytes / self.pp
        return out

    def kv_bytes_per_device(self, batch, context) -> np.ndarray:
        """The roofline's; with data-parallel attention a device caches its own sequences only, whole
        (the latent not replicated, every KV head): the batch's cache over the devices."""
        if not getattr(self, "dp_attention", False):
            return super().kv_bytes_per_device(batch, context)
        m = self.model
        per_token = (m.kv_per_token if m.kv_lora_rank else 2 * m.kv_heads * m.head_dim * m.layers) * self.kv_bytes / self.pp
        return np.asarray(batch, dtype=np.float64) * np.asarray(context, dtype=np.float64) * per_token / self.tp

    # -- what was measured -----------------------------------------------------------------------
    def breakdown(self, batch: int, new_tokens: int = 1, context: int = 0) -> list[Part]:
        """One uniform call (``batch`` sequences of ``new_tokens`` on ``context`` cached tokens each),
        part by part: seconds, measured or estimated, and the table or formula behind it."""
        stats = BatchStats.of_shape(batch, new_tokens, context)
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
                    "; ".join(filter(None, [f"{name}: {note}" for name, _, note in layers if note] + [said("gemm layers")]))),
               Part("gemm lm_head", secs["gemm lm_head"], head[1] and not said("gemm lm_head"), self._sources["gemm"].split(":")[0],
                    "; ".join(filter(None, [head[2], said("gemm lm_head")]))),
               Part("attention", secs["attention"], not said("attention") and "estimated" not in self._sources["attention"],
                    self._sources["attention"], said("attention"))]
        if "routed experts" in secs:
            out.append(Part("routed experts", secs["routed experts"], self._routed is not None and not said("routed experts"),
                            self._sources["routed experts"], said("routed experts")))
        if "shared expert (fused)" in secs:
            out.append(Part("shared expert (fused)", secs["shared expert (fused)"], False, self._sources["shared expert (fused)"],
                            said("routed experts")))
        for key in ("allreduce", "all-to-all"):
            if key in secs and key in self._sources:
                out.append(Part(key, secs[key], not said(key) and not self._sources[key].startswith(("estimated", "roofline")),
                                self._sources[key], said(key)))
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
