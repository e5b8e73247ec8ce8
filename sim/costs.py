"""Cost models: how long one forward call of a model takes.

Models are numbered as everywhere in ``sim``: 0 is the target, 1, 2, … the drafters in
order of decreasing size (the last may be Max-Gram). A :class:`Costs` holds one
:class:`CallCost` per model; times are in any unit (seconds, or target calls when the
target's single-token call costs 1, the cost-coefficient convention of the papers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import DraftsimError, as_cost

__all__ = ["CallCost", "Costs"]


@dataclass(frozen=True)
class CallCost:
    """t(n) = a + b·n for a forward call over n tokens (b = 0: constant per call)."""

    a: float
    b: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "a", float(as_cost("a (time per call)", self.a)))
        object.__setattr__(self, "b", float(as_cost("b (time per token)", self.b)))

    def time(self, calls, tokens):
        """Total time of ``calls`` calls that processed ``tokens`` tokens in all."""
        return self.a * np.asarray(calls) + self.b * np.asarray(tokens)

    @property
    def single(self) -> float:
        """Time of a one-token call."""
        return self.a + self.b


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
