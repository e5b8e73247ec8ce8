"""sim.serving.layout: a dense ragged batch cache's width.

Its bounds on random windows (at least the longest context, at most what the compaction rule
lets stale slots grow to, exact for one row) are a property
(test_ragged_width_bounds); this file also checks the rule's ranges and a hand-worked window.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving.layout import LayoutState, RaggedLayout


@pytest.mark.parametrize("kw, match", [(dict(compact_ratio=1.0), "compact_ratio"), (dict(compact_ratio=-0.1), "compact_ratio"),
                                       (dict(compact_min=-1), "compact_min")])
def test_compaction_rule_ranges(kw, match):
    with pytest.raises(DraftsimError, match=match):
        RaggedLayout(**kw)


def test_two_rows_by_hand():
    """Rows of context 10 and 4, compacted; each step verifies 5 tokens a row and the rows keep
    1 and 5: every forward attends over the furthest row's end, the axis grows by 5 a step,
    and the slow row's holes stay (the stale share stays under one half: no compaction)."""
    state = LayoutState(2)
    state.after(np.arange(2), (np.array([10.0, 4.0]), 10.0))
    W = 3
    active = np.ones((W, 2), dtype=bool)
    n = np.full((W, 2), 5)
    e = np.array([[1, 5], [1, 5], [1, 5]])
    c = np.array([[10, 4], [11, 9], [12, 14]], dtype=float)
    width, compacted, snaps = RaggedLayout(0.5, 0).steps(state, np.arange(2), active, n, e, c, np.full(2, np.nan), np.full(2, -1))
    # step 0: cut to the longest end (10); the axis grows to 15; ends 11 and 15
    # step 1: width 15 (row 1 ends at 15); axis 20; ends 16 and 20
    # step 2: width 20; axis 25; ends 21 and 25
    np.testing.assert_array_equal(width, [10, 15, 20])
    assert not compacted.any()
    assert snaps[-1][1] == 25.0 and snaps[-1][0].tolist() == [21.0, 25.0]
    state.after(np.arange(2), snaps[-1])
    assert state.length == 25.0 and state.ends(np.array([1, 0])).tolist() == [25.0, 21.0]


def test_a_leaver_frees_nothing_until_a_compaction():
    state = LayoutState(2)
    state.after(np.arange(2), (np.array([100.0, 10.0]), 100.0))
    active = np.array([[True, True], [False, True]])
    n, e = np.full((2, 2), 2), np.ones((2, 2), dtype=int)
    c = np.array([[100.0, 10.0], [101.0, 11.0]])
    width, compacted, snaps = RaggedLayout(0.5, 0).steps(state, np.arange(2), active, n, e, c, np.full(2, np.nan), np.array([0, -1]))
    # step 0: the long row leaves at its end; the short row then holds 12 of 102 slots: compacted
    assert width[0] == 100 and compacted[0] and snaps[0][1] == 12.0
    assert width[1] == 11  # the short row alone, left-aligned: its own context


# -- the width's bounds on random windows -----------------------------------------------------------

@st.composite
def _lanes(draw):
    """A window of decoding lanes: per step new tokens n, emitted e ≤ n, contexts growing by e;
    some lanes join at step 0 (their prompt), some leave."""
    W, B = draw(st.integers(1, 30)), draw(st.integers(1, 6))
    n = np.array(draw(st.lists(st.lists(st.integers(1, 5), min_size=B, max_size=B), min_size=W, max_size=W)))
    frac = np.array(draw(st.lists(st.lists(st.floats(0, 1), min_size=B, max_size=B), min_size=W, max_size=W)))
    e = np.maximum(1, np.floor(frac * n + 0.5).astype(int))
    e = np.minimum(e, n)
    c0 = np.array(draw(st.lists(st.integers(1, 300), min_size=B, max_size=B)))
    joins = np.array(draw(st.lists(st.booleans(), min_size=B, max_size=B)))
    leaves = np.array(draw(st.lists(st.integers(-1, W - 1), min_size=B, max_size=B)))
    leaves = np.where(joins & (leaves == 0), -1, leaves)  # a joiner decodes before it can leave
    step = np.arange(W)[:, None]
    active = (step >= joins[None, :].astype(int)) & ((leaves[None, :] < 0) | (step <= leaves[None, :]))
    grown = np.where(active, e, 0)
    c = c0[None, :] + np.cumsum(np.vstack([np.zeros((1, B), int), grown[:-1]]), axis=0)
    return W, B, n, e, c, joins, leaves, active


@pytest.mark.slow  # 10.1 s measured (pytest --durations, 2-core machine)
@settings(max_examples=200, deadline=None)
@given(_lanes(), st.sampled_from([0.0, 0.2, 0.5, 0.9]), st.sampled_from([0, 8, 64]))
def test_ragged_width_bounds(lanes, ratio, least):
    """A forward attends over at least its longest context (every live slot is in the cache)
    and at most what the compaction rule lets the stale slots grow to; one row alone
    attends over exactly its context (the stale tail is cut; a row keeps the holes others'
    longer blocks left in it until a compaction)."""
    from draftsim.sim.serving.layout import LayoutState, RaggedLayout

    W, B, n, e, c, joins, leaves, active = lanes
    n_act = np.where(active, n, 0)
    state = LayoutState(B)
    prior = ~joins
    state.after(np.arange(B), (np.where(prior, c[0], np.nan).astype(float), float(c[0][prior].max(initial=0))))  # compacted
    joined = np.where(joins, c[0], np.nan).astype(float)
    width, compacted, snaps = RaggedLayout(ratio, least).steps(state, np.arange(B), active, n_act, e, c.astype(float), joined, leaves)
    for w in range(W):
        act = active[w]
        if not act.any():
            assert width[w] == 0
            continue
        assert width[w] >= c[w][act].max()
        if B == 1:  # alone since it was compacted: no holes in its row
            assert width[w] == c[w][act].max()
        if w > 0:  # the previous step left at most what its compaction check allows
            held = active[w - 1] & ((leaves < 0) | (leaves > w - 1))
            slots = np.where(held, c[w - 1] + n[w - 1], 0)
            if w - 1 == 0:
                slots = np.where(joins, c[0], slots)
            assert width[w] <= max(least, slots.max() / (1 - ratio)) + 1e-9
    for w in np.flatnonzero(compacted):  # a compaction leaves the longest row's slots, and only happens past least
        held = active[w] & ((leaves < 0) | (leaves > w))
        slots = np.where(held, c[w] + n[w], 0)
        if w == 0:
            slots = np.where(joins, c[0], slots)
        assert snaps[w][1] == slots.max() and (width[w] + n[w][active[w]].max(initial=0) >= least or w == 0)
