"""Drafting methods as engines deploy them, priced from the target's architecture.

A drafter is named as vLLM and SGLang name the method (``--drafter-model``):

``draft_model:NAME`` (or a bare catalog name / ``config.json`` path)
    a separate small model, priced by its own roofline; it runs at the target's tensor
    parallelism unless ``--drafter-tp`` says otherwise (vLLM runs a draft model at the target's TP).
``eagle``
    EAGLE (Li et al. 2024, arXiv 2401.15077): one decoder layer at the target's width, fed the
    target's top-layer feature concatenated with the next token's embedding through an FC layer
    (2h → h), and the target's LM head (vocabulary V). Head config: ``yuhuili/EAGLE-llama2-chat-7B``
    config.json (one layer, the target's intermediate size and heads; docs/research/moe.json).
``eagle3``
    EAGLE-3 (Li et al. 2025, arXiv 2503.01840 §3.1): one decoder layer whose QKV projection takes
    the token embedding and the feature concatenated (2h inputs: vLLM/SGLang ``LlamaDecoderLayer``
    of ``llama_eagle3`` override ``qkv_proj`` with ``2 * hidden_size`` inputs), an LM head over a
    reduced draft vocabulary: the ``draft_vocab_size`` of the head published (or SpecForge's template)
    for the target (``sim/data/drafting_methods.json`` ``draft_vocab_by_target``, each cited; 32000
    for every target found), else the Llama-3.1-8B head's 32000, said in the head's name;
    ``eagle3:draft_vocab=N`` overrides. Not priced: the FC that
    fuses three target layers' features (3h → h), run once per round over the verified tokens
    (vLLM's ``combine_hidden_states``) — 50M weights for Llama-3.1-8B, about 0.6% of the target's
    own step; the cost interface prices draft *calls*, and charging it on every call would
    overstate it k-fold.
``medusa``
    Medusa (Cai et al. 2024, arXiv 2401.10774): heads on the target's last hidden state of the same
    forward, each a residual block (h × h, SiLU) and its own LM head (h × V)
    (``FasterDecoding/Medusa`` ``medusa_model.py``); no attention, no KV cache. Draft token i is
    head i's output, so a round of k draft tokens prices k heads: one "call" = one head.
``mtp``
    multi-token prediction modules (DeepSeek-V3 §2.2: projection 2h → h of the embedding and the
    previous depth's feature, one transformer block, the shared LM head), run in sequence: one call
    per draft token. Only for a target whose catalog entry declares MTP modules (``mtp_layers``);
    refused otherwise. The block is priced as one of the target's blocks, with its experts and
    latent attention where it has them (DeepSeek-V3, GLM-4.5-Air: an MoE layer). EAGLE and Medusa
    heads are dense with standard attention on any target (SpecForge's templates for MoE targets).
``ngram``, ``suffix`` (and draftsim's ``maxgram``, ``bigram``)
    lookups on the CPU: priced by a measured profile's proposal time per token
    (``draftsim profile``) when one is given, else free, and said so.
``selfspec:window=B``
    self-speculation with a capped KV cache (MagicDec, arXiv 2408.11049; TriForce, arXiv 2404.11912):
    the target drafts for itself attending to at most B cached tokens (StreamingLLM-style window).
    Priced as the target's forward with every sequence's context capped at B (sequence by sequence
    in the serving simulator; from batch statistics alone, the mean context), with no prefill of
    its own (it reads a window of the target's cache).

The facts each description rests on (layer counts, input widths, the draft vocabulary) are read
from ``sim/data/drafting_methods.json``, where each carries its source.

With ``--cost-model operators`` a head is priced from the same measured operator tables as the
target (:class:`OperatorHead`): its decoder layer as a one-layer
:class:`~draftsim.sim.cost.operators.OperatorModel` (EAGLE-3's QKV one GEMM over its 2h inputs, its
LM head over the draft vocabulary), EAGLE's fc, an MTP projection and Medusa's residual blocks and
LM head as :class:`~draftsim.sim.cost.operators.MeasuredGemm` s of the same GEMM table, the roofline
where a table ends (recorded per part), the engine's per-draft-forward time on top once per call.

The heads share the target's devices (they are priced at the target's tensor parallelism) and
:meth:`HeadCost.weight_bytes` and :meth:`HeadCost.kv_bytes_per_token` say what they add to the
target's memory (:meth:`draftsim.sim.cost.assembly.Assembly.check_fits`). Norms, activations and
biases are neglected, as in :mod:`~draftsim.sim.cost.roofline`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DraftsimError, as_count
from ..registry import METHODS, methods
from ..registry import method as method_entry
from .base import BatchStats, CostModel
from .catalog import WEIGHT_ONLY, HardwareSpec, ModelSpec
from .linear import CallCost
from .memory import NOTHING, MemoryFootprint, activation_bytes_per_token
from .operators import MeasuredGemm, OperatorModel, Part
from .roofline import RooflineModel, overlapped

__all__ = ["LOOKUPS", "HEADS", "LAYOUTS", "DrafterSpec", "parse_drafter", "HeadCost", "OperatorHead", "Lookup", "Matmul", "CappedContext",
           "head_cost", "EAGLE3_DRAFT_VOCAB"]

#: Drafters that look tokens up on the CPU instead of running a model (the registry's ``lookup`` methods).
LOOKUPS = methods(pricing="lookup")
#: Heads that run on the target's devices from its hidden states (the registry's ``head`` methods).
HEADS = methods(pricing="head")
#: The head layouts :func:`head_cost` builds (a registry head names one as its ``layout``).
LAYOUTS = ("eagle", "eagle3", "medusa", "mtp")
#: How each head is built, with the sources (sim/data/drafting_methods.json).
FACTS = json.loads((Path(__file__).parent.parent / "data" / "drafting_methods.json").read_text())["methods"]
#: EAGLE-3's reduced draft vocabulary for Llama-3.1-8B (SpecForge configs/llama3-8B-eagle3.json,
#: ``draft_vocab_size``); used for a target without a published head unless ``eagle3:draft_vocab=N`` is given.
EAGLE3_DRAFT_VOCAB = int(FACTS["eagle3"]["draft_vocab"])
#: The published EAGLE-3 heads' ``draft_vocab_size`` by target catalog name (each cited in the data file).
EAGLE3_DRAFT_VOCAB_BY_TARGET = {name: int(e["draft_vocab"]) for name, e in FACTS["eagle3"].get("draft_vocab_by_target", {}).items()
                                if isinstance(e, dict)}


def eagle3_draft_vocab(target: ModelSpec, options=()) -> tuple[int, str]:
    """EAGLE-3's draft vocabulary on ``target`` and where it comes from: ``draft_vocab=N`` when
    given, else the published head's for that target (:data:`EAGLE3_DRAFT_VOCAB_BY_TARGET`), else
    the Llama-3.1-8B head's :data:`EAGLE3_DRAFT_VOCAB` (no head published for the target)."""
    given = dict(options).get("draft_vocab")
    if given is not None:
        return int(given), "given"
    if target.name in EAGLE3_DRAFT_VOCAB_BY_TARGET:
        return EAGLE3_DRAFT_VOCAB_BY_TARGET[target.name], f"the published head's for {target.name}"
    return EAGLE3_DRAFT_VOCAB, f"no head published for {target.name}: Llama-3.1-8B's"


