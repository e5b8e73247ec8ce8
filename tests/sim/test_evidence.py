"""The published suite's record of errors (sim/evidence.py, sim/data/evidence.json) and what an
answer says with it. That the file matches a fresh run of the suite is checked where the suite
runs (tests/test_published.py)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim.errors import DraftsimError
from draftsim.sim.evidence import (
    BATCH_FACTOR,
    LEVELS,
    MIN_POINTS,
    EvidencePoint,
    adverse_margin,
    evidence_for,
    method_family,
    overall,
    read_evidence,
)
from draftsim.sim.registry import METHODS


def test_the_catalogs_record_is_every_scored_point_with_its_own_arithmetic():
    points = read_evidence()
    assert len(points) >= 70 and len({(p.source, p.label) for p in points}) == len(points)
    for p in points:
        assert p.error == pytest.approx(p.predicted / p.published - 1.0, abs=2e-6)
        assert p.method in METHODS or p.method == "draft_model"
    whole = overall()
    assert whole.points == len(points) and whole.matched == ()
    assert whole.median_abs_error <= whole.worst_abs_error == max(abs(p.error) for p in points)


def test_a_drafters_method_is_its_registry_name_or_a_draft_model():
    assert method_family("eagle3") == "eagle3" and method_family("EAGLE3:draft_vocab=32000") == "eagle3"
    assert method_family("qwen3-0.6b") == "draft_model" and method_family(None) == "none"


def _point(i: int, method: str, moe: bool, engine: str, hardware: str, error: float, batch: int | None = None) -> EvidencePoint:
    return EvidencePoint(f"s{i % 3}", f"p{i}", "throughput_ratio", engine, hardware, "t", moe, 1, method, batch, 1.0, 1.0 + error, error)


POOL = st.lists(st.tuples(st.sampled_from(["eagle", "eagle3", "mtp"]), st.booleans(), st.sampled_from(["vllm", "sglang"]),
                          st.sampled_from(["h100-sxm", "h200"]), st.floats(-0.5, 0.5), st.sampled_from([None, 1, 2, 4, 16, 64])),
                min_size=1, max_size=40)


def _shares(p: EvidencePoint, field: str, value) -> bool:
    """The rule said in words: the same value, or a batch held within BATCH_FACTOR of the deployment's."""
    if field == "batch":
        return p.batch is not None and value / BATCH_FACTOR <= p.batch <= value * BATCH_FACTOR
    return getattr(p, field) == value


@settings(max_examples=200, deadline=None)
@given(POOL, st.sampled_from(["eagle", "eagle3", "mtp"]), st.booleans(), st.sampled_from(["vllm", "sglang"]),
       st.sampled_from(["h100-sxm", "h200"]), st.one_of(st.none(), st.floats(0.5, 100.0)))
def test_the_evidence_is_the_most_specific_level_with_enough_points(pool, method, moe, engine, hardware, batch):
    """Every point chosen shares the matched fields with the deployment (a batch: within BATCH_FACTOR); the level
    is the first of LEVELS with MIN_POINTS points (the whole pool where none has), never one matching a batch the
    deployment did not give; the statistics are the chosen points'."""
    points = tuple(_point(i, *row) for i, row in enumerate(pool))
    ev = evidence_for(method, moe, engine, hardware, batch, points=points)
    like = {"method": method, "moe": moe, "engine": engine, "hardware": hardware, "batch": batch}
    chosen = [p for p in points if all(_shares(p, f, like[f]) for f in ev.matched)]
    assert ev.points == len(chosen) and ev.like == {f: like[f] for f in ev.matched}
    assert batch is not None or "batch" not in ev.matched
    level = LEVELS.index(ev.matched)
    for earlier in LEVELS[:level]:
        if batch is None and "batch" in earlier:
            continue
        assert sum(all(_shares(p, f, like[f]) for f in earlier) for p in points) < MIN_POINTS
    assert ev.points >= MIN_POINTS or ev.matched == ()
    errors = sorted(abs(p.error) for p in chosen)
    assert ev.worst_abs_error == errors[-1] and errors[0] <= ev.median_abs_error <= errors[-1]
    assert ev.mean_error == pytest.approx(sum(p.error for p in chosen) / len(chosen))


def test_without_hardware_the_evidence_never_matches_on_it():
    points = tuple(_point(i, "eagle3", False, "vllm", "h100-sxm", 0.1) for i in range(6))
    ev = evidence_for("eagle3", False, "vllm", None, points=points)
    assert ev.matched == ("method", "moe", "engine") and ev.points == 6
    assert ev.text().startswith("draftsim's speedups of 6 published runs of EAGLE-3 on dense targets with vllm (3 sources) were off by a "
                                "median 10.0%")


@given(st.floats(-0.9, 5.0), st.floats(0.0, 2.0), st.floats(0.0, 2.0))
def test_a_margin_under_an_over_predicted_gain_shrinks_with_the_error(margin, e1, e2):
    lo, hi = sorted((e1, e2))
    assert adverse_margin(margin, 0.0) == pytest.approx(margin)
    assert adverse_margin(margin, hi) <= adverse_margin(margin, lo) + 1e-12 and adverse_margin(margin, -lo) == adverse_margin(margin, lo)
    assert (1 + adverse_margin(margin, hi)) * (1 + hi) == pytest.approx(1 + margin)


