"""Replay of a real run in ``sim``: a run trace's realised acceptance as an acceptance
process, its forward-call timings as call costs, and the run's own policy.

For each run trace (:class:`draftsim.sim.traces.RunTrace`):

- :func:`replay_process` — per (proposer, verifier) pair and output position, whether the
  token proposed there was accepted (the realised flag), and the drafter's confidence in it,
  as a :class:`draftsim.sim.acceptance.TraceDriven` process;
- :func:`run_policy` — the *same policy* the run used, parsed from its metadata; for a
  drafter whose proposals vary in length with the text (the lookup drafters ``ngram`` and
  ``suffix``, which propose nothing where the context has no match), :class:`RecordedLengths`
  — the lengths it proposed, round by round, as the trace recorded them;
- :func:`run_pricing` — per model a measured cost table (a profile of the model, or the
  run's own calls: mean seconds per tokens fed) and the executor's overhead per round;
  :func:`fit_costs` — per-call costs t(n) = a + b·n fitted to the run's forward calls (the
  papers' cost coefficients of a run).

:mod:`draftsim.analysis.reality` simulates the policy on the process with the Monte Carlo engine and
compares prediction with measurement. For greedy runs of single-drafter policies (any rule)
the drafter always sees the final text, so the replay reproduces the run's counts exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .acceptance import TraceDriven
from .cost import ProfileCost
from .cost.linear import CallCost, Costs
from .errors import DraftsimError
from .policies import Autoregressive, Block, Policy, parse_policy
from .traces import RunTrace

__all__ = ["fit_costs", "replay_process", "run_policy", "RecordedLengths", "VARIABLE_PROPOSALS", "RunPricing", "run_pricing",
           "run_context", "isotonic"]

#: Drafters whose proposal length is decided by the text, not by a policy: realrun's lookup
#: drafters (vLLM's ``ngram``, suffix decoding), which propose up to k tokens and none where
#: the context has no match.
VARIABLE_PROPOSALS = ("ngram", "suffix")


class RecordedLengths(Policy):
    """A run's own draft lengths: drafter 1 drafts, per sequence and round, as many tokens as
    the run's drafter proposed at that output position (``lengths[sequence][start]``; 0 where
    it proposed nothing). What a lookup drafter proposes is a property of the text — no sim
    policy decides it — so its run is replayed with the lengths it recorded, as its acceptance
    is replayed with the flags it recorded. ``spec`` is the run's own policy (its k)."""

    memoryless = False

    def __init__(self, lengths: list[dict[int, int]], spec: str, k_max: int = 0):
        self.spec = spec
        self._lengths = lengths
        # the run's own bound (its draft window: a KV pool reserves it) when given, else the longest proposal
        self._max = max([max(d.values(), default=0) for d in lengths] + [int(k_max)])

    @classmethod
    def from_trace(cls, trace: RunTrace) -> "RecordedLengths":
        lengths = []
        for entry in trace.entries:
            r = entry["rounds"].select(["start", "drafted"]).to_pydict()
            lengths.append({int(s): int(d) for s, d in zip(r["start"], r["drafted"])})
        return cls(lengths, trace.metadata["policy"])

    def init(self, n: int) -> dict:
        return {"pos": np.zeros(n, dtype=np.int64)}

    def begin_round(self, state):
        pos = state["pos"]
        steps = np.array([self._lengths[i].get(int(p), 0) if i < len(self._lengths) else 0 for i, p in enumerate(pos)], dtype=np.int64)
        return (Block(1, steps),)

    def end_round(self, state, drafted, accepted):
        state["pos"] = state["pos"] + np.asarray(accepted, dtype=np.int64) + 1

    @property
    def max_draft(self) -> int:
        return self._max


def run_policy(trace: RunTrace) -> Policy | None:
    """The policy ``trace`` was run with (None for the sequential token cascade, which has no
    simulator policy); for a lookup drafter (:data:`VARIABLE_PROPOSALS`) the lengths it
    proposed (:class:`RecordedLengths`)."""
    meta = trace.metadata
    if meta.get("method") == "ar":
        return Autoregressive()
    if meta.get("sequential"):
        return None
    policy = parse_policy(meta["policy"])
    drafters = meta.get("drafters") or []
    if policy.kind == "chain" and len(drafters) == 1 and drafters[0] in VARIABLE_PROPOSALS:
        return RecordedLengths.from_trace(trace)
    return policy