@dataclass(frozen=True)
class DrafterSpec:
    """A parsed ``--drafter-model`` value: the method, its options, and for a draft model its name."""

    method: str
    options: tuple = ()
    model: str | None = None

    @property
    def label(self) -> str:
        if self.method == "draft_model":
            return str(self.model)
        opts = ",".join(f"{k}={v}" for k, v in self.options)
        return self.method + (f":{opts}" if opts else "")


def parse_drafter(text: str) -> DrafterSpec:
    """``eagle3``, ``eagle3:draft_vocab=32000``, ``medusa``, ``mtp``, ``selfspec:window=2048``,
    ``ngram``, ``suffix``, ``maxgram``, ``bigram``, ``draft_model:NAME`` or a model name/path: a
    method of the registry (:data:`draftsim.sim.registry.METHODS`) with the options it takes, each
    in its range."""
    raw = str(text).strip()
    head, sep, rest = raw.partition(":")
    entry = METHODS.get(head.lower())
    if entry is not None and entry.pricing == "draft_model":
        if not rest:
            raise DraftsimError(f"drafter {raw!r}: {entry.name} needs a model ({entry.name}:NAME, a catalog name or config.json path)")
        return DrafterSpec(entry.name, (), rest)
    if entry is None:
        return DrafterSpec(METHODS["draft_model"].name, (), raw)  # a catalog name or a config.json path: checked by the catalog
    method = entry.name
    if entry.pricing == "lookup":
        if rest or sep:  # 'ngram:' was priced as a model named None
            raise DraftsimError(f"drafter {raw!r}: {method} takes no options; write {method}")
        return DrafterSpec(method)
    opts = {}
    parts = [p.strip() for p in rest.split(",")]
    if sep and not all(parts):  # 'eagle3:' or 'eagle3:draft_vocab=N,': an option left out is a typo, not the default
        valid = ", ".join(f"{o.key}={o.placeholder}" for o in entry.options) or "none"
        raise DraftsimError(f"drafter {raw!r}: an empty option after {method}: write {method} alone or {method}:KEY=VALUE,... "
                            f"(options: {valid})")
    for part in filter(None, parts):
        key, eq, value = part.partition("=")
        if eq and key in opts:  # the first value would be dropped silently
            raise DraftsimError(f"drafter {raw!r}: {key} is given twice; give it once")
        option = entry.option(key) if eq else None
        if option is None:
            valid = ", ".join(sorted(o.key for o in entry.options)) or "none"
            raise DraftsimError(f"drafter {raw!r}: unknown option {part!r} for {method} (valid: {valid})")
        digits = len(str(option.maximum))  # int() of thousands of digits raises
        if not re.fullmatch(r"[0-9]+", value.strip()) or len(value.strip().lstrip("0")) > digits:
            raise DraftsimError(f"drafter {raw[:60]!r}: {key} must be a whole number from {option.minimum:,} to {option.maximum:,}; "
                                f"got {value[:20]!r}" + ("..." if len(value) > 20 else ""))
        opts[key] = int(as_count(f"{method} {key}", int(value), minimum=option.minimum, maximum=option.maximum))
    for option in entry.options:
        if option.required and option.key not in opts:
            raise DraftsimError(f"drafter {raw!r}: {method} needs {option.key}={option.placeholder} ({option.meaning}, "
                                f"e.g. {method}:{option.key}={option.example})")
    return DrafterSpec(method, tuple(sorted(opts.items())))


