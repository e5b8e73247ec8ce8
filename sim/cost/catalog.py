"""Catalogs of model architectures and hardware: the data files, user files, HF configs.

Two JSON files ship with draftsim (``sim/data/models.json``, ``sim/data/hardware.json``);
each has a ``schema``, a ``version`` and one entry per name, every entry with a ``source``
(the model card / config.json / datasheet its numbers come from). Users add entries with
files of the same format (:func:`load_catalog`), and a Hugging Face ``config.json`` (or a
checkpoint folder holding one) is read directly (:func:`model_from_hf_config`).

Units in the files are the ones datasheets use (TFLOP/s, GB/s, GB, µs); the records here are
SI (FLOP/s, B/s, B, s).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from ..errors import DraftsimError, unknown
from ..files import atomic_write_json

__all__ = [
    "DTYPE_BYTES",
    "WEIGHT_ONLY",
    "HardwareSpec",
    "ModelSpec",
    "Catalog",
    "dtype_bytes",
    "kv_auto_dtype",
    "load_catalog",
    "default_catalog",
    "model_from_hf_config",
    "write_catalog",
]

MODELS_SCHEMA = "draftsim.models"
HARDWARE_SCHEMA = "draftsim.hardware"
CATALOG_VERSION = 1

#: Bytes per element of each dtype the roofline knows.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1, "int8": 1, "int4": 0.5}

#: Weight-only formats and the dtype their activations and GEMMs run in: int4 weights (AWQ, GPTQ)
#: are dequantised inside the GEMM and multiplied at the bfloat16 rate (W4A16), their embedding and
#: LM head left in bfloat16 — an assumption of the roofline, not a measured kernel.
WEIGHT_ONLY = {"int4": "bfloat16"}

#: The KV cache's dtype under ``--kv-cache-dtype auto`` for each weight dtype: the model's data type,
#: not the weights' format. vLLM: "Data type for kv cache storage. If "auto", will use model data type"
#: (``vllm/config``, ``CacheConfig.cache_dtype``); SGLang: '"auto" will use model data type'
#: (``python/sglang/srt/server_args.py``, ``--kv-cache-dtype``). A quantised checkpoint's model data type
#: is the ``torch_dtype`` of its config.json, which quantisation leaves alone (DeepSeek-V3's FP8
#: checkpoint: ``"torch_dtype": "bfloat16"`` beside ``"quantization_config": {"quant_method": "fp8", ...}``);
#: draftsim takes it as bfloat16 for every FP8, INT8 and INT4 checkpoint (an assumption: a checkpoint
#: quantised from a float16 model would say float16; the bytes are the same). An FP8 cache is asked for
#: explicitly (``--kv-dtype fp8``).
KV_AUTO = {"float8": "bfloat16", "int8": "bfloat16", "int4": "bfloat16"}


def kv_auto_dtype(dtype: str) -> str:
    """The KV cache's dtype an engine's ``--kv-cache-dtype auto`` gives a model whose weights are ``dtype``."""
    return KV_AUTO.get(dtype, dtype)


def dtype_bytes(dtype: str) -> float:
    if dtype not in DTYPE_BYTES:
        raise DraftsimError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer LM (Llama/Qwen/Gemma/Mistral family; with the fields below a
    mixture of experts and multi-head latent attention), as in its config.json.

    layers (num_hidden_layers), hidden (hidden_size), intermediate (intermediate_size: the dense
    layers' MLP), heads (num_attention_heads), kv_heads (num_key_value_heads; < heads is GQA, 1
    is MQA), head_dim (hidden / heads unless the config says otherwise, as in Gemma-2; with MLA
    the query/key head, qk_nope_head_dim + qk_rope_head_dim), vocab (vocab_size),
    tied_embeddings (tie_word_embeddings: the LM head shares the embedding's weights, stored
    once), mlp ``"gated"`` (SwiGLU/GeGLU: gate, up and down projections) or ``"plain"`` (up and
    down), max_context (max_position_embeddings).

    **Mixture of experts** (``experts`` > 0): every layer after the first ``dense_layers``
    replaces the MLP by a router (hidden × experts), ``experts`` routed experts of
    ``expert_intermediate`` each (n_routed_experts / num_local_experts / num_experts,
    moe_intermediate_size), of which ``experts_per_token`` run for each token
    (num_experts_per_tok), and ``shared_experts`` that run for every token
    (n_shared_experts). **Multi-head latent attention** (``kv_lora_rank`` > 0, DeepSeek-V2/V3):
    queries through a ``q_lora_rank`` bottleneck (0: a full projection), keys and values from a
    cached latent of ``kv_lora_rank`` + ``qk_rope_head_dim`` elements per token per layer,
    ``v_head_dim`` per head. ``mtp_layers``: multi-token-prediction modules (num_nextn_predict_layers).
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    mlp: str = "gated"
    max_context: int = 0
    source: str = ""
    notes: str = ""
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    expert_intermediate: int = 0
    dense_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0

    def __post_init__(self):
        for key in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DraftsimError(f"model {self.name!r}: {key} must be an integer >= 1; got {v!r}")
            if v > 2**31 - 1:  # a larger one overflows the roofline's floats
                raise DraftsimError(f"model {self.name!r}: {key} must be at most 2,147,483,647; got {str(v)[:20]}{'...' if len(str(v)) > 20 else ''}")
        for key in ("experts", "experts_per_token", "shared_experts", "expert_intermediate", "dense_layers", "q_lora_rank",
                    "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "mtp_layers", "max_context"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise DraftsimError(f"model {self.name!r}: {key} must be an integer >= 0; got {v!r}")
            if v > 2**31 - 1:
                raise DraftsimError(f"model {self.name!r}: {key} must be at most 2,147,483,647; got {str(v)[:20]}{'...' if len(str(v)) > 20 else ''}")
        if self.heads % self.kv_heads:
            raise DraftsimError(f"model {self.name!r}: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.mlp not in ("gated", "plain"):
            raise DraftsimError(f"model {self.name!r}: mlp must be 'gated' or 'plain'; got {self.mlp!r}")
        if self.experts:
            if not 1 <= self.experts_per_token <= self.experts or self.expert_intermediate < 1 or self.dense_layers >= self.layers:
                raise DraftsimError(f"model {self.name!r}: a mixture of experts needs 1 <= experts_per_token <= experts, "
                                    f"expert_intermediate >= 1 and dense_layers < layers; got {self.experts_per_token}, "
                                    f"{self.experts}, {self.expert_intermediate}, {self.dense_layers}")
        elif self.experts_per_token or self.shared_experts or self.dense_layers:
            raise DraftsimError(f"model {self.name!r}: experts_per_token, shared_experts and dense_layers need experts > 0")
        if self.kv_lora_rank and (self.qk_rope_head_dim < 1 or self.v_head_dim < 1 or self.qk_rope_head_dim >= self.head_dim):
            raise DraftsimError(f"model {self.name!r}: latent attention (kv_lora_rank) needs qk_rope_head_dim in [1, head_dim) "
                                f"and v_head_dim >= 1; got {self.qk_rope_head_dim}, {self.v_head_dim}")

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "gated" else 2

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model)."""
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def expert_params(self) -> int:
        """Weights of one routed (or shared) expert."""
        return self.mlp_matrices * self.hidden * self.expert_intermediate

    @property
    def attention_params(self) -> int:
        """Weights of one layer's attention projections (norms and biases neglected)."""
        h, H, hd = self.hidden, self.heads, self.head_dim
        if self.kv_lora_rank:
            q = h * H * hd if not self.q_lora_rank else h * self.q_lora_rank + self.q_lora_rank * H * hd
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * H * (hd - self.qk_rope_head_dim + self.v_head_dim)
            return q + kv + H * self.v_head_dim * h
        return h * (H + 2 * self.kv_heads) * hd + H * hd * h

    @property
    def layer_params(self) -> int:
        """Weights of one dense decoder layer (projections and MLP; norms and biases neglected)."""
        return self.attention_params + self.mlp_matrices * self.hidden * self.intermediate

    @property
    def moe_layer_params(self) -> int:
        """Weights of one mixture-of-experts layer: attention, router, every routed and shared expert."""
        return self.attention_params + self.hidden * self.experts + (self.experts + self.shared_experts) * self.expert_params

    @property
    def params(self) -> int:
        """All weights: layers (every expert), embedding and (unless tied) the LM head."""
        emb = self.vocab * self.hidden
        dense = self.layers - self.moe_layers
        return dense * self.layer_params + self.moe_layers * self.moe_layer_params + emb * (1 if self.tied_embeddings else 2)

    @property
    def active_params(self) -> int:
        """Weights one token runs through (its experts only)."""
        unused = self.moe_layers * (self.experts - self.experts_per_token) * self.expert_params
        return self.params - unused

    @property
    def architecture(self) -> str:
        """A short fingerprint of the shape: layers x hidden/intermediate, heads/kv x head_dim, vocab (and experts, MLA)."""
        moe = f" e{self.experts}k{self.experts_per_token}s{self.shared_experts}x{self.expert_intermediate}d{self.dense_layers}" if self.experts else ""
        mla = f" mla{self.q_lora_rank}/{self.kv_lora_rank}+{self.qk_rope_head_dim}v{self.v_head_dim}" if self.kv_lora_rank else ""
        return f"{self.layers}x{self.hidden}/{self.intermediate} h{self.heads}/{self.kv_heads}x{self.head_dim} v{self.vocab}{moe}{mla}"

    @property
    def kv_per_token(self) -> int:
        """KV-cache elements per token over all layers (keys and values; with MLA the latent and
        the rotary key, shared by keys and values)."""
        if self.kv_lora_rank:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.layers * self.kv_heads * self.head_dim


