"""sim.serving.metrics: the summary of a run, vLLM's spec-decode counters, replications'
confidence intervals and the Chrome trace, on hand-made records.

Whole-run consistency: counters following the acceptance model at the end of this file,
Little's law in tests/sim/serving/test_server.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_server import serving_config, workload

from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving import serve
from draftsim.sim.serving.metrics import SLO, TIMELINE_SCHEMA, Recorder, RunRecord, combine, summarize_run, write_chrome_trace


def record(arrival, first, finish, output, admitted=None, itl=(), steps=None, replicas=1, kv_blocks=None) -> RunRecord:
    n = len(arrival)
    rec = Recorder(4)
    if steps is None:
        rec.steps(0, [0.0, 1.0], [1.0, 1.0], [0.25, 0.0], [2, 1], [10, 5], None if kv_blocks is None else [4, 2], 0)
    else:
        rec.steps(*steps)
    arr = np.asarray(arrival, dtype=float)
    return RunRecord(arr, arr if admitted is None else np.asarray(admitted, float), np.asarray(first, float),
                     np.asarray(finish, float), np.full(n, 10), np.asarray(output), np.zeros(n, dtype=np.int64),
                     np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64), np.asarray(itl, dtype=float),
                     rec.step_arrays(), rec.spec_counters(), kv_blocks, replicas)


def test_summary_follows_the_definitions():
    run = record(arrival=[0.0, 1.0], first=[0.5, 3.0], finish=[2.5, 3.0], output=[5, 1], admitted=[0.0, 2.0],
                 itl=[0.5, 0.5, 1.0], kv_blocks=8)
    s = summarize_run(run, SLO(ttft=1.0, tpot=1.0))
    assert s["ttft"]["mean"] == pytest.approx(1.25) and s["ttft"]["p50"] == pytest.approx(1.25)
    assert s["tpot"]["mean"] == pytest.approx(0.5)  # (2.5 − 0.5) / 4; a one-token output has no TPOT
    assert s["e2e"]["mean"] == pytest.approx(2.25)
    assert s["queue"]["mean"] == pytest.approx(0.5)
    assert s["itl"]["mean"] == pytest.approx(2 / 3)
    assert s["throughput"] == pytest.approx(6 / 3.0) and s["request_throughput"] == pytest.approx(2 / 3.0)
    assert s["goodput"] == pytest.approx(1 / 3.0) and s["slo_attainment"] == 0.5  # request 1 waits 2 s for its token
    assert s["requests"] == 2 and s["output_tokens"] == 6 and s["steps"] == 2
    assert s["busy"] == pytest.approx(2 / 3.0) and s["mean_batch"] == pytest.approx(1.5) and s["max_batch"] == 2
    assert s["kv_utilisation"] == pytest.approx((4 / 8 + 2 / 8) / 2) and s["kv_utilisation_max"] == 0.5


@given(st.lists(st.floats(0.0, 1e3), min_size=1, max_size=200), st.lists(st.floats(0.0, 50.0), min_size=1, max_size=200))
def test_latency_statistics_are_ordered(waits, gaps):
    """Every latency's p50 <= p90 <= p99 and its mean lies within its range."""
    n = len(waits)
    arrival = np.zeros(n)
    first = np.asarray(waits)
    finish = first + 1.0 + np.asarray((gaps * n)[:n])  # a run of at least a second: no overflowing rates
    s = summarize_run(record(arrival, first, finish, np.full(n, 3), itl=gaps))
    for name in ("ttft", "tpot", "itl", "e2e"):
        x = s[name]
        assert x["p50"] <= x["p90"] <= x["p99"]
        lo, hi = {"ttft": (first.min(), first.max()), "e2e": (finish.min(), finish.max()),
                  "itl": (min(gaps), max(gaps)), "tpot": (min(finish - first) / 2, max(finish - first) / 2)}[name]
        assert lo - 1e-9 * (1 + abs(lo)) <= x["mean"] <= hi + 1e-9 * (1 + abs(hi))


