"""Constant and linear cost models: t = a + b·N for a call over N new tokens.

The papers' cost model (Cascade Speculative Drafting §2, SpecDec++ §3): a call of model m
costs a constant c_m (b = 0), the target's one-token call 1. :class:`CallCost` is that model
for one model behind the :class:`~draftsim.sim.cost.base.CostModel` interface, :class:`Costs` one per
model of a drafting system (target first) as the simulators use them; times are in any unit
(seconds, or target calls when the target's one-token call costs 1).

Models are numbered as everywhere in ``sim``: 0 is the target, 1, 2, … the drafters in order
of decreasing size (the last may be Max-Gram).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import DraftsimError, as_cost
from .base import BatchStats, CostModel

__all__ = ["CallCost", "Costs", "linear_fit"]


@dataclass(frozen=True)
class CallCost(CostModel):
    """t(N) = a + b·N for a forward call over N new tokens in all (b = 0: constant per call).

    The batch enters only through N and context not at all. :meth:`bound` cannot tell memory
    from compute here: the per-call part is reported as ``"overhead"``, the per-token part as
    ``"compute"``, whichever is larger.
    """

    a: float
    b: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "a", float(as_cost("a (time per call)", self.a)))
        object.__setattr__(self, "b", float(as_cost("b (time per token)", self.b)))

    @property
    def name(self) -> str:
        return f"linear {self.a:g} + {self.b:g}·n"

    def time(self, calls, tokens):
        """Total time of ``calls`` calls that processed ``tokens`` tokens in all."""
        return self.a * np.asarray(calls) + self.b * np.asarray(tokens)

    @property
    def single(self) -> float:
        """Time of a one-token call."""
        return self.a + self.b

    def _time(self, stats: BatchStats) -> np.ndarray:
        return self.a + self.b * stats.tokens

    def _bound(self, stats: BatchStats) -> np.ndarray:
        return np.where(self.a >= self.b * stats.tokens, 1, 3)


@dataclass(frozen=True)
class Costs:
    """One :class:`CallCost` per model, target first."""

    models: tuple[CallCost, ...]

    def __post_init__(self):
        if not self.models:
            raise DraftsimError("costs need at least the target's")
        if self.models[0].single <= 0:
            raise DraftsimError("the target's one-token call must take time > 0")

    @classmethod
    def coefficients(cls, drafter_costs: Sequence[float] | float, target: float = 1.0) -> "Costs":
        """Constant costs: the target's call costs ``target``, drafter i's ``drafter_costs[i-1]``."""
        values = np.atleast_1d(as_cost("cost", drafter_costs)).tolist()
        return cls((CallCost(target),) + tuple(CallCost(c) for c in values))

    @classmethod
    def from_models(cls, models: Sequence[CostModel], batch: int = 1, context: int = 0, max_tokens: int = 16) -> "Costs":
        """Linear costs in target calls from any cost models (target first): each model's
        t(n) at ``batch`` sequences and ``context`` fitted by :func:`linear_fit` over
        n = 1..``max_tokens``, divided by the target's one-token call."""
        # a measured profile is fitted over its own new-token range only (it refuses to extrapolate)
        fits = [linear_fit(m, np.arange(1, min(max_tokens, getattr(m, "new_tokens", (max_tokens,))[-1]) + 1), batch, context)
                for m in models]
        unit = fits[0].single
        if unit <= 0:
            raise DraftsimError("the target's one-token call must take time > 0")
        return cls(tuple(CallCost(f.a / unit, f.b / unit) for f in fits))

    @property
    def n_models(self) -> int:
        return len(self.models)

    @property
    def coefficient(self) -> np.ndarray:
        """Cost coefficients c_m: one-token call time over the target's (c_0 = 1)."""
        return np.array([m.single for m in self.models]) / self.models[0].single

    def time(self, calls: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Time per row of per-model call and token counts, arrays (..., n_models)."""
        calls = np.asarray(calls, dtype=np.float64)
        tokens = np.asarray(tokens, dtype=np.float64)
        M = calls.shape[-1]
        self.require(M)
        a = np.array([m.a for m in self.models[:M]])
        b = np.array([m.b for m in self.models[:M]])
        return (calls * a).sum(axis=-1) + (tokens * b).sum(axis=-1)

    def require(self, n_models: int) -> None:
        """Raise unless there is a cost for each of ``n_models`` models."""
        if self.n_models < n_models:
            raise DraftsimError(
                f"the policy uses {n_models} models (target + {n_models - 1} drafters) but costs were given "
                f"for {self.n_models}; give one cost per drafter"
            )


def linear_fit(model: CostModel, new_tokens, batch: int = 1, context: int = 0) -> CallCost:
    """The least-squares t(n) ≈ a + b·n (a, b >= 0) of ``model`` over uniform calls of
    ``batch`` sequences with n ∈ ``new_tokens`` new tokens *each*.

    n counts one sequence's tokens, as the single-stream simulators do: at ``batch`` 1 the fit
    is a CallCost of the model itself; at a larger batch it is the time of a call of that batch
    as seen by one of its sequences. The exact one-token time is kept (a + b = t(1) when 1 is
    among ``new_tokens``): the fit only decides how the extra tokens of a verification are priced.
    """
    from scipy.optimize import nnls

    n = np.atleast_1d(np.asarray(new_tokens))
    t = np.atleast_1d(model.shape_time(batch, n, context))
    x = n.astype(np.float64)
    if len(n) == 1:
        return CallCost(float(t[0]), 0.0)
    (a, b), _ = nnls(np.stack([np.ones_like(x), x], axis=1), t)
    if (n == 1).any():  # pin the one-token call, keep the fitted slope
        t1 = float(t[n == 1][0])
        b = min(b, t1)
        a = t1 - b
    return CallCost(float(a), float(b))
