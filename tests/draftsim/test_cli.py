"""The draftsim command line: output, --json, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import run

from draftsim.sim import analytic


def test_ewif_table_marks_best_k(capsys):
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", "--cost", "0.05")
    assert status == 0 and err == ""
    best_rows = [line for line in out.splitlines() if line.rstrip().endswith("*")]
    assert len(best_rows) == 1 and best_rows[0].split()[0] == "8"
    assert "best k in 0..16: k = 8, EWIF 3.0921" in out


def test_ewif_json(capsys):
    status, out, _ = run(capsys, "ewif", "--alpha", "0.8", "--cost", "0.05", "--k", "5", "--json")
    data = json.loads(out)
    assert status == 0
    assert [r["k"] for r in data["rows"]] == [5]
    assert data["rows"][0]["ewif"] == pytest.approx(analytic.ewif(0.8, 0.05, 5))
    assert data["best"] == {"k": 8, "ewif": pytest.approx(analytic.optimal_k(0.8, 0.05, 16)[1]), "k_max": 16}


def test_plan_ranks_strategies(capsys):
    status, out, _ = run(
        capsys, "plan", "--drafter", "medium:0.85:0.15", "--drafter", "small:0.65:0.02", "--mag-alpha", "0.55", "--json"
    )
    data = json.loads(out)
    assert status == 0
    values = [s["ewif"] for s in data["strategies"]]
    assert values == sorted(values, reverse=True)
    kinds = {s["kind"] for s in data["strategies"]}
    assert kinds == {"autoregressive", "sd", "horizontal", "vertical"}
    horizontal = next(s for s in data["strategies"] if s["kind"] == "horizontal")
    assert horizontal["drafters"] == ["medium", "small"] and horizontal["counts"] == [3, 5]
    assert horizontal["ewif"] == pytest.approx(analytic.ewif_horizontal([(0.85, 0.15), (0.65, 0.02)], [3, 5]))


def test_plan_text(capsys):
    status, out, _ = run(capsys, "plan", "--drafter", "small:0.75:0.05")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["rank", "kind", "strategy", "EWIF"]
    assert "sd small k=7" in lines[2] and lines[2].split()[-1] == "2.6663"


def test_demo_writes_figures(capsys, tmp_path):
    status, out, _ = run(capsys, "demo", "--out", str(tmp_path), "--json")
    data = json.loads(out)
    assert status == 0
    assert len(data["settings"]) >= 3
    real = data["real"]  # make test installs torch and SmolLM2: the short real run happens
    assert real["quality"]["identical_to_target"] == 1.0 and real["sim_check"]["counts_equal"], real
    for path in data["figures"]:
        png = Path(path)
        assert png.parent == tmp_path and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["ewif", "--alpha", "1.5", "--cost", "0.1"], "alpha must lie in [0, 1]; got 1.5"),
        (["ewif", "--alpha", "nan", "--cost", "0.1"], "alpha must lie in [0, 1]; got nan"),
        (["ewif", "--alpha", "0.5", "--cost", "-1"], "cost must be a finite cost >= 0; got -1"),
        (["ewif", "--alpha", "0.5", "--cost", "0.1", "--k", "-2"], "k must be an integer in [0, 1024]; got -2"),
        (["ewif", "--alpha", "0.5", "--cost", "0.1", "--k", "2.5"], "k must be an integer in [0, 1024]; got 2.5"),
        (["ewif", "--alpha", "0.5", "--cost", "0.1", "--k-max", "100000"], "k_max must be an integer in [0, 1024]"),
        (["ewif", "--alpha", "high", "--cost", "0.1"], "alpha must be a number written with ASCII digits (e.g. 0.25, 3, 1e6); got 'high'"),
        (["plan", "--drafter", "small:0.7"], "drafter must be NAME:ALPHA:COST"),
        (["plan", "--drafter", "small:x:0.1"], "ALPHA and COST must be numbers"),
        (["plan", "--drafter", "small:1.7:0.1"], "alpha of drafter small must lie in [0, 1]; got 1.7"),
        (["plan", "--drafter", "small:0.7:-0.1"], "cost of drafter small must be a finite cost >= 0"),
        (["plan", "--drafter", "a:0.7:0.1", "--drafter", "a:0.6:0.1"], "drafter names must be distinct"),
        (["plan", "--drafter", ".x:0.7:0.1"], "drafter name must hold only letters"),
        (["plan", "--drafter", "a:0.7:0.1", "--mag-alpha", "2"], "mag_alpha must lie in [0, 1]; got 2"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, fragment):
    status, out, err = run(capsys, *argv)
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1 and fragment in err
    assert "Traceback" not in err


@pytest.mark.slow  # 6.0 s measured (pytest --durations, 2-core machine)
def test_console_script_entry_point():
    """The installed ``draftsim`` script runs and reports bad input the same way."""
    script = Path(sys.executable).with_name("draftsim")
    assert script.exists(), "draftsim is not installed in this environment (pip install -e .)"
    ok = subprocess.run([script, "ewif", "--alpha", "0.7", "--cost", "0.1", "--json"], capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["best"]["k"] == 4
    bad = subprocess.run([script, "ewif", "--alpha", "-0.1", "--cost", "0.1"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_simulate_mc_json(capsys):
    status, out, err = run(capsys, "simulate", "--policy", "fixed:k=5", "--alpha", "0.8", "--cost", "0.05", "--tokens", "100000", "--json")
    assert status == 0
    data = json.loads(out)
    ewif = data["metrics"]["ewif"]
    assert abs(ewif["value"] - data["analytic_ewif"]) <= 4 * ewif["se"]
    assert data["analytic_ewif"] == pytest.approx(analytic.ewif(0.8, 0.05, 5))


def test_simulate_des_text_and_timeline(capsys, tmp_path):
    tl = tmp_path / "tl.json"
    status, out, _ = run(
        capsys, "simulate", "--policy", "vertical:n=2,k=3", "--alpha", "0.8", "--pair", "2:1=0.6", "--cost", "0.1",
        "--cost", "0", "--tokens", "20000", "--executor", "des", "--requests", "4", "--rate", "0.05",
        "--timeline", str(tl), "--timeline-png", str(tmp_path / "tl.png"),
    )
    assert status == 0
    assert "EWIF (speedup over AR)" in out and "latency per request p50" in out and "analytic EWIF" in out
    assert json.loads(tl.read_text())["schema"] == "draftsim.timeline"
    assert (tmp_path / "tl.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["simulate", "--policy", "warp:k=3", "--alpha", "0.8"], "unknown policy 'warp'"),
        (["simulate", "--policy", "fixed:k=x", "--alpha", "0.8"], "k='x' is not a valid value"),
        (["simulate", "--policy", "fixed:k=3"], "give exactly one acceptance process"),
        (["simulate", "--policy", "horizontal:counts=2,2", "--alpha", "0.8", "--cost", "0.1"], "uses 2 drafter(s): give --cost"),
        (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--executor", "des", "--rate", "0"], "rate must be finite and > 0"),
        (["simulate", "--policy", "vertical:K=0,1;1,0", "--alpha", "0.8", "--cost", "0.1"], "strictly upper triangular"),
        (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--pair", "1:2=0.5"], "need 0 <= V < M"),
        (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--timeline", "x.json"], "--timeline applies to the discrete-event executor"),
    ],
)
def test_simulate_bad_input(capsys, argv, fragment):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and fragment in err, err


def test_optimize_kmatrix_json(capsys):
    status, out, _ = run(capsys, "optimize", "kmatrix", "--cost", "0.15", "--cost", "0", "--alpha", "0.6",
                         "--pair", "1:0=0.85", "--pair", "2:1=0.55", "--k-max", "10", "--json")
    data = json.loads(out)
    assert status == 0
    assert data["exact"]["ewif"] >= data["grid"]["ewif"] - 1e-12 >= 0
    assert data["exact"]["ewif"] >= data["best_single_drafter"]["ewif"]


def test_optimize_threshold_and_tree_text(capsys):
    status, out, _ = run(capsys, "optimize", "threshold", "--markov", "0.95,0.3", "--stay", "0.95,0.8", "--k-max", "12", "--sweep", "0.02,0.2,3")
    assert status == 0 and "MDP optimum" in out and "oracle (Theorem 4.1)" in out and "h* against" in out
    status, out, _ = run(capsys, "optimize", "tree", "--rank-alphas", "0.6,0.4,0.3", "--budget", "32", "--json")
    data = json.loads(out)
    assert status == 0 and data["tree"]["tokens_per_time"] >= data["best_chain"]["tokens_per_time"]
    assert data["tree"]["size"] == len(data["tree"]["parents"]) <= 32


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["optimize", "kmatrix", "--cost", "0.1", "--alpha", "1.2"], "alpha must lie in [0, 1]"),
        (["optimize", "kmatrix", "--cost", "0.1", "--alpha", "0.8", "--k-max", "50"], "k_max must be an integer in [0, 20]"),
        (["optimize", "kmatrix", "--cost", "0.1", "--cost", "0.1", "--cost", "0.1", "--cost", "0", "--alpha", "0.8"], "up to 3 drafters"),
        (["optimize", "threshold"], "give exactly one of --alpha or --markov"),
        (["optimize", "threshold", "--alpha", "0.8", "--t-draft", "0"], "t_draft must be finite and > 0"),
        (["optimize", "tree", "--rank-alphas", "0.6,x"], "--rank-alphas must be comma-separated numbers"),
        (["optimize", "tree", "--rank-alphas", "0.6", "--verify-cost", "0,1"], "needs finite A > 0 and B >= 0; got A 0, B 1"),
    ],
)
def test_optimize_bad_input(capsys, argv, fragment):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and fragment in err, err


def test_names_a_user_would_write(capsys):
    """A drafter named after its size plans (issue 26: '1b' was refused); simulate takes
    --drafter as serve-sim and cost do."""
    from clirun import run

    status, out, err = run(capsys, "plan", "--drafter", "1b:0.8:0.05", "--drafter", "8b-instruct:0.9:0.2")
    assert status == 0 and "sd 1b" in out, err
    status, out, err = run(capsys, "simulate", "--policy", "fixed:k=4", "--alpha", "0.8", "--target", "llama-3.1-8b", "--drafter",
                           "qwen2.5-0.5b", "--hardware", "h100-sxm", "--tokens", "2000")
    assert status == 0, err


@pytest.mark.parametrize("alpha", ["0", "1"])
def test_simulate_without_variance_says_exactly(alpha, capsys):
    """Acceptance 0 or 1: every round alike, the SE is 0 or rounding (2.7e-18), and a z-score of it is
    nonsense ('+nan SE', '+40.78 SE' were printed): the comparison with the closed form says 'exactly'."""
    from draftsim.cli import main

    assert main(["simulate", "--policy", "fixed:k=3", "--alpha", alpha, "--cost", "0.1", "--tokens", "10000"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("analytic EWIF"))
    assert line.endswith("(exactly)") and "nan" not in line, line
