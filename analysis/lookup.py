"""Planning lookup drafting (vLLM's ``ngram``, suffix decoding) for a real target on this machine.

A lookup drafter's proposals are a function of the text alone, and greedy speculative decoding
writes the target's own greedy text, so the rounds a greedy run will make are known exactly
once that text is: :func:`lookup_rounds` walks a drafter along it (each round: the proposal
for the context so far, its tokens accepted up to the first that differs from the text, the
target's token after them). :func:`plan_lookup` does this on a pilot — the target's greedy
outputs on prompts it will not be measured on — for every drafter and draft length, prices
the rounds with a profile of the target's forward calls on this machine (t(n), n tokens
verified at the pilot's context) plus the lookups' measured time and the executor's own time
per round, and ranks (drafter, k) by predicted speedup over autoregressive decoding of the
same text. :func:`price_rounds` prices any run's rounds the same way (the prediction for the
rounds that did happen), and :func:`why` says what separates measurement from prediction.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..realrun.drafters import Drafter
from ..realrun.executor import generate
from ..realrun.methods import make_drafter
from ..realrun.prompts import Prompt, format_prompt
from ..sim.errors import DraftsimError

__all__ = ["lookup_rounds", "Pilot", "LookupChoice", "LookupPlan", "run_pilot", "plan_lookup", "price_rounds", "predict_run", "why"]


def lookup_rounds(drafter: Drafter, prompt: list[int], text: list[int], k: int) -> tuple[list[tuple[int, int, int]], float]:
    """The rounds greedy speculative decoding with ``drafter`` drafting up to ``k`` tokens
    makes while it writes ``text`` after ``prompt`` (the target's greedy output, ending at EOS
    or the token budget): (proposed, accepted, emitted) per round — proposed as the target
    verified it (a budget of the tokens still to write), accepted and emitted cut at the
    text's end, as :func:`draftsim.realrun.executor.decode` counts them — and the seconds the
    proposals took."""
    rounds, seconds, pos, L = [], 0.0, 0, len(text)
    while pos < L:
        t0 = time.perf_counter()
        proposal = drafter.propose(prompt + text[:pos], min(k, L - pos), prompt_len=len(prompt))[0]
        seconds += time.perf_counter() - t0
        n = 0
        while n < len(proposal) and pos + n < L and proposal[n] == text[pos + n]:
            n += 1
        emitted = min(n + 1, L - pos)
        rounds.append((len(proposal), n, emitted))
        pos += emitted
    return rounds, seconds


@dataclass
class Pilot:
    """The target's greedy texts on the pilot prompts, and what this machine charges: ``verify``
    [n − 1] the median seconds of a forward call verifying n tokens (n = 1: a plain decoding
    step) at ``context``, ``overhead`` the executor's own seconds per round, ``prefill`` the
    prompts' prefill seconds (all measured)."""

    prompts: list[list[int]]
    texts: list[list[int]]
    verify: list[float]
    context: int
    overhead: float
    prefill: float

    def step(self, proposed: int) -> float:
        """Seconds of a round whose target call verifies ``proposed`` tokens (+ its own)."""
        if proposed + 1 > len(self.verify):
            raise DraftsimError(f"the pilot's profile covers drafts of up to {len(self.verify) - 1} tokens; got {proposed}")
        return self.verify[proposed] + self.overhead


@dataclass(frozen=True)
class LookupChoice:
    """One (drafter, k) on the pilot: its rounds' totals and predicted speedup."""

    drafter: str
    k: int
    rounds: int
    tokens: int
    proposing_rounds: int
    proposed: int
    accepted: int
    lookup_seconds: float
    predicted_seconds: float
    autoregressive_seconds: float

    @property
    def speedup(self) -> float:
        return self.autoregressive_seconds / self.predicted_seconds

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / max(self.rounds, 1)

    def to_dict(self) -> dict:
        return {**asdict(self), "speedup": self.speedup, "tokens_per_call": self.tokens_per_call}


@dataclass
class LookupPlan:
    """Every (drafter, k) on the pilot, best predicted speedup first, and the pilot."""

    choices: list[LookupChoice]
    pilot: Pilot = field(repr=False)

    @property
    def best(self) -> LookupChoice:
        return self.choices[0]

    def to_dict(self) -> dict:
        p = self.pilot
        return {"choices": [c.to_dict() for c in self.choices], "pilot_prompts": len(p.prompts),
                "pilot_tokens": sum(map(len, p.texts)), "verify_seconds": list(p.verify), "context": p.context,
                "overhead_seconds_per_round": p.overhead}


