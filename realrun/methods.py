"""The catalogue of real-run methods: what ``draftsim run`` (and the demo, the benchmarks)
can run, the defaults per method, and how command-line specs become drafters and a
:class:`Method`.

Two steps, so that every argument is checked before any model is loaded:

1. :class:`MethodSpec` — the method as the user wrote it (kind, drafter names, policy and
   rule specs, sequential, head path) — validates everything that does not need a model:
   the policy and rule parse, the number of drafters matches the policy, the method and rule
   agree (lossless methods take lossless rules), tree methods take tree policies, a head
   drives a threshold policy, every drafter name is one :func:`make_drafter` can build.
2. :func:`build_method` loads the drafters for a loaded target and returns the
   :class:`Method` that :func:`draftsim.realrun.compare.measure` runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..sim.errors import DraftsimError
from ..sim.policies import Autoregressive, Policy, Threshold, parse_policy
from ..sim.rules import SD, Rule, parse_rule
from .drafters import (
    STATISTICAL_DRAFTERS,
    Bigram,
    Controlled,
    Drafter,
    NeuralDraft,
    lookup_drafter,
    parse_controlled,
)
from .executor import RunLog, Sampling, generate, token_cascade
from .models import EMBEDDED, LoadedModel, load_model, same_tokenizer

__all__ = ["METHODS", "TREE_METHODS", "DEFAULTS", "STATISTICAL_DRAFTERS", "MethodSpec", "Method", "make_drafter", "fit_bigram",
           "build_method", "method_from", "check_model_name"]

#: Per method: default drafters (comma-separated), policy and rule.
DEFAULTS = {
    "ar": ("", "ar", "sd"),
    "sd": ("maxgram", "fixed:k=4", "sd"),
    "csd": ("distilled,maxgram", "vertical:n=2,k=4", "sd"),
    "cascade": ("distilled", "fixed:k=4", "opt:alpha=0.5"),
    "ssd": ("distilled", "tree:width=1,depth=4", "sd"),
    "tsd": ("distilled", "tree:width=3,depth=4,sib=0.1,nodes=40", "sd"),
    "gsd": ("distilled", "tree:width=3,depth=4,sib=0.1,nodes=40,merge=2", "sd"),
}
METHODS = tuple(DEFAULTS)
TREE_METHODS = ("ssd", "tsd", "gsd")
#: The statistical drafters that read the bundled bigram table.
BIGRAM_DRAFTERS = ("maxgram", "bigram")
#: Methods with one drafter (csd takes several).
SINGLE_DRAFTER = ("sd", "cascade", *TREE_METHODS)


def check_model_name(name: str, role: str = "model") -> str:
    """Raise unless ``name`` is something :func:`draftsim.realrun.models.load_model` can load (checked
    without loading): the embedded model, ``tiny[:SEED]``, a checkpoint folder or a ``.gguf``
    file. Returns the name."""
    if name == EMBEDDED:
        return name
    if name == "tiny" or name.startswith("tiny:"):
        seed = name.partition(":")[2]
        if seed and not (seed.isascii() and seed.isdigit()):
            raise DraftsimError(f"{role} {name!r}: tiny models are named tiny or tiny:SEED (SEED a non-negative integer)")
        return name
    if name.startswith("random:"):
        _, model, seed = (name.split(":", 2) + [""])[:3]
        if not model or (seed and not (seed.isascii() and seed.isdigit())):
            raise DraftsimError(f"{role} {name!r}: random models are named random:NAME or random:NAME:SEED (NAME from draftsim cost --list)")
        from ..sim.cost import default_catalog

        spec = default_catalog().model(model)  # an unknown name: the catalog's message
        if spec.experts or spec.kv_lora_rank or spec.mlp != "gated":
            raise DraftsimError(f"{role} {name!r}: random models are dense Llama-shaped decoders; {spec.name} is not")
        return name
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise DraftsimError(f"{role} {name!r} is not a Hugging Face checkpoint (no config.json)")
        return name
    raise DraftsimError(f"unknown {role} {name!r}: use {EMBEDDED}, tiny[:SEED], random:NAME[:SEED], a checkpoint directory or a .gguf file")


@dataclass(frozen=True)
class MethodSpec:
    """A method as written on the command line, validated without loading a model.

    ``drafters`` is None for the method's default drafters; ``policy`` / ``rule`` likewise.
    """

    kind: str
    drafters: str | None = None
    policy: str | None = None
    rule: str | None = None
    sequential: bool = False
    head: str | None = None

    def __post_init__(self):
        if self.kind not in DEFAULTS:
            raise DraftsimError(f"method must be one of {', '.join(METHODS)}; got {self.kind!r}")
        if self.kind == "ar" and (self.drafters or self.policy or self.rule):
            raise DraftsimError("method ar takes no --drafter, --policy or --rule")
        if self.sequential and self.kind != "cascade":
            raise DraftsimError("--sequential applies to --method cascade")
        policy, rule = self.parsed_policy, self.parsed_rule
        names = self.drafter_names
        if self.kind != "ar" and policy.n_models - 1 != len(names):
            raise DraftsimError(f"policy {self.policy_spec} uses {policy.n_models - 1} drafter(s) but --drafter names "
                                f"{len(names)} ({', '.join(names) or 'none'})")
        if self.kind in SINGLE_DRAFTER and policy.n_models > 2:
            raise DraftsimError(f"method {self.kind} uses one drafter; policy {self.policy_spec} needs {policy.n_models - 1} (use --method csd)")
        if len(set(names)) != len(names):
            raise DraftsimError(f"--drafter names a drafter twice ({', '.join(names)}); each level needs its own")
        for name in names:
            if name.startswith("controlled"):
                _, model = parse_controlled(name)
                if model is not None:
                    check_model_name(model, "the controlled drafter's cost model")
                continue
            if name not in (*STATISTICAL_DRAFTERS, "distilled"):
                try:
                    check_model_name(name, "drafter")
                except DraftsimError as exc:
                    raise DraftsimError(f"{exc}; or a drafter without a model: {', '.join(STATISTICAL_DRAFTERS)}, distilled") from None
        if self.kind in ("sd", "csd", *TREE_METHODS) and not rule.lossless:
            raise DraftsimError(f"method {self.kind} is lossless; rule {self.rule_spec} is lossy — use --method cascade")
        if self.kind in TREE_METHODS:
            if policy.kind != "tree":
                raise DraftsimError(f"method {self.kind} needs a tree policy (e.g. tree:width=3,depth=4); got {self.policy_spec}")
            if policy.choices is not None:
                raise DraftsimError(f"{self.policy_spec}: static trees (choices) run in the simulators; the real executor drafts "
                                    "dynamic trees: give width and depth")
            if self.kind == "ssd" and policy.width != 1:
                raise DraftsimError("method ssd drafts a chain: tree:width=1,depth=K")
            if self.kind == "tsd" and policy.merge:
                raise DraftsimError("method tsd drafts a tree: leave merge=0 (merging makes it gsd)")
            if self.kind == "gsd" and not policy.merge:
                raise DraftsimError("method gsd merges repeated m-grams: give merge=M (e.g. merge=2)")
        elif policy.kind == "tree":
            raise DraftsimError(f"a tree policy runs with --method ssd, tsd or gsd; got --method {self.kind}")
        if self.head is not None:
            if not isinstance(policy, Threshold):
                raise DraftsimError(f"an acceptance head drives the threshold policy (--policy threshold:h=0.7); got {self.policy_spec}")
            if not names or names[0] in STATISTICAL_DRAFTERS:
                raise DraftsimError("an acceptance head needs a neural drafter (its hidden states are the head's input)")
            if not Path(self.head).exists():
                raise DraftsimError(f"--head {self.head}: no such file or folder (train one with draftsim train-head)")

    @property
    def policy_spec(self) -> str:
        return self.policy or DEFAULTS[self.kind][1]

    @property
    def rule_spec(self) -> str:
        return self.rule or DEFAULTS[self.kind][2]

    @property
    def parsed_policy(self) -> Policy:
        return parse_policy(self.policy_spec)

    @property
    def parsed_rule(self) -> Rule:
        return parse_rule(self.rule_spec)

    @property
    def drafter_names(self) -> list[str]:
        text = self.drafters if self.drafters is not None else DEFAULTS[self.kind][0]
        return [s.strip() for s in text.split(",") if s.strip()]


@dataclass
class Method:
    """What to run: ``kind`` (one of :data:`METHODS`), the policy (and its command-line
    spec), drafters (models 1, 2, …), the target-level rule, and for cascades whether to run
    the sequential token cascade ([SC] Algorithm 2) instead of speculative cascades. Build it
    with :func:`build_method`, which validates through :class:`MethodSpec`."""

    kind: str
    policy: Policy = field(default_factory=Autoregressive)
    policy_spec: str = "ar"
    drafters: list[Drafter] = field(default_factory=list)
    rule: Rule = field(default_factory=SD)
    rule_spec: str = "sd"
    sequential: bool = False
    tree_stats: object = None

    def __post_init__(self):
        if self.kind in TREE_METHODS and self.tree_stats is None:
            from .trees import TreeStats

            self.tree_stats = TreeStats()

    @property
    def head_path(self) -> str | None:
        """Where drafter 1's acceptance head came from, if it has one."""
        head = self.drafters[0].head if self.drafters else None
        return None if head is None else str(head.path)

    @property
    def label(self) -> str:
        if self.kind == "ar":
            return "autoregressive"
        names = "+".join(d.name for d in self.drafters)
        if self.sequential:
            return f"sequential cascade {self.rule_spec} with {names}"
        rule = "" if isinstance(self.rule, SD) else f", {self.rule_spec}"
        head = " + head" if self.head_path is not None else ""
        return f"{self.kind} {self.policy_spec}{rule} with {names}{head}"

    def run(self, target: LoadedModel, ids: list[int], max_new_tokens: int, sampling: Sampling, rng) -> RunLog:
        if self.sequential:
            return token_cascade(target, self.drafters[0], ids, max_new_tokens, self.rule, sampling, rng)
        if self.kind in TREE_METHODS:
            from .trees import generate_tree

            return generate_tree(target, ids, max_new_tokens, self.policy, self.drafters[0], sampling, rng, stats=self.tree_stats)
        log = generate(target, ids, max_new_tokens, self.policy, sampling=sampling, rule=self.rule, rng=rng, drafters=self.drafters)
        for d in self.drafters:  # suffix decoding keeps the output for later requests
            d.finish(ids, log.output)
        return log


