"""What-if cost-ratio planning: rank speculative-decoding strategies for a set of drafters.

Given drafters described by their acceptance rate α (by the target) and cost coefficient c,
:func:`plan` scores, with the closed forms of :mod:`draftsim.sim.analytic`:

* autoregressive decoding (EWIF 1, the baseline);
* speculative decoding with each drafter alone, at its best k;
* the best horizontal cascade over all drafters ([CSD] §3.2);
* for each drafter, the best two-level vertical cascade with Max-Gram (cost 0) drafting for
  it, when Max-Gram's acceptance by that drafter is given ([CSD] §3.1, §3.3);

and returns them ranked by EWIF.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from . import analytic
from .errors import DraftsimError, as_cost, as_probability, parse_number

__all__ = ["PlannedDrafter", "Strategy", "plan"]

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class PlannedDrafter:
    """A drafter as the planner sees it: its name, acceptance rate by the target and cost
    coefficient (the real proposer of tokens is :class:`draftsim.realrun.drafters.Drafter`)."""

    name: str
    alpha: float
    cost: float

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise DraftsimError(
                f"drafter name must hold only letters, digits, '_', '.', '-' (not starting with '.' or '-'); got {self.name!r}"
            )
        object.__setattr__(self, "alpha", float(as_probability(f"alpha of drafter {self.name}", self.alpha)))
        object.__setattr__(self, "cost", float(as_cost(f"cost of drafter {self.name}", self.cost)))

    @classmethod
    def parse(cls, spec: str) -> "PlannedDrafter":
        """Parse ``NAME:ALPHA:COST`` (e.g. ``small:0.75:0.05``)."""
        parts = spec.split(":")
        if len(parts) != 3:
            raise DraftsimError(f"drafter must be NAME:ALPHA:COST (e.g. small:0.75:0.05); got {spec!r}")
        name, alpha, cost = parts
        try:
            alpha_value, cost_value = float(parse_number("ALPHA", alpha)), float(parse_number("COST", cost))
        except DraftsimError:
            raise DraftsimError(
                f"drafter {spec!r}: ALPHA and COST must be numbers written with ASCII digits (e.g. small:0.75:0.05)"
            ) from None
        return cls(name, alpha_value, cost_value)


@dataclass(frozen=True)
class Strategy:
    """One scored strategy of a plan.

    ``ewif`` is the expected speedup over autoregressive decoding under the cost model;
    ``params`` holds what configures it (k, counts, n), ready for JSON.
    """

    kind: str  # "autoregressive" | "sd" | "horizontal" | "vertical"
    description: str
    ewif: float
    params: dict = field(default_factory=dict)


def plan(
    drafters: list[PlannedDrafter], mag_alpha: float | None = None, k_max: int = 32, mag_cost: float = 0.0, verify=None
) -> list[Strategy]:
    """Score every strategy the drafters allow and return them ranked by EWIF (best first).

    Parameters
    ----------
    drafters : list of :class:`PlannedDrafter` (at least one, distinct names)
    mag_alpha : float in [0, 1], optional
        Acceptance of Max-Gram's tokens by each drafter; adds vertical cascades.
    mag_cost : float >= 0
        Max-Gram's cost coefficient (0 in [CSD]; a string search costs next to nothing).
    k_max : int
        Largest draft length searched (per drafter; total for a horizontal cascade; and the
        bound on n and k of a vertical cascade).
    verify : optional table v(1), v(2), … of the target's time to process n tokens over its
        one-token time (:func:`draftsim.sim.analytic.ewif`): every strategy's target call is priced at
        the number of tokens it verifies, and drafts are limited to what the table covers.
        Without it a target call costs 1 whatever it verifies, as in the papers' EWIF.
    """
    if not drafters:
        raise DraftsimError("plan needs at least one drafter")
    names = [d.name for d in drafters]
    if len(set(names)) != len(names):
        raise DraftsimError(f"drafter names must be distinct; got {names}")
    strategies = [Strategy("autoregressive", "autoregressive (target only)", 1.0, {"k": 0})]
    for d in drafters:
        k, value = analytic.optimal_k(d.alpha, d.cost, k_max, verify)
        strategies.append(Strategy("sd", f"sd {d.name} k={int(k)}", float(value), {"drafter": d.name, "k": int(k)}))
    if len(drafters) > 1:
        h = analytic.optimal_horizontal([(d.alpha, d.cost) for d in drafters], k_max, verify)
        parts = [f"{drafters[i].name}:{c}" for i, c in zip(h.order, h.counts)]
        strategies.append(
            Strategy(
                "horizontal",
                "horizontal " + (" > ".join(parts) if parts else "(empty)"),
                h.ewif,
                {"drafters": [drafters[i].name for i in h.order], "counts": list(h.counts)},
            )
        )
    if mag_alpha is not None:
        mag_alpha = float(as_probability("mag_alpha", mag_alpha))
        for d in drafters:
            v = analytic.optimal_vertical(d.alpha, d.cost, mag_alpha, mag_cost, k_max, verify=verify)
            strategies.append(
                Strategy(
                    "vertical",
                    f"vertical {d.name} < maxgram n={v.n} k={v.k}",
                    v.ewif,
                    {"drafter": d.name, "n": v.n, "k": v.k, "mag_alpha": mag_alpha, "mag_cost": mag_cost},
                )
            )
    return sorted(strategies, key=lambda s: -s.ewif)


def simulation_setting(strategy: Strategy, drafters: list[PlannedDrafter]):
    """The (policy, acceptance process, costs) that simulate a planned strategy.

    Drafters are renumbered in the order the strategy uses them (model 1, 2, …); Max-Gram
    is the last model of a vertical cascade. Acceptance is Bernoulli with the drafters' α
    (and Max-Gram's α by its drafter).
    """
    from .acceptance import Bernoulli
    from .cost.linear import Costs
    from .policies import Autoregressive, FixedK, HorizontalCascade, VerticalCascade

    by_name = {d.name: d for d in drafters}
    p = strategy.params
    if strategy.kind == "autoregressive":
        return Autoregressive(), Bernoulli(0.0), Costs.coefficients([])
    if strategy.kind == "sd":
        d = by_name[p["drafter"]]
        return FixedK(p["k"]), Bernoulli(d.alpha), Costs.coefficients([d.cost])
    if strategy.kind == "horizontal":
        used = [by_name[n] for n in p["drafters"]]
        size = len(used) + 1
        A = np.zeros((size, size))
        A[1:, 0] = [d.alpha for d in used]
        policy = HorizontalCascade(tuple(range(1, size)), tuple(p["counts"]))
        return policy, Bernoulli(A), Costs.coefficients([d.cost for d in used])
    if strategy.kind == "vertical":
        d = by_name[p["drafter"]]
        A = np.zeros((3, 3))
        A[1, 0], A[2, 1] = d.alpha, p["mag_alpha"]
        policy = VerticalCascade([[0, p["n"], 0], [0, 0, p["k"]], [0, 0, 0]])
        return policy, Bernoulli(A), Costs.coefficients([d.cost, p["mag_cost"]])
    raise DraftsimError(f"no simulation for strategy kind {strategy.kind!r}")
