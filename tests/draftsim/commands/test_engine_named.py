"""Every command that prices from hardware names, in its text output as in its JSON, the engine
it priced with (the default one too) and the target's tp beyond 1."""

from __future__ import annotations

import json

import pytest
from clirun import run

HW = ["--target", "llama-2-70b", "--drafter-model", "llama-2-7b", "--hardware", "h100-sxm", "--tp", "4"]


@pytest.mark.parametrize("argv", [
    ["ewif", "--alpha", "0.8", "--k", "3", *HW],
    ["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--tokens", "500", *HW],
    ["optimize", "kmatrix", "--alpha", "0.7", "--k-max", "3", *HW],
    ["optimize", "threshold", "--alpha", "0.8", "--k-max", "4", *HW],
    ["plan", "--drafter", "big:0.8:llama-2-7b", "--target", "llama-2-70b", "--hardware", "h100-sxm", "--tp", "4"],
])
def test_the_priced_planners_name_the_default_engine_and_tp_in_text(capsys, argv):
    status, out, err = run(capsys, *argv)
    assert status == 0, err
    line = next(x for x in out.splitlines() if x.startswith("costs from "))
    assert "engine vllm v0.10.1" in line and "target on tp 4" in line, line
    status, out, err = run(capsys, *argv, "--json")
    info = json.loads(out)["cost_from"]
    assert info["engine_label"] == "vllm v0.10.1" and info["tp"] == 4 and info["drafter_tp"] == 4


def test_the_bare_roofline_and_a_drafter_tp_of_its_own_are_named(capsys):
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", "--k", "3", *HW, "--engine", "none", "--drafter-tp", "1")
    assert status == 0, err
    line = out.splitlines()[0]
    assert "engine none (the roofline alone)" in line and "target on tp 4" in line and "drafters on tp 1" in line, line
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", "--k", "3", "--target", "llama-2-7b", "--drafter-model", "llama-2-7b",
                           "--hardware", "h100-sxm")
    assert status == 0 and "engine vllm v0.10.1" in out and "tp" not in out.splitlines()[0]


def test_calibrate_names_what_it_fitted_in_text_and_json(capsys, tmp_path):
    from tests.sim.cost.test_calibrate import PROFILE

    argv = ["calibrate", "--target", "smollm2", "--hardware", "h100-sxm", "--profile", str(PROFILE), "--dtype", "float32", "--tp", "3",
            "--out", str(tmp_path / "c.json")]
    status, out, err = run(capsys, *argv)
    assert status == 0, err
    assert "the roofline of smollm2 (float32, tp 3), engine none" in out.splitlines()[0]
    status, out, err = run(capsys, *argv, "--json")
    data = json.loads(out)
    assert (data["target"], data["dtype"], data["tp"], data["engine"]) == ("smollm2", "float32", 3, "none")


def test_a_draft_model_priced_on_one_device_says_so(capsys):
    """Qwen2.5-0.5B's 14 heads do not split over tp 4: it is priced at tp 1 (as vLLM may run it), and the
    'costs from' line and --json say tp 1, not the target's 4."""
    argv = ["ewif", "--alpha", "0.8", "--k", "3", "--target", "qwen2.5-7b", "--drafter-model", "qwen2.5-0.5b",
            "--hardware", "h100-sxm", "--tp", "4"]
    status, out, err = run(capsys, *argv)
    assert status == 0, err
    assert "drafters on tp 1" in next(x for x in out.splitlines() if x.startswith("costs from "))
    status, out, err = run(capsys, *argv, "--json")
    assert json.loads(out)["cost_from"]["drafter_tp"] == 1
