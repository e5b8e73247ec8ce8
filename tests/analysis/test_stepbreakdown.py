"""A step's breakdown (sim/cost/callparts.py, analysis/stepbreakdown.py): a priced call split into
its forward, CUDA-graph padding, engine host time and fixed overhead from the recorded tokens and
seconds alone, equal to the cost model's own terms at the call's full batch; serve-sim's mean step
of its steady-state window, part by part, in the typed result and --json, the parts adding up to the
simulated step time."""

from __future__ import annotations

import copy
import importlib.metadata
import json
from functools import lru_cache

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.analysis.stepbreakdown import PART_LABELS, step_breakdown
from draftsim.commands.servesim import ServeSimConfig, serve_sim, serving_config
from draftsim.sim.cost.assembly import Deployment, assemble
from draftsim.sim.cost.base import BatchStats
from draftsim.sim.cost.callparts import split_calls
from draftsim.sim.cost.operators import PINNED_VERSION


def _operators_installed() -> bool:
    try:
        return importlib.metadata.version("aiconfigurator-core") == PINNED_VERSION
    except importlib.metadata.PackageNotFoundError:
        return False


#: Deployments whose target calls are split: (target, tp, engine, speculating server, cost model).
DEPLOYMENTS = [("llama-3.1-8b", 1, "vllm", True, "roofline"), ("llama-3.1-70b", 4, "vllm", True, "roofline"),
               ("llama-3.1-8b", 1, "sglang", False, "roofline"),  # host work overlapped: a floor
               ("smollm2-135m", 1, "sglang", False, "roofline"), ("llama-3.1-8b", 1, "none", True, "roofline"),
               ("qwen3-30b-a3b", 2, "vllm", True, "roofline")]
if _operators_installed():
    DEPLOYMENTS.append(("llama-3.1-8b", 1, "vllm", True, "operators"))


@lru_cache(maxsize=None)
def _target(i: int):
    name, tp, engine, speculating, cost_model = DEPLOYMENTS[i]
    built = assemble(Deployment(name, "h100-sxm", tp=tp, overheads=engine, cost_model=cost_model))
    model = built.target if speculating or built.plain_target is None else built.plain_target
    return model, built.engine


def _bare(model):
    """The model without fixed time, engine host time, capture sizes or floor: its GPU forward alone."""
    bare = model.with_overhead(0.0, 0.0)
    bare.floor, bare.graph_tokens = 0.0, None
    return bare


@settings(max_examples=120, deadline=None)
@given(st.integers(0, len(DEPLOYMENTS) - 1), st.lists(st.tuples(st.integers(0, 9), st.integers(0, 6000)), min_size=1, max_size=96))
def test_the_parts_of_a_call_are_the_cost_models_own_terms(i, lanes):
    """From (tokens, seconds) alone the parts add up to the call, none is negative, the fixed part is
    the engine's host time and the hardware's overhead, and the forward plus the padding is the
    model's GPU time at the call's whole batch (contexts and all), the padding the capture sizes'
    own cost: exact, not an estimate."""
    model, engine = _target(i)
    n = np.array([[x for x, _ in lanes]])
    c = np.array([[x for _, x in lanes]])
    stats = BatchStats.of_batch(n, c)
    t = np.atleast_1d(model.stats_time(stats))
    parts = split_calls(model, stats.tokens, t, engine_host=engine.per_step)
    pad = parts["padding"]
    total = parts["forward"] + parts["host"] + parts["overhead"] + (0.0 if pad is None else pad)
    assert np.allclose(total, t, rtol=1e-12, atol=1e-15)
    for name, v in parts.items():
        assert v is None or np.all(v >= -1e-12 * max(float(t.max()), 1e-3)), (name, v)
    if stats.tokens[0] == 0:
        assert t[0] == 0 and all(v is None or v[0] == 0 for v in parts.values())
        return
    gpu = float(_bare(model).stats_time(stats)[0])
    fixed = model.overhead + model.overhead_per_layer * model.model.layers
    if model.floor:  # max(forward, host): the critical path's part
        if t[0] <= model.floor * (1 + 1e-12):
            assert parts["host"][0] == t[0] and gpu + fixed <= model.floor * (1 + 1e-9)
        else:
            assert parts["host"][0] == 0 and parts["overhead"][0] == pytest.approx(fixed)
            assert parts["forward"][0] + (0.0 if pad is None else pad[0]) == pytest.approx(gpu, rel=1e-9)
        return
    assert parts["host"][0] == pytest.approx(min(engine.per_step, fixed), rel=1e-12)
    assert parts["host"][0] + parts["overhead"][0] == pytest.approx(fixed, rel=1e-12)
    if pad is None:  # the operator model: the padding stays inside the forward
        assert DEPLOYMENTS[i][4] == "operators"
        return
    eager = copy.copy(model)
    eager.graph_tokens = None
    assert pad[0] == pytest.approx(float(model.stats_time(stats)[0] - eager.stats_time(stats)[0]), rel=1e-9, abs=1e-15)
    assert parts["forward"][0] == pytest.approx(gpu, rel=1e-9)


def test_a_measured_cost_is_its_forward_whole():
    """A cost that is a measurement (or a fit of one) holds its host time inside it: nothing is split off."""
    from draftsim.sim.cost.linear import CallCost

    model = CallCost(0.002, 0.0001)
    t = np.array([0.0021, 0.0])
    parts = split_calls(model, np.array([1, 0]), t, engine_host=0.001)
    assert np.array_equal(parts["forward"], t) and parts["padding"] is None and not parts["host"].any()


