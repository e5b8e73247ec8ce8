"""benchmarks/bench_vidur.py (issue 37 item 1): the operator model scored on the committed subset of
Vidur's public operator profiles (benchmarks/data/vidur). The scoring is deterministic, reports every
operator kind on every GPU that has rows, fits nothing on Vidur's numbers, and holds the one kind whose
median is within the 10% goal (A100 GEMMs) at its measured value. Skipped, with the reason, where
aiconfigurator-core 0.12.0 is not installed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from benchscript import load_script
from operatortables import tables

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data" / "vidur"

#: issue 37: the operator model's error, median per operator kind
GOAL = 0.10
#: measured by ``python benchmarks/bench_vidur.py``: A100 GEMMs, 9.3% at the median over 3,864 rows. Vidur's own
#: repeat noise (its Llama-2-70B and Llama-3-70B A100 profiles time the same 448 GEMM shapes) is 1.3% at the
#: median; the bound is the measured value plus that noise, capped at the goal
A100_GEMM_MEDIAN = 0.093
A100_GEMM_BOUND = min(A100_GEMM_MEDIAN + 0.013, GOAL)


def _module():
    return load_script("benchmarks/bench_vidur.py")


@pytest.fixture(scope="module")
def bench():
    return _module()


@pytest.fixture(scope="module")
def scores(bench):
    return bench.all_scores()


def test_the_committed_subset_names_its_source_and_is_small():
    readme = (DATA / "README.md").read_text()
    assert "microsoft/vidur" in readme and "MIT" in readme and "milliseconds" in readme
    assert "MIT License" in (DATA / "LICENSE").read_text()
    models = pd.read_csv(DATA / "models.csv")
    for commit in set(models.commit):
        assert commit[:7] in readme
    assert "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a" in readme and "7d47513363ec447a741ac5e47241580b47724fbf" in readme
    assert sum(p.stat().st_size for p in DATA.glob("*.csv")) < 300_000
    assert list(pd.read_csv(DATA / "gemm.csv").columns) == ["gpu", "model", "tp", "num_tokens", "attn_pre_proj", "attn_post_proj",
                                                           "mlp_up_proj", "mlp_down_proj"]
    assert list(pd.read_csv(DATA / "all_reduce.csv").columns) == ["network", "num_workers", "size_bytes", "median", "min", "max"]
    att = pd.read_csv(DATA / "attention_a100.csv")
    assert set(att.phase) == {"decode", "prefill"} and (att.attn > 0).all()


@tables
def test_every_row_is_scored_deterministically(bench, scores):
    again = bench.all_scores()
    pd.testing.assert_frame_equal(scores, again)
    for col in ("measured", "predicted", "curve"):
        assert np.isfinite(scores[col]).all() and (scores[col] > 0).all()
    n = {f: len(pd.read_csv(DATA / f)) for f in ("gemm.csv", "attention_a100.csv", "all_reduce.csv")}
    assert (scores.kind == "gemm").sum() == 4 * n["gemm.csv"]
    assert scores.kind.str.contains("attention").sum() == n["attention_a100.csv"]
    assert (scores.kind == "allreduce").sum() == n["all_reduce.csv"]


@tables
def test_every_kind_is_reported(bench, scores):
    summary = {(s.kind, s.group): s for s in bench.summarise(scores)}
    assert set(summary) == {("gemm", "a100-80g"), ("gemm", "h100-sxm"), ("decode attention", "a100-80g"),
                            ("prefill attention", "a100-80g"), ("allreduce", "a100-80g"), ("allreduce", "h100-sxm")}
    for s in summary.values():
        assert s.rows > 0 and 0 <= s.median <= s.worst and s.ratio > 0 and 0 <= s.curve_median <= s.curve_worst
    text = bench.markdown(bench.summarise(scores), "GPU")
    for kind, _ in summary:
        assert f"| {kind} |" in text
    assert bench.evidence(scores)


@tables
def test_a_gemm_row_is_priced_as_the_operator_model_prices_that_layer(bench, scores):
    """Llama-2-7B's QKV at tp 1, 512 tokens on H100: the operator model's own layer GEMMs of a one-layer
    Llama-2-7B price it, and its table holds the shape."""
    from draftsim.sim.cost import default_catalog
    from draftsim.sim.cost.operators import OperatorModel

    row = scores[(scores.kind == "gemm") & (scores.gpu == "h100-sxm") & (scores.model == "meta-llama/Llama-2-7b-hf") & (scores.tp == 1)
                 & (scores.m == 512)]
    assert len(row) == 4 and set(row.path) == {"table"}
    models = pd.read_csv(DATA / "models.csv")
    spec = bench.vidur_model(models[(models.gpu == "h100") & (models.model == "meta-llama/Llama-2-7b-hf")].iloc[0])
    whole = OperatorModel(spec, default_catalog().hardware_spec("h100-sxm"), engine="vllm", check_memory=False)
    layers = next(p for p in whole.breakdown(512, 1, 0) if p.part == "gemm layers").seconds
    assert row.predicted.sum() == pytest.approx(layers, rel=1e-9)
    assert {(int(r.n), int(r.k)) for r in row.itertuples()} == {(3 * 4096, 4096), (4096, 4096), (2 * 11008, 4096), (4096, 11008)}


@tables
def test_a100_gemms_hold_their_measured_median(bench, scores):
    s = next(s for s in bench.summarise(scores) if (s.kind, s.group) == ("gemm", "a100-80g"))
    assert s.median <= A100_GEMM_BOUND, f"A100 GEMMs on Vidur's profiles: {s.median:.1%} at the median (measured {A100_GEMM_MEDIAN:.1%})"
