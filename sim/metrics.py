"""Metrics of a simulated run, each with a standard error.

Runs are made of independent sequences (or requests), so every metric is a ratio of sums
over sequences, ΣX/ΣY; its standard error is the delta-method one,
SE² = Σ_s (X_s − R·Y_s)² / (n(n − 1)·Ȳ²).

Definitions (N tokens, N_target target calls, N_discarded tokens proposed to the target and
rejected, times from the cost model):

* ``tokens_per_call`` = N / N_target: mean accepted length per target call, bonus included;
* ``ewif`` = (AR time per token) / (time per token): the walltime improvement factor, i.e.
  the speedup over autoregressive decoding under the cost model ([CSD] §4);
* ``swi`` = N / Σ_m calls_m·c_m with cost coefficients c_m (target 1) ([CSD] §5); equal to
  ``ewif`` under constant per-call costs, different when calls cost a + b·n;
* ``discard_rate`` = N_discarded / N and ``verification_rate`` = N_target / N ([SD++] §3);
* ``latency_per_token`` = time / N, in the cost model's unit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost.linear import Costs

__all__ = ["Estimate", "ratio", "summarize"]


@dataclass(frozen=True)
class Estimate:
    """A value and its standard error (nan when it cannot be estimated)."""

    value: float
    se: float

    def __format__(self, spec: str) -> str:
        spec = spec or ".4f"
        if not np.isfinite(self.se):
            return format(self.value, spec)
        return f"{format(self.value, spec)} ± {format(self.se, spec)}"

    def to_dict(self) -> dict:
        return {"value": self.value, "se": self.se}


def ratio(x, y) -> Estimate:
    """ΣX/ΣY over sequences with its delta-method standard error."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    total = y.sum()
    if total <= 0:
        return Estimate(float("nan"), float("nan"))
    r = x.sum() / total
    n = len(x)
    if n < 2:
        return Estimate(float(r), float("nan"))
    resid = x - r * y
    se = np.sqrt((resid**2).sum() / (n * (n - 1))) / y.mean()
    return Estimate(float(r), float(se))


def summarize(counts, costs: Costs) -> dict[str, Estimate]:
    """All scalar metrics of a run from its per-sequence counts."""
    costs.require(counts.calls.shape[1])
    M = counts.calls.shape[1]
    tokens = counts.tokens
    target_calls = counts.calls[:, 0]
    time = costs.time(counts.calls, counts.call_tokens)
    ar_time = costs.models[0].single
    standard = (counts.calls * costs.coefficient[:M]).sum(axis=1)
    discarded = counts.top_drafted - counts.top_accepted
    return {
        "tokens_per_call": ratio(tokens, target_calls),
        "ewif": ratio(tokens * ar_time, time),
        "swi": ratio(tokens, standard),
        "discard_rate": ratio(discarded, tokens),
        "verification_rate": ratio(target_calls, tokens),
        "latency_per_token": ratio(time, tokens),
        "acceptance_rate": ratio(counts.top_accepted, counts.top_drafted),
    }