class Matmul(CostModel):
    """One weight matrix (``inputs`` × ``outputs``, columns split over ``tp`` devices) applied to
    every new token: max(bytes / bandwidth, FLOPs / peak), the roofline of one operator (with
    ``overlap`` o < 1, that max + (1 − o)·min, as :class:`~draftsim.sim.cost.roofline.RooflineModel`),
    plus one GEMM kernel's fixed time where the hardware holds one (``kernel_fixed_us``)."""

    def __init__(self, name: str, inputs: int, outputs: int, hardware: HardwareSpec, dtype_bytes: float, peak: float, mfu: float,
                 mbu: float, tp: int = 1, overlap: float = 1.0, kernel: bool = True):
        self.name = name
        self.overlap = float(overlap)
        self.inputs, self.outputs = int(inputs), int(outputs) / tp
        self.weights = self.inputs * self.outputs
        self._bytes = dtype_bytes
        self._P = peak * mfu
        self._B = hardware.memory_bandwidth * mbu
        #: the fixed GPU time of one GEMM kernel on this hardware (``kernel_fixed_us``; 0 where not derived),
        #: or 0 for a matrix that widens another's kernel (``kernel`` False: EAGLE-3's second QKV input half)
        self.fixed = float(hardware.kernel_fixed.get("gemm", 0.0)) if kernel else 0.0

    def flops(self, tokens) -> np.ndarray:
        return 2.0 * self.weights * np.asarray(tokens, dtype=np.float64)

    def bytes(self, tokens) -> np.ndarray:
        return (self.weights + (self.inputs + self.outputs) * np.asarray(tokens, dtype=np.float64)) * self._bytes

    def _time(self, stats: BatchStats) -> np.ndarray:
        m, c = self.bytes(stats.tokens) / self._B, self.flops(stats.tokens) / self._P
        return self.fixed + (overlapped(m, c, self.overlap) if self.overlap < 1.0 else np.maximum(m, c))

    def _bound(self, stats: BatchStats) -> np.ndarray:
        return np.where(self.bytes(stats.tokens) / self._B >= self.flops(stats.tokens) / self._P, 2, 3)


