"""Exact output distributions by enumeration — no sampling.

Small "models" are tables of next-token distributions per prefix (:class:`TableModel`).
For a decoding process the distribution of the first n output tokens is computed by
enumerating every draft outcome and every accept/reject branch, round after round:

* :func:`autoregressive` — sampling from the target alone (the reference);
* :class:`BlockProcess` — a draft chain of k tokens verified by any rule (:mod:`draftsim.sim.rules`);
* :class:`VerticalProcess` — a two-level vertical cascade: d2 drafts for d1 (inner rule,
  e.g. leniency), d1's proposal is verified by the target ([CSD] Algorithm 1);
* :class:`TreeProcess` — a token tree with m candidates per node verified by
  multi-candidate sampling (:mod:`draftsim.sim.tree`).

Each process is a class whose steps are methods, so a test can subclass it with one step
broken (a mutation control) and show that the same checks catch it. Everything is exact up
to floating-point rounding; with vocabularies ≤ 6 and n ≤ 4 it runs in milliseconds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterator, Mapping

import numpy as np

from .distributions import check_rows
from .errors import DraftsimError, as_count
from .rules import SD, Rule
from .tree import candidate_acceptance, candidate_proposal, candidate_residual

__all__ = [
    "TableModel",
    "Distribution",
    "autoregressive",
    "BlockProcess",
    "VerticalProcess",
    "TreeProcess",
    "max_abs_difference",
    "round_distribution",
]

Prefix = tuple[int, ...]
Distribution = dict[Prefix, float]
#: A round yields (tokens emitted, probability) pairs; probabilities sum to 1.
Round = Iterator[tuple[Prefix, float]]


class TableModel:
    """A toy language model: a table from prefix (tuple of ids) to a next-token distribution.

    Rows come from ``table`` when present; otherwise, if ``seed`` is given, they are drawn
    from a Dirichlet(concentration) seeded by (seed, prefix) — the same prefix always gets
    the same row, so a model is a fixed, reproducible object of unbounded depth. ``zeros``
    sets that fraction of each generated row to 0 (at least one entry is kept), to exercise
    tokens one model can produce and the other cannot.
    """

    def __init__(
        self,
        vocab: int,
        table: Mapping[Prefix, np.ndarray] | None = None,
        *,
        seed: int | None = None,
        concentration: float = 1.0,
        zeros: float = 0.0,
        warp: Callable[[np.ndarray], np.ndarray] | None = None,
    ):
        self.vocab = int(as_count("vocab", vocab, minimum=1))
        self.table = {tuple(k): check_rows(f"row {k}", v, vocab=self.vocab) for k, v in (table or {}).items()}
        if seed is None and table is None:
            raise DraftsimError("TableModel needs a table, a seed, or both")
        self.seed = seed
        self.concentration = float(concentration)
        self.zeros = float(zeros)
        self.warp = warp
        self._cache: dict[Prefix, np.ndarray] = {}

    def __call__(self, prefix: Prefix) -> np.ndarray:
        prefix = tuple(prefix)
        row = self._cache.get(prefix)
        if row is None:
            row = self._row(prefix)
            if self.warp is not None:
                row = self.warp(row)
            self._cache[prefix] = row
        return row

    def _row(self, prefix: Prefix) -> np.ndarray:
        if prefix in self.table:
            return self.table[prefix]
        if self.seed is None:
            raise DraftsimError(f"no row for prefix {prefix} in the table and no seed to generate one")
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        row = rng.dirichlet(np.full(self.vocab, self.concentration))
        if self.zeros > 0 and self.vocab > 1:
            n_zero = min(self.vocab - 1, int(round(self.zeros * self.vocab)))
            row[rng.permutation(self.vocab)[:n_zero]] = 0.0
            row /= row.sum()
        return row


def _unroll(round_fn: Callable[[Prefix, int], Round], n: int, prefix: Prefix = ()) -> Distribution:
    """Distribution of the first n tokens after ``prefix`` of a process made of rounds.

    ``round_fn(context, need)`` enumerates one round's outcomes from ``context``; a round may
    stop enumerating once it has emitted ``need`` tokens (what follows is beyond n).
    """
    n = int(as_count("n", n, minimum=1))
    out: dict[Prefix, float] = defaultdict(float)

    def go(generated: Prefix, prob: float) -> None:
        if len(generated) >= n:
            out[generated[:n]] += prob
            return
        for emitted, pr in round_fn(tuple(prefix) + generated, n - len(generated)):
            if pr > 0:
                go(generated + emitted, prob * pr)

    go((), 1.0)
    return dict(out)


def autoregressive(target: Callable[[Prefix], np.ndarray], n: int, prefix: Prefix = ()) -> Distribution:
    """Exact distribution of n tokens sampled from ``target`` one at a time (the reference)."""

    def one_token(context: Prefix, need: int) -> Round:
        for y, py in enumerate(target(context)):
            yield (y,), float(py)

    return _unroll(one_token, n, prefix)


def round_distribution(process, context: Prefix = ()) -> Distribution:
    """Distribution of the tokens one round of ``process`` emits from ``context``.

    A round may reach the same emitted tuple along several branches (e.g. different
    rejected candidates); their probabilities are summed.
    """
    out: dict[Prefix, float] = defaultdict(float)
    for emitted, pr in process.round(tuple(context)):
        out[emitted] += pr
    return dict(out)


def max_abs_difference(a: Distribution, b: Distribution) -> float:
    """max over sequences of |a(s) − b(s)| (absent sequences count as 0)."""
    keys = set(a) | set(b)
    return max((abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in keys), default=0.0)


class BlockProcess:
    """Speculative decoding with a draft chain of k tokens verified by ``rule`` each round.

    Per round: the draft samples x_1..x_k one after another; x_i is accepted with
    rule.acceptance(q_i, p_i)(x_i); at the first rejection the correction comes from
    rule.residual(q_i, p_i); if all are accepted the bonus token comes from p_{k+1}.
    """

    def __init__(self, target, draft, rule: Rule | None = None, k: int = 2):
        self.target, self.draft = target, draft
        self.rule = SD() if rule is None else rule
        self.k = int(as_count("k", k))

    def distribution(self, n: int, prefix: Prefix = ()) -> Distribution:
        return _unroll(self.round, n, prefix)

    def round(self, context: Prefix, need: int = 1 << 30) -> Round:
        yield from self._walk(context, 0, (), 1.0, need)

    def _walk(self, context: Prefix, i: int, emitted: Prefix, prob: float, need: int) -> Round:
        if len(emitted) >= need:
            yield emitted, prob
            return
        p = self.target(context)
        if i == self.k:
            yield from self.bonus(p, emitted, prob)
            return
        q = self.draft(context)
        accept = self.rule.acceptance(q, p)
        rejected = 1.0 - float((q * accept).sum())
        if rejected > 0:
            for z, rz in enumerate(self.rule.residual(q, p)):
                yield emitted + (z,), prob * rejected * rz
        for x in np.flatnonzero(q * accept > 0):
            x = int(x)
            yield from self._walk(context + (x,), i + 1, emitted + (x,), prob * q[x] * accept[x], need)

    def bonus(self, p: np.ndarray, emitted: Prefix, prob: float) -> Round:
        """All k drafts accepted: one more token from the target's row after the draft."""
        for y, py in enumerate(p):
            yield emitted + (y,), prob * py