def test_spec_counters_per_position_are_cumulative():
    rec = Recorder(3)
    rec.spec(np.array([3, 3, 1, 0]), np.array([3, 1, 0, 0]))
    rec.spec(np.array([5]), np.array([4]))  # beyond P = 3 positions: counted at the last one
    c = rec.spec_counters()
    assert c["num_drafts"] == 4 and c["num_draft_tokens"] == 12 and c["num_accepted_tokens"] == 8
    assert c["num_draft_tokens_per_pos"] == [4, 3, 3] and c["num_accepted_tokens_per_pos"] == [3, 2, 2]
    assert c["mean_acceptance_length"] == pytest.approx(1 + 8 / 4) and c["draft_acceptance_rate"] == pytest.approx(8 / 12)
    empty = Recorder(2).spec_counters()
    assert empty["num_drafts"] == 0 and empty["mean_acceptance_length"] == 1.0 and np.isnan(empty["draft_acceptance_rate"])


def test_combine_means_and_student_t_intervals():
    a = {"x": 1.0, "n": 3, "d": {"y": 2.0}, "per_pos": [1.0, 2.0]}
    b = {"x": 3.0, "n": 5, "d": {"y": 2.0}, "per_pos": [3.0]}
    out = combine([a, b])
    assert out["x"] == 2.0 and out["n"] == 4.0 and out["d"]["y"] == 2.0 and out["per_pos"] == [2.0, 2.0]
    assert out["ci95"]["x"] == pytest.approx(12.706204736 * 1.0, rel=1e-6)  # t(0.975, 1) · s / √2, s = √2
    assert out["ci95"]["d"]["y"] == 0.0 and "per_pos" not in out["ci95"] and out["replications"] == 2
    one = combine([a])
    assert one["n"] == 3 and np.isnan(one["ci95"]["x"])
    with pytest.raises(DraftsimError, match="no replication"):
        combine([])


@pytest.mark.parametrize("kw", [dict(ttft=0.0), dict(tpot=-1.0), dict(ttft=float("nan"))])
def test_slo_must_be_positive(kw):
    with pytest.raises(DraftsimError):
        SLO(**kw)


def test_chrome_trace_has_a_track_per_model_and_counters(tmp_path):
    steps = (1, [0.0, 1.0, 2.0], [1.0, 1.0, 0.5], [0.25, 0.0, 0.1], [2, 1, 1], [10, 5, 3], [4, 2, 2], 3)
    run = record([0.0], [0.5], [2.5], [4], steps=steps, replicas=2)
    run.meta["policy"] = "fixed:k=4"
    out = write_chrome_trace(tmp_path / "tl.json", [run], max_steps=2)
    assert out == {"path": str(tmp_path / "tl.json"), "steps": 2, "steps_total": 3}
    doc = json.loads((tmp_path / "tl.json").read_text())
    assert doc["otherData"]["schema"] == TIMELINE_SCHEMA and doc["otherData"]["policy"] == "fixed:k=4"
    ev = doc["traceEvents"]
    assert sum(e["ph"] == "M" and e["name"] == "process_name" for e in ev) == 2
    drafts = [e for e in ev if e["name"] == "draft"]
    verifies = [e for e in ev if e["name"] == "verify"]
    assert [e["dur"] for e in drafts] == [0.25e6] and len(verifies) == 2  # no draft bar in a step without drafting
    assert verifies[0]["ts"] == 0.25e6 and verifies[0]["dur"] == 0.75e6 and verifies[0]["pid"] == 1
    assert [e["args"]["kv_blocks"] for e in ev if e["ph"] == "C"] == [4, 2]
    assert not list(tmp_path.glob(".*tmp"))


# -- whole-run counters follow the acceptance model -------------------------------------------------

def test_spec_decode_metrics_follow_the_acceptance_model():
    run = serve(serving_config(), workload(n=400, qps=20.0, output=128), seed=0)
    s = run.spec
    pos = np.array(s["num_accepted_tokens_per_pos"]) / s["num_drafts"]
    np.testing.assert_allclose(pos, 0.8 ** np.arange(1, 5), atol=0.01)
    assert s["mean_acceptance_length"] == pytest.approx((1 - 0.8**5) / 0.2, rel=0.01)
