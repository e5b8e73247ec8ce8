"""Simulation against reality: replay a real run's trace in ``sim`` and compare.

For each run trace (:class:`sim.traces.RunTrace`), with the pieces of :mod:`sim.replay`:

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
from sim.replay import fit_costs, replay_process, run_policy
from sim.traces import RunTrace

__all__ = ["check_run", "check_tree_run", "held_to_sim"]


def check_run(trace, seed: int = 0) -> dict:
    """Replay ``trace`` (a :class:`RunTrace` or its path) with its own policy; compare counts
    and tokens/s. Relative errors are (predicted − measured) / measured."""
    trace = trace if isinstance(trace, RunTrace) else RunTrace(trace)
    policy = run_policy(trace)
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


def held_to_sim(measurement, seed: int = 0, check: bool = True) -> dict:
    """A :class:`realrun.compare.Measurement` as a dict, held against the simulator: with
    ``check``, ``sim_check`` (:func:`check_run` on its trace); for tree and graph runs,
    ``tree_check`` (:func:`check_tree_run`)."""
    out = measurement.to_dict()
    if measurement.tree is not None:
        out["tree_check"] = check_tree_run(measurement.trace, measurement.tree)
    if check:
        out["sim_check"] = check_run(measurement.trace, seed=seed)
    return out
