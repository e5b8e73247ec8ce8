"""A mixture-of-experts decode step priced from NVIDIA AIConfigurator's measured MoE, MLA, GEMM and
all-reduce tables (``aiconfigurator-core``, pinned in :mod:`~draftsim.sim.cost.kernel_tables`, read
with pyarrow; the package itself is never imported).

What the roofline of :mod:`~draftsim.sim.cost.moe` cannot see is how slowly a grouped GEMM runs at
the few tokens each awake expert receives: one decoding sequence of DeepSeek-V3 gives each of its 8
experts a single row. The tables measured it:

* **routed experts** (``moe/<engine>/<version>/moe_perf.parquet``): the fused-MoE kernel's time for
  one layer at (tokens, hidden, expert width, top-k, experts, moe_tp, moe_ep, dtype, routing
  distribution), linear in the call's tokens between the 27 measured counts (1 … 16,384). Tensor
  parallelism is ``moe_tp = tp, moe_ep = 1``; ``--expert-parallel`` is ``moe_tp = 1, moe_ep = tp``.
  The routing is AIConfigurator's own default for DeepSeek, ``power_law_1.01`` (a skewed router,
  sdk/config.py ``workload_distribution = "power_law"``, sdk/models/deepseek.py alpha 1.01; the
  collector draws per-expert loads from a power law, collector/helper.py ``power_law_logits_v3``: at 4
  tokens about 19 experts wake (a numpy re-run of it, 300 draws), at 8 about 47, where uniform routing wakes 30.5 and 57.4);
  ``balanced`` spreads the N·k picks over distinct experts (32 at 4 tokens, 64 at 8). At decode sizes
  the two tables differ by more than routing explains: power law measures 28% slower at 4 tokens with
  fewer experts awake, and SGLang 0.5.10's table measures the two about 1% apart at 4 and 8 tokens. :meth:`MeasuredExperts.efficiency`
  is the roofline's time over the measured one: the grouped-GEMM efficiency at the tokens each awake
  expert receives (:func:`tokens_per_awake_expert`), the factor :class:`~draftsim.sim.cost.moe.ExpertCost`
  takes as ``measured``.
* **latent attention**, as each engine's tables hold it. vLLM (``mla/vllm/<version>/mla_generation_module_perf.parquet``):
  the whole MLA block of one decode layer (query and latent projections, FlashMLA over the latent cache,
  output projection) of DeepSeek-V3's shape at heads/tp query heads, bilinear in batch and cached tokens.
  SGLang's tables hold no block: its layer is priced part by part as AIConfigurator composes it for SGLang
  (sdk/models/deepseek.py, the granular MLA ops): the fused q_a+kv_a projection (replicated) and q_b and
  o_proj from SGLang's GEMM table, the two absorbed latent BMMs (``mla_bmm/sglang/<version>/mla_bmm_perf.parquet``,
  ``sgl_kernel``'s FP8 BMM for FP8 weights) and the attention kernel over the latent cache
  (``mla/sglang/<version>/generation_mla_perf.parquet``, FlashAttention-3's MLA decode, bilinear in batch and
  cached tokens; :class:`GranularMLA`, which the operator model's SGLang path reads too); vLLM's block where
  SGLang's kernel or BMM table is missing (said in the source). The KV
  cache is the engines' default (``kv_dtype``): ``--kv-cache-dtype auto`` keeps it in the model's data type,
  bfloat16 for DeepSeek's FP8 checkpoints, in SGLang and vLLM alike (:data:`~draftsim.sim.cost.catalog.KV_AUTO`);
  vLLM's block is then read at its bfloat16-KV rows (FLASH_ATTN_MLA), its FP8 rows (FlashMLA) with ``--kv-dtype fp8``.
* **shared expert**: SGLang fuses DeepSeek-V3/R1's into the fused-MoE call (one more expert every token
  picks, at moe_ep 1): priced as one more awake expert at the call's measured seconds per awake expert
  (estimated, said); otherwise two GEMMs added to the step.
* **dense GEMMs** (``gemm/<engine>/<version>/gemm_perf.parquet``): the shared expert (unfused), the first
  dense layers' MLP (block-FP8; the kernel order and why in :func:`_gemm_grid`), the router and the LM head
  (bfloat16, as the checkpoint keeps them), linear in tokens and bilinear in (n, k) between measured
  widths.
* **all-reduces** (``comm/<engine>/<version>/custom_allreduce_perf.parquet``): two per layer of
  N·hidden bfloat16 elements at tp GPUs, the CUDA-graph kernel, linear in message size.
* **estimated, not measured**: the two residual-add+RMSNorm per layer and the embedding row, by
  AIConfigurator's analytic memory-op formula (:func:`~draftsim.sim.cost.kernel_tables.mem_op_constants`).

**Every measured table is made non-decreasing** in its size axes before it is interpolated
(:func:`~draftsim.sim.cost.efficiency.monotone_table`: an isolated spike, more than 2x both neighbours
that agree within 30%, replaced by their interpolation, then isotonic regression along each axis): the fused MoE in tokens (H100's Qwen3-30B-A3B table read 474.2 us per
layer at 80 tokens and 417.0 us at 96), each GEMM width in m, the BMMs in tokens, the MLA kernel in
batch and cached (or prompt) tokens, the all-reduce in message size. A bigger call is so never priced below a smaller one measured.

The step adds the engine's per-step host time (``sim/data/engines.json``). A shape a table does not
hold is reported in :attr:`DecodeStep.missing` and the step is not priced (no silent extrapolation).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import DraftsimError
from .catalog import WEIGHT_ONLY, kv_auto_dtype
from .efficiency import grid_edge, monotone_table
from .kernel_tables import FRAMEWORKS, SYSTEMS, allreduce_rows, mem_op_constants, newest_table, read_columns, systems_root
from .moe import expected_experts

__all__ = ["DISTRIBUTION", "DecodeStep", "GranularMLA", "GroupedGemmEfficiency", "MLAPart", "MeasuredExperts", "decode_step",
           "fused_shared_expert_seconds", "fused_shared_expert_source", "grouped_gemm_efficiency", "kv_table_dtype",
           "measured_experts", "mla_layer_parts", "sglang_fuses_shared_expert", "tokens_per_awake_expert"]

#: AIConfigurator's default routing distribution for DeepSeek-style MoE (sdk/config.py, sdk/models/deepseek.py).
DISTRIBUTION = "power_law_1.01"
#: draftsim weight dtype -> the MoE table's moe_dtype, most preferred first (DeepSeek's checkpoint is block-FP8).
_MOE_DTYPES = {"float8": ("fp8_block", "fp8"), "bfloat16": ("bfloat16",), "float16": ("bfloat16",)}


def tokens_per_awake_expert(n_tokens, experts: int, per_token: int) -> np.ndarray:
    """N·k / E_act(N): the rows each awake expert's GEMM receives in a call of N tokens (uniform routing)."""
    n = np.asarray(n_tokens, dtype=np.float64)
    awake = expected_experts(n, experts, per_token)
    return np.divide(n * per_token, awake, out=np.zeros_like(n), where=awake > 0)