def run_pilot(target, prompts: list[Prompt], max_new_tokens: int, k_max: int, repeats: int = 5, progress=None) -> Pilot:
    """The target's greedy outputs on ``prompts`` (its own autoregressive decoding, timed) and
    a profile of its forward calls verifying 1 … k_max + 1 tokens at their mean context;
    ``progress(what)`` is told as each prompt's text is done, naming the next step."""
    from ..realrun.profiling import profile_model

    ids, texts, overhead, prefill, rounds = [], [], 0.0, 0.0, 0
    for p in prompts:
        prompt = format_prompt(p, target.tokenizer)
        log = generate(target, prompt, max_new_tokens)
        ids.append(prompt)
        texts.append(list(log.output))
        overhead += sum(r.overhead_seconds for r in log.rounds)
        rounds += len(log.rounds)
        prefill += log.prefill_seconds
        if progress is not None:
            progress(f"greedy text {len(texts)}/{len(prompts)} done" + ("; profiling" if len(texts) == len(prompts) else ""))
    context = int(np.mean([len(a) + len(t) / 2 for a, t in zip(ids, texts)]))
    prof = profile_model(target, [1], list(range(1, k_max + 2)), [context], repeats=repeats, last_row=False)
    verify = [float(prof.shape_time(1, n, context)) for n in range(1, k_max + 2)]
    return Pilot(ids, texts, verify, context, overhead / max(rounds, 1), prefill)


def price_rounds(pilot: Pilot, rounds: list[tuple[int, int, int]], lookup_seconds: float = 0.0) -> float:
    """Predicted seconds of ``rounds`` (proposed, accepted, emitted) on this machine."""
    return float(sum(pilot.step(d) for d, _, _ in rounds) + lookup_seconds)


def predict_run(pilot: Pilot, trace) -> float:
    """The speedup the pilot's profile predicts for a measured run's own rounds (a
    :class:`draftsim.sim.traces.RunTrace`): its prefill and lookups as measured, its target calls
    priced by the profile, against autoregressive decoding of the same tokens."""
    rounds = trace.rounds.to_pydict()
    calls = trace.calls.to_pydict()
    prefill = sum(s for k, s in zip(calls["kind"], calls["seconds"]) if k == "prefill")
    lookup = sum(s for model, s in zip(calls["model"], calls["seconds"]) if model == 1)
    autoregressive = prefill + pilot.step(0) * sum(rounds["emitted"])
    return autoregressive / (prefill + price_rounds(pilot, list(zip(rounds["drafted"], rounds["accepted"], rounds["emitted"])), lookup))


def plan_lookup(target, pilot: Pilot, drafters=("ngram", "suffix"), ks=range(1, 7)) -> LookupPlan:
    """Rank every (lookup drafter, k) by its predicted speedup on the pilot's texts."""
    choices = []
    autoregressive = pilot.prefill + sum(pilot.step(0) * len(t) for t in pilot.texts)
    for name in drafters:
        for k in ks:
            drafter = make_drafter(name, target)
            rounds, lookup = [], 0.0
            for prompt, text in zip(pilot.prompts, pilot.texts):
                r, s = lookup_rounds(drafter, prompt, text, k)
                rounds += r
                lookup += s
                drafter.finish(prompt, text)  # as a run does: suffix decoding remembers the output
            choices.append(LookupChoice(
                name, int(k), len(rounds), sum(e for _, _, e in rounds), sum(1 for d, _, _ in rounds if d), sum(d for d, _, _ in rounds),
                sum(a for _, a, _ in rounds), lookup, pilot.prefill + price_rounds(pilot, rounds, lookup), autoregressive))
    choices.sort(key=lambda c: -c.speedup)
    return LookupPlan(choices, pilot)


def why(measured: dict, predicted_on_run: float, choice: LookupChoice, pilot: Pilot) -> list[str]:
    """What the run did against what the pilot predicted, in sentences: the text (tokens per
    target call, rounds with a proposal) and the machine (the speed of its calls)."""
    rounds = measured["target_calls"]
    tpc = measured["mean_accepted_length"]
    lines = [f"the test prompts gave {tpc:.2f} tokens per target call (pilot {choice.tokens_per_call:.2f}); "
             f"a call verifying {choice.k + 1} tokens costs {pilot.verify[choice.k] / pilot.verify[0]:.2f}x a one-token step on this machine"]
    speed = measured["speedup"]
    if predicted_on_run > 0:
        lines.append(f"priced with the same profile, this run's own rounds predict {predicted_on_run:.2f}x; "
                     f"measured {speed:.2f}x ({speed / predicted_on_run - 1:+.0%}: what the profile does not price — the machine's "
                     "speed during the run, the run's own contexts)")
    if speed < 1.0:
        proposing = measured.get("proposing_rounds")
        if tpc < pilot.verify[choice.k] / pilot.verify[0]:
            lines.append("it does not pay: the tokens gained per target call do not cover the longer verification"
                         + (f" (a proposal in {proposing / max(rounds, 1):.0%} of rounds)" if proposing is not None else ""))
        else:
            lines.append("it does not pay although the text repeated as predicted: the machine ran the calls slower than profiled")
    return lines
