"""The registries: every drafting method and every serving engine draftsim knows, one entry each.

**Drafting methods** (:data:`METHODS`, one :class:`DraftingMethod` each) by the names vLLM and
SGLang give them (``--drafter-model``; a catalog model name is a ``draft_model``): the options a
method takes and their ranges, how it is priced (a draft model's own roofline, a head on the
target's devices, the target over a capped window of its cache, or a lookup on the CPU:
:mod:`draftsim.sim.cost.methods` and :mod:`draftsim.sim.cost.assembly` price by :attr:`DraftingMethod.pricing`),
the entry of ``sim/data/drafting_methods.json`` its head is built from, the drafter of
``realrun/drafters.py`` that runs it here (by name only: ``sim`` does not import ``realrun``), and
its help line. Every list of methods — the drafter options' help, the front door's
``--method``, the acceptance catalog's methods, the lookups whose proposal time ``profile``
measures — is read from here, so a new method is one entry (and its tests).

**Engines** (:data:`ENGINES`, one :class:`EngineOverheads` each) are the entries of
``sim/data/engines.json``, read through a schema (:data:`ENGINE_SCHEMA`): every key is one the
schema declares (or a citation: ``source``, ``assumptions``, ``FIELD_source``, …), every required
key is there, every value has its type and range — else one line naming the file and the field
(:func:`read_engines`). Each entry is built by keyword; its CUDA-graph capture sizes are data
(``graph_capture_tokens``: the sizes listed and the ranges stepped). ``--engine``'s help is
generated from the entries (:func:`engine_help`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import DraftsimError, unknown

__all__ = ["MethodOption", "DraftingMethod", "METHODS", "method", "methods", "drafter_help", "served_method_help", "lookup_drafters",
           "EngineOverheads", "SchedulerDefaults", "ENGINES", "ENGINES_FILE", "ENGINE_SCHEMA", "CITATIONS", "Obj", "ListOf", "Maybe", "read_engines", "engine_help"]

DATA = Path(__file__).parent / "data"


# --- drafting methods ------------------------------------------------------------------------

@dataclass(frozen=True)
class MethodOption:
    """One ``KEY=VALUE`` a drafting method takes (``eagle3:draft_vocab=32000``): a whole number in
    [``minimum``, ``maximum``], written ``placeholder`` in the help, required or not."""

    key: str
    placeholder: str
    meaning: str
    example: int
    required: bool = False
    minimum: int = 1
    maximum: int = 10**7


#: How a method's draft calls are priced (sim/cost/assembly.py dispatches on it).
PRICINGS = {
    "draft_model": "a separate model, by its own roofline or measured profile",
    "head": "a head on the target's devices, from the target's architecture and the method's facts",
    "target_window": "the target's own forward over a capped window of its KV cache",
    "lookup": "a lookup on the CPU: a measured profile's proposal time, else free",
}


@dataclass(frozen=True)
class DraftingMethod:
    """One drafting method: its name (as engines name it), title, help line, options, how it is
    priced (:data:`PRICINGS`), for a head the layout its cost model is built from
    (:mod:`draftsim.sim.cost.methods`, default: its name) and its entry of
    ``sim/data/drafting_methods.json`` (default: the layout), the drafter of ``realrun/drafters.py``
    that runs it on this machine (None: none), and whether serving engines deploy it (the front
    door's ``--method``, the acceptance catalog's methods)."""

    name: str
    title: str
    help: str
    pricing: str
    options: tuple[MethodOption, ...] = ()
    layout: str | None = None
    facts: str | None = None
    real_drafter: str | None = None
    served: bool = True
    usage_text: str | None = None  #: how the help writes it, where its name alone does not say (draft_model:NAME)
    #: vLLM's ``--speculative-config`` for it, less ``num_speculative_tokens`` ({target}: the target's catalog name,
    #: {drafter}: the draft model's Hugging Face id); method names as vLLM's ``SpeculativeMethod`` spells them
    #: (docs/research/acceptance.json, ``method_names``). Empty: vLLM's flags for it are not modelled.
    vllm: tuple = ()
    #: SGLang's ``--speculative-algorithm`` for it (None: not modelled)
    sglang: str | None = None

    def __post_init__(self):
        if self.pricing not in PRICINGS:
            raise ValueError(f"drafting method {self.name}: pricing {self.pricing!r} is none of {', '.join(PRICINGS)}")
        if self.pricing == "head":
            object.__setattr__(self, "layout", self.layout or self.name)
            object.__setattr__(self, "facts", self.facts or self.layout)

    @property
    def usage(self) -> str:
        """As the help writes it: ``eagle3[:draft_vocab=N]``, ``selfspec:window=B``."""
        if self.usage_text is not None:
            return self.usage_text
        required = ",".join(f"{o.key}={o.placeholder}" for o in self.options if o.required)
        optional = "".join(f"[{',' if required else ':'}{o.key}={o.placeholder}]" for o in self.options if not o.required)
        return self.name + (f":{required}" if required else "") + optional

    @property
    def spelled(self) -> str:
        """The shortest valid spelling (its required options shown): ``eagle3``, ``selfspec:window=B``."""
        required = ",".join(f"{o.key}={o.placeholder}" for o in self.options if o.required)
        return self.name + (f":{required}" if required else "")

    def option(self, key: str) -> MethodOption | None:
        return next((o for o in self.options if o.key == key), None)


_WINDOW = MethodOption("window", "B", "the KV tokens the drafting pass attends to", 2048, required=True)
_DRAFT_VOCAB = MethodOption("draft_vocab", "N", "the head's draft vocabulary (default: the published head's for the target)", 32000)

#: Every drafting method, in the order the help lists them.
METHODS: dict[str, DraftingMethod] = {m.name: m for m in (
    DraftingMethod("draft_model", "draft model", "a separate small model (a catalog name or config.json path), run at the target's "
                   "tensor parallelism unless --drafter-tp says otherwise", "draft_model", real_drafter="NeuralDraft",
                   usage_text="a catalog name or config.json path (draft_model:NAME)", vllm=(("model", "{drafter}"),)),
    DraftingMethod("eagle", "EAGLE", "EAGLE (arXiv 2401.15077): one decoder layer fed the target's feature and the next token's "
                   "embedding through an FC (2h -> h), the target's LM head", "head",
                   vllm=(("method", "eagle"), ("model", "<the EAGLE head trained for {target}>")), sglang="EAGLE"),
    DraftingMethod("eagle3", "EAGLE-3", "EAGLE-3 (arXiv 2503.01840): one decoder layer whose QKV takes embedding and feature (2h), "
                   "an LM head over a reduced draft vocabulary", "head", options=(_DRAFT_VOCAB,),
                   vllm=(("method", "eagle3"), ("model", "<the EAGLE3 head trained for {target}>")), sglang="EAGLE3"),
    DraftingMethod("medusa", "Medusa", "Medusa (arXiv 2401.10774): heads on the target's last hidden state, each a residual block "
                   "and its own LM head; one call per head", "head",
                   vllm=(("method", "medusa"), ("model", "<the Medusa heads trained for {target}>"))),
    DraftingMethod("mtp", "MTP", "multi-token prediction modules (DeepSeek-V3 §2.2), one of the target's blocks each; only for a "
                   "target that declares them", "head", vllm=(("method", "deepseek_mtp"),)),
    DraftingMethod("selfspec", "self-speculation", "self-speculation with a capped KV cache (MagicDec, TriForce): the target "
                   "drafts for itself over a window of B cached tokens", "target_window", options=(_WINDOW,), served=False),
    DraftingMethod("ngram", "n-gram lookup", "vLLM's prompt lookup on the CPU", "lookup", real_drafter="NGram",
                   vllm=(("method", "ngram"), ("prompt_lookup_max", 4))),
    DraftingMethod("suffix", "suffix decoding", "suffix decoding (arXiv 2411.04975) on the CPU", "lookup", real_drafter="Suffix",
                   vllm=(("method", "suffix"),)),
    DraftingMethod("maxgram", "Max-Gram", "draftsim's Max-Gram lookup on the CPU", "lookup", real_drafter="MaxGram", served=False),
    DraftingMethod("bigram", "bigram", "draftsim's bigram table on the CPU", "lookup", real_drafter="Bigram", served=False),
)}


def methods(pricing: str | None = None, served: bool | None = None) -> tuple[str, ...]:
    """The methods' names, in registry order, priced as ``pricing`` and/or served or not."""
    return tuple(m.name for m in METHODS.values()
                 if (pricing is None or m.pricing == pricing) and (served is None or m.served == served))


