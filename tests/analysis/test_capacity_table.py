"""analysis.capacity: the capacity table and figure, and the search's bracket invariants.

The bisection against known thresholds, the M/D/1 check, replications and the ``capacity``
command (specs, resume, the serving simulator) are tested in tests/analysis/test_capacity.py.
"""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pngcheck import png_size

from draftsim.analysis import capacity as cap
from draftsim.sim.errors import DraftsimError


@given(st.floats(1e-3, 1e4), st.floats(1e-3, 1e3), st.floats(1e-3, 0.5))
def test_search_trail_is_consistent_with_a_monotone_threshold(threshold, start, tolerance):
    """Every rate tried below the answer's bracket passed, every rate at or above its upper
    end failed, and the reported metrics are those measured at the reported rate."""
    c = cap.find_capacity(lambda q: (q <= threshold, {"q": q}), start=min(start, 1e3), minimum=1e-3, maximum=1e3,
                          tolerance=tolerance)
    for q, ok, metrics in c.evaluations:
        assert ok == (q <= threshold) and metrics == {"q": q}
        if ok:
            assert q <= c.qps
        else:
            assert q >= c.high
    if c.qps > 0:
        assert c.metrics == {"q": c.qps}


@pytest.mark.parametrize("kw, match", [(dict(start=0.0), "0 < minimum <= start"), (dict(tolerance=1.0), "tolerance"),
                                       (dict(maximum=math.inf), "maximum < inf")])
def test_search_ranges(kw, match):
    with pytest.raises(DraftsimError, match=match):
        cap.find_capacity(lambda q: (True, {}), **kw)


def test_search_gives_up_after_its_budget():
    with pytest.raises(DraftsimError, match="did not converge in 3 evaluations"):
        cap.find_capacity(lambda q: (q < 7.3, {}), start=1.0, tolerance=1e-6, max_evaluations=3)


def table() -> pa.Table:
    return pa.table({
        "policy": ["ar", "fixed:k=4", "fixed:k=4"],
        "tp": [1, 1, 2],
        "status": ["ok", "ok", "error"],
        "error": [None, None, "boom"],
        "capacity_qps": [2.0, 3.5, None],
        "bracket_high": [2.1, math.inf, None],
        "ttft_p99_at_capacity": [0.8, 0.9, None],
        "throughput_at_capacity": [500.0, 800.0, None],
        "cost_per_million_tokens": [1.2, 0.7, None],
    })


def test_table_rows_mark_open_brackets_and_failures():
    s = cap.Settings(slo={"ttft_p99": 1.0}, price_per_hour=2.0, compare="policy")
    headers, rows = cap.table_rows(table(), ["policy", "tp"], s)
    assert headers == ["policy", "tp", "capacity (req/s)", "ttft_p99 at cap.", "tokens/s at cap.", "$ per 1M tokens"]
    assert rows[0] == ["ar", 1, "2", "0.8", "500", "1.2"]
    assert rows[1][2] == ">= 3.5"  # the search stopped at its maximum still meeting the SLOs
    assert rows[2][:3] == ["fixed:k=4", 2, "failed: boom"] and len(rows[2]) == len(headers)


def test_figure_is_written(tmp_path):
    s = cap.Settings(slo={"ttft_p99": 1.0}, price_per_hour=2.0, compare="policy")
    path = cap.figure(tmp_path / "cap.png", table(), ["policy", "tp"], s)
    assert png_size(path) and not list(tmp_path.glob(".*"))


@given(answer=st.integers(1, 1024), capacity=st.floats(0.05, 50.0), load=st.floats(1.0, 2000.0))
def test_replicas_are_bisected_not_walked(answer, capacity, load):
    """The fewest replicas meeting a monotone SLO (met from ``answer`` replicas on) are found
    from any first guess ⌈load / capacity⌉ in O(log |answer − guess|) simulated counts:
    galloping away from the guess, then bisecting; a guess past MAX_REPLICAS simulates nothing."""
    tried = []

    def evaluate(point):
        n, qps = point
        assert qps == load
        tried.append(n)
        return n >= answer, {"x": 0.5}

    s = cap.Settings(slo={"x": 1.0}, load=load, latency="x")
    notes: list = []
    found = cap.replicas_for_load({}, capacity, s, evaluate, devices=2.0, notes=notes)
    guess = math.ceil(load / capacity - 1e-9)
    if guess > cap.MAX_REPLICAS:
        assert found["replicas_for_load"] is None and not tried and "more than the 1,024" in notes[0]
        return
    assert found["replicas_for_load"] == answer and found["devices_for_load"] == 2 * answer
    assert found["load_margin"] == pytest.approx(answer * capacity / load - 1)
    assert len(tried) == len(set(tried)) <= 3 + 2 * math.ceil(math.log2(abs(answer - guess) + 1)), (guess, tried)


#: The runs of :func:`_pooled_run`: (replicas, rate) per call.
RUNS: list = []


def _pooled_run(config, seed):
    """A stand-in serving run whose replicas pool (n replicas serve a load n^1.25 times one's:
    the first guess ⌈load / capacity⌉ overshoots the fewest replicas by hundreds), counting its
    calls in :data:`RUNS`: the mean wait of an M/M/1 queue at the per-replica load."""
    RUNS.append((config.get("replicas", 1), config["qps"]))
    rho = config["qps"] / config.get("replicas", 1) ** 1.25
    return {"wait": rho / (1.0 - rho) if rho < 1 else math.inf}


def test_a_large_load_takes_logarithmically_many_replica_runs():
    """A configuration's whole search (capacity, then replicas for 300 req/s) counted run by run
    on a stand-in whose guess is 601 replicas where 167 suffice: the replica search simulates
    at most 2 log2(434) + 3 counts (18 measured), not the 435 a walk down one count at a time took."""
    from draftsim.analysis.sweep import Task

    RUNS.clear()
    s = cap.Settings(slo={"wait": 1.0}, start=0.1, minimum=0.01, maximum=10.0, tolerance=1e-3, throughput=None, load=300.0,
                     latency="wait")
    out = cap.search_task(_pooled_run, "qps", {"wait": "wait"}, s, 0, 1, Task(0, 0, 0, 0, {"policy": "ar"}))
    assert out.error is None, out.error
    counts = [n for n, q in RUNS if q == 300.0]
    # one replica meets wait <= 1 up to rho = 0.5: capacity 0.5, guess 600; n replicas meet 300 req/s from n^1.25 >= 600
    assert out.values["capacity_qps"] == pytest.approx(0.5, rel=1e-3)
    assert out.values["replicas_for_load"] == math.ceil(600 ** (1 / 1.25) - 1e-9) == 167
    assert len(counts) <= 2 * math.ceil(math.log2(601 - 167)) + 3 and len(counts) == len(set(counts)), counts