def fit_bigram(target: LoadedModel) -> Bigram:
    """The bigram drafter fitted to every bundled *train* prompt, formatted for ``target``."""
    from .prompts import SETS, format_prompt, prompt_set

    train = [format_prompt(p, target.tokenizer) for s in SETS for p in prompt_set(s, "train")]
    return Bigram.fit(train, target.vocab_size)


def make_drafter(name: str, target: LoadedModel, bigram: Bigram | None = None, load=load_model) -> Drafter:
    """A drafter for ``target`` by name: ``maxgram`` (with the bigram fallback of [CSD]),
    ``bigram``, ``ngram`` (vLLM's prompt lookup, n from 2 to 4), ``suffix`` (suffix decoding
    with vLLM's defaults), ``distilled`` (``draftsim distill``'s cached draft), or a neural model
    :func:`draftsim.realrun.models.load_model` can load (it must share the target's tokenizer).
    ``load(name, device=, dtype=)`` loads a model (default :func:`load_model`; a caller serving
    several runs in one process passes one that keeps what it loaded)."""
    if name.startswith("controlled"):
        rates, model = parse_controlled(name)
        cost = load(model, device=target.device, dtype=target.dtype) if model else None
        return Controlled(target.vocab_size, rates, cost, name=name)
    if name in STATISTICAL_DRAFTERS:
        if name in BIGRAM_DRAFTERS and bigram is None:
            bigram = fit_bigram(target)
        return lookup_drafter(name, target.vocab_size, bigram)
    if name == "distilled":
        from .distill import load_distilled

        return NeuralDraft(load_distilled(target), "distilled")
    loaded = load(name, device=target.device, dtype=target.dtype)
    if not same_tokenizer(loaded.tokenizer, target.tokenizer):
        raise DraftsimError(f"drafter {name} does not share the target's tokenizer")
    return NeuralDraft(loaded, name)


def build_method(spec: MethodSpec, target: LoadedModel) -> Method:
    """Load ``spec``'s drafters (and head) for ``target`` and return the runnable method."""
    names = spec.drafter_names
    bigram = fit_bigram(target) if any(n in BIGRAM_DRAFTERS for n in names) else None
    drafters = [make_drafter(n, target, bigram) for n in names]
    if spec.head is not None:
        from .head import load_head

        if not isinstance(drafters[0], NeuralDraft):
            raise DraftsimError("an acceptance head needs a neural drafter (its hidden states are the head's input)")
        drafters[0].head = load_head(spec.head, drafters[0].loaded)
    return Method(spec.kind, spec.parsed_policy, spec.policy_spec, drafters, spec.parsed_rule, spec.rule_spec, spec.sequential)


def method_from(kind: str, target: LoadedModel, drafter: str | None = None, policy: str | None = None, rule: str | None = None,
                sequential: bool = False, head: str | None = None) -> Method:
    """:func:`build_method` of a :class:`MethodSpec` in one call (defaults per method)."""
    return build_method(MethodSpec(kind, drafter, policy, rule, sequential, head), target)
