"""Measure a decoding method against autoregressive decoding on real prompts.

:func:`measure` runs, prompt by prompt and alternately (these machines are noisy), the
target's own autoregressive decoding and the method, writes the method's run trace
(:mod:`realrun.runs`), and reports tokens/s, speedup, accepted lengths, counts per level,
SWI with the costs measured in the run, quality against the target's output, and the
simulator's replay of the run (:func:`analysis.reality.check_run`). The CLI (``draftsim
run``), the demo and the benchmark scripts all call it.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field

import numpy as np

from sim.analytic import swi
from sim.errors import DraftsimError
from sim.policies import Autoregressive, Policy
from sim.rules import SD, Rule

from .drafters import Drafter
from .executor import RunLog, Sampling, generate, token_cascade
from .models import LoadedModel
from .prompts import Prompt, format_prompt
from .runs import RunWriter

__all__ = ["Method", "measure", "METHODS"]

METHODS = ("ar", "sd", "csd", "cascade", "ssd", "tsd", "gsd")
TREE_METHODS = ("ssd", "tsd", "gsd")


@dataclass
class Method:
    """What to run: ``kind`` (ar, sd, csd, cascade), the policy (and its command-line spec),
    drafters (models 1, 2, …), the target-level rule, and for cascades whether to run the
    sequential token cascade ([SC] Algorithm 2) instead of speculative cascades."""

    kind: str
    policy: Policy = field(default_factory=Autoregressive)
    policy_spec: str = "ar"
    drafters: list = field(default_factory=list)
    rule: Rule = field(default_factory=SD)
    rule_spec: str = "sd"
    sequential: bool = False
    tree_stats: object = None

    def __post_init__(self):
        if self.kind not in METHODS:
            raise DraftsimError(f"method must be one of {', '.join(METHODS)}; got {self.kind!r}")
        if self.kind in ("sd", "csd", *TREE_METHODS) and not self.rule.lossless:
            raise DraftsimError(f"method {self.kind} is lossless; rule {self.rule_spec} is lossy — use --method cascade")
        if self.kind in TREE_METHODS:
            from .trees import TreeStats

            if self.policy.kind != "tree":
                raise DraftsimError(f"method {self.kind} needs a tree policy (e.g. tree:width=3,depth=4); got {self.policy_spec}")
            if self.kind == "ssd" and self.policy.width != 1:
                raise DraftsimError("method ssd drafts a chain: tree:width=1,depth=K")
            if self.kind == "tsd" and self.policy.merge:
                raise DraftsimError("method tsd drafts a tree: leave merge=0 (merging makes it gsd)")
            if self.kind == "gsd" and not self.policy.merge:
                raise DraftsimError("method gsd merges repeated m-grams: give merge=M (e.g. merge=2)")
            self.tree_stats = TreeStats()
        elif self.policy.kind == "tree":
            raise DraftsimError(f"a tree policy runs with --method ssd, tsd or gsd; got --method {self.kind}")

    @property
    def head_path(self) -> str | None:
        """Where drafter 1's acceptance head came from, if it has one."""
        head = getattr(self.drafters[0], "head", None) if self.drafters else None
        return None if head is None else str(getattr(head, "path", ""))

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
        return generate(target, ids, max_new_tokens, self.policy, sampling=sampling, rule=self.rule, rng=rng, drafters=self.drafters)


def _prefix_fraction(a: list[int], b: list[int]) -> float:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n / max(len(b), 1)


def _target_nll(target: LoadedModel, ids: list[int], output: list[int]) -> float:
    """Mean negative log-likelihood per token of ``output`` after ``ids`` under the target
    (one teacher-forced forward; lower is closer to what the target itself would write)."""
    import torch

    if not output:
        return float("nan")
    with torch.inference_mode():
        x = torch.tensor([list(ids) + list(output)], device=target.device)
        logits = target.model(x).logits[0, len(ids) - 1 : -1].double()
        logp = torch.log_softmax(logits, dim=-1)[torch.arange(len(output)), torch.tensor(output)]
    return float(-logp.mean())


def _answer_correct(prompt: Prompt, text: str) -> bool | None:
    if prompt.answer is None:
        return None
    return re.search(rf"(?<![\d.]){re.escape(prompt.answer)}(?![\d])", text.replace(",", "")) is not None