def fit_costs(trace: RunTrace, n_models: int) -> Costs:
    """Per model, t(n) = a + b·n by least squares over its forward calls (n = tokens fed);
    a statistical drafter (no forward calls) costs its proposal time per proposed token."""
    calls = trace.calls.to_pydict()
    drafts = trace.drafts.to_pydict()
    out = []
    for m in range(n_models):
        sel = [i for i, (model, kind) in enumerate(zip(calls["model"], calls["kind"])) if model == m and kind != "prefill"]
        n = np.array([calls["n_tokens"][i] for i in sel], dtype=np.float64)
        t = np.array([calls["seconds"][i] for i in sel], dtype=np.float64)
        if not len(sel):
            if m == 0:
                raise DraftsimError(f"run trace {trace.path} has no target calls")
            out.append(CallCost(0.0))
            continue
        if n.max() == 0:  # a statistical drafter: its calls are proposals of several tokens
            proposed = sum(1 for p, v in zip(drafts["proposer"], drafts["verifier"]) if p == m)
            out.append(CallCost(t.sum() / max(proposed, 1)))
            continue
        if np.ptp(n) > 0:
            b, a = np.polyfit(n, t, 1)
            if a < 0 or b < 0:  # keep the model physical
                a, b = (0.0, t.sum() / n.sum()) if a < 0 else (t.mean(), 0.0)
        else:
            a, b = t.mean(), 0.0
        out.append(CallCost(max(a, 0.0) if m else max(a, 1e-9), max(b, 0.0)))
    return Costs(tuple(out))


def replay_process(trace: RunTrace, n_models: int) -> TraceDriven:
    """The run's realised acceptance as a trace-driven process.

    Each outcome is kept per (round start, draft index) — a position drafted past a
    rejection is drafted again from another context next round — and, as a fallback, per
    position (last outcome). Tokens are attributed to the plan block they came out of (for
    a vertical cascade, the drafter whose speculative round passed them up), which is how
    the simulators see them.
    """
    pairs = [(m, v) for m in range(1, max(n_models, 2)) for v in range(m)]
    data = {pair: [] for pair in pairs}
    rounds = {pair: [] for pair in pairs}
    confidence, round_conf = [], []
    for entry in trace.entries:
        length = len(entry["sequences"]["output_ids"][0].as_py())
        # What the drafter observed about its token: the head's prediction when the run had one.
        seen = "pred" if trace.metadata.get("head") else "conf"
        d = entry["drafts"].select(["verifier", "block", "position", "index", seen, "accepted"]).to_pydict()
        d["conf"] = d.pop(seen)
        width = max(d["index"], default=0) + 1
        flags = {pair: np.zeros(length) for pair in pairs}
        by_round = {pair: np.full((length, width), np.nan) for pair in pairs}
        conf = np.ones(length)
        conf_round = np.full((length, width), np.nan)
        for ver, blk, pos, i, c, acc in zip(d["verifier"], d["block"], d["position"], d["index"], d["conf"], d["accepted"]):
            if pos >= length or (blk, ver) not in flags:
                continue
            flags[(blk, ver)][pos] = float(acc)
            by_round[(blk, ver)][pos - i, i] = float(acc)
            if ver == 0:
                conf[pos] = c
                conf_round[pos - i, i] = c
        for pair in pairs:
            data[pair].append(flags[pair])
            rounds[pair].append(by_round[pair])
        confidence.append(np.clip(conf, 0.0, 1.0))
        round_conf.append(np.clip(conf_round, 0.0, 1.0))
    return TraceDriven(data, confidence=confidence, rounds=rounds, round_confidence=round_conf)


# ---------------------------------------------------------------- pricing a replayed run


