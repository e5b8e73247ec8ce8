"""A token tree under a draft-token budget, as EAGLE-2 and SGLang build it, in the per-rank model.

The simulators accept candidate r at a tree node with the process's per-rank rate α_r given that
ranks 1..r−1 were rejected (:meth:`draftsim.sim.acceptance.AcceptanceProcess.rank_prob`). The
target's token at a node is then rank r with probability π_r = α_r Π_{r'<r}(1 − α_{r'}), and no
candidate with 1 − Σπ_r. A node reached by ranks (r_1, …, r_d) is on the accepted path with
probability Π π_{r_i}.

EAGLE-2 (Li et al. 2024, arXiv 2406.16858 §4) expands ``topk`` candidates per node for ``depth``
steps and then *reranks*: it keeps the ``budget`` nodes of highest value (the product of draft
confidences along the path) for verification — SGLang's ``speculative_num_draft_tokens``. Here a
node's value is its probability of being on the accepted path, which never exceeds its parent's,
so the kept nodes form a subtree; ties keep the shallower, then the lower ranks. The expected
number of accepted draft tokens is the sum of the kept nodes' values (nodes of one level are
accepted exclusively).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from .errors import DraftsimError

__all__ = ["BudgetTree", "budget_tree"]


@dataclass(frozen=True)
class BudgetTree:
    """The kept nodes: ``child[n, r]`` is the node reached from node n (0 = the root) by rank
    r + 1, −1 where not kept; ``per_level[d]`` the kept nodes at depth d (d = 0: the root);
    ``value[n]`` node n's probability of being on the accepted path (nodes in the order kept,
    not by level: ``level[n]`` is node n's depth)."""

    child: np.ndarray
    per_level: np.ndarray
    value: np.ndarray
    rank_probs: np.ndarray  #: π_r, r = 1..width: the target's token is rank r
    level: np.ndarray  #: depth of each node (0: the root)

    @property
    def nodes(self) -> int:
        """Draft tokens verified (the root excluded)."""
        return int(self.per_level[1:].sum())

    @property
    def depth(self) -> int:
        return len(self.per_level) - 1

    def expected_accepted(self) -> float:
        """Mean accepted draft tokens per round: the sum of the kept nodes' values."""
        return float(self.value[1:].sum())

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Accepted draft tokens in ``n`` independent rounds: at each level the target's token
        is rank r with π_r (or none); the walk goes on while that child was kept."""
        at = np.zeros(n, dtype=np.int64)
        accepted = np.zeros(n, dtype=np.int64)
        alive = np.ones(n, dtype=bool)
        cdf = np.cumsum(self.rank_probs)
        for _ in range(self.depth):
            if not alive.any():
                break
            u = rng.random(n)
            rank = np.searchsorted(cdf, u, side="right")  # == width: no candidate is the target's token
            nxt = np.where(rank < self.child.shape[1], self.child[at, np.minimum(rank, self.child.shape[1] - 1)], -1)
            alive &= nxt >= 0
            at = np.where(alive, nxt, at)
            accepted += alive
        return accepted


def budget_tree(rank_alphas, width: int, depth: int, budget: int) -> BudgetTree:
    """The ``budget`` most valuable nodes of the ``width``-ary tree of ``depth`` levels."""
    alphas = np.asarray([rank_alphas(r) if callable(rank_alphas) else rank_alphas[r - 1] for r in range(1, width + 1)], dtype=float)
    if alphas.size != width or np.any(~np.isfinite(alphas)) or np.any((alphas < 0) | (alphas > 1)):
        raise DraftsimError(f"rank acceptances must be {width} probabilities; got {alphas.tolist()}")
    if budget < 1:
        raise DraftsimError(f"a tree's draft-token budget must be >= 1; got {budget}")
    pi = alphas * np.concatenate([[1.0], np.cumprod(1.0 - alphas)[:-1]])
    child = [[-1] * width]
    value = [1.0]
    level = [0]
    heap = [(-pi[r], 1, r, 0) for r in range(width)]  # (−value, depth, rank, parent)
    heapq.heapify(heap)
    while heap and len(value) - 1 < budget:
        neg, d, r, parent = heapq.heappop(heap)
        node = len(value)
        value.append(-neg)
        level.append(d)
        child.append([-1] * width)
        child[parent][r] = node
        if d < depth:
            for r2 in range(width):
                heapq.heappush(heap, (neg * pi[r2], d + 1, r2, node))
    per_level = np.bincount(np.asarray(level), minlength=1)
    return BudgetTree(np.asarray(child, dtype=np.int64), per_level.astype(np.int64), np.asarray(value), pi, np.asarray(level, dtype=np.int64))
