"""Discrete-event engine (simpy): requests share the models' devices on a timeline.

What happens inside a round — drafted and accepted tokens, forward calls per model — is
decided by the same policy and acceptance process as in Monte Carlo: the rounds of every
request are drawn up front with :func:`draftsim.sim.montecarlo.run` (they do not depend on time). The
simpy model then places them on a timeline: each request is one long-lived process that
arrives (at time 0, or by a Poisson process of rate ``rate``), and for each round holds the
device while its drafters run and the target verifies. Following simpy practice, a round
whose middle nothing observes is one timeout: with the drafters on the target's device a
round is one hold of that device; with ``separate_drafter`` the drafting phase holds the
drafter's device and the verification the target's. A request alone in the system needs no
resource at all (nothing can contend), so it is one timeout per round.

Service times come from :class:`draftsim.sim.cost.linear.Costs` (constant per call, or a + b·n).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from .cost.linear import Costs
from .montecarlo import RoundLog

__all__ = ["Timeline", "DesOutcome", "replay"]


@dataclass
class Timeline:
    """Who did what, when: one entry per phase (columns of equal length)."""

    request: list
    resource: list  # "device" (target's device, shared) or "drafter" (separate drafter device)
    phase: list  # "draft+verify", "draft" or "verify"
    start: list
    end: list

    def to_dict(self) -> dict:
        return {"request": self.request, "resource": self.resource, "phase": self.phase, "start": self.start, "end": self.end}

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class DesOutcome:
    arrival: np.ndarray
    finish: np.ndarray
    busy: dict  # resource name -> busy time
    makespan: float
    timeline: Timeline | None


def _phase_times(log: RoundLog, costs: Costs) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, requests) arrays of drafting time (drafters) and verification time (target)."""
    calls = np.stack(log.calls).astype(np.float64)  # (R, S, M)
    toks = np.stack(log.call_tokens).astype(np.float64)
    M = calls.shape[2]
    a = np.array([m.a for m in costs.models[:M]])
    b = np.array([m.b for m in costs.models[:M]])
    per_model = calls * a + toks * b
    return per_model[:, :, 1:].sum(axis=2), per_model[:, :, 0]


def replay(
    log: RoundLog,
    costs: Costs,
    *,
    rate: float | None = None,
    separate_drafter: bool = False,
    rng: np.random.Generator,
    record: bool = False,
) -> DesOutcome:
    """Place the logged rounds of every request on a simpy timeline."""
    draft_t, verify_t = _phase_times(log, costs)
    live = np.stack(log.live)  # (R, S)
    n_req = live.shape[1]
    if rate is None:
        arrival = np.zeros(n_req)
    else:
        arrival = np.cumsum(rng.exponential(1.0 / rate, size=n_req))
    env = simpy.Environment()
    device = simpy.Resource(env, capacity=1)
    drafter = simpy.Resource(env, capacity=1) if separate_drafter else device
    finish = np.zeros(n_req)
    busy = {"device": 0.0, "drafter": 0.0} if separate_drafter else {"device": 0.0}
    tl = Timeline([], [], [], [], []) if record else None
    alone = n_req == 1

    def log_phase(req, resource, phase, start, end):
        if tl is not None:
            tl.request.append(req)
            tl.resource.append(resource)
            tl.phase.append(phase)
            tl.start.append(start)
            tl.end.append(end)

    def hold(i: int, resource, name: str, phase: str, duration: float):
        """Hold ``resource`` (None: nothing can contend) for one timeout of ``duration``."""
        if resource is None:
            start = env.now
            yield env.timeout(duration)
        else:
            with resource.request() as req:
                yield req
                start = env.now
                yield env.timeout(duration)
        busy[name] += duration
        log_phase(i, name, phase, start, env.now)

    def request(i: int):
        yield env.timeout(arrival[i])
        rounds = np.flatnonzero(live[:, i])
        for d, v in zip(draft_t[rounds, i].tolist(), verify_t[rounds, i].tolist()):
            if not separate_drafter:
                yield from hold(i, None if alone else device, "device", "draft+verify", d + v)
            else:
                if d > 0:
                    yield from hold(i, drafter, "drafter", "draft", d)
                yield from hold(i, device, "device", "verify", v)
        finish[i] = env.now

    for i in range(n_req):
        env.process(request(i))
    env.run()
    return DesOutcome(arrival=arrival, finish=finish, busy=busy, makespan=float(env.now), timeline=tl)