class HeadCost(CostModel):
    """A drafting head: the sum of its parts' times per call (each part a roofline), and what it
    holds on the target's devices (:meth:`memory`: every weight of the head as the engine loads
    it, which may be more than one call reads — Medusa's other heads, EAGLE-3's fusion layer)."""

    def __init__(self, name: str, parts: list[CostModel], footprint: MemoryFootprint, overhead: float = 0.0):
        self.name, self.parts = name, parts
        self._footprint = dataclasses.replace(footprint, attached=True)
        self.overhead = float(overhead)  #: seconds per call beyond its parts' rooflines (an engine's per-draft-forward time)

    def plus(self, seconds: float, note: str) -> HeadCost:
        """A new head of the same kind: this one with ``seconds`` more per call (an engine's
        per-draft-forward time) and ``note`` added to its name."""
        return type(self)(self.name + note, self.parts, self._footprint, self.overhead + seconds)

    def memory(self) -> MemoryFootprint:
        """The head's weights, KV per cached token (0: no attention) and activations per new
        token on each of the target's devices; it always shares them."""
        return self._footprint

    def weight_bytes(self) -> float:
        """Bytes of the head's weights per device (what it adds to the target's memory)."""
        return self._footprint.weights

    def kv_bytes_per_token(self) -> float:
        """Bytes of the head's KV cache per cached token per device (0: no attention)."""
        return self._footprint.kv_per_token

    def _time(self, stats: BatchStats) -> np.ndarray:
        return sum(np.asarray(p.stats_time(stats), dtype=np.float64) for p in self.parts) + self.overhead

    def _bound(self, stats: BatchStats) -> np.ndarray:
        return self.parts[0]._bound(stats)