def method(name: str) -> DraftingMethod | None:
    """The entry of method ``name`` (case-insensitive), or None (a model name: a draft model)."""
    return METHODS.get(str(name).strip().lower())


def _or_list(items) -> str:
    items = list(items)
    return ", ".join(items[:-1]) + (" or " if len(items) > 1 else "") + items[-1]


def lookup_drafters() -> str:
    """The lookup drafters this machine runs (those with a ``realrun`` drafter), as the real
    commands' ``--drafter`` help lists them."""
    return ", ".join(m.name for m in METHODS.values() if m.pricing == "lookup" and m.real_drafter)


def drafter_help() -> str:
    """The help of ``--drafter-model``: every method as it is written."""
    return "drafter (repeat, in drafter order): " + _or_list(m.usage for m in METHODS.values())


def served_method_help() -> str:
    """The methods a serving engine deploys, as the front door's ``--method`` names them."""
    return _or_list([*(m.name for m in METHODS.values() if m.served and m.pricing != "draft_model"), "a catalog draft model"])


# --- engines ---------------------------------------------------------------------------------

#: The engines' overheads, scheduler defaults and their sources.
ENGINES_FILE = DATA / "engines.json"


@dataclass(frozen=True)
class SchedulerDefaults:
    """What an engine's scheduler does when its user sets nothing, on one device (each value cited
    in sim/data/engines.json under the engine's ``scheduler``): the most running requests, the
    token budget of a step, whether prompts are prefilled in chunks within it, the KV block size
    in tokens and the share of device memory the engine takes."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    block_size: int
    gpu_memory_utilization: float
    entry_point: str = ""

    def describe(self) -> str:
        return (f"max_num_seqs {self.max_num_seqs}, max_num_batched_tokens {self.max_num_batched_tokens:,}, chunked prefill "
                f"{'on' if self.chunked_prefill else 'off'}, block {self.block_size}, gpu-memory-utilization {self.gpu_memory_utilization:g}")


def _tier(tiers: list[dict], memory_gb: float, name: str) -> dict:
    """The first tier whose device conditions ``memory_gb`` (10^9 bytes) and ``name`` meet."""
    gib = memory_gb * 1e9 / 2**30
    for tier in tiers:
        if gib < float(tier.get("min_memory_gib", 0.0)):
            continue
        if any(x in name.lower() for x in tier.get("exclude_names", ())):
            continue
        return tier
    return tiers[-1]


@dataclass(frozen=True)
class EngineOverheads:
    """One engine of sim/data/engines.json (:mod:`draftsim.sim.cost.overheads` says what each value does to a price)."""

    name: str
    per_step: float = 0.0
    per_draft_forward: float = 0.0
    graph_tokens: tuple[int, ...] | None = None
    source: str = ""
    #: how far a forward's memory and compute times overlap (1: the roofline's max; 0: their sum)
    overlap: float = 1.0
    #: measured tensor-parallel all-reduce times: {"hardware": [names], "message_bytes": [...], "us": {tp: [...]}} or None
    allreduce: dict | None = None
    #: whether the per-step host work runs beside the forward (max, not sum) in a server without / with speculation
    plain_overlap: bool = False
    speculative_overlap: bool = False
    #: drafting methods (:data:`METHODS` names) verified by batch expansion
    batch_expansion: tuple[str, ...] = ()
    #: the engine's version these values describe (said in every output)
    version: str = ""
    #: the scheduler's defaults by device (engines.json ``scheduler``: tiers by device memory)
    scheduler_entry: dict | None = None

    @property
    def label(self) -> str:
        """The engine and its version, as outputs name it (``vllm v0.10.1``)."""
        return f"{self.name} {self.version}".strip() if self.name != "none" else "none (the roofline alone)"

    def scheduler(self, hardware=None) -> SchedulerDefaults:
        """The scheduler's defaults of this engine on ``hardware`` (a catalog HardwareSpec; None:
        no known device, the smallest tier)."""
        s = self.scheduler_entry or ENGINES["none"].scheduler_entry
        tier = _tier(s["tiers"], 0.0 if hardware is None else float(hardware.memory) / 1e9, "" if hardware is None else hardware.name)
        seqs = min(int(tier["max_num_seqs"]), int(tier["max_num_batched_tokens"]))
        return SchedulerDefaults(seqs, int(tier["max_num_batched_tokens"]), bool(s["chunked_prefill"]), int(s["block_size"]),
                                 float(s["gpu_memory_utilization"]), s.get("entry_point", ""))

    def host_overlap(self, speculative: bool) -> bool:
        """Whether a server of this kind hides its per-step host work behind the forward."""
        return self.speculative_overlap if speculative else self.plain_overlap

    def allreduce_for(self, hardware: str, tp: int):
        """(message bytes, seconds) of the engine's measured all-reduce on ``hardware`` at ``tp``
        devices, or None where it measured none (the roofline's latency + bytes / bandwidth)."""
        ar = self.allreduce
        if ar is None or hardware not in ar["hardware"] or str(tp) not in ar["us"]:
            return None
        return tuple(float(x) for x in ar["message_bytes"]), tuple(float(x) * 1e-6 for x in ar["us"][str(tp)])

    def help_line(self) -> str:
        """What ``--engine``'s help says of it, every number from its entry."""
        if self.name == "none":
            return "none (the roofline alone)"
        notes = [f"{self.per_step * 1e3:.2f} ms per step"]
        if self.plain_overlap:
            notes.append("host work overlapped without speculation")
        if self.batch_expansion:
            notes.append(f"{', '.join(self.batch_expansion)} verified by batch expansion")
        return f"{self.label} ({', '.join(notes)})"

    def describe(self) -> str:
        if self.name == "none":
            return "engine: none (the roofline alone, no engine overheads)"
        pad = f", CUDA graphs padded to {len(self.graph_tokens)} sizes up to {self.graph_tokens[-1]} tokens" if self.graph_tokens else ""
        if self.overlap < 1.0:
            pad += ", memory and compute time " + ("added" if self.overlap == 0 else f"overlapping {self.overlap:g}")
        if self.allreduce:
            pad += f", all-reduces at their measured times on {', '.join(self.allreduce['hardware'])}"
        if self.plain_overlap or self.speculative_overlap:
            kinds = [k for k, on in (("without", self.plain_overlap), ("with", self.speculative_overlap)) if on]
            pad += f", per-step host work overlapped with the forward {' and '.join(kinds)} speculation"
        if self.batch_expansion:
            pad += f", {', '.join(self.batch_expansion)} proposals verified by batch expansion"
        return (f"engine: {self.label} ({self.per_step * 1e3:.2f} ms per step, {self.per_draft_forward * 1e3:.2f} ms per draft "
                f"forward{pad}; {self.source})")


# The schema of engines.json. A check takes (value, where) and returns the value or raises _Bad.

class _Bad(Exception):
    """A field of the file that breaks the schema: where, and what is wrong."""

    def __init__(self, where: str, what: str):
        super().__init__(where, what)
        self.where, self.what = where, what


Check = Callable[[Any, str], Any]

#: Keys that cite where a value comes from, allowed beside any object's fields (their contents are the citation).
CITATIONS = ("source", "sources", "assumption", "assumptions", "consistency", "reading", "via", "about", "setup", "note")


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(lo: float = 0.0, hi: float = math.inf, *, integer: bool = False, above: bool = False) -> Check:
    def check(v, where):
        kind = "a whole number" if integer else "a number"
        rng = f"{'>' if above else '>='} {lo:g}" + (f" and <= {hi:g}" if hi < math.inf else "")
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (not integer or float(v).is_integer())
        if not ok or (v <= lo if above else v < lo) or v > hi:
            raise _Bad(where, f"expected {kind} {rng}; got {_short(v)}")
        return int(v) if integer else float(v)
    return check


def _text(v, where):
    if not isinstance(v, str) or not v.strip():
        raise _Bad(where, f"expected a non-empty string; got {_short(v)}")
    return v


def _flag(v, where):
    if not isinstance(v, bool):
        raise _Bad(where, f"expected true or false; got {_short(v)}")
    return v


@dataclass(frozen=True)
class ListOf:
    """A list of ``item`` s (increasing where ``increasing``; empty only where ``empty``)."""

    item: Check
    increasing: bool = False
    empty: bool = False

    def __call__(self, v, where):
        if not isinstance(v, list) or (not v and not self.empty):
            raise _Bad(where, f"expected a {'' if self.empty else 'non-empty '}list; got {_short(v)}")
        out = [self.item(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if self.increasing and any(b <= a for a, b in zip(out, out[1:])):
            raise _Bad(where, f"expected increasing values; got {_short(v)}")
        return out


@dataclass(frozen=True)
class Maybe:
    """null, or what ``inner`` accepts."""

    inner: Check

    def __call__(self, v, where):
        return None if v is None else self.inner(v, where)


def _one_of(choices: Callable[[], tuple[str, ...]], kind: str) -> Check:
    def check(v, where):
        if v not in choices():
            raise _Bad(where, f"{unknown(kind, v, choices())}")
        return v
    return check


@dataclass(frozen=True)
class Obj:
    """An object of the file: its fields (name → (required, check)). Besides them it may hold
    :data:`CITATIONS` and ``FIELD_source`` for any of its fields (``per_step_source`` for
    ``per_step_us``); any other key is refused."""

    fields: dict[str, tuple[bool, Check]]
    mapping: Check | None = None  #: an object whose keys are free (e.g. engine names): the check of each value
    cites: tuple[str, ...] = ()  #: fields of its nested objects it may cite as FIELD_source too

    def __call__(self, v, where: str) -> dict:
        if not isinstance(v, dict):
            raise _Bad(where, f"expected an object; got {_short(v)}")
        if self.mapping is not None:
            return {k: self.mapping(x, f"{where}.{k}") for k, x in v.items()}
        cited = {f"{k.removesuffix('_us')}_source" for k in (*self.fields, *self.cites)} | {f"{k}_source" for k in self.fields}
        for key in v:
            if key not in self.fields and key not in CITATIONS and key not in cited:
                raise _Bad(f"{where}.{key}", f"unknown key (valid: {', '.join(self.fields)}, or a citation: "
                                            f"{', '.join(CITATIONS[:4])}, FIELD_source)")
        for key, (required, _) in self.fields.items():
            if required and key not in v:
                raise _Bad(f"{where}.{key}", "missing")
        return {k: check(v[k], f"{where}.{k}") for k, (_, check) in self.fields.items() if k in v}


def _tp_table(v, where):
    if not isinstance(v, dict) or not v:
        raise _Bad(where, f"expected an object of tensor-parallel sizes; got {_short(v)}")
    for k in v:
        if not k.isdigit() or int(k) < 2:
            raise _Bad(f"{where}.{k}", "expected a tensor-parallel size >= 2 as the key")
    return {k: ListOf(_number())(x, f"{where}.{k}") for k, x in v.items()}


_STEPS = Obj({"from": (True, _number(1, integer=True)), "to": (True, _number(1, integer=True)),
              "every": (True, _number(1, integer=True))})
_TIER = Obj({"max_num_seqs": (True, _number(1, integer=True)), "max_num_batched_tokens": (True, _number(1, integer=True)),
             "min_memory_gib": (False, _number()), "exclude_names": (False, ListOf(_text))})

#: The schema of one engine of sim/data/engines.json.
ENGINE_SCHEMA = Obj({
    "source": (True, _text),
    "version": (True, _text),
    "per_step_us": (True, _number()),
    "per_draft_forward_us": (True, _number()),
    "graph_capture_tokens": (True, Maybe(Obj({"listed": (True, ListOf(_number(1, integer=True), increasing=True, empty=True)),
                                                "ranges": (True, ListOf(_STEPS, empty=True)), "rule": (False, _text)}))),
    "forward_overlap": (False, _number(0.0, 1.0)),
    "host_overlap": (False, Obj({"plain": (True, _flag), "speculative": (True, _flag)})),
    "batch_expansion": (False, Obj({"methods": (True, ListOf(_one_of(lambda: tuple(METHODS), "drafting method")))})),
    "allreduce": (False, Obj({"hardware": (True, ListOf(_text)), "message_bytes": (True, ListOf(_number(0, above=True), increasing=True)),
                              "us": (True, _tp_table)})),
    "cuda_graph_memory": (False, Obj({"bytes_in_kv_budget": (True, _number()), "plan_note": (True, _text)})),
    "scheduler": (True, Obj({"entry_point": (True, _text), "tiers": (True, ListOf(_TIER)), "chunked_prefill": (True, _flag),
                             "block_size": (True, _number(1, integer=True)),
                             "gpu_memory_utilization": (True, _number(0.0, 1.0, above=True))}, cites=tuple(_TIER.fields))),
})
_FILE = Obj({"schema": (True, _text), "version": (True, _number(1, integer=True)), "engines": (True, Obj({}, mapping=ENGINE_SCHEMA))})


def _sizes(graphs: dict | None, where: str) -> tuple[int, ...] | None:
    """The capture sizes ``graph_capture_tokens`` lists: ``listed`` then every ``ranges`` entry's
    from..to (inclusive) stepped by ``every``; increasing."""
    if graphs is None:
        return None
    sizes = list(graphs["listed"])
    for i, r in enumerate(graphs["ranges"]):
        if r["to"] < r["from"]:
            raise _Bad(f"{where}.ranges[{i}]", f"expected from <= to; got {r['from']}..{r['to']}")
        sizes += range(r["from"], r["to"] + 1, r["every"])
    if not sizes or any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise _Bad(where, "expected increasing sizes, listed then ranges")
    return tuple(sizes)


def _engine(name: str, e: dict, raw: dict) -> EngineOverheads:
    """One checked entry as its record, by keyword."""
    cited = raw.get("per_step_source")
    return EngineOverheads(
        name=name, per_step=e["per_step_us"] * 1e-6, per_draft_forward=e["per_draft_forward_us"] * 1e-6,
        graph_tokens=_sizes(e["graph_capture_tokens"], f"engines.{name}.graph_capture_tokens"),
        source="per step: " + (cited["repo"] + " " + cited["path"] if isinstance(cited, dict) else e["source"]),
        overlap=e.get("forward_overlap", 1.0), allreduce=raw.get("allreduce"),
        plain_overlap=e.get("host_overlap", {}).get("plain", False), speculative_overlap=e.get("host_overlap", {}).get("speculative", False),
        batch_expansion=tuple(e.get("batch_expansion", {}).get("methods", ())), version=e["version"], scheduler_entry=raw["scheduler"])


def read_engines(path: Path | str = ENGINES_FILE) -> dict[str, EngineOverheads]:
    """Every engine of ``path`` (an engines.json) by name, each checked against
    :data:`ENGINE_SCHEMA`; a key the schema does not know, a missing one or a value of the wrong
    type or range is refused in one line naming the file and the field."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DraftsimError(f"{path}: not a readable JSON file ({str(exc).splitlines()[0]})") from None
    try:
        checked = _FILE(doc, "")
        if checked["schema"] != "draftsim.engines":
            raise _Bad(".schema", f"expected 'draftsim.engines'; got {_short(checked['schema'])}")
        if "none" not in checked["engines"]:
            raise _Bad(".engines.none", "missing (the roofline alone, the default on a CPU)")
        return {name: _engine(name, e, doc["engines"][name]) for name, e in checked["engines"].items()}
    except _Bad as bad:
        raise DraftsimError(f"{path}: {bad.where.lstrip('.')}: {bad.what}") from None


#: Every engine of sim/data/engines.json by name.
ENGINES = read_engines()


def engine_help() -> str:
    """Every engine as ``--engine``'s help lists it (:meth:`EngineOverheads.help_line`)."""
    return ", ".join(e.help_line() for e in ENGINES.values())
