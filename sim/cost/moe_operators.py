"""The parts of a mixture-of-experts or latent-attention target that the operator cost model
(:mod:`~draftsim.sim.cost.operators`, ``--cost-model operators``) prices from AIConfigurator's
tables beyond a dense model's GEMMs, attention and all-reduces:

* **routed experts** (``moe/<engine>/<version>/moe_perf.parquet``, read by
  :func:`~draftsim.sim.cost.moe_tables.measured_experts`): the fused-MoE kernel of one layer at the
  call's tokens (CUDA-graph padded), linear between the 27 measured counts, times the MoE layers —
  the grouped GEMMs at the rows each awake expert actually receives. More tokens than measured: the
  largest count's time scaled by the roofline's ratio (said); a model or GPU the table does not hold
  (GPT-OSS's MXFP4 experts, GLM-4.5): the roofline (said).
* **latent attention**, as each engine runs it. vLLM (``mla/vllm/<version>/mla_generation_module_perf.parquet``
  and ``mla_context_module_perf.parquet``): the whole MLA block of a layer (query and latent projections,
  FlashMLA, output projection) of DeepSeek-V3's shape at the query heads on a device, bilinear in
  (batch, cached tokens) for decoding and in (batch, prompt tokens) for a prefill. A sequence
  verifying n > 1 tokens is priced as n rows of the decode table over c + (n − 1)/2 cached tokens
  (its projections run on every token; FlashMLA reads the latent once per row here, more than it
  does: estimated, said). SGLang's tables hold no block: its layer is priced part by part with the
  parts and lookups :func:`~draftsim.sim.cost.moe_tables.decode_step` uses
  (:class:`~draftsim.sim.cost.moe_tables.GranularMLA`, AIConfigurator's composition for SGLang), each
  part's table named: decoding, the fused q_a+kv_a projection, q_b and o_proj from SGLang's GEMM table
  (block-FP8 weights: DeepGEMM's rows first) and the two absorbed BMMs (``mla_bmm/sglang/<version>/
  mla_bmm_perf.parquet``) at the call's tokens, FlashAttention-3's MLA decode kernel
  (``mla/sglang/<version>/generation_mla_perf.parquet``) bilinear in (sequences, cached tokens); a
  sequence verifying n > 1 tokens keeps vLLM's convention for the kernel (n rows over c + (n − 1)/2
  cached tokens, estimated, said), its projections and BMMs at the call's tokens. Prefilling: the
  q_a+kv_a, q_b, kv_b and o_proj projections at the call's tokens and the MLA prefill kernel
  (``context_mla_perf.parquet``) at (sequences, the whole prompt of the call's query–key pairs, as
  dense attention: exact for whole prompts, a chunk after cached tokens estimated, said). The KV cache
  is SGLang's default, bfloat16 (``--kv-cache-dtype auto``): the kernel's bfloat16 rows, and two bytes a
  cached element in the memory accounting (an explicit KV dtype: its own rows and bytes). A call a part's
  table does not hold: the roofline's latent attention (said); an engine with no MLA tables of its own:
  vLLM's block (said).
* **shared expert**: SGLang runs DeepSeek-V3/R1's inside the fused-MoE call at moe_ep 1
  (:func:`~draftsim.sim.cost.moe_tables.sglang_fuses_shared_expert`): one more awake expert at the routed
  call's seconds per awake expert (estimated, said), with no GEMMs or activation of its own; otherwise its
  two GEMMs.
* **all-to-all** (``comm/vllm/<version>/moe_a2a_perf.parquet``, DeepEP): with data-parallel
  attention (below) the dispatch and combine of each MoE layer at the tokens on a device — the
  low-latency kernels up to their largest measured count (256 tokens a device), the normal ones
  above — linear between measured counts, beyond a kernel's last (first) count its edge scaled by the
  roofline's interconnect (the ratio held ≥ 1 beyond, ≤ 1 below, as every table); the table measures 8
  devices and DeepSeek-class widths; elsewhere the roofline's interconnect, 2 × (latency +
  tokens·k·hidden·bytes·(D − 1)/D / bandwidth) per layer (said).

**Data-parallel attention with expert parallelism** (``expert_parallel`` at tp = D > 1; how SGLang
``--enable-dp-attention --moe-a2a-backend deepep`` and vLLM ``--data-parallel-size D
--enable-expert-parallel`` serve DeepSeek): every device runs attention, the dense MLPs, the shared
experts and the router whole, on its own ⌈B/D⌉ sequences (the step waits for the busiest rank); the
routed experts are split whole over the D devices (``moe_ep_size = D`` rows of the MoE table, at
the call's total tokens); tokens reach their experts by all-to-all, not all-reduce; the LM head
stays vocabulary-parallel over all N rows. Each device caches only its own sequences' KV (the
latent is not replicated) and holds every attention weight.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .efficiency import monotone_table
from .kernel_tables import read_columns

__all__ = ["A2A_LOW_LATENCY_MAX", "a2a_table", "attention_params", "mla_grid"]

#: DeepSeek-V3's latent-attention widths (hidden, q_lora_rank, kv_lora_rank): the shape the MLA tables measure.
MLA_SHAPE = (7168, 1536, 512)
#: DeepEP's low-latency kernels are measured up to this many tokens a device; beyond, the normal ones.
A2A_LOW_LATENCY_MAX = 256


def mla_grid(path: Path | None, model, heads: int, dtype: str, axis: str, kv: str = "bfloat16"):
    """(rows, kernel) of an MLA module table for ``model`` at ``heads`` query heads a device, of one
    kernel: latency (ms) by ``batch_size`` and ``axis``, ``step`` (decode: cached tokens) or ``isl``
    (prefill: prompt tokens); (None, why) where the table does not hold it. Block-FP8 weights read the
    block-FP8 GEMM rows, bfloat16 the bfloat16 ones; ``kv`` (the table's kv_cache_dtype, "bfloat16" or
    "fp8": :func:`~draftsim.sim.cost.moe_tables.kv_table_dtype`) the KV cache's rows."""
    if path is None:
        return None, "no MLA module table"
    if (model.hidden, model.q_lora_rank, model.kv_lora_rank) != MLA_SHAPE:
        return None, f"the MLA tables hold DeepSeek-V3's widths {MLA_SHAPE}, not {model.name}'s"
    df = read_columns(str(path), ("kernel_source", "model", "kv_cache_dtype", "gemm_type", "num_heads", "batch_size", "isl", "step", "latency"))
    gemm = "fp8_block" if dtype == "float8" else "bfloat16"
    df = df[(df.model == "deepseek-ai/DeepSeek-V3") & (df.kv_cache_dtype == kv) & (df.gemm_type == gemm) & (df.num_heads == heads)]
    if axis == "isl":
        df = df[df.step == 0] if "step" in df and (df.step == 0).any() else df
    if df.empty:
        return None, f"no rows at {heads} query heads, {gemm} GEMMs, {kv} KV"
    kernels = sorted(df.kernel_source.unique())
    # decoding: FlashMLA where measured (vLLM's MLA decode kernel on Hopper with an FP8 cache; the bfloat16-KV rows
    # measure FLASH_ATTN_MLA); a prefill: the kernel measured over the most prompt lengths
    # (FlashMLA's context rows stop at 128 tokens; vLLM prefills MLA with FlashAttention)
    kernel = (next((k for k in kernels if "FLASHMLA" in k.upper()), kernels[0]) if axis == "step" else
              max(kernels, key=lambda k: (df[df.kernel_source == k][axis].nunique(), k)))
    return df[df.kernel_source == kernel], f"{kernel}, {gemm} GEMMs, {kv} KV"


