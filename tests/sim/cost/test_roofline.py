"""sim.cost.roofline: the roofline of a dense decoder LM on catalog hardware.

Monotonicity, tensor parallelism, the one-token weight read, parts against the fast path,
GQA, memory fit, overhead fitting and published-number checks are in tests/test_costs.py;
this file adds that every path prices the same sums, what limits a call, the fixed overhead,
and the KV cache's size per device.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim.cost import BatchStats, RooflineModel, default_catalog
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
