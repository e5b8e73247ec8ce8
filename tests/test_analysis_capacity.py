"""analysis.capacity: the capacity table and figure, and the search's bracket invariants.

The bisection against known thresholds, the M/D/1 check, replications and the ``capacity``
command (specs, resume, the serving simulator) are tested in tests/test_capacity.py.
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