@dataclass(frozen=True)
class MeasuredExperts:
    """One MoE layer's routed experts on one device, measured: ``tokens`` (increasing) and ``seconds``."""

    source: str
    kernel: str
    moe_dtype: str
    distribution: str
    tokens: np.ndarray
    seconds: np.ndarray

    def inside(self, n_tokens) -> np.ndarray:
        n = np.asarray(n_tokens, dtype=np.float64)
        return (n >= self.tokens[0]) & (n <= self.tokens[-1])

    def __call__(self, n_tokens) -> np.ndarray:
        """Seconds of one layer for calls of N tokens, linear between measured counts (raises outside them)."""
        n = np.asarray(n_tokens, dtype=np.float64)
        if not np.all(self.inside(n) | (n == 0)):
            raise DraftsimError(f"{self.source} measured {int(self.tokens[0])}..{int(self.tokens[-1])} tokens per call; "
                                f"asked {np.asarray(n).max():g}")
        return np.where(n > 0, np.interp(n, self.tokens, self.seconds), 0.0)

    def efficiency(self, n_tokens, roofline_seconds) -> np.ndarray:
        """The roofline's seconds over the measured ones at N tokens: the grouped-GEMM efficiency."""
        return np.asarray(roofline_seconds, dtype=np.float64) / self(n_tokens)


def _frame(system: str, op: str, framework: str, filename: str):
    root = systems_root()
    path = newest_table(root, system, op, framework, filename)
    return root, path


