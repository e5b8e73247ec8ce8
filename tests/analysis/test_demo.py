"""analysis.demo: the demo's steps, each checked against what it claims (``draftsim demo``
end to end, figures included, is tested in tests/draftsim/test_cli.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pngcheck import png_size

from draftsim.analysis import demo
from draftsim.sim import analytic
from draftsim.sim.plan import plan

Z = 4.0


@pytest.mark.parametrize("setting", demo.REFERENCE_SETTINGS, ids=lambda s: s.name)
def test_confirm_holds_the_plan_against_simulation(setting):
    best = plan(list(setting.drafters), mag_alpha=setting.mag_alpha, k_max=16)[0]
    out = demo.confirm(setting, best, tokens=60_000, seed=1)
    assert out["setting"] == setting.name and out["strategy"] == best.description
    assert abs(out["simulated_ewif"] - out["analytic_ewif"]) <= Z * out["se"]


def test_optimisation_step(tmp_path):
    out = demo.optimisation_step(tmp_path, ratios=(0.05, 0.2), k_max=8)
    A, costs = np.array(demo.CASCADE["A"]), [1.0] + demo.CASCADE["costs"]
    exact, grid = out["kmatrix"]["exact"], out["kmatrix"]["grid"]
    assert exact["ewif"] >= grid["ewif"] - 1e-12
    assert analytic.ewif_kmatrix(np.array(exact["K"]), A, costs) == pytest.approx(exact["ewif"])
    for row in out["mdp"]:
        assert row["oracle"] <= row["optimal"] <= row["best_fixed_k"]["latency_per_token"] + 1e-12
    assert png_size(out["figure"])


def test_replay_step_on_the_embedded_trace():
    out = demo.replay_step(k_max=4)
    assert out["sequences"] > 0 and out["tokens"] > 0 and out["rows"]
    for row in out["rows"]:
        assert row["ewif"] > 0 and row["tokens_per_call"] >= 1.0
        if row["oracle_speedup"] is not None:  # Theorem 4.1's oracle bounds every policy on the same flags
            assert row["ewif"] <= row["oracle_speedup"] * (1 + 1e-9)


def test_the_default_figure_folder_is_ignored_by_git():
    """``draftsim demo`` writes to ``figures/demo`` unless told otherwise, a folder git ignores:
    a demo run leaves ``git status`` as it found it (the README's figures are committed copies)."""
    import shutil
    import subprocess
    from pathlib import Path

    from draftsim.commands.demo import DEFAULT_OUT, DemoConfig

    assert DemoConfig().out == DEFAULT_OUT
    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    for name in ("ewif_vs_k.png", "optimal_k_map.png", "threshold_vs_cost.png", "serving_speedup.png"):
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{DEFAULT_OUT}/{name}"], cwd=root)
        assert ignored.returncode == 0, f"{DEFAULT_OUT}/{name} is not ignored by git"
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", f"{DEFAULT_OUT}/{name}"], cwd=root, capture_output=True)
        assert tracked.returncode != 0, f"{DEFAULT_OUT}/{name} is tracked"


def test_run_demo_writes_its_four_figures_under_out_only_and_says_each_stage(tmp_path, monkeypatch):
    """Everything the demo writes lies under ``out_dir`` (nothing in the working folder, no
    tracked figure touched), and each stage's start and end reach ``log`` with the time so far."""
    import re
    from functools import partial
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    committed = {p: p.stat().st_mtime_ns for p in (root / "figures").glob("*.png")}
    work, out = tmp_path / "cwd", tmp_path / "out"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(demo, "optimisation_step", partial(demo.optimisation_step, ratios=(0.05, 0.2), k_max=8))
    lines, counted = [], []

    class Bar:
        def __init__(self, total, desc):
            self.total = total

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            counted.append(self.total)

        def update(self, n=1):
            self.total -= n

    result = demo.run_demo(out, k_max=8, sim_tokens=2_000, real=False, log=lines.append, bar=Bar, serving_requests=40)
    assert sorted(p.name for p in out.iterdir()) == ["ewif_vs_k.png", "optimal_k_map.png", "serving_speedup.png", "threshold_vs_cost.png"]
    assert [Path(p).parent for p in result["figures"]] == [out] * 4 and all(png_size(p) for p in result["figures"])
    assert list(work.iterdir()) == []
    assert {p: p.stat().st_mtime_ns for p in (root / "figures").glob("*.png")} == committed
    assert result["real"]["by_request"]
    assert counted == [0]  # the Monte Carlo bar counted every check
    assert all(re.match(r"\[\s*\d+ s\] ", line) for line in lines), lines
    starts = [line.split("] ", 1)[1][: -len(" ...")] for line in lines if line.endswith(" ...")]
    ends = [re.sub(r": done in [\d.]+ s$", "", line.split("] ", 1)[1]) for line in lines if " done in " in line]
    assert len(starts) == 6 and starts == ends


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_serving_rows_name_each_server_that_did_not_settle(flags):
    rows = [{"qps": 1.0 + i, "speedup": 1.0, "tpot_speedup": 1.0, "throughput_ratio": 1.0, "steady": ss and sa, "steady_reason": "",
             "spec_steady": ss, "spec_overloaded": so and not ss, "ar_steady": sa, "ar_overloaded": ao and not sa}
            for i, (ss, so, sa, ao) in enumerate(flags)]
    for row, (ss, so, sa, ao) in zip(demo.serving_rows({"rows": rows}), flags):
        assert (row["status"] == "") == (ss and sa)
        assert ("speculative overloaded" in row["status"]) == (so and not ss)
        assert ("speculative not settled" in row["status"]) == (not so and not ss)
        assert ("plain overloaded" in row["status"]) == (ao and not sa)
        assert ("plain not settled" in row["status"]) == (not ao and not sa)


@given(st.floats(-0.9, 5.0), st.floats(0.001, 1.0), st.floats(1.0, 100.0))
def test_explain_speaks_exactly_when_prediction_and_measurement_part(error, lo, spread):
    iv = {"error": error, "autoregressive_error": 0.1, "speculative_error": -0.2, "one_token_seconds_range": [lo, lo * spread],
          "profiles": 4, "context": 200}
    lines = demo.explain(iv)
    if abs(error) <= demo.EXPLAIN_ABOVE:
        assert lines == []
    else:
        assert f"{error:+.0%}" in lines[0] and len(lines) == 2
        assert ("speed moved" in lines[1]) == (spread > 1 + demo.EXPLAIN_ABOVE)


@given(st.floats(-0.9, 5.0), st.floats(-0.9, 5.0))
def test_explain_speaks_of_the_planners_forecast_exactly_when_it_missed(forecast_error, error):
    iv = {"error": error, "autoregressive_error": 0.0, "speculative_error": 0.0, "one_token_seconds_range": [0.04, 0.04],
          "profiles": 4, "context": 200, "forecast": 2.0, "forecast_error": forecast_error, "verify_ratio": 1.9, "pilot_verify_ratio": 1.4}
    lines = demo.explain(iv)
    about_forecast = [line for line in lines if "planner's forecast" in line]
    assert len(about_forecast) == (abs(forecast_error) > demo.EXPLAIN_ABOVE)
    assert len(lines) == len(about_forecast) + (2 if abs(error) > demo.EXPLAIN_ABOVE else 0)


def test_interleaved_prediction_prices_each_prompt_with_the_profiles_beside_it():
    """Prompt i's rounds and its autoregressive twin's steps are priced with the mean of profiles
    i and i + 1; prefill and lookups count as measured."""
    from types import SimpleNamespace

    from draftsim.sim.records import Call, Round

    def rnd(i, drafted):
        return Round(round=i, start=0, drafted=drafted, accepted=0, emitted=1, draft_seconds=0.0, target_seconds=0.0, overhead_seconds=0.0)

    prompts = [SimpleNamespace(set="edit", id=7), SimpleNamespace(set="edit", id=9)]
    records = {
        ("rounds", "edit-7"): [rnd(0, 2), rnd(1, 0)],
        ("calls", "edit-7"): [Call(-1, 0, "prefill", 10, 0.5), Call(0, 1, "draft", 0, 0.01), Call(0, 0, "verify", 3, 9.0)],
        ("rounds", "edit-9"): [rnd(0, 1)],
        ("calls", "edit-9"): [Call(-1, 0, "prefill", 10, 0.25), Call(0, 0, "verify", 2, 9.0)],
    }
    trace = SimpleNamespace(records=lambda table, key: records[(table, key)])
    ar_calls = [[Call(-1, 0, "prefill", 10, 0.5)] + [Call(i, 0, "verify", 1, 9.0) for i in range(3)],
                [Call(-1, 0, "prefill", 10, 0.25)] + [Call(0, 0, "verify", 1, 9.0)]]
    slices = [[1.0, 2.0, 3.0], [3.0, 4.0, 5.0], [5.0, 6.0, 7.0]]
    o = 0.125
    out = demo._interleaved_prediction(trace, prompts, ar_calls, slices, o)
    # prompt 1: mean profile [2, 3, 4]; prompt 2: [4, 5, 6]
    spec = (0.5 + 0.01 + (4 + o) + (2 + o)) + (0.25 + (5 + o))
    ar = (0.5 + 3 * (2 + o)) + (0.25 + (4 + o))
    assert out["speculative_seconds"] == pytest.approx(spec) and out["autoregressive_seconds"] == pytest.approx(ar)
    assert out["speedup"] == pytest.approx(ar / spec)
