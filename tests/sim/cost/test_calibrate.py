"""draftsim calibrate: a hardware entry fitted to measured calls (sim/cost/calibrate.py, sim/vllm_bench.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim.cost import RooflineModel, default_catalog
from draftsim.sim.cost.calibrate import StepPoints, calibrate, points_from_profile, points_from_vllm
from draftsim.sim.cost.profile import load_profile
from draftsim.sim.vllm_bench import read_vllm_bench

CAT = default_catalog()
PROFILE = Path(__file__).resolve().parents[3] / "figures" / "real-serving" / "profile-smollm2-cpu-steps.json"


def synthetic(mfu, mbu, overhead, noise, seed):
    """Calls of Qwen2.5-0.5B on an H100 priced with known factors, times jittered by ``noise``: a
    grid from launch-bound single tokens to compute-bound 4096-token calls, so that each factor
    shows (a small model: its fixed overhead is not hidden behind its weight reads)."""
    B, N, C = (x.ravel().astype(float) for x in np.meshgrid([1, 4, 16, 64, 256], [1, 2, 4, 8, 16], [0, 512, 4096], indexing="ij"))
    truth = RooflineModel(CAT.model("qwen2.5-0.5b"), CAT.hardware_spec("h100-sxm"), mfu=mfu, mbu=mbu, overhead=overhead,
                          overhead_per_layer=0.0, check_memory=False)
    t = np.asarray(truth.shape_time(B, N, C), dtype=float) * np.exp(np.random.default_rng(seed).normal(0.0, noise, B.size))
    return StepPoints(B, N, C, t, "synthetic")


@settings(max_examples=8, deadline=None)
@given(st.floats(0.2, 0.9), st.floats(0.3, 0.95), st.floats(0.0, 2e-3), st.integers(0, 2**31 - 1))
def test_calibration_recovers_the_factors_that_made_the_times(mfu, mbu, overhead, seed):
    fit = calibrate(CAT.model("qwen2.5-0.5b"), CAT.hardware_spec("h100-sxm"), synthetic(mfu, mbu, overhead, 0.02, seed), holdout=0.25)
    assert fit.mfu == pytest.approx(mfu, rel=0.1)
    assert fit.mbu == pytest.approx(mbu, rel=0.1)
    assert fit.overhead == pytest.approx(overhead, abs=5e-5)
    assert fit.errors["held_out"]["median_abs"] < 0.03  # 2% noise
    assert fit.fitted + fit.held_out == 75 and fit.held_out == 18


def test_calibration_improves_the_held_out_error_on_a_profile_of_this_machine():
    """SmolLM2's measured serving-path profile (this CPU, figures/real-serving): the calibrated
    entry predicts the points it never saw better than the catalog's local-cpu defaults."""
    points = points_from_profile(load_profile(PROFILE))
    fit = calibrate(CAT.model("smollm2-135m"), CAT.hardware_spec("local-cpu"), points, dtype="float32", holdout=0.25)
    e = fit.errors
    assert e["held_out"]["median_abs"] < e["default_held_out"]["median_abs"]
    assert e["fit"]["median_abs"] < e["default_fit"]["median_abs"]


def vllm_result(path: Path, rate: float, itl_ms: float, ttft_ms: float, n: int = 20) -> Path:
    doc = {"model_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": n, "request_rate": rate, "max_concurrency": None,
           "duration": (n / rate if rate != "inf" else 0.0) + (ttft_ms + 127 * itl_ms) / 1e3, "completed": n,  # the last request's end "total_input_tokens": 256 * n,
           "total_output_tokens": 128 * n, "request_throughput": rate, "mean_ttft_ms": ttft_ms, "median_ttft_ms": ttft_ms,
           "mean_tpot_ms": itl_ms, "median_itl_ms": itl_ms, "mean_e2el_ms": ttft_ms + 127 * itl_ms,
           "input_lens": [256] * n, "output_lens": [128] * n, "ttfts": [ttft_ms / 1e3] * n, "itls": [[itl_ms / 1e3] * 127] * n}
    path.write_text(json.dumps(doc))
    return path


