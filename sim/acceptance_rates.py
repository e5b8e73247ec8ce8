"""Per-position acceptance: one convention, and the conversions between the published forms.

draftsim's convention (the same for input and output)
-----------------------------------------------------
For a chain draft of ``k`` tokens verified in one step, positions ``i = 1..k``:

* **cumulative rate** ``a_i = P(drafted tokens 1..i are all accepted)``. This is vLLM's
  "per-position acceptance rate": accepted tokens at position i / number of drafts
  (``vllm/v1/spec_decode/metrics.py``: ``acceptance_rates = np.sum(pos_matrix, axis=0) /
  num_drafts``). It never increases with i. It is also what
  :attr:`draftsim.sim.simulate.SimResult.acceptance_by_position` reports when every round
  drafts k tokens (rounds in which position i was accepted / rounds that drafted it).
* **conditional rate** ``c_i = P(token i accepted | tokens 1..i-1 accepted)``, so
  ``a_i = c_1 · … · c_i``. This is the EAGLE papers' "n-α" (acceptance conditioned on all
  previous drafted tokens being accepted; EAGLE issue 191, EAGLE-3 §4) and what
  :class:`draftsim.sim.acceptance.Positional` takes: the Monte Carlo engine draws token i
  of a round with ``alphas[i-1]`` and accepts up to the first rejection (a cumulative
  product), i.e. each value applies only once the earlier tokens were accepted.
* **mean acceptance length** ``L = 1 + a_1 + … + a_k``: tokens per verification step,
  *including* the bonus token the target adds (vLLM: ``mean_acceptance_length = 1 +
  num_accepted_tokens / num_drafts``; the EAGLE papers' τ, EAGLE issue 195). It lies in
  ``[1, k + 1]`` and equals draftsim's ``tokens_per_call`` of a fixed-k chain.
* **draft acceptance rate** ``r = (a_1 + … + a_k) / k``: vLLM's accepted / drafted tokens
  (``draft_acceptance_rate = num_accepted_tokens / num_draft_tokens``), when every draft has
  k tokens. So ``L = 1 + k·r``.

The identities above follow from the definitions (Leviathan et al. 2023, arXiv 2211.17192,
§3.1: with i.i.d. acceptance α, ``L = (1 − α^{k+1}) / (1 − α)``).

Every function takes rates along the last axis (vectorised over leading axes) and raises
:class:`DraftsimError` on bad input. Too few values for ``k`` is an error, never padded.
"""

from __future__ import annotations

import numpy as np

from .errors import K_MAX_LIMIT, DraftsimError, as_count, as_float_array, as_probability

__all__ = [
    "cumulative_from_conditional",
    "conditional_from_cumulative",
    "mean_length",
    "draft_acceptance_rate",
    "mean_length_from_draft_rate",
    "conditional_from_mean_length",
]

#: Slack for rounding when checking that cumulative rates do not increase.
_TOL = 1e-12


def _k(k) -> int:
    return int(as_count("k", k, minimum=1, maximum=K_MAX_LIMIT))


def _rates(name: str, rates, k) -> tuple[np.ndarray, int]:
    """``rates`` as probabilities along the last axis, cut to the first ``k`` (default: all);
    fewer than ``k`` values is an error."""
    arr = as_probability(name, rates)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise DraftsimError(f"{name} must hold one rate per draft position (a non-empty sequence); got {rates!r}")
    n = arr.shape[-1]
    k = n if k is None else _k(k)
    if n < k:
        raise DraftsimError(f"{name} has {n} per-position values but k={k} needs {k} (one per drafted token); give k <= {n}")
    return arr[..., :k], k


def _check_cumulative(name: str, a: np.ndarray) -> None:
    rise = np.diff(a, axis=-1) > _TOL
    if rise.any():
        idx = np.argwhere(rise)[0]
        i = int(idx[-1])
        row = tuple(int(j) for j in idx[:-1])
        raise DraftsimError(
            f"{name} (P(tokens 1..i all accepted)) must not increase with i; "
            f"got {float(a[row + (i,)])!r} at position {i + 1} then {float(a[row + (i + 1,)])!r} at position {i + 2}"
        )


def cumulative_from_conditional(conditional, k=None) -> np.ndarray:
    """Cumulative rates ``a_i = c_1 · … · c_i`` for the first ``k`` positions (default: all)."""
    c, _ = _rates("conditional rates", conditional, k)
    return np.cumprod(c, axis=-1)


