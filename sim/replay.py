"""Replay of a real run in ``sim``: a run trace's realised acceptance as an acceptance
process, its forward-call timings as call costs, and the run's own policy.

For each run trace (:class:`sim.traces.RunTrace`):

- :func:`replay_process` — per (proposer, verifier) pair and output position, whether the
  token proposed there was accepted (the realised flag), and the drafter's confidence in it,
  as a :class:`sim.acceptance.TraceDriven` process;
- :func:`run_policy` — the *same policy* the run used, parsed from its metadata;
- :func:`fit_costs` — per-call costs t(n) = a + b·n fitted to the run's forward calls.

:mod:`analysis.reality` simulates the policy on the process with the Monte Carlo engine and
compares prediction with measurement. For greedy runs of single-drafter policies (any rule)
the drafter always sees the final text, so the replay reproduces the run's counts exactly.
"""

from __future__ import annotations

import numpy as np

from .acceptance import TraceDriven
from .costs import CallCost, Costs
from .errors import DraftsimError
from .policies import Autoregressive, Policy, parse_policy
from .traces import RunTrace

__all__ = ["fit_costs", "replay_process", "run_policy"]


def run_policy(trace: RunTrace) -> Policy | None:
    """The policy ``trace`` was run with (None for the sequential token cascade, which has no
    simulator policy)."""
    meta = trace.metadata
    if meta.get("method") == "ar":
        return Autoregressive()
    if meta.get("sequential"):
        return None
    return parse_policy(meta["policy"])


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
