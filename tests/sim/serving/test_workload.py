"""sim.serving.workload: arrival processes, length distributions and workload assembly.

The parsers' examples, gamma burstiness, request-trace formats and a trace's replay are at the
end of this file (test_length_distributions_and_arrivals, test_request_traces_azure_and_vidur);
it first tests the stated invariants: arrivals are sorted and have the stated rate in
expectation, lengths stay in their support with the stated mean, same seed same workload.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_server import serving_config

from draftsim.sim import acceptance, policies
from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving import read_request_trace, serve
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
    parse_lengths,
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


# -- the parsers' examples, request traces and their replay -----------------------------------------

def test_length_distributions_and_arrivals(tmp_path):
    rng = np.random.default_rng(0)
    for spec, lo, hi in (("fixed:512", 512, 512), ("uniform:128,1024", 128, 1024), ("lognormal:median=200,sigma=0.5,max=900", 1, 900),
                         ("zipf:a=1.2,max=4096", 1, 4096), ("77", 77, 77)):
        x = parse_lengths(spec).sample(2000, rng)
        assert x.min() >= lo and x.max() <= hi
    t = parse_arrivals("gamma:cv=3").times(10.0, 20000, None, rng)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.1, rel=0.1) and gaps.std() / gaps.mean() == pytest.approx(3, rel=0.15)
    assert np.all(np.diff(parse_arrivals("poisson").times(5.0, None, 100.0, rng)) >= 0)
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("10\n20\n30\n")
    assert set(parse_lengths(f"empirical:{lengths}").sample(500, rng).tolist()) == {10, 20, 30}
    for bad in ("fixed:0", "uniform:9,3", "lognormal:median=-1,sigma=1", "zipf:a=1", "gauss:3", "fixed:x", "uniform:5:2", "uniform:1,2,3"):
        with pytest.raises(DraftsimError) as err:
            parse_lengths(bad, "--prompt-len")
        assert str(err.value).count("--prompt-len") == 1, err.value  # the option named once
    with pytest.raises(DraftsimError):
        parse_arrivals("poisson").times(-1.0, 10, None, rng)


def test_request_traces_azure_and_vidur(tmp_path):
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                     "2023-11-16 18:15:50.9951690,396,109\n2023-11-16 18:15:51.2000000,879,20\n")
    arr, p, o, _ = read_request_trace(azure)
    np.testing.assert_allclose(arr, [0.0, 4.314579, 4.519410], atol=1e-6)
    assert p.tolist() == [374, 396, 879] and o.tolist() == [44, 109, 20]
    vidur = tmp_path / "vidur.csv"
    vidur.write_text("Date,Time,PromptTokenCount,CompletionTokenCount\nd,0.5,100,10\nd,1.5,200,20\n")
    arr, p, o, _ = read_request_trace(vidur)
    assert arr.tolist() == [0.0, 1.0] and p.tolist() == [100, 200]
    lengths = tmp_path / "lengths.jsonl"
    lengths.write_text(json.dumps({"num_prefill_tokens": 10, "num_decode_tokens": 5}) + "\n")
    arr, p, o, _ = read_request_trace(lengths)
    assert arr is None and p.tolist() == [10] and o.tolist() == [5]
    wl = make_workload(arrivals=Poisson(), qps=None, requests=None, duration=None, prompt=None, output=None,
                       rng=np.random.default_rng(0), trace=azure)
    assert len(wl) == 3
    for text, match in (("TIMESTAMP,ContextTokens\n1,2\n", "no output tokens column"),
                        ("Time,PromptTokenCount,CompletionTokenCount\n2,1,1\n1,1,1\n", "sorted"),
                        ("Time,PromptTokenCount,CompletionTokenCount\n-1,1,1\n", ">= 0"),
                        ("Time,PromptTokenCount,CompletionTokenCount\n1,0,1\n", "in \\[1,"),
                        # the file and the row (1-based) as the user sees them, the value as written
                        ("Time,PromptTokenCount,CompletionTokenCount\n1,5,1\n2,5,inf\n",
                         "bad.csv'?: column CompletionTokenCount must hold integers in \\[1, [0-9]+\\]; row 2 has 'inf'"),
                        ("Time,PromptTokenCount,CompletionTokenCount\nx,1,1\n", "seconds or dates")):
        bad = tmp_path / "bad.csv"
        bad.write_text(text)
        with pytest.raises(DraftsimError, match=match):
            read_request_trace(bad)


def test_trace_driven_requests_replay_their_recorded_sequences():
    seqs = [np.array([1.0] * 30), np.array([0.0] * 12)]
    process = acceptance.TraceDriven(seqs)
    wl = Workload(np.array([0.0, 0.0, 1.0, 1.0]), np.full(4, 32), np.full(4, 999), np.zeros(4, dtype=np.int64))
    run = serve(serving_config(policies.FixedK(5), process), wl, seed=0)
    assert run.output.tolist() == [31, 13, 31, 13]  # recorded lengths + the prefill's token
    assert run.rounds[1] == 12 and run.rounds[0] == 5  # all rejected: one token a round; all accepted: 6


@pytest.mark.parametrize("text, seconds", [("0.5", 0.5), ("500ms", 0.5), ("2m", 120.0), ("1.5 s", 1.5)])
def test_a_closed_loops_think_time_is_read_as_every_time_is(text, seconds):
    """think= takes a unit as --duration and --slo-ttft do (sim.errors.parse_seconds); a bare number is seconds."""
    assert parse_arrivals(f"closed:clients=2,think={text}").think == pytest.approx(seconds)


def test_a_think_time_with_an_unknown_unit_names_it():
    with pytest.raises(DraftsimError, match="unknown unit 'xs'"):
        parse_arrivals("closed:clients=2,think=5xs")