GOOD = {"source": "s", "label": "l", "metric": "throughput_ratio", "engine": "vllm", "hardware": "h100-sxm", "target": "t",
        "moe": False, "tp": 1, "method": "eagle3", "batch": None, "published": 1.5, "predicted": 1.6, "error": 0.0667}


@pytest.mark.parametrize("doc,words", [
    ("{not json", "not a readable JSON file"),
    (json.dumps({"schema": "draftsim.engines", "version": 1, "points": [GOOD]}), "not a draftsim.evidence file of version 1"),
    (json.dumps({"schema": "draftsim.evidence", "version": 2, "points": [GOOD]}), "version 1"),
    (json.dumps({"schema": "draftsim.evidence", "version": 1, "points": []}), "points: expected a non-empty list"),
    (json.dumps({"schema": "draftsim.evidence", "version": 1, "points": [{**GOOD, "tp": True}]}), "points[0].tp: expected a whole number"),
    (json.dumps({"schema": "draftsim.evidence", "version": 1, "points": [{**GOOD, "error": "NaN"}]}), "points[0].error: expected a number"),
    (json.dumps({"schema": "draftsim.evidence", "version": 1, "points": [{**GOOD, "moe": 0}]}), "points[0].moe: expected a flag"),
    (json.dumps({"schema": "draftsim.evidence", "version": 1, "points": [{**GOOD, "batch": 1.5}]}), "batch: expected a whole number or null"),
    (json.dumps({"schema": "draftsim.evidence", "version": 1, "points": [{k: v for k, v in GOOD.items() if k != "label"}]}), "missing label"),
    (json.dumps({"schema": "draftsim.evidence", "version": 1, "points": [{**GOOD, "extra": 1}]}), "unknown key(s) extra"),
    (json.dumps({"schema": "draftsim.evidence", "version": 1, "points": [{**GOOD, "published": 0}]}), "must be > 0"),
])
def test_a_bad_evidence_file_is_refused_in_one_line_naming_the_field(tmp_path, doc, words):
    path = tmp_path / "evidence.json"
    path.write_text(doc)
    with pytest.raises(DraftsimError) as info:
        read_evidence(path)
    assert words in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)


def test_the_answer_says_how_far_speedups_like_it_were_off_and_its_margin_under_that():
    from draftsim.commands.frontdoor import Recommendation, model_error
    from draftsim.sim.evidence import model_error_lines

    row = {"load_margin": 0.20}
    rec = Recommendation("enable EAGLE-3 with k = 3: ...", "fixed:k=3", "eagle3", 3, 5, 6, row)
    error = model_error(rec, False, "vllm", "h100-sxm")
    like = evidence_for("eagle3", False, "vllm", "h100-sxm")
    assert error["points"] == like.points and error["median_abs_error"] == like.median_abs_error
    assert error["overall"]["points"] == overall().points
    assert error["margin_at_median_error"] == pytest.approx(1.2 / (1 + like.median_abs_error) - 1)
    assert error["margin_at_worst_error"] <= error["margin_at_median_error"] <= 0.2
    lines = model_error_lines(error)
    assert lines[0] == f"model error: {like.text()}" and f"over all {overall().points} published runs" in lines[1]
    assert f"{error['margin_at_median_error']:+.0%}" in lines[2] and ("does NOT hold" in lines[2]) == (error["margin_at_median_error"] < 0)
    assert math.isfinite(json.loads(json.dumps(error))["margin"])
    plain = Recommendation("do not enable speculation: ...", "ar", None, 0, 6, 6, row)
    assert model_error(plain, False, "vllm", "h100-sxm") is None


def test_the_evidence_at_a_batch_says_the_batches_it_matched_and_leaves_out_unheld_ones():
    """Points within 2x of the deployment's batch first (an open loop's point, batch unheld, never among them); too few
    there and the match drops the batch, saying so by not naming it."""
    points = tuple(_point(i, "eagle3", False, "vllm", "h100-sxm", e, b) for i, (e, b) in
                   enumerate([(0.1, 32), (0.1, 40), (0.2, 16), (0.3, 64), (0.5, 1), (0.5, 1), (0.5, None), (0.5, None)]))
    ev = evidence_for("eagle3", False, "vllm", "h100-sxm", 32.0, points=points)
    assert ev.matched == ("method", "moe", "engine", "hardware", "batch") and ev.points == 4
    assert " at batch 16-64 (within 2x of 32) (3 sources)" in ev.text() and ev.worst_abs_error == pytest.approx(0.3)
    ev = evidence_for("eagle3", False, "vllm", "h100-sxm", 1.0, points=points)
    assert ev.matched == ("method", "moe", "engine", "hardware") and ev.points == 8 and " at batch" not in ev.text()
    assert evidence_for("eagle3", False, "vllm", "h100-sxm", float("nan"), points=points).matched == ("method", "moe", "engine", "hardware")
