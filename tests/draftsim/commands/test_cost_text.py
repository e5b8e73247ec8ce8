"""draftsim cost's text and JSON: a profile named once (no "profile profile of"), the forward
split under the device the calls ran on (a CPU profile is not a GPU forward), and ``engine`` the
engine's name with its description in a key of its own."""

from __future__ import annotations

import json

import pytest
from clirun import run

from tests.sim.cost.test_profile import toy_profile


@pytest.fixture
def cpu_profile(tmp_path):
    from draftsim.realrun.profiling import machine_fingerprint

    prof, _ = toy_profile()
    prof.fingerprint["machine"] = machine_fingerprint("cpu")
    prof.save(tmp_path / "p.json")
    return prof, str(tmp_path / "p.json")


def test_a_cpu_profile_is_named_once_and_split_as_a_cpu_forward(capsys, cpu_profile):
    prof, path = cpu_profile
    argv = ["cost", "--target", prof.model, "--drafter-model", "maxgram", "--hardware", "local-cpu", "--dtype", prof.dtype, "--profile", path]
    status, out, err = run(capsys, *argv)
    assert status == 0, err
    assert "profile profile" not in out and f"{prof.model}: profile of {prof.model} (float32, cpu)" in out
    assert "the CPU forward" in out and "GPU" not in out
    status, out, err = run(capsys, *argv, "--json")
    data = json.loads(out)
    assert data["backends"][prof.model] == f"profile of {prof.model} (float32, cpu)"
    assert data["devices"] == {prof.model: "cpu", "maxgram": "cpu"}


def test_cost_json_names_the_engine_and_describes_it_apart(capsys):
    argv = ["cost", "--target", "llama-2-70b", "--drafter-model", "llama-2-7b", "--hardware", "h100-sxm", "--tp", "4"]
    status, out, err = run(capsys, *argv, "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["engine"] == "vllm" and data["engine_label"] == "vllm v0.10.1" and "engine_name" not in data
    assert data["engine_description"].startswith("vllm v0.10.1 (") and "ms per step" in data["engine_description"]
    assert data["devices"] == {"llama-2-70b": "gpu", "llama-2-7b": "gpu"}
    status, out, err = run(capsys, *argv)
    assert f"  engine: {data['engine_description']}" in out.splitlines() and "the GPU forward" in out
    status, out, err = run(capsys, *argv, "--engine", "none", "--json")
    data = json.loads(out)
    assert data["engine"] == "none" and data["engine_description"] == "none (the roofline alone, no engine overheads)"


def test_the_planners_cost_from_names_the_engine_alike(capsys):
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", "--k", "2", "--target", "llama-2-7b", "--drafter-model", "llama-2-7b",
                           "--hardware", "h100-sxm", "--json")
    assert status == 0, err
    info = json.loads(out)["cost_from"]
    assert info["engine"] == "vllm" and info["engine_description"].startswith("vllm v0.10.1 (") and "engine_name" not in info
