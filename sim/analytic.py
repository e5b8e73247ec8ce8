"""Closed-form speculative-decoding arithmetic: expected tokens, EWIF, SWI, latency.

Every function is vectorised and broadcasts like a numpy ufunc (scipy.stats style): pass
arrays of ``alpha``, ``c`` and ``k`` and get an array back. Inputs are validated and a bad
value raises :class:`draftsim.sim.errors.DraftsimError`.

Notation (DESIGN.md): ``alpha`` is an acceptance rate (probability that the target accepts a
drafted token, i.i.d. per token), ``c`` a cost coefficient (one draft forward pass over one
target forward pass), ``k`` a draft length, EWIF the expected walltime improvement factor,
i.e. the speedup over autoregressive decoding under the cost model "a target call costs 1, a
draft call costs c".

References
----------
[LKM23] Leviathan, Kalman, Matias. Fast Inference from Transformers via Speculative
        Decoding. ICML 2023 (eq. 1 and Theorem 3.8).
[CSD]   Chen, Yang, Lin, Wang, Chang. Cascade Speculative Drafting for Even Faster LLM
        Inference. NeurIPS 2024 (Theorem 4.1, Corollary 4.2, Theorem 4.4, §5 SWI).
[SD++]  Huang, Guo, Wang. SpecDec++: Boosting Speculative Decoding via Adaptive Candidate
        Lengths. 2024 (§3, eq. 5.1: latency in terms of discard and verification rates).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .errors import DraftsimError, as_cost, as_count, as_k_max, as_positive, as_probability

__all__ = [
    "expected_tokens",
    "ewif",
    "as_verify",
    "verify_cost",
    "ewif_positional",
    "ewif_match",
    "ewif_horizontal",
    "ewif_vertical",
    "optimal_k",
    "optimal_horizontal",
    "optimal_vertical",
    "HorizontalPlan",
    "VerticalPlan",
    "swi",
    "latency_per_token",
    "fixed_k_rates",
    "ewif_kmatrix",
]

#: Largest number of count vectors :func:`optimal_horizontal` will enumerate.
MAX_ENUMERATION = 2_000_000


def _geometric_sum(z: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Σ_{i=0}^{m-1} z^i = (1 − z^m)/(1 − z) for z in [0, 1], m ≥ 0, accurate near z = 1.

    For z ≥ 1/2 the numerator is computed as −expm1(m·log z), so nothing cancels as z → 1
    (and 1 − z is exact there); z = 1 gives m. The result is kept within its exact bounds
    [1, m] (for m ≥ 1) so a last-bit rounding never breaks 1 ≤ E[tokens] ≤ k + 1.
    """
    z, m = np.broadcast_arrays(np.asarray(z, dtype=np.float64), np.asarray(m))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        near_one = -np.expm1(m * np.log(z))
        direct = 1.0 - z**m
        out = np.where(z >= 0.5, near_one, direct) / (1.0 - z)
    out = np.where(z == 1.0, m, out)
    out = np.clip(out, np.minimum(m, 1), m)
    return out.astype(np.float64)[()]


def expected_tokens(alpha, k):
    """Expected tokens emitted per target call when drafting ``k`` tokens.

    E[tokens] = (1 − α^(k+1)) / (1 − α), and k + 1 at α = 1 ([LKM23] eq. 1): the accepted
    prefix of k i.i.d. Bernoulli(α) drafts plus the target's correction or bonus token.

    Parameters
    ----------
    alpha : array_like, in [0, 1]
        Per-token acceptance rate.
    k : array_like of int, >= 0
        Draft length.

    Returns
    -------
    ndarray (or float), in [1, k + 1].
    """
    alpha = as_probability("alpha", alpha)
    k = as_count("k", k)
    return _geometric_sum(alpha, k + 1)


