"""Measure a decoding method against autoregressive decoding on real prompts.

:func:`measure` runs, prompt by prompt and alternately (these machines are noisy), the
target's own autoregressive decoding and the method, writes the method's run trace
(:mod:`draftsim.realrun.runs`), and reports tokens/s, speedup, accepted lengths, counts per level,
SWI with the costs measured in the run and quality against the target's output, as a
:class:`Measurement`. Its callers hold it against the simulator
(:func:`draftsim.analysis.reality.held_to_sim`): the CLI (``draftsim run``), the demo and the
benchmark scripts.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import asdict, dataclass, field

import numpy as np

from ..sim.analytic import swi
from ..sim.errors import DraftsimError
from ..sim.replay import fit_costs
from ..sim.traces import RunTrace
from .executor import Sampling, generate
from .methods import Method
from .models import LoadedModel
from .profiling import machine_fingerprint
from .prompts import Prompt, format_prompt
from .runs import RunWriter

__all__ = ["Measurement", "Quality", "measure"]


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


@dataclass(frozen=True)
class Quality:
    """How the method's text compares with the target's own (autoregressive) text.

    ``identical_to_target``: share of prompts with the same output; ``mean_prefix_agreement``:
    mean share of the target's tokens before the first difference; ``answer_accuracy`` (and
    ``_target``): arithmetic answers correct, None without arithmetic prompts; ``target_nll``
    (and ``_target``): mean target negative log-likelihood per token, measured only where the
    text may differ from the target's (lossy rules or sampling), else None.
    """

    identical_to_target: float
    mean_prefix_agreement: float
    answer_accuracy: float | None = None
    answer_accuracy_target: float | None = None
    target_nll: float | None = None
    target_nll_target: float | None = None


@dataclass(frozen=True)
class Measurement:
    """One :func:`measure`: the method and autoregressive decoding of the same prompts.

    Rates are output tokens per wall-clock second of decoding (prefill included);
    ``calls_per_model`` counts forward calls (or proposals, for statistical drafters) per
    model, target first; ``levels`` drafted / accepted per (proposer, verifier) pair, by name;
    ``cost_coefficients`` are fitted to the run's calls (:func:`draftsim.sim.replay.fit_costs`);
    ``swi`` is [CSD]'s standardised walltime improvement with them. ``trace`` is the run
    trace loaded in memory (``trace_path`` is None when it was written to a temporary
    folder); ``tree`` the tree/graph statistics of ssd/tsd/gsd runs.
    """

    target: str
    method: str
    label: str
    policy: str
    rule: str
    sequential: bool
    drafters: list[str]
    prompts: int
    max_new_tokens: int
    sampling: str
    autoregressive_tokens_per_second: float
    tokens_per_second: float
    speedup: float
    tokens: int
    target_calls: int
    mean_accepted_length: float
    acceptance_rate: float
    calls_per_model: list[int]
    levels: list[dict]
    cost_coefficients: list[float]
    swi: float
    quality: Quality
    trace_path: str | None
    tree: dict | None = None
    trace: RunTrace | None = field(default=None, repr=False, compare=False)
    #: The interleaved autoregressive runs' forward calls (:class:`draftsim.sim.records.Call`), one list
    #: per prompt: a measurement of the machine's speed while the method ran
    #: (:func:`draftsim.analysis.reality.run_speed`).
    autoregressive_calls: list | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """Every field but the in-memory trace and calls, JSON-ready (``trace`` is the trace's path)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("trace", "trace_path", "autoregressive_calls")}
        out["trace"] = self.trace_path
        if self.tree is None:
            out.pop("tree")
        return out


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
) -> Measurement:
    """Run ``method`` and autoregressive decoding alternately on ``prompts``; see the module docstring."""
    if not prompts:
        raise DraftsimError("no prompts to decode: give at least one prompt set with --prompts and --n >= 1")
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
        "machine": machine_fingerprint(target.device),
        "cache": "static" if target.static_tokens else "dynamic",
    }
    costs = [d.cost for d in method.drafters if getattr(d, "cost", None) is not None]  # a controlled drafter's cost model
    if costs:  # the path its forwards take, as a profile of it must time them (check-sim reads it)
        meta["controlled_cost_path"] = "server-static" if costs[0].static_tokens else "model"
    writer = RunWriter(trace_dir, meta, resume=resume)
    mode = "greedy" if sampling.greedy else "sampled"
    base = {"tokens": 0, "seconds": 0.0}
    spec = {"tokens": 0, "seconds": 0.0}
    quality = {"identical": 0, "prefix": [], "answers": [], "answers_ar": [], "nll": [], "nll_ar": []}
    logs, ar_calls = [], []
    for prompt in prompts:
        key = f"{prompt.set}-{prompt.id}"
        ids = format_prompt(prompt, target.tokenizer)
        ar = generate(target, ids, max_new_tokens, sampling=sampling, rng=rng)
        base["tokens"] += ar.tokens
        base["seconds"] += ar.seconds
        ar_calls.append(list(ar.calls))
        for d in method.drafters:  # a controlled drafter proposes the target's own output: recorded here, before the timed run
            d.prepare(ids, ar.output)
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
    if tmp is not None:
        tmp.cleanup()
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
    drafted = sum(log.drafted for log in logs)
    accepted = sum(log.accepted for log in logs)
    costs = fit_costs(trace, n_models)
    names = trace.models()

    def mean(values):
        return float(np.mean(values)) if values else None

    return Measurement(
        target=target.name, method=method.kind, label=method.label, policy=method.policy_spec, rule=method.rule_spec,
        sequential=method.sequential, drafters=[d.name for d in method.drafters], prompts=len(prompts),
        max_new_tokens=max_new_tokens, sampling=meta["sampling"],
        autoregressive_tokens_per_second=ar_rate, tokens_per_second=rate, speedup=rate / ar_rate,
        tokens=spec["tokens"], target_calls=target_calls,
        mean_accepted_length=spec["tokens"] / max(target_calls, 1),
        acceptance_rate=accepted / max(drafted, 1),
        calls_per_model=per_model,
        levels=[{"proposer": names[p], "verifier": names[v], "drafted": d, "accepted": a} for (p, v), (d, a) in sorted(levels.items())],
        cost_coefficients=costs.coefficient.tolist(),
        swi=float(swi(per_model, costs.coefficient, max(spec["tokens"], 1))),
        quality=Quality(
            identical_to_target=quality["identical"] / len(prompts),
            mean_prefix_agreement=float(np.mean(quality["prefix"])),
            answer_accuracy=mean(quality["answers"]), answer_accuracy_target=mean(quality["answers_ar"]),
            target_nll=mean(quality["nll"]), target_nll_target=mean(quality["nll_ar"]),
        ),
        trace_path=None if tmp else str(trace_dir),
        tree=method.tree_stats.to_dict() if method.tree_stats is not None else None,
        trace=trace,
        autoregressive_calls=ar_calls,
    )
