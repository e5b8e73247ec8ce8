"""Roofline cost model of a dense decoder LM on given hardware.

Each operator of a forward call takes max(FLOPs / (peak · MFU), bytes / (bandwidth · MBU))
(the roofline of Williams, Waterman & Patterson, CACM 2009), and a call is the sum over its
operators, plus collectives and a fixed overhead:

* per layer: the QKV projection, attention (scores and values), the output projection and
  the MLP (3 matrices gated, 2 plain); each projection reads its weights once per call
  (whatever the batch) plus its input and output activations; FLOPs are 2 per weight per
  new token (Kaplan et al. 2020, eq. 2.2's 2N forward FLOPs per token);
* attention reads every active sequence's KV cache (c_i cached + n_i new entries of
  2·kv_heads·head_dim elements per layer) and does 4·head_dim FLOPs per query–key pair per
  head (QKᵀ and PV); with GQA the KV cache shrinks by heads/kv_heads;
* the LM head (vocab × hidden) computes logits for every new token (as verification
  needs); the embedding lookup reads one row per new token; tied embeddings store the matrix
  once (memory capacity) but the LM head still reads it;
* tensor parallelism over ``tp`` devices (Megatron-LM, Shoeybi et al. 2019) splits heads and
  MLP columns (KV heads replicate when kv_heads < tp), and adds two all-reduces of the
  activations per layer and an all-gather of the logits, each a ring collective:
  latency + 2(tp−1)/tp · bytes / (link bandwidth · efficiency) (all-gather: (tp−1)/tp);
* pipeline stages ``pp`` split the layers for memory; one call still runs them in sequence,
  plus a point-to-point activation transfer per stage boundary;
* a fixed overhead per call, ``overhead + overhead_per_layer · layers`` (framework and kernel
  launches): what dominates small batches of small models (:func:`fit_overhead` fits it
  from a measured profile); a serving engine's per-step overhead is added to it
  (:mod:`~draftsim.sim.cost.overheads`);
* a fixed GPU time per kernel where the hardware entry holds one (``kernel_fixed_us``: H100, H200,
  derived from their measured operator tables by benchmarks/derive_affine.py): each layer's GEMMs
  (2 attention projections, or a latent-attention model's 5 as absorbed decode runs them; 2 for a dense
  MLP; a MoE layer's router and 2 for its shared experts), its attention and its 3 elementwise kernels
  (norms and residual adds, the MLP activation) each add their kind's fixed time, as does the LM head's
  GEMM (a quantised call's GEMMs at ``gemm_<dtype>``'s time where the entry holds one, its router and LM head,
  left in bfloat16, at ``gemm``'s: :meth:`RooflineModel.kernel_counts`) (and a drafting head's own GEMMs, :class:`~draftsim.sim.cost.methods.Matmul`), and at tp > 1 the
  two all-reduces per layer take the ``allreduce`` fixed time in place of the interconnect latency
  (unless an engine's measured all-reduce table prices them); the MBU is derived with them in place;
* with ``graph_tokens`` (an engine's CUDA-graph capture sizes) the dense operators of a call of
  N tokens run at the smallest captured size ≥ N, as a replayed graph computes its padding.

**Dtypes.** ``dtype`` is the weights' dtype; activations, the GEMMs' rate and the KV cache follow
it, except that ``int4`` weights (W4A16, as AWQ/GPTQ kernels run them) are read at half a byte
each and multiplied at the ``bfloat16`` rate with ``bfloat16`` activations, their embedding and
LM head kept in ``bfloat16`` (what those formats leave unquantised) — an assumption, stated in
:data:`~draftsim.sim.cost.catalog.WEIGHT_ONLY`. ``kv_dtype`` (vLLM's ``--kv-cache-dtype``; None or
``auto``: the model's data type, as the engines do — bfloat16 under FP8, INT8 and INT4 weights,
:data:`~draftsim.sim.cost.catalog.KV_AUTO`) sets the bytes of each cached and new KV entry: an FP8 cache halves
what attention reads and what the cache holds against ``bfloat16``.

Efficiency factors (``mfu``, ``mbu``, ``ici_efficiency``) come from the hardware entry and
may be overridden.

**Routed experts** (:mod:`~draftsim.sim.cost.moe`): the weights of the experts a call wakes (uniform
routing) at the MBU, plus a fixed time per fused-MoE call, one per MoE layer: the hardware entry's
``fused_moe_us``, derived from the GPU's measured fused-MoE table at one anchor (Qwen3-30B-A3B,
bfloat16, one token, one GPU: benchmarks/derive_fused_moe.py). The tables show that form: at one token
a fused-MoE call of any shape takes some 20–25 µs more than its bytes at the MBU on H100/H200 (Qwen3-30B-A3B
at tp 8 reads 4 µs of weights and measures 21–25 µs), while large calls run at about the MBU; an
efficiency (one factor on the bytes) would price the big calls twice too slow. A GPU without the field
(no fused-MoE table) prices the routed experts at the plain MBU, no fixed time. Norms, rotary embeddings, biases and softmax are neglected (a few % of the
FLOPs and bytes of one layer). Sliding-window attention (Mistral-7B v0.1, Gemma-2 local
layers) is treated as full attention, which overestimates KV reads beyond the window.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import DraftsimError, as_count, as_positive
from .base import BatchStats, CostModel, checked_sizes
from .catalog import WEIGHT_ONLY, HardwareSpec, ModelSpec, dtype_bytes, kv_auto_dtype
from .memory import MemoryFootprint, activation_bytes_per_token
from .moe import ExpertCost
from .moe_tables import grouped_gemm_efficiency
from .overheads import pad_tokens

__all__ = ["RooflineModel", "fit_overhead", "overlapped"]


class RooflineModel(CostModel):
    """Seconds of a forward call of ``model`` on ``tp × pp`` devices of ``hardware`` in ``dtype``.

    Parameters
    ----------
    model, hardware : catalog records
    dtype : weights (and activations and KV cache unless said otherwise): "float32", "bfloat16", "float16",
        "float8", "int8", or "int4" (weights only; activations and compute in bfloat16)
    kv_dtype : the KV cache's elements (None: the model's data type, :func:`~draftsim.sim.cost.catalog.kv_auto_dtype`)
    tp, pp : tensor-parallel and pipeline-parallel degrees, >= 1
    mfu, mbu, ici_efficiency, overhead, overhead_per_layer : override the hardware's factors
    check_memory : refuse (DraftsimError) when the weights do not fit in the devices' memory
    floor : the least a call takes (host work run beside the forward: an overlapped scheduler)
    expert_parallel : place the routed experts whole across the tp devices (:mod:`draftsim.sim.cost.moe`)
    moe_efficiency : True: the routed experts at the grouped-GEMM efficiency measured at the rows each
        awake expert receives, where the GPU has a fused-MoE table (:func:`~draftsim.sim.cost.moe_tables.grouped_gemm_efficiency`,
        the ``operators`` extra). Off by default: a default price must not depend on whether an optional
        package is installed, and rows per awake expert do not tell one token from eight (both ~1 row)
        where the table's efficiency climbs from ~0.16 to ~0.6; False, or without a table: the catalog's MBU and MFU
    kv_per_query : attention reads each query's whole context (a verification by batch expansion)
    fused_moe : seconds of one fused-MoE call beyond its bytes, per MoE layer (None: the hardware's
        ``fused_moe``, 0 where not derived; unused with a measured ``moe_efficiency`` curve)
    kernel_fixed : fixed seconds per kernel call by kind (None: the hardware's ``kernel_fixed``; {}: none)
    """

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, dtype: str = "bfloat16", tp: int = 1, pp: int = 1, *,
                 mfu: float | None = None, mbu: float | None = None, ici_efficiency: float | None = None,
                 overhead: float | None = None, overhead_per_layer: float | None = None, check_memory: bool = True,
                 graph_tokens: tuple[int, ...] | None = None, overlap: float = 1.0, allreduce=None, floor: float = 0.0,
                 expert_parallel: bool = False, kv_per_query: bool = False, kv_dtype: str | None = None, moe_efficiency: bool = False,
                 fused_moe: float | None = None, kernel_fixed: dict | None = None):
        self.model, self.hardware, self.dtype = model, hardware, dtype
        self.tp = int(as_count("tp", tp, minimum=1, maximum=1024))
        self.pp = int(as_count("pp", pp, minimum=1, maximum=model.layers))
        #: bytes of one weight of the layers' matrices
        self.weight_bytes = dtype_bytes(dtype)
        #: the activations' and the GEMMs' dtype (int4 weights run as W4A16)
        self.compute_dtype = WEIGHT_ONLY.get(dtype, dtype)
        #: bytes of one activation (and of the embedding and LM head weights of int4 weights)
        self.bytes = dtype_bytes(self.compute_dtype)
        self.kv_dtype = kv_auto_dtype(dtype) if kv_dtype in (None, "auto") else kv_dtype
        if self.kv_dtype in WEIGHT_ONLY:
            raise DraftsimError(f"--kv-dtype {self.kv_dtype} is a weight format; a KV cache is held in "
                                f"{', '.join(d for d in ('auto', 'float32', 'bfloat16', 'float16', 'float8', 'int8'))}")
        #: bytes of one KV-cache element
        self.kv_bytes = dtype_bytes(self.kv_dtype)
        self._head_bytes = self.bytes if dtype in WEIGHT_ONLY else self.weight_bytes
        self.peak = hardware.peak(self.compute_dtype)
        self.mfu = hardware.mfu if mfu is None else _fraction("mfu", mfu)
        self.mbu = hardware.mbu if mbu is None else _fraction("mbu", mbu)
        self.ici_efficiency = hardware.ici_efficiency if ici_efficiency is None else _fraction("ici_efficiency", ici_efficiency)
        self.overhead = hardware.overhead if overhead is None else float(_nonneg("overhead", overhead))
        #: seconds of one fused-MoE call (one per MoE layer) beyond its bytes at the MBU (0: none)
        self.fused_moe = hardware.fused_moe if fused_moe is None else float(_nonneg("fused_moe", fused_moe))
        self.overhead_per_layer = hardware.overhead_per_layer if overhead_per_layer is None else float(_nonneg("overhead_per_layer", overhead_per_layer))
        #: fixed GPU seconds per kernel call by kind (module docstring; {}: none)
        self.kernel_fixed = dict(hardware.kernel_fixed if kernel_fixed is None else
                                 {k: float(_nonneg(f"kernel_fixed {k}", v)) for k, v in kernel_fixed.items()})
        #: CUDA-graph capture sizes in tokens: the dense operators run at the next size up (None: no padding)
        self.graph_tokens = None if graph_tokens is None else tuple(int(x) for x in graph_tokens)
        #: how far an operator's memory and compute times overlap: its time is max(m, c) + (1 − overlap)·min(m, c)
        #: (1: the roofline's max; 0: their sum, as a fit of a real engine's forward finds, sim/data/engines.json)
        self.overlap = float(overlap)
        #: measured all-reduce times at this tp (message bytes, seconds; increasing), or None: latency + bytes / bandwidth
        self.allreduce = None if allreduce is None else (np.asarray(allreduce[0], dtype=np.float64), np.asarray(allreduce[1], dtype=np.float64))
        #: the least a call takes, seconds: host work that runs beside the forward (an engine's
        #: overlapped scheduler) makes a step max(forward, host) rather than their sum
        self.floor = float(_nonneg("floor", floor))
        #: attention reads each query's whole context, with no reuse between a sequence's queries (a
        #: verification scored by batch expansion: every draft position a sequence of its own)
        self.kv_per_query = bool(kv_per_query)
        #: routed experts placed whole across the tp devices (vLLM's --enable-expert-parallel at DP 1)
        self.expert_parallel = bool(expert_parallel)
        #: price the routed experts at the grouped-GEMM efficiency the GPU's MoE table measures (where it has one)
        self.moe_efficiency = bool(moe_efficiency)
        #: that efficiency curve (sim/cost/moe_tables.py), or None: the catalog's MBU/MFU
        self.expert_efficiency = None
        if self.expert_parallel:
            if not model.experts:
                raise DraftsimError(f"--expert-parallel places routed experts on devices; {model.name} has none (a dense model)")
            if model.experts % self.tp:
                raise DraftsimError(f"--expert-parallel places whole experts: {model.name}'s {model.experts} routed experts do not "
                                    f"split over --tp {self.tp}; valid --tp: "
                                    f"{', '.join(str(t) for t in range(1, model.experts + 1) if model.experts % t == 0 and model.heads % t == 0)}")
        if not 0.0 <= self.overlap <= 1.0:
            raise DraftsimError(f"overlap must lie in [0, 1] (1: the roofline's max of memory and compute time; 0: their sum); got {overlap!r}")
        if model.heads % self.tp:
            raise DraftsimError(f"--tp {self.tp} does not divide {model.name}'s {model.heads} attention heads (tensor parallelism splits "
                                f"them evenly, as vLLM requires); valid: {', '.join(str(t) for t in range(1, min(model.heads, 64) + 1) if model.heads % t == 0)}")
        if (self.tp > 1 or self.pp > 1) and hardware.interconnect_bandwidth <= 0:
            raise DraftsimError(f"hardware {hardware.name!r} lists no interconnect; use --tp 1 --pp 1")
        self.name = f"{model.name} on {self.devices}x {hardware.name} ({dtype}" + (f", kv {self.kv_dtype}" if self.kv_dtype != self.compute_dtype
                                                                                 else "") + (f", tp {self.tp}" if self.tp > 1 else "") + \
            (f", pp {self.pp}" if self.pp > 1 else "") + ")"
        self._build()
        if check_memory:
            self.check_fits(1, 0)

    @property
    def devices(self) -> int:
        return self.tp * self.pp

    def _build(self) -> None:
        """Per-call coefficients of each operator, per device: FLOPs and bytes are affine in
        (tokens N, pairs, KV entries read); weights are a constant."""
        m, t, w = self.model, self.tp, self.bytes
        hd, h = m.head_dim, m.hidden
        q_heads = m.heads / t
        kvw = self.kv_bytes
        kv_heads = float(np.ceil(m.kv_heads / t))  # replicated when fewer KV heads than devices
        qkv_out = (q_heads + 2 * kv_heads) * hd
        L = m.layers
        # (weight elements, FLOPs per token, activation elements per token) of the dense operators, per device
        qkv = (h * qkv_out, 2 * h * qkv_out, h + qkv_out)
        out = (q_heads * hd * h, 2 * q_heads * hd * h, q_heads * hd + h)
        mlp_w = m.mlp_matrices * h * m.intermediate / t
        mlp = (mlp_w, 2 * mlp_w, h + (m.mlp_matrices - 1) * m.intermediate / t + h)
        head_w = m.vocab * h / t
        head = (head_w, 2 * head_w, h + m.vocab / t)
        self._kv_bytes = 2 * kv_heads * hd * kvw * L  # per KV entry (cached or new) read, all layers
        self._q_bytes = 2 * q_heads * hd * w * L  # per new token: queries in, attention out
        self._pair_flops = 4 * q_heads * hd * L  # per query-key pair
        self._experts = None
        if not m.experts and not m.kv_lora_rank:
            # rows: layer ops (x L), then the LM head (x 1)
            groups = [(np.array([qkv, out, mlp]), L), (np.array([head]), 1)]
        else:
            groups = self._moe_groups(qkv, out, mlp, head)
        # weights in the weights' dtype; the LM head (the last group) in the head's (int4: bfloat16)
        self._dense = [(d[:, 0] * (self._head_bytes if i == len(groups) - 1 else self.weight_bytes), d[:, 1], d[:, 2] * w, mult)
                       for i, (d, mult) in enumerate(groups)]
        self._embed_bytes = h * w  # one embedding row per new token
        #: GPU seconds per call of the kernels' fixed times (``kernel_fixed``), all layers
        self.kernel_seconds = self._kernel_seconds()
        self._fixed = self.overhead + self.overhead_per_layer * L + self.kernel_seconds
        bw = self.hardware.interconnect_bandwidth * self.ici_efficiency
        lat = self.hardware.interconnect_latency
        # collectives: per call a constant (latencies) plus seconds per new token
        self._comm_fixed, self._comm_per_token = 0.0, 0.0
        self._ar = None  # (count per call, bytes per token, sizes, seconds, seconds per byte beyond the largest size)
        if t > 1:
            ring = 2 * (t - 1) / t
            ar_lat = self.kernel_fixed.get("allreduce", lat)  # an all-reduce's fixed time: measured where derived, else the latency
            self._comm_fixed += lat + (0 if self.allreduce is not None else 2 * L * ar_lat)  # the logits' gather; the all-reduces
            self._comm_per_token += (t - 1) / t * m.vocab * w / bw
            if self.allreduce is None:
                self._comm_per_token += 2 * L * ring * h * w / bw
            else:  # two per layer, each at its measured time for its message: h values per token
                sizes, secs = self.allreduce
                self._ar = (2 * L, h * w, sizes, secs, ring / bw)
        if self.pp > 1:
            self._comm_fixed += (self.pp - 1) * lat
            self._comm_per_token += (self.pp - 1) * h * w / bw
        # what a call's time needs, fixed per model: the dense operators' curve and attention's factors
        P = self.peak * self.mfu
        B = self.hardware.memory_bandwidth * self.mbu
        a, b, c = [], [], []  # dense operator j takes max(a_j + b_j·N, c_j·N) seconds
        for weights, flops_tok, act_tok, mult in self._dense:
            a.extend(weights * mult / B)
            b.extend(act_tok * mult / B)
            c.extend(flops_tok * mult / P)
        linear = self._comm_per_token + self._embed_bytes / B  # embedding rows and collectives, per new token
        self._curve = _DenseCurve(np.array(a), np.array(b), np.array(c), linear, self._fixed + self._comm_fixed, self.overlap)
        self._kv_per_cached = self._kv_bytes / B
        self._kv_per_token = (self._kv_bytes + self._q_bytes) / B
        self._q_per_token = self._q_bytes / B
        self._flops_per_pair = self._pair_flops / P

    def kernel_counts(self) -> dict[str, int]:
        """Kernels a call runs per kind: each layer's GEMMs, attention and 3 elementwise kernels, and the
        LM head's GEMM (the embedding row left out; the all-reduces are priced with the collectives).

        ``gemm`` counts the GEMMs in the call's dtype, ``gemm_unquantized`` those a quantised checkpoint
        leaves in bfloat16: a MoE layer's router (SGLang's ``MoEGate``: ``F.linear`` on its bfloat16 weight,
        sgl-project/sglang python/sglang/srt/models/deepseek_v2.py at 00114aef) and the LM head (an
        assumption: FP8 checkpoints and vLLM/SGLang's FP8 methods quantise the linear layers only).
        Latent attention (DeepSeek-V2/V3) as the engines run it in absorbed decode (SGLang's
        ``forward_absorb_prepare`` / ``forward_absorb_core``, same file): the fused q_a + kv_a GEMM
        (``fused_qkv_a_proj_with_mqa``; without a query bottleneck ``q_proj`` and ``kv_a_proj_with_mqa``),
        ``q_b_proj``, the two absorbed BMMs (``bmm_fp8`` with ``w_kc`` and ``w_vc``, in place of ``kv_b_proj``)
        and ``o_proj``: 5 GEMMs either way. The latent's own RMSNorms (``q_a_layernorm``, ``kv_a_layernorm``)
        are not counted: adding them (2 elementwise kernels a layer) was scored on benchmarks/derive_affine.py's
        held-out check and left the held-out median where it was (issue 37, item 1; not adopted)."""
        m, L = self.model, self.model.layers
        attn = 5 if m.kv_lora_rank else 2  # fused q_a+kv_a (or q, kv_a), q_b, 2 absorbed BMMs, o; or qkv, o
        quantized = self.compute_dtype not in ("bfloat16", "float16", "float32")
        router = m.moe_layers
        gemms = L * attn + (L - m.moe_layers) * 2 + m.moe_layers * (2 if m.shared_experts else 0)
        plain = router + 1  # the routers and the LM head
        counts = {"gemm": gemms + (0 if quantized else plain), "attention": L, "elementwise": 3 * L}
        if quantized:
            counts["gemm_unquantized"] = plain
        return counts

    def gemm_fixed(self) -> float:
        """Seconds of one GEMM kernel's fixed time in the call's dtype: ``kernel_fixed`` ``gemm_<dtype>``
        where derived (``gemm_float8``: the FP8 GEMMs of the GPU's tables), else ``gemm``."""
        return self.kernel_fixed.get(f"gemm_{self.compute_dtype}", self.kernel_fixed.get("gemm", 0.0))

    def _kernel_seconds(self) -> float:
        if not self.kernel_fixed:
            return 0.0
        fixed = dict(self.kernel_fixed, gemm=self.gemm_fixed(), gemm_unquantized=self.kernel_fixed.get("gemm", 0.0))
        return float(sum(n * fixed.get(k, 0.0) for k, n in self.kernel_counts().items()))

    def _moe_groups(self, qkv, out, mlp, head) -> list:
        """The dense operator rows of a mixture-of-experts or latent-attention model (the routed
        experts are priced apart: :class:`draftsim.sim.cost.moe.ExpertCost`), and its attention
        and expert factors. Multi-head latent attention (DeepSeek-V2/V3): the query bottleneck and
        the latent's down-projection are replicated on every TP device, the heads' up-projections
        and the output split; the cache holds the latent and the rotary key once per token per
        layer (on every device), and decoding attends over the latent (absorbed weights):
        2·(kv_lora + rope) FLOPs per head per pair for the scores, 2·kv_lora for the values."""
        m, t, w = self.model, self.tp, self.bytes
        h, L, hd = m.hidden, m.layers, m.head_dim
        attn = [qkv, out]
        if m.kv_lora_rank:
            Hq, ql, kl, r, v = m.heads / t, m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim
            q = [(h * ql, 2 * h * ql, h + ql), (ql * Hq * hd, 2 * ql * Hq * hd, ql + Hq * hd)] if ql else \
                [(h * Hq * hd, 2 * h * Hq * hd, h + Hq * hd)]
            kv = [(h * (kl + r), 2 * h * (kl + r), h + kl + r), (kl * Hq * (hd - r + v), 2 * kl * Hq * (hd - r + v), kl + Hq * (hd - r + v))]
            attn = q + kv + [(Hq * v * h, 2 * Hq * v * h, Hq * v + h)]
            self._kv_bytes = (kl + r) * self.kv_bytes * L
            self._q_bytes = 2 * Hq * hd * w * L
            self._pair_flops = Hq * (2 * (kl + r) + 2 * kl) * L
        groups = [(np.array(attn), L)]
        dense_layers = L - m.moe_layers
        if dense_layers:
            groups.append((np.array([mlp]), dense_layers))
        if m.moe_layers:
            rows = [(h * m.experts, 2 * h * m.experts, h + m.experts)]  # the router, replicated
            if m.shared_experts:
                sw = m.shared_experts * m.expert_params / t
                rows.append((sw, 2 * sw, h + (m.mlp_matrices - 1) * m.shared_experts * m.expert_intermediate / t + h))
            groups.append((np.array(rows), m.moe_layers))
            e = t if self.expert_parallel else 1  # devices the experts are spread over whole; else each split over t
            split = t // e
            act = (h + (m.mlp_matrices - 1) * m.expert_intermediate / split + h) * w
            self._experts = ExpertCost(m.moe_layers, m.experts, m.experts_per_token, m.expert_params / split * self.weight_bytes, act,
                                       2 * m.expert_params / split, groups=e)
            # the grouped GEMMs at the efficiency the GPU's fused-MoE table measures at the rows each awake expert receives
            curve = grouped_gemm_efficiency(self.hardware, self.dtype, t, self.expert_parallel, model=m) if self.moe_efficiency else None
            if curve is not None:
                self.expert_efficiency = curve
                self._experts = dataclasses.replace(self._experts, measured=curve.priced(self._experts, self.hardware.memory_bandwidth,
                                                                                          self.peak))
            elif self.fused_moe:  # the fused-MoE call's fixed time on top of its bytes (module docstring)
                self._experts = dataclasses.replace(self._experts, fixed=self.fused_moe)
        groups.append((np.array([head]), 1))
        return groups

    def _allreduce_seconds(self, N) -> np.ndarray | float:
        """The tensor-parallel all-reduces of calls of N tokens at their measured times (0 without
        a measured table): interpolated between the measured message sizes, the smallest one's
        time below them (a latency floor), and beyond the largest the catalog's interconnect
        bandwidth from the largest one's time on."""
        if self._ar is None:
            return 0.0
        count, per_token, sizes, secs, per_byte = self._ar
        msg = np.asarray(N, dtype=np.float64) * per_token
        t = np.where(msg <= sizes[-1], np.interp(msg, sizes, secs), secs[-1] + (msg - sizes[-1]) * per_byte)
        return count * np.where(msg > 0, t, 0.0)

    def expert_seconds(self, N) -> np.ndarray | float:
        """The routed experts' seconds for calls of N tokens (0 for a dense model)."""
        return self._expert_seconds(N)

    def latent_attention_seconds(self, B, N, cached) -> np.ndarray:
        """A latent-attention model's attention per call of N tokens over B sequences with ``cached``
        tokens in all: its projections (the first dense group, once per layer) and the attention over
        the latent cache, each max(memory, compute) at the catalog's MBU/MFU."""
        weights, flops_tok, act_tok, mult = self._dense[0]
        P, bw = self.peak * self.mfu, self.hardware.memory_bandwidth * self.mbu
        n = np.asarray(N, np.float64)[..., None]
        proj = (np.maximum((weights + act_tok * n) * (mult / bw), n * (flops_tok * mult / P))).sum(axis=-1)
        pairs = N * (cached / B + (N / B + 1) / 2)
        return proj + np.maximum(cached * self._kv_per_cached + N * self._kv_per_token, pairs * self._flops_per_pair)

    def _expert_seconds(self, N) -> np.ndarray | float:
        """The routed experts' seconds for calls of N tokens (0 for a dense model)."""
        if self._experts is None:
            return 0.0
        if self._experts.measured is not None:  # at the measured grouped-GEMM efficiency (bandwidth and peak inside)
            return self._experts.seconds(N, 0.0, 0.0)
        if self.overlap < 1.0:
            B, P = self.hardware.memory_bandwidth * self.mbu, self.peak * self.mfu
            return overlapped(self._experts.bytes(N) / B, self._experts.flops(N) / P, self.overlap) + self._experts.fixed_seconds(N)
        return self._experts.seconds(N, self.hardware.memory_bandwidth * self.mbu, self.peak * self.mfu)

    # -- the cost interface ----------------------------------------------------------------------
    def _parts(self, stats: BatchStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Seconds limited by memory, by compute, and fixed (overhead + collectives)."""
        P = self.peak * self.mfu
        B = self.hardware.memory_bandwidth * self.mbu
        N = stats.tokens
        mem = np.zeros_like(N)
        cmp = np.zeros_like(N)
        for weights, flops_tok, act_tok, mult in self._dense:
            for wb, ft, at in zip(weights, flops_tok, act_tok):
                tm = (wb + at * N) * (mult / B)
                tc = N * (ft * mult / P)
                _accumulate(mem, cmp, tm, tc)
        read = stats.pairs if self.kv_per_query else stats.cached + N  # KV entries read (see _time)
        tm = (read * self._kv_bytes + N * self._q_bytes) / B
        tc = stats.pairs * (self._pair_flops / P)
        _accumulate(mem, cmp, tm, tc)
        if self._experts is not None:
            _accumulate(mem, cmp, self._experts.bytes(N) / B, self._experts.flops(N) / P)
        mem += N * (self._embed_bytes / B)
        fixed = self._fixed + self._comm_fixed + self._comm_per_token * N + self._allreduce_seconds(N)
        if self._experts is not None:
            fixed = fixed + self._experts.fixed_seconds(N)
        return mem, cmp, fixed

    def _time(self, stats: BatchStats) -> np.ndarray:
        # Same sum as _parts, faster: the dense operators' max(memory, compute) terms depend on
        # N only and sum to a convex piecewise-linear function of N, evaluated by np.interp at
        # its breakpoints (:class:`_DenseCurve`); attention adds max(KV bytes / bandwidth, pair FLOPs / peak).
        N = stats.tokens
        padded = N if self.graph_tokens is None else pad_tokens(N, self.graph_tokens)
        out = self._curve(padded)
        if self._ar is not None:
            out += self._allreduce_seconds(padded)
        if self.kv_per_query:  # every query reads its own context: KV entries read = query-key pairs
            kv = stats.pairs * self._kv_per_cached + N * self._q_per_token
        else:
            kv = stats.cached * self._kv_per_cached
            kv += N * self._kv_per_token
        flops = stats.pairs * self._flops_per_pair
        if self.overlap < 1.0:
            kv = overlapped(kv, flops, self.overlap)
        elif np.ndim(kv):
            np.maximum(kv, flops, out=kv)
        else:
            kv = np.maximum(kv, flops)
        out += kv
        if self._experts is not None:
            out += self._expert_seconds(N)
        if self.floor:
            out = np.maximum(out, self.floor)
        return out

    def shape_time(self, batch, new_tokens, context=0) -> np.ndarray:
        """:meth:`CostModel.shape_time` computed straight from the shapes (the same sums as
        ``_time`` of their :class:`BatchStats`, with fewer temporary arrays)."""
        b = checked_sizes("batch", batch, 1)
        n = checked_sizes("new_tokens", new_tokens, 1)
        c = checked_sizes("context", context, 0)
        shape = np.broadcast_shapes(b.shape, n.shape, c.shape)
        b, n, c = (np.atleast_1d(x) for x in np.broadcast_arrays(b, n, c))
        P = self.peak * self.mfu
        B = self.hardware.memory_bandwidth * self.mbu
        N = np.multiply(b, n, dtype=np.float64)
        padded = N if self.graph_tokens is None else pad_tokens(N, self.graph_tokens)
        out = self._curve(padded)
        if self._ar is not None:
            out = out + self._allreduce_seconds(padded)
        # attention: max(KV bytes, pair FLOPs) over KV entries b·c + N and pairs N·(c + (n + 1)/2)
        flops = np.add(n, 1.0, dtype=np.float64)
        flops *= 0.5
        flops += c
        flops *= N
        if self.kv_per_query:  # KV entries read = query-key pairs (see _time)
            kv = flops * (self._kv_bytes / B)
            N *= self._q_bytes / B
            kv += N
        else:
            N *= (self._kv_bytes + self._q_bytes) / B
            kv = np.multiply(b, c, dtype=np.float64)
            kv *= self._kv_bytes / B
            kv += N
        flops *= self._pair_flops / P
        if self.overlap < 1.0:
            kv = overlapped(kv, flops, self.overlap)
        else:
            np.maximum(kv, flops, out=kv)
        out += kv
        if self._experts is not None:
            out += self._expert_seconds(np.multiply(b, n, dtype=np.float64))
        if self.floor:
            np.maximum(out, self.floor, out=out)
        return out.reshape(shape)[()]

    def _bound(self, stats: BatchStats) -> np.ndarray:
        mem, cmp, fixed = self._parts(stats)
        return np.argmax(np.stack([fixed, mem, cmp]), axis=0) + 1

    # -- memory capacity -------------------------------------------------------------------------
    def weight_bytes_per_device(self) -> float:
        m = self.model
        embed = m.vocab * m.hidden * (1 if m.tied_embeddings else 2)  # embedding and LM head (int4: kept in bfloat16)
        return ((m.params - embed) * self.weight_bytes + embed * self._head_bytes) / self.devices

    def kv_bytes_per_device(self, batch, context) -> np.ndarray:
        m = self.model
        if m.kv_lora_rank:  # the latent and the rotary key, on every TP device
            per_token = m.kv_per_token * self.kv_bytes / self.pp
        else:
            kv_heads = np.ceil(m.kv_heads / self.tp)
            per_token = 2 * kv_heads * m.head_dim * self.kv_bytes * m.layers / self.pp
        return np.asarray(batch, dtype=np.float64) * np.asarray(context, dtype=np.float64) * per_token

    def memory(self) -> MemoryFootprint:
        """Weights, KV per cached token and activations per new token on each of its devices."""
        return MemoryFootprint(self.weight_bytes_per_device(), float(self.kv_bytes_per_device(1, 1)),
                               activation_bytes_per_token(self.model, self.tp, self.bytes))

    def check_fits(self, batch, context, extra_weights: float = 0.0, extra_kv_per_token: float = 0.0) -> None:
        """Raise unless weights plus the KV cache of ``batch`` sequences of ``context`` tokens
        fit in the usable memory of each device (say by how much they do not). ``extra_*``:
        what drafting heads on the same devices add (bytes per device; per cached token)."""
        hw = self.hardware
        cap = hw.memory * hw.usable_memory
        weights = self.weight_bytes_per_device() + extra_weights
        kv = float(np.max(self.kv_bytes_per_device(batch, context) + extra_kv_per_token * np.asarray(batch) * np.asarray(context)))
        if weights + kv > cap:
            what = f"{weights / 1e9:.1f} GB of weights" + (f" + {kv / 1e9:.1f} GB of KV cache (batch {int(np.max(batch))} x context "
                                                            f"{int(np.max(context))})" if kv > 0 else "")
            hint = f"; add devices (--tp/--pp; {self.devices} now)" if hw.interconnect_bandwidth > 0 else ""
            raise DraftsimError(
                f"{self.model.name} in {self.dtype} does not fit on {hw.name}: {what} per device, "
                f"{cap / 1e9:.1f} GB usable ({hw.usable_memory:.0%} of {hw.memory / 1e9:.0f} GB): "
                f"{(weights + kv - cap) / 1e9:.1f} GB short{hint}"
            )

    def with_overhead(self, overhead: float, overhead_per_layer: float = 0.0) -> "RooflineModel":
        """The same roofline with another fixed overhead per call."""
        return RooflineModel(self.model, self.hardware, self.dtype, self.tp, self.pp, mfu=self.mfu, mbu=self.mbu,
                             ici_efficiency=self.ici_efficiency, overhead=overhead, overhead_per_layer=overhead_per_layer,
                             check_memory=False, graph_tokens=self.graph_tokens, overlap=self.overlap, allreduce=self.allreduce,
                             floor=self.floor, expert_parallel=self.expert_parallel, kv_per_query=self.kv_per_query, kv_dtype=self.kv_dtype,
                             moe_efficiency=self.moe_efficiency, fused_moe=self.fused_moe, kernel_fixed=self.kernel_fixed)


class _DenseCurve:
    """Seconds of a call's dense operators and fixed costs as a function of its new tokens N:
    Σ_j max(a_j + b_j·N, c_j·N) + linear·N + const, a convex piecewise-linear function whose
    knots are 0 and the operators' crossings a_j / (c_j − b_j). ``__call__`` evaluates the line
    of N's segment, intercept_k + slope_k·N (each operator's branch fixed on the segment): one
    call's seconds depend on its own N only, never on the other calls priced with it (a
    serving window's steps cost what they cost one step at a time). With ``overlap`` o < 1 each
    operator takes max + (1 − o)·min of its two times, o·max(…) + (1 − o)·(a_j + (b_j + c_j)·N):
    the same segments."""

    def __init__(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, linear: float, const: float, overlap: float = 1.0):
        self.a, self.b, self.c, self.linear, self.const, self.overlap = a, b, c, linear, const, overlap
        with np.errstate(divide="ignore", invalid="ignore"):
            cross = np.where(c > b, a / (c - b), np.inf)
        cross = np.unique(cross[np.isfinite(cross) & (cross > 0.0)])  # 0 is a knot anyway
        self._cross = cross
        # a point inside each segment [0, x_1), [x_1, x_2), …, [x_last, ∞) fixes each operator's branch there
        edges = np.concatenate([[0.0], cross])
        inside = np.concatenate([(edges[:-1] + edges[1:]) / 2, [edges[-1] + 1.0]])
        memory = (a + b * inside[:, None]) >= c * inside[:, None]  # (segments, operators)
        intercept = np.where(memory, a, 0.0).sum(axis=-1)
        slope = np.where(memory, b, c).sum(axis=-1)
        if overlap < 1.0:
            intercept = overlap * intercept + (1.0 - overlap) * a.sum()
            slope = overlap * slope + (1.0 - overlap) * (b + c).sum()
        self._intercept = intercept + const
        self._slope = slope + linear

    def values(self, N: np.ndarray) -> np.ndarray:
        """The curve at the points ``N`` (1-D), summed operator by operator."""
        out = np.maximum(self.a + self.b * N[:, None], self.c * N[:, None]).sum(axis=-1)
        if self.overlap < 1.0:
            o = self.overlap
            out = o * out + (1.0 - o) * (self.a.sum() + (self.b + self.c).sum() * N)
        return out + N * self.linear + self.const

    def __call__(self, N: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self._cross, N, side="right")
        out = self._slope.take(k)
        out *= N
        out += self._intercept.take(k)
        return out


def overlapped(m, c, overlap: float):
    """An operator's seconds from its memory time ``m`` and compute time ``c`` when the two
    overlap by ``overlap`` ∈ [0, 1]: max(m, c) + (1 − overlap)·min(m, c), elementwise (1: the
    roofline's max; 0: their sum)."""
    return np.maximum(m, c) + (1.0 - overlap) * np.minimum(m, c)


def _accumulate(mem: np.ndarray, cmp: np.ndarray, tm, tc) -> None:
    """Add max(tm, tc) to ``mem`` where memory limits the operator, to ``cmp`` elsewhere."""
    tm = np.broadcast_to(tm, mem.shape)
    tc = np.broadcast_to(tc, mem.shape)
    is_mem = tm >= tc
    mem += np.where(is_mem, tm, 0.0)
    cmp += np.where(is_mem, 0.0, tc)


#: The smallest utilisation or efficiency accepted: below it a forward call's time overflows or
#: means nothing (a fraction of a millionth of the hardware's peak).
MIN_FRACTION = 1e-6


def _fraction(name: str, x) -> float:
    v = float(as_positive(name, x))
    if not MIN_FRACTION <= v <= 1:
        raise DraftsimError(f"{name} must lie in [{MIN_FRACTION:g}, 1]; got {v:g}")
    return v


def _nonneg(name: str, x) -> float:
    from ..errors import as_cost

    return float(as_cost(name, x))


def fit_overhead(roofline: RooflineModel, batch, new_tokens, context, seconds, fit_mfu: bool = False) -> RooflineModel:
    """The roofline with the fixed per-call overhead o >= 0 that best explains measured
    ``seconds`` at the given uniform shapes: o minimises Σ (log(r_i + o) − log(m_i))², the
    relative error, where r_i is the roofline without overhead (a 1-D bounded search).

    With ``fit_mfu`` the MFU is fitted too (a grid of 64 values in [0.01, 1], each with its
    best overhead): small matrices reach a smaller fraction of the peak FLOP/s a large matmul
    probe measures, which is what a CPU's many-token calls show.
    """
    from scipy.optimize import minimize_scalar

    m = np.ravel(as_positive("seconds", seconds))

    def best(model: RooflineModel) -> tuple[float, float]:
        r = np.ravel(model.with_overhead(0.0).shape_time(batch, new_tokens, context))
        loss = lambda o: float(np.sum((np.log(r + o) - np.log(m)) ** 2))  # noqa: E731
        res = minimize_scalar(loss, bounds=(0.0, float(m.max())), method="bounded")
        return loss(res.x), float(res.x)

    if not fit_mfu:
        return roofline.with_overhead(best(roofline)[1])
    fits = []
    for mfu in np.geomspace(0.01, 1.0, 64):
        candidate = RooflineModel(roofline.model, roofline.hardware, roofline.dtype, roofline.tp, roofline.pp, mfu=float(mfu),
                                  mbu=roofline.mbu, ici_efficiency=roofline.ici_efficiency, check_memory=False, kv_dtype=roofline.kv_dtype)
        fits.append((*best(candidate), float(mfu)))
    _, overhead, mfu = min(fits)
    return RooflineModel(roofline.model, roofline.hardware, roofline.dtype, roofline.tp, roofline.pp, mfu=mfu, mbu=roofline.mbu,
                         ici_efficiency=roofline.ici_efficiency, overhead=overhead, overhead_per_layer=0.0, check_memory=False,
                         kv_dtype=roofline.kv_dtype)