class OperatorHead(HeadCost):
    """A drafting head priced from measured operator tables (``--cost-model operators``): its
    decoder layer an :class:`~draftsim.sim.cost.operators.OperatorModel` of one layer (GEMMs,
    attention over the context, all-reduces, norms; the LM head over the head's vocabulary), its
    GEMMs beyond the layer :class:`~draftsim.sim.cost.operators.MeasuredGemm` s read from the same
    GEMM table, each falling back to the roofline outside the tables (recorded), and the engine's
    per-draft-forward time (:attr:`overhead`) on top, once per call."""

    def _part_list(self, p: CostModel, batch: int, new_tokens: int, context: int) -> list[Part]:
        if isinstance(p, OperatorModel):
            return p.breakdown(batch, new_tokens, context)
        if isinstance(p, MeasuredGemm):
            return [p.part(batch, new_tokens, context)]
        return [Part("gemm layers", float(p.shape_time(batch, new_tokens, context)), False, f"catalog roofline: {p.name}",
                     "its layer is priced by the roofline whole")]

    def breakdown(self, batch: int, new_tokens: int = 1, context: int = 0) -> list[Part]:
        """One uniform call part by part, with :meth:`OperatorModel.breakdown`'s labels (a GEMM beyond
        the layer joins ``gemm layers``, an LM head ``gemm lm_head``); ``host`` holds the engine's
        per-draft-forward time."""
        merged: dict[str, Part] = {}
        for p in self.parts:
            for part in self._part_list(p, batch, new_tokens, context):
                had = merged.get(part.part)
                merged[part.part] = part if had is None else Part(
                    part.part, had.seconds + part.seconds, had.measured and part.measured,
                    had.source if part.source in had.source else f"{had.source}; {part.source}", "; ".join(filter(None, [had.note, part.note])))
        engine = "the engine's per-draft-forward time (sim/data/engines.json)"
        host = merged.pop("host", None)
        merged["host"] = (Part("host", self.overhead, False, engine) if host is None else
                          Part("host", host.seconds + self.overhead, False, f"{host.source}; {engine}", host.note))
        return list(merged.values())

    @property
    def fallbacks(self) -> dict[str, set[str]]:
        """Per operator, why a priced call left its table (the parts' records)."""
        out: dict[str, set[str]] = {}
        for p in self.parts:
            if isinstance(p, OperatorModel):
                items = p.fallbacks.items()
            elif isinstance(p, MeasuredGemm):
                items = [(f"gemm {p.label}", p.probe.fallbacks.get(f"gemm {p.label}", set()))]
            else:
                items = [("whole call", {"catalog roofline"})]
            for key, reasons in items:
                if reasons:
                    out.setdefault(key, set()).update(reasons)
        return out

    def describe(self) -> str:
        """Where each part's price comes from."""
        lines = [f"{self.name}:"]
        for p in self.parts:
            if isinstance(p, OperatorModel):
                lines += ["  " + line for line in p.describe().splitlines()]
            elif isinstance(p, MeasuredGemm):
                lines.append(f"  gemm {p.label}: {p.probe.sources['gemm'].split(':')[0]} at n={p.outputs}, k={p.inputs}, "
                             + ("measured" if p.measured else f"estimated ({p.note})"))
            else:
                lines.append(f"  {p.name}: catalog roofline")
        lines.append(f"  engine: {self.overhead * 1e3:.4g} ms per draft forward on top")
        return "\n".join(lines)


class Lookup(CallCost):
    """A lookup drafter (n-gram, suffix tree, Max-Gram, bigram): its proposal time per call and
    per token (a measured profile's, else nothing); its tables live in host memory, so it holds
    nothing on the device."""

    def memory(self) -> MemoryFootprint:
        return NOTHING


class CappedContext(CostModel):
    """``inner`` with every sequence's cached context capped at ``window`` tokens. Where the
    caller knows each sequence's context it caps them one by one before summing
    (:attr:`context_cap`: the serving simulator does); a batch's statistics alone hold only the
    total, so here the mean context is capped (exact for one sequence, and for a batch whose
    contexts are all above or all below the window)."""

    def __init__(self, inner: CostModel, window: int):
        self.inner, self.window = inner, int(window)
        self.context_cap = self.window  #: each sequence's cached context is at most this (callers cap per sequence)
        self.own_prefill = False  #: the target's prefill fills the cache this drafter reads a window of
        self.name = f"{inner.name}, KV window {self.window}"

    def memory(self) -> MemoryFootprint:
        """Nothing of its own: the target's weights and a window of the target's cache, on the
        target's devices (the step's working set is the target's)."""
        inner = self.inner.memory()
        return MemoryFootprint(0.0, 0.0, 0.0 if inner is None else inner.activation_per_token, attached=True)

    def _capped(self, stats: BatchStats) -> BatchStats:
        seqs = np.maximum(stats.sequences, 1)
        mean = stats.cached / seqs
        cut = np.maximum(mean - self.window, 0.0)
        return BatchStats(stats.sequences, stats.tokens, stats.cached - cut * stats.sequences, stats.pairs - cut * stats.tokens)

    def _time(self, stats):
        return self.inner.stats_time(self._capped(stats))

    def _bound(self, stats):
        return self.inner._bound(self._capped(stats))


