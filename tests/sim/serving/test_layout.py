"""sim.serving.layout: a dense ragged batch cache's width.

Its bounds on random windows (at least the longest context, at most what the compaction rule
lets stale slots grow to, exact for one row) are a property in tests/test_serving.py
(test_ragged_width_bounds); this file checks the rule's ranges and a hand-worked window.
"""

from __future__ import annotations

import numpy as np
import pytest

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
