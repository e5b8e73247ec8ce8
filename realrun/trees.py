"""Token trees and token graphs on real models (GSD §4–5, Appendix A; SSD / TSD / GSD).

A round drafts a graph level by level with a neural drafter, then the target verifies it in
one forward call:

* **drafting** — every node of a level is drafted in *one* forward pass of the drafter with a
  tree-attention mask (a node sees the context and its own ancestors; its position id is
  context length − 1 + depth); the drafter's KV cache keeps the context and the graph's
  earlier levels, so each level feeds only its new nodes. Candidates per node: the top
  ``width`` tokens of q (greedy) or ``width`` draws without replacement from q (sampling);
  ``theta_sib`` / ``theta_prob`` prune candidates (greedy: dropped; sampling: kept as leaves,
  so that every drawn candidate is still tried — pruning a drawn candidate would bias the
  verification); ``theta_exit`` ends drafting once every new node's probability is below it;
* **merging** (``merge`` = m ≥ 1, GSD) — a new node whose last m tokens (context included)
  already end another node of the graph that is not its ancestor becomes a leaf pointing at
  that first occurrence, whose successors it reuses: the tree becomes a DAG and the drafter
  never expands the merged node;
* **verification** — the DAG is unmerged into a tree (each merged node gets a copy of its
  target's subtree, cut at ``depth``), flattened, and scored by one target forward with the
  tree mask. Greedy: the walk of :func:`draftsim.sim.tree.verify_tree_greedy_ids`; sampling: lossless
  multi-candidate verification (:func:`draftsim.sim.tree.verify_tree`, without replacement), where a
  copied node's candidates carry the row q they were drawn from at the original.

With width 1 this is speculative decoding with a chain (SSD); with ``merge = 0`` a token
tree (TSD); with ``merge ≥ 1`` a token graph (GSD). Rounds run in the chain executors' round
loop (:func:`draftsim.realrun.executor.decode`) and are logged with the same records
(:class:`draftsim.realrun.executor.RunLog`), plus the graph's own counters (:class:`TreeStats`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..sim.errors import DraftsimError
from ..sim.policies import Tree
from ..sim.records import Call, DraftEvent
from ..sim.tree import TokenTree, draw_candidates, verify_tree, verify_tree_greedy_ids
from .drafters import NeuralDraft
from .executor import RoundResult, RunLog, Sampling, check_context, check_drafters, check_sampling, decode, eos_id, prefill
from .kvcache import CachedLM
from .models import LoadedModel, sync

__all__ = ["TreeForward", "Graph", "draft_graph", "verify_graph", "generate_tree", "TreeStats"]


class TreeForward:
    """Feeds a context and then tree nodes into a :class:`CachedLM` with tree attention
    (:meth:`draftsim.realrun.kvcache.BatchKV.attend`).

    ``start(context, nodes)`` rolls the cache back to its longest prefix shared with the
    context, feeds the rest of the context plus the given nodes in one call and returns the
    logits at the context's last token (row 0) and at every node; ``add(nodes)`` feeds more
    nodes. A node is (id, token, parent id or −1 for the context's last token, depth); parents
    come before their children, and only fed nodes may be parents. A node attends to the
    context and its ancestors, at position id len(context) − 1 + depth. Node slots are held
    as not being context (id −1), so the model's next ordinary call rolls them back.
    ``seconds`` is the wall time of the last forward call (the model alone).
    """

    def __init__(self, lm: CachedLM):
        self.lm = lm
        self.slot: dict = {}  # node id -> cache index
        self.parent: dict = {}
        self.seconds = 0.0

    def start(self, context: list[int], nodes=()):
        keep = self.lm.rollback(context, len(context) - 1)
        self.base = len(context)
        self.slot, self.parent = {}, {}
        return self._forward(context[keep:], list(nodes))  # rows: the context's last token, then the nodes

    def add(self, nodes):
        return self._forward([], list(nodes))

    def _forward(self, linear, nodes):
        """Logits at the last linear token (if any) and at every node."""
        import torch

        lm = self.lm
        past = lm.kv.length
        L, N = len(linear), len(nodes)
        kv_len = past + L + N
        allowed = torch.zeros((L + N, kv_len), dtype=torch.bool)
        allowed[:L] = torch.arange(kv_len)[None, :] <= torch.arange(past, past + L)[:, None]  # causal over the context
        positions = list(range(past, past + L))
        for j, (node, _tok, parent, depth) in enumerate(nodes):
            self.slot[node] = past + L + j
            self.parent[node] = parent
            row = allowed[L + j]
            row[: self.base] = True
            a = node
            while a >= 0:
                row[self.slot[a]] = True
                a = self.parent[a]
            positions.append(self.base - 1 + depth)
        dev = lm.loaded.device
        sync(dev)
        t0 = time.perf_counter()
        logits = lm.kv.attend(list(linear) + [n[1] for n in nodes], positions, allowed, N + 1 if L else N)
        sync(dev)
        self.seconds = time.perf_counter() - t0
        lm.fed = L + N
        if N:
            lm.ids[-N:] = [-1] * N  # node slots are not context: the next ordinary call rolls them back
        return logits


@dataclass
class Graph:
    """A drafted token graph. Node i: ``tokens[i]``, ``parents[i]`` (−1 = root), ``probs[i]``
    (the drafter's probability of the token), ``merged[i]`` (the node it points to, or −1).
    ``rows[r]`` is the draft row at position r (0 = root, i + 1 = node i) when sampling."""

    tokens: list = field(default_factory=list)
    parents: list = field(default_factory=list)
    probs: list = field(default_factory=list)
    merged: list = field(default_factory=list)
    rows: dict = field(default_factory=dict)
    expanded: int = 0  # nodes the drafter fed (its forward tokens beyond the context)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, prob: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.probs.append(float(prob))
        self.merged.append(-1)
        return len(self.tokens) - 1

    def ancestors(self, node: int) -> set:
        out = set()
        while node >= 0:
            out.add(node)
            node = self.parents[node]
        return out

    def path(self, node: int) -> list[int]:
        out = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def unmerge(self, depth: int) -> tuple[TokenTree, list[int], list[bool]]:
        """The tree to verify: every merged node gets a copy of its target's subtree (cut at
        ``depth``). Returns the tree, each tree node's origin in the graph (for its q row)
        and whether it is (inside) a copy."""
        tokens, parents, origin, copied = [], [], [], []

        def emit(node: int, parent: int, level: int, is_copy: bool):
            tokens.append(self.tokens[node])
            parents.append(parent)
            origin.append(node)
            copied.append(is_copy)
            me = len(tokens) - 1
            if level >= depth:
                return
            source, via = (self.merged[node], True) if self.merged[node] >= 0 else (node, is_copy)
            for child in self.children(source):
                emit(child, me, level + 1, via)

        for root_child in self.children(-1):
            emit(root_child, -1, 1, False)
        return TokenTree(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64)), origin, copied


def _candidates(logits, width: int, sampling: Sampling, rng):
    """A node's candidate tokens with their draft probabilities, and the row (sampling)."""
    import torch

    if sampling.greedy:
        probs = torch.softmax(logits.double(), -1)
        top = torch.topk(probs, width)
        return [int(t) for t in top.indices], [float(v) for v in top.values], None
    q = sampling.rows(logits[None, :])[0]
    toks = draw_candidates(q, width, rng, replacement=False)
    return toks, [float(q[t]) for t in toks], q


def draft_graph(draft: CachedLM, context: list[int], policy: Tree, sampling: Sampling, rng, log: RunLog, round_: int) -> Graph:
    """Draft a token graph level by level (see the module docstring)."""
    g = Graph()
    tf = TreeForward(draft)
    frontier_logits = tf.start(context)[-1:]  # the root's row
    log.calls.append(Call(round_, 1, "draft", draft.fed, tf.seconds))
    frontier = [-1]
    first_seen: dict = {}  # m-gram ending at a node -> the first node that ends it
    m = policy.merge
    for level in range(1, policy.depth + 1):
        new, expand = [], []
        for f, logits in zip(frontier, frontier_logits):
            toks, probs, row = _candidates(logits, policy.width, sampling, rng)
            if row is not None:
                g.rows[f + 1] = row
            best = max(probs) if probs else 0.0
            for tok, pr in zip(toks, probs):
                if len(g) >= policy.max_nodes:
                    break
                pruned = pr < policy.theta_prob or pr < policy.theta_sib * best
                if pruned and sampling.greedy:
                    continue
                node = g.add(tok, f, pr)
                new.append(node)
                if m and level < policy.depth:  # a merged leaf at the last level would reuse nothing
                    key = tuple((context + g.path(node))[-m:])
                    other = first_seen.get(key)
                    if other is not None and other not in g.ancestors(node):
                        g.merged[node] = other
                        continue
                    first_seen.setdefault(key, node)
                if not pruned:
                    expand.append(node)
        if not new or level == policy.depth or len(g) >= policy.max_nodes:
            break
        if all(g.probs[n] < policy.theta_exit for n in new):
            break  # early exit: the drafter is unsure everywhere
        if not expand:
            break
        frontier_logits = list(tf.add([(n, g.tokens[n], g.parents[n], level) for n in expand]))
        log.calls.append(Call(round_, 1, "draft", draft.fed, tf.seconds))
        g.expanded += len(expand)
        frontier = expand
    return g


@dataclass
class TreeStats:
    """GSD's metrics over a run: nodes drafted (fed to the drafter), nodes verified, rounds
    whose accepted path used merged nodes."""

    rounds: int = 0
    drafted_nodes: int = 0
    expanded_nodes: int = 0
    verified_nodes: int = 0
    merged_nodes: int = 0
    rounds_using_merged: int = 0
    accepted: int = 0
    # Per candidate rank r (0-based): positions on the walk where rank r was tried (every
    # earlier rank rejected) and where it was the accepted one — the per-rank acceptance
    # the tree optimiser (sim.optimize.tree_shape) takes.
    rank_tried: list = field(default_factory=list)
    rank_accepted: list = field(default_factory=list)

    def observe_round(self, g: Graph, tree: TokenTree, copied: list[bool], path: list[int]) -> None:
        """Count one round: graph ``g`` drafted, ``tree`` (its unmerging) verified, ``path`` accepted."""
        self.rounds += 1
        self.drafted_nodes += len(g)
        self.expanded_nodes += g.expanded
        self.verified_nodes += tree.size
        self.merged_nodes += sum(1 for x in g.merged if x >= 0)
        self.rounds_using_merged += int(any(copied[c] for c in path))
        self.accepted += len(path)
        self.observe_walk(tree, path)

    def observe_walk(self, tree: TokenTree, path: list[int]) -> None:
        position = 0
        for step in range(len(path) + 1):
            children = list(tree.children(position))
            chosen = children.index(path[step]) if step < len(path) else None
            tried = len(children) if chosen is None else chosen + 1
            while len(self.rank_tried) < len(children):
                self.rank_tried.append(0)
                self.rank_accepted.append(0)
            for r in range(tried):
                self.rank_tried[r] += 1
            if chosen is not None:
                self.rank_accepted[chosen] += 1
                position = path[step] + 1

    @property
    def rank_alphas(self) -> list[float]:
        return [a / t if t else 0.0 for a, t in zip(self.rank_accepted, self.rank_tried)]

    def to_dict(self) -> dict:
        d = dict(vars(self))
        d["rank_alphas"] = self.rank_alphas
        d["acceptance_rate"] = self.accepted / max(self.verified_nodes, 1)
        d["accepted_per_round"] = self.accepted / max(self.rounds, 1)
        d["merged_path_share"] = self.rounds_using_merged / max(self.rounds, 1)
        return d


def verify_graph(target: CachedLM, context: list[int], g: Graph, tree: TokenTree, origin: list[int], sampling: Sampling, rng,
                 log: RunLog, round_: int) -> tuple[list[int], int]:
    """The target verifies ``tree`` (``g`` unmerged; ``origin`` maps its nodes to ``g``'s) in
    one forward call with tree attention: the accepted path (tree node indices) and the
    target's next token. Greedy: the walk of argmax ids; sampling: lossless multi-candidate
    verification, a copied node's candidates carrying the row q they were drawn from."""
    tf = TreeForward(target)
    depths = tree.depth()
    logits = tf.start(context, [(i, int(t), int(par), int(depths[i])) for i, (t, par) in enumerate(zip(tree.tokens, tree.parents))])
    log.calls.append(Call(round_, 0, "verify", target.fed, tf.seconds))
    if sampling.greedy:
        res = verify_tree_greedy_ids(tree, logits.argmax(dim=-1).cpu().numpy())
    else:
        p = sampling.rows(logits)
        q = np.empty_like(p)
        for r in range(tree.size + 1):
            src = 0 if r == 0 else origin[r - 1] + 1  # a copied node's children came from its original
            if r > 0 and g.merged[origin[r - 1]] >= 0:
                src = g.merged[origin[r - 1]] + 1
            q[r] = g.rows.get(src, p[r])  # leaves: any valid row (never used)
        res = verify_tree(tree, q, p, rng, replacement=False)
    return [int(c) for c in res.path], int(res.token)


def generate_tree(
    target: LoadedModel,
    prompt: list[int],
    max_new_tokens: int,
    policy: Tree,
    drafter: NeuralDraft,
    sampling: Sampling = Sampling(),
    rng: np.random.Generator | None = None,
    stop_at_eos: bool = True,
    stats: TreeStats | None = None,
    prefill_apart: bool = True,
) -> RunLog:
    """Decode with token trees / graphs (see the module docstring). Greedy output is the
    target's own greedy output; sampling keeps the target's distribution. ``prefill_apart``:
    the target reads the prompt in a call of its own first (as :func:`draftsim.realrun.executor.generate`
    does), so the first tree verification is sized like every other."""
    if not isinstance(policy, Tree):
        raise DraftsimError(f"{policy!r} is not a tree policy; use realrun.executor.generate")
    if not drafter.neural:
        raise DraftsimError("tree drafting needs a neural drafter (it drafts a level per forward call)")
    check_sampling(sampling, rng)
    check_drafters(target, [drafter])
    check_context(target, prompt, max_new_tokens + policy.depth)
    stats = stats if stats is not None else TreeStats()
    started = time.perf_counter()
    log = RunLog()
    tgt, dlm = CachedLM(target), CachedLM(drafter.loaded)
    if prefill_apart:
        prefill(tgt, prompt, log)

    def step(context: list[int], budget: int) -> RoundResult:
        round_ = len(log.rounds)
        t0 = time.perf_counter()
        g = draft_graph(dlm, context, policy, sampling, rng, log, round_)
        t1 = time.perf_counter()
        tree, origin, copied = g.unmerge(policy.depth)
        path, token = verify_graph(tgt, context, g, tree, origin, sampling, rng, log, round_)
        t2 = time.perf_counter()
        start, depth = len(context) - len(prompt), tree.depth()
        on_path = set(path)
        for i in range(tree.size):
            conf = g.probs[origin[i]]
            log.drafts.append(DraftEvent(round_, 0, 1, 1, start + int(depth[i]) - 1, int(depth[i]) - 1, int(tree.tokens[i]), conf, conf,
                                         i in on_path))
        stats.observe_round(g, tree, copied, path)
        return RoundResult([int(tree.tokens[c]) for c in path] + [token], tree.size, len(path), t1 - t0, t2 - t1)

    try:
        return decode(log, prompt, max_new_tokens, eos_id(target, stop_at_eos), step, started, in_text=False)
    finally:
        tgt.release()
        dlm.release()
