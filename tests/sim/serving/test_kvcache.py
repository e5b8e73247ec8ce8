"""sim.serving.kvcache: block arithmetic, the one-request check and the memory plan.

Block accounting under a running scheduler (plans never exceed the pool, preemption frees
blocks) is tested in tests/sim/serving/test_scheduler.py; a run too big for memory at
the end of this file (test_memory_too_small_says_what_fits).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_server import serving_config, workload

from draftsim.sim.cost import CallCost, RooflineModel, default_catalog
from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving import serve
from draftsim.sim.serving.kvcache import KVCache, blocks_for, memory_plan


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=20), st.integers(1, 4096))
def test_blocks_are_the_fewest_that_hold_the_tokens(tokens, block):
    b = blocks_for(tokens, block)
    t = np.array(tokens)
    assert b.dtype == np.int64
    assert np.all(b * block >= t) and np.all((b - 1) * block < np.maximum(t, 1))
    assert np.all((t == 0) == (b == 0))


@given(st.lists(st.integers(0, 10**5), min_size=2, max_size=20), st.integers(1, 256), st.integers(1, 64))
def test_splitting_tokens_never_needs_fewer_blocks(tokens, block, lookahead):
    """Paging wastes at most one partial block per request: the pool's blocks for several
    requests are between those of their tokens pooled and that plus one per request."""
    kv = KVCache(block, 1, lookahead)
    held = int(kv.request_blocks(tokens).sum())
    pooled = int(blocks_for(sum(tokens) + lookahead * len(tokens), block))
    assert pooled <= held <= pooled + len(tokens)


def test_check_request_says_what_fits():
    kv = KVCache(block_size=16, blocks=10, lookahead=5)  # 160 slots
    kv.check_request(100, 55)  # 155 + 5 = 160: exactly fits
    with pytest.raises(DraftsimError, match="requests fit while prompt \\+ output <= 155 tokens"):
        kv.check_request(100, 56)


@pytest.mark.parametrize("kw, match", [(dict(block_size=0, blocks=1, lookahead=1), "block_size"),
                                        (dict(block_size=16, blocks=0, lookahead=1), "KV blocks"),
                                        (dict(block_size=16, blocks=1, lookahead=0), "lookahead")])
def test_kvcache_ranges(kw, match):
    with pytest.raises(DraftsimError, match=match):
        KVCache(**kw)


def roofline(model: str, hardware: str = "h100-sxm", tp: int = 1) -> RooflineModel:
    cat = default_catalog()
    return RooflineModel(cat.model(model), cat.hardware_spec(hardware), tp=tp)


def test_memory_plan_leaves_what_weights_and_activations_do_not_take():
    target, drafter = roofline("llama-2-7b"), roofline("smollm2-135m")
    plan = memory_plan(target, [drafter, CallCost(0.0)], max_batched_tokens=2048)  # Max-Gram: no weights
    hw = target.hardware
    assert plan.usable == hw.memory * hw.usable_memory
    assert plan.target_weights == target.weight_bytes_per_device()
    assert plan.drafter_weights == drafter.weight_bytes_per_device()
    assert plan.kv_bytes_per_token == float(target.kv_bytes_per_device(1, 1) + drafter.kv_bytes_per_device(1, 1))
    free = plan.usable - plan.target_weights - plan.drafter_weights - plan.activations
    assert plan.tokens == int(free // plan.kv_bytes_per_token) > 0
    assert "KV tokens" in plan.describe() and plan.to_dict()["tokens"] == plan.tokens
    # a drafter on its own device leaves the target's device more room
    apart = memory_plan(target, [drafter], max_batched_tokens=2048, separate_drafter=True)
    assert apart.drafter_weights == 0 and apart.tokens > plan.tokens
    # a bigger step budget needs more activations and leaves less
    assert memory_plan(target, [drafter], max_batched_tokens=16384).tokens < plan.tokens
    # tensor parallelism splits the weights and the KV heads
    assert memory_plan(roofline("llama-2-7b", tp=2), [], max_batched_tokens=2048).tokens > apart.tokens


def test_memory_plan_without_a_roofline_is_unknown_and_too_small_is_refused():
    assert memory_plan(CallCost(0.02), [CallCost(0.002)], max_batched_tokens=2048) is None
    with pytest.raises(DraftsimError, match="nothing is left for the KV cache"):
        memory_plan(roofline("llama-2-13b", "a100-40g"), [roofline("llama-2-7b", "a100-40g")], max_batched_tokens=2048)


# -- a run too big for memory -----------------------------------------------------------------------

def test_memory_too_small_says_what_fits():
    with pytest.raises(DraftsimError, match="requests fit while prompt \\+ output <="):
        serve(serving_config(kv_tokens=500), workload(n=5, prompt=400, output=200), seed=0)
