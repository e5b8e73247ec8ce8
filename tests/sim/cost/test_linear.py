"""sim.cost.linear: CallCost, Costs and linear_fit.

The fit's stated guarantees and the checks; at the end, the old CallCost/Costs numbers,
Costs.from_models and a straight-line fit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftsim.sim.cost import (
    CallCost,
    Costs,
    RooflineModel,
    coefficient,
    default_catalog,
    linear_fit,
)
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


# -- linear: the old CallCost/Costs numbers ---------------------------------------------------------

CAT = default_catalog()


def roofline(model="llama-3-8b", hw="h100-sxm", **kw):
    return RooflineModel(CAT.model(model), CAT.hardware_spec(hw), kw.pop("dtype", "bfloat16"), **kw)


def test_linear_costs_have_one_home():
    """The linear costs live in sim.cost.linear alone (the old sim.costs shim is gone) and sim.cost
    exports the same classes."""
    import importlib

    import draftsim.sim.cost as cost

    assert cost.CallCost is CallCost and cost.Costs is Costs
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("draftsim.sim.costs")


@given(a=st.floats(0, 10), b=st.floats(0, 10), n=st.lists(st.integers(0, 50), min_size=1, max_size=6))
def test_linear_backend_gives_the_old_callcost_numbers(a, b, n):
    cc = CallCost(a, b)
    calls, tokens = int(sum(v > 0 for v in n)), sum(n)
    t = cc.forward_time([n], [[7] * len(n)])[0]
    expected = cc.time(1, tokens) if calls else 0.0  # one call over all the batch's tokens
    assert t == pytest.approx(expected)
    assert cc.single == a + b
    if a + b > 0:  # Costs.time is the old per-model sum of a·calls + b·tokens
        costs = Costs((cc, CallCost(b, a)))
        calls, toks = np.array([[3.0, 5.0]]), np.array([[7.0, 5.0]])
        assert costs.time(calls, toks)[0] == pytest.approx(3 * a + 7 * b + 5 * b + 5 * a)
        assert costs.coefficient.tolist() == pytest.approx([1.0, 1.0])


def test_costs_from_models_pins_the_one_token_call():
    costs = Costs.from_models([roofline("llama-2-70b", "a100-80g", tp=2), roofline("llama-2-7b", "a100-80g")], context=512)
    c = coefficient(roofline("llama-2-7b", "a100-80g"), roofline("llama-2-70b", "a100-80g", tp=2), context=512)
    assert costs.models[0].single == pytest.approx(1.0)
    assert costs.coefficient[1] == pytest.approx(float(c))


def test_linear_fit_recovers_a_line():
    fit = linear_fit(CallCost(0.3, 0.02), np.arange(1, 9))
    assert (fit.a, fit.b) == (pytest.approx(0.3), pytest.approx(0.02))
