"""Simulation against reality: replay a real run's trace in ``sim`` and compare.

For each run trace (:class:`draftsim.sim.traces.RunTrace`), with the pieces of :mod:`draftsim.sim.replay`:

1. the acceptance the run observed becomes a :class:`draftsim.sim.acceptance.TraceDriven` process —
   per (proposer, verifier) pair and output position, whether the token proposed there was
   accepted (the realised flag), and the drafter's confidence in it;
2. the *same policy* (parsed from the run's metadata) is simulated on it by the Monte Carlo
   engine, which stops each sequence where the real text ended;
3. the replayed rounds are priced round by round with measured cost tables — a ``draftsim
   profile`` of each model where given, else the run's own calls (mean seconds per tokens
   fed) — plus the executor's own time per round measured in the run, and the prefill (the
   target's profile where given and its grid holds the prompts, else as the run measured it):
   the predicted tokens/s.

For greedy runs of single-drafter policies (any rule) the drafter always sees the final
text, so the replay reproduces the run's counts exactly — target calls, drafted and accepted
tokens. Inside a vertical cascade a drafter may verify a smaller drafter on a context that
the target later rejects, which per-position flags cannot represent: there the counts are a
prediction and their relative error is reported.
"""

from __future__ import annotations

import numpy as np

from ..sim import montecarlo
from ..sim.errors import DraftsimError
from ..sim.replay import fit_costs, replay_process, run_policy, run_pricing
from ..sim.traces import RunTrace

__all__ = ["check_run", "check_tree_run", "held_to_sim", "run_speed"]


def _real_counts(trace: RunTrace) -> dict:
    rounds = trace.rounds.to_pydict()
    return {
        "tokens": int(sum(len(o) for o in trace.sequences["output_ids"].to_pylist())),
        "target_calls": len(rounds["round"]),
        "drafted": int(sum(rounds["drafted"])),
        "accepted": int(sum(rounds["accepted"])),
    }


