"""sim.serving.router: which replica a new request goes to.

Whole runs over several replicas are tested in tests/sim/serving/test_server.py
(test_replicas_and_routers_serve_everything).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving.router import ROUTERS, LeastOutstanding, RoundRobin, make_router


class Stub:
    def __init__(self, load: int):
        self.load = load

    def outstanding(self) -> int:
        return self.load


@given(st.integers(1, 16), st.integers(0, 200))
def test_round_robin_takes_replicas_in_turn(replicas, requests):
    router, stubs = RoundRobin(), [Stub(0)] * replicas
    picks = [router.pick(stubs) for _ in range(requests)]
    assert picks == [i % replicas for i in range(requests)]
    counts = np.bincount(picks, minlength=replicas) if picks else np.zeros(replicas)
    assert counts.max() - counts.min() <= 1


@given(st.lists(st.integers(0, 50), min_size=1, max_size=16))
def test_least_outstanding_picks_the_first_least_loaded(loads):
    i = LeastOutstanding().pick([Stub(x) for x in loads])
    assert loads[i] == min(loads) and loads.index(min(loads)) == i


@given(st.lists(st.integers(0, 5), min_size=2, max_size=8), st.integers(1, 60))
def test_least_outstanding_keeps_loads_level(loads, requests):
    """Sending each request to the least loaded replica never widens the gap beyond one
    request once it is that small (requests never finish here)."""
    stubs = [Stub(x) for x in loads]
    router = LeastOutstanding()
    for _ in range(requests):
        stubs[router.pick(stubs)].load += 1
    final = [s.load for s in stubs]
    assert max(final) - min(final) <= max(max(loads) - min(loads), 1)
    assert sum(final) == sum(loads) + requests


def test_make_router_names():
    assert set(ROUTERS) == {"round-robin", "least-outstanding"}
    assert isinstance(make_router("least-outstanding"), LeastOutstanding)
    a, b = make_router("round-robin"), make_router("round-robin")
    assert a.pick([Stub(0)] * 2) == b.pick([Stub(0)] * 2) == 0  # fresh state each time
    with pytest.raises(DraftsimError, match="unknown router 'random'; known: round-robin, least-outstanding"):
        make_router("random")
