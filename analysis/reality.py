"""Simulation against reality: replay a real run's trace in ``sim`` and compare.

For each run trace (:class:`sim.traces.RunTrace`):

1. the acceptance the run observed becomes a :class:`sim.acceptance.TraceDriven` process —
   per (proposer, verifier) pair and output position, whether the token proposed there was
   accepted (the realised flag), and the drafter's confidence in it;
2. the *same policy* (parsed from the run's metadata) is simulated on it by the Monte Carlo
   engine, which stops each sequence where the real text ended;
3. per-call costs t(n) = a + b·n are fitted to the run's own forward-call timings, and the
   simulated calls priced with them give the predicted tokens/s.

For greedy runs of single-drafter policies (any rule) the drafter always sees the final
text, so the replay reproduces the run's counts exactly — target calls, drafted and accepted
tokens. Inside a vertical cascade a drafter may verify a smaller drafter on a context that
the target later rejects, which per-position flags cannot represent: there the counts are a
prediction and their relative error is reported.
"""

from __future__ import annotations

import numpy as np

from sim import montecarlo
from sim.acceptance import TraceDriven
from sim.costs import CallCost, Costs
from sim.errors import DraftsimError
from sim.policies import Autoregressive, parse_policy
from sim.traces import RunTrace

__all__ = ["fit_costs", "replay_process", "check_run", "check_tree_run"]


def _policy(trace: RunTrace):
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


def check_run(trace, seed: int = 0) -> dict:
    """Replay ``trace`` (a :class:`RunTrace` or its path) with its own policy; compare counts
    and tokens/s. Relative errors are (predicted − measured) / measured."""
    trace = trace if isinstance(trace, RunTrace) else RunTrace(trace)
    policy = _policy(trace)
    rounds = trace.rounds.to_pydict()
    real = {
        "tokens": int(sum(len(o) for o in trace.sequences["output_ids"].to_pylist())),
        "target_calls": len(rounds["round"]),
        "drafted": int(sum(rounds["drafted"])),
        "accepted": int(sum(rounds["accepted"])),
    }
    seconds = float(sum(p.get("seconds", 0.0) for p in trace.manifest["prompts"]))
    calls = trace.calls.to_pydict()
    prefill = float(sum(s for k, s in zip(calls["kind"], calls["seconds"]) if k == "prefill"))
    model_seconds = float(sum(s for k, s in zip(calls["kind"], calls["seconds"]) if k != "prefill"))
    out = {"path": str(trace.path), "method": trace.metadata.get("method"), "policy": trace.metadata.get("policy"),
           "mode": trace.metadata.get("sampling"), "sequences": len(trace.entries), "real": real,
           "measured_tokens_per_second": real["tokens"] / seconds if seconds > 0 else float("nan")}
    if policy is None or policy.kind == "tree":
        out["replayable"] = False
        out["reason"] = ("the sequential token cascade has no simulator policy" if policy is None else
                         "tree and graph runs are held against the tree optimiser (analysis.reality.check_tree_run)")
        return out
    M = policy.n_models
    process = replay_process(trace, M)
    counts, _ = montecarlo.run(policy, process, process.n_sequences, None, np.random.default_rng(seed))
    sim = {
        "tokens": int(counts.tokens.sum()),
        "target_calls": int(counts.calls[:, 0].sum()),
        "drafted": int(counts.top_drafted.sum()),
        "accepted": int(counts.top_accepted.sum()),
    }
    costs = fit_costs(trace, M)
    predicted_model = float(costs.time(counts.calls, counts.call_tokens).sum())
    predicted = predicted_model + prefill
    out.update({
        "replayable": True,
        "sim": sim,
        "counts_equal": sim == real,
        "count_errors": {k: (sim[k] - real[k]) / real[k] if real[k] else float(sim[k] != 0) for k in real},
        "costs": [{"a": c.a, "b": c.b} for c in costs.models],
        "predicted_tokens_per_second": sim["tokens"] / predicted if predicted > 0 else float("nan"),
        # Time the run spent outside model calls (Python, sampling, verification): what the
        # cost model leaves out.
        "overhead_share": 1.0 - (model_seconds + prefill) / seconds if seconds > 0 else float("nan"),
        "model_time_error": (predicted_model - model_seconds) / model_seconds if model_seconds > 0 else float("nan"),
    })
    out["tokens_per_second_error"] = out["predicted_tokens_per_second"] / out["measured_tokens_per_second"] - 1.0
    return out


def check_tree_run(trace, tree_stats: dict) -> dict:
    """Hold a tree / graph run against the tree optimiser (:func:`sim.optimize.tree_shape`):
    with the per-rank acceptance the run observed and the call costs fitted to its timings,
    the best tree of at most as many nodes as the run verified per round, its expected
    accepted tokens per round and modelled tokens/s, next to the run's own."""
    from sim.optimize import tree_shape

    trace = trace if isinstance(trace, RunTrace) else RunTrace(trace)
    costs = fit_costs(trace, 2)
    rounds = trace.rounds.to_pydict()
    calls = trace.calls.to_pydict()
    draft = [s for m, k, s in zip(calls["model"], calls["kind"], calls["seconds"]) if m == 1 and k == "draft"]
    n_rounds = max(len(rounds["round"]), 1)
    per_level = float(np.sum(draft)) / max(len(draft), 1)  # one drafter call per tree level
    budget = int(max(rounds["drafted"], default=1))
    target = costs.models[0]
    shape = tree_shape(tree_stats["rank_alphas"] or [0.0], budget, lambda n: target.a + target.b * n, per_level)
    seconds = float(sum(p.get("seconds", 0.0) for p in trace.manifest["prompts"]))
    tokens = int(sum(rounds["emitted"]))
    return {
        "rank_alphas": tree_stats["rank_alphas"],
        "run": {"accepted_per_round": tree_stats["accepted_per_round"], "verified_nodes_per_round": tree_stats["verified_nodes"] / n_rounds,
                "tokens_per_second": tokens / seconds if seconds else float("nan")},
        "optimiser": {"nodes": shape.size, "depth": shape.depth(), "expected_accepted_per_round": shape.expected_accepted,
                      "tokens_per_second": shape.tokens_per_time, "parents": list(shape.parents)},
    }
