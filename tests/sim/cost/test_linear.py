"""sim.cost.linear: CallCost, Costs and linear_fit.

The old CallCost/Costs numbers, Costs.from_models and a straight-line fit are tested in
tests/test_costs.py; this file adds the fit's stated guarantees and the checks.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftsim.sim.cost import CallCost, Costs, linear_fit
from draftsim.sim.cost.base import CostModel
from draftsim.sim.errors import DraftsimError


class Convex(CostModel):
    """t(N) = 0.1 + 0.001·N²: not a line."""

    def _time(self, stats):
        return 0.1 + 0.001 * stats.tokens**2

    def _bound(self, stats):
        return np.ones_like(stats.tokens, dtype=int)


@given(st.integers(2, 32), st.integers(1, 8))
def test_fit_keeps_the_one_token_call_and_nonnegative_terms(n_max, batch):
    model = Convex()
    fit = linear_fit(model, np.arange(1, n_max + 1), batch=batch)
    assert fit.a >= 0 and fit.b >= 0
    assert fit.single == pytest.approx(float(model.shape_time(batch, 1)))


def test_fit_of_one_point_is_a_constant():
    fit = linear_fit(Convex(), [5])
    assert (fit.a, fit.b) == (pytest.approx(0.125), 0.0)


def test_callcost_bound_names_the_larger_part():
    cc = CallCost(1.0, 0.1)
    assert list(cc.bound([[5], [20]])) == ["overhead", "compute"]
    assert cc.name == "linear 1 + 0.1·n"


@pytest.mark.parametrize("a, b, match", [(-1, 0, "a \\(time per call\\)"), (0, float("nan"), "b \\(time per token\\)")])
def test_callcost_ranges(a, b, match):
    with pytest.raises(DraftsimError, match=match):
        CallCost(a, b)


def test_costs_checks():
    with pytest.raises(DraftsimError, match="at least the target"):
        Costs(())
    with pytest.raises(DraftsimError, match="one-token call must take time > 0"):
        Costs((CallCost(0.0),))
    costs = Costs.coefficients([0.1, 0.0], target=2.0)
    assert costs.n_models == 3 and costs.coefficient.tolist() == pytest.approx([1.0, 0.05, 0.0])
    with pytest.raises(DraftsimError, match="uses 4 models \\(target \\+ 3 drafters\\) but costs were given for 3"):
        costs.require(4)
    with pytest.raises(DraftsimError, match="uses 4 models"):
        costs.time(np.ones((1, 4)), np.ones((1, 4)))
