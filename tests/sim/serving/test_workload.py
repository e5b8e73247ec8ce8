"""sim.serving.workload: arrival processes, length distributions and workload assembly.

The parsers' examples, gamma burstiness and request-trace formats are tested in
tests/test_serving.py (test_length_distributions_and_arrivals, test_request_traces_azure_and_vidur);
this file tests the stated invariants: arrivals are sorted and have the stated rate in
expectation, lengths stay in their support with the stated mean, same seed same workload.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving.workload import (
    ClosedLoop,
    Empirical,
    EvenArrivals,
    Fixed,
    GammaArrivals,
    LogNormal,
    Poisson,
    Uniform,
    Workload,
    Zipf,
    make_workload,
    parse_arrivals,
)

Z = 5.0  # standard errors allowed for a statistical check
seeds = st.integers(0, 2**32 - 1)
rates = st.floats(0.1, 1000.0)


@settings(max_examples=40, deadline=None)
@given(seeds, rates, st.sampled_from([Poisson(), GammaArrivals(0.5), GammaArrivals(3.0), EvenArrivals()]))
def test_arrivals_are_sorted_with_the_stated_mean_gap(seed, rate, process):
    """n arrivals: non-decreasing, positive, mean gap 1/rate (within Z standard errors: the
    gaps' standard deviation is cv/rate, cv 1 for Poisson, 0 for even spacing)."""
    n = 4000
    t = process.times(rate, n, None, np.random.default_rng(seed))
    assert t.shape == (n,) and t[0] > 0 and np.all(np.diff(t) >= 0)
    cv = {Poisson: 1.0, EvenArrivals: 0.0}.get(type(process), getattr(process, "cv", None))
    se = cv / rate / np.sqrt(n)
    assert abs(t[-1] / n - 1.0 / rate) <= Z * se + 1e-12 / rate


@settings(max_examples=40, deadline=None)
@given(seeds, st.floats(0.5, 200.0), st.floats(1.0, 60.0))
def test_poisson_arrivals_over_a_duration_count_rate_times_duration(seed, rate, duration):
    """Arrivals in [0, duration): a Poisson count of mean rate·duration, all inside the window."""
    t = Poisson().times(rate, None, duration, np.random.default_rng(seed))
    assert np.all(np.diff(t) >= 0) and (t.size == 0 or (t[0] >= 0 and t[-1] < duration))
    lam = rate * duration
    assert abs(t.size - lam) <= Z * np.sqrt(lam) + 1


def test_even_arrivals_are_exactly_spaced_and_a_duration_cuts_them():
    t = EvenArrivals().times(4.0, None, 2.0, np.random.default_rng(0))
    np.testing.assert_allclose(t, np.arange(1, 8) * 0.25)


@settings(max_examples=30, deadline=None)
@given(seeds, st.sampled_from([Fixed(7), Uniform(3, 90), Zipf(1.3, 500, 2), Empirical([1, 5, 5, 40]),
                               LogNormal(200.0, 0.3, 100_000)]))
def test_lengths_stay_in_their_support_with_the_stated_mean(seed, dist):
    n = 20_000
    x = dist.sample(n, np.random.default_rng(seed))
    assert x.dtype == np.int64 and x.shape == (n,)
    assert x.min() >= 1 and x.max() <= dist.max
    se = x.std() / np.sqrt(n)
    # LogNormal rounds to integers: its mean moves by less than 0.5
    slack = 0.5 if isinstance(dist, LogNormal) else 0.0
    assert abs(x.mean() - dist.mean) <= Z * se + slack + 1e-9


def test_lognormal_and_zipf_respect_their_bounds():
    rng = np.random.default_rng(1)
    assert LogNormal(1000.0, 2.0, max=50).sample(5000, rng).max() == 50
    z = Zipf(2.0, 10, min=4)
    assert set(np.unique(z.sample(5000, rng))) <= set(range(4, 11))
    probs = np.arange(4, 11) ** -2.0
    assert z.mean == pytest.approx((np.arange(4, 11) * probs).sum() / probs.sum())


@given(seeds, st.integers(1, 8))
@settings(max_examples=20, deadline=None)
def test_make_workload_same_seed_same_requests(seed, priorities):
    def draw():
        return make_workload(arrivals=Poisson(), qps=3.0, requests=50, duration=None, prompt=Uniform(5, 50),
                             output=Fixed(9), rng=np.random.default_rng(seed), priorities=priorities)

    a, b = draw(), draw()
    for col in ("arrival", "prompt", "output", "priority"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))
    assert len(a) == 50 and np.all(np.diff(a.arrival) >= 0)
    assert a.priority.min() >= 0 and a.priority.max() < priorities


def test_closed_loop_workloads_leave_arrivals_to_the_server():
    wl = make_workload(arrivals=parse_arrivals("closed:clients=4,think=0.5"), qps=None, requests=12, duration=None,
                       prompt=Fixed(10), output=Fixed(3), rng=np.random.default_rng(0))
    assert len(wl) == 12 and np.isnan(wl.arrival).all()
    think = ClosedLoop(2, 0.5).think_times(20_000, np.random.default_rng(0))
    assert think.min() >= 0 and abs(think.mean() - 0.5) <= Z * 0.5 / np.sqrt(20_000)
    assert not ClosedLoop(2).think_times(3, np.random.default_rng(0)).any()


@pytest.mark.parametrize("kw, match", [
    (dict(arrivals=Poisson(), qps=None, requests=5, duration=None), "need --qps"),
    (dict(arrivals=Poisson(), qps=1.0, requests=None, duration=None), "--requests N or --duration"),
    (dict(arrivals=Poisson(), qps=1.0, requests=5, duration=9.0), "not both"),
    (dict(arrivals=ClosedLoop(2), qps=1.0, requests=5, duration=None), "take no --qps"),
    (dict(arrivals=ClosedLoop(2), qps=None, requests=None, duration=None), "need --requests"),
    (dict(arrivals=Poisson(), qps=1e-6, requests=None, duration=1.0), "no request arrives"),
])
def test_make_workload_refuses_what_it_cannot_draw(kw, match):
    with pytest.raises(DraftsimError, match=match):
        make_workload(prompt=Fixed(4), output=Fixed(4), rng=np.random.default_rng(0), **kw)


def test_workload_columns_are_checked():
    one = np.ones(2, dtype=np.int64)
    with pytest.raises(DraftsimError, match="at least one request"):
        Workload(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    with pytest.raises(DraftsimError, match="one entry per request"):
        Workload(np.zeros(3), one, one, one)
    with pytest.raises(DraftsimError, match="prompt tokens"):
        Workload(np.zeros(2), np.array([1, 0]), one, one)