def test_vllm_results_give_a_decode_step_per_run_and_the_prefill_of_light_runs(tmp_path, capsys):
    light = read_vllm_bench(vllm_result(tmp_path / "a.json", 0.5, 7.5, 30.0))
    pts = points_from_vllm([light])
    conc = 0.5 * (0.030 + 127 * 0.0075)  # Little's law: 0.49 requests in flight
    assert conc < 1.5 and len(pts) == 2
    assert pts.batch.tolist() == [1.0, 1.0] and pts.new_tokens.tolist() == [1.0, 256.0] and pts.context.tolist() == [256 + 64, 0.0]
    assert pts.seconds.tolist() == pytest.approx([0.0075, 0.030])
    files = [vllm_result(tmp_path / f"{r}.json", r, itl, 40.0) for r, itl in ((0.5, 7.5), (8.0, 8.5), (30.0, 10.5), (60.0, 13.0))]
    out = tmp_path / "cat.json"
    status, text, err = run(capsys, "calibrate", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", *sum((["--vllm-result", str(f)] for f in files), []),
                            "--holdout", "0", "--out", str(out), "--json")
    assert status == 0, err
    res = json.loads(text)
    assert res["points_fitted"] == 5 and res["hardware"] == "h100-sxm-calibrated"
    entry = json.loads(out.read_text())["hardware"]["h100-sxm-calibrated"]
    assert entry["mbu"] == pytest.approx(res["mbu"]) and "calibrated by draftsim calibrate" in entry["source"]
    assert entry["measured"]["calibration"]["calls"] == 5 and "vllm bench serve" in entry["measured"]["calibration"]["fitted_to"]
    # the written catalog is usable at once
    status, text, err = run(capsys, "cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm-calibrated", "--catalog", str(out), "--json")
    assert status == 0, err
    # its fitted overhead holds the measured engine's: engine overheads on top are refused in one line
    status, text, err = run(capsys, "cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm-calibrated", "--catalog", str(out),
                            "--overheads", "vllm")
    assert status == 2 and text == "" and len(err.strip().splitlines()) == 1 and "use --engine none" in err  # --overheads: the old name of --engine
    # check-serve's default engine is then none, and it says the hardware is calibrated
    status, text, err = run(capsys, "check-serve", "--vllm-result", str(files[1]), "--target", "llama-3.1-8b",
                            "--hardware", "h100-sxm-calibrated", "--catalog", str(out))
    assert status == 0, err


