"""Drafting policies: one definition each, driven by every executor.

A policy decides, round by round, what to draft for the target to verify. Its protocol is
executor-agnostic and vectorised over a batch of independent sequences (the Monte Carlo
engine runs thousands at once; the DES and the real executor run batches of one):

``init(n) -> state``
    per-sequence state (a dict of numpy arrays);
``begin_round(state) -> plan``
    a tuple of :class:`Block` — which drafter drafts how many steps, and (for a vertical
    cascade) with which cascade of its own. An empty plan is one autoregressive step;
``stop(state, index, obs) -> bool array or None``
    after drafting top-level token ``index`` (0-based), whether to stop drafting, given
    what the drafter observed about it (``obs``: see :meth:`draftsim.sim.acceptance.AcceptanceProcess.observe`);
``end_round(state, drafted, accepted)``
    feedback after the target's verification.

Models are numbered 0 (target), 1, 2, … (drafters by decreasing size; the last may be
Max-Gram). Tree drafting is described by :class:`Tree` (``kind == "tree"``).

References: [CSD] Cascade Speculative Drafting (Algorithm 1, K matrix, §3.2 horizontal
cascade); [SD++] SpecDec++ (threshold stopping on 1 − Π p̂); transformers'
assisted generation (the "heuristic" schedule and ``assistant_confidence_threshold``);
BiLD (confidence-based fallback); GSD / Sequoia (token trees).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .budget_tree import budget_tree, static_tree, tree_choices
from .errors import DraftsimError, as_count, as_probability
from .params import Entry, Param, Parametrised, Registry, ascii_float, ascii_int, ascii_ints, ascii_matrix

__all__ = [
    "Block",
    "Policy",
    "Autoregressive",
    "FixedK",
    "HorizontalCascade",
    "VerticalCascade",
    "Threshold",
    "Heuristic",
    "ConfidenceStop",
    "Tree",
    "parse_policy",
    "POLICY_HELP",
]

#: Largest entry of a K matrix and largest draft length a policy accepts.
MAX_STEPS = 256


@dataclass(frozen=True)
class Block:
    """``model`` runs ``steps`` forward steps (an int, or one per sequence).

    Without ``inner``, a step drafts one token. With ``inner`` (a vertical cascade), a step
    is one speculative round of ``model`` verifying the draft its own cascade ``inner``
    built, and emits the accepted tokens plus ``model``'s correction or bonus token.
    """

    model: int
    steps: object
    inner: tuple["Block", ...] = ()


def plan_bound(plan: tuple[Block, ...]) -> int:
    """Most tokens a plan can propose to its verifier."""
    total = 0
    for block in plan:
        per_step = 1 + plan_bound(block.inner) if block.inner else 1
        total += int(np.max(block.steps)) * per_step
    return total


class Policy(Parametrised):
    """Base class of drafting policies (see the module docstring for the protocol)."""

    kind = "chain"
    #: Drafters the policy uses (model indices).
    drafters: tuple[int, ...] = (1,)
    #: True when a round's outcome does not depend on earlier rounds (no state carried over).
    memoryless = True
    #: Leniency l of drafters verifying other drafters ([CSD] §3.1; 1 = lossless, the default;
    #: :class:`VerticalCascade` takes one). The target never applies it.
    leniency = 1.0

    @property
    def n_models(self) -> int:
        """Models involved, target included (costs must cover them)."""
        return 1 + (max(self.drafters) if self.drafters else 0)

    def init(self, n: int) -> dict:
        return {}

    def begin_round(self, state: dict) -> tuple[Block, ...]:
        raise NotImplementedError

    def stop(self, state: dict, index: int, obs: dict) -> np.ndarray | None:
        return None

    def end_round(self, state: dict, drafted: np.ndarray, accepted: np.ndarray) -> None:
        return None

    @property
    def max_draft(self) -> int:
        """Most tokens proposed to the target in one round."""
        return plan_bound(self.begin_round(self.init(1)))



def _steps(name: str, value, minimum: int = 0) -> int:
    return int(as_count(name, value, minimum=minimum, maximum=MAX_STEPS))


class Autoregressive(Policy):
    """No drafting: one target call per token (the baseline)."""

    drafters = ()

    def begin_round(self, state):
        return ()

    @property
    def max_draft(self) -> int:
        return 0


class FixedK(Policy):
    """Draft k tokens with drafter 1 every round (Leviathan et al.)."""

    def __init__(self, k: int):
        self.k = _steps("k", k)

    def begin_round(self, state):
        return (Block(1, self.k),)


class HorizontalCascade(Policy):
    """Drafters take turns within one draft: ``counts[0]`` tokens by ``drafters[0]``, then
    ``counts[1]`` by ``drafters[1]``, … ([CSD] §3.2; larger drafters first)."""

    def __init__(self, drafters: Sequence[int], counts: Sequence[int]):
        drafters = tuple(int(as_count("drafters", d, minimum=1)) for d in drafters)
        counts = tuple(_steps("counts", c) for c in counts)
        if not drafters or len(drafters) != len(counts):
            raise DraftsimError(f"a horizontal cascade needs one count per drafter; got drafters {drafters} and counts {counts}")
        self.drafters = drafters
        self.counts = counts

    def begin_round(self, state):
        return tuple(Block(d, k) for d, k in zip(self.drafters, self.counts) if k > 0)


class VerticalCascade(Policy):
    """Cascade Speculative Drafting with a K matrix ([CSD] Algorithm 1).

    ``K`` is an m × m strictly upper-triangular matrix over models 0 (target), 1, …, m−1
    (the last may be Max-Gram). Row i says how model i's draft is built: ``K[i][j]`` steps
    of model j, for j = i+1, …, in order (several non-zero entries in a row are a horizontal
    cascade). A step of a model whose own row is non-zero is a speculative round of that
    model over the draft its row builds (vertical cascade); a step of a model with an empty
    row drafts one token. ``leniency`` (≥ 1 in [CSD]) is applied by drafters verifying
    other drafters, never by the target; in the simulators its effect is part of the
    drafter-to-drafter acceptance rates.

    The two-drafter case ``K = [[0, n, 0], [0, 0, k], [0, 0, 0]]`` is the cascade of
    :func:`draftsim.sim.analytic.ewif_vertical`.
    """

    def __init__(self, K, leniency: float = 1.0):
        K = as_count("K", K, maximum=MAX_STEPS)
        if K.ndim != 2 or K.shape[0] != K.shape[1] or K.shape[0] < 2:
            raise DraftsimError(f"K must be a square matrix over target + drafters (at least 2 x 2); got shape {K.shape}")
        if np.any(np.tril(K) != 0):
            raise DraftsimError("K must be strictly upper triangular: model i can only be drafted for by models j > i")
        if K[0].sum() == 0:
            raise DraftsimError("K[0] (the target's row) must draft at least one step")
        leniency = float(leniency)
        if not (np.isfinite(leniency) and leniency > 0):
            raise DraftsimError(f"leniency must be finite and > 0; got {leniency!r}")
        self.K = K
        self.leniency = leniency
        self.drafters = tuple(range(1, K.shape[0]))
        self._plans = {i: self._plan(i) for i in range(K.shape[0])}

    def _plan(self, level: int) -> tuple[Block, ...]:
        return tuple(
            Block(j, int(self.K[level, j]), self._plan(j)) for j in range(level + 1, self.K.shape[0]) if self.K[level, j] > 0
        )

    def begin_round(self, state):
        return self._plans[0]

    def __repr__(self) -> str:
        return f"VerticalCascade(K={self.K.tolist()!r}, leniency={self.leniency!r})"


class Threshold(Policy):
    """SpecDec++: stop drafting once the predicted chance that some drafted token will be
    rejected, 1 − Π p̂_i, exceeds ``h`` (or at ``k_max`` tokens; at least ``k_min``)."""

    def __init__(self, h: float, k_max: int = 16, k_min: int = 0):
        self.h = float(as_probability("h", h))
        self.k_max = _steps("k_max", k_max, minimum=1)
        self.k_min = _steps("k_min", k_min)
        if self.k_min > self.k_max:
            raise DraftsimError(f"k_min ({self.k_min}) must not exceed k_max ({self.k_max})")

    def init(self, n):
        return {"prod": np.ones(n)}

    def begin_round(self, state):
        state["prod"][:] = 1.0
        return (Block(1, self.k_max),)

    def stop(self, state, index, obs):
        state["prod"] *= obs["pred"]
        return (1.0 - state["prod"] > self.h) & (index + 1 >= self.k_min)


class Heuristic(Policy):
    """transformers' "heuristic" schedule: K += 2 after a fully accepted round, else
    K −= 1, with 1 ≤ K ≤ k_max (k_max bounds the simulators' arrays)."""

    memoryless = False

    def __init__(self, k: int = 5, k_max: int = 64):
        self.k = _steps("k", k, minimum=1)
        self.k_max = _steps("k_max", k_max, minimum=1)
        if self.k > self.k_max:
            raise DraftsimError(f"k ({self.k}) must not exceed k_max ({self.k_max})")

    def init(self, n):
        return {"K": np.full(n, self.k, dtype=np.int64)}

    def begin_round(self, state):
        return (Block(1, state["K"]),)

    def end_round(self, state, drafted, accepted):
        K = state["K"]
        full = accepted >= drafted
        np.copyto(K, np.clip(np.where(full, K + 2, K - 1), 1, self.k_max))

    @property
    def max_draft(self) -> int:
        return self.k_max


class ConfidenceStop(Policy):
    """Stop drafting after a token whose draft confidence is below ``tau`` (BiLD;
    transformers' ``assistant_confidence_threshold``), or at ``k_max`` tokens."""

    def __init__(self, tau: float, k_max: int = 16):
        self.tau = float(as_probability("tau", tau))
        self.k_max = _steps("k_max", k_max, minimum=1)

    def begin_round(self, state):
        return (Block(1, self.k_max),)

    def stop(self, state, index, obs):
        return obs["conf"] < self.tau


class Tree(Policy):
    """Token-tree (and token-graph) drafting: up to ``width`` candidates per node, ``depth``
    levels, one target call verifying the whole tree with a tree-attention mask.

    The real executor (:mod:`draftsim.realrun.trees`) also honours the graph-structured drafting
    controls of GSD (§4–5): ``theta_prob`` prunes candidates whose draft probability is
    below it, ``theta_sib`` those below ``theta_sib`` × their best sibling's, ``theta_exit``
    ends drafting once every new node's probability is below it, ``merge`` = m ≥ 1 turns a
    node that ends an m-gram already present elsewhere in the graph into a leaf pointing at
    the first occurrence (a DAG; 0 = a plain tree), and ``max_nodes`` caps the drafted nodes.
    The simulators draft the ``width``/``depth`` tree and accept candidate r at a node with the
    process's per-rank acceptance (:meth:`draftsim.sim.acceptance.AcceptanceProcess.rank_prob`);
    under ``max_nodes`` smaller than the full tree they keep its ``max_nodes`` most valuable nodes,
    as EAGLE-2 reranks and SGLang's ``speculative_num_draft_tokens`` caps (less one: its count holds the root)
    (:mod:`draftsim.sim.budget_tree`), and verify those. The effect of pruning and merging
    reaches them through traces of real runs.
    """

    kind = "tree"

    def __init__(self, width: int | None = None, depth: int | None = None, theta_prob: float = 0.0, theta_sib: float = 0.0,
                 theta_exit: float = 0.0, merge: int = 0, max_nodes: int = 4096, choices=None):
        self.choices = tuple(tuple(int(r) for r in c) for c in choices) if choices is not None else None
        if self.choices is not None:  # a static tree: its shape is the paths'
            if width is not None or depth is not None or max_nodes != 4096:
                raise DraftsimError("a static tree (choices) takes its width, depth and nodes from its paths: drop width, depth and nodes")
            width, depth = max(max(c) for c in self.choices) + 1, max(len(c) for c in self.choices)
            max_nodes = len(self.choices)
        if width is None or depth is None:
            raise DraftsimError("policy tree needs width and depth (e.g. tree:width=2,depth=4) or choices (e.g. tree:choices=medusa-63)")
        self.width = _steps("width", width, minimum=1)
        self.depth = _steps("depth", depth, minimum=1)
        self.theta_prob = float(as_probability("theta_prob", theta_prob))
        self.theta_sib = float(as_probability("theta_sib", theta_sib))
        self.theta_exit = float(as_probability("theta_exit", theta_exit))
        self.merge = int(as_count("merge", merge, maximum=64))
        self.max_nodes = int(as_count("max_nodes", max_nodes, minimum=1, maximum=4096))
        if self.choices is None and self.nodes > 4096 and max_nodes == 4096:
            raise DraftsimError(f"a tree of width {self.width} and depth {self.depth} has {self.nodes} nodes; the limit is 4096 (or set max_nodes)")

    def kept_tree(self, rank_prob):
        """The tree the simulators verify when it is not the full ``width``/``depth`` tree: the
        static tree of ``choices``, or the ``max_nodes`` most valuable nodes
        (:mod:`draftsim.sim.budget_tree`); None for the full tree. ``rank_prob(r)``: the
        process's per-rank acceptance."""
        if self.choices is not None:
            return static_tree(rank_prob, self.choices)
        if self.max_nodes < self.nodes:
            return budget_tree(rank_prob, self.width, self.depth, self.max_nodes)
        return None

    @property
    def nodes(self) -> int:
        """Drafted tokens in a full tree (a static tree: its paths)."""
        if self.choices is not None:
            return len(self.choices)
        return sum(self.width**d for d in range(1, self.depth + 1))

    def begin_round(self, state):
        return (Block(1, self.depth),)

    @property
    def max_draft(self) -> int:
        return self.depth


# ---------------------------------------------------------------- the policy mini-language

def _horizontal(counts: list[int]) -> HorizontalCascade:
    return HorizontalCascade(tuple(range(1, len(counts) + 1)), counts)


def _vertical(n: int | None = None, k: int | None = None, K=None, leniency: float = 1.0) -> VerticalCascade:
    if K is not None:
        if n is not None or k is not None:
            raise DraftsimError("policy vertical takes either K or n and k, not both")
        return VerticalCascade(K, leniency)
    if n is None or k is None:
        raise DraftsimError("policy vertical needs n and k (e.g. vertical:n=4,k=10) or K")
    return VerticalCascade([[0, n, 0], [0, 0, k], [0, 0, 0]], leniency)


def _tree(**params) -> Tree:
    return Tree(**params)


_int, _float = ascii_int, ascii_float

#: The policy mini-language: one entry per policy (adding a policy is a class plus an entry).
POLICIES = Registry("policy", plural="policies", base=Policy, entries=[
    Entry("ar", Autoregressive, (), (("ar", "autoregressive (no drafting)"),), aliases=("autoregressive",)),
    Entry("fixed", FixedK, (Param("k", _int, required=True),), (("fixed:k=5", "draft k tokens with drafter 1"),)),
    Entry("heuristic", Heuristic, (Param("k", _int), Param("kmax", _int, "k_max")),
          (("heuristic[:k=5,kmax=64]", "transformers' schedule: K+2 after a full accept, else K-1"),)),
    Entry("threshold", Threshold, (Param("h", _float, required=True), Param("kmax", _int, "k_max"), Param("kmin", _int, "k_min")),
          (("threshold:h=0.7[,kmax=16,kmin=0]", "SpecDec++: stop when 1 - prod(p_hat) > h"),)),
    Entry("confidence", ConfidenceStop, (Param("tau", _float, required=True), Param("kmax", _int, "k_max")),
          (("confidence:tau=0.4[,kmax=16]", "stop after a token with draft confidence < tau\n"
            "(Max-Gram's confidence grows with its match length)"),)),
    Entry("horizontal", _horizontal, (Param("counts", ascii_ints, required=True),),
          (("horizontal:counts=3,5", "drafter 1 drafts 3 tokens, then drafter 2 drafts 5"),)),
    Entry("vertical", _vertical, (Param("n", _int), Param("k", _int), Param("K", ascii_matrix), Param("leniency", _float)),
          (("vertical:n=4,k=10", "d1 builds its draft in n inner rounds of k tokens from d2"),
           ("vertical:K=0,4,0;0,0,10;0,0,0", "a full K matrix (rows separated by ';')"),
           ("vertical:...,leniency=2", "inner verifications accept leniently ([CSD] 3.1)"))),
    Entry("tree", _tree, (Param("width", _int), Param("depth", _int), Param("prob", _float, "theta_prob"),
                          Param("sib", _float, "theta_sib"), Param("exit", _float, "theta_exit"), Param("merge", _int),
                          Param("nodes", _int, "max_nodes"), Param("choices", tree_choices)),
          (("tree:width=2,depth=4", "token tree, candidates accepted by per-rank rates"),
           ("tree:width=4,depth=5,nodes=7", "EAGLE-2 dynamic tree: top-4 per node, 5 steps, the 7 most\n"
            "likely nodes verified (SGLang's eagle_topk, num_steps, num_draft_tokens 8: the root and 7)"),
           ("tree:choices=medusa-63", "a static tree: Medusa's 63-node default (medusa_choices; eagle-25:\n"
            "EAGLE-1's), or a JSON file of rank paths [[0], [0, 0], [1], ...]"),
           ("tree:width=3,depth=5,prob=0.05,sib=0.1,exit=0.02,merge=2,nodes=48",
            "GSD graph drafting on real models: pruning, early exit,\nmerging of repeated m-grams (merge=0: a tree)"))),
])

POLICY_HELP = POLICIES.help


def parse_policy(spec: str) -> Policy:
    """Build a policy from the mini-language (:data:`POLICY_HELP`), e.g. ``fixed:k=5``."""
    return POLICIES.parse(spec)
