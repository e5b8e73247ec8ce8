"""Cost models of forward calls: kept for existing callers; the code lives in :mod:`draftsim.sim.cost`.

:class:`CallCost` (t = a + b·n per call) and :class:`Costs` (one per model, target first)
are defined in :mod:`draftsim.sim.cost.linear`, behind the :class:`draftsim.sim.cost.CostModel` interface
shared with measured profiles and rooflines.
"""

from __future__ import annotations

from .cost.linear import CallCost, Costs

__all__ = ["CallCost", "Costs"]