class VerticalProcess:
    """A two-level vertical cascade ([CSD] Algorithm 1 with two drafters).

    d1 builds its proposal to the target in ``n_inner`` inner rounds; in each, d2 drafts
    ``k_inner`` tokens that d1 verifies with ``inner_rule`` (e.g. :class:`draftsim.sim.rules.Leniency`)
    — a correction from the inner residual at the first rejection, a bonus from d1 if all
    are accepted. The target then verifies the proposal with ``outer_rule`` (SD: lossless).

    For that verification each proposed token needs the distribution it was *actually*
    proposed from (:meth:`proposal_row`): the inner rule's output distribution for tokens
    produced by inner verification, d1's row for d1's bonus tokens. With it, the target's
    lossless verification restores p exactly, whatever the inner rule.
    """

    def __init__(self, target, d1, d2, inner_rule: Rule | None = None, n_inner: int = 1, k_inner: int = 1, outer_rule: Rule | None = None):
        self.target, self.d1, self.d2 = target, d1, d2
        self.inner_rule = SD() if inner_rule is None else inner_rule
        self.outer_rule = SD() if outer_rule is None else outer_rule
        self.n_inner = int(as_count("n_inner", n_inner))
        self.k_inner = int(as_count("k_inner", k_inner))

    def distribution(self, n: int, prefix: Prefix = ()) -> Distribution:
        return _unroll(self.round, n, prefix)

    def round(self, context: Prefix, need: int = 1 << 30) -> Round:
        yield from self._walk(context, 0, 0, (), 1.0, need)

    def proposal_row(self, inner_output: np.ndarray, d1_row: np.ndarray, is_bonus: bool) -> np.ndarray:
        """The distribution a proposed token was drawn from (what the target verifies against)."""
        return d1_row if is_bonus else inner_output

    def _branches(self, context: Prefix, i: int):
        """Proposal outcomes at this position: (token, probability, is_inner_accept), and the row."""
        p1 = self.d1(context)
        if i == self.k_inner:  # every inner draft accepted: d1's own bonus token
            return [(x, float(p1[x]), False) for x in np.flatnonzero(p1 > 0)], self.proposal_row(p1, p1, True)
        q2 = self.d2(context)
        accept = self.inner_rule.acceptance(q2, p1)
        rejected = 1.0 - float((q2 * accept).sum())
        residual = self.inner_rule.residual(q2, p1)
        branches = [(int(x), float(q2[x] * accept[x]), True) for x in np.flatnonzero(q2 * accept > 0)]
        if rejected > 0:
            branches += [(int(z), rejected * float(residual[z]), False) for z in np.flatnonzero(residual > 0)]
        inner_output = q2 * accept + rejected * residual
        return branches, self.proposal_row(inner_output, p1, False)

    def _walk(self, context: Prefix, r: int, i: int, emitted: Prefix, prob: float, need: int) -> Round:
        if len(emitted) >= need:
            yield emitted, prob
            return
        p = self.target(context)
        if r == self.n_inner:  # the whole proposal accepted: the target's bonus token
            for y, py in enumerate(p):
                yield emitted + (y,), prob * py
            return
        branches, q = self._branches(context, i)
        accept = self.outer_rule.acceptance(q, p)
        rejected = sum(b * (1.0 - accept[x]) for x, b, _ in branches)
        if rejected > 0:
            for z, rz in enumerate(self.outer_rule.residual(q, p)):
                yield emitted + (z,), prob * rejected * rz
        for x, b, inner_accept in branches:
            if b * accept[x] > 0:
                nr, ni = (r, i + 1) if inner_accept else (r + 1, 0)
                yield from self._walk(context + (x,), nr, ni, emitted + (x,), prob * b * accept[x], need)


