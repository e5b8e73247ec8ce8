"""``simulate``: one entry point for both executors (Monte Carlo and discrete-event), returning every metric with its error.

    >>> from draftsim.sim import simulate, policies, acceptance
    >>> r = simulate(policies.FixedK(5), acceptance.Bernoulli(0.8), 0.05, 100_000, seed=0)
    >>> round(r.metrics["ewif"].value, 2)  # analytic: 2.95
    2.94
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .acceptance import AcceptanceProcess
from .cost.linear import Costs
from .errors import DraftsimError, as_count, as_positive
from .files import atomic_write_json
from .metrics import ratio, summarize
from .policies import Policy

if TYPE_CHECKING:  # the engines are imported when a simulation runs: `import draftsim.sim` stays light (simpy is slow to import)
    from . import des, montecarlo

__all__ = ["SimResult", "simulate", "ENGINES"]

ENGINES = ("mc", "des")
#: Schema version of timeline files written by :meth:`SimResult.save_timeline`.
TIMELINE_SCHEMA = 1


@dataclass
class SimResult:
    """What a simulation measured. ``metrics`` maps names to :class:`Estimate`."""

    engine: str
    policy: Policy
    process: AcceptanceProcess
    costs: Costs
    n_sequences: int
    tokens: int
    metrics: dict
    acceptance_by_position: np.ndarray
    acceptance_by_position_se: np.ndarray
    counts: montecarlo.Counts
    requests: dict = field(default_factory=dict)
    timeline: des.Timeline | None = None

    def to_dict(self) -> dict:
        return {
            "engine": self.engine,
            "policy": repr(self.policy),
            "process": repr(self.process),
            "cost_coefficients": self.costs.coefficient.tolist(),
            "n_sequences": self.n_sequences,
            "tokens": self.tokens,
            "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
            "acceptance_by_position": self.acceptance_by_position.tolist(),
            "acceptance_by_position_se": self.acceptance_by_position_se.tolist(),
            "calls_per_model": self.counts.calls.sum(axis=0).tolist(),
            "drafted_per_model": self.counts.drafted.sum(axis=0).tolist(),
            "accepted_per_model": self.counts.accepted.sum(axis=0).tolist(),
            "requests": self.requests,
        }

    def save_timeline(self, path) -> Path:
        """Write the timeline as JSON (schema version 1), atomically (temp file + rename)."""
        if self.timeline is None:
            raise DraftsimError("this result has no timeline: run the des engine with timeline=True")
        path = Path(path)
        payload = {"schema": "draftsim.timeline", "version": TIMELINE_SCHEMA, "policy": repr(self.policy), **self.timeline.to_dict()}
        return atomic_write_json(path, payload, indent=None, mkdir=True)


def _as_costs(costs) -> Costs:
    if isinstance(costs, Costs):
        return costs
    return Costs.coefficients(costs)


def default_sequences(n_tokens: int, process: AcceptanceProcess | None = None) -> int:
    """Sequences for a Monte Carlo run, between 16 and 65 536 of them: ≥ 256 tokens each when
    rounds are i.i.d., ≥ 16 384 when acceptance has memory (each sequence starts from the
    chain's stationary state, not from the steady state of round starts, so short sequences
    would carry a start-up bias)."""
    per = 256 if process is None or process.stationary_rounds else 16384
    return int(np.clip(n_tokens // per, 16, 65536))


def simulate(
    policy: Policy,
    process: AcceptanceProcess,
    costs,
    n_tokens: int,
    engine: str = "mc",
    seed=0,
    *,
    n_sequences: int | None = None,
    requests: int = 1,
    rate: float | None = None,
    separate_drafter: bool = False,
    timeline: bool = False,
    progress=None,
) -> SimResult:
    """Simulate ``policy`` under ``process`` and ``costs`` for about ``n_tokens`` tokens.

    Parameters
    ----------
    policy : :class:`draftsim.sim.policies.Policy`
    process : :class:`draftsim.sim.acceptance.AcceptanceProcess` (a trace replays its own sequences)
    costs : :class:`draftsim.sim.cost.linear.Costs`, or drafter cost coefficient(s) with the target at 1
    n_tokens : total tokens (split over sequences or requests)
    engine : "mc" (vectorised Monte Carlo) or "des" (simpy timeline)
    seed : int or numpy.random.Generator; the same seed gives the same result, bit for bit
    n_sequences : Monte Carlo sequences (default: :func:`default_sequences`)
    requests : DES requests sharing the target (each gets n_tokens / requests tokens)
    rate : DES Poisson arrival rate of requests (default: all arrive at time 0)
    separate_drafter : DES: drafters run on their own device
    timeline : DES: record the timeline
    progress : callable(tokens) called as tokens are produced (e.g. a progress bar's update)
    """
    if engine not in ENGINES:
        raise DraftsimError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
    from . import des, montecarlo

    costs = _as_costs(costs)
    costs.require(policy.n_models)
    n_tokens = int(as_count("n_tokens", n_tokens, minimum=1))
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    finite = process.finite
    if engine == "mc":
        n_seq = n_sequences if n_sequences is not None else default_sequences(n_tokens, process)
        n_seq = int(as_count("n_sequences", n_seq, minimum=1))
        per_seq = None if finite else -(-n_tokens // n_seq)
        counts, _ = montecarlo.run(policy, process, n_seq, per_seq, rng, progress=progress)
        extra, tl = {}, None
    else:
        requests = int(as_count("requests", requests, minimum=1))
        if rate is not None:
            rate = float(as_positive("rate", rate))
        per_req = None if finite else -(-n_tokens // requests)
        counts, log = montecarlo.run(policy, process, requests, per_req, rng, log=True, progress=progress)
        outcome = des.replay(log, costs, rate=rate, separate_drafter=separate_drafter, rng=rng, record=timeline)
        latency = outcome.finish - outcome.arrival
        extra = {
            "n_requests": len(latency),
            "latency_p50": float(np.percentile(latency, 50)),
            "latency_p90": float(np.percentile(latency, 90)),
            "latency_p99": float(np.percentile(latency, 99)),
            "latency_mean": float(latency.mean()),
            "makespan": outcome.makespan,
            "throughput": float(counts.tokens.sum() / outcome.makespan) if outcome.makespan > 0 else float("nan"),
            "utilisation": {k: (v / outcome.makespan if outcome.makespan > 0 else float("nan")) for k, v in outcome.busy.items()},
        }
        tl = outcome.timeline
    metrics = summarize(counts, costs)
    if engine == "des":
        # Time per token on the timeline (queueing included), per request.
        metrics["time_per_token"] = ratio(outcome.finish - outcome.arrival, counts.tokens)
    with np.errstate(invalid="ignore", divide="ignore"):
        by_position = np.where(counts.pos_drafted > 0, counts.pos_accepted / np.maximum(counts.pos_drafted, 1), np.nan)
        # Binomial standard error of each position's acceptance frequency.
        by_position_se = np.sqrt(by_position * (1 - by_position) / np.maximum(counts.pos_drafted, 1))
    return SimResult(
        engine=engine,
        policy=policy,
        process=process,
        costs=costs,
        n_sequences=len(counts.tokens),
        tokens=int(counts.tokens.sum()),
        metrics=metrics,
        acceptance_by_position=by_position,
        acceptance_by_position_se=by_position_se,
        counts=counts,
        requests=extra,
        timeline=tl,
    )
