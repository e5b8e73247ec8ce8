"""sim.cost.base: BatchStats, the CostModel plumbing and the cost coefficient.

The sums' invariants for any batch and any backend; at the end, one uniform example of
BatchStats, padding slots and refused shapes on the roofline.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftsim.sim.cost import (
    BOUNDS,
    BatchStats,
    CallCost,
    CostModel,
    RooflineModel,
    coefficient,
    default_catalog,
)
from draftsim.sim.errors import DraftsimError

slots = st.lists(st.tuples(st.integers(0, 64), st.integers(0, 4096)), min_size=1, max_size=12)


@given(slots, st.randoms(use_true_random=False))
def test_batch_sums_ignore_slot_order_and_padding(batch, rnd):
    n = np.array([s[0] for s in batch])
    c = np.array([s[1] for s in batch])
    a = BatchStats.of_batch(n[None], c[None])
    order = list(range(len(batch)))
    rnd.shuffle(order)
    padded_n = np.concatenate([n[order], [0, 0]])
    padded_c = np.concatenate([c[order], [123, 9]])  # an empty slot's context is ignored
    b = BatchStats.of_batch(padded_n[None], padded_c[None])
    for f in ("sequences", "tokens", "cached", "pairs"):
        assert getattr(a, f)[0] == pytest.approx(getattr(b, f)[0])
    active = n > 0
    assert a.sequences[0] == active.sum() and a.tokens[0] == n.sum() and a.cached[0] == c[active].sum()
    # causal attention: new token j of a sequence sees its c cached tokens and j new ones
    assert a.pairs[0] == pytest.approx(sum(sum(ci + j for j in range(1, ni + 1)) for ni, ci in zip(n, c)))


@given(st.integers(1, 64), st.integers(1, 32), st.integers(0, 4096))
def test_uniform_shapes_are_batches_of_equal_slots(b, n, c):
    s, t = BatchStats.of_shape(b, n, c), BatchStats.of_batch(np.full((1, b), n), np.full((1, b), c))
    for f in ("sequences", "tokens", "cached", "pairs"):
        assert float(getattr(s, f)) == pytest.approx(getattr(t, f)[0])
    assert float(s.mean_new_tokens) == n and float(s.mean_context) == c


def test_empty_calls_have_zero_means():
    s = BatchStats.of_batch([[0, 0]], [[5, 5]])
    assert s.mean_new_tokens[0] == 0 and s.mean_context[0] == 0


class Stub(CostModel):
    """Every active call takes 1 s + 1 s per token; bound: compute when over 4 tokens."""

    name = "stub"

    def _time(self, stats):
        return 1.0 + stats.tokens

    def _bound(self, stats):
        return np.where(stats.tokens > 4, 3, 1)


def test_the_plumbing_zeroes_empty_calls_and_names_bounds():
    m = Stub()
    np.testing.assert_array_equal(m.forward_time([[1, 2], [0, 0], [5, 0]], 0), [4.0, 0.0, 6.0])
    assert list(m.bound([[1, 2], [0, 0], [5, 0]])) == ["overhead", "idle", "compute"]
    assert m.shape_bound(1, 9) == "compute" and m.one_token(100) == 2.0
    assert repr(m) == "<Stub stub>" and BOUNDS[0] == "idle"


@given(st.floats(0.001, 1.0), st.floats(0.0, 0.1), st.floats(0.0, 1.0), st.floats(0.0, 0.1), st.integers(1, 16))
def test_coefficient_is_the_ratio_of_calls_at_one_shape(ta, tb, da, db, n):
    target, drafter = CallCost(ta, tb), CallCost(da, db)
    assert coefficient(drafter, target) == pytest.approx((da + db) / (ta + tb))
    assert coefficient(drafter, target, batch=2, new_tokens=n) == pytest.approx((da + 2 * n * db) / (ta + 2 * n * tb))


def test_coefficient_needs_a_target_that_takes_time():
    with pytest.raises(DraftsimError, match="time > 0"):
        coefficient(CallCost(1.0), CallCost(0.0))


# -- batches and shapes through a backend (a roofline) ----------------------------------------------

CAT = default_catalog()


def roofline(model="llama-3-8b", hw="h100-sxm", **kw):
    return RooflineModel(CAT.model(model), CAT.hardware_spec(hw), kw.pop("dtype", "bfloat16"), **kw)


def test_batch_stats_match_a_uniform_shape():
    a = BatchStats.of_batch([[3, 3, 3, 3]], [[100, 100, 100, 100]])
    b = BatchStats.of_shape(4, 3, 100)
    for f in ("sequences", "tokens", "cached", "pairs"):
        assert getattr(a, f)[0] == pytest.approx(getattr(b, f))
    assert b.pairs == 4 * 3 * (100 + 2)  # each new token attends to the cache and the new tokens up to itself


def test_padding_slots_are_absent_and_empty_calls_are_idle():
    r = roofline()
    t = r.forward_time([[2, 0, 0], [2, 2, 0], [0, 0, 0]], [[64, 9999, 9999], [64, 64, 0], [5, 5, 5]])
    assert t[0] == pytest.approx(float(r.shape_time(1, 2, 64)))
    assert t[1] == pytest.approx(float(r.shape_time(2, 2, 64)))
    assert t[2] == 0.0
    assert list(r.bound([[0, 0]], [[1, 1]])) == ["idle"]


@pytest.mark.parametrize("bad", [{"new_tokens": [[-1]]}, {"new_tokens": [[1.5]]}, {"new_tokens": [[1]], "context": [[-3]]}])
def test_bad_batches_are_refused(bad):
    with pytest.raises(DraftsimError):
        roofline().forward_time(**{"context": 0, **bad})


@pytest.mark.parametrize("shape", [(0, 1, 0), (1, 0, 0), (1, 1, -1), (2.5, 1, 0)])
def test_bad_shapes_are_refused(shape):
    with pytest.raises(DraftsimError):
        roofline().shape_time(*shape)