def a2a_table(path: Path | None, model, devices: int) -> dict | None:
    """{"low_latency"|"normal": (tokens a device, seconds of dispatch + combine)} of DeepEP in the
    all-to-all table for ``model``'s widths at ``devices`` (None: not measured)."""
    if path is None or not model.experts:
        return None
    df = read_columns(str(path), ("comm_backend", "phase", "ep_size", "node_num", "hidden_size", "topk", "num_experts", "num_tokens", "sms",
                                  "latency"))
    df = df[(df.ep_size == devices) & (df.node_num == 1) & (df.hidden_size == model.hidden) & (df.topk == model.experts_per_token)
            & (df.num_experts == model.experts)]
    out = {}
    for name, backend in (("low_latency", "deepep_ll"), ("normal", "deepep_ht")):
        rows = df[df.comm_backend == backend]
        if rows.empty:
            continue
        rows = rows[rows.sms == rows.sms.min()]  # one SM budget: the engines' default for the backend
        t = rows.pivot_table(index="num_tokens", columns="phase", values="latency", aggfunc="median").dropna()
        if {"dispatch", "combine"} <= set(t.columns) and len(t) > 1:
            tokens = t.index.to_numpy(np.float64)  # made non-decreasing in tokens, as every measured table (efficiency.monotone_table):
            seconds = (t["dispatch"] + t["combine"]).to_numpy(np.float64) * 1e-6  # B200's low-latency rows dip 128 -> 98 us over 1..32
            out[name] = (tokens, monotone_table(seconds, (tokens,)).values)
    return out or None


def attention_params(model) -> tuple[float, float]:
    """(weights split over tensor-parallel devices, weights replicated on each) of one layer's
    attention: with data-parallel attention every device holds both whole."""
    h, hd, H = model.hidden, model.head_dim, model.heads
    if model.kv_lora_rank:
        ql, kl, r, v = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim, model.v_head_dim
        split = (ql * H * hd if ql else h * H * hd) + kl * H * (hd - r + v) + H * v * h
        replicated = (h * ql if ql else 0) + h * (kl + r)
        return float(split), float(replicated)
    return float(h * (H + 2 * model.kv_heads) * hd + H * hd * h), 0.0