def _relative(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0 if measured > 0 else float("nan")


def run_speed(calls_per_prompt, profile) -> dict | None:
    """How fast the machine ran during a measurement against ``profile`` (the target's): the
    autoregressive runs interleaved with the method (:func:`draftsim.realrun.compare.measure`) — their
    target calls, a prefill then one token per call, each at its exact context — measured
    seconds over the profile's price of the same calls. 1.0: as fast as when profiled; 1.08:
    8% slower. None without calls or where the profile's grid does not hold them.

    These calls are not the method's: the factor re-states the profile at the speed the
    machine had while the method ran (a busy or throttled machine drifts by several percent
    within minutes), without looking at the method's own timings."""
    measured = priced = 0.0
    for calls in calls_per_prompt or ():
        context = 0
        for c in calls:
            if c.model != 0 or c.n_tokens <= 0:
                continue
            shape = (1, c.n_tokens, context)
            if profile.outside(*shape).any():
                return None
            priced += float(profile.shape_time(*shape, rows=1 if c.kind == "prefill" else None))
            measured += c.seconds
            context += c.n_tokens
    if priced <= 0:
        return None
    return {"factor": measured / priced, "measured_seconds": measured, "priced_seconds": priced,
            "source": f"the interleaved autoregressive runs' target calls, priced by the profile of {profile.model}"}


def check_run(trace, seed: int = 0, profiles=(), speed: float | None = None) -> dict:
    """Replay ``trace`` (a :class:`RunTrace` or its path) with its own policy; compare counts
    and tokens/s. Relative errors are (predicted − measured) / measured.

    The replayed rounds are priced round by round (:func:`draftsim.sim.replay.run_pricing`): each
    model's calls from a measured cost table (``profiles``, else the run's own calls) and the
    executor's own time per round from the run's rounds; the prefill is the run's. Tree and
    graph runs are replayed with the per-level acceptance they recorded (:func:`_tree_replay`).
    With ``speed`` (:func:`run_speed`'s factor) the prediction is also given with the model
    calls priced at the machine's speed during the run (``..._at_run_speed``).
    """
    trace = trace if isinstance(trace, RunTrace) else RunTrace(trace)
    _check_machine(trace, profiles)
    policy = run_policy(trace)
    real = _real_counts(trace)
    seconds = float(sum(p.get("seconds", 0.0) for p in trace.manifest["prompts"]))
    calls = trace.calls.to_pydict()
    # A verification that carried the prompt (prompt_tokens > 0) counts as the prefill: the
    # replay prices its round's verification again, a small overestimate (one call per prompt).
    riding = calls.get("prompt_tokens", [0] * len(calls["kind"]))
    is_prefill = [k == "prefill" or p > 0 for k, p in zip(calls["kind"], riding)]
    measured_prefill = float(sum(s for f, s in zip(is_prefill, calls["seconds"]) if f))
    model_seconds = float(sum(s for f, s in zip(is_prefill, calls["seconds"]) if not f))
    prefill, prefill_source = _price_prefill(trace, calls, profiles, measured_prefill)
    out = {"path": str(trace.path), "method": trace.metadata.get("method"), "policy": trace.metadata.get("policy"),
           "mode": trace.metadata.get("sampling"), "sequences": len(trace.entries), "real": real,
           "measured_tokens_per_second": real["tokens"] / seconds if seconds > 0 else float("nan"),
           # Time the run spent outside model calls (Python, sampling, verification).
           "overhead_share": 1.0 - (model_seconds + measured_prefill) / seconds if seconds > 0 else float("nan"),
           "prefill": {"measured_seconds": measured_prefill, "predicted_seconds": prefill, "source": prefill_source}}
    if policy is None:
        out["replayable"] = False
        out["reason"] = "the sequential token cascade has no simulator policy"
        return out
    M = policy.n_models
    # a chain's forwards through a static cache run at padded shapes (a tree's attend at their own new tokens)
    pricing = run_pricing(trace, M, profiles, padded=trace.metadata.get("cache") == "static" and policy.kind != "tree")
    if policy.kind == "tree":
        return _tree_replay(trace, policy, pricing, out, prefill, model_seconds, seconds, seed, speed)
    process = replay_process(trace, M)
    counts, log = montecarlo.run(policy, process, process.n_sequences, None, np.random.default_rng(seed), log=True)
    sim = {
        "tokens": int(counts.tokens.sum()),
        "target_calls": int(counts.calls[:, 0].sum()),
        "drafted": int(counts.top_drafted.sum()),
        "accepted": int(counts.top_accepted.sum()),
    }
    live = np.stack(log.live)
    predicted_model = float((pricing.call_seconds(np.stack(log.calls), np.stack(log.call_tokens)) * live).sum())
    predicted_overhead = float(pricing.overhead_seconds(live.sum(), counts.tokens.sum()))
    predicted = predicted_model + predicted_overhead + prefill
    out.update({
        "replayable": True,
        "sim": sim,
        "counts_equal": sim == real,
        "count_errors": {k: (sim[k] - real[k]) / real[k] if real[k] else float(sim[k] != 0) for k in real},
        "pricing": pricing.describe(),
        "predicted_tokens_per_second": sim["tokens"] / predicted if predicted > 0 else float("nan"),
        "predicted_tokens_per_second_without_overhead": sim["tokens"] / (predicted_model + prefill) if predicted_model + prefill > 0 else float("nan"),
        "model_time_error": _relative(predicted_model, model_seconds),
    })
    out["tokens_per_second_error"] = _relative(out["predicted_tokens_per_second"], out["measured_tokens_per_second"])
    return _at_speed(out, speed, predicted_model + prefill, predicted_overhead, sim["tokens"])


def _at_speed(out: dict, speed: float | None, model: float, overhead: float, tokens: int) -> dict:
    """Add the prediction with the model calls and prefill (``model`` seconds as priced)
    ``speed`` times slower, where profiles priced them all (a run's own timings are at its
    speed already); ``overhead`` is the executor's own time, as measured."""
    profiled = all(str(s).startswith(("profile", "none")) for s in out["pricing"]["sources"]) and out["prefill"]["source"] != "run"
    if speed is not None and np.isfinite(speed) and speed > 0 and profiled:
        t = speed * model + overhead
        out["run_speed_factor"] = float(speed)
        out["predicted_tokens_per_second_at_run_speed"] = tokens / t if t > 0 else float("nan")
        out["tokens_per_second_error_at_run_speed"] = _relative(out["predicted_tokens_per_second_at_run_speed"],
                                                                out["measured_tokens_per_second"])
    return out


def _price_prefill(trace: RunTrace, calls: dict, profiles, measured: float) -> tuple[float, str]:
    """The prompts' prefill time: each standalone prefill call priced by the target's profile
    (its tokens at context 0) when one is given and its grid holds them, else the run's
    measured prefill. A prompt that rode on the first verification stays as measured."""
    names = trace.models()
    prof = next((p for p in profiles if names and p.model == names[0]), None)
    if prof is None:
        return measured, "run"
    riding = np.array(calls.get("prompt_tokens", [0] * len(calls["kind"])), dtype=np.int64)
    kind = np.array(calls["kind"], dtype=object)
    model = np.array(calls["model"], dtype=np.int64)
    fed = np.array(calls["n_tokens"], dtype=np.int64)
    secs = np.array(calls["seconds"], dtype=np.float64)
    alone = (kind == "prefill") & (model == 0)
    if not alone.any() or prof.outside(1, fed[alone], 0).any():
        return measured, "run"
    priced = float(np.sum(prof.shape_time(1, fed[alone], 0, rows=1)))  # a prefill keeps the last row's logits only
    return priced + float(secs[riding > 0].sum()), f"profile of {prof.model}"


def _check_machine(trace: RunTrace, profiles) -> None:
    """Refuse a profile measured on another machine than the run (when both say), and one
    of another forward path than the run's (single-stream runs call the model itself; with
    ``--static-cache``, through the static cache: ``profile --path server-static``; a controlled
    drafter's cost model by the path the trace records, ``controlled_cost_path``: through a one-row
    static cache in a static run since 2026-11-26, plain forwards before, as on the H200 run)."""
    from ..sim.replay import seeded

    here = trace.metadata.get("machine")
    static = trace.metadata.get("cache") == "static"
    costs = {seeded(n.partition("@")[2]) for n in (trace.models() or []) if n.startswith("controlled") and "@" in n}
    cost_path = trace.metadata.get("controlled_cost_path", "model")
    for prof in profiles:
        if seeded(prof.model) in costs:
            want = cost_path
            what = (f"are priced by a profile of the path their controlled drafter's cost model ran ({cost_path}; the trace's "
                    "controlled_cost_path)")
        else:
            want = "server-static" if static else "model"
            what = ("with a static cache are priced by a profile of that cache" if static else
                    "are priced by a profile of the model's own call")
        if prof.path != want:
            raise DraftsimError(f"the profile of {prof.model} timed the {prof.path} forward path; single-stream runs {what} "
                                f"(draftsim profile --path {want})")
        if here:
            prof.check_fingerprint(machine=here)


def _tree_replay(trace, policy, pricing, out, prefill, model_seconds, seconds, seed, speed=None) -> dict:
    """A tree or graph run replayed: the Monte Carlo engine drafts ``policy``'s tree with the
    per-level acceptance the run recorded (β̂, the truncated-geometric maximum-likelihood
    estimate from the accepted lengths per round), which gives the tokens per round; a round
    costs what the run's rounds cost on average — the run's own calls (the target's over the
    verified nodes, the drafter's per level) each priced at its size by the cost tables (GSD's
    pruning, early exit and merging reach the simulator through these sizes: its own tree is
    the full width × depth one) — plus the executor's overhead."""
    from ..sim.acceptance import Bernoulli

    rounds = trace.rounds.to_pydict()
    accepted = np.array(rounds["accepted"], dtype=np.float64)
    n_rounds = len(accepted)
    short = float((accepted < policy.depth).sum())
    beta = float(accepted.sum() / (accepted.sum() + short)) if accepted.sum() + short > 0 else 0.0
    tokens = out["real"]["tokens"]
    counts, _ = montecarlo.run(policy, Bernoulli(beta, rank_alphas=(beta,)), 1, max(tokens, 1) * 200, np.random.default_rng(seed))
    per_round = float(counts.tokens.sum() / counts.calls[:, 0].sum())
    calls = trace.calls.to_pydict()
    riding = calls.get("prompt_tokens", [0] * len(calls["kind"]))
    # logit rows each call kept (realrun.trees.TreeForward): all it fed, but the drafter's
    # first call of a round, which catches up on the accepted tokens and keeps one row
    kept, last = [], {}  # model -> round of its previous call (reset by each prompt's prefill)
    for r, m, k, n, p in zip(calls["round"], calls["model"], calls["kind"], calls["n_tokens"], riding):
        if k == "prefill":
            last.clear()
        if k == "prefill" or p > 0:
            continue
        first = m > 0 and last.get(m) != r
        last[m] = r
        kept.append((m, n, 1 if first else n))
    recorded = pricing.recorded_call_seconds(*zip(*kept)) if kept else 0.0
    round_model = recorded / max(n_rounds, 1)
    rounds_pred = tokens / per_round
    predicted_model = rounds_pred * round_model
    predicted_overhead = float(pricing.overhead_seconds(rounds_pred, tokens))
    predicted = predicted_model + predicted_overhead + prefill
    out.update({
        "replayable": True,
        "tree": True,
        "level_acceptance": beta,
        "sim": {"tokens_per_round": per_round},
        "real_tokens_per_round": tokens / max(n_rounds, 1),
        "tokens_per_round_error": _relative(per_round, tokens / max(n_rounds, 1)),
        "counts_equal": False,
        "pricing": pricing.describe(),
        "predicted_tokens_per_second": tokens / predicted if predicted > 0 else float("nan"),
        "model_time_error": _relative(predicted_model, model_seconds),
    })
    out["tokens_per_second_error"] = _relative(out["predicted_tokens_per_second"], out["measured_tokens_per_second"])
    return _at_speed(out, speed, predicted_model + prefill, predicted_overhead, tokens)


def check_tree_run(trace, tree_stats: dict) -> dict:
    """Hold a tree / graph run against the tree optimiser (:func:`draftsim.sim.optimize.tree_shape`):
    with the per-rank acceptance the run observed and the call costs fitted to its timings,
    the best tree of at most as many nodes as the run verified per round, its expected
    accepted tokens per round and modelled tokens/s, next to the run's own."""
    from ..sim.optimize import tree_shape

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


def held_to_sim(measurement, seed: int = 0, check: bool = True, profiles=()) -> dict:
    """A :class:`draftsim.realrun.compare.Measurement` as a dict, held against the simulator: with
    ``check``, ``sim_check`` (:func:`check_run` on its trace, priced with ``profiles`` where
    given); for tree and graph runs, ``tree_check`` (:func:`check_tree_run`)."""
    out = measurement.to_dict()
    if measurement.tree is not None:
        out["tree_check"] = check_tree_run(measurement.trace, measurement.tree)
    if check:
        target = measurement.trace.models()[0] if measurement.trace is not None else None
        prof = next((p for p in profiles if p.model == target), None)
        speed = run_speed(measurement.autoregressive_calls, prof) if prof is not None else None
        out["sim_check"] = check_run(measurement.trace, seed=seed, profiles=profiles, speed=speed["factor"] if speed else None)
        if speed is not None:
            out["sim_check"]["run_speed"] = speed
    return out
