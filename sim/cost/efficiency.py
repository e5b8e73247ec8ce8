"""Efficiency curves fitted on measured kernel tables: what the operator model prices where a
table lacks a shape or an operator, in place of a roofline at constant efficiency.

Each operator kind's time is a roofline with a fitted efficiency and a fixed cost per kernel::

    t = fixed + max(t_mem · s_mem(x), t_cmp · s_cmp(x)),   s = 1 / efficiency ≥ 1

where ``t_mem`` is the kernel's bytes over the hardware's peak memory (or, for a collective,
interconnect) bandwidth and ``t_cmp`` its FLOPs over the peak bfloat16 rate (the catalog's cited
numbers, ``sim/data/hardware.json``), and ``log s`` is a quadratic polynomial in the log2 features
``x`` below, fitted by least squares, separately on the rows the roofline calls memory-bound and
compute-bound. ``fixed`` is chosen among fractions of the smallest measured latency (the one whose
fit leaves the smallest mean squared log error). A prediction holds each feature inside the range
it was fitted on (the efficiency at the edge of the measurements carries beyond them) and never
exceeds the peak (s ≥ 1).

* **GEMM** (``gemm_perf.parquet``, bfloat16, PyTorch's linear): bytes (n·k + m·k + m·n)·2, FLOPs
  2·m·n·k; x = log2 of the token count m, n and k.
* **Decode attention** (``generation_attention_perf.parquet``, FlashAttention-3, bfloat16 KV
  cache, full attention): one query per sequence over ``kv_len`` = step + 1 cached entries; bytes
  the KV read B·kv_len·2·kv_heads·head_dim·2 plus the queries and outputs, FLOPs
  4·heads·head_dim·B·kv_len; x = log2 of batch × context, batch, KV heads, head_dim and the GQA
  ratio. A FlashAttention-2 table (A100's, :data:`FA2_KERNELS`) is priced with that kernel's parallel
  structure (:func:`fa2_decode_split`, the SM count from the catalog): the bytes of each thread block's
  whole key tiles in waves over the SMs, x adding log2 of the waves, its combine kernel (KV split) and
  its queries' copy (held out by family 6.4%, was 18.4% with the plain terms).
* **Prefill attention** (``context_attention_perf.parquet``): B causal prompts of ``isl`` tokens;
  bytes B·isl·(2·heads + 2·kv_heads)·head_dim·2, FLOPs 4·heads·head_dim·B·isl(isl+1)/2; x = log2
  of batch × tokens, tokens, heads, KV heads and head_dim.
* **All-reduce** (``custom_allreduce_perf.parquet``, the CUDA-graph rows: the kernel alone): not
  the quadratic but vLLM's algorithms (:class:`CollectiveCurve`, :func:`allreduce_algorithm`): its
  custom kernel's one-shot (each rank reads every peer's buffer: (g−1)·e·2 bytes over the
  interconnect) for small messages, two-shot (reduce-scatter + all-gather, 2(g−1)/g·e·2) above
  vLLM's switch, NCCL (ring, 2(g−1)/g·e·2) from 8 MB and at counts the kernel lacks; each a latency
  growing with log2 of the GPU count (a barrier waits for the last of g−1 peers; the two-shot
  crosses two) plus its bytes at a fitted fraction of the link. The table has no model axis: its
  held-out check fits on the other GPU counts (:func:`gpu_count_holdout`), and the count is a
  physical term, never a feature clipped to the counts fitted. The eager rows' excess over the
  graph rows at small messages is the fixed cost of a kernel launched without a CUDA graph
  (:attr:`Curves.eager_launch`).

What the operator model reads (:class:`Curves`' methods) is each curve **made non-decreasing** in its
size arguments (:func:`_monotone`: tabulated on a log2 grid of the sizes, its lower envelope, linear in
log2 size between grid points, anchored at the grid's edge beyond it): the quadratic slowdown may fall
faster than the roofline term rises. :func:`family_holdout` scores the fitted curve itself
(:meth:`Curve.seconds`).

The curves are fitted from the installed tables at first use and cached per (tables, GPU, engine)
(:func:`fit_curves`): deterministic (closed-form least squares), well under a second, and always
the pinned tables' own — a committed data file would copy numbers derived from a dependency that
``--cost-model operators`` needs anyway, and could drift from it.

**Held out by model family** (:func:`family_holdout`): fitted on the table rows that the shapes of
some families (Llama, Qwen) use and scored on the rows of the others (Gemma, SmolLM2,
Mistral/Mixtral, DeepSeek, GPT-OSS, GLM), no row in both; a GEMM shape between measured widths
brings the measured widths around it. The all-reduce table has no model axis, so it is held out
by GPU count (:func:`gpu_count_holdout`: fitted on the other counts' rows only).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .catalog import HardwareSpec, ModelSpec
from .kernel_tables import allreduce_rows, attention_rows, gemm_rows, newest_table

__all__ = ["ALLREDUCE_ALGORITHMS", "FIT_FAMILIES", "KINDS", "SPIKE_FACTOR", "SPIKE_NEIGHBOURS", "Cleaned", "CollectiveCurve", "Curve", "Curves",
           "Roofs", "Score", "allreduce_algorithm", "attention_layouts", "family_holdout", "family_of", "fit_collective", "fit_curve",
           "fit_curves", "gemm_shapes", "gpu_count_holdout", "grid_bracket", "grid_edge", "monotone_table", "read_tables"]

#: The operator kinds with a curve.
KINDS = ("gemm", "decode attention", "prefill attention", "allreduce")
#: Catalog name prefix → model family.
FAMILY_PREFIXES = {"llama": "llama", "qwen": "qwen", "gemma": "gemma", "smollm": "smollm", "mistral": "mistral", "mixtral": "mistral",
                   "deepseek": "deepseek", "gpt-oss": "gpt-oss", "glm": "glm"}
#: The families the held-out curves are fitted on (the others are scored).
FIT_FAMILIES = ("llama", "qwen")
#: Tensor-parallel sizes a family's shapes are taken at.
TP_SIZES = (1, 2, 4, 8)
#: Fractions of the smallest measured latency tried as the fixed cost per kernel.
_FIXED_FRACTIONS = np.linspace(0.0, 0.98, 50)
BYTES = 2  # bfloat16: every table row priced here
#: A measured cell more than this many times both its neighbours along an axis is a spike (monotone_table) ...
SPIKE_FACTOR = 2.0
#: ... where those two neighbours agree within this ratio (a smooth curve around one outlier).
SPIKE_NEIGHBOURS = 1.3
TABLE_ENVELOPE = "isotonic"


@dataclass(frozen=True)
class Cleaned:
    """A measured table made non-decreasing (:func:`monotone_table`): the values, how many isolated spikes
    were replaced and how many cells changed (spikes included), and the cells changed (a mask)."""

    values: np.ndarray
    spikes: int
    cells: int
    changed: np.ndarray


def monotone_table(values, coords=None, axes=None, envelope: str = TABLE_ENVELOPE) -> Cleaned:
    """A measured table (NaN: not measured) made non-decreasing along each size axis, in two steps:

    1. **Isolated spikes removed**: along each axis, a measured cell more than :data:`SPIKE_FACTOR` (2)
       times both its measured neighbours, where those neighbours agree within :data:`SPIKE_NEIGHBOURS`
       (30%), is one bad measurement (AIConfigurator's A100 decode table: 93.7 us at batch 4, step 511,
       between 22.6 and 27.4 us): it is replaced by the linear interpolation of its neighbours in the
       axis's coordinate (``coords``, default the index), so step 2 does not pool or carry it. Only
       spikes up: a dip below both neighbours is what step 2 pools.
    2. **Isotonic regression** (``envelope="isotonic"``, :data:`TABLE_ENVELOPE`): along each axis in
       turn the least-squares non-decreasing fit of the measured cells (pool adjacent violators: a run
       of cells that falls is replaced by its mean), then the running maximum along each axis to settle
       what a later axis's pass undid of an earlier's (a no-op on one axis). A table already monotone
       along every axis is left exactly as measured.

    Not the running maximum alone (``envelope="upper"``), which :class:`~draftsim.sim.cost.profile.ProfileCost`
    applies to a profile's few, far-apart medians: a kernel table is dense and flat where it is memory-bound,
    with noise of ±10-15% (SGLang's H100 torch linear at n = 6144, k = 4096 reads 20.6-25.3 us from m = 1 to
    256), and the running maximum reads the top of that noise: it raised Llama-3.1-8B's decode GEMMs on an H100
    by 12-15% at batch 16-48, the published reproduction's worst error from 44.6% to 50.5% (isotonic: 43.5%) and
    Vidur's A100 GEMM median error from 9.3% to 10.2%. The cost of isotonic regression: the smallest shape may
    change (a one-token GEMM slower than a two-token one is pooled with it), so what is derived from it moves
    (benchmarks/derive_mbu.py's H100 MBU 0.732 -> 0.737, H200 0.648 -> 0.650). ``envelope="lower"``: each cell
    the smallest value at or above it (a fitted curve's, :func:`_monotone`).

    Multilinear interpolation of a table monotone along each axis is monotone along each axis.
    """
    raw = np.asarray(values, np.float64)
    v = np.array(raw)
    axes = list(range(v.ndim) if axes is None else axes)
    nan = np.isnan(v)
    spikes = 0
    for ax in axes:
        x = np.arange(v.shape[ax], dtype=np.float64) if coords is None else np.asarray(coords[ax], np.float64)
        w = np.moveaxis(v, ax, -1)  # a view: writes go to v
        for i in range(1, w.shape[-1] - 1):
            lo, mid, hi = w[..., i - 1], w[..., i], w[..., i + 1]
            spike = ((mid > SPIKE_FACTOR * np.maximum(lo, hi)) & (np.maximum(lo, hi) <= SPIKE_NEIGHBOURS * np.minimum(lo, hi)))
            if np.any(spike):
                f = (x[i] - x[i - 1]) / (x[i + 1] - x[i - 1])
                w[..., i] = np.where(spike, lo + f * (hi - lo), mid)
                spikes += int(spike.sum())
    if envelope == "isotonic":
        for ax in axes:
            v = np.apply_along_axis(_pava, ax, v)
        envelope = "upper"  # a later axis's pass may undo an earlier's: the running maximum settles it
    for ax in axes:  # an unmeasured cell passes the running value on (restored to NaN at the end)
        if envelope == "upper":
            v = np.fmax.accumulate(v, axis=ax)
        else:  # the lower envelope: each cell the smallest value at or above it (a fitted curve's, _monotone)
            v = np.flip(np.fmin.accumulate(np.flip(v, axis=ax), axis=ax), axis=ax)
    out = np.where(nan, np.nan, v)
    changed = ~nan & (out != raw)
    return Cleaned(out, spikes, int(changed.sum()), changed)


def _pava(y: np.ndarray) -> np.ndarray:
    """The least-squares non-decreasing fit of the measured values of ``y`` (pool adjacent violators)."""
    ok = ~np.isnan(y)
    vals = y[ok]
    blocks: list[list[float]] = []  # [mean, count]
    for x in vals:
        blocks.append([float(x), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks[-1]
            blocks[-1] = [(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2]
    out = np.array(y, dtype=np.float64)
    out[ok] = np.concatenate([np.full(int(c), m) for m, c in blocks]) if blocks else vals
    return out


def grid_edge(xs, ys, values, x, y) -> tuple[np.ndarray, np.ndarray]:
    """The measured point of a table t(x, y) on the grid ``xs`` × ``ys`` (NaN: not measured; each row's
    measurements one run, the tables' holes being corners) that a shape (x, y) outside it is anchored at:
    x clamped into the grid, then y into the columns measured in both rows around that x (bilinear
    interpolation there needs both): a batch × context hole is left along the context."""
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    meas = ~np.isnan(np.asarray(values, np.float64))
    any_ = meas.any(axis=1)
    first = np.where(any_, meas.argmax(axis=1), len(ys) - 1)
    last = np.where(any_, len(ys) - 1 - meas[:, ::-1].argmax(axis=1), 0)
    x, y = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(y, np.float64))
    xc = np.clip(x, xs[0], xs[-1])
    i = np.clip(np.searchsorted(xs, xc, side="right") - 1, 0, len(xs) - 1)
    i1 = np.where(xs[i] == xc, i, np.minimum(i + 1, len(xs) - 1))
    lo, hi = ys[np.maximum(first[i], first[i1])], ys[np.minimum(last[i], last[i1])]
    return xc, np.clip(y, lo, np.maximum(hi, lo))


@dataclass(frozen=True)
class Roofs:
    """The peaks a curve's roofline terms divide by (B/s, FLOP/s): the catalog hardware's memory
    bandwidth, bfloat16 rate and interconnect bandwidth, and its count of streaming multiprocessors
    (0: not listed), which FlashAttention-2's decode kernel fills in waves (sim/data/hardware.json, cited there)."""

    memory_bandwidth: float
    peak: float
    interconnect_bandwidth: float
    sm_count: int = 0

    @classmethod
    def of(cls, hw: HardwareSpec) -> "Roofs":
        return cls(float(hw.memory_bandwidth), float(hw.peak("bfloat16")), float(hw.interconnect_bandwidth), int(hw.sm_count))


def _poly2(cols: list[np.ndarray]) -> np.ndarray:
    """1, x_i and x_i·x_j (i ≤ j): the quadratic design matrix."""
    out = [np.ones_like(cols[0])] + list(cols)
    for i in range(len(cols)):
        for j in range(i, len(cols)):
            out.append(cols[i] * cols[j])
    return np.stack(out, axis=1)


@dataclass(frozen=True)
class _Regime:
    """log s(x) on one side of the roofline's ridge: a quadratic in the features held inside their
    fitted range (a constant where too few rows were measured there)."""

    weights: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]

    def design(self, feats: list[np.ndarray]) -> np.ndarray:
        return _poly2([np.clip(f, a, b) for f, a, b in zip(feats, self.lo, self.hi)])

    def slowdown(self, feats: list[np.ndarray]) -> np.ndarray:
        return np.exp(np.maximum(self.design(feats) @ np.asarray(self.weights), 0.0))


@dataclass(frozen=True)
class Curve:
    """One operator kind's fitted time: ``fixed + max(t_mem · s_mem(x), t_cmp · s_cmp(x))``
    (see the module docstring); ``rows``: how many measurements it was fitted on; ``source``: the table;
    ``kernel``: the table's ``kernel_source`` where its terms depend on it (decode attention: :func:`decode_attention_terms`)."""

    kind: str
    fixed: float
    mem: _Regime
    cmp: _Regime
    rows: int
    source: str
    kernel: str = ""

    def seconds(self, t_mem, t_cmp, feats: list[np.ndarray]) -> np.ndarray:
        t_mem, t_cmp = np.asarray(t_mem, np.float64), np.asarray(t_cmp, np.float64)
        shape = np.broadcast_shapes(t_mem.shape, t_cmp.shape, *(np.shape(f) for f in feats))
        t_mem, t_cmp = np.broadcast_to(t_mem, shape).reshape(-1), np.broadcast_to(t_cmp, shape).reshape(-1)
        feats = [np.broadcast_to(np.asarray(f, np.float64), shape).reshape(-1) for f in feats]
        out = self.fixed + np.maximum(t_mem * self.mem.slowdown(feats), t_cmp * self.cmp.slowdown(feats))
        return out.reshape(shape)

    def describe(self) -> str:
        return f"{self.kind}: efficiency curve fitted on {self.rows} rows of {self.source}, fixed {self.fixed * 1e6:.2f} us per kernel"


def fit_curve(kind: str, t_mem: np.ndarray, t_cmp: np.ndarray, feats: list[np.ndarray], seconds: np.ndarray, source: str,
              kernel: str = "") -> Curve:
    """The :class:`Curve` of measured ``seconds`` at roofline terms (``t_mem``, ``t_cmp``) and log2
    features ``feats`` (one array per feature, a value per row); ``kernel``: what its terms were computed for."""
    t_mem, t_cmp, seconds = (np.asarray(a, np.float64) for a in (t_mem, t_cmp, seconds))
    feats = [np.asarray(f, np.float64) for f in feats]
    floor = float(seconds.min())
    sides = []  # per regime: its rows, its roofline term there, the pseudo-inverse of its design, its design on all rows
    for sel, t in ((t_mem >= t_cmp, t_mem), (t_mem < t_cmp, t_cmp)):
        own = [f[sel] for f in feats]
        lo = tuple(float(f.min()) if sel.any() else 0.0 for f in own)
        hi = tuple(float(f.max()) if sel.any() else 0.0 for f in own)
        shell = _Regime((), lo, hi)
        X = shell.design(own)
        pinv = np.linalg.pinv(X) if len(X) >= 4 * X.shape[1] else None
        sides.append((sel, np.maximum(t[sel], 1e-30), pinv, shell, shell.design(feats)))
    best = None
    for frac in _FIXED_FRACTIONS:  # the fixed cost: the fraction of the smallest latency that fits best
        fixed = frac * floor
        rest = np.maximum(seconds - fixed, 1e-3 * floor)
        regimes, terms = [], []
        for (sel, t, pinv, shell, design_all), t_all in zip(sides, (t_mem, t_cmp)):
            y = np.log(rest[sel] / t)
            if pinv is not None:
                w = pinv @ y
            else:  # too few rows for the quadratic: the median slowdown (none measured: the peak)
                w = np.zeros(design_all.shape[1])
                w[0] = float(np.median(y)) if len(y) else 0.0
            regimes.append(_Regime(tuple(float(v) for v in w), shell.lo, shell.hi))
            terms.append(t_all * np.exp(np.maximum(design_all @ w, 0.0)))
        err = float(np.mean(np.log((fixed + np.maximum(*terms)) / seconds) ** 2))
        if best is None or err < best[0]:
            best = (err, Curve(kind, fixed, regimes[0], regimes[1], int(len(seconds)), source, kernel))
    return best[1]


# -- the roofline terms and features of each kind ---------------------------------------------------
def gemm_terms(hw: Roofs, m, n, k):
    m, n, k = (np.asarray(a, np.float64) for a in (m, n, k))
    t_mem = (n * k + m * k + m * n) * BYTES / hw.memory_bandwidth
    t_cmp = 2 * m * n * k / hw.peak
    return t_mem, t_cmp, [np.log2(m), np.log2(n), np.log2(k)]


#: The decode tables' kernels that are FlashAttention-2 (``kernel_source``; vLLM's FA2 build, vllm-project/flash-attention's
#: ``_vllm_fa2_C``: A100's vLLM 0.14.0 table, which names it ``vllm_flash_attn``; Ampere runs no FA3), priced with its
#: split-KV structure (:func:`fa2_decode_split`). The Hopper tables' ``vllm_flash_attn_fa3`` keeps the plain terms.
FA2_KERNELS = ("vllm_flash_attn", "vllm_flash_attn_fa2")


def fa2_splits(units, slots: int, n_blocks, max_splits: int = 128) -> np.ndarray:
    """How many KV splits FlashAttention-2 picks (csrc/flash_attn/flash_api.cpp, ``num_splits_heuristic``, vllm-project/
    flash-attention): one where ``units`` (batch × heads × m-blocks) already fill 80% of ``slots``; else, among the split
    counts up to min(``max_splits``, slots, ``n_blocks``) that change the key tiles per split, the smallest whose wave
    efficiency w / ceil(w), w = units · splits / slots, reaches 85% of the best (single precision, as the C++)."""
    u, nb = np.broadcast_arrays(np.asarray(units, np.int64), np.asarray(n_blocks, np.int64))
    shape, u, nb = u.shape, u.reshape(-1), nb.reshape(-1)
    sp = np.arange(1, max_splits + 1, dtype=np.int64)[None, :]
    cap = np.minimum(np.minimum(max_splits, slots), nb)[:, None]
    per = -(-nb[:, None] // sp)
    prev = -(-nb[:, None] // np.maximum(sp - 1, 1))
    eligible = (sp <= cap) & ((sp == 1) | (per != prev))
    waves = (u[:, None] * sp).astype(np.float32) / np.float32(slots)
    eff = np.where(eligible, waves / np.ceil(waves), np.float32(0.0))
    ok = eligible & (eff >= np.float32(0.85) * eff.max(axis=1, keepdims=True))
    pick = np.argmax(ok, axis=1) + 1
    return np.where(u >= np.float32(0.8) * np.float32(slots), 1, pick).reshape(shape)


def fa2_decode_split(batch, kv_len, heads, kv_heads, head_dim, sm_count: int):
    """FlashAttention-2's decode kernel as vLLM calls it (``flash_attn_varlen_func`` over a paged KV cache, one query per
    sequence; vllm-project/flash-attention csrc/flash_attn/flash_api.cpp ``mha_varlen_fwd`` and
    csrc/flash_attn/src/flash_fwd_launch_template.h, at the vLLM 0.14 era's 7d346be6): (splits, thread blocks, key tiles
    per block, whether the queries are copied).

    * GQA (``heads > kv_heads``) is ``seqlenq_ngroups_swapped``: q (b, 1, kv·g, d) becomes (b·g, kv, d), a block per
      (sequence, KV head, 64 query rows) — ceil(g / 64) m-blocks — and only then the KV is split, by
      :func:`fa2_splits` over ``2 × sm_count`` slots ("We multiply number of SMs by 2 to hard-code the fact that we're
      using 128 threads per block", ``set_params_splitkv``); the reshape is a view where b = 1 or kv = 1, else a copy
      kernel (``q.reshape(...).transpose(1, 2).reshape(...)``). MHA: a block per (sequence, head), never split.
    * The split-KV kernel (``run_mha_fwd_splitkv_dispatch``, always for a paged cache) walks keys in tiles of
      kBlockN = 256 (head_dim ≤ 64), 128 (≤ 128) or 64; each split ceil(tiles / splits) of them. A split count above
      one adds the combine kernel (``flash_fwd_splitkv_combine_kernel``)."""
    b, s, h, kv, hd = (np.ceil(np.asarray(a, np.float64)).astype(np.int64) for a in (batch, kv_len, heads, kv_heads, head_dim))
    b, s, h, kv, hd = np.broadcast_arrays(b, s, h, kv, hd)
    swapped = h > kv
    m_blocks = np.where(swapped, -(-(h // np.maximum(kv, 1)) // 64), 1)
    units = np.where(swapped, b * kv * m_blocks, b * h)
    block_n = np.where(hd <= 64, 256, np.where(hd <= 128, 128, 64))
    n_blocks = -(-s // block_n)
    splits = np.ones_like(b)
    if np.any(swapped):
        pairs, inv = np.unique(np.stack([units[swapped], n_blocks[swapped]]), axis=1, return_inverse=True)
        splits[swapped] = fa2_splits(pairs[0], 2 * int(sm_count), pairs[1])[inv.reshape(-1)]
    tiles = -(-n_blocks // splits)
    return splits, units * splits, tiles * block_n, swapped & (b > 1) & (kv > 1)


def decode_attention_terms(hw: Roofs, batch, kv_len, heads, kv_heads, head_dim, kernel: str = ""):
    """Decode attention's roofline terms and features (the module docstring); for a FlashAttention-2 ``kernel``
    (:data:`FA2_KERNELS`) on hardware whose SM count is listed, its parallel structure (:func:`fa2_decode_split`): the
    bytes are each thread block's whole key tiles (the kernel pays for a tile's padding: 8 sequences × 32 heads at 2
    cached tokens take as long as at 64 on the A100), its blocks run in waves over the SMs (ceil(blocks / SMs) · SMs
    blocks' worth), and the features add log2 of the waves, the combine kernel (splits > 1) and the queries' copy."""
    b, s, h, kv, hd = (np.asarray(a, np.float64) for a in (batch, kv_len, heads, kv_heads, head_dim))
    t_cmp = 4 * h * hd * b * s / hw.peak
    feats = [np.log2(b * s), np.log2(b), np.log2(kv), np.log2(hd), np.log2(h / kv)]
    if kernel in FA2_KERNELS and hw.sm_count > 0:
        splits, blocks, keys, copied = fa2_decode_split(b, s, h, kv, hd, hw.sm_count)
        waves = np.ceil(blocks / hw.sm_count)
        t_mem = (waves * hw.sm_count * keys * 2 * hd + 2 * b * h * hd) * BYTES / hw.memory_bandwidth
        return t_mem, t_cmp, feats + [np.log2(waves), (splits > 1).astype(np.float64), copied.astype(np.float64)]
    t_mem = (b * s * 2 * kv * hd + 2 * b * h * hd) * BYTES / hw.memory_bandwidth
    return t_mem, t_cmp, feats


def prefill_attention_terms(hw: Roofs, batch, isl, heads, kv_heads, head_dim):
    b, n, h, kv, hd = (np.asarray(a, np.float64) for a in (batch, isl, heads, kv_heads, head_dim))
    t_mem = b * n * (2 * h + 2 * kv) * hd * BYTES / hw.memory_bandwidth
    t_cmp = 4 * h * hd * b * n * (n + 1) / 2 / hw.peak
    return t_mem, t_cmp, [np.log2(b * n), np.log2(n), np.log2(h * hd), np.log2(hd)]


#: vLLM's custom all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py, ``CustomAllreduce``): the GPU
#: counts it runs on (``_SUPPORTED_WORLD_SIZES``; any other count is NCCL's) ...
CUSTOM_ALLREDUCE_GPUS = (2, 4, 6, 8)
#: ... and the message it takes, bytes: ``should_custom_ar`` is ``inp_size < max_size``, ``max_size=8192 * 1024``
#: (larger messages are NCCL's, or torch's symmetric memory where vLLM enables it).
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2**20
#: Its kernel (csrc/custom_all_reduce.cuh, ``CustomAllreduce::allreduce``): one-shot (``cross_device_reduce_1stage``, each
#: rank reads every peer's whole buffer) at 2 GPUs always, at up to 4 below 512 KB, at up to 8 below 256 KB; two-shot
#: (``cross_device_reduce_2stage``: a reduce-scatter, a barrier, an all-gather) otherwise. Bytes: (GPUs, below).
ONE_SHOT_BELOW = ((4, 512 * 2**10), (8, 256 * 2**10))
#: The all-reduce's algorithms (:func:`allreduce_algorithm`).
ALLREDUCE_ALGORITHMS = ("one-shot", "two-shot", "nccl")


def allreduce_algorithm(elements, gpus) -> np.ndarray:
    """Which algorithm vLLM runs an all-reduce of ``elements`` bfloat16 values over ``gpus`` GPUs with (an index into
    :data:`ALLREDUCE_ALGORITHMS`): its custom kernel's one-shot or two-shot (:data:`ONE_SHOT_BELOW`) for a count in
    :data:`CUSTOM_ALLREDUCE_GPUS` and a message under :data:`CUSTOM_ALLREDUCE_MAX_BYTES`, else NCCL."""
    b = np.asarray(elements, np.float64) * BYTES
    g = np.asarray(gpus, np.float64)
    custom = np.isin(g, CUSTOM_ALLREDUCE_GPUS) & (b < CUSTOM_ALLREDUCE_MAX_BYTES)
    one = g == 2
    for most, below in ONE_SHOT_BELOW:
        one = one | ((g <= most) & (b < below))
    return np.where(custom, np.where(one, 0, 1), 2)


def allreduce_terms(hw: Roofs, elements, gpus):
    """The bytes a rank moves over the interconnect by the algorithm vLLM runs (:func:`allreduce_algorithm`): one-shot
    (g−1)·e·2 (every peer's buffer read), two-shot and NCCL's ring 2(g−1)/g·e·2 (a reduce-scatter and an all-gather);
    features log2 of the GPU count and the algorithm (:class:`CollectiveCurve`)."""
    e, g = np.asarray(elements, np.float64), np.asarray(gpus, np.float64)
    algo = allreduce_algorithm(e, g)
    moved = np.where(algo == 0, (g - 1) * e * BYTES, 2 * (g - 1) / np.maximum(g, 1) * e * BYTES)
    t_mem = moved / hw.interconnect_bandwidth
    return t_mem, np.zeros_like(t_mem), [np.log2(np.maximum(g, 1.0)), algo.astype(np.float64)]


@dataclass(frozen=True)
class CollectiveCurve:
    """The all-reduce's fitted time, per algorithm ``r`` (:data:`ALLREDUCE_ALGORITHMS`)::

        t = latency_r + per_doubling_r · log2 g + t_mem · slowdown_r,   slowdown_r ≥ 1

    ``t_mem`` the bytes the algorithm moves over the interconnect's peak (:func:`allreduce_terms`). The custom kernel's
    two algorithms share a barrier: a one-shot crosses one (``start_sync``: each rank writes its flag to every peer
    at once, then waits for the last of the g−1 peers' flags: a wait that grows with the count of peers, measured
    as about log2 g, 4.25 / 4.55 / 4.65 us at 2 / 4 / 8 H100s), a two-shot two (``end_sync`` between its halves)
    and its own fixed cost; NCCL has its own latency and bandwidth. Fitted by :func:`fit_collective`;
    ``fixed``: the custom kernel's latency less its barrier's growth."""

    kind: str
    latency: tuple[float, ...]
    per_doubling: tuple[float, ...]
    slowdown: tuple[float, ...]
    rows: int
    source: str

    @property
    def fixed(self) -> float:
        return self.latency[0]

    def seconds(self, t_mem, t_cmp, feats: list[np.ndarray]) -> np.ndarray:
        lg, algo = (np.asarray(f, np.float64) for f in feats)
        t_mem = np.asarray(t_mem, np.float64)
        shape = np.broadcast_shapes(t_mem.shape, lg.shape, algo.shape)
        t_mem, lg, r = (np.broadcast_to(a, shape) for a in (t_mem, lg, algo.astype(int)))
        pick = lambda v: np.asarray(v)[r]  # noqa: E731
        return pick(self.latency) + pick(self.per_doubling) * lg + t_mem * pick(self.slowdown)

    def describe(self) -> str:
        parts = ", ".join(f"{name} {a * 1e6:.2f} us + {b * 1e6:.2f} us per doubling of GPUs, {1 / s:.0%} of the link"
                          for name, a, b, s in zip(ALLREDUCE_ALGORITHMS, self.latency, self.per_doubling, self.slowdown))
        return f"{self.kind}: vLLM's algorithms fitted on {self.rows} rows of {self.source}: {parts}"


def fit_collective(kind: str, t_mem, feats, seconds, source: str) -> CollectiveCurve:
    """The :class:`CollectiveCurve` of measured ``seconds``: least squares of the relative error, the parameters
    non-negative (each slowdown ≥ 1: never faster than the interconnect's peak; scipy's ``nnls``, deterministic).
    Shared by the custom kernel's one-shot (0) and two-shot (1): the base latency a and the barrier's growth b
    (one barrier, two); the two-shot adds a fixed cost of its own. An algorithm without a measured row runs at
    the peak with the shared latency (NCCL: none)."""
    from scipy.optimize import nnls

    t, y = np.asarray(t_mem, np.float64), np.asarray(seconds, np.float64)
    lg, algo = (np.asarray(f, np.float64) for f in feats)
    m0, m1, m2 = ((algo == r).astype(np.float64) for r in range(3))
    #          a        b                   a2  one-shot δ  two-shot δ  NCCL a, b, δ
    X = np.stack([m0 + m1, (m0 + 2 * m1) * lg, m1, m0 * t, m1 * t, m2, m2 * lg, m2 * t], axis=1)
    w, _ = nnls(X / y[:, None], 1 - t / y)  # t·(1 + δ): the peak term moved to the right-hand side
    a, b, a2, d0, d1, a3, b3, d2 = (float(v) for v in w)
    return CollectiveCurve(kind, (a, a + a2, a3), (b, 2 * b, b3), (1 + d0, 1 + d1, 1 + d2), int(len(y)), source)


TERMS = {"gemm": gemm_terms, "decode attention": decode_attention_terms, "prefill attention": prefill_attention_terms,
         "allreduce": allreduce_terms}


def _columns(kind: str, df) -> list[np.ndarray]:
    """The term arguments of each row of a selected table frame (after ``hw``)."""
    if kind == "gemm":
        return [df.m.to_numpy(), df.n.to_numpy(), df.k.to_numpy()]
    if kind == "decode attention":
        return [df.batch_size.to_numpy(), df.step.to_numpy() + 1, df.num_heads.to_numpy(), df.num_key_value_heads.to_numpy(),
                df.head_dim.to_numpy()]
    if kind == "prefill attention":
        return [df.batch_size.to_numpy(), df.isl.to_numpy(), df.num_heads.to_numpy(), df.num_key_value_heads.to_numpy(),
                df.head_dim.to_numpy()]
    return [df.message_size.to_numpy(), df.num_gpus.to_numpy()]


def _kernel_of(kind: str, df) -> str:
    """The table's kernel where a kind's terms depend on it (decode attention; one kernel per selected frame)."""
    if kind != "decode attention" or "kernel_source" not in df or df.empty:
        return ""
    kernels = df.kernel_source.unique()
    return str(kernels[0]) if len(kernels) == 1 else ""


def _terms(kind: str, hw: Roofs, args, kernel: str = ""):
    return TERMS[kind](hw, *args, kernel=kernel) if kernel else TERMS[kind](hw, *args)


def fit_frame(kind: str, hw: Roofs, df, source: str) -> Curve | CollectiveCurve:
    """The curve of ``kind`` fitted on a selected table frame (latency in ms)."""
    kernel = _kernel_of(kind, df)
    t_mem, t_cmp, feats = _terms(kind, hw, _columns(kind, df), kernel)
    seconds = df.latency.to_numpy(np.float64) * 1e-3
    if kind == "allreduce":
        return fit_collective(kind, t_mem, feats, seconds, source)
    return fit_curve(kind, t_mem, t_cmp, feats, seconds, source, kernel)


def predict_frame(curve: Curve, hw: Roofs, df) -> np.ndarray:
    """Seconds the curve gives each row of a selected table frame."""
    return curve.seconds(*_terms(curve.kind, hw, _columns(curve.kind, df), getattr(curve, "kernel", "")))


# -- the fitted set of one GPU and engine ------------------------------------------------------------
@dataclass(frozen=True)
class _Tables:
    """The selected rows of one GPU and engine: frames per kind and where they come from."""

    frames: dict
    sources: dict


def read_tables(root: Path, system: str, framework: str) -> _Tables:
    frames, sources = {}, {}
    rel = lambda p: str(p.relative_to(Path(root) / "data"))  # noqa: E731
    path = newest_table(root, system, "gemm", framework, "gemm_perf.parquet")
    if path is not None:
        kernel, frames["gemm"] = gemm_rows(path)
        sources["gemm"] = f"{rel(path)} ({kernel}, bfloat16)"
    for kind, filename in (("decode attention", "generation_attention_perf.parquet"), ("prefill attention", "context_attention_perf.parquet")):
        path = newest_table(root, system, "attention", framework, filename)
        if path is not None:
            kernel, df = attention_rows(path)
            if not df.empty:
                frames[kind], sources[kind] = df, f"{rel(path)} ({kernel}, bfloat16 KV cache)"
    path = newest_table(root, system, "comm", framework, "custom_allreduce_perf.parquet")
    if path is not None:
        df = allreduce_rows(path)
        graph = df.kernel_source.str.contains("graph")
        frames["allreduce"] = df[graph] if graph.any() else df
        frames["allreduce eager"] = df[~graph] if graph.any() else df.iloc[:0]
        sources["allreduce"] = f"{rel(path)} ({'CUDA-graph rows' if graph.any() else 'eager rows'})"
    return _Tables(frames, sources)


@dataclass(frozen=True)
class Curves:
    """The fitted curves of one GPU and engine (None: no table of that kind) and the measured fixed
    cost of a kernel launched without a CUDA graph (``eager_launch``, seconds; 0 where not measured)."""

    roofs: Roofs
    gemm: Curve | None
    decode: Curve | None
    prefill: Curve | None
    allreduce: CollectiveCurve | None
    eager_launch: float

    def gemm_seconds(self, m, n, k) -> np.ndarray:
        """A GEMM's seconds, non-decreasing in m (:func:`_monotone`)."""
        return _monotone(self.gemm, self.roofs, (m,), (n, k))

    def decode_seconds(self, batch, kv_len, heads, kv_heads, head_dim) -> np.ndarray:
        """Decode attention's seconds, non-decreasing in batch and KV length (:func:`_monotone`)."""
        return _monotone(self.decode, self.roofs, (batch, kv_len), (heads, kv_heads, head_dim))

    def prefill_seconds(self, batch, isl, heads, kv_heads, head_dim) -> np.ndarray:
        """Prefill attention's seconds, non-decreasing in batch and prompt length (:func:`_monotone`)."""
        return _monotone(self.prefill, self.roofs, (batch, isl), (heads, kv_heads, head_dim))

    def allreduce_seconds(self, elements, gpus, eager: bool = False) -> np.ndarray:
        """An all-reduce's seconds, non-decreasing in its message size (:func:`_monotone`)."""
        return _monotone(self.allreduce, self.roofs, (elements,), (gpus,)) + (self.eager_launch if eager else 0.0)

    def describe(self) -> list[str]:
        out = [c.describe() for c in (self.gemm, self.decode, self.prefill, self.allreduce) if c is not None]
        if self.eager_launch:
            out.append(f"a kernel launched without a CUDA graph: +{self.eager_launch * 1e6:.2f} us (the all-reduce's eager rows over "
                       "its graph rows, messages up to 64K elements)")
        return out


#: The sizes a fitted curve is made non-decreasing over (log2 of the smallest and largest, per size argument) and
#: the grid's steps per octave (:func:`_monotone`); beyond them the curve is anchored at the grid's edge.
MONOTONE_RANGE = {"gemm": ((0, 20),), "decode attention": ((0, 14), (0, 21)), "prefill attention": ((0, 14), (0, 18)),
                  "allreduce": ((0, 34),)}
MONOTONE_STEPS = 4
#: A fitted curve is made non-decreasing by its lower envelope (:func:`_monotone`), a measured table by the running maximum.
ENVELOPE = "lower"


def _raw(curve: Curve, roofs: Roofs, sizes, fixed) -> np.ndarray:
    return curve.seconds(*_terms(curve.kind, roofs, [*sizes, *fixed], getattr(curve, "kernel", "")))


@functools.lru_cache(maxsize=512)
def _monotone_grid(curve: Curve, roofs: Roofs, fixed: tuple) -> tuple[list[np.ndarray], np.ndarray]:
    """The curve at the other arguments ``fixed`` tabulated on a log2 grid of its size arguments
    (:data:`MONOTONE_RANGE`, :data:`MONOTONE_STEPS` a octave) and made non-decreasing along each
    (:func:`monotone_table`'s :data:`ENVELOPE`)."""
    axes = [np.arange(lo * MONOTONE_STEPS, hi * MONOTONE_STEPS + 1) / MONOTONE_STEPS for lo, hi in MONOTONE_RANGE[curve.kind]]
    mesh = np.meshgrid(*[2.0 ** a for a in axes], indexing="ij")
    t = _raw(curve, roofs, mesh, fixed)
    return axes, monotone_table(t, [2.0 ** a for a in axes], envelope=ENVELOPE).values


def _monotone(curve: Curve, roofs: Roofs, sizes: tuple, fixed: tuple) -> np.ndarray:
    """A fitted curve made non-decreasing in its size arguments (GEMM: m; decode attention: batch and KV
    length; prefill attention: batch and prompt; all-reduce: message size). The fitted slowdown is a
    quadratic in log features, free to fall faster than the roofline term rises (the H100 decode curve at
    512 sequences read 117.7 us at KV length 1, 91.1 us at 2), so the curve is tabulated on a log2 grid of
    its sizes (:data:`MONOTONE_STEPS` a octave over :data:`MONOTONE_RANGE`), made non-decreasing there by
    its **lower envelope** (each grid point the smallest fitted time at or above it along each axis: the
    price of the call padded to that bigger size), and interpolated linearly in log2 size; beyond the grid
    it is anchored at the grid's edge as a table is, t_grid(edge) · t(shape) / t(edge), the ratio held ≥ 1
    beyond and ≤ 1 below. Exact wherever the fitted curve does not fall (at the grid points; between
    them linear in log2 size). Not the running maximum the measured tables get: a curve falls where its
    quadratic is weakest, at the small edge of its data (few rows; KV length 1 is not measured), and
    the maximum would carry that artifact over the bulk of the fit (the H100 decode curve's median error
    against its own table 9.0% as fitted, 17.5% under the maximum, 8.8% under the lower envelope; no
    kind's median or worst error against its table grows by more than 0.3 points under the envelope on
    the H100, H200 or A100 vLLM tables; the A100 all-reduce's median fell 12.9% -> 11.4% when it was such a quadratic curve)."""
    sizes = [np.asarray(x, np.float64) for x in sizes]
    fixed = [np.asarray(x, np.float64) for x in fixed]
    shape = np.broadcast_shapes(*(np.shape(x) for x in sizes + fixed))
    sizes = [np.broadcast_to(x, shape).reshape(-1) for x in sizes]
    fixed = [np.broadcast_to(x, shape).reshape(-1) for x in fixed]
    out = np.empty(sizes[0].shape)
    keys = np.stack(fixed, axis=1) if fixed else np.zeros((len(out), 0))
    # one curve per distinct value of the other arguments (usually one: a model's widths; no sort then)
    one = len(keys) == 0 or bool(np.all(keys == keys[0]))
    for key in (keys[:1] if one else np.unique(keys, axis=0)):
        sel = np.ones(len(out), dtype=bool) if one else np.all(keys == key, axis=1)
        fx = tuple(float(v) for v in key)
        axes, grid = _monotone_grid(curve, roofs, fx)
        u = [np.log2(np.maximum(x[sel], 1e-300)) for x in sizes]
        uc = [np.clip(a, g[0], g[-1]) for a, g in zip(u, axes)]
        # multilinear in log2 size on the uniform grid
        idx, frac = [], []
        for a, g in zip(uc, axes):
            f = (a - g[0]) * MONOTONE_STEPS
            i = np.clip(np.floor(f).astype(int), 0, len(g) - 2)
            idx.append(i)
            frac.append(np.clip(f - i, 0.0, 1.0))
        val = np.zeros(len(uc[0]))
        for corner in np.ndindex(*(2,) * len(axes)):
            w = np.ones(len(uc[0]))
            ii = []
            for d, c in enumerate(corner):
                w = w * (frac[d] if c else 1 - frac[d])
                ii.append(idx[d] + c)
            val = val + w * grid[tuple(ii)]
        outside = np.zeros(len(uc[0]), dtype=bool)
        for a, b in zip(u, uc):
            outside |= a != b
        if np.any(outside):
            xs, xe = [x[sel][outside] for x in sizes], [2.0 ** b[outside] for b in uc]
            fo = [np.full(int(outside.sum()), v) for v in fx]
            ratio = _raw(curve, roofs, xs, fo) / _raw(curve, roofs, xe, fo)
            up = np.all([a >= b for a, b in zip(xs, xe)], axis=0)
            down = np.all([a <= b for a, b in zip(xs, xe)], axis=0)
            ratio = np.where(up, np.maximum(ratio, 1.0), np.where(down, np.minimum(ratio, 1.0), ratio))
            val[outside] = val[outside] * ratio
        out[sel] = val
    return out.reshape(shape)


def _eager_launch(graph, eager) -> float:
    """Median excess of an eager all-reduce over the same one in a CUDA graph at small messages."""
    if graph.empty or eager.empty:
        return 0.0
    small = 1 << 16
    g = graph[graph.message_size <= small].groupby(["num_gpus", "message_size"]).latency.median()
    e = eager[eager.message_size <= small].groupby(["num_gpus", "message_size"]).latency.median()
    both = g.index.intersection(e.index)
    return max(float(np.median((e[both] - g[both]).to_numpy())) * 1e-3, 0.0) if len(both) else 0.0


@functools.lru_cache(maxsize=16)
def fit_curves(root: Path, system: str, framework: str, hardware: Roofs) -> Curves:
    """The curves of every kind fitted on all the rows of one GPU's and engine's tables (cached per
    tables, GPU, engine and peaks: :meth:`Roofs.of` a catalog hardware entry)."""
    t = read_tables(Path(root), system, framework)
    fitted = {kind: fit_frame(kind, hardware, t.frames[kind], t.sources[kind]) if kind in t.frames and not t.frames[kind].empty else None
              for kind in KINDS}
    eager = _eager_launch(t.frames.get("allreduce", _EMPTY), t.frames.get("allreduce eager", _EMPTY)) if "allreduce" in t.frames else 0.0
    return Curves(hardware, fitted["gemm"], fitted["decode attention"], fitted["prefill attention"], fitted["allreduce"], eager)


class _Empty:
    empty = True


_EMPTY = _Empty()


# -- model families and their shapes ------------------------------------------------------------------
def family_of(name: str) -> str | None:
    """The family of a catalog model name (None: none of :data:`FAMILY_PREFIXES`)."""
    return next((f for p, f in FAMILY_PREFIXES.items() if name.startswith(p)), None)


def gemm_shapes(model: ModelSpec, tp: int = 1, qkv_inputs: int | None = None) -> list[tuple[str, int, int]]:
    """(name, n, k) of the GEMMs of one layer of ``model`` at ``tp`` (columns of QKV, gate+up and the
    LM head split, rows of the output and down projections), then its LM head; a mixture of experts
    adds one expert's gate+up and down (whole on a device), latent attention (MLA) its projections
    in place of QKV and the output projection. ``qkv_inputs``: the QKV projection's input width
    (default the hidden size)."""
    h, hd, t = model.hidden, model.head_dim, int(tp)
    q_heads, kv_heads = max(model.heads // t, 1), -(-model.kv_heads // t)
    if model.kv_lora_rank:
        rope, ql = model.qk_rope_head_dim, model.q_lora_rank
        attn = ([("q_a", ql, h), ("q_b", q_heads * hd, ql)] if ql else [("q", q_heads * hd, h)])
        attn += [("kv_a", model.kv_lora_rank + rope, h), ("kv_b", q_heads * (hd - rope + model.v_head_dim), model.kv_lora_rank),
                 ("o", h, q_heads * model.v_head_dim)]
    else:
        attn = [("qkv", (q_heads + 2 * kv_heads) * hd, h if qkv_inputs is None else int(qkv_inputs)), ("o", h, q_heads * hd)]
    up = (model.mlp_matrices - 1) * model.intermediate // t
    mlp = [("gate_up" if model.mlp == "gated" else "up", up, h), ("down", h, model.intermediate // t)]
    if model.experts:
        e = model.expert_intermediate
        mlp += [("expert gate_up", (model.mlp_matrices - 1) * e, h), ("expert down", h, e)]
    return attn + mlp + [("lm_head", model.vocab // t, h)]


def attention_layouts(model: ModelSpec, tp: int = 1) -> list[tuple[int, int, int]]:
    """(query heads, KV heads, head_dim) per device of ``model``'s attention at ``tp`` (KV heads
    replicate below one per device); none for latent attention (its own tables)."""
    if model.kv_lora_rank:
        return []
    return [(max(model.heads // tp, 1), -(-model.kv_heads // tp), model.head_dim)]


# -- held out -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Score:
    """A held-out curve's error on one family's (or one GPU count's) measured rows: |predicted /
    measured − 1|, median and worst, over ``rows`` rows; ``fitted``: the rows it was fitted on."""

    kind: str
    held_out: str
    rows: int
    fitted: int
    median: float
    worst: float


def grid_bracket(v: float, grid: np.ndarray) -> set:
    """The measured grid values a value lies on or between (none outside the grid)."""
    if v in grid:
        return {float(v)}
    if v < grid[0] or v > grid[-1]:
        return set()
    i = int(np.searchsorted(grid, v))
    return {float(grid[i - 1]), float(grid[i])}


def _score(kind: str, held_out: str, curve: Curve, hw: Roofs, df) -> Score:
    err = np.abs(predict_frame(curve, hw, df) / (df.latency.to_numpy(np.float64) * 1e-3) - 1)
    return Score(kind, held_out, int(len(df)), curve.rows, float(np.median(err)), float(err.max()))


def family_holdout(root: Path, system: str, framework: str, hardware: Roofs, models: dict[str, ModelSpec],
                   fit_families=FIT_FAMILIES) -> list[Score]:
    """Per kind (GEMM, decode and prefill attention): the curve fitted on the rows that the shapes of
    ``fit_families``' models use (at tp 1, 2, 4, 8), none of them a row of another family, and its
    error on each other family's rows and on all of them (held_out ``all``)."""
    t = read_tables(Path(root), system, framework)
    fams: dict[str, list[ModelSpec]] = {}
    for name, model in models.items():
        f = family_of(name)
        if f is not None:
            fams.setdefault(f, []).append(model)
    out: list[Score] = []
    if "gemm" in t.frames:
        df = t.frames["gemm"]
        ngrid, kgrid = np.sort(df.n.unique()).astype(float), np.sort(df.k.unique()).astype(float)
        keys = {f: {(a, b) for m in ms for tp in TP_SIZES for _, n, k in gemm_shapes(m, tp)
                    for a in grid_bracket(n, ngrid) for b in grid_bracket(k, kgrid)} for f, ms in fams.items()}
        pairs = list(zip(df.n.astype(float), df.k.astype(float)))
        out += _holdout("gemm", hardware, df, t.sources["gemm"], [p for p in pairs], keys, fit_families)
    for kind in ("decode attention", "prefill attention"):
        if kind not in t.frames:
            continue
        df = t.frames[kind]
        keys = {f: {lay for m in ms for tp in TP_SIZES for lay in attention_layouts(m, tp)} for f, ms in fams.items()}
        rowkeys = list(zip(df.num_heads, df.num_key_value_heads, df.head_dim))
        out += _holdout(kind, hardware, df, t.sources[kind], rowkeys, keys, fit_families)
    return out


def _holdout(kind, hw, df, source, rowkeys, keys, fit_families) -> list[Score]:
    fit_keys = set().union(*(keys.get(f, set()) for f in fit_families))
    held = [f for f in sorted(keys) if f not in fit_families]
    held_keys = set().union(*(keys[f] for f in held)) if held else set()
    in_fit = np.array([k in fit_keys and k not in held_keys for k in rowkeys])
    curve = fit_frame(kind, hw, df[in_fit], f"{source}, {'+'.join(fit_families)} rows")
    out = []
    for f in held + ["all"]:
        ks = held_keys if f == "all" else keys[f]
        sel = np.array([k in ks for k in rowkeys])
        if sel.any():
            out.append(_score(kind, f, curve, hw, df[sel]))
    return out


def gpu_count_holdout(root: Path, system: str, framework: str, hardware: Roofs) -> list[Score]:
    """The all-reduce curve fitted on the other GPU counts' rows and scored on each count's."""
    t = read_tables(Path(root), system, framework)
    if "allreduce" not in t.frames:
        return []
    df = t.frames["allreduce"]
    out = []
    for g in sorted(df.num_gpus.unique()):
        rest = df[df.num_gpus != g]
        if rest.empty:
            continue
        curve = fit_frame("allreduce", hardware, rest, t.sources["allreduce"])
        out.append(_score("allreduce", f"{int(g)} GPUs", curve, hardware, df[df.num_gpus == g]))
    return out