SERVE = dict(hardware="h100-sxm", prompt_len="fixed:128", output_len="uniform:16,64", replications=1)


@settings(max_examples=6, deadline=None)
@given(st.sampled_from([("llama-3.1-8b", ["eagle3"], "fixed:k=3", "vllm"), ("llama-3.1-8b", ["llama-3.2-1b"], "fixed:k=4", "vllm"),
                        ("llama-3.1-8b", [], "ar", "sglang"), ("llama-3.1-8b", ["eagle"], "fixed:k=2", "sglang"),
                        ("qwen3-8b", ["qwen3-0.6b"], "fixed:k=5", "none")]),
       st.floats(0.5, 0.95), st.sampled_from([2.0, 20.0, 80.0]), st.integers(0, 3))
def test_serve_sims_step_parts_add_up_to_the_simulated_step(setup, alpha, qps, seed):
    """For random deployments, loads and acceptance, every recorded step's parts add up to its
    duration, the drafting part is the recorder's, and the mean breakdown's parts add up to the
    mean step of the steps it averages."""
    target, drafters, policy, engine = setup
    config = ServeSimConfig(target=target, drafter_model=drafters or None, engine=engine, policy=policy,
                            alpha=alpha if drafters else None, qps=qps, requests=60, seed=seed, **SERVE)
    serving = serving_config(config)
    from draftsim.commands.servesim import _workload_maker
    from draftsim.sim.serving import run_replications

    _, make = _workload_maker(config, qps)
    run_ = run_replications(serving, make, seed=seed, replications=1).runs[0]
    s = run_.steps
    parts = split_calls(serving.target, s["tokens"], s["duration"] - s["draft"], engine_host=serving.engine.per_step)
    total = s["draft"] + parts["forward"] + parts["host"] + parts["overhead"] + parts["padding"]
    assert np.allclose(total, s["duration"], rtol=1e-12, atol=1e-15)
    bd = step_breakdown(run_, serving)
    assert [p.name for p in bd.parts] == list(PART_LABELS)
    assert sum(p.ms for p in bd.parts) == pytest.approx(bd.step_ms, rel=1e-12)
    assert sum(p.share for p in bd.parts) == pytest.approx(1.0, rel=1e-12)
    assert bd.steps <= len(s["duration"]) and bd.step_ms > 0
    assert (bd.part("drafting").ms == 0) == (not drafters)


def test_serve_sim_carries_the_breakdown_in_its_result_json_and_text(capsys):
    """The typed result holds it; --json holds the same numbers; the text names each part."""
    args = ["serve-sim", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--drafter", "eagle3", "--alpha", "0.8", "--qps", "8",
            "--requests", "120", "--replications", "1", "--prompt-len", "fixed:256", "--output-len", "fixed:64"]
    status, out, err = run(capsys, *args, "--json")
    assert status == 0, err
    doc = json.loads(out)["step_breakdown"]
    result = serve_sim(ServeSimConfig(target="llama-3.1-8b", hardware="h100-sxm", drafter_model=["eagle3"], alpha=0.8, qps=8.0,
                                      requests=120, replications=1, prompt_len="fixed:256", output_len="fixed:64"))
    bd = result.step_breakdown
    assert doc["step_ms"] == pytest.approx(bd.step_ms, rel=1e-12) and doc["steps"] == bd.steps
    for p in bd.parts:
        assert doc["parts"][p.name]["ms_per_step"] == pytest.approx(p.ms, rel=1e-12)
    # vLLM v0.10.1's per-step host time (sim/data/engines.json) is the host part of every step
    assert bd.part("host").ms == pytest.approx(1.21, abs=0.01)
    assert 0 < bd.part("drafting").share < bd.part("target_forward").share
    assert "steady-state window" in doc["window"] and "exact" in doc["split"]
    status, out, err = run(capsys, *args)
    assert status == 0, err
    line = next(x for x in out.splitlines() if x.startswith("step time"))
    assert "target forward" in line and "drafting" in line and "host" in line and "padding" in line


def test_cost_prints_each_calls_split(capsys):
    """draftsim cost splits every call it prices: the parts add up to the call, the target's host
    part is the engine's per-step time, a drafter's its per-draft-forward time, and a
    verification of 5 tokens at batch 1 pays the padding to the 8-token capture size."""
    from draftsim.sim.cost.overheads import engine_overheads

    vllm = engine_overheads("vllm")
    args = ["cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--batch", "1,16", "--new-tokens", "1,5",
            "--drafter", "eagle3", "--drafter", "llama-3.2-1b"]
    status, out, err = run(capsys, *args, "--json")
    assert status == 0, err
    doc = json.loads(out)
    for r in doc["records"]:
        total = r["forward"] + r["host"] + r["overhead"] + (r["padding"] or 0.0)
        assert total == pytest.approx(r["seconds"], rel=1e-12) and r["forward"] > 0
        assert r["host"] == pytest.approx(vllm.per_step if r["role"] == "target" else vllm.per_draft_forward, rel=1e-12)
        assert (r["padding"] is None) == (r["model"] == "eagle3")
        if r["model"] == "llama-3.1-8b":
            assert (r["padding"] > 0) == (r["batch"] * r["new_tokens"] == 5)  # 5 tokens run as the 8-token graph
    assert set(doc["split"]) == {"llama-3.1-8b", "eagle3", "llama-3.2-1b"}
    status, out, err = run(capsys, *args)
    assert status == 0 and "each call split (ms)" in out and "inside forward" in out