#: the kernel kinds whose fixed time per call a hardware entry may hold (``kernel_fixed_us``)
KERNEL_KINDS = ("gemm", "gemm_float8", "attention", "elementwise", "allreduce")


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (or CPU) and its efficiency factors, in SI units.

    peak_flops : dense peak FLOP/s per dtype (no sparsity), per device
    memory_bandwidth : B/s; memory : bytes of device memory
    interconnect_bandwidth : B/s per direction between devices (NVLink, PCIe) for tensor
        parallelism; interconnect_latency : seconds per collective
    mfu, mbu : achievable fractions of peak FLOP/s and of memory bandwidth (model FLOP/bandwidth
        utilisation); ici_efficiency : achievable fraction of the interconnect's bandwidth
    overhead, overhead_per_layer : fixed seconds per forward call (framework, kernel launches)
    usable_memory : fraction of memory that may hold weights and KV cache
    sm_count : streaming multiprocessors (0: not listed); a kernel's thread blocks run on them in
        waves (the operator model's FlashAttention-2 decode, sim/cost/efficiency.py)
    fused_moe : fixed seconds of one fused-MoE kernel call (one per MoE layer) beyond its weight and
        activation bytes at the MBU: the roofline's routed experts take it on top of their bytes
        (0: not derived; the routed experts priced at the plain MBU). Derived where the GPU has
        measured fused-MoE tables (benchmarks/derive_fused_moe.py)
    kernel_fixed : fixed GPU seconds of one kernel call per kernel kind ("gemm", "gemm_float8": an FP8 GEMM where
        derived, "attention", "elementwise", "allreduce"), on top of its bytes at the MBU: the roofline adds them per kernel its layers run
        (sim/cost/roofline.py); empty: none. Derived where the GPU has measured operator tables
        (benchmarks/derive_affine.py)
    """

    name: str
    peak_flops: dict
    memory_bandwidth: float
    memory: float
    interconnect_bandwidth: float = 0.0
    interconnect_latency: float = 0.0
    mfu: float = 0.6
    mbu: float = 0.7
    ici_efficiency: float = 0.7
    overhead: float = 0.0
    overhead_per_layer: float = 0.0
    usable_memory: float = 0.9
    kind: str = "gpu"
    source: str = ""
    notes: str = ""
    measured: dict = field(default_factory=dict)
    sm_count: int = 0
    fused_moe: float = 0.0
    kernel_fixed: dict = field(default_factory=dict)

    @property
    def calibration(self) -> dict | None:
        """What ``draftsim calibrate`` fitted this entry's factors and overhead to (None: not
        calibrated). Its measured steps already hold their engine's overheads."""
        c = self.measured.get("calibration") if isinstance(self.measured, dict) else None
        return c if isinstance(c, dict) else None

    def __post_init__(self):
        if not self.peak_flops:
            raise DraftsimError(f"hardware {self.name!r}: peak_tflops needs at least one dtype")
        for dt, v in self.peak_flops.items():
            if dt in WEIGHT_ONLY:  # a weight format: its GEMMs run at the rate of its activations' dtype
                raise DraftsimError(f"hardware {self.name!r}: unknown dtype {dt!r} for a peak FLOP/s ({dt} is a weight-only format, "
                                    f"multiplied at the {WEIGHT_ONLY[dt]} rate); known: "
                                    f"{', '.join(d for d in DTYPE_BYTES if d not in WEIGHT_ONLY)}")
            dtype_bytes(dt)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
                raise DraftsimError(f"hardware {self.name!r}: peak FLOP/s for {dt} must be > 0 (and finite); got {v!r}")
        for key in ("memory_bandwidth", "memory"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
                raise DraftsimError(f"hardware {self.name!r}: {key} must be > 0 (and finite); got {v!r}")
        for key in ("mfu", "mbu", "ici_efficiency", "usable_memory"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 1e-6 <= v <= 1):
                raise DraftsimError(f"hardware {self.name!r}: {key} must lie in [1e-06, 1]; got {v!r}")
        for key in ("interconnect_bandwidth", "interconnect_latency", "overhead", "overhead_per_layer", "fused_moe"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise DraftsimError(f"hardware {self.name!r}: {key} must be >= 0 (and finite); got {v!r}")
        for kind, v in self.kernel_fixed.items():
            if kind not in KERNEL_KINDS or not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise DraftsimError(f"hardware {self.name!r}: kernel_fixed_us maps {', '.join(KERNEL_KINDS)} to seconds >= 0; "
                                    f"got {kind!r}: {v!r}")
        if not (isinstance(self.sm_count, int) and not isinstance(self.sm_count, bool) and self.sm_count >= 0):
            raise DraftsimError(f"hardware {self.name!r}: sm_count must be a whole number >= 0 (0: not listed); got {self.sm_count!r}")

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise DraftsimError(f"hardware {self.name!r} lists no peak FLOP/s for {dtype}; it lists {', '.join(self.peak_flops)}")
        return float(self.peak_flops[dtype])


# -- file <-> records ----------------------------------------------------------------------------

_MODEL_REQUIRED = ("layers", "hidden", "intermediate", "heads", "vocab", "source")
_MOE_FIELDS = ("experts", "experts_per_token", "shared_experts", "expert_intermediate", "dense_layers", "q_lora_rank", "kv_lora_rank",
               "qk_rope_head_dim", "v_head_dim", "mtp_layers")
_MODEL_OPTIONAL = ("kv_heads", "head_dim", "tied_embeddings", "mlp", "max_context", "notes", "aliases", "architecture", "unsupported",
                   *_MOE_FIELDS)
_HW_REQUIRED = ("peak_tflops", "memory_bandwidth_gbs", "memory_gb", "source")
_HW_OPTIONAL = ("interconnect_gbs", "interconnect_latency_us", "mfu", "mbu", "ici_efficiency", "overhead_us", "overhead_per_layer_us",
                "usable_memory", "kind", "notes", "measured", "aliases", "sm_count", "fused_moe_us",
                "kernel_fixed_us")


def _check_keys(what: str, name: str, entry, required, optional) -> None:
    if not isinstance(entry, dict):
        raise DraftsimError(f"{what} {name!r}: an entry must be a JSON object")
    missing = [k for k in required if k not in entry]
    if missing:
        raise DraftsimError(f"{what} {name!r} is missing field(s) {', '.join(missing)}")
    unknown = [k for k in entry if k not in required and k not in optional]
    if unknown:
        raise DraftsimError(f"{what} {name!r} has unknown field(s) {', '.join(unknown)}; known: {', '.join(required + optional)}")


def model_from_entry(name: str, e: dict) -> ModelSpec:
    """A :class:`ModelSpec` from a catalog entry (raises for unsupported architectures)."""
    if e.get("unsupported"):
        raise DraftsimError(f"model {name!r} is not supported by the roofline: {e['unsupported']}")
    _check_keys("model", name, e, _MODEL_REQUIRED, _MODEL_OPTIONAL)
    heads = e["heads"]
    return ModelSpec(
        name=name, layers=e["layers"], hidden=e["hidden"], intermediate=e["intermediate"], heads=heads,
        kv_heads=e.get("kv_heads", heads),
        head_dim=e.get("head_dim", e["hidden"] // heads if isinstance(heads, int) and heads and isinstance(e["hidden"], int) else 0),
        vocab=e["vocab"], tied_embeddings=bool(e.get("tied_embeddings", False)), mlp=e.get("mlp", "gated"),
        max_context=e.get("max_context", 0), source=e["source"], notes=e.get("notes", ""),
        **{k: e[k] for k in _MOE_FIELDS if k in e},
    )


def hardware_from_entry(name: str, e: dict) -> HardwareSpec:
    _check_keys("hardware", name, e, _HW_REQUIRED, _HW_OPTIONAL)
    if not isinstance(e["peak_tflops"], dict):
        raise DraftsimError(f"hardware {name!r}: peak_tflops must map dtypes to TFLOP/s")
    num = lambda key, default=0.0: _float(name, key, e.get(key, default)) if isinstance(e.get(key, default), (int, float)) else _bad(name, key, e[key])  # noqa: E731
    return HardwareSpec(
        name=name,
        peak_flops={dt: (_float(name, f"peak_tflops {dt}", v) * 1e12 if isinstance(v, (int, float)) else v) for dt, v in e["peak_tflops"].items()},
        memory_bandwidth=num("memory_bandwidth_gbs") * 1e9, memory=num("memory_gb") * 1e9,
        interconnect_bandwidth=num("interconnect_gbs") * 1e9, interconnect_latency=num("interconnect_latency_us") * 1e-6,
        mfu=num("mfu", 0.6), mbu=num("mbu", 0.7), ici_efficiency=num("ici_efficiency", 0.7),
        overhead=num("overhead_us") * 1e-6, overhead_per_layer=num("overhead_per_layer_us") * 1e-6,
        usable_memory=num("usable_memory", 0.9), kind=e.get("kind", "gpu"), source=e["source"], notes=e.get("notes", ""),
        measured=e.get("measured", {}), sm_count=e.get("sm_count", 0), fused_moe=num("fused_moe_us") * 1e-6,
        kernel_fixed=_kernel_fixed(name, e.get("kernel_fixed_us", {})),
    )


def _kernel_fixed(name, d) -> dict:
    if not isinstance(d, dict):
        raise DraftsimError(f"hardware {name!r}: kernel_fixed_us must map kernel kinds ({', '.join(KERNEL_KINDS)}) to microseconds")
    return {k: (_float(name, f"kernel_fixed_us {k}", v) * 1e-6 if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
            for k, v in d.items()}


def _bad(name, key, value):
    raise DraftsimError(f"hardware {name!r}: {key} must be a number; got {value!r}")


def _float(name, key, value) -> float:
    """A catalog number as a float (an integer of hundreds of digits: one line, not an OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        raise DraftsimError(f"hardware {name!r}: {key} must be a finite number; got an integer of {len(str(value)):,} digits") from None


def hardware_to_entry(hw: HardwareSpec) -> dict:
    """The catalog entry (file units) of a :class:`HardwareSpec`."""
    e = {
        "kind": hw.kind,
        "peak_tflops": {dt: v / 1e12 for dt, v in hw.peak_flops.items()},
        "memory_bandwidth_gbs": hw.memory_bandwidth / 1e9,
        "memory_gb": hw.memory / 1e9,
        "interconnect_gbs": hw.interconnect_bandwidth / 1e9,
        "interconnect_latency_us": hw.interconnect_latency * 1e6,
        "mfu": hw.mfu, "mbu": hw.mbu, "ici_efficiency": hw.ici_efficiency,
        "overhead_us": hw.overhead * 1e6, "overhead_per_layer_us": hw.overhead_per_layer * 1e6,
        "usable_memory": hw.usable_memory, "source": hw.source,
    }
    if hw.notes:
        e["notes"] = hw.notes
    if hw.measured:
        e["measured"] = hw.measured
    if hw.sm_count:
        e["sm_count"] = hw.sm_count
    if hw.fused_moe:
        e["fused_moe_us"] = hw.fused_moe * 1e6
    if hw.kernel_fixed:
        e["kernel_fixed_us"] = {k: round(v * 1e6, 9) for k, v in hw.kernel_fixed.items()}  # µs to 1e-9: round-trips exactly
    return e


def model_to_entry(m: ModelSpec) -> dict:
    e = {k: v for k, v in asdict(m).items() if k != "name"}
    return {k: v for k, v in e.items() if v != ""}


@dataclass
class Catalog:
    """Model and hardware entries by lower-case name (raw file entries, validated on use)."""

    models: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)
    aliases: dict = field(default_factory=dict)

    def merge(self, other: "Catalog") -> "Catalog":
        return Catalog({**self.models, **other.models}, {**self.hardware, **other.hardware}, {**self.aliases, **other.aliases})

    def model(self, name: str, alternatives: tuple[str, ...] = ()) -> ModelSpec:
        """A model by catalog name or alias (case-insensitive; an entry's aliases include the
        Hugging Face repository ids of its weights, ``meta-llama/Llama-3.1-70B-Instruct``), or by
        a config.json / checkpoint path. An unknown name is refused in one line with the closest
        names (``alternatives``: what else the caller accepts there, e.g. a drafter's methods)."""
        path = Path(str(name)).expanduser()
        if path.is_dir() or (path.suffix == ".json" and path.is_file()):
            return model_from_hf_config(path)
        key = self._key(name)
        if key not in self.models:
            listed = ", ".join([*alternatives, *sorted(self.models)])
            raise unknown("model", name, {**{a: a for a in alternatives}, **self._spellings(self.models)},
                          known=f"known: {listed} (or a path to a config.json)")
        return model_from_entry(key, self.models[key])

    def hardware_spec(self, name: str) -> HardwareSpec:
        key = self._key(name)
        if key not in self.hardware:
            raise unknown("hardware", name, self._spellings(self.hardware),
                          known=f"known: {', '.join(sorted(self.hardware))}")
        return hardware_from_entry(key, self.hardware[key])

    def _key(self, name) -> str:
        """The entry name ``name`` stands for (lower case, aliases resolved; blanks around it and a
        ``https://huggingface.co/`` prefix ignored)."""
        text = str(name).strip().lower().removeprefix("https://huggingface.co/").strip("/")
        return self.aliases.get(text, text)

    def _spellings(self, entries: dict) -> dict[str, str]:
        """Each name and alias of ``entries`` → its entry's name (what "did you mean" suggests)."""
        return {**{k: k for k in sorted(entries)}, **{a: k for a, k in sorted(self.aliases.items()) if k in entries}}

    def validate(self) -> None:
        """Build every record once: raises on the first bad entry."""
        for name, e in self.models.items():
            if not e.get("unsupported"):
                model_from_entry(name, e)
            elif "source" not in e:
                raise DraftsimError(f"model {name!r} is missing field(s) source")
        for name in self.hardware:
            self.hardware_spec(name)


def _read_json(path) -> dict:
    from ..files import parse_json, read_text

    # bounded nesting, an over-long integer and invalid JSON all one line naming the file
    return parse_json(read_text(path, "catalog or config file", 64 * 2**20, fifo=False), str(path))


def _parse(doc: dict, origin: str) -> Catalog:
    if not isinstance(doc, dict) or doc.get("schema") not in (MODELS_SCHEMA, HARDWARE_SCHEMA):
        raise DraftsimError(f"{origin}: not a draftsim catalog (schema must be {MODELS_SCHEMA!r} or {HARDWARE_SCHEMA!r})")
    if doc.get("version") != CATALOG_VERSION:
        raise DraftsimError(f"{origin}: catalog version {doc.get('version')!r} is not supported (this draftsim reads version {CATALOG_VERSION})")
    key = "models" if doc["schema"] == MODELS_SCHEMA else "hardware"
    entries = doc.get(key)
    if not isinstance(entries, dict):
        raise DraftsimError(f"{origin}: a {doc['schema']} catalog needs a {key!r} object")
    entries = {str(k).lower(): v for k, v in entries.items()}
    aliases = {}
    for name, e in entries.items():
        listed = e.get("aliases", []) if isinstance(e, dict) else []
        if not isinstance(listed, list) or not all(isinstance(x, str) and x for x in listed):
            raise DraftsimError(f"{origin}: {name!r}: aliases must be a list of names; got {json.dumps(listed)[:60]}")
        for alias in listed:
            aliases[str(alias).lower()] = name
    cat = Catalog(models=entries, aliases=aliases) if key == "models" else Catalog(hardware=entries, aliases=aliases)
    try:
        cat.validate()
    except DraftsimError as exc:
        raise DraftsimError(f"{origin}: {exc}") from None
    return cat


def load_catalog(path) -> Catalog:
    """A user catalog file (models or hardware, told apart by its schema), validated."""
    return _parse(_read_json(path), str(path))


def default_catalog(extra=()) -> Catalog:
    """The shipped catalogs, then each user file in ``extra`` (later entries win)."""
    data = resources.files("draftsim.sim") / "data"
    cat = Catalog()
    for fname in ("models.json", "hardware.json"):
        cat = cat.merge(_parse(json.loads((data / fname).read_text()), f"sim/data/{fname}"))
    for path in extra:
        cat = cat.merge(load_catalog(path))
    return cat


_HF_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "intermediate": "intermediate_size",
            "heads": "num_attention_heads", "vocab": "vocab_size"}
_HF_ALIASES = {"n_layer": "num_hidden_layers", "n_embd": "hidden_size", "n_head": "num_attention_heads",
               "n_inner": "intermediate_size", "n_positions": "max_position_embeddings"}
#: model_type values whose MLP is a plain up/down projection (others are gated).
_PLAIN_MLP = {"gpt2", "gpt_neox", "gptj", "opt", "phi", "falcon", "bloom", "starcoder2", "gpt_bigcode"}
#: model_type values whose tie_word_embeddings defaults to true in transformers.
_TIED_DEFAULT = {"gemma", "gemma2", "gemma3_text", "gpt2", "opt", "phi"}


#: The largest whole number a config.json field is read as (int32: every real config fits).
_HF_MAX = 2**31 - 1


def _hf_show(v) -> str:
    text = json.dumps(v) if isinstance(v, (str, int, float, bool, type(None))) else type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _hf_int(cfg: dict, key: str, path, low: int = 1, default=None) -> int:
    """``cfg[key]`` as a whole number in [low, 2^31 − 1] (an integral float such as 4096.0 too);
    anything else — a string ("lots", "two"), a bool, a fraction, an out-of-range value — one line
    naming the file and the field. Missing or null: ``default`` (None: required)."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise DraftsimError(f"{path}: field '{key}' is missing (needed by the roofline)")
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()) or not low <= v <= _HF_MAX:
        raise DraftsimError(f"{path}: field '{key}' is {_hf_show(v)}; a whole number from {low} to {_HF_MAX:,} is valid")
    return int(v)


def hf_whole(cfg: dict, key: str, path, low: int = 1) -> int:
    """``cfg[key]`` (present) as a whole number in [low, 2^31 − 1]; a refusal is one line naming
    ``path`` and the field (:func:`_hf_int`)."""
    return _hf_int(cfg, key, path, low=low)


def model_from_hf_config(path) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` (or a folder holding one): every
    field read is typed and ranged where it is read (:func:`_hf_int`), the file's size and nesting
    bounded before it is parsed; a refusal is one line naming the file and the field."""
    from ..files import parse_json, read_text

    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    cfg = parse_json(read_text(path, "config file", 64 * 2**20, fifo=False), f"config file {path}")
    if not isinstance(cfg, dict):
        raise DraftsimError(f"{path}: a config.json must be a JSON object")
    cfg = {**{v: cfg[k] for k, v in _HF_ALIASES.items() if k in cfg}, **cfg}
    if cfg.get("is_encoder_decoder"):
        raise DraftsimError(f"{path}: encoder-decoder models ({cfg.get('model_type', '?')}) are not supported by the roofline (dense decoder LMs only)")
    moe = _moe_fields(cfg, path)
    model_type = cfg.get("model_type", "")
    if not isinstance(model_type, str):
        raise DraftsimError(f"{path}: field 'model_type' is {_hf_show(model_type)}; a model type name (a string) is valid")
    if "intermediate_size" not in cfg and model_type in _PLAIN_MLP and "hidden_size" in cfg:
        cfg["intermediate_size"] = 4 * _hf_int(cfg, "hidden_size", path)
    missing = [hf for hf in _HF_KEYS.values() if cfg.get(hf) is None]
    if missing:
        raise DraftsimError(f"{path} is missing field(s) {', '.join(missing)} (needed by the roofline)")
    heads = _hf_int(cfg, "num_attention_heads", path)
    hidden = _hf_int(cfg, "hidden_size", path)
    kv_heads = _hf_int(cfg, "num_key_value_heads", path, default=heads)
    if heads % kv_heads:
        raise DraftsimError(f"{path}: field 'num_key_value_heads' is {kv_heads}; a divisor of num_attention_heads ({heads}) is valid")
    head_dim = _hf_int(cfg, "head_dim", path, low=0, default=0) or hidden // heads
    if head_dim < 1:
        raise DraftsimError(f"{path}: field 'hidden_size' is {hidden}, less than num_attention_heads ({heads}): no head dimension "
                            "(give head_dim)")
    if moe.get("kv_lora_rank"):
        head_dim = _hf_int(cfg, "qk_nope_head_dim", path, low=0, default=0) + moe["qk_rope_head_dim"]
    tied = cfg.get("tie_word_embeddings", model_type in _TIED_DEFAULT)
    if not isinstance(tied, bool):
        raise DraftsimError(f"{path}: field 'tie_word_embeddings' is {_hf_show(tied)}; true or false is valid")
    return ModelSpec(
        name=path.parent.name or path.stem,
        layers=_hf_int(cfg, "num_hidden_layers", path), hidden=hidden, intermediate=_hf_int(cfg, "intermediate_size", path),
        heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=_hf_int(cfg, "vocab_size", path), tied_embeddings=tied,
        mlp="plain" if model_type in _PLAIN_MLP else "gated", max_context=_hf_int(cfg, "max_position_embeddings", path, low=0, default=0),
        source=str(path), **moe,
    )


def _moe_fields(cfg: dict, path) -> dict:
    """The mixture-of-experts, latent-attention and MTP fields of a config.json (Mixtral, Qwen3-MoE,
    DeepSeek-V2/V3, gpt-oss, GLM-4.5 layouts), each typed and ranged (:func:`_hf_int`); refuses a
    layout the roofline cannot price."""
    out: dict = {}
    key = next((k for k in ("n_routed_experts", "num_local_experts", "num_experts") if cfg.get(k)), None)
    experts = _hf_int(cfg, key, path, low=0) if key else 0
    if experts:
        k_key = "num_experts_per_tok" if cfg.get("num_experts_per_tok") is not None else "experts_per_token"
        if not cfg.get(k_key):
            raise DraftsimError(f"{path}: a mixture of experts without num_experts_per_tok (how many experts run per token)")
        k = _hf_int(cfg, k_key, path)
        if k > experts:
            raise DraftsimError(f"{path}: field '{k_key}' is {k}; from 1 to {key} ({experts}) is valid")
        if cfg.get("shared_expert_intermediate_size"):
            raise DraftsimError(f"{path}: a shared expert of its own size (shared_expert_intermediate_size, Qwen2-MoE) is not priced "
                                "by the roofline")
        for name, ok in (("moe_layer_freq", 1), ("decoder_sparse_step", 1)):
            if cfg.get(name, ok) != ok:
                raise DraftsimError(f"{path}: {name} = {_hf_show(cfg[name])}: MoE layers other than every layer after the first dense "
                                    "ones are not priced by the roofline")
        if cfg.get("mlp_only_layers"):
            raise DraftsimError(f"{path}: mlp_only_layers {_hf_show(cfg['mlp_only_layers'])}: dense layers between MoE layers are not priced")
        inter = "moe_intermediate_size" if cfg.get("moe_intermediate_size") is not None else "intermediate_size"
        out.update(experts=experts, experts_per_token=k, shared_experts=_hf_int(cfg, "n_shared_experts", path, low=0, default=0),
                   expert_intermediate=_hf_int(cfg, inter, path),
                   dense_layers=_hf_int(cfg, "first_k_dense_replace", path, low=0, default=0))
    if cfg.get("kv_lora_rank"):
        for name in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if not cfg.get(name):
                raise DraftsimError(f"{path}: latent attention (kv_lora_rank) without {name}")
        out.update(kv_lora_rank=_hf_int(cfg, "kv_lora_rank", path), q_lora_rank=_hf_int(cfg, "q_lora_rank", path, low=0, default=0),
                   qk_rope_head_dim=_hf_int(cfg, "qk_rope_head_dim", path), v_head_dim=_hf_int(cfg, "v_head_dim", path))
    if cfg.get("num_nextn_predict_layers"):
        out["mtp_layers"] = _hf_int(cfg, "num_nextn_predict_layers", path, low=0)
    return out


def write_catalog(path, hardware: dict | None = None, models: dict | None = None) -> None:
    """Write a user catalog file atomically (temp file + rename); ``hardware`` maps names to
    :class:`HardwareSpec` (or raw entries), ``models`` names to :class:`ModelSpec`."""
    if (hardware is None) == (models is None):
        raise DraftsimError("write_catalog writes either hardware or models")
    if hardware is not None:
        doc = {"schema": HARDWARE_SCHEMA, "version": CATALOG_VERSION,
               "hardware": {k: hardware_to_entry(v) if isinstance(v, HardwareSpec) else v for k, v in hardware.items()}}
    else:
        doc = {"schema": MODELS_SCHEMA, "version": CATALOG_VERSION,
               "models": {k: model_to_entry(v) if isinstance(v, ModelSpec) else v for k, v in models.items()}}
    _parse(doc, str(path))  # never write what we could not read back
    atomic_write_json(path, doc)