def conditional_from_cumulative(cumulative, k=None) -> np.ndarray:
    """Conditional rates ``c_1 = a_1``, ``c_i = a_i / a_{i-1}`` for the first ``k`` positions.

    Where ``a_{i-1} = 0`` no step reaches position i and ``c_i`` is not identified: it is
    returned as 0 (any value gives the same cumulative rates). Cumulative rates that
    increase are an error.
    """
    a, _ = _rates("cumulative rates", cumulative, k)
    _check_cumulative("cumulative rates", a)
    prev = np.concatenate([np.ones(a.shape[:-1] + (1,)), a[..., :-1]], axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(prev > 0, a / np.where(prev > 0, prev, 1.0), 0.0)
    return np.minimum(c, 1.0)  # rounding in a_i <= a_{i-1} + _TOL


def mean_length(cumulative, k=None) -> np.ndarray | float:
    """Mean acceptance length ``1 + a_1 + … + a_k`` (tokens per step, bonus token included)."""
    a, _ = _rates("cumulative rates", cumulative, k)
    _check_cumulative("cumulative rates", a)
    out = 1.0 + a.sum(axis=-1)
    return float(out) if out.ndim == 0 else out


def draft_acceptance_rate(cumulative, k=None) -> np.ndarray | float:
    """vLLM's draft acceptance rate (accepted / drafted tokens) ``(a_1 + … + a_k) / k``."""
    a, k = _rates("cumulative rates", cumulative, k)
    _check_cumulative("cumulative rates", a)
    out = a.sum(axis=-1) / k
    return float(out) if out.ndim == 0 else out


def mean_length_from_draft_rate(rate, k) -> np.ndarray | float:
    """Mean acceptance length ``1 + k·r`` from vLLM's draft acceptance rate ``r`` at draft length ``k``."""
    k = _k(k)
    r = as_probability("draft acceptance rate", rate)
    out = 1.0 + k * r
    return float(out) if out.ndim == 0 else out


def _geometric(r: np.ndarray, n: int) -> np.ndarray:
    """``1 + r + … + r^(n-1)`` elementwise."""
    return sum(r**j for j in range(n))


def conditional_from_mean_length(length, k, first=None) -> np.ndarray:
    """Conditional rates for a chain of ``k`` that reproduce a mean acceptance length exactly,
    under a stated assumption (a mean alone does not determine k rates):

    * without ``first``: one **constant** conditional rate ``c`` at every position, the
      root in [0, 1] of ``1 + c + c² + … + c^k = L`` (the i.i.d. model of Leviathan et al.
      2023, §3.1);
    * with ``first`` (``c_1``, e.g. 1 − the share of steps that accept nothing, which is what
      a bimodal n-gram drafter shows): ``c_1 = first`` and one constant rate ``c`` for
      positions 2..k, the root of ``1 + c_1·(1 + c + … + c^{k-1}) = L``.

    The left-hand sides increase in ``c`` on [0, 1], so the root is unique; it is found by
    bisection to machine precision (64 halvings of [0, 1]). ``L`` must lie in [1, k + 1]
    (with ``first``: in [1 + c_1, 1 + k·c_1]); ``length`` may be an array (result shape
    ``length.shape + (k,)``).
    """
    k = _k(k)
    L = as_float_array("mean acceptance length", length)
    if first is None:
        lo_L, hi_L, what = np.ones_like(L), np.full_like(L, k + 1.0), f"[1, k+1] = [1, {k + 1}]"
        target, n, scale = L, k + 1, np.ones_like(L)
    else:
        c1 = np.broadcast_to(as_probability("first-position rate", first), L.shape).astype(float)
        lo_L, hi_L = 1.0 + c1, 1.0 + k * c1
        what = "[1 + c1, 1 + k*c1]"
        target, n, scale = L - 1.0, k, c1
    bad = ~((L >= lo_L - _TOL) & (L <= hi_L + _TOL))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0]) if L.ndim else ()
        raise DraftsimError(
            f"mean acceptance length must lie in {what} for k={k}"
            + (f" and c1={float(np.asarray(c1)[idx])!r} ({float(lo_L[idx])!r}..{float(hi_L[idx])!r})" if first is not None else "")
            + f"; got {float(L[idx])!r}"
        )
    lo, hi = np.zeros_like(L), np.ones_like(L)
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        low_side = scale * _geometric(mid, n) < target
        lo = np.where(low_side, mid, lo)
        hi = np.where(low_side, hi, mid)
    c = 0.5 * (lo + hi)
    rest = np.repeat(c[..., None], k, axis=-1)
    if first is not None:
        rest[..., 0] = c1
    return rest