def ewif(alpha, c, k, verify=None):
    """Expected walltime improvement factor of speculative decoding with a fixed draft length.

    EWIF = (1 − α^(k+1)) / ((1 − α)(c·k + 1)) ([LKM23] Theorem 3.8; [CSD] Corollary 4.2): the
    expected tokens per round over the round's cost, k draft calls at c plus one target call.
    With ``verify`` (:func:`as_verify`) the target's call costs v(k + 1) instead of 1: its time
    to verify k + 1 tokens over its one-token time, as hardware charges it.

    Parameters
    ----------
    alpha : array_like, in [0, 1]
    c : array_like, >= 0
        Draft cost coefficient (draft forward time / target forward time).
    k : array_like of int, >= 0
    verify : array_like, optional
        v(1), v(2), …: the target's call time for n tokens over its one-token call.
    """
    c = as_cost("c", c)
    k_arr = as_count("k", k)
    return expected_tokens(alpha, k_arr) / (c * k_arr + verify_cost(verify, k_arr + 1))


def as_verify(verify) -> np.ndarray:
    """A verification-cost table v(1), v(2), …, v(K) (v(n): the target's time to process n
    new tokens over its one-token time), checked: finite, v(1) = 1, non-decreasing."""
    v = np.asarray(verify, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise DraftsimError(f"verify must be a 1-D table v(1), v(2), ... of at least one entry; got shape {v.shape}")
    if not np.isfinite(v).all() or abs(v[0] - 1.0) > 1e-9 or (np.diff(v) < -1e-12).any():
        raise DraftsimError(f"verify must be finite, start at v(1) = 1 and never decrease; got {v[:8].tolist()}")
    return v


def verify_cost(verify, n) -> np.ndarray:
    """v(n) from the table ``verify`` (1 for every n when it is None); n beyond the table is
    refused."""
    n = np.asarray(n)
    if verify is None:
        return np.ones(n.shape)[()]
    v = as_verify(verify)
    if n.size and (n.min() < 1 or n.max() > v.size):
        raise DraftsimError(f"the verification table covers 1..{v.size} tokens; asked for {int(n.max()) if n.max() > v.size else int(n.min())}")
    return v[n - 1][()]


def ewif_positional(alphas, costs):
    """EWIF when draft position i has its own acceptance α_i and cost c_i ([CSD] Theorem 4.1).

    EWIF = (Σ_{i=0}^{k} Π_{j=1}^{i} α_j) / (1 + Σ_{i=1}^{k} c_i).

    This is a horizontal cascade: position i is drafted by a model accepted with α_i that
    costs c_i per call.

    Parameters
    ----------
    alphas : array_like, shape (..., k), in [0, 1]
        Acceptance rate of each draft position (last axis).
    costs : array_like, shape (..., k), >= 0
        Cost coefficient of the model drafting each position; broadcast against ``alphas``.
    """
    alphas = as_probability("alphas", alphas)
    costs = as_cost("costs", costs)
    if alphas.ndim == 0 or costs.ndim == 0:
        raise DraftsimError("alphas and costs must have a last axis of draft positions")
    if alphas.shape[-1] != costs.shape[-1]:
        raise DraftsimError(
            f"alphas and costs must have the same number of positions; got {alphas.shape[-1]} "
            f"and {costs.shape[-1]}"
        )
    alphas, costs = np.broadcast_arrays(alphas, costs)
    numerator = 1.0 + np.cumprod(alphas, axis=-1).sum(axis=-1)
    return (numerator / (1.0 + costs.sum(axis=-1)))[()]


def _drafter_arrays(drafters) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split a sequence of (α, c) pairs into validated lists of α and c arrays."""
    try:
        pairs = [tuple(d) for d in drafters]
    except TypeError as exc:
        raise DraftsimError(f"drafters must be a sequence of (alpha, cost) pairs; got {drafters!r}") from exc
    if not pairs:
        raise DraftsimError("drafters must hold at least one (alpha, cost) pair; got none")
    for i, pair in enumerate(pairs):
        if len(pair) != 2:
            raise DraftsimError(f"drafters[{i}] must be an (alpha, cost) pair; got {pair!r}")
    alphas = [as_probability(f"drafters[{i}] alpha", a) for i, (a, _) in enumerate(pairs)]
    costs = [as_cost(f"drafters[{i}] cost", c) for i, (_, c) in enumerate(pairs)]
    return alphas, costs


def ewif_match(alphas, costs, match):
    """EWIF of a chain drafter that proposes only in a share ``match`` of rounds (a lookup
    drafter — n-gram, suffix — finds no match in the others; then the round is a plain decode
    step: no draft call, no draft token verified, one token out).

    EWIF = (m · T + 1 − m) / (1 + m · Σ c_i), T = Σ_{i=0}^{k} Π_{j≤i} α_j the tokens of a round
    with a proposal (:func:`ewif_positional`'s numerator); ``match`` = 1 gives
    :func:`ewif_positional`. Target calls cost 1 whatever they verify, as there.
    """
    m = as_probability("match", match)
    ewif_positional(alphas, costs)  # the same checks
    alphas, costs = np.broadcast_arrays(as_probability("alphas", alphas), as_cost("costs", costs))
    tokens = 1.0 + np.cumprod(alphas, axis=-1).sum(axis=-1)
    return ((m * tokens + 1.0 - m) / (1.0 + m * costs.sum(axis=-1)))[()]


def ewif_horizontal(drafters, counts, verify=None):
    """EWIF of a horizontal cascade ([CSD] §3.2 and Theorem 4.1).

    The first ``counts[0]`` draft positions are drafted by ``drafters[0]``, the next
    ``counts[1]`` by ``drafters[1]``, and so on; all are verified by the target in one call.
    Equal to :func:`ewif_positional` on the expanded per-position lists, computed in closed
    form block by block so that ``counts`` may be arrays (all count vectors at once).

    Parameters
    ----------
    drafters : sequence of (alpha, c) pairs, in drafting order
    counts : sequence of int (or int arrays), one per drafter, >= 0
    verify : optional table of the target's v(n) (:func:`ewif`): the target's call costs
        v(Σ counts + 1) instead of 1
    """
    alphas, costs = _drafter_arrays(drafters)
    try:
        n_counts = len(counts)
    except TypeError as exc:
        raise DraftsimError(f"counts must be a sequence with one count per drafter; got {counts!r}") from exc
    if n_counts != len(alphas):
        raise DraftsimError(
            f"counts must have one entry per drafter ({len(alphas)}); got {n_counts}"
        )
    ks = [as_count(f"counts[{i}]", k) for i, k in enumerate(counts)]
    numerator = 0.0
    prefix = 1.0  # Π of α over the positions drafted so far
    cost = verify_cost(verify, sum(ks) + 1)  # the target call
    for a, c, k in zip(alphas, costs, ks):
        numerator = numerator + prefix * _geometric_sum(a, k)
        prefix = prefix * a**k
        cost = cost + c * k
    return np.asarray((numerator + prefix) / cost)[()]


def ewif_vertical(alpha, c_d1, n, alpha_inner, c_d2, k, verify=None):
    """EWIF of a two-level vertical cascade ([CSD] §3.1, Algorithm 1 with two drafters).

    Drafter d1 builds the draft it proposes to the target in ``n`` inner speculative rounds;
    in each inner round d2 drafts ``k`` tokens that d1 verifies with acceptance
    ``alpha_inner``, so one inner round emits L ∈ {1, …, k+1} tokens with
    P(L > i) = alpha_inner^i for i ≤ k. With φ(z) = E[z^L]::

        EWIF = (1 − α·φ(α)^n) / ((1 − α)(1 + n·c_d1 + n·k·c_d2)).

    The numerator is E[Σ_{i=0}^{T} α^i] for the draft length T = L_1 + … + L_n; at α = 1 it
    is 1 + n·E[L]. ``c_d2 = 0`` is the Max-Gram case; ``k = 0`` reduces to
    ``ewif(alpha, c_d1, n)``. Computed as −expm1(log α + n·log φ(α)) / (1 − α) with
    φ(α) − 1 = −(1 − α)·Σ_{i=0}^{k} (α·alpha_inner)^i, so it stays accurate as α → 1.

    Parameters
    ----------
    alpha : array_like, in [0, 1]
        Target's acceptance of d1's tokens.
    c_d1 : array_like, >= 0
        Cost of one d1 forward call (which verifies d2's k tokens in parallel).
    n : array_like of int, >= 0
        Inner rounds per target call.
    alpha_inner : array_like, in [0, 1]
        d1's acceptance of d2's tokens.
    c_d2 : array_like, >= 0
        Cost of one d2 forward call (0 for Max-Gram).
    k : array_like of int, >= 0
        Tokens d2 drafts per inner round.
    verify : optional table of the target's v(m) (:func:`ewif`), scalars only: the target's
        call then costs E[v(T + 1)] over the distribution of T (the n-fold convolution of L's),
        and the numerator is E[Σ_{i=0}^{T} α^i] over the same distribution; the table must
        cover the longest draft, n·(k + 1) + 1 tokens.
    """
    alpha = as_probability("alpha", alpha)
    alpha_inner = as_probability("alpha_inner", alpha_inner)
    c_d1 = as_cost("c_d1", c_d1)
    c_d2 = as_cost("c_d2", c_d2)
    n = as_count("n", n)
    k = as_count("k", k)
    if verify is not None:
        return _vertical_priced(float(alpha), float(c_d1), int(n), float(alpha_inner), float(c_d2), int(k), as_verify(verify))
    g = _geometric_sum(alpha * alpha_inner, k + 1)  # E[Σ_{i<L} α^i] = (1 − φ(α)) / (1 − α)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_term = np.log(alpha) + np.where(n == 0, 0.0, n * np.log1p(-(1.0 - alpha) * g))
        numerator = -np.expm1(log_term) / (1.0 - alpha)
    numerator = np.where(alpha == 1.0, 1.0 + n * g, numerator)
    return np.asarray(numerator / (1.0 + n * c_d1 + n * k * c_d2))[()]


def optimal_k(alpha, c, k_max=32, verify=None):
    """The draft length k ∈ {0, …, k_max} maximising :func:`ewif`, vectorised over α and c.

    k = 0 (plain autoregressive decoding, EWIF 1) is returned where no draft helps. Ties go
    to the smallest k. With ``verify`` (the target's v(n), :func:`ewif`) the draft is also
    limited to the table (k + 1 ≤ its length) and every k is scored: a measured v(n) need not
    be convex, so EWIF need not be unimodal.

    The scan accumulates E[tokens] term by term (Σ α^i, all terms positive, so accurate for
    every α) and works through the points in cache-sized chunks. EWIF is unimodal in k — the
    numerator is concave in k and the denominator affine and positive, so every superlevel
    set is an interval — hence a point that stops improving is done, and the scan continues
    only with the points still improving.

    Parameters
    ----------
    alpha : array_like, in [0, 1]
    c : array_like, >= 0
    k_max : int in [0, 1024]

    Returns
    -------
    (k, ewif) : arrays of the broadcast shape of ``alpha`` and ``c``.
    """
    alpha = as_probability("alpha", alpha)
    c = as_cost("c", c)
    k_max = as_k_max(k_max)
    if verify is not None:
        v = as_verify(verify)
        ks = np.arange(min(k_max, v.size - 1) + 1)
        values = ewif(alpha[..., None], c[..., None], ks, v)
        best_k = np.argmax(values, axis=-1)  # the first maximum: ties to the smallest k
        return best_k[()], np.take_along_axis(values, best_k[..., None], -1)[..., 0][()]
    shape = np.broadcast_shapes(alpha.shape, c.shape)
    alpha = np.broadcast_to(alpha, shape).ravel()
    c = np.broadcast_to(c, shape).ravel()
    best = np.ones(alpha.size)
    best_k = np.zeros(alpha.size, dtype=np.int64)
    for start in range(0, alpha.size, _CHUNK):
        _scan_chunk(alpha, c, k_max, np.arange(start, min(start + _CHUNK, alpha.size)), best, best_k)
    return best_k.reshape(shape)[()], best.reshape(shape)[()]


def _scan_chunk(alpha, c, k_max, idx, best, best_k) -> None:
    """Scan k = 1..k_max for the points ``idx``, writing their optimum into best/best_k.

    Points still improving form the active set; when fewer than half remain, the work arrays
    are compacted to them (a point that stopped improving never improves again: unimodality).
    """
    a, cc = alpha[idx], c[idx]
    b, bk = np.ones(idx.size), np.zeros(idx.size, dtype=np.int64)
    power = np.ones(idx.size)  # α^k
    tokens = np.ones(idx.size)  # Σ_{i=0}^{k} α^i
    value = np.empty(idx.size)
    better = np.empty(idx.size, dtype=bool)
    for k in range(1, k_max + 1):
        np.multiply(power, a, out=power)
        np.add(tokens, power, out=tokens)
        np.multiply(cc, k, out=value)
        value += 1.0
        np.divide(tokens, value, out=value)
        np.greater(value, b, out=better)
        np.copyto(b, value, where=better)
        np.copyto(bk, k, where=better)
        active = np.count_nonzero(better)
        if active == 0:
            break
        if 2 * active < idx.size:
            best[idx], best_k[idx] = b, bk
            keep = better.copy()
            idx, a, cc, power, tokens, b, bk = (x[keep] for x in (idx, a, cc, power, tokens, b, bk))
            value, better = np.empty(idx.size), np.empty(idx.size, dtype=bool)
    best[idx], best_k[idx] = b, bk


#: Points per chunk in :func:`optimal_k`: small enough for the work arrays to stay in cache.
_CHUNK = 65536


@dataclass(frozen=True)
class HorizontalPlan:
    """The best horizontal cascade: which drafters, in which order, with how many tokens each.

    ``order`` indexes the ``drafters`` passed to :func:`optimal_horizontal`; drafters with a
    zero count are left out. ``evaluations`` counts the count vectors scored.
    """

    order: tuple[int, ...]
    counts: tuple[int, ...]
    ewif: float
    evaluations: int

    @property
    def k(self) -> int:
        """Total draft length."""
        return int(sum(self.counts))


def _compositions(n: int, total_max: int) -> np.ndarray:
    """All vectors of n non-negative integers with sum ≤ total_max, shape (count, n)."""
    # Stars and bars: choose n bar positions among total_max + n slots.
    bars = np.array(list(itertools.combinations(range(total_max + n), n)), dtype=np.int64)
    bars = bars.reshape(-1, n)
    gaps = np.diff(np.concatenate([np.full((len(bars), 1), -1), bars], axis=1), axis=1) - 1
    return gaps


def optimal_horizontal(drafters, k_max=32, verify=None) -> HorizontalPlan:
    """The best horizontal cascade over ``drafters`` with total draft length ≤ ``k_max``.

    Exact. Two facts reduce the search to count vectors ([CSD] Theorem 4.1 and 4.4):

    * swapping two adjacent positions so that the higher-α drafter goes first changes only
      one prefix product, upward, and leaves the cost unchanged; so an optimal cascade drafts
      in order of decreasing α;
    * a drafter with lower α and higher cost than another is never needed (replacing it
      raises every prefix product and lowers the cost); and by Theorem 4.4 no random
      interpolation between drafters beats the best deterministic allocation.

    All count vectors (k_1, …, k_n) with Σ k_i ≤ k_max over the remaining drafters sorted by
    decreasing α are then scored at once with :func:`ewif_horizontal`.

    Parameters
    ----------
    drafters : sequence of (alpha, c) pairs (scalars)
    k_max : int, maximum total draft length (and k_max + 1 ≤ the length of ``verify``)
    verify : optional table of the target's v(n) (:func:`ewif`); the first fact above holds
        with it too (a swap leaves the total length, hence v, unchanged), the second as well
        (the replacement keeps every count)
    """
    alphas, costs = _drafter_arrays(drafters)
    for i, (a, c) in enumerate(zip(alphas, costs)):
        if a.ndim or c.ndim:
            raise DraftsimError(f"drafters[{i}] must hold scalars for optimal_horizontal")
    k_max = as_k_max(k_max)
    if verify is not None:
        k_max = min(k_max, as_verify(verify).size - 1)
    alphas = [float(a) for a in alphas]
    costs = [float(c) for c in costs]
    # Decreasing α, ties broken by cost; then drop dominated drafters.
    ranked = sorted(range(len(alphas)), key=lambda i: (-alphas[i], costs[i], i))
    kept: list[int] = []
    for i in ranked:
        if not any(alphas[j] >= alphas[i] and costs[j] <= costs[i] for j in kept):
            kept.append(i)
    n = len(kept)
    total = math.comb(k_max + n, n)
    if total > MAX_ENUMERATION:
        raise DraftsimError(
            f"k_max={k_max} with {n} non-dominated drafters needs {total} evaluations; "
            f"the limit is {MAX_ENUMERATION}: lower k_max"
        )
    counts = _compositions(n, k_max)
    values = ewif_horizontal([(alphas[i], costs[i]) for i in kept], list(counts.T), verify)
    best = int(np.argmax(values))
    chosen = [(kept[j], int(counts[best, j])) for j in range(n) if counts[best, j] > 0]
    return HorizontalPlan(
        order=tuple(i for i, _ in chosen),
        counts=tuple(k for _, k in chosen),
        ewif=float(values[best]),
        evaluations=len(counts),
    )


def _draft_length_pmf(alpha_inner: float, n: int, k: int) -> np.ndarray:
    """P(T = t), t = 0..n(k+1): T = L_1 + … + L_n, each L on 1..k+1 with P(L > i) = alpha_inner^i."""
    powers = alpha_inner ** np.arange(k + 1)
    pmf_l = np.zeros(k + 2)
    pmf_l[1:] = powers - np.append(powers[1:], 0.0)  # P(L = i) = a^(i-1) − a^i, P(L = k+1) = a^k
    pmf = np.ones(1)
    for _ in range(n):
        pmf = np.convolve(pmf, pmf_l)
    return pmf


def _vertical_priced(alpha, c_d1, n, alpha_inner, c_d2, k, v) -> float:
    """:func:`ewif_vertical` with the target's verification table ``v`` (scalars)."""
    if n * (k + 1) + 1 > v.size:
        raise DraftsimError(f"the verification table covers 1..{v.size} tokens; a vertical cascade with n={n}, k={k} "
                            f"verifies up to {n * (k + 1) + 1}")
    pmf = _draft_length_pmf(alpha_inner, n, k)
    t = np.arange(pmf.size)
    tokens = float(pmf @ _geometric_sum(np.full(t.size, alpha), t + 1))
    return tokens / (float(pmf @ v[t]) + n * c_d1 + n * k * c_d2)


@dataclass(frozen=True)
class VerticalPlan:
    """The best (n, k) of a two-level vertical cascade (see :func:`ewif_vertical`)."""

    n: int
    k: int
    ewif: float
    evaluations: int


def optimal_vertical(alpha, c_d1, alpha_inner, c_d2=0.0, k_max=32, rtol=1e-6, verify=None) -> VerticalPlan:
    """Best inner-round count n ∈ {0, …, k_max} and inner draft length k ∈ {0, …, k_max}.

    Exhaustive over the (n, k) grid with :func:`ewif_vertical` (scalars only); n = 0 is plain
    autoregressive decoding. With a free bottom drafter (``c_d2 = 0``, Max-Gram) EWIF keeps
    growing in k by amounts that shrink like (α·alpha_inner)^k, so near-ties are broken
    towards the smallest n, then the smallest k, whose EWIF is within ``rtol`` (relative) of
    the maximum. With ``verify`` (the target's v(m), :func:`ewif_vertical`) only the (n, k)
    whose longest draft the table covers are scored (the others count as EWIF 0).
    """
    k_max = as_k_max(k_max)
    rtol = float(as_probability("rtol", rtol))
    grid_n, grid_k = np.meshgrid(np.arange(k_max + 1), np.arange(k_max + 1), indexing="ij")
    if verify is not None:
        v = as_verify(verify)
        if np.ndim(alpha) or np.ndim(c_d1) or np.ndim(alpha_inner) or np.ndim(c_d2):
            raise DraftsimError("optimal_vertical takes scalar alpha, costs and alpha_inner")
        values = np.zeros(grid_n.shape)
        for n_, k_ in zip(grid_n.ravel(), grid_k.ravel()):
            if n_ * (k_ + 1) + 1 <= v.size:
                values[n_, k_] = ewif_vertical(alpha, c_d1, n_, alpha_inner, c_d2, k_, v)
    else:
        values = np.asarray(ewif_vertical(alpha, c_d1, grid_n, alpha_inner, c_d2, grid_k))
    if values.ndim != 2:
        raise DraftsimError("optimal_vertical takes scalar alpha, costs and alpha_inner")
    near = values >= values.max() * (1.0 - rtol)
    flat = int(np.argmax(near))  # first in (n, k) row-major order
    n, k = np.unravel_index(flat, values.shape)
    return VerticalPlan(n=int(n), k=int(k), ewif=float(values.flat[flat]), evaluations=values.size)


def swi(counts, costs, n_tokens):
    """Standardised walltime improvement ([CSD] §5).

    SWI = n_tokens / Σ_m counts_m · c_m: the walltime of autoregressive decoding (one target
    call, cost 1, per token) over the standardised walltime of the run, in which each forward
    call of model m costs its cost coefficient c_m. Include the target in ``counts`` and
    ``costs`` with cost 1.

    Parameters
    ----------
    counts : array_like of int, shape (..., n_models), >= 0
        Forward calls of each model.
    costs : array_like, shape (..., n_models), >= 0
        Cost coefficient of each model.
    n_tokens : array_like of int, >= 1
        Tokens generated.
    """
    counts = as_count("counts", counts)
    costs = as_cost("costs", costs)
    n_tokens = as_count("n_tokens", n_tokens, minimum=1)
    if counts.ndim == 0 or costs.ndim == 0 or counts.shape[-1] != costs.shape[-1]:
        raise DraftsimError(
            f"counts and costs need one entry per model on their last axis; got shapes "
            f"{counts.shape} and {costs.shape}"
        )
    walltime = (counts * costs).sum(axis=-1)
    if np.any(walltime <= 0):
        raise DraftsimError("counts and costs give a standardised walltime of 0; the target must be called")
    return (n_tokens / walltime)[()]


def latency_per_token(t_draft, t_target, discard_rate, verification_rate):
    """Average latency per generated token ([SD++] §3, eq. 5.1).

    With N tokens generated, N_discarded drafted-and-discarded tokens and N_target target
    calls, the draft runs N − N_target + N_discarded times and the target N_target times, so::

        latency = t_draft·(1 + r_discard) + (t_target − t_draft)·r_verify,

    with r_discard = N_discarded/N and r_verify = N_target/N.

    Parameters
    ----------
    t_draft, t_target : array_like, > 0
        Seconds per draft and per target forward call.
    discard_rate : array_like, >= 0
    verification_rate : array_like, in (0, 1]
    """
    t_draft = as_positive("t_draft", t_draft)
    t_target = as_positive("t_target", t_target)
    discard_rate = as_cost("discard_rate", discard_rate)
    verification_rate = as_probability("verification_rate", verification_rate)
    return (t_draft * (1.0 + discard_rate) + (t_target - t_draft) * verification_rate)[()]


def fixed_k_rates(alpha, k):
    """Expected discard and verification rates of fixed-k speculative decoding ([SD++] §3).

    Under i.i.d. acceptance each round makes one target call, drafts k tokens and emits
    E = :func:`expected_tokens` tokens, of which E − 1 were accepted drafts; by the
    renewal-reward theorem the long-run rates are::

        verification_rate = 1 / E,    discard_rate = (k − (E − 1)) / E.

    Returns
    -------
    (discard_rate, verification_rate)
    """
    k_arr = as_count("k", k)
    tokens = expected_tokens(alpha, k_arr)
    return (k_arr - (tokens - 1.0)) / tokens, 1.0 / tokens


def _one_minus_power(p, k) -> np.ndarray:
    """1 − p^k for p in [0, 1], k ≥ 0, accurate as p → 1 (−expm1(k·log p): nothing cancels, as
    :func:`_geometric_sum`'s numerator); 0 at k = 0, 1 at p = 0."""
    p, k = np.broadcast_arrays(np.asarray(p, dtype=np.float64), np.asarray(k))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = -np.expm1(k * np.log(p))
    return np.where(k == 0, 0.0, np.where(p == 0.0, 1.0, out))


def kmatrix_model(K: np.ndarray, A: np.ndarray, c: np.ndarray):
    """Closed-form statistics of the cascade a K matrix describes, vectorised over a leading
    batch axis of K (see :func:`ewif_kmatrix`). Returns (step_cost, mean_L, pgf_L) functions
    of the model index."""
    m = K.shape[-1]

    def step_cost(j: int) -> np.ndarray:
        """Cost of one step of model j: its own call plus its cascade's steps."""
        return c[j] + sum(K[..., j, l] * step_cost(l) for l in range(j + 1, m))

    def pgf_L(j: int, w) -> np.ndarray:
        """E[w^L_j] for the tokens L_j one step of model j emits (1 without a cascade)."""
        w = np.asarray(w, dtype=np.float64)
        total, reach = 0.0, 1.0
        for l in range(j + 1, m):
            a = A[l, j]
            aw = a * w
            phi = pgf_L(l, aw)
            phi_T = phi ** K[..., j, l]
            with np.errstate(divide="ignore", invalid="ignore"):
                term = np.where(aw < 1.0, (1.0 - a) * _one_minus_power(phi, K[..., j, l]) / np.where(aw < 1.0, 1.0 - aw, 1.0), 0.0)
            total = total + reach * term
            reach = reach * phi_T
        return w * (total + reach)

    def mean_L(j: int) -> np.ndarray:
        """E[L_j] = 1 + expected tokens of j's draft accepted by j."""
        total, reach = 0.0, 1.0
        for l in range(j + 1, m):
            a = A[l, j]
            k = K[..., j, l]
            phi = pgf_L(l, a)
            phi_T = phi ** k
            block = k * mean_L(l) if a >= 1.0 else a * _one_minus_power(phi, k) / (1.0 - a)
            total = total + reach * block
            reach = reach * phi_T
        return 1.0 + total

    return step_cost, mean_L, pgf_L


def ewif_kmatrix(K, A, costs):
    """EWIF of Cascade Speculative Drafting with a K matrix ([CSD] Algorithm 1), closed form.

    Models 0 (target), 1, …, m−1. Row i of ``K`` builds model i's draft: ``K[i][j]`` steps of
    model j, in order of j; a step of a model with a non-zero row is one speculative round
    over its own cascade and emits L_j tokens (accepted + its correction or bonus), a step of
    a model with an empty row emits one token. A token proposed by model j to model i is
    accepted with ``A[j, i]``, independently ([CSD] Theorem 4.1's assumption). With
    L_j's generating function φ_j, a block of k steps of j has length T with
    E[w^T] = φ_j(w)^k, and for blocks in order, by first-rejection analysis::

        E[w^A_i] = Σ_j (Π_{j'<j} φ_{T_j'}(α_j'·w)) (1 − α_j)(1 − φ_{T_j}(α_j·w))/(1 − α_j·w)
                   + Π_j φ_{T_j}(α_j·w),
        E[A_i]   = Σ_j (Π_{j'<j} φ_{T_j'}(α_j')) α_j (1 − φ_{T_j}(α_j))/(1 − α_j),

    and φ_i(w) = w·E[w^A_i]. EWIF = (1 + E[A_0]) / step cost of the target, where a step of
    model j costs c_j + Σ_l K[j][l]·(step cost of l). ``[[0, n, 0], [0, 0, k], [0, 0, 0]]``
    gives :func:`ewif_vertical`; a single non-zero row gives :func:`ewif_horizontal`.

    Parameters
    ----------
    K : int array (..., m, m), strictly upper triangular, entries >= 0
    A : array (m, m), A[j, i] in [0, 1] for j > i
    costs : array (m,) of cost coefficients, costs[0] = 1 for the target
    """
    K = as_count("K", K)
    A = as_probability("A", A)
    c = as_cost("costs", costs)
    m = K.shape[-1]
    if K.ndim < 2 or K.shape[-2] != m or A.shape != (m, m) or c.shape != (m,):
        raise DraftsimError(f"K must be (..., m, m), A (m, m) and costs (m,); got {K.shape}, {A.shape}, {c.shape}")
    if np.any(np.tril(np.ones((m, m), dtype=bool)) & (K != 0)):
        raise DraftsimError("K must be strictly upper triangular")
    step_cost, mean_L, _ = kmatrix_model(K, A, c)
    return (mean_L(0) / step_cost(0))[()]
