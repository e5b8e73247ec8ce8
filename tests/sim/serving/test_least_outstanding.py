"""Least-outstanding routing in whole runs (sim.serving.server, sim.serving.replica): every
request goes to the replica with the fewest requests not yet finished at its arrival, ties to
the lowest index — checked against a reference that recounts those from the run's own
arrival and finish times, and against stepping one step at a time (``window_max = 1``), bit
for bit. The router on its own is tested in tests/sim/serving/test_router.py."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim import acceptance, policies
from draftsim.sim.controllers import parse_controller
from draftsim.sim.cost import CallCost, RooflineModel, default_catalog
from draftsim.sim.serving import SchedulerConfig, ServingConfig, make_workload, serve
from draftsim.sim.serving.scheduler import Scheduler
from draftsim.sim.serving.workload import ClosedLoop, Fixed, Poisson, parse_lengths
from tests.sim.serving.test_replica import assert_same_run

_CAT = default_catalog()
_H100 = _CAT.hardware_spec("h100-sxm")


def _shaped_costs():
    """check-serve's static-cache pricing: the target's verification and the drafter's calls each at
    their padded shape (StepCost, DraftStepCost: the window hands both their make-up) on profiles
    whose time is a function of the padded shape."""
    from draftsim.analysis.servecheck import DraftStepCost, StepCost
    from draftsim.sim.cost import ProfileCost
    from draftsim.sim.cost.profile import pow2

    batch, new, context = (1, 2, 4, 8, 16, 32), (1, 2, 4, 8), (0, 8, 24, 56, 120, 248, 504, 1016, 2040)
    B, N, C = np.meshgrid(batch, new, context, indexing="ij")

    def table(scale):
        seconds = scale * (1.0 + 0.05 * pow2(B) + 0.02 * pow2(N) + 1e-4 * pow2(B) * np.maximum(pow2(C + pow2(N)), 16))
        return ProfileCost(model="m", batch=batch, new_tokens=new, context=context, seconds=seconds, extrapolate="clamp")

    return StepCost(table(0.01), 0.0, 0.0, 4, static_rows=32), DraftStepCost(table(0.002), 0.0, 0.0, 4, static_rows=32)


COSTS = {"linear": (CallCost(0.02, 1e-4), CallCost(0.002)),
         "roofline": (RooflineModel(_CAT.model("llama-2-7b"), _H100), RooflineModel(_CAT.model("smollm2-135m"), _H100)),
         "shaped": _shaped_costs()}


@contextmanager
def routes():
    """The replica each request reaches, in the order the requests reach one (filled by the run
    served inside the block)."""
    got: list = []
    add = Scheduler.add

    def recording(self, rid, now):
        got.append((int(rid), self.replica, float(now)))
        return add(self, rid, now)

    with mock.patch.object(Scheduler, "add", recording):
        yield got


def reference_routes(order, arrival, finish, replicas: int) -> list:
    """Least-outstanding by hand: request j (in the order requests reached a replica) goes to the
    replica with the fewest requests that reached it before j and had not finished by j's
    arrival (a finish at that very instant has finished), ties to the lowest index."""
    placed: list = [[] for _ in range(replicas)]
    out = []
    for rid in order:
        t = arrival[rid]
        loads = [sum(1 for i in ids if not finish[i] <= t) for ids in placed]
        r = loads.index(min(loads))
        placed[r].append(rid)
        out.append(r)
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), replicas=st.integers(2, 5), qps=st.floats(5.0, 150.0), costs=st.sampled_from(sorted(COSTS)),
       seqs=st.integers(2, 24), kv=st.sampled_from([None, 3000]), controller=st.sampled_from(["none", "goodput"]),
       closed=st.booleans())
def test_least_outstanding_routes_as_the_reference(seed, replicas, qps, costs, seqs, kv, controller, closed):
    """Each request reaches the replica the reference picks from the run's own times, and the run
    equals stepping one step at a time, bit for bit (its routing included)."""
    target, drafter = COSTS[costs]
    cfg = ServingConfig(policies.FixedK(3), acceptance.Bernoulli(0.75), target, [drafter], kv_tokens=kv or 1 << 20,
                        controller=parse_controller(controller), replicas=replicas, router="least-outstanding",
                        scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=2048))
    arr = ClosedLoop(2 * replicas + 1) if closed else Poisson()
    wl = make_workload(arrivals=arr, qps=None if closed else qps, requests=60, duration=None, prompt=parse_lengths("uniform:1,500"),
                       output=parse_lengths("uniform:1,150"), rng=np.random.default_rng(seed))
    with routes() as got:
        run = serve(cfg, wl, seed=seed, arrivals=arr if closed else None)
    order = [rid for rid, _, _ in got]
    assert sorted(order) == list(range(len(wl)))
    assert [r for _, r, _ in got] == reference_routes(order, run.arrival, run.finish, replicas)
    with routes() as stepped:
        steps = serve(dataclasses.replace(cfg, window_max=1), wl, seed=seed, arrivals=arr if closed else None)
    assert stepped == got
    assert_same_run(run, steps)


def test_least_outstanding_under_load_routes_as_the_reference():
    """The benchmark's models at four replicas, a few hundred requests: many finishes fall
    between two arrivals, so the loads differ by more than the last few routes."""
    target, drafter = COSTS["roofline"]
    cfg = ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), target, [drafter], replicas=4, router="least-outstanding")
    wl = make_workload(arrivals=Poisson(), qps=40.0, requests=400, duration=None, prompt=Fixed(512), output=Fixed(256),
                       rng=np.random.default_rng(7))
    with routes() as got:
        run = serve(cfg, wl, seed=7)
    order = [rid for rid, _, _ in got]
    assert [r for _, r, _ in got] == reference_routes(order, run.arrival, run.finish, 4)
    assert len(set(r for _, r, _ in got)) == 4


POLICIES = {"fixed": lambda k: policies.FixedK(k), "tree": lambda k: policies.Tree(2, k),
            "cascade": lambda k: policies.HorizontalCascade([1, 2], [k, 2])}


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), replicas=st.integers(2, 4), qps=st.floats(10.0, 120.0), costs=st.sampled_from(sorted(COSTS)),
       seqs=st.integers(2, 24), kv=st.sampled_from([None, 3000]), k=st.integers(1, 4), policy=st.sampled_from(sorted(POLICIES)),
       chunked=st.booleans())
def test_an_arrival_taken_into_a_window_in_place_equals_the_window_made_anew(seed, replicas, qps, costs, seqs, kv, k, policy, chunked):
    """Least-outstanding routing: an arrival the window under way takes in (window.admit) is
    added to the window's own arrays and sums in place; that window equals the one computed anew
    with it over every lane (``_with_folds``), array for array, bit for bit — and the run equals
    stepping one step at a time. Chains, trees and two-drafter cascades, with and without chunked
    prefill and a small KV pool."""
    from draftsim.sim.serving import window

    target, drafter = COSTS[costs]
    pol = POLICIES[policy](k)
    cfg = ServingConfig(pol, acceptance.Bernoulli(0.75), target, [drafter] * (pol.n_models - 1), kv_tokens=kv or 1 << 20,
                        replicas=replicas, router="least-outstanding",
                        scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=2048, chunked_prefill=chunked))
    wl = make_workload(arrivals=Poisson(), qps=qps, requests=60, duration=None, prompt=parse_lengths("uniform:1,500"),
                       output=parse_lengths("uniform:2,150"), rng=np.random.default_rng(seed))
    taken = []
    add_lane = window._add_lane

    def counted(*a, **kw):
        out = add_lane(*a, **kw)
        taken.append(out is not None)
        return out

    with mock.patch.object(window, "CHECK_ADMIT", True), mock.patch.object(window, "_add_lane", counted):
        run = serve(cfg, wl, seed=seed)
    assert_same_run(run, serve(dataclasses.replace(cfg, window_max=1), wl, seed=seed))
    if qps >= 40 and kv is None and seqs >= 12 and policy == "fixed":  # busy, unqueued replicas: arrivals come while windows are under way
        assert any(taken)


def test_least_outstanding_replicas_take_arrivals_into_their_windows():
    """The benchmark's setting at four replicas: most arrivals are taken into the window under
    way rather than cutting it (a window per arrival is what made least-outstanding routing cost
    about twice round-robin's)."""
    from draftsim.sim.serving import window

    target, drafter = COSTS["roofline"]
    cfg = ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), target, [drafter], replicas=4, router="least-outstanding")
    wl = make_workload(arrivals=Poisson(), qps=40.0, requests=400, duration=None, prompt=Fixed(512), output=Fixed(256),
                       rng=np.random.default_rng(7))
    taken = []
    admit = window.admit

    def counted(*a, **kw):
        out = admit(*a, **kw)
        taken.append(out is not None)
        return out

    with mock.patch("draftsim.sim.serving.replica.admit", counted):
        serve(cfg, wl, seed=7)
    assert sum(taken) > 0.8 * len(wl)


def test_least_outstanding_windows_outlast_their_longest_lane():
    """The benchmark's setting at four replicas: a window lengthens with each arrival it takes in
    once its own lanes have finished (window._horizon), so it is not bounded by its longest lane's
    drawn rounds: a window commits more steps than any request has rounds, and a replica runs a
    few windows for a hundred arrivals (it was one window every four arrivals or so)."""
    from draftsim.sim.serving import replica

    target, drafter = COSTS["roofline"]
    cfg = ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), target, [drafter], replicas=4, router="least-outstanding")
    wl = make_workload(arrivals=Poisson(), qps=40.0, requests=400, duration=None, prompt=Fixed(512), output=Fixed(256),
                       rng=np.random.default_rng(7))
    kept = []
    commit = replica.Replica._commit

    def counted(self, plan, win, n, *a):
        kept.append(n)
        return commit(self, plan, win, n, *a)

    with mock.patch.object(replica.Replica, "_commit", counted):
        run = serve(cfg, wl, seed=7)
    assert max(kept) > run.rounds.max()
    assert len(kept) < len(wl) / 10
    assert_same_run(run, serve(dataclasses.replace(cfg, window_max=1), wl, seed=7))
