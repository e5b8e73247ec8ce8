"""Policy optimisation: K matrices, token-tree shapes, and the lenience of deferral rules.

* :func:`kmatrix_exact` — the EWIF-optimal K matrix of Cascade Speculative Drafting for up
  to 3 drafters (entries 0..k_max ≤ 20), by exhaustive search with an upper bound that
  prunes whole families of matrices; provably optimal under the closed form
  :func:`draftsim.sim.analytic.ewif_kmatrix`.
* :func:`kmatrix_grid` — the paper's tuning procedure as a baseline: a coordinate search
  whose step halves (16, 8, 4, 2, 1), scored by the closed form or by Monte Carlo with
  common random numbers (:func:`mc_evaluator`).
* :func:`tree_shape` — Sequoia-style dynamic programming for the token tree that maximises
  expected accepted tokens per unit time, given per-rank acceptance and a cost curve t(n).
* :func:`choose_lenience` — the deferral threshold α meeting a rejection (or deferral) rate
  budget B ([SC] eq. 7).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from . import analytic
from .errors import DraftsimError, as_cost, as_count, as_probability

__all__ = [
    "KMatrixResult",
    "kmatrix_exact",
    "kmatrix_grid",
    "mc_evaluator",
    "TreeShape",
    "tree_shape",
    "chain_value",
    "choose_lenience",
]

#: Largest K-matrix entry the exact search supports.
EXACT_ENTRY_MAX = 20


@dataclass(frozen=True)
class KMatrixResult:
    """An optimised K matrix, its EWIF and how many K matrices were scored."""

    K: np.ndarray
    ewif: float
    evaluations: int
    method: str

    def to_dict(self) -> dict:
        return {"K": self.K.tolist(), "ewif": self.ewif, "evaluations": self.evaluations, "method": self.method}


def _check_system(A, costs) -> tuple[np.ndarray, np.ndarray]:
    A = as_probability("A", A)
    c = as_cost("costs", costs)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 2:
        raise DraftsimError(f"A must be a square matrix over target + drafters; got shape {A.shape}")
    if c.shape == (A.shape[0] - 1,):
        c = np.concatenate([[1.0], c])
    if c.shape != (A.shape[0],):
        raise DraftsimError(f"costs must give one coefficient per drafter ({A.shape[0] - 1}); got {c.shape[0]}")
    return A, c


def kmatrix_exact(A, costs, k_max: int = EXACT_ENTRY_MAX, progress=None) -> KMatrixResult:
    """The EWIF-optimal K matrix for n ≤ 3 drafters, exactly.

    Every K matrix with entries in 0..k_max is covered. Rows 1..n−1 (the drafters' own
    cascades) are enumerated; each such *lower configuration* fixes, for every drafter j,
    its step cost s_j, the generating function φ_j of the tokens a step emits and their mean.
    The target's row (K01, …, K0n) then enters in closed form: with block j of K0j steps,
    P_j = φ_j(α_j)^K0j and m_j the expected tokens of the block accepted when it is reached::

        EWIF = (1 + m_1 + P_1 (m_2 + P_2 (m_3 + …))) / (1 + Σ_j K0j·s_j),

    evaluated for all target rows of a batch of lower configurations at once. Pruning: an
    upper bound per lower configuration — the best value over K01 of
    (1 + m_1 + P_1·max(rest of the numerator)) / (1 + s_1·K01), which drops only
    non-negative cost terms — is computed first; configurations are scored in decreasing
    order of their bound, and the search stops when the next bound cannot beat the best
    value found. The result is therefore the exact optimum of the closed form.

    With one drafter there is no lower configuration to enumerate (one empty one): the K
    matrix is ``[[0, k], [0, 0]]`` — [CSD]'s 1×1 matrix [[k]] over the target's row — and k
    is the best fixed draft length of :func:`draftsim.sim.analytic.optimal_k` (k = 0 where no
    draft helps).

    Parameters
    ----------
    A : (n+1, n+1) acceptance matrix, A[j, i] = P(model i accepts a token proposed by j)
    costs : n drafter cost coefficients (or n+1 with the target's 1 first)
    k_max : largest entry, ≤ 20
    progress : optional callable(n) told how many lower configurations were settled
    """
    A, c = _check_system(A, costs)
    k_max = int(as_count("k_max", k_max, maximum=EXACT_ENTRY_MAX))
    m = A.shape[0]
    n = m - 1
    if n > 3:
        raise DraftsimError(f"the exact search handles up to 3 drafters; got {n} (use kmatrix_grid)")
    values = np.arange(k_max + 1)
    lower_slots = [(i, j) for i in range(1, m) for j in range(i + 1, m)]
    # One row per lower configuration; one drafter has no lower slots and one (empty) configuration.
    combos = np.array(list(itertools.product(values, repeat=len(lower_slots))), dtype=np.int64)
    combos = combos.reshape((k_max + 1) ** len(lower_slots), len(lower_slots))
    K_low = np.zeros((len(combos), m, m), dtype=np.int64)
    for col, (i, j) in enumerate(lower_slots):
        K_low[:, i, j] = combos[:, col]
    step_cost, mean_L, pgf_L = analytic.kmatrix_model(K_low, A, c)
    ks = values.astype(np.float64)
    m_tab, p_tab, s = [], [], []
    for j in range(1, m):
        a = A[j, 0]
        phi = np.broadcast_to(pgf_L(j, a), (len(combos),))
        P = phi[:, None] ** ks[None, :]  # (L, k_max+1)
        if a >= 1.0:
            mb = ks[None, :] * np.broadcast_to(mean_L(j), (len(combos),))[:, None]
        else:
            mb = a * (1.0 - P) / (1.0 - a)
        m_tab.append(mb)
        p_tab.append(P)
        s.append(np.broadcast_to(step_cost(j), (len(combos),)).astype(np.float64))

    # Upper bound per lower configuration (see the docstring).
    rest = np.zeros((len(combos), 1))
    for j in range(n - 1, 0, -1):  # blocks 2..n, Horner, flattened over their rows
        rest = (m_tab[j][:, :, None] + p_tab[j][:, :, None] * rest[:, None, :]).reshape(len(combos), -1)
    rest_max = rest.max(axis=1)
    bound = ((1.0 + m_tab[0] + p_tab[0] * rest_max[:, None]) / (1.0 + s[0][:, None] * ks[None, :])).max(axis=1)
    order = np.argsort(-bound, kind="stable")

    best, best_K, evaluations = -np.inf, None, 0
    chunk = max(1, 2_000_000 // (k_max + 1) ** n)
    grids = np.meshgrid(*([ks] * n), indexing="ij")  # K01..K0n over the target row
    cost_parts = [g.ravel() for g in grids]
    for start in range(0, len(order), chunk):
        idx = order[start : start + chunk]
        if bound[idx[0]] <= best:
            if progress is not None:
                progress(len(order) - start)
            break
        if progress is not None:
            progress(len(idx))
        num = np.zeros((len(idx), 1))
        for j in range(n - 1, -1, -1):
            num = (m_tab[j][idx][:, :, None] + p_tab[j][idx][:, :, None] * num[:, None, :]).reshape(len(idx), -1)
        num = 1.0 + num
        den = 1.0 + sum(s[j][idx][:, None] * cost_parts[j][None, :] for j in range(n))
        val = num / den
        evaluations += val.size
        flat = int(np.argmax(val))
        li, ui = divmod(flat, val.shape[1])
        if val.flat[flat] > best:
            best = float(val.flat[flat])
            K = K_low[idx[li]].copy()
            K[0, 1:] = [int(cost_parts[j][ui]) for j in range(n)]
            best_K = K
    # Canonical form: rows of drafters the target never uses do not matter; zero them.
    best_K = _prune_unused(best_K)
    return KMatrixResult(best_K, float(analytic.ewif_kmatrix(best_K, A, c)), evaluations, "exact")


def _prune_unused(K: np.ndarray) -> np.ndarray:
    """Zero the rows of models not reachable from the target (they never run)."""
    K = K.copy()
    m = K.shape[0]
    used = {0}
    for i in range(m):
        if i in used:
            used |= {j for j in range(i + 1, m) if K[i, j] > 0}
    for i in range(1, m):
        if i not in used:
            K[i] = 0
    return K


def kmatrix_grid(
    A,
    costs,
    k_max: int = EXACT_ENTRY_MAX,
    start: np.ndarray | None = None,
    evaluate: Callable[[np.ndarray], float] | None = None,
    first_step: int = 16,
) -> KMatrixResult:
    """The halving grid search (the baseline of [CSD]'s hand tuning).

    From ``start`` (default: every upper entry 1, or 0 when k_max is 0), each entry in turn is moved by ±step
    (clipped to 0..k_max) while that improves the score; when no entry improves, the step
    halves (16, 8, 4, 2, 1). ``evaluate(K) -> EWIF`` defaults to the closed form; pass
    :func:`mc_evaluator` to score by simulation. Local: it may miss the optimum.
    """
    A, c = _check_system(A, costs)
    k_max = int(as_count("k_max", k_max, maximum=256))
    m = A.shape[0]
    slots = [(i, j) for i in range(m) for j in range(i + 1, m)]
    score = evaluate or (lambda K: float(analytic.ewif_kmatrix(K, A, c)))
    K = np.zeros((m, m), dtype=np.int64)
    if start is None:
        for i, j in slots:
            K[i, j] = min(1, k_max)
    else:
        K = np.array(start, dtype=np.int64)
    cache: dict = {}

    def value(K):
        key = K.tobytes()
        if key not in cache:
            cache[key] = score(K)
        return cache[key]

    best = value(K)
    step = int(first_step)
    while step >= 1:
        improved = True
        while improved:
            improved = False
            for i, j in slots:
                for delta in (step, -step):
                    trial = K.copy()
                    trial[i, j] = int(np.clip(trial[i, j] + delta, 0, k_max))
                    if trial[i, j] == K[i, j] or trial[0].sum() == 0:
                        continue
                    v = value(trial)
                    if v > best + 1e-12:
                        K, best, improved = trial, v, True
        step //= 2
    return KMatrixResult(_prune_unused(K), float(best), len(cache), "grid")


def mc_evaluator(process, costs, tokens: int = 200_000, seed: int = 0, leniency: float = 1.0):
    """Score K matrices by Monte Carlo with common random numbers (the same seed for every
    candidate), for acceptance processes without a closed form."""
    from .policies import VerticalCascade
    from .simulate import simulate

    def evaluate(K: np.ndarray) -> float:
        return simulate(VerticalCascade(K, leniency), process, costs, tokens, seed=seed).metrics["ewif"].value

    return evaluate


# ---------------------------------------------------------------- token trees


@dataclass(frozen=True)
class TreeShape:
    """A token tree: ``parents`` (−1 = root), its expected accepted tokens per round
    (bonus excluded), the verification cost and the resulting tokens per unit time."""

    parents: tuple[int, ...]
    expected_accepted: float
    cost: float
    tokens_per_time: float

    @property
    def size(self) -> int:
        return len(self.parents)

    def depths(self) -> list[int]:
        """Depth of every node (children of the root: 1)."""
        d = [0] * self.size
        for i, p in enumerate(self.parents):
            d[i] = 1 if p < 0 else d[p] + 1
        return d

    def depth(self) -> int:
        return max(self.depths(), default=0)


def _rank_probs(rank_alphas) -> np.ndarray:
    """P(the candidate of rank r is the accepted one) = r_r Π_{i<r} (1 − r_i)."""
    r = as_probability("rank_alphas", rank_alphas)
    if r.ndim != 1 or r.size == 0:
        raise DraftsimError("rank_alphas must be a non-empty 1-d sequence")
    survive = np.concatenate([[1.0], np.cumprod(1.0 - r)[:-1]])
    return r * survive


def tree_shape(rank_alphas, budget: int, cost: Callable[[int], float], draft_cost: float = 0.0) -> TreeShape:
    """The token tree maximising (1 + E[accepted]) / (t(n + 1) + draft time), over n ≤ budget.

    Dynamic programming as in Sequoia: with p_r the probability that the rank-r child of an
    accepted node is the accepted one, f(n) — the best expected accepted tokens of a subtree
    of n nodes below an accepted node — satisfies f(n) = g(n, 1) with
    g(n, r) = max(0, max_{s=1..n} p_r (1 + f(s − 1)) + g(n − s, r + 1)).
    ``cost(n)`` is the target's time to verify n tokens in one call (root included);
    ``draft_cost`` the drafter's time per tree level. O(budget² · ranks).
    """
    p = _rank_probs(rank_alphas)
    budget = int(as_count("budget", budget, minimum=0, maximum=4096))
    W = len(p)
    f = np.zeros(budget + 1)
    # g[n][r]: best value with n nodes using ranks r.. (0-based), choice[n][r] = subtree size
    g = np.zeros((budget + 1, W + 1))
    choice = np.zeros((budget + 1, W + 1), dtype=np.int64)
    for n in range(1, budget + 1):
        for r in range(W - 1, -1, -1):
            best, arg = 0.0, 0
            for size in range(1, n + 1):
                v = p[r] * (1.0 + f[size - 1]) + g[n - size, r + 1]
                if v > best:
                    best, arg = v, size
            g[n, r], choice[n, r] = best, arg
        f[n] = g[n, 0]

    def build(n: int, parent: int, parents: list) -> None:
        r = 0
        while n > 0 and r < W and choice[n, r] > 0:
            size = choice[n, r]
            parents.append(parent)
            me = len(parents) - 1
            build(size - 1, me, parents)
            n -= size
            r += 1

    best = None
    for n in range(0, budget + 1):
        parents: list = []
        build(n, -1, parents)
        depth = TreeShape(tuple(parents), 0.0, 0.0, 0.0).depth()
        t = float(cost(len(parents) + 1)) + draft_cost * depth
        value = (1.0 + f[n]) / t
        if best is None or value > best.tokens_per_time + 1e-15:
            best = TreeShape(tuple(parents), float(f[n]), t, float(value))
    return best


def chain_value(rank_alphas, length: int, cost: Callable[[int], float], draft_cost: float = 0.0) -> TreeShape:
    """A chain of ``length`` tokens (rank-1 candidates only) scored like :func:`tree_shape`."""
    p1 = _rank_probs(rank_alphas)[0]
    acc = float(sum(p1**d for d in range(1, length + 1)))
    t = float(cost(length + 1)) + draft_cost * length
    return TreeShape(tuple(range(-1, length - 1)), acc, t, (1.0 + acc) / t)


# ---------------------------------------------------------------- speculative cascades


def choose_lenience(rule_factory, rows: Sequence[tuple[np.ndarray, np.ndarray]], budget: float, measure: str = "rejection", tol: float = 1e-6) -> dict:
    """The deferral threshold α ∈ [0, 1] meeting a rate budget B ([SC] eq. 7).

    ``rule_factory(alpha)`` builds the rule (e.g. ``sim.rules.Chow``); ``rows`` are (q, p)
    pairs from a model or from data. ``measure`` is ``"rejection"`` (mean P(reject) =
    mean δ·TV, Lemma 5: the target's corrections per token) or ``"deferral"`` (mean δ).
    The rate is monotone in α for Chow, Diff and OPT (a larger α defers less), so the
    smallest α with rate ≤ B — the one that defers most within budget — is found by
    bisection. Returns α, the achieved rate and the rate at α = 0 and α = 1.
    """
    budget = float(as_probability("budget", budget))
    if measure not in ("rejection", "deferral"):
        raise DraftsimError(f"measure must be 'rejection' or 'deferral'; got {measure!r}")
    if not rows:
        raise DraftsimError("choose_lenience needs (q, p) rows to measure rates on")
    q = np.stack([np.asarray(r[0], dtype=np.float64) for r in rows])
    p = np.stack([np.asarray(r[1], dtype=np.float64) for r in rows])

    def rate(alpha: float) -> float:
        rule = rule_factory(alpha)
        if measure == "rejection":
            return float(rule.rejection_rate(q, p).mean())
        return float(rule.defer(q, p).mean())

    lo, hi = 0.0, 1.0
    r_lo, r_hi = rate(lo), rate(hi)
    if r_lo <= budget:
        return {"alpha": 0.0, "rate": r_lo, "rate_at_0": r_lo, "rate_at_1": r_hi}
    if r_hi > budget:
        raise DraftsimError(f"no alpha in [0, 1] meets the budget {budget}: the rate is {r_hi:.4g} even at alpha = 1")
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if rate(mid) <= budget:
            hi = mid
        else:
            lo = mid
    return {"alpha": hi, "rate": rate(hi), "rate_at_0": r_lo, "rate_at_1": r_hi}
