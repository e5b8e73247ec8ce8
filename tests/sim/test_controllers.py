"""sim.controllers on the serving simulator: K tables and disable-above cap drafting, goodput tunes
k per step with the batch, and the controllers' specs are checked."""

from __future__ import annotations

import numpy as np
import pytest

from draftsim.sim import acceptance, policies
from draftsim.sim.controllers import NO_CAP, DisableAbove, Goodput, KTable
from draftsim.sim.cost import CallCost
from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving import SchedulerConfig, serve, summarize_run
from tests.sim.serving.test_server import serving_config, workload


def test_controllers_cap_drafting():
    wl = workload(n=150, qps=40.0)
    off = serve(serving_config(controller=DisableAbove(0)), wl, seed=0)
    assert off.spec["num_draft_tokens"] == 0
    table = serve(serving_config(controller=KTable("1-2:4,3-:1")), wl, seed=0)
    assert table.spec["num_draft_tokens"] > 0
    per_draft = table.spec["num_draft_tokens"] / table.spec["num_drafts"]
    assert 1.0 <= per_draft < 4.0


def test_goodput_controller_beats_fixed_k_under_load():
    """A target whose verification grows with the tokens: at 10 req/s drafting k = 6 for every
    request is slower than no drafting at all, while the goodput controller's k per step beats
    both."""
    wl = workload(n=400, qps=10.0, prompt=128, output=64, seed=3)
    target = CallCost(0.01, 4e-4)
    fixed = summarize_run(serve(serving_config(policies.FixedK(6), target=target, drafter=CallCost(0.001)), wl, seed=3))
    smart = summarize_run(serve(serving_config(policies.FixedK(6), target=target, drafter=CallCost(0.001), controller=Goodput()), wl, seed=3))
    ar = summarize_run(serve(serving_config(policies.Autoregressive(), target=target), wl, seed=3))
    assert smart["e2e"]["mean"] < 0.8 * fixed["e2e"]["mean"]
    assert smart["e2e"]["mean"] < ar["e2e"]["mean"] < fixed["e2e"]["mean"]


def test_ktable_validation():
    with pytest.raises(DraftsimError, match="gap"):
        KTable("1-4:3,6-:1")
    with pytest.raises(DraftsimError, match="overlap"):
        KTable("1-4:3,4-:1")
    with pytest.raises(DraftsimError, match="start at batch size 1"):
        KTable("2-:3")
    with pytest.raises(DraftsimError, match="overlap"):
        KTable("1-:3,8-:1")
    with pytest.raises(DraftsimError, match="max_num_seqs"):
        serving_config(controller=KTable("1-8:3"), scheduler=SchedulerConfig(max_num_seqs=16))
    assert KTable("1-8:4,9-:0").caps(np.array([1, 8, 9, 500]), np.zeros(4)).tolist() == [4, 4, 0, 0]


def test_goodput_controller_turns_drafting_down_with_the_batch():
    """Verification cost growing with tokens: at batch 1 drafting pays, at a huge batch not."""
    g = Goodput()
    target = CallCost(0.01, 2e-4)
    g.bind(policies.FixedK(6), acceptance.Bernoulli(0.8), target, [CallCost(0.0005)], 256)
    caps = g.caps(np.array([1, 256]), np.array([100, 100]))
    assert caps[0] >= 3 and caps[1] <= 1
    assert DisableAbove(4).caps(np.array([4, 5]), np.zeros(2)).tolist() == [NO_CAP, 0]
