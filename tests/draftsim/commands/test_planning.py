"""The planning commands (draftsim/commands/planning.py: ewif, plan, simulate, optimize) priced from
``--target``/``--hardware`` rooflines and measured profiles, as ``draftsim cost`` prices them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import run

from draftsim.sim import analytic
from draftsim.sim.cost import (
    RooflineModel,
    coefficient,
    default_catalog,
)
from tests.sim.cost.test_profile import toy_profile

# -- the planning commands take the same model/hardware options -------------------------------------

CAT = default_catalog()


def roofline(model="llama-3-8b", hw="h100-sxm", **kw):
    return RooflineModel(CAT.model(model), CAT.hardware_spec(hw), kw.pop("dtype", "bfloat16"), **kw)


HW = ["--target", "llama-2-70b", "--hardware", "a100-80g", "--tp", "2", "--engine", "none"]  # the bare roofline


def test_ewif_from_hardware_uses_the_roofline_coefficient(capsys):
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", *HW, "--drafter-model", "llama-2-7b", "--cost-context", "256", "--json")
    assert status == 0, err
    data = json.loads(out)
    # the draft model runs at the target's TP by default (as vLLM runs it) ...
    c = coefficient(roofline("llama-2-7b", "a100-80g", tp=2), roofline("llama-2-70b", "a100-80g", tp=2), context=256)
    assert data["cost"] == pytest.approx(float(c)) and data["cost_from"]["hardware"] == "a100-80g"
    # ... and on its own devices when told
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", *HW, "--drafter-model", "llama-2-7b", "--drafter-tp", "1", "--cost-context", "256",
                           "--json")
    c = coefficient(roofline("llama-2-7b", "a100-80g"), roofline("llama-2-70b", "a100-80g", tp=2), context=256)
    assert status == 0 and json.loads(out)["cost"] == pytest.approx(float(c))
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", "--cost", "0.1", *HW, "--drafter-model", "llama-2-7b")
    assert status == 2 and "not both" in err


def test_plan_simulate_optimize_from_hardware(capsys):
    status, out, err = run(capsys, "plan", "--drafter", "big:0.8:llama-2-7b", "--drafter", "tiny:0.5:0.0", *HW, "--json")
    assert status == 0, err
    drafters = json.loads(out)["drafters"]
    assert drafters[0]["cost"] == pytest.approx(json.loads(out)["cost_from"]["coefficients"][0]) and drafters[1]["cost"] == 0.0
    status, out, err = run(capsys, "simulate", "--policy", "fixed:k=3", "--alpha", "0.8", *HW, "--drafter-model", "llama-2-7b", "--tokens", "2000", "--json")
    assert status == 0, err
    status, out, err = run(capsys, "optimize", "kmatrix", "--alpha", "0.7", *HW, "--drafter-model", "llama-2-7b", "--drafter-model", "maxgram",
                           "--k-max", "4", "--json")
    assert status == 0, err
    assert json.loads(out)["costs"][2] == 0.0
    status, out, err = run(capsys, "optimize", "tree", "--rank-alphas", "0.7,0.2", "--budget", "8", *HW, "--drafter-model", "llama-2-7b", "--json")
    assert status == 0, err
    status, _, err = run(capsys, "simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--target", "llama-2-70b", "--hardware", "a100-80g",
                         "--drafter-model", "llama-2-7b")
    assert status == 2 and "GB short" in err


def test_planning_from_hardware_prices_the_targets_verification(capsys):
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", *HW, "--drafter-model", "llama-2-7b", "--cost-context", "256", "--k-max", "8", "--json")
    assert status == 0, err
    data = json.loads(out)
    target = roofline("llama-2-70b", "a100-80g", tp=2)
    t = np.array([float(target.shape_time(1, n, 256)) for n in range(1, 10)])
    assert data["cost_from"]["verify"] == pytest.approx((t / t[0]).tolist(), rel=1e-9)
    for row in data["rows"]:
        k = row["k"]
        assert row["ewif"] == pytest.approx(float(analytic.expected_tokens(0.8, k)) / (data["cost"] * k + t[k] / t[0]), rel=1e-9)
    best = max(data["rows"], key=lambda r: r["ewif"])
    assert data["best"]["k"] == best["k"] and best["best"]
    status, out, err = run(capsys, "plan", "--drafter", "big:0.8:llama-2-7b", *HW, "--k-max", "8", "--cost-context", "256", "--json")
    assert status == 0, err
    sd = [s for s in json.loads(out)["strategies"] if s["kind"] == "sd"][0]
    assert sd["k"] == data["best"]["k"] and sd["ewif"] == pytest.approx(data["best"]["ewif"], rel=1e-9)


def test_planning_with_a_profile_stops_where_its_grid_does(capsys, tmp_path):
    from draftsim.realrun.profiling import machine_fingerprint

    prof, _ = toy_profile()  # new tokens up to 8
    prof.fingerprint["machine"] = machine_fingerprint("cpu")
    prof.save(tmp_path / "p.json")
    status, out, err = run(capsys, "ewif", "--alpha", "0.9", "--target", prof.model, "--drafter-model", prof.model, "--hardware", "local-cpu",
                           "--profile", str(tmp_path / "p.json"), "--dtype", prof.dtype, "--cost-batch", "2", "--cost-context", "128", "--json")
    assert status == 0, err
    data = json.loads(out)
    assert len(data["cost_from"]["verify"]) == 8 and [r["k"] for r in data["rows"]] == list(range(8))
    status, _, err = run(capsys, "ewif", "--alpha", "0.9", "--k", "9", "--target", prof.model, "--drafter-model", prof.model, "--hardware", "local-cpu",
                         "--profile", str(tmp_path / "p.json"), "--dtype", prof.dtype, "--cost-batch", "2", "--cost-context", "128")
    assert status == 2 and "drafts up to 7 tokens" in err and err.count("\n") == 1