@dataclass(frozen=True)
class RunPricing:
    """How a replayed run is priced (:func:`run_pricing`).

    ``models[m]`` is model m's cost model, asked for one call of n new tokens at the run's
    mean ``context`` (batch 1), or None for a statistical drafter, which costs
    ``per_proposal[m]`` seconds per proposed token (its proposals are not forward calls);
    ``sources[m]`` says where each came from: ``"run"`` (a table of the run's own calls:
    mean seconds per number of tokens fed) or a profile file. The executor's own time per
    round (planning, bookkeeping, verification arithmetic) is ``overhead_round`` +
    ``overhead_token`` × emitted tokens, fitted to the rounds the run recorded.
    """

    models: tuple
    per_proposal: tuple[float, ...]
    sources: tuple[str, ...]
    context: int
    overhead_round: float
    overhead_token: float

    def call_seconds(self, calls: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Seconds of model calls per row of per-model ``calls`` and ``tokens`` fed, arrays
        (..., n_models): each model's calls priced at their mean tokens per call."""
        calls = np.asarray(calls, dtype=np.float64)
        tokens = np.asarray(tokens, dtype=np.float64)
        total = np.zeros(calls.shape[:-1])
        for m in range(calls.shape[-1]):
            c, t = calls[..., m], tokens[..., m]
            if self.models[m] is None:
                total += c * self.per_proposal[m]
                continue
            n = np.where(c > 0, np.rint(t / np.maximum(c, 1)), 1).astype(np.int64)
            total += c * self.models[m].shape_time(1, np.maximum(n, 1), self.context)
        return total

    def recorded_call_seconds(self, model, n_tokens, rows=None) -> float:
        """Total seconds of individual calls (``model`` and ``n_tokens`` fed, one entry per
        call), each priced at its own size; ``rows``: the logit rows each call kept (default
        all it fed; a profile with a last-row table prices only those)."""
        model = np.asarray(model, dtype=np.int64)
        n_tokens = np.asarray(n_tokens, dtype=np.int64)
        rows = n_tokens if rows is None else np.asarray(rows, dtype=np.int64)
        total = 0.0
        for m in np.unique(model):
            sel = model == m
            n = n_tokens[sel]
            if m >= len(self.models):
                continue
            if self.models[m] is None:
                total += self.per_proposal[m] * len(n)
            else:
                total += float(np.sum(self.models[m].shape_time(1, np.maximum(n, 1), self.context, rows=np.maximum(rows[sel], 1))))
        return total

    def overhead_seconds(self, rounds, emitted) -> np.ndarray:
        """The executor's own time for ``rounds`` rounds that emitted ``emitted`` tokens."""
        return self.overhead_round * np.asarray(rounds, dtype=np.float64) + self.overhead_token * np.asarray(emitted, dtype=np.float64)

    def describe(self) -> dict:
        return {"sources": list(self.sources), "context": self.context,
                "overhead": {"per_round": self.overhead_round, "per_token": self.overhead_token}}


def isotonic(values, weights) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool
    adjacent violators). A bigger call never takes less time; noisy means that say otherwise
    are pooled, each weighted by its number of calls, instead of raised to a running maximum
    (which would price the common call at a rare slow one)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, count of values]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v2, w2, c2), (v1, w1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return np.array([v for v, _, c in blocks for _ in range(c)])


def _run_table(name: str, n: np.ndarray, t: np.ndarray, context: int) -> ProfileCost:
    """A model's own calls in a run as a measured cost table: mean seconds per tokens fed (the
    mean, not the median: a run's time is a sum, and noise skews call times upwards)."""
    sizes, counts = np.unique(n, return_counts=True)
    seconds = isotonic([float(np.mean(t[n == s])) for s in sizes], counts)
    return ProfileCost(model=name, batch=(1,), new_tokens=tuple(int(s) for s in sizes), context=(int(context),),
                       seconds=seconds.reshape(1, -1, 1), extrapolate="clamp")


def seeded(model: str) -> str:
    """A model's name with its seed spelled out: ``random:NAME`` and ``tiny`` are seed 0, the names
    their loaded models carry (``random:NAME:0``, ``tiny:0``)."""
    if model.startswith("random:") and model.count(":") == 1:
        return model + ":0"
    return "tiny:0" if model == "tiny" else model


def run_context(trace: RunTrace) -> int:
    """The run's mean context: prompt length plus half the output, averaged over sequences."""
    seq = trace.sequences.to_pydict()
    lengths = [len(p) + len(o) / 2 for p, o in zip(seq["prompt_ids"], seq["output_ids"])]
    return int(round(float(np.mean(lengths)))) if lengths else 0


@dataclass(frozen=True)
class StaticCalls:
    """A profile of the static path (``profile --path server-static``) asked for a single-stream
    run's calls as ``run --static-cache`` makes them: a chain's forwards run at their padded shape
    (:func:`draftsim.sim.cost.profile.static_shape`: 5 new tokens as 8, attention over the next power
    of two), so each is priced at the profile's grid point of that shape, keeping the rows the call
    fed; a shape the grid holds no point of is interpolated as a plain profile would be."""

    profile: ProfileCost

    def shape_time(self, batch, new_tokens, context=0, rows=None) -> np.ndarray:
        b, n, c = np.broadcast_arrays(*(np.asarray(x) for x in (batch, new_tokens, context)))
        kept = n if rows is None else np.broadcast_to(np.asarray(rows), n.shape)
        t = self.profile.static_time(b, n, c, rows=kept, max_rows=1)
        miss = np.isnan(t)
        if miss.any():
            t = np.array(t, dtype=np.float64)
            t[miss] = self.profile.shape_time(b[miss], n[miss], c[miss], rows=None if rows is None else kept[miss])
        return t[()]


def run_pricing(trace: RunTrace, n_models: int, profiles=(), padded: bool = False) -> RunPricing:
    """Price a run's replay: per model, a measured cost table — a profile of that model
    (``profiles``: :class:`draftsim.sim.cost.ProfileCost` objects, matched to the run's models by name;
    their drafter entries price Max-Gram and bigram proposals) or else the run's own calls —
    and the executor's overhead per round fitted to the run's rounds (a least-squares
    a + b·emitted, kept non-negative). Replaces the a + b·n fit of :func:`fit_costs`, which
    cannot follow the step a CPU forward takes from 1 to 2 new tokens. ``padded``: the run's forwards
    went through a static cache at padded shapes (a chain's, ``run --static-cache``): profiles price
    them as :class:`StaticCalls`."""
    calls = trace.calls.to_pydict()
    drafts = trace.drafts.to_pydict()
    names = trace.models() or [f"model {m}" for m in range(n_models)]
    context = run_context(trace)
    by_name = {p.model: p for p in profiles}
    # controlled:R@MODEL: MODEL's forwards (MODEL as the user spelled it: random:NAME is random:NAME:0, the name its profile has)
    costs = {seeded(n.partition("@")[2]): n for n in names if n.startswith("controlled") and "@" in n}
    for prof in profiles:
        if prof.model not in names and seeded(prof.model) not in costs and not set(prof.drafters) & set(names):
            raise DraftsimError(f"the profile of {prof.model} prices no model of this run (models: {', '.join(names)}); "
                                "profile the run's target or drafters with draftsim profile")
    kind = np.array(calls["kind"], dtype=object)
    model = np.array(calls["model"], dtype=np.int64)
    n_fed = np.array(calls["n_tokens"], dtype=np.int64)
    secs = np.array(calls["seconds"], dtype=np.float64)
    # A verification that carried the prompt's prefill is a prefill for pricing purposes.
    kind[np.array(calls.get("prompt_tokens", [0] * len(n_fed)), dtype=np.int64) > 0] = "prefill"
    models, per_proposal, sources = [], [], []
    for m in range(n_models):
        name = names[m] if m < len(names) else f"model {m}"
        sel = (model == m) & (kind != "prefill")
        statistical = m > 0 and (not sel.any() or n_fed[sel].max() == 0)
        if statistical:
            drafter_profile = next((p for p in profiles if name in p.drafters), None)
            cost_profile = next((p for p in profiles if costs.get(seeded(p.model)) == name), None)
            models.append(None)
            if cost_profile is not None:  # the controlled drafter: one forward of its cost model per proposed token, fed alone
                per_proposal.append(float(cost_profile.shape_time(1, 1, 0)))
                sources.append(f"profile of {cost_profile.model} (controlled drafter's cost model)")
            elif drafter_profile is not None:
                entry = drafter_profile.drafters[name]
                per_proposal.append(float(entry["seconds_per_token"] if isinstance(entry, dict) else entry))
                sources.append(f"profile {drafter_profile.model} (drafter {name})")
            else:
                proposed = sum(1 for p in drafts["proposer"] if p == m)
                per_proposal.append(float(secs[sel].sum()) / max(proposed, 1))
                sources.append("run")
            continue
        per_proposal.append(0.0)
        if name in by_name:
            prof = by_name[name]
            used = n_fed[sel]
            if used.size:
                prof.shape_time(1, np.array([used.min(), used.max()]), context)  # refuses shapes outside its grid
            models.append(StaticCalls(prof) if padded else prof)
            sources.append(f"profile of {name}" + (" at the static cache's padded shapes" if padded else ""))
            continue
        if not sel.any():
            if m == 0:
                raise DraftsimError(f"run trace {trace.path} has no target calls")
            models.append(None)
            sources.append("none (no calls)")
            continue
        models.append(_run_table(name, n_fed[sel], secs[sel], context))
        sources.append("run")
    rounds = trace.rounds.to_pydict()
    over = np.array(rounds.get("overhead_seconds", []), dtype=np.float64)
    emitted = np.array(rounds["emitted"], dtype=np.float64)
    o_round, o_token = 0.0, 0.0
    if over.size:
        if np.ptp(emitted) > 0:
            o_token, o_round = np.polyfit(emitted, over, 1)
            if o_round < 0 or o_token < 0:
                o_round, o_token = (0.0, over.sum() / emitted.sum()) if o_round < 0 else (over.mean(), 0.0)
        else:
            o_round = float(over.mean())
    return RunPricing(tuple(models), tuple(per_proposal), tuple(sources), context, float(max(o_round, 0.0)), float(max(o_token, 0.0)))
