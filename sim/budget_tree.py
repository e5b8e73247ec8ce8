"""A token tree under a draft-token budget, as EAGLE-2 and SGLang build it, in the per-rank model.

The simulators accept candidate r at a tree node with the process's per-rank rate α_r given that
ranks 1..r−1 were rejected (:meth:`draftsim.sim.acceptance.AcceptanceProcess.rank_prob`). The
target's token at a node is then rank r with probability π_r = α_r Π_{r'<r}(1 − α_{r'}), and no
candidate with 1 − Σπ_r. A node reached by ranks (r_1, …, r_d) is on the accepted path with
probability Π π_{r_i}.

A **static tree** (Medusa's ``medusa_choices``, Cai et al. 2024, arXiv 2401.10774 §2.1.2; EAGLE-1's
``tree_choices``) is a fixed set of such rank paths, every prefix of a path also in the set: the
same record with the given nodes (:func:`static_tree`), verified whatever their values.

EAGLE-2 (Li et al. 2024, arXiv 2406.16858 §4) expands ``topk`` candidates per node for ``depth``
steps and then *reranks*: it keeps the ``budget`` nodes of highest value (the product of draft
confidences along the path) for verification — SGLang's ``speculative_num_draft_tokens`` − 1 (its count
holds the root: ``organize_draft_results`` keeps ``topk(score_list, num_draft_token - 1)``). Here a
node's value is its probability of being on the accepted path, which never exceeds its parent's,
so the kept nodes form a subtree; ties keep the shallower, then the lower ranks. The expected
number of accepted draft tokens is the sum of the kept nodes' values (nodes of one level are
accepted exclusively).
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DraftsimError

__all__ = ["BudgetTree", "budget_tree", "static_tree", "tree_choices", "TREE_CHOICES"]

#: Named static trees (sim/data/tree_choices.json, each with its source).
TREE_CHOICES = Path(__file__).with_name("data") / "tree_choices.json"
#: Most nodes a static tree may have (as :class:`draftsim.sim.policies.Tree` caps a tree).
MAX_STATIC_NODES = 4096


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


def static_tree(rank_alphas, choices) -> BudgetTree:
    """The static tree of ``choices`` (rank paths, 0-based as Medusa writes them: [0] is the top
    candidate of the first head, [0, 1] the second candidate after it), in the per-rank model."""
    paths = [tuple(int(r) for r in c) for c in choices]
    width = max(max(p) for p in paths) + 1
    alphas = np.asarray([rank_alphas(r) if callable(rank_alphas) else rank_alphas[r - 1] for r in range(1, width + 1)], dtype=float)
    if np.any(~np.isfinite(alphas)) or np.any((alphas < 0) | (alphas > 1)):
        raise DraftsimError(f"rank acceptances must be {width} probabilities; got {alphas.tolist()}")
    pi = alphas * np.concatenate([[1.0], np.cumprod(1.0 - alphas)[:-1]])
    index = {(): 0}
    child, value, level = [[-1] * width], [1.0], [0]
    for p in sorted(paths, key=lambda q: (len(q), q)):  # parents before children
        node = len(value)
        index[p] = node
        parent = index[p[:-1]]
        child.append([-1] * width)
        child[parent][p[-1]] = node
        value.append(value[parent] * pi[p[-1]])
        level.append(len(p))
    per_level = np.bincount(np.asarray(level), minlength=1)
    return BudgetTree(np.asarray(child, dtype=np.int64), per_level.astype(np.int64), np.asarray(value), pi, np.asarray(level, dtype=np.int64))


def tree_choices(text: str) -> tuple[tuple[int, ...], ...]:
    """Static-tree choices by name (``sim/data/tree_choices.json``: medusa-63, eagle-25) or from
    a JSON file holding a list of rank paths; checked: non-empty paths of ranks >= 0, each once,
    every prefix present, at most :data:`MAX_STATIC_NODES`."""
    from .files import parse_json, read_text

    named = json.loads(TREE_CHOICES.read_text())["trees"]
    if text in named:
        raw, where = named[text]["choices"], f"tree choices {text!r}"
    else:
        if not Path(text).is_file():
            raise DraftsimError(f"tree choices {text!r}: neither a named tree ({', '.join(named)}) nor a JSON file of rank paths")
        where = f"tree choices file {text}"
        raw = parse_json(read_text(text, "tree choices file", 1 << 20, fifo=False), where)
    if not isinstance(raw, list) or not raw or len(raw) > MAX_STATIC_NODES:
        raise DraftsimError(f"{where} must be a list of 1 to {MAX_STATIC_NODES} rank paths such as [[0], [0, 0], [1]]")
    paths = []
    for c in raw:
        if not (isinstance(c, list) and c and all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < 64 for r in c)):
            raise DraftsimError(f"{where}: each path is a non-empty list of ranks in [0, 63]; got {json.dumps(c)[:60]}")
        paths.append(tuple(c))
    seen = set(paths)
    if len(seen) != len(paths):
        raise DraftsimError(f"{where}: a path is listed twice ({next(list(p) for p in paths if paths.count(p) > 1)})")
    orphan = next((p for p in paths if len(p) > 1 and p[:-1] not in seen), None)
    if orphan is not None:
        raise DraftsimError(f"{where}: path {list(orphan)} has no parent {list(orphan[:-1])} in the tree")
    return tuple(paths)