def measure(
    target: LoadedModel,
    method: Method,
    prompts: list[Prompt],
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    seed: int = 0,
    trace_dir=None,
    resume: bool = False,
    progress=None,
    check: bool = True,
) -> dict:
    """Run ``method`` and autoregressive decoding alternately on ``prompts``; see the module docstring."""
    from analysis.reality import check_run, fit_costs

    rng = np.random.default_rng(seed)
    tmp = None
    if trace_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="draftsim-run-")
        trace_dir = tmp.name + "/trace"
    meta = {
        "target": target.name, "models": [target.name] + [d.name for d in method.drafters], "drafters": [d.name for d in method.drafters],
        "method": method.kind, "policy": method.policy_spec, "rule": method.rule_spec, "sequential": method.sequential,
        "head": method.head_path,
        "prompt_set": sorted({p.set for p in prompts}), "max_new_tokens": max_new_tokens,
        "sampling": "greedy" if sampling.greedy else f"temperature={sampling.temperature:g},top_k={sampling.top_k}", "seed": seed,
    }
    writer = RunWriter(trace_dir, meta, resume=resume)
    mode = "greedy" if sampling.greedy else "sampled"
    base = {"tokens": 0, "seconds": 0.0}
    spec = {"tokens": 0, "seconds": 0.0}
    quality = {"identical": 0, "prefix": [], "answers": [], "answers_ar": [], "nll": [], "nll_ar": []}
    logs = []
    for prompt in prompts:
        key = f"{prompt.set}-{prompt.id}"
        ids = format_prompt(prompt, target.tokenizer)
        ar = generate(target, ids, max_new_tokens, sampling=sampling, rng=rng)
        base["tokens"] += ar.tokens
        base["seconds"] += ar.seconds
        log = ar if method.kind == "ar" else method.run(target, ids, max_new_tokens, sampling, rng)
        spec["tokens"] += log.tokens
        spec["seconds"] += log.seconds
        logs.append(log)
        if key not in writer.done:
            writer.commit(key, log, prompt, ids, mode, -1 if sampling.greedy else seed, prompt_id=prompt.id, set=prompt.set)
        quality["identical"] += int(log.output == ar.output)
        quality["prefix"].append(_prefix_fraction(log.output, ar.output))
        if method.kind == "cascade" or not sampling.greedy:  # lossless greedy output is the target's own text
            quality["nll"].append(_target_nll(target, ids, log.output))
            quality["nll_ar"].append(_target_nll(target, ids, ar.output))
        ok = _answer_correct(prompt, target.tokenizer.decode(log.output))
        if ok is not None:
            quality["answers"].append(ok)
            quality["answers_ar"].append(_answer_correct(prompt, target.tokenizer.decode(ar.output)))
        if progress is not None:
            progress(1)
    trace = writer.load()
    ar_rate = base["tokens"] / base["seconds"]
    rate = spec["tokens"] / spec["seconds"]
    # Counts of this call's generations (a resumed trace may hold earlier ones too).
    n_models = 1 + len(method.drafters)
    per_model = np.sum([log.calls_per_model(n_models) for log in logs], axis=0).tolist()
    target_calls = sum(log.target_calls for log in logs)
    levels: dict = {}
    for log in logs:
        for pair, e in log.levels().items():
            total = levels.setdefault(pair, [0, 0])
            total[0] += e["drafted"]
            total[1] += e["accepted"]
    drafted = sum(r["drafted"] for log in logs for r in log.rounds)
    accepted = sum(r["accepted"] for log in logs for r in log.rounds)
    costs = fit_costs(trace, n_models)
    out = {
        "target": target.name, "method": method.kind, "label": method.label, "policy": method.policy_spec, "rule": method.rule_spec,
        "sequential": method.sequential, "drafters": [d.name for d in method.drafters], "prompts": len(prompts),
        "max_new_tokens": max_new_tokens, "sampling": meta["sampling"],
        "autoregressive_tokens_per_second": ar_rate, "tokens_per_second": rate, "speedup": rate / ar_rate,
        "tokens": spec["tokens"], "target_calls": target_calls,
        "mean_accepted_length": spec["tokens"] / max(target_calls, 1),
        "acceptance_rate": accepted / max(drafted, 1),
        "calls_per_model": per_model,
        "levels": [{"proposer": trace.models()[p], "verifier": trace.models()[v], "drafted": d, "accepted": a}
                   for (p, v), (d, a) in sorted(levels.items())],
        "cost_coefficients": costs.coefficient.tolist(),
        "swi": float(swi(per_model, costs.coefficient, max(spec["tokens"], 1))),
        "quality": {
            "identical_to_target": quality["identical"] / len(prompts),
            "mean_prefix_agreement": float(np.mean(quality["prefix"])),
            "answer_accuracy": float(np.mean(quality["answers"])) if quality["answers"] else None,
            "answer_accuracy_target": float(np.mean(quality["answers_ar"])) if quality["answers_ar"] else None,
            "target_nll": float(np.mean(quality["nll"])) if quality["nll"] else None,
            "target_nll_target": float(np.mean(quality["nll_ar"])) if quality["nll_ar"] else None,
        },
        "trace": None if tmp else str(trace_dir),
    }
    if method.tree_stats is not None:
        from analysis.reality import check_tree_run

        out["tree"] = method.tree_stats.to_dict()
        out["tree_check"] = check_tree_run(trace, out["tree"])
    if check:
        out["sim_check"] = check_run(trace, seed=seed)
    if tmp is not None:
        tmp.cleanup()
    return out