class TreeProcess:
    """A token tree drafted ``widths[d]`` candidates per node at depth d, verified by
    multi-candidate speculative sampling (:func:`draftsim.sim.tree.verify_tree`).

    Candidates are drawn lazily in the order they are tried, which has the same distribution
    as drawing the whole tree first. ``replacement`` selects i.i.d. or without-replacement
    drawing and the matching residual.
    """

    def __init__(self, target, draft, widths: tuple[int, ...] = (2, 2), replacement: bool = True):
        self.target, self.draft = target, draft
        self.widths = tuple(int(as_count("widths", w, minimum=1)) for w in widths)
        self.replacement = bool(replacement)

    def distribution(self, n: int, prefix: Prefix = ()) -> Distribution:
        return _unroll(self.round, n, prefix)

    def round(self, context: Prefix, need: int = 1 << 30) -> Round:
        yield from self._node(context, 0, (), 1.0, need)

    # Overridable steps (mutation controls replace one of them).
    def proposal(self, q: np.ndarray, used: list[int]) -> np.ndarray:
        """The distribution the next candidate is drawn from."""
        return candidate_proposal(q, used, self.replacement)

    def assumed_proposal(self, q: np.ndarray, used: list[int]) -> np.ndarray:
        """The distribution the verifier divides by; correct only if it equals :meth:`proposal`."""
        return self.proposal(q, used)

    def after_rejection(self, residual: np.ndarray, proposal: np.ndarray) -> np.ndarray:
        return candidate_residual(residual, proposal)

    def _node(self, context: Prefix, depth: int, emitted: Prefix, prob: float, need: int) -> Round:
        if len(emitted) >= need:
            yield emitted, prob
            return
        p = self.target(context)
        if depth == len(self.widths):  # a leaf: the bonus token
            for y, py in enumerate(p):
                yield emitted + (y,), prob * py
            return
        yield from self._candidates(context, depth, self.draft(context), p, [], 0, emitted, prob, need)

    def _candidates(self, context, depth, q, residual, used, j, emitted, prob, need) -> Round:
        proposal = self.proposal(q, used)
        if j == self.widths[depth] or proposal.sum() <= 0:  # all candidates rejected
            for z, rz in enumerate(residual):
                yield emitted + (z,), prob * rz
            return
        assumed = self.assumed_proposal(q, used)
        accept = candidate_acceptance(residual, assumed)
        after = self.after_rejection(residual, assumed)
        for x in np.flatnonzero(proposal > 0):
            x = int(x)
            if accept[x] > 0:
                yield from self._node(context + (x,), depth + 1, emitted + (x,), prob * proposal[x] * accept[x], need)
            if accept[x] < 1:
                yield from self._candidates(
                    context, depth, q, after, used + [x], j + 1, emitted, prob * proposal[x] * (1 - accept[x]), need
                )
