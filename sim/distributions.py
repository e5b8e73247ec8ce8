"""Next-token distributions as numpy rows: validation, warping, distances and sampling.

A *row* is a probability vector over the vocabulary (last axis); arrays of rows broadcast
over leading axes. ``p`` is the target's row, ``q`` the draft's (DESIGN.md).
"""

from __future__ import annotations

import numpy as np

from .errors import DraftsimError, as_count

#: Rows must sum to 1 within this absolute tolerance to be accepted as distributions.
SUM_TOLERANCE = 1e-6


def check_rows(name: str, rows, *, vocab: int | None = None, min_ndim: int = 1) -> np.ndarray:
    """Validate ``rows`` as probability vectors along the last axis and return them as float64.

    Every entry must be finite and ≥ 0 and every row must sum to 1 within
    :data:`SUM_TOLERANCE`; ``vocab`` (if given) is the required last-axis length.
    """
    try:
        arr = np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DraftsimError(f"{name} must be an array of probabilities; got {type(rows).__name__}") from exc
    if arr.ndim < min_ndim or arr.shape[-1] == 0:
        raise DraftsimError(f"{name} must have at least {min_ndim} axis/axes and a non-empty vocabulary axis; got shape {arr.shape}")
    if vocab is not None and arr.shape[-1] != vocab:
        raise DraftsimError(f"{name} must have a vocabulary axis of length {vocab}; got shape {arr.shape}")
    bad = ~(np.isfinite(arr) & (arr >= 0.0))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise DraftsimError(f"{name} must hold finite probabilities >= 0; got {arr[idx]!r} at index {idx}")
    sums = arr.sum(axis=-1)
    off = np.abs(sums - 1.0) > SUM_TOLERANCE
    if off.any():
        idx = tuple(int(i) for i in np.argwhere(off)[0]) if sums.ndim else ()
        raise DraftsimError(
            f"{name} rows must sum to 1 within {SUM_TOLERANCE:g}; row {idx} sums to {float(sums[idx]):.9g}"
        )
    return arr


def check_tokens(name: str, tokens, vocab: int) -> np.ndarray:
    """Validate token ids as integers in [0, vocab)."""
    return as_count(name, tokens, minimum=0, maximum=vocab - 1)


def normalize(weights: np.ndarray, fallback: np.ndarray | None = None) -> np.ndarray:
    """Scale non-negative ``weights`` to sum to 1 along the last axis.

    Rows with zero mass become ``fallback`` (broadcast) if given, else stay all-zero. Used for
    residual distributions ``norm(max(0, π − q))``, whose mass is zero exactly when the
    rejection probability is zero, so the fallback is never sampled from.
    """
    weights = np.asarray(weights, dtype=np.float64)
    total = weights.sum(axis=-1, keepdims=True)
    if np.all(total > 0):  # the common case: one division, no masks
        return weights / total
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(total > 0, weights / np.where(total > 0, total, 1.0), 0.0)
    if fallback is not None:
        out = np.where(total > 0, out, fallback)
    return out


def capped_ratio(num, den) -> np.ndarray:
    """min(1, num/den) elementwise, and 1 where den = 0 — an acceptance probability.

    A token with den = q(x) = 0 is never drafted, so its value is never used.
    """
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(den > 0, np.minimum(1.0, num / np.where(den > 0, den, 1.0)), 1.0)


def closed_classes(transition) -> list[list[int]]:
    """The closed communicating classes of a stochastic matrix (the sets of states a chain,
    once in, never leaves), each sorted, in order of their smallest state."""
    T = np.asarray(transition, dtype=np.float64)
    reach = (T > 0) | np.eye(len(T), dtype=bool)
    for k in range(len(T)):  # transitive closure (Warshall)
        reach |= reach[:, k:k + 1] & reach[k:k + 1, :]
    recurrent = [i for i in range(len(T)) if np.all(reach[reach[i], i])]
    classes = {tuple(np.flatnonzero(reach[i] & reach[:, i])) for i in recurrent}
    return sorted([list(map(int, c)) for c in classes])


def stationary(transition) -> np.ndarray:
    """The stationary distribution π = πT of a stochastic matrix (eigenvector of eigenvalue 1).

    Refuses (DraftsimError) a chain with more than one closed class: its long-run behaviour
    then depends on where it starts, and no single stationary distribution exists.
    """
    T = np.asarray(transition, dtype=np.float64)
    classes = closed_classes(T)
    if len(classes) > 1:
        names = " and ".join("{" + ", ".join(map(str, c)) + "}" for c in classes)
        raise DraftsimError(f"the regime chain never leaves regimes {names} once there (closed classes), so its long-run "
                            "behaviour depends on the starting regime; let every regime be reachable from the others "
                            "(a stay probability below 1)")
    w, vecs = np.linalg.eig(T.T)
    pi = np.real(vecs[:, np.argmin(np.abs(w - 1.0))])
    return pi / pi.sum()