@pytest.mark.parametrize("extra, message", [
    ([], "exactly one of --profile, --step-table or --vllm-result"),
    (["--profile", str(PROFILE), "--step-table", "x.csv"], "got --profile, --step-table"),
    (["--step-table", "{tmp}/bad.csv"], "every row needs batch, new_tokens, context and seconds"),
    (["--vllm-result", "{tmp}/notjson.json"], "is not valid JSON"),
    (["--vllm-result", "{tmp}/nodetail.json"], "save the run with --save-detailed"),
    (["--step-table", "{tmp}/ok.csv", "--holdout", "0.9"], "--holdout must lie in [0, 0.5]"),
    # one shape measured three times: three parameters would match it exactly (a 0.0% error, exit 0, before)
    (["--step-table", "{tmp}/same.csv", "--holdout", "0"], "hold 1 distinct shape (batch, new tokens, context)"),
    (["--step-table", "{tmp}/two.csv", "--holdout", "0"], "hold 2 distinct shapes"),
])
def test_bad_calibrations_are_one_line(tmp_path, capsys, extra, message):
    (tmp_path / "bad.csv").write_text("batch,new_tokens,seconds\n1,1,0.01\n")
    (tmp_path / "ok.csv").write_text("batch,new_tokens,context,seconds\n" + "".join(f"{b},1,0,{0.01 * b}\n" for b in range(1, 9)))
    (tmp_path / "notjson.json").write_text("{nope")
    (tmp_path / "same.csv").write_text("batch,new_tokens,context,seconds\n" + "1,1,0,0.01\n" * 3)
    (tmp_path / "two.csv").write_text("batch,new_tokens,context,seconds\n" + "1,1,0,0.01\n" * 3 + "8,1,0,0.02\n" * 2)
    doc = json.loads(vllm_result(tmp_path / "full.json", 1.0, 8.0, 30.0).read_text())
    for key in ("input_lens", "output_lens", "ttfts", "itls"):
        doc.pop(key)
    (tmp_path / "nodetail.json").write_text(json.dumps(doc))
    args = [x.replace("{tmp}", str(tmp_path)) for x in extra]
    status, out, err = run(capsys, "calibrate", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", *args, "--out", str(tmp_path / "o.json"))
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o.json").exists()


def test_check_serve_replays_a_vllm_result(tmp_path, capsys):
    """check-serve --vllm-result: the run's arrivals (start_times) and lengths replayed on the named
    deployment, each metric the file has compared; a speculative run with its acceptance."""
    from draftsim.analysis.servecheck import vllm_workload

    doc = json.loads(vllm_result(tmp_path / "r.json", 2.0, 8.0, 40.0, n=12).read_text())
    doc["start_times"] = [100.0 + 0.5 * i for i in range(12)]
    doc["input_lens"] = [100 + 10 * i for i in range(12)]
    doc["output_lens"] = [50 + i for i in range(12)]
    doc["itls"] = [[0.008] * (50 + i - 1) for i in range(12)]
    (tmp_path / "r.json").write_text(json.dumps(doc))
    wl = vllm_workload(read_vllm_bench(tmp_path / "r.json"))
    assert wl.arrival.tolist() == [0.5 * i for i in range(12)] and wl.prompt.tolist() == doc["input_lens"]
    assert wl.output.tolist() == doc["output_lens"]
    status, out, err = run(capsys, "check-serve", "--vllm-result", str(tmp_path / "r.json"), "--target", "llama-3.1-8b",
                           "--hardware", "h100-sxm", "--json")
    assert status == 0, err
    rows = {r["metric"]: r for r in json.loads(out)}
    assert set(rows) == {"ttft_mean", "ttft_p50", "tpot_mean", "itl_p50", "e2e_mean", "throughput"}
    assert rows["tpot_mean"]["measured"] == pytest.approx(0.008) and rows["tpot_mean"]["predicted"] > 0
    doc["spec_decode_per_position_acceptance_rates"] = [80.0, 60.0, 45.0]  # percent, as vLLM writes them
    (tmp_path / "s.json").write_text(json.dumps(doc))
    status, out, err = run(capsys, "check-serve", "--vllm-result", str(tmp_path / "s.json"), "--target", "llama-3.1-8b",
                           "--hardware", "h100-sxm", "--drafter-model", "eagle3")
    assert status == 0, err
    assert "k=3" in out.splitlines()[0]  # the policy drafts as many tokens as the file has positions
    status, out, err = run(capsys, "check-serve", "--vllm-result", str(tmp_path / "r.json"), "--target", "llama-3.1-8b",
                           "--hardware", "h100-sxm", "--drafter-model", "eagle3")
    assert status == 2 and "holds no spec_decode_per_position_acceptance_rates" in err
    status, out, err = run(capsys, "check-serve", "--vllm-result", str(tmp_path / "r.json"))
    assert status == 2 and "needs --target MODEL and --hardware HW" in err


def test_a_holdout_too_small_to_hold_a_point_out_holds_none():
    """--holdout 1e-320 (every 10^320-th point): none held out, no overflow (the fuzz test found it)."""
    cat = default_catalog()
    pts = StepPoints(np.array([1.0, 1, 4, 4, 16, 16]), np.array([1.0, 4, 1, 4, 1, 4]), np.full(6, 512.0),
                     np.array([0.0061, 0.0064, 0.0064, 0.0076, 0.0076, 0.0124]), "table")
    fit = calibrate(cat.model("llama-3.1-8b"), cat.hardware_spec("h100-sxm"), pts, holdout=1e-320)
    assert fit.fitted == 6 and fit.held_out == 0 and fit.errors["held_out"]["median_abs"] is None
