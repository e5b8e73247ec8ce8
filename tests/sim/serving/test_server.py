"""sim.serving.server: ServingConfig, serve and run_replications.

The server's behaviour under load (exactness against the Monte Carlo engine, queueing
theory, preemption, routers, controllers) is tested in tests/test_serving.py; this file
tests the configuration's checks, the KV pool it derives, replications and their streams.
"""

from __future__ import annotations

import numpy as np
import pytest

from draftsim.sim import acceptance, policies
from draftsim.sim.cost import CallCost, RooflineModel, default_catalog
from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving import SchedulerConfig, ServingConfig, run_replications, serve, workload_stream
from draftsim.sim.serving.workload import Fixed, Poisson, Workload, make_workload

TARGET, DRAFTER = CallCost(0.02, 1e-4), CallCost(0.002)


def config(**kw) -> ServingConfig:
    kw.setdefault("kv_tokens", 1 << 16)
    return ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), TARGET, [DRAFTER], **kw)


def draw(rng, n=30) -> Workload:
    return make_workload(arrivals=Poisson(), qps=4.0, requests=n, duration=None, prompt=Fixed(64), output=Fixed(32), rng=rng)


@pytest.mark.parametrize("kw, match", [
    (dict(replicas=0), "replicas"),
    (dict(router="random"), "unknown router"),
    (dict(kv_tokens=0), "kv_tokens"),
])
def test_config_ranges(kw, match):
    with pytest.raises(DraftsimError, match=match):
        config(**kw)


def test_a_drafter_cost_per_drafter():
    with pytest.raises(DraftsimError, match="uses 2 drafter\\(s\\); give a cost model for each \\(got 1\\)"):
        ServingConfig(policies.VerticalCascade([[0, 2, 0], [0, 0, 3], [0, 0, 0]]), acceptance.Bernoulli(0.8), TARGET, [DRAFTER])


def test_kv_pool_from_tokens_or_from_the_hardware():
    kv, plan = config(kv_tokens=1000, scheduler=SchedulerConfig(block_size=16)).kv_cache()
    assert (kv.blocks, kv.block_size, kv.lookahead, plan) == (62, 16, 5, None)
    assert config(kv_tokens=None).kv_cache() == (None, None)  # linear costs know no memory: unlimited
    with pytest.raises(DraftsimError, match="less than one block of 16"):
        config(kv_tokens=15).kv_cache()
    cat = default_catalog()
    hw = cat.hardware_spec("h100-sxm")
    roof = ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), RooflineModel(cat.model("llama-2-7b"), hw),
                         [RooflineModel(cat.model("smollm2-135m"), hw)])
    kv, plan = roof.kv_cache()
    assert kv.blocks == plan.tokens // 16 and plan.tokens > 10_000


def test_check_refuses_what_cannot_be_served():
    wl = Workload(np.zeros(2), np.array([100, 3000]), np.array([10, 100]), np.zeros(2, dtype=np.int64))
    with pytest.raises(DraftsimError, match="memory too small for one request"):
        config(kv_tokens=2048).check(wl)
    with pytest.raises(DraftsimError, match="without chunked prefill a prefill .* up to 3,100"):
        config(scheduler=SchedulerConfig(max_num_batched_tokens=2048, chunked_prefill=False)).check(wl)
    config(scheduler=SchedulerConfig(max_num_batched_tokens=2048)).check(wl)  # chunked: fine


def test_serve_reports_progress_per_request_and_its_setup():
    done = []
    wl = draw(np.random.default_rng(0))
    run = serve(config(), wl, seed=1, progress=done.append)
    assert sum(done) == len(wl) and np.all(np.isfinite(run.finish))
    assert run.meta["policy"] == repr(policies.FixedK(4)) and run.kv_blocks == (1 << 16) // 16
    assert np.all(run.first_token >= run.arrival) and np.all(run.finish >= run.first_token)


def test_replications_draw_their_own_workloads_and_combine():
    seen = []

    def make(rng):
        wl = draw(rng)
        seen.append(wl.arrival.copy())
        return wl

    res = run_replications(config(), make, seed=5, replications=3, keep_runs=False)
    assert len(res.summaries) == 3 and len(res.runs) == 1 and res.summary["replications"] == 3
    assert not np.array_equal(seen[0], seen[1])
    np.testing.assert_array_equal(seen[0], draw(workload_stream(5, 0)).arrival)
    assert res.summary["ttft"]["mean"] == pytest.approx(np.mean([s["ttft"]["mean"] for s in res.summaries]))
    assert res.summary["ci95"]["ttft"]["mean"] > 0
    again = run_replications(config(), draw, seed=5, replications=3)
    assert [s["e2e"] for s in again.summaries] == [s["e2e"] for s in res.summaries] and len(again.runs) == 3
    with pytest.raises(DraftsimError, match="replications"):
        run_replications(config(), draw, replications=0)
