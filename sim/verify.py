"""Block verification of a drafted chain of k tokens ([SC] Algorithm 4; [SD++] Algorithm 2).

Given the k drafted tokens x_1..x_k, the draft rows q_1..q_k they were drawn from and the
target rows p_1..p_{k+1} (p_{k+1} follows the whole draft), a rule and a Generator:

1. draw u_1..u_k ~ U[0, 1) and accept x_i while u_i < acceptance_i(x_i);
2. at the first rejection i, sample the correction token from the rule's residual at i;
   if all k are accepted, sample the bonus token from p_{k+1}.

The number accepted and the correction/bonus token are returned. Everything is vectorised
over leading batch axes: tokens (..., k), q (..., k, V), p (..., k+1, V). The same
Generator state gives the same outcome: exactly k + 1 uniforms are drawn per batch element
(k for the acceptance tests, one for the final token), in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .distributions import check_rows, check_tokens, sample
from .errors import DraftsimError
from .rules import SD, Rule

__all__ = ["BlockResult", "verify_block", "verify_block_greedy", "verify_greedy_ids"]


@dataclass(frozen=True)
class BlockResult:
    """Outcome of verifying one block (arrays when the input was batched).

    n_accepted : drafted tokens accepted, 0..k
    token : the correction token (n_accepted < k) or the bonus token (n_accepted == k)
    """

    n_accepted: np.ndarray | int
    token: np.ndarray | int

    @property
    def n_emitted(self):
        """Tokens this block adds to the output: the accepted ones plus one."""
        return self.n_accepted + 1


def _check_block(tokens, q, p):
    p = check_rows("p", p, min_ndim=2)
    vocab = p.shape[-1]
    tokens = check_tokens("tokens", tokens, vocab)
    if tokens.ndim < 1:
        raise DraftsimError("tokens must have a draft axis (shape (..., k)); got a scalar")
    k = tokens.shape[-1]
    if p.shape[:-1] != tokens.shape[:-1] + (k + 1,):
        raise DraftsimError(
            f"p must have shape (..., k+1, V) = {tokens.shape[:-1] + (k + 1, vocab)} for tokens of shape "
            f"{tokens.shape}; got {p.shape}"
        )
    if q is not None:
        q = check_rows("q", q, vocab=vocab, min_ndim=2)
        if q.shape[:-1] != tokens.shape:
            raise DraftsimError(f"q must have shape (..., k, V) = {tokens.shape + (vocab,)}; got {q.shape}")
        drafted_q = np.take_along_axis(q, tokens[..., None], axis=-1)[..., 0]
        if (drafted_q <= 0).any():
            idx = tuple(int(i) for i in np.argwhere(drafted_q <= 0)[0])
            raise DraftsimError(f"drafted token {int(tokens[idx])} at {idx} has probability 0 under q")
    return tokens, q, p


def _first_true(flags: np.ndarray, k: int) -> np.ndarray:
    """Index of the first True along the last axis, k where there is none (also for k = 0)."""
    if k == 0:
        return np.zeros(flags.shape[:-1], dtype=np.int64)
    return np.where(flags.any(axis=-1), flags.argmax(axis=-1), k)


def _row(rows: np.ndarray, i: np.ndarray) -> np.ndarray:
    """rows[..., i, :] with one index per batch element."""
    flat = rows.reshape(-1, *rows.shape[-2:])
    return flat[np.arange(len(flat)), np.ravel(i)].reshape(*rows.shape[:-2], rows.shape[-1])


def verify_block(tokens, q, p, rule: Rule | None = None, rng: np.random.Generator | None = None, *, validate: bool = True) -> BlockResult:
    """Verify k drafted tokens against the target under ``rule`` (default :class:`SD`).

    Parameters
    ----------
    tokens : int array (..., k)
        Drafted token ids, x_i ~ q_i.
    q : array (..., k, V)
        Draft rows the tokens were drawn from.
    p : array (..., k+1, V)
        Target rows at each drafted position plus the one after the draft.
    rule : Rule
    rng : numpy.random.Generator (required)
    validate : bool
        Check shapes, rows and token ids (O(kV)); executors in a hot loop may skip it.
    """
    if rng is None or not isinstance(rng, np.random.Generator):
        raise DraftsimError("verify_block needs an explicit numpy.random.Generator (rng=np.random.default_rng(seed))")
    rule = SD() if rule is None else rule
    if validate:
        tokens, q, p = _check_block(tokens, q, p)
    else:
        tokens, q, p = np.asarray(tokens), np.asarray(q, dtype=np.float64), np.asarray(p, dtype=np.float64)
    k = tokens.shape[-1]
    accept = rule.accept_prob(q, p[..., :k, :], tokens) if k else np.zeros(tokens.shape)
    u = rng.random(tokens.shape)
    rejected = u >= accept
    n = _first_true(rejected, k)
    final_p = _row(p, n)
    if k:
        at = np.minimum(n, k - 1)
        residual = rule.residual(_row(q, at), _row(p[..., :k, :], at))
        final = np.where((n < k)[..., None], residual, final_p)
    else:
        final = final_p
    token = sample(final, rng)
    return BlockResult(n_accepted=n[()], token=token[()])


def verify_block_greedy(tokens, p, rule: Rule | None = None, q=None, *, validate: bool = True) -> BlockResult:
    """Greedy verification: keep x_i while the rule's greedy test accepts it (for SD: x_i =
    argmax p_i); at the first miss emit :meth:`draftsim.sim.rules.Rule.greedy_choice`, after a full
    accept argmax p_k (the bonus token).

    ``q`` (the draft rows, (..., k, V)) is needed by rules whose decision depends on the
    draft (Chow, Diff, OPT, token-specific, Lossy). Ties in argmax go to the lowest token id
    (numpy's argmax), the same convention as :func:`draftsim.sim.distributions.warp` with temperature 0.
    No randomness.
    """
    if validate:
        tokens, q, p = _check_block(tokens, q, p)
    else:
        tokens, p = np.asarray(tokens), np.asarray(p)
        q = None if q is None else np.asarray(q)
    if rule is None or isinstance(rule, SD):
        return verify_greedy_ids(tokens, p.argmax(axis=-1))
    k = tokens.shape[-1]
    if q is None and k:
        q = np.zeros(p[..., :k, :].shape)  # rules that ignore q (Leniency) still get rows
    best = p.argmax(axis=-1)
    if not k:
        return BlockResult(n_accepted=np.zeros(tokens.shape[:-1], dtype=np.int64)[()], token=best[..., 0][()])
    keep = rule.greedy_accept(q, p[..., :k, :], tokens)
    n = _first_true(~keep, k)
    choice = rule.greedy_choice(q, p[..., :k, :])
    at = np.minimum(n, k - 1)
    token = np.where(n < k, np.take_along_axis(choice, at[..., None], axis=-1)[..., 0], best[..., k])
    return BlockResult(n_accepted=n[()], token=token[()])


def verify_greedy_ids(tokens, target_argmax) -> BlockResult:
    """Greedy verification from the target's argmax ids (..., k+1) alone, no distributions."""
    tokens, best = np.asarray(tokens), np.asarray(target_argmax)
    k = tokens.shape[-1]
    n = _first_true(tokens != best[..., :k], k)
    token = np.take_along_axis(best, n[..., None], axis=-1)[..., 0]
    return BlockResult(n_accepted=n[()], token=token[()])