def tv_distance(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Total variation distance ½ Σ |p − q| along the last axis."""
    return 0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum(axis=-1)


def kl_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """KL(p ‖ q) = Σ p log(p/q) along the last axis (inf where q = 0 < p)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    return terms.sum(axis=-1)


def warp(rows, temperature: float = 1.0, top_k: int | None = None) -> np.ndarray:
    """Apply temperature and top-k to probability rows, the same way for q and p.

    ``temperature`` T > 0 raises probabilities to 1/T (softmax of logits/T) and renormalises;
    T = 0 is greedy: all mass on the argmax (the lowest id on ties). ``top_k`` keeps the k
    most probable tokens (ties broken towards lower ids) and renormalises. Temperature is
    applied first, as in transformers' logits processors.
    """
    rows = np.asarray(rows, dtype=np.float64)
    if not (np.isfinite(temperature) and temperature >= 0):
        raise DraftsimError(f"temperature must be finite and >= 0; got {temperature!r}")
    if temperature == 0:
        out = np.zeros_like(rows)
        np.put_along_axis(out, rows.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return out
    if temperature != 1.0:
        with np.errstate(divide="ignore"):
            logits = np.log(rows) / temperature
        logits -= logits.max(axis=-1, keepdims=True)
        rows = normalize(np.exp(logits))
    if top_k is not None:
        k = int(as_count("top_k", top_k, minimum=1))
        if k < rows.shape[-1]:
            # Stable descending order: equal probabilities keep lower ids first.
            order = np.argsort(-rows, axis=-1, kind="stable")
            keep = np.zeros(rows.shape, dtype=bool)
            np.put_along_axis(keep, order[..., :k], True, axis=-1)
            rows = normalize(np.where(keep, rows, 0.0))
    return rows


#: Rows longer than this are sampled in two levels (blocks, then within a block).
_BLOCK = 256


def sample(rows: np.ndarray, rng: np.random.Generator, u: np.ndarray | None = None) -> np.ndarray:
    """One token id per row by inverse-CDF sampling, vectorised over leading axes.

    Rows need not be normalised (the CDF is scaled by the row's total). ``u`` (uniforms in
    [0, 1), shape of the leading axes) may be given to reuse draws; otherwise they are drawn
    from ``rng`` — one per row. Zero-probability tokens are never returned. Long rows are
    searched in two levels (block sums, then one block's CDF) to avoid a full cumulative sum.
    """
    rows = np.asarray(rows, dtype=np.float64)
    if u is None:
        u = rng.random(rows.shape[:-1])
    u = np.asarray(u, dtype=np.float64)
    lead, V = rows.shape[:-1], rows.shape[-1]
    flat = rows.reshape(-1, V)
    u = np.broadcast_to(u, lead).reshape(-1)
    if V <= 4 * _BLOCK:
        idx = _search(flat, u * flat.sum(axis=-1))
        return idx.reshape(lead)
    n_blocks = -(-V // _BLOCK)
    padded = flat if V % _BLOCK == 0 else np.pad(flat, ((0, 0), (0, n_blocks * _BLOCK - V)))
    blocks = padded.reshape(len(flat), n_blocks, _BLOCK)
    block_mass = blocks.sum(axis=-1)
    target = u * block_mass.sum(axis=-1)
    b = _search(block_mass, target)
    before = np.where(b > 0, np.take_along_axis(np.cumsum(block_mass, axis=-1), np.maximum(b - 1, 0)[:, None], axis=-1)[:, 0], 0.0)
    inner = blocks[np.arange(len(flat)), b]
    within = _search(inner, target - before)
    return (b * _BLOCK + within).reshape(lead)


def _search(rows: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per row, the first index whose cumulative mass exceeds ``target``, never a zero-mass index."""
    cdf = np.cumsum(rows, axis=-1)
    idx = (cdf <= target[:, None]).sum(axis=-1)
    # Rounding at the top end: step back to the last index with mass.
    last = rows.shape[-1] - 1 - np.argmax(rows[:, ::-1] > 0, axis=-1)
    return np.minimum(idx, last)