def head_cost(spec: DrafterSpec, target: ModelSpec, hardware: HardwareSpec, dtype: str, tp: int, *, mfu=None, mbu=None,
              overhead=None, overlap: float = 1.0, kv_dtype: str | None = None, cost_model: str = "roofline", engine: str = "vllm",
              graph_tokens=None) -> HeadCost | CappedContext:
    """The cost model of one draft call of head ``spec`` on ``target`` (see the module docstring).
    ``dtype`` is the target's weights: EAGLE and Medusa heads ship in bfloat16 whatever the target's
    weight-only format (int4), an MTP module and self-speculation are the target's own weights;
    ``kv_dtype`` is the KV cache's (the head's layer caches in it too). ``cost_model``
    ``"operators"`` prices the head from ``engine``'s measured operator tables
    (:class:`OperatorHead`; a call of N tokens at the CUDA-graph size ``graph_tokens`` above N, as
    vLLM's EAGLE proposer pads its drafting forward), the roofline where they end; its memory
    is the same either way."""
    entry = method_entry(spec.method)
    layout = entry.layout  # the shape of the head (its builder below); None for self-speculation
    facts = FACTS.get(entry.facts, {}) if entry.facts else {}
    layers = int(facts.get("layers", facts.get("layers_per_module", 1)))
    if layout == "mtp":  # an MTP module is one of the target's blocks: its experts and latent attention too
        layer = dataclasses.replace(target, name=f"{spec.label} head of {target.name}", layers=layers, dense_layers=0, mtp_layers=0)
    else:  # EAGLE and Medusa heads are dense, with standard attention, on any target
        layer = dataclasses.replace(target, name=f"{spec.label} head of {target.name}", layers=layers, experts=0, experts_per_token=0,
                                    shared_experts=0, expert_intermediate=0, dense_layers=0, q_lora_rank=0, kv_lora_rank=0,
                                    qk_rope_head_dim=0, v_head_dim=0, mtp_layers=0,
                                    head_dim=target.v_head_dim if target.kv_lora_rank else target.head_dim)
    kw = dict(mfu=mfu, mbu=mbu, check_memory=False, overlap=overlap, kv_dtype=kv_dtype)
    measured = dict(engine=engine, graph_tokens=graph_tokens) if cost_model == "operators" else None
    if entry.pricing == "target_window":
        cls = RooflineModel if measured is None else OperatorModel
        return CappedContext(cls(target, hardware, dtype, tp, mfu=mfu, mbu=mbu, overhead=overhead, overhead_per_layer=None if overhead is None else 0.0,
                                 overlap=overlap, kv_dtype=kv_dtype, **(measured or {})), dict(spec.options)["window"])
    if layout != "mtp":
        dtype = WEIGHT_ONLY.get(dtype, dtype)
    probe = RooflineModel(layer, hardware, dtype, tp, **kw)
    whole = set(facts.get("replicated", {}).get("layers", ()))  # kept whole on every device (nn.Linear), not split over tp

    def mm(what: str, inputs: int, outputs: int, key: str = "", kernel: bool = True) -> Matmul:
        return Matmul(f"{what} ({inputs}x{outputs})", inputs, outputs, hardware, probe.bytes, probe.peak, probe.mfu, probe.mbu,
                      1 if key in whole else tp, overlap, kernel)

    h = target.hidden
    act = activation_bytes_per_token(layer, tp, probe.bytes)
    # heads run inside the engine's step: no launch overhead of their own beyond the hardware's per-call one
    if layout == "medusa":
        parts = [mm("residual block", h, h, "residual_block") for _ in range(int(facts["residual_blocks_per_head"]))] + \
                [mm("LM head", h, target.vocab)]
        # the engine loads every head of the checkpoint; a call runs one
        weights = int(facts["default_heads"]) * sum(p.weights for p in parts) * probe.bytes
        footprint = MemoryFootprint(weights, 0.0, act)
        if measured is not None:
            gemms = OperatorModel(layer, hardware, dtype, tp, **kw, **measured)  # whose GEMM table prices the head's matrices
            parts = [MeasuredGemm("residual block", h, h, gemms, 1 if "residual_block" in whole else tp)
                     for _ in range(int(facts["residual_blocks_per_head"]))] + [MeasuredGemm("lm_head", h, target.vocab, gemms, tp, lm_head=True)]
            return OperatorHead(f"medusa head of {target.name}, operators measured", parts, footprint)
        return HeadCost(f"medusa head of {target.name}", parts, footprint)
    if layout == "mtp":
        if getattr(target, "mtp_layers", 0) < 1:
            raise DraftsimError(f"drafter mtp needs a target with multi-token-prediction modules; {target.name} declares none "
                                "(its catalog entry or config.json has no mtp_layers / num_nextn_predict_layers)")
        block = RooflineModel(layer, hardware, dtype, tp, **kw)
        parts = [block, mm("projection", facts["projection_inputs"] * h, h, "projection")]
    elif layout == "eagle":
        block = RooflineModel(layer, hardware, dtype, tp, **kw)
        parts = [block, mm("fc", facts["fc_inputs"] * h, h, "fc")]
    elif layout == "eagle3":
        vocab, vocab_from = eagle3_draft_vocab(target, spec.options)
        if vocab > target.vocab:
            raise DraftsimError(f"drafter {spec.label}: draft_vocab {vocab} exceeds {target.name}'s vocabulary {target.vocab}")
        block = RooflineModel(dataclasses.replace(layer, vocab=vocab), hardware, dtype, tp, **kw)
        kv_heads = float(np.ceil(target.kv_heads / tp))
        qkv_out = (target.heads / tp + 2 * kv_heads) * target.head_dim
        # the layer's QKV GEMM takes 2h inputs: one kernel, its second half priced here (no kernel of its own)
        parts = [block, mm("QKV's embedding half", (facts["qkv_inputs"] - 1) * h, qkv_out * tp, kernel=False)]
    else:  # pragma: no cover - parse_drafter only yields the methods above
        raise DraftsimError(f"no head layout {layout!r} (drafting method {spec.method})")
    # the block's parameters count an embedding table and an LM head (one matrix when tied): the
    # embedding is the target's; so is the LM head of eagle and mtp; eagle3's (draft vocabulary) is its own
    matrix = block.model.vocab * h / tp * probe.bytes
    shared = (1 if block.model.tied_embeddings else 2) if layout in ("eagle", "mtp") else (0 if block.model.tied_embeddings else 1)
    weights = block.weight_bytes_per_device() - shared * matrix + sum(p.weights for p in parts[1:]) * probe.bytes
    if layout == "eagle3":  # the fusion layer (3h -> h), run once per round over the verified tokens: held, not priced per call
        weights += mm("fusion fc", facts["fusion_inputs"] * h, h, "fusion_fc").weights * probe.bytes
    footprint = MemoryFootprint(max(weights, 0.0), float(block.kv_bytes_per_device(1, 1)),
                                activation_bytes_per_token(block.model, tp, probe.bytes))
    label = f"{spec.label} head of {target.name}"
    if layout == "eagle3" and vocab_from != "given":
        label += f" (draft vocabulary {vocab:,}: {vocab_from})"
    if measured is None:
        return HeadCost(label, parts, footprint)
    # the same head from the measured operators: its layer (EAGLE-3's QKV one GEMM over its 2h inputs) and matrices
    layer_op = OperatorModel(block.model, hardware, dtype, tp, **kw, **measured,
                             qkv_inputs=facts["qkv_inputs"] * h if layout == "eagle3" else None)
    extra = {"eagle": ("fc", facts.get("fc_inputs", 0)), "mtp": ("projection", facts.get("projection_inputs", 0))}.get(layout)
    if extra is None:
        parts = [layer_op]
    elif layer_op.whole_roofline:  # an MoE / latent-attention MTP block: no GEMM table was read for it
        parts = [layer_op, *parts[1:]]
    else:
        parts = [layer_op, MeasuredGemm(extra[0], extra[1] * h, h, layer_op, 1 if extra[0] in whole else tp)]
    return OperatorHead(label + ", operators measured", parts, footprint)