def measured_experts(model, hardware: str, framework: str = "vllm", dtype: str = "float8", tp: int = 1,
                     expert_parallel: bool = False, distribution: str = DISTRIBUTION) -> MeasuredExperts | None:
    """The MoE table's rows for ``model``'s routed experts on catalog ``hardware`` under ``framework``'s
    kernels (None: the GPU, engine, dtype or shape is not measured)."""
    system, fw = SYSTEMS.get(hardware), FRAMEWORKS.get(framework, framework)
    if system is None or not model.experts:
        return None
    _, path = _frame(system, "moe", fw, "moe_perf.parquet")
    if path is None:
        return None
    df = read_columns(str(path), ("kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                                  "moe_tp_size", "moe_ep_size", "distribution", "latency"))
    mtp, mep = (1, tp) if expert_parallel else (tp, 1)
    df = df[(df.hidden_size == model.hidden) & (df.inter_size == model.expert_intermediate) & (df.num_experts == model.experts)
            & (df.topk == model.experts_per_token) & (df.moe_tp_size == mtp) & (df.moe_ep_size == mep)
            & (df.distribution == distribution)]
    for moe_dtype in _MOE_DTYPES.get(dtype, ()):
        rows = df[df.moe_dtype == moe_dtype]
        if rows.empty:
            continue
        kernels = sorted(rows.kernel_source.unique())
        kernel = next((k for k in kernels if "triton" in k), kernels[0])  # the fused-MoE Triton kernel: both engines' default on Hopper
        rows = rows[rows.kernel_source == kernel].groupby("num_tokens").latency.median()
        tokens = rows.index.to_numpy(np.float64)
        seconds = monotone_table(rows.to_numpy(np.float64) * 1e-3, (tokens,)).values  # non-decreasing in tokens (module docstring)
        return MeasuredExperts(str(path), kernel, moe_dtype, distribution, tokens, seconds)
    return None


class _GemmGrid:
    """GEMM latencies of one kernel and dtype: linear in m, bilinear in (n, k) between measured widths."""

    def __init__(self, df):
        self.df = df
        self.n = np.sort(df.n.unique())
        self.k = np.sort(df.k.unique())
        self.by = {}
        for key, g in df.groupby(["n", "k"]):  # each width's latencies non-decreasing in m (module docstring)
            g = g.groupby("m").latency.median()
            self.by[key] = (g.index.to_numpy(np.float64), monotone_table(g.to_numpy(np.float64) * 1e-3, (g.index.to_numpy(np.float64),)).values)

    def at(self, m, n: int, k: int) -> np.ndarray:
        """Seconds at tokens ``m`` (any shape) of width (n, k); NaN where a corner's rows do not cover m."""
        m = np.asarray(m, np.float64)
        nan = np.full(m.shape, np.nan)
        if not (self.n[0] <= n <= self.n[-1] and self.k[0] <= k <= self.k[-1]):
            return nan
        i = min(np.searchsorted(self.n, n, side="right") - 1, len(self.n) - 2)
        j = min(np.searchsorted(self.k, k, side="right") - 1, len(self.k) - 2)
        n0, n1, k0, k1 = self.n[i], self.n[i + 1], self.k[j], self.k[j + 1]
        fn, fk = (n - n0) / (n1 - n0), (k - k0) / (k1 - k0)
        total, ok = np.zeros(m.shape), np.ones(m.shape, dtype=bool)
        for nn, kk, wgt in ((n0, k0, (1 - fn) * (1 - fk)), (n0, k1, (1 - fn) * fk), (n1, k0, fn * (1 - fk)), (n1, k1, fn * fk)):
            if wgt == 0:
                continue
            ms = self.by.get((nn, kk))
            if ms is None:
                return nan
            ok &= (ms[0][0] <= m) & (m <= ms[0][-1])
            total = total + wgt * np.interp(m, *ms)
        return np.where(ok, total, np.nan)

    def __call__(self, m: float, n: int, k: int) -> float | None:
        t = float(self.at(m, n, k))
        return None if np.isnan(t) else t

    def m_range(self, n: int, k: int) -> tuple[float, float]:
        """The token counts measured at width (n, k): every corner with weight (lo > hi: none)."""
        if not (self.n[0] <= n <= self.n[-1] and self.k[0] <= k <= self.k[-1]):
            return (np.inf, 0.0)
        i = min(np.searchsorted(self.n, n, side="right") - 1, len(self.n) - 2)
        j = min(np.searchsorted(self.k, k, side="right") - 1, len(self.k) - 2)
        n0, n1, k0, k1 = self.n[i], self.n[i + 1], self.k[j], self.k[j + 1]
        fn, fk = (n - n0) / (n1 - n0), (k - k0) / (k1 - k0)
        lo, hi = 0.0, np.inf
        for nn, kk, wgt in ((n0, k0, (1 - fn) * (1 - fk)), (n0, k1, (1 - fn) * fk), (n1, k0, fn * (1 - fk)), (n1, k1, fn * fk)):
            if wgt == 0:
                continue
            ms = self.by.get((nn, kk))
            if ms is None:
                return (np.inf, 0.0)
            lo, hi = max(lo, float(ms[0][0])), min(hi, float(ms[0][-1]))
        return lo, hi


class _Gemms:
    """A dtype's GEMM kernels, the widest-covered first: a shape is priced by the first that measured it."""

    def __init__(self, grids: list):
        self.grids = grids

    def at(self, m, n: int, k: int) -> np.ndarray:
        """Seconds at tokens ``m`` (any shape) of width (n, k), each from the first kernel that measured it; NaN where none did."""
        out = np.full(np.shape(m), np.nan)
        for g in self.grids:
            miss = np.isnan(out)
            if not miss.any():
                break
            out = np.where(miss, g.at(m, n, k), out)
        return out

    def __call__(self, m: float, n: int, k: int) -> float | None:
        t = float(self.at(m, n, k))
        return None if np.isnan(t) else t

    def m_range(self, n: int, k: int) -> tuple[float, float]:
        """The token counts some kernel measured at width (n, k) (lo > hi: none)."""
        rs = [g.m_range(n, k) for g in self.grids]
        rs = [r for r in rs if r[0] <= r[1]]
        return (min(r[0] for r in rs), max(r[1] for r in rs)) if rs else (np.inf, 0.0)

    @property
    def kernels(self) -> list[str]:
        """The kernels in the order a shape is priced by."""
        return [str(g.df.kernel_source.iloc[0]) for g in self.grids]


@functools.lru_cache(maxsize=16)
def _gemm_grid(path: Path, dtype: str) -> _Gemms | None:
    """The GEMM kernels of ``dtype`` ("fp8_block" or "bfloat16"), in the order a shape is priced by.

    Block-FP8 (DeepSeek's checkpoint): DeepGEMM, then CUTLASS block-scaled, then the per-tensor FP8
    CUTLASS kernel as a proxy (the same weight bytes; the tables hold no block-FP8 row of the first two
    below 16 tokens), and FlashInfer's block-scaled GEMM last: it measures 56-62 us at m <= 8 whatever
    the width on h200_sxm (4-6x the others), which vLLM's own MLA-module table (four block-FP8 GEMMs
    and the attention in ~0.1 ms a layer) shows is not what vLLM runs at decode sizes."""
    df = read_columns(str(path), ("kernel_source", "gemm_dtype", "m", "n", "k", "latency"))
    order = []
    if dtype == "fp8_block":
        block = df[df.gemm_dtype == "fp8_block"]
        kernels = sorted(block.kernel_source.unique(), key=lambda k: ("flashinfer" in k.lower(), "cutlass" in k.lower()))
        late = [k for k in kernels if "flashinfer" in k.lower()]
        order = [block[block.kernel_source == k] for k in kernels if k not in late]
        order.append(df[df.gemm_dtype == "fp8"])
        order += [block[block.kernel_source == k] for k in late]
    else:
        plain = df[df.gemm_dtype == dtype]
        order = [plain[plain.kernel_source == k] for k in plain.groupby("kernel_source").size().sort_values(ascending=False).index]
    order = [o for o in order if not o.empty]
    return _Gemms([_GemmGrid(o) for o in order]) if order else None


@dataclass
class DecodeStep:
    """A decode step of ``batch`` sequences at ``context`` cached tokens, split into its parts (seconds, per device)."""

    parts: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    missing: list = field(default_factory=list)

    @property
    def seconds(self) -> float:
        if self.missing:
            raise DraftsimError("not measured: " + "; ".join(self.missing))
        return float(sum(self.parts.values()))


def decode_step(model, hardware: str, framework: str = "vllm", dtype: str = "float8", tp: int = 1, batch: int = 1,
                context: int = 512, expert_parallel: bool = False, host: float = 0.0,
                distribution: str = DISTRIBUTION, overlap: bool = False, kv_dtype: str | None = None) -> DecodeStep:
    """One decode step of a MoE with latent attention (the MLA tables hold DeepSeek-V3's shape; GQA
    attention is not priced here) from the tables, plus ``host`` seconds of engine time (``overlap``:
    the engine hides it behind the forward, the step taking max(forward, host)).

    ``framework`` picks the engine's tables and how its layer is composed (module docstring): vLLM's
    attention is its measured MLA block; SGLang's is priced part by part from its own tables (vLLM's
    block where SGLang's tables lack a part's table) and its shared expert rides in the fused-MoE call.
    ``kv_dtype`` ("bfloat16", "float16" or "float8"; None: the engines' ``auto``, the model's data type,
    bfloat16 under FP8 weights) is the KV cache's, and picks the rows the attention is read at."""
    out = DecodeStep()
    system, fw = SYSTEMS.get(hardware), FRAMEWORKS.get(framework, framework)
    if system is None:
        raise DraftsimError(f"AIConfigurator's tables cover {', '.join(SYSTEMS)}; got {hardware!r}")
    root = systems_root()
    N, h, L = batch, model.hidden, model.layers
    # routed experts
    experts = measured_experts(model, hardware, framework, dtype, tp, expert_parallel, distribution)
    if experts is None or not bool(experts.inside(N)):
        out.missing.append(f"routed experts {model.experts}x{model.expert_intermediate} top-{model.experts_per_token} at tp {tp}")
    else:
        out.parts["routed experts"] = model.moe_layers * float(experts(N))
        out.sources["routed experts"] = f"{experts.source} ({experts.kernel}, {experts.moe_dtype}, {experts.distribution})"
    fused = fw == "sglang" and sglang_fuses_shared_expert(model, expert_parallel)
    if fused and "routed experts" in out.parts:
        # one more awake expert in the same kernel call, at the call's measured seconds per awake expert
        out.parts["shared expert (fused, estimated)"] = float(fused_shared_expert_seconds(out.parts["routed experts"], N, model))
        out.sources["shared expert (fused, estimated)"] = fused_shared_expert_source(model, N)
    # latent attention: SGLang's parts where its tables hold them, else vLLM's whole block
    kv = kv_table_dtype(kv_dtype, dtype)
    gpath = newest_table(root, system, "gemm", fw, "gemm_perf.parquet")
    fp8 = _gemm_grid(gpath, "fp8_block" if dtype == "float8" else "bfloat16") if gpath else None
    bf16 = _gemm_grid(gpath, "bfloat16") if gpath else None
    granular = _mla_parts(model, root, system, fw, dtype, kv, tp, batch, context, fp8, gpath) if fw != "vllm" else None
    if granular is not None:
        for name, t, src in granular:
            if t is None:
                out.missing.append(f"{name} ({src})")
            else:
                out.parts[name], out.sources[name] = L * t, src
    else:
        _mla_block(out, model, root, system, fw, dtype, kv, tp, batch, context)
    # dense GEMMs
    dense_layers = L - model.moe_layers
    s = model.shared_experts * model.expert_intermediate
    shared = model.moe_layers if s and not fused else 0
    gemms = [("shared expert gate+up", fp8, 2 * s // tp, h, shared), ("shared expert down", fp8, h, s // tp, shared),
             ("router", bf16, model.experts, h, model.moe_layers),
             ("dense MLP gate+up", fp8, 2 * model.intermediate // tp, h, dense_layers),
             ("dense MLP down", fp8, h, model.intermediate // tp, dense_layers),
             ("LM head", bf16, -(-model.vocab // tp), h, 1)]
    for name, grid, n, k, count in gemms:
        if count == 0 or n == 0:
            continue
        t = grid(N, n, k) if grid is not None else None
        if t is None:
            out.missing.append(f"GEMM {name} m={N} n={n} k={k}")
        else:
            out.parts[f"GEMM {name}"] = count * t
            out.sources[f"GEMM {name}"] = str(gpath)
    # all-reduces
    if tp > 1:
        apath = newest_table(root, system, "comm", fw, "custom_allreduce_perf.parquet")
        rows = allreduce_rows(apath) if apath else None
        rows = rows[(rows.num_gpus == tp) & rows.kernel_source.str.endswith("_graph")].sort_values("message_size") if rows is not None else None
        msg = N * h
        if rows is None or rows.empty or not rows.message_size.iloc[0] <= msg <= rows.message_size.iloc[-1]:
            out.missing.append(f"all-reduce of {msg} elements at {tp} GPUs")
        else:
            med = rows.groupby("message_size").latency.median()  # made non-decreasing in the message size (module docstring)
            sizes = med.index.to_numpy(np.float64)
            out.parts["all-reduce (2 per layer)"] = 2 * L * float(np.interp(msg, sizes, monotone_table(med.to_numpy(np.float64), (sizes,)).values)) * 1e-3
            out.sources["all-reduce (2 per layer)"] = str(apath)
    # estimated: residual-add+RMSNorm twice per layer, the embedding row (AIConfigurator's memory-op formula)
    bw, scale, const = mem_op_constants(root, system)
    norm = (2 * N * h * 2 + 2 * N * h * 2) / (bw * scale) + const
    out.parts["add+norm (estimated)"] = 2 * L * norm
    out.parts["embedding (estimated)"] = N * h * 2 / (bw * scale) + const
    out.sources["add+norm (estimated)"] = out.sources["embedding (estimated)"] = f"{root / (system + '.yaml')} memory-op formula"
    if host:
        out.parts["engine host"] = float(host)
        out.sources["engine host"] = "sim/data/engines.json per_step"
        if overlap:  # an overlapped scheduler: the step is max(forward, host)
            gpu = sum(v for k, v in out.parts.items() if k != "engine host")
            out.parts["engine host"] = max(0.0, float(host) - gpu)
            out.sources["engine host"] += " (overlapped: what the forward does not hide)"
    return out


#: draftsim KV dtype -> the MLA tables' kv_cache_dtype
_KV_TABLE = {"bfloat16": "bfloat16", "float16": "bfloat16", "float8": "fp8"}


def kv_table_dtype(kv_dtype: str | None, dtype: str) -> str:
    """The MLA tables' kv_cache_dtype for ``kv_dtype`` (None: the engines' ``auto``, the model's data type,
    :func:`~draftsim.sim.cost.catalog.kv_auto_dtype`)."""
    if kv_dtype is None:
        kv_dtype = kv_auto_dtype(dtype)
    if kv_dtype not in _KV_TABLE:
        raise DraftsimError(f"KV-cache dtype {kv_dtype!r}: the MLA tables measure {', '.join(_KV_TABLE)}")
    return _KV_TABLE[kv_dtype]


def sglang_fuses_shared_expert(model, expert_parallel: bool) -> bool:
    """SGLang's default for DeepSeek-V3/R1 on NVIDIA GPUs (compute capability 8.0 and up) without expert
    parallelism: the shared expert rides in the fused-MoE kernel as one more expert every token picks
    (python/sglang/srt/models/deepseek_v2.py ``determine_num_fused_shared_experts``: 256 routed experts and
    one shared, ``moe_ep_size == 1``, no DeepEP, not W4AFP8, unless ``--disable-shared-experts-fusion``)."""
    return model.experts == 256 and model.shared_experts == 1 and not expert_parallel


_sglang_fuses_shared_expert = sglang_fuses_shared_expert  # the name tests/sim/cost/test_moe_tables.py imports


def fused_shared_expert_seconds(routed, n_tokens, model) -> np.ndarray:
    """The shared expert :func:`sglang_fuses_shared_expert` puts in the fused-MoE call of ``n_tokens``
    tokens: one more awake expert at the call's ``routed`` seconds per awake expert (uniform routing's
    expected awake experts; an estimate, the tables measure the routed experts alone)."""
    return routed / expected_experts(n_tokens, model.experts, model.experts_per_token)


def fused_shared_expert_source(model, n_tokens=None) -> str:
    """Where :func:`fused_shared_expert_seconds` comes from (with the awake experts at ``n_tokens`` where given)."""
    awake = "" if n_tokens is None else f" ({float(expected_experts(n_tokens, model.experts, model.experts_per_token)):.1f} awake under uniform routing)"
    return ("SGLang fuses DeepSeek-V3/R1's shared expert into the fused-MoE kernel as expert "
            f"{model.experts} (top-{model.experts_per_token + 1}) at moe_ep 1 (python/sglang/srt/models/deepseek_v2.py "
            f"determine_num_fused_shared_experts): one more awake expert at the routed call's measured seconds per awake expert{awake}")


def _mla_block(out: DecodeStep, model, root: Path, system: str, fw: str, dtype: str, kv: str, tp: int, batch: int,
               context: int) -> None:
    """The whole MLA block of a decode layer from a module table (vLLM's; an engine without one: vLLM's, said)."""
    mla_path = newest_table(root, system, "mla", fw, "mla_generation_module_perf.parquet")
    mla_note = ""
    if mla_path is None and fw != "vllm":
        mla_path, mla_note = newest_table(root, system, "mla", "vllm", "mla_generation_module_perf.parquet"), f", vLLM's: {fw} has no MLA tables"
    if not model.kv_lora_rank or mla_path is None:
        out.missing.append(f"attention of {model.name} ({'no MLA module table for ' + fw if model.kv_lora_rank else 'not MLA'})")
        return
    df = read_columns(str(mla_path), ("kernel_source", "model", "kv_cache_dtype", "gemm_type", "num_heads", "batch_size", "step", "latency"))
    gemm = "fp8_block" if dtype == "float8" else "bfloat16"
    df = df[(df.model == "deepseek-ai/DeepSeek-V3") & (df.kv_cache_dtype == kv) & (df.gemm_type == gemm) & (df.num_heads == model.heads // tp)]
    shape_ok = (model.hidden, model.q_lora_rank, model.kv_lora_rank) == (7168, 1536, 512)
    t = _bilinear(df, batch, context) if shape_ok and not df.empty else None
    if t is None:
        out.missing.append(f"MLA block at {model.heads // tp} heads, kv {kv}, batch {batch}, context {context}")
    else:
        out.parts["attention (MLA block)"] = model.layers * t
        out.sources["attention (MLA block)"] = f"{mla_path} ({df.kernel_source.iloc[0]}, kv {kv}{mla_note})"


#: draftsim weight dtype -> the MLA BMM table's bmm_dtype
_BMM_DTYPES = {"float8": "fp8", "bfloat16": "bfloat16", "float16": "bfloat16"}


@dataclass(frozen=True)
class MLAPart:
    """One operator of a latent-attention layer as :func:`mla_layer_parts` composes it: a GEMM of width
    (``n``, ``k``) at the call's tokens (``kind`` "gemm"), an absorbed BMM (``op``: the BMM table's
    op_name) at the call's tokens ("bmm"), or the attention kernel over the latent cache ("kernel")."""

    name: str
    kind: str
    n: int = 0
    k: int = 0
    op: str = ""


def mla_layer_parts(model, heads: int, phase: str = "generation") -> list[MLAPart]:
    """The operators of one latent-attention layer at ``heads`` query heads a device, as AIConfigurator
    composes it for SGLang (sdk/models/deepseek.py ``generation_mla_granular`` / ``context_mla_granular``;
    SGLang's tables hold no MLA module): the fused q_a+kv_a projection (replicated), q_b, then decoding
    (``phase`` "generation") the absorbed BMM with W_UK, the MLA kernel over the latent cache and the
    absorbed BMM with W_UV, prefilling ("context") the kv_b projection and the MLA prefill kernel; o_proj."""
    h, ql, kl, r, v = model.hidden, model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim, model.v_head_dim
    nope = model.head_dim - r
    head = [MLAPart("MLA q_a+kv_a projection", "gemm", (ql + kl + r) if ql else kl + r, h),
            MLAPart("MLA q projection", "gemm", heads * (nope + r), ql or h)]
    if phase == "generation":
        mid = [MLAPart("MLA absorbed BMM (q·W_UK)", "bmm", op="mla_gen_pre"), MLAPart("MLA attention kernel", "kernel"),
               MLAPart("MLA absorbed BMM (·W_UV)", "bmm", op="mla_gen_post")]
    elif phase == "context":
        mid = [MLAPart("MLA kv_b projection", "gemm", heads * (nope + v), kl), MLAPart("MLA attention kernel", "kernel")]
    else:
        raise DraftsimError(f"MLA phase {phase!r}: generation or context")
    return head + mid + [MLAPart("MLA o_proj", "gemm", h, heads * v)]


class GranularMLA:
    """One latent-attention layer priced part by part (:func:`mla_layer_parts`) from an engine's own tables:
    the GEMMs from its GEMM table (``gemms``: :func:`_gemm_grid`'s kernels of the weights' dtype), the
    absorbed BMMs from ``mla_bmm/<engine>/<version>/mla_bmm_perf.parquet`` (linear in tokens between measured
    counts) and the attention kernel from ``mla/<engine>/<version>/generation_mla_perf.parquet`` (decoding:
    bilinear in sequences and cached tokens) or ``context_mla_perf.parquet`` (prefilling: in sequences and
    prompt tokens), at ``heads`` query heads a device and the ``kv`` cache dtype (the tables' name). The
    BMM and kernel tables measure DeepSeek-V3's latent (512 + rope 64, 128-wide heads) only: another
    latent's are not measured. :func:`decode_step` (SGLang) and the operator model
    (:class:`~draftsim.sim.cost.operators.OperatorModel` with engine sglang) both price it so."""

    TABLES = {"generation": "generation_mla_perf.parquet", "context": "context_mla_perf.parquet"}

    def __init__(self, model, heads: int, dtype: str, kv: str, kernel_path: Path, bmm_path: Path | None, gemms,
                 gemm_path: Path | None, phase: str = "generation"):
        self.parts = mla_layer_parts(model, heads, phase)
        self.heads, self.kv, self.phase = heads, kv, phase
        self.kernel_path, self.bmm_path, self.gemms, self.gemm_path = kernel_path, bmm_path, gemms, gemm_path
        kl, r, v = model.kv_lora_rank, model.qk_rope_head_dim, model.v_head_dim
        #: the BMM and kernel tables hold this latent (DeepSeek-V3's)
        self.holds = (kl, r, model.head_dim - r, v) == (512, 64, 128, 128)
        a = read_columns(str(kernel_path), ("kernel_source", "kv_cache_dtype", "num_heads", "batch_size", "isl", "step", "latency"))
        a = a[(a.num_heads == heads) & (a.kv_cache_dtype == kv)]
        #: the kernel's axis besides the sequences: cached tokens decoding, prompt tokens prefilling
        self.axis = "step" if phase == "generation" else "isl"
        self.kernel = _Bilinear(a, self.axis) if self.holds and not a.empty else None
        self.kernel_name = a.kernel_source.iloc[0] if not a.empty else ""
        self.bmm_dtype = _BMM_DTYPES.get(dtype)
        #: op -> (tokens, milliseconds, kernel) of the BMM table
        self.bmm: dict[str, tuple[np.ndarray, np.ndarray, str]] = {}
        if bmm_path is not None:
            df = read_columns(str(bmm_path), ("kernel_source", "op_name", "bmm_dtype", "num_tokens", "num_heads", "latency"))
            for p in self.parts:
                if p.kind != "bmm" or not self.holds:
                    continue
                rows = df[(df.op_name == p.op) & (df.num_heads == heads) & (df.bmm_dtype == self.bmm_dtype)]
                if not rows.empty:
                    g = rows.groupby("num_tokens").latency.median()
                    x = g.index.to_numpy(np.float64)
                    self.bmm[p.op] = (x, monotone_table(g.to_numpy(np.float64), (x,)).values, rows.kernel_source.iloc[0])

    @classmethod
    def available(cls, model, root: Path, system: str, fw: str, phase: str = "generation") -> tuple[Path, Path | None] | None:
        """(kernel table, BMM table: decoding only) of ``fw``'s newest tables on ``system``; None where ``fw`` has
        no MLA kernel table of the phase (decoding: or no BMM table) or the model is not MLA."""
        kernel_path = newest_table(root, system, "mla", fw, cls.TABLES[phase])
        bmm_path = newest_table(root, system, "mla_bmm", fw, "mla_bmm_perf.parquet") if phase == "generation" else None
        if not model.kv_lora_rank or kernel_path is None or (phase == "generation" and bmm_path is None):
            return None
        return kernel_path, bmm_path

    @classmethod
    def of(cls, model, root: Path, system: str, fw: str, dtype: str, kv: str, heads: int, gemms=None, gemm_path: Path | None = None,
           phase: str = "generation") -> "GranularMLA | None":
        """The layer from ``fw``'s newest tables on ``system`` (:meth:`available`; None where they are missing).
        ``gemms`` and ``gemm_path``: the GEMM kernels and their table (None: ``fw``'s GEMM table, block-FP8
        kernels first for float8 weights, :func:`_gemm_grid`)."""
        paths = cls.available(model, root, system, fw, phase)
        if paths is None:
            return None
        if gemm_path is None:
            gemm_path = newest_table(root, system, "gemm", fw, "gemm_perf.parquet")
            gemms = _gemm_grid(gemm_path, "fp8_block" if dtype == "float8" else "bfloat16") if gemm_path else None
        return cls(model, heads, dtype, kv, *paths, gemms, gemm_path, phase)

    def token_range(self) -> tuple[float, float]:
        """The call tokens every GEMM and BMM part's table measured (lo > hi: none in common)."""
        lo, hi = 0.0, np.inf
        for p in self.parts:
            if p.kind == "gemm" and self.gemms is not None:
                r = self.gemms.m_range(p.n, p.k)
            elif p.kind == "bmm" and p.op in self.bmm:
                r = (float(self.bmm[p.op][0][0]), float(self.bmm[p.op][0][-1]))
            elif p.kind == "kernel":
                continue
            else:
                r = (np.inf, 0.0)
            lo, hi = max(lo, r[0]), min(hi, r[1])
        return lo, hi

    def seconds(self, part: MLAPart, tokens, batch, axis) -> np.ndarray:
        """One layer's seconds of ``part`` for calls of ``tokens`` new tokens over ``batch`` sequences at ``axis``
        (the kernel's: cached tokens decoding, prompt tokens prefilling); NaN where its table does not hold the shape."""
        if part.kind == "gemm":
            return self.gemms.at(tokens, part.n, part.k) if self.gemms is not None else np.full(np.shape(tokens), np.nan)
        if part.kind == "kernel":
            if self.kernel is None:
                return np.full(np.broadcast_shapes(np.shape(batch), np.shape(axis)), np.nan)
            return self.kernel(batch, axis)
        m = np.asarray(tokens, np.float64)
        tab = self.bmm.get(part.op)
        if tab is None:
            return np.full(m.shape, np.nan)
        x, ms, _ = tab
        return np.where((x[0] <= m) & (m <= x[-1]), 1e-3 * np.interp(m, x, ms), np.nan)

    def source(self, part: MLAPart, show: Callable = str) -> str:
        """The table that prices ``part`` (``show``: how a path is written) and its kernel."""
        if part.kind == "gemm":
            return show(self.gemm_path)
        if part.kind == "kernel":
            return f"{show(self.kernel_path)} ({self.kernel_name}, kv {self.kv})"
        return f"{show(self.bmm_path)} ({self.bmm[part.op][2]}, {self.bmm_dtype})" if part.op in self.bmm else show(self.bmm_path)

    def why(self, part: MLAPart, tokens, batch, axis) -> str:
        """Why ``part`` is not priced at the shape (its table does not hold it)."""
        if part.kind == "gemm":
            return f"GEMM m={tokens} n={part.n} k={part.k} not measured"
        if part.kind == "kernel":
            return f"{self.heads} heads, kv {self.kv}, batch {batch}, context {axis} not measured in {self.kernel_path.name}"
        return f"{part.op} at {self.heads} heads, {self.bmm_dtype}, {tokens} tokens not measured"


def _mla_parts(model, root: Path, system: str, fw: str, dtype: str, kv: str, tp: int, batch: int, context: int, gemms,
               gpath: Path | None) -> list | None:
    """[(part, seconds of one layer or None, source or why)] of the absorbed-MLA decode layer as AIConfigurator
    composes it for SGLang (:class:`GranularMLA`) at ``batch`` sequences of one new token over ``context`` cached
    tokens. None where ``fw`` has no MLA kernel or BMM table (the caller falls back to vLLM's block) or the model
    is not MLA."""
    mla = GranularMLA.of(model, root, system, fw, dtype, kv, model.heads // tp, gemms, gpath)
    if mla is None:
        return None
    parts = []
    for p in mla.parts:
        t = float(mla.seconds(p, batch, batch, context))
        parts.append((p.name, None, mla.why(p, batch, batch, context)) if np.isnan(t) else (p.name, t, mla.source(p)))
    return parts


class _Bilinear:
    """Latency (seconds) bilinear in (batch_size, ``axis``) on a table's measured grid; NaN outside it or where
    a corner with weight is not measured."""

    def __init__(self, df, axis: str = "step"):
        table = df.pivot_table(index="batch_size", columns=axis, values="latency", aggfunc="median")
        self.b, self.s = table.index.to_numpy(np.float64), table.columns.to_numpy(np.float64)
        self.raw = table.to_numpy(np.float64)
        #: the table made non-decreasing in both axes (module docstring)
        self.cleaning = monotone_table(self.raw, (self.b, self.s))
        self.v = self.cleaning.values

    def edge(self, batch, step) -> tuple[np.ndarray, np.ndarray]:
        """The measured point a shape outside the table is anchored at (:func:`~draftsim.sim.cost.efficiency.grid_edge`)."""
        return grid_edge(self.b, self.s, self.v, batch, step)

    def __call__(self, batch, step) -> np.ndarray:
        b, s, v = self.b, self.s, self.v
        x, y = np.broadcast_arrays(np.asarray(batch, np.float64), np.asarray(step, np.float64))
        inside = (b[0] <= x) & (x <= b[-1]) & (s[0] <= y) & (y <= s[-1])
        i = np.clip(np.searchsorted(b, x, side="right") - 1, 0, max(len(b) - 2, 0))
        j = np.clip(np.searchsorted(s, y, side="right") - 1, 0, max(len(s) - 2, 0))
        i1, j1 = np.minimum(i + 1, len(b) - 1), np.minimum(j + 1, len(s) - 1)
        db, ds = b[i1] - b[i], s[j1] - s[j]
        fb = np.where(db > 0, (x - b[i]) / np.where(db > 0, db, 1.0), 0.0)
        fs = np.where(ds > 0, (y - s[j]) / np.where(ds > 0, ds, 1.0), 0.0)
        total, bad = np.zeros(x.shape), np.zeros(x.shape, dtype=bool)
        for c, w in ((v[i, j], (1 - fb) * (1 - fs)), (v[i, j1], (1 - fb) * fs), (v[i1, j], fb * (1 - fs)), (v[i1, j1], fb * fs)):
            bad |= np.isnan(c) & (w > 0)
            total = total + np.where(w > 0, c * w, 0.0)
        return np.where(inside & ~bad, 1e-3 * total, np.nan)


def _bilinear(df, batch: float, step: float) -> float | None:
    """Latency (seconds) bilinear in (batch_size, step) on the measured grid; None outside it."""
    t = float(_Bilinear(df)(batch, step))
    return None if np.isnan(t) else t


@dataclass(frozen=True)
class GroupedGemmEfficiency:
    """The fused-MoE kernel's efficiency against the datasheet roofline as a function of the rows each
    awake expert receives, measured on one GPU (:func:`grouped_gemm_efficiency`): ``rows`` (increasing)
    and ``efficiency`` there, the median over the table's expert shapes; held at the ends outside them."""

    source: str
    rows: np.ndarray
    efficiency: np.ndarray

    def __call__(self, rows) -> np.ndarray:
        r = np.log(np.maximum(np.asarray(rows, dtype=np.float64), self.rows[0]))
        return np.interp(r, np.log(self.rows), self.efficiency)

    def priced(self, experts, bandwidth: float, peak: float) -> Callable:
        """One layer's seconds of ``experts`` (a :class:`~draftsim.sim.cost.moe.ExpertCost` without
        ``measured``) for calls of N tokens: its roofline at the datasheet ``bandwidth`` and ``peak``
        over this efficiency at the rows per awake expert of N tokens (uniform routing)."""
        def per_layer(n_tokens) -> np.ndarray:
            n = np.asarray(n_tokens, dtype=np.float64)
            rows = tokens_per_awake_expert(n, experts.experts, experts.per_token)
            eff = self(np.maximum(rows, 1.0))
            return np.where(n > 0, experts.seconds(n, bandwidth, peak) / experts.layers / eff, 0.0)

        return per_layer


#: the roofline's weight dtype -> the MoE table's moe_dtype and the bytes of a weight and of an activation
_EFFICIENCY_DTYPES = {"bfloat16": (("bfloat16",), 2, 2), "float16": (("bfloat16",), 2, 2), "float8": (("fp8_block", "fp8"), 1, 1)}


@functools.lru_cache(maxsize=32)
def _efficiency_curve(hardware_name: str, bandwidth: float, peak: float, dtype: str, tp: int = 1, expert_parallel: bool = False,
                      distribution: str = "balanced", shape: tuple | None = None) -> GroupedGemmEfficiency | None:
    system = SYSTEMS.get(hardware_name)
    kinds = _EFFICIENCY_DTYPES.get(dtype)
    if system is None or kinds is None:
        return None
    try:
        root = systems_root()
    except DraftsimError:  # the operators extra is not installed: the catalog's MBU/MFU
        return None
    path = newest_table(root, system, "moe", "vllm", "moe_perf.parquet")
    if path is None:
        return None
    df = read_columns(str(path), ("kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                                  "moe_tp_size", "moe_ep_size", "distribution", "latency"))
    mtp, mep = (1, tp) if expert_parallel else (tp, 1)
    df = df[(df.moe_tp_size == mtp) & (df.moe_ep_size == mep)]
    if distribution == "balanced" and not (df.distribution == distribution).any():  # A100's table measured skewed routers only
        distribution = DISTRIBUTION
    df = df[df.distribution == distribution]
    moe_dtypes, wb, ab = kinds
    df = next((d for d in (df[df.moe_dtype == m] for m in moe_dtypes) if not d.empty), None)
    if df is None:
        return None
    from .moe import ExpertCost

    groups = df.groupby(["hidden_size", "inter_size", "topk", "num_experts"])
    own = shape is not None and shape in groups.groups
    curves = []
    for (h, inter, k, e), g in groups:
        if own and (h, inter, k, e) != shape:
            continue
        kernels = sorted(g.kernel_source.unique())
        kernel = next((x for x in kernels if "triton" in x), kernels[0])
        t = g[g.kernel_source == kernel].groupby("num_tokens").latency.median()
        n, secs = t.index.to_numpy(np.float64), t.to_numpy(np.float64) * 1e-3
        if e % mep or inter % mtp:
            continue
        w = 3 * h * inter // mtp  # one expert's slice on a device (whole experts under expert parallelism)
        cost = ExpertCost(1, int(e), int(k), w * wb, (2 * h + 2 * inter // mtp) * ab, 2 * w, groups=mep)
        # rows of a one-token call come out as 1 + 2e-16: snapped to 1, else the grid's first point (one row)
        # falls outside every curve and the one-token measurement is lost
        rows = tokens_per_awake_expert(n, int(e), int(k))
        rows = np.where(np.isclose(rows, 1.0, rtol=1e-9, atol=0.0), 1.0, np.maximum(rows, 1.0))
        curves.append((np.log(rows), np.minimum(cost.seconds(n, bandwidth, peak) / secs, 1.0)))  # never above the datasheet
    if not curves:
        return None
    grid = np.geomspace(1.0, float(np.exp(max(c[0][-1] for c in curves))), 64)
    eff = []
    for r in np.log(grid):
        at = [np.interp(r, x, y) for x, y in curves if x[0] <= r <= x[-1]]
        eff.append(np.median(at) if at else np.nan)
    eff = np.asarray(eff)
    keep = np.isfinite(eff)
    which = f"the model's own expert shape {shape}" if own else f"median of {len(curves)} expert shapes"
    return GroupedGemmEfficiency(f"{path} ({which}, {'/'.join(moe_dtypes)}, {distribution} routing, "
                                 f"moe_tp {mtp}, moe_ep {mep})", grid[keep], eff[keep])


def grouped_gemm_efficiency(hardware, dtype: str, tp: int = 1, expert_parallel: bool = False, distribution: str = "balanced",
                            model=None) -> GroupedGemmEfficiency | None:
    """The grouped-GEMM efficiency curve of catalog ``hardware`` at weights ``dtype`` from vLLM's fused-MoE
    table (the triton kernel where measured) against the datasheet roofline of the same experts (its
    memory bandwidth and ``dtype``'s peak) at ``tp`` devices (``expert_parallel``: whole experts over them,
    else each expert split): the roofline's seconds over the measured ones at each token count, placed at
    that count's rows per awake expert (:func:`tokens_per_awake_expert`); ``model``'s own expert shape
    where the table holds it, else the median over the table's shapes at each of 64 rows from 1 up. The
    routing is ``balanced`` (uniform), the roofline's own assumption, so the curve is the kernel's
    efficiency alone (a table without balanced rows, A100's: :data:`DISTRIBUTION`, said in the source). None where the GPU, the dtype, the split or the tables (the ``operators`` extra)
    are missing."""
    try:
        peak = hardware.peak(WEIGHT_ONLY.get(dtype, dtype))
    except DraftsimError:
        return None
    shape = (model.hidden, model.expert_intermediate, model.experts_per_token, model.experts) if model is not None else None
    return _efficiency_curve(hardware.name, float(hardware.memory_bandwidth), float(peak), dtype, int(tp), bool(expert_parallel),
                             distribution, shape)
