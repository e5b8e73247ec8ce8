"""Token trees and their verification: greedy walk and lossless multi-candidate sampling.

A :class:`TokenTree` holds drafted nodes under a root (the current prefix). Each node has a
token and a parent (−1 for the root); children are tried in node order. Rows are indexed
by *position*: row 0 is the root, row i + 1 is node i. ``q[r]`` is the draft distribution the
children of position r were drawn from and ``p[r]`` the target's distribution there (one
target forward pass over the flattened tree with a tree-attention mask gives all of them).

Multi-candidate speculative sampling (SpecTr / SpecInfer style): at a position with target
row p and candidates x_1..x_m, keep a residual target r (initially p) and try the children
in order — accept x_j with probability min(1, r(x_j)/q_j(x_j)), where q_j is the
distribution x_j was drawn from; on rejection set r ← norm(max(0, r − q_j)). If every
candidate is rejected, sample from the last r. By induction over the candidates this
outputs exactly p **provided each x_j really was drawn from q_j given the earlier ones**:

* ``replacement=True`` — candidates drawn i.i.d. from q: q_j = q for all j;
* ``replacement=False`` — candidates drawn one after another without replacement:
  q_j = q with x_1..x_{j−1} removed and renormalised.

Using one residual with the other drawing scheme is lossy, and so is the acceptance in the
GSD paper's code (min(1, p/q) for every child against the *original* p, no residual
update); the tests demonstrate both with exact enumeration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .distributions import capped_ratio, check_rows, check_tokens, normalize, sample
from .errors import DraftsimError, as_count

__all__ = [
    "TokenTree",
    "TreeResult",
    "candidate_proposal",
    "candidate_acceptance",
    "candidate_residual",
    "draw_candidates",
    "verify_tree_greedy",
    "verify_tree_greedy_ids",
    "verify_tree",
]


# ---------------------------------------------------------------- the shared step


def candidate_proposal(q: np.ndarray, used, replacement: bool) -> np.ndarray:
    """The distribution the next candidate is drawn from, given the tokens ``used`` so far."""
    if replacement or not used:
        return q
    remaining = q.copy()
    remaining[list(used)] = 0.0
    return normalize(remaining)


def candidate_acceptance(residual: np.ndarray, proposal: np.ndarray) -> np.ndarray:
    """min(1, r/q_j) for every token (1 where q_j = 0: such a token is never a candidate)."""
    return capped_ratio(residual, proposal)


def candidate_residual(residual: np.ndarray, proposal: np.ndarray) -> np.ndarray:
    """The residual after rejecting a candidate drawn from ``proposal``: norm(max(0, r − q_j))."""
    return normalize(np.maximum(0.0, residual - proposal), fallback=residual)


# ---------------------------------------------------------------- trees


@dataclass(frozen=True)
class TokenTree:
    """Drafted tokens arranged as a tree under the root (the current prefix).

    tokens : (n,) token id of each node
    parents : (n,) parent node index (−1 = root); a parent comes before its children
    """

    tokens: np.ndarray
    parents: np.ndarray
    _children: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        tokens = as_count("tokens", self.tokens)
        parents = np.asarray(self.parents)
        if tokens.ndim != 1 or parents.shape != tokens.shape:
            raise DraftsimError(f"tokens and parents must be 1-d of equal length; got {tokens.shape} and {parents.shape}")
        parents = as_count("parents", parents + 1) - 1 if parents.size else parents.astype(np.int64)
        for i, par in enumerate(parents):
            if not -1 <= par < i:
                raise DraftsimError(f"parents[{i}] must be -1 (root) or an earlier node in [0, {i - 1}]; got {int(par)}")
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents.astype(np.int64))
        children: list[list[int]] = [[] for _ in range(len(tokens) + 1)]
        for i, par in enumerate(parents):
            children[par + 1].append(i)
        object.__setattr__(self, "_children", tuple(tuple(c) for c in children))

    @property
    def size(self) -> int:
        return len(self.tokens)

    def children(self, position: int) -> tuple[int, ...]:
        """Nodes whose parent is ``position`` (0 = root, i + 1 = node i)."""
        return self._children[position]

    def path(self, node: int) -> list[int]:
        """Token ids from the root down to ``node``."""
        out = []
        while node >= 0:
            out.append(int(self.tokens[node]))
            node = int(self.parents[node])
        return out[::-1]

    def depth(self) -> np.ndarray:
        """Depth of every node (root children have depth 1)."""
        d = np.zeros(self.size, dtype=np.int64)
        for i, par in enumerate(self.parents):
            d[i] = 1 if par < 0 else d[par] + 1
        return d

    @classmethod
    def chain(cls, tokens) -> "TokenTree":
        """A chain x_1 → x_2 → … (speculative decoding's draft as a tree)."""
        tokens = np.asarray(tokens)
        return cls(tokens, np.arange(len(tokens)) - 1)


@dataclass(frozen=True)
class TreeResult:
    """Outcome of verifying a tree: accepted nodes from the root down, and the next token."""

    path: tuple[int, ...]
    tokens: tuple[int, ...]
    token: int

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def _check_tree_rows(tree: TokenTree, name: str, rows) -> np.ndarray:
    rows = check_rows(name, rows, min_ndim=2)
    if rows.shape[0] != tree.size + 1 or rows.ndim != 2:
        raise DraftsimError(f"{name} must have shape (n_nodes + 1, V) = ({tree.size + 1}, V); got {rows.shape}")
    check_tokens("tree tokens", tree.tokens, rows.shape[-1])
    return rows


def draw_candidates(q: np.ndarray, m: int, rng: np.random.Generator, replacement: bool) -> list[int]:
    """Draw m candidates from q, i.i.d. or one after another without replacement.

    Without replacement, at most the number of tokens with q > 0 are drawn.
    """
    out: list[int] = []
    for _ in range(m):
        proposal = candidate_proposal(q, out, replacement)
        if proposal.sum() <= 0:
            break
        out.append(int(sample(proposal, rng)))
    return out


def verify_tree_greedy(tree: TokenTree, p) -> TreeResult:
    """Follow the child equal to the target's argmax from the root; emit the argmax at the first miss."""
    p = _check_tree_rows(tree, "p", p)
    return verify_tree_greedy_ids(tree, p.argmax(axis=-1))


def verify_tree_greedy_ids(tree: TokenTree, best) -> TreeResult:
    """:func:`verify_tree_greedy` from the target's argmax id at every position (n + 1,) alone."""
    best = np.asarray(best)
    if best.shape != (tree.size + 1,):
        raise DraftsimError(f"target argmax ids must have shape (n_nodes + 1,) = ({tree.size + 1},); got {best.shape}")
    position, path = 0, []
    while True:
        want = int(best[position])
        child = next((c for c in tree.children(position) if tree.tokens[c] == want), None)
        if child is None:
            return TreeResult(tuple(path), tuple(int(tree.tokens[c]) for c in path), want)
        path.append(child)
        position = child + 1


def verify_tree(tree: TokenTree, q, p, rng: np.random.Generator, *, replacement: bool = True) -> TreeResult:
    """Lossless multi-candidate sampling verification of a token tree (see the module doc).

    ``replacement`` must match how each node's children were drawn from q at that node.
    Uniforms are drawn one per candidate tried plus one for the final token.
    """
    if rng is None or not isinstance(rng, np.random.Generator):
        raise DraftsimError("verify_tree needs an explicit numpy.random.Generator")
    q = _check_tree_rows(tree, "q", q)
    p = _check_tree_rows(tree, "p", p)
    position, path = 0, []
    while True:
        residual = p[position]
        used: list[int] = []
        accepted = None
        for child in tree.children(position):
            x = int(tree.tokens[child])
            proposal = candidate_proposal(q[position], used, replacement)
            if proposal[x] <= 0:
                raise DraftsimError(
                    f"node {child} (token {x}) could not have been drawn from q at its parent "
                    f"({'i.i.d.' if replacement else 'without replacement'})"
                )
            if rng.random() < candidate_acceptance(residual, proposal)[x]:
                accepted = child
                break
            residual = candidate_residual(residual, proposal)
            used.append(x)
        if accepted is None:
            token = int(sample(residual, rng))
            return TreeResult(tuple(path), tuple(int(tree.tokens[c]) for c in path), token)
        path.append(accepted)
        position = accepted + 1
