"""Closed-form predictions for simulated settings, where one exists.

Maps a (policy, acceptance process, costs) triple to the analytic EWIF of
:mod:`draftsim.sim.analytic`, so that simulations can be checked against the formulas: fixed k,
horizontal and two-level vertical cascades under Bernoulli acceptance, fixed k under
positional acceptance, and autoregressive decoding.
"""

from __future__ import annotations

import numpy as np

from . import analytic
from .acceptance import AcceptanceProcess, Bernoulli, Positional
from .cost.linear import Costs
from .policies import Autoregressive, FixedK, HorizontalCascade, Policy, VerticalCascade

__all__ = ["predicted_ewif"]


def predicted_ewif(policy: Policy, process: AcceptanceProcess, costs: Costs) -> float | None:
    """The analytic EWIF of this setting under constant per-call costs, or None."""
    if any(m.b != 0 for m in costs.models[: policy.n_models]):
        return None
    c = costs.coefficient
    if isinstance(policy, Autoregressive):
        return 1.0
    if process.match < 1.0:
        if not isinstance(policy, FixedK) or not isinstance(process, (Positional, Bernoulli)):
            return None
        alphas = process.alphas if isinstance(process, Positional) else np.array([process.constant(1, 0)])
        alphas = alphas[np.minimum(np.arange(policy.k), len(alphas) - 1)]
        return float(analytic.ewif_match(alphas, np.full(policy.k, c[1]), process.match))
    if isinstance(process, Positional) and isinstance(policy, FixedK):
        alphas = process.alphas[np.minimum(np.arange(policy.k), len(process.alphas) - 1)]
        return float(analytic.ewif_positional(alphas, np.full(policy.k, c[1])))
    if not isinstance(process, Bernoulli):
        return None
    if isinstance(policy, FixedK):
        return float(analytic.ewif(process.constant(1, 0), c[1], policy.k))
    if isinstance(policy, HorizontalCascade):
        pairs = [(process.constant(d, 0), c[d]) for d in policy.drafters]
        return float(analytic.ewif_horizontal(pairs, list(policy.counts)))
    if isinstance(policy, VerticalCascade) and policy.K.shape == (3, 3):
        K = policy.K
        if K[0, 2] == 0 and K[0, 1] > 0:
            return float(
                analytic.ewif_vertical(process.constant(1, 0), c[1], K[0, 1], process.constant(2, 1), c[2], K[1, 2])
            )
    return None
