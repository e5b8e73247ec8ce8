"""sim.cost.roofline: the roofline of a dense decoder LM on catalog hardware.

Every path prices the same sums, what limits a call, the fixed overhead and the KV cache's
size per device; at the end, monotonicity, tensor parallelism, the one-token weight read,
parts against the fast path, GQA, memory fit, overhead fitting and published-number checks.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim.cost import (
    BatchStats,
    RooflineModel,
    default_catalog,
    fit_overhead,
)
from draftsim.sim.errors import DraftsimError

CAT = default_catalog()


def roofline(model="llama-2-7b", hw="h100-sxm", **kw) -> RooflineModel:
    return RooflineModel(CAT.model(model), CAT.hardware_spec(hw), **kw)


MODELS = [roofline(), roofline("smollm2-135m", "local-cpu", dtype="float32"), roofline("llama-2-70b", "a100-80g", tp=4),
          roofline("qwen2.5-7b", "h200", tp=2, pp=2)]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(range(len(MODELS))), st.integers(1, 64), st.integers(1, 64), st.integers(0, 8192))
def test_every_path_prices_the_same_sums(i, b, n, c):
    """shape_time (uniform shapes), forward_time (a materialised batch) and the operator
    parts (memory + compute + fixed) agree."""
    m = MODELS[i]
    t = float(m.shape_time(b, n, c))
    assert t == pytest.approx(float(m.forward_time(np.full((1, b), n), np.full((1, b), c))[0]), rel=1e-12)
    mem, cmp, fixed = m._parts(BatchStats.of_shape(b, n, c))
    assert t == pytest.approx(float(mem + cmp + fixed), rel=1e-9)


def test_what_limits_a_call():
    gpu = roofline()
    assert gpu.shape_bound(1, 1, 512) == "memory"  # decoding reads the weights for one token
    assert gpu.shape_bound(1, 8192, 0) == "compute"  # a long prefill multiplies them
    cpu = roofline("smollm2-135m", "local-cpu", dtype="float32")
    assert cpu.shape_bound(1, 1, 0) == "overhead"  # a small model on this CPU: launch time per layer


def test_the_fixed_overhead_adds_to_every_call():
    base = roofline()
    more = base.with_overhead(0.001, 1e-5)
    b, n, c = np.array([1, 8, 64]), np.array([1, 5, 1]), np.array([0, 100, 4000])
    np.testing.assert_allclose(more.shape_time(b, n, c) - base.shape_time(b, n, c), 0.001 + 1e-5 * base.model.layers, rtol=1e-9)
    assert more.forward_time([[0, 0]], [[1, 1]])[0] == 0.0  # an empty call is idle, overhead or not


def test_kv_cache_per_device():
    m = roofline()  # Llama-2-7B: 32 layers x 32 KV heads x 128 x 2 (K and V) x 2 bytes = 512 KiB per token
    assert float(m.kv_bytes_per_device(1, 1)) == 2 * 32 * 32 * 128 * 2
    assert float(m.kv_bytes_per_device(3, 100)) == 300 * float(m.kv_bytes_per_device(1, 1))
    assert float(roofline(tp=2).kv_bytes_per_device(1, 1)) == float(m.kv_bytes_per_device(1, 1)) / 2
    gqa = roofline("llama-3-8b")  # 8 KV heads: replicated beyond 8 devices, split up to them
    per = float(gqa.kv_bytes_per_device(1, 1))
    assert float(roofline("llama-3-8b", tp=8).kv_bytes_per_device(1, 1)) == per / 8
    assert float(roofline("llama-3-8b", tp=16).kv_bytes_per_device(1, 1)) == per / 8
    assert float(roofline(pp=2).kv_bytes_per_device(1, 1)) == float(m.kv_bytes_per_device(1, 1)) / 2
    assert roofline(tp=2, pp=2).devices == 4


@pytest.mark.parametrize("kw, match", [
    (dict(hw="local-cpu", tp=2), "lists no interconnect"),
    (dict(mfu=1.5), "mfu must lie in \\[1e-06, 1\\]"),
    (dict(mbu=1e-320), "mbu must lie in \\[1e-06, 1\\]"),
    (dict(overhead=-1.0), "overhead"),
    (dict(tp=0), "tp"),
    (dict(pp=33), "pp"),
    (dict(dtype="float64"), "unknown dtype 'float64'"),
])
def test_refused_configurations(kw, match):
    with pytest.raises(DraftsimError, match=match):
        roofline(**kw)


# -- roofline properties, memory fit, overhead fitting, published measurements ----------------------

GPU_PAIRS = [("llama-2-7b", "a100-80g"), ("llama-3-8b", "h100-sxm"), ("qwen2.5-0.5b", "l4"), ("gemma-2-9b", "h200"),
             ("smollm2-135m", "rtx-4090"), ("mistral-7b", "a10g")]


sizes = st.integers(1, 512)


contexts = st.integers(0, 8192)


@pytest.mark.parametrize("model,hw", GPU_PAIRS)
@given(b=sizes, n=sizes, c=contexts, db=st.integers(0, 64), dn=st.integers(0, 64), dc=st.integers(0, 4096))
def test_roofline_is_monotone_in_batch_tokens_and_context(model, hw, b, n, c, db, dn, dc):
    r = roofline(model, hw, check_memory=False)
    t = r.shape_time(b, n, c)
    assert r.shape_time(b + db, n, c) >= t
    assert r.shape_time(b, n + dn, c) >= t
    assert r.shape_time(b, n, c + dc) >= t


@pytest.mark.parametrize("model,hw", [("llama-2-70b", "a100-80g"), ("llama-3-8b", "h100-sxm"), ("qwen2.5-72b", "h200"), ("gemma-2-27b", "h100-sxm")])
@given(tp=st.sampled_from([1, 2, 4, 8]), b=sizes, n=st.integers(1, 64), c=contexts)
def test_tensor_parallel_is_never_faster_than_its_share_of_the_work(model, hw, tp, b, n, c):
    one = roofline(model, hw, check_memory=False)
    par = roofline(model, hw, tp=tp, check_memory=False)
    t1, tp_t = float(one.shape_time(b, n, c)), float(par.shape_time(b, n, c))
    assert tp_t * tp >= t1 * (1 - 1e-12)  # no super-linear speed-up: every device does at least 1/tp of the work
    assert tp_t >= float(par.with_overhead(0.0).shape_time(b, n, c)) - 1e-15


def test_roofline_is_the_weight_read_time_for_one_token_calls():
    r = roofline("llama-2-7b", "a100-80g")
    hw = CAT.hardware_spec("a100-80g")
    m = r.model  # every weight is read once, except the embedding table: one row per new token
    weights = (m.params - m.vocab * m.hidden) * 2 / (hw.memory_bandwidth * hw.mbu)
    assert float(r.shape_time(1, 1, 0)) == pytest.approx(weights, rel=0.01)
    assert r.shape_bound(1, 1, 0) == "memory"
    assert r.shape_bound(1024, 512, 0) == "compute"
    assert roofline("smollm2-135m", "h100-sxm", overhead=0.01).shape_bound(1, 1, 10) == "overhead"


def test_roofline_parts_sum_to_the_fast_path():
    r = roofline("qwen2.5-7b", "a10g", tp=2, check_memory=False)
    rng = np.random.default_rng(0)
    stats = BatchStats.of_shape(rng.integers(1, 300, 2000), rng.integers(1, 3000, 2000), rng.integers(0, 9000, 2000))
    mem, cmp, fixed = r._parts(stats)
    np.testing.assert_allclose(r.stats_time(stats), mem + cmp + fixed, rtol=1e-12)
    rng = np.random.default_rng(0)
    b, n, c = rng.integers(1, 300, 2000), rng.integers(1, 3000, 2000), rng.integers(0, 9000, 2000)
    np.testing.assert_allclose(r.shape_time(b, n, c), r.stats_time(BatchStats.of_shape(b, n, c)), rtol=1e-12)  # shape fast path
    assert r.shape_time([1, 2], 3, [[0], [9]]).shape == (2, 2) and np.ndim(r.shape_time(1, 1, 1)) == 0


def test_gqa_reads_less_kv_cache():
    dense = roofline("llama-2-7b", "a100-80g")
    gqa = roofline("mistral-7b", "a100-80g")
    extra = lambda r: float(r.shape_time(32, 1, 4096) - r.shape_time(32, 1, 0))  # noqa: E731
    assert extra(gqa) == pytest.approx(extra(dense) / 4, rel=0.05)  # 32 heads vs 8 KV heads


def test_a_model_that_does_not_fit_says_by_how_much():
    with pytest.raises(DraftsimError, match=r"138.0 GB of weights.*GB short"):
        roofline("llama-2-70b", "a100-80g")
    r = roofline("llama-2-70b", "a100-80g", tp=2)
    with pytest.raises(DraftsimError, match="KV cache"):
        r.check_fits(512, 8192)


def test_fit_overhead_recovers_a_known_overhead():
    r = roofline("smollm2-135m", "l4")
    truth = r.with_overhead(0.004)
    b, n, c = np.meshgrid([1, 2, 4], [1, 4, 16], [0, 512], indexing="ij")
    fitted = fit_overhead(r, b, n, c, truth.shape_time(b, n, c))
    assert fitted.overhead == pytest.approx(0.004, rel=1e-3)


@pytest.mark.parametrize("model,tp,tokens_per_s,tolerance", [
    ("llama-2-7b", 1, 104.9, 0.10), ("llama-2-70b", 2, 21.32, 0.10), ("llama-2-70b", 4, 38.01, 0.10), ("llama-2-70b", 8, 62.50, 0.20),
])
def test_roofline_matches_gpt_fast_on_a100(model, tp, tokens_per_s, tolerance):
    """gpt-fast README: batch 1, bf16, compiled, A100-80GB (330 W); the catalog's default efficiencies."""
    r = roofline(model, "a100-80g", tp=tp)
    assert float(r.shape_time(1, 1, 5)) == pytest.approx(1 / tokens_per_s, rel=tolerance)


def test_roofline_predicts_specdec_70b_from_an_overhead_fitted_on_7b():
    """SpecDec++ App. D.2: t = 0.0207 s (7B, one A100-80G) and 0.108 s (70B over two, layer-sharded)."""
    r7 = roofline("llama-2-7b", "a100-80g")
    per_layer = (0.0207 - float(r7.shape_time(1, 1, 256))) / 32
    r70 = roofline("llama-2-70b", "a100-80g", pp=2).with_overhead(0.0, per_layer)
    assert float(r70.shape_time(1, 1, 256)) == pytest.approx(0.108, rel=0.2)
