"""Vectorised Monte Carlo engine: many independent sequences, one numpy step per round.

Every iteration runs one round of the policy for all live sequences at once. Within a round
the engine loops over draft *positions* (at most the policy's draft bound), each step a
handful of numpy operations over all sequences — never a Python loop per token. For the
common case (a flat draft of k tokens under position-independent acceptance: FixedK,
Heuristic) the round's accepted length is sampled directly as min(Geometric, k).

The result holds per-sequence counts (tokens, rounds, forward calls and the tokens they
processed per model, drafted and accepted tokens per model), acceptance by draft position,
and optionally every round (for the discrete-event executor, which replays them on a
timeline). :func:`rounds` gives every round alone, flat (for the serving simulator's round
book).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .acceptance import AcceptanceProcess, Bernoulli, Track
from .errors import DraftsimError
from .policies import Block, Policy, plan_bound

__all__ = ["Counts", "RoundLog", "Rounds", "run", "rounds"]


@dataclass
class Counts:
    """Per-sequence accumulators (arrays over sequences; the model axis is last)."""

    tokens: np.ndarray
    rounds: np.ndarray
    calls: np.ndarray  # (S, M) forward calls per model
    call_tokens: np.ndarray  # (S, M) tokens processed by those calls
    drafted: np.ndarray  # (S, M) tokens proposed by model m to its verifier
    accepted: np.ndarray  # (S, M) of those, accepted
    top_drafted: np.ndarray  # tokens proposed to the target
    top_accepted: np.ndarray  # of those, accepted by the target
    pos_drafted: np.ndarray  # (P,) rounds in which draft position i (0-based) was proposed to the target
    pos_accepted: np.ndarray  # (P,) ... and accepted

    @classmethod
    def zeros(cls, S: int, M: int, P: int) -> "Counts":
        z = lambda *shape: np.zeros(shape, dtype=np.int64)  # noqa: E731
        return cls(z(S), z(S), z(S, M), z(S, M), z(S, M), z(S, M), z(S), z(S), z(P), z(P))


@dataclass
class RoundLog:
    """Every round of every sequence, in round order (for replay on a timeline).

    ``live[r]`` marks the sequences that ran round r; ``calls[r]``/``call_tokens[r]`` are
    the per-model counts of that round, ``emitted[r]`` its tokens.
    """

    live: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    call_tokens: list = field(default_factory=list)
    emitted: list = field(default_factory=list)


@dataclass
class Rounds:
    """Every round of every sequence, flat, sequence by sequence (each one's rounds in order):
    sequence s ran rounds ``bounds[s]:bounds[s + 1]``. Per round: ``emitted`` tokens, and per
    model (model 0 the target) ``calls`` forward calls and ``call_tokens`` tokens they processed."""

    bounds: np.ndarray  # (S + 1,)
    emitted: np.ndarray  # (N,)
    calls: np.ndarray  # (N, M)
    call_tokens: np.ndarray  # (N, M)

    def take(self, seqs: np.ndarray) -> "Rounds":
        """The rounds of sequences ``seqs``, in that order."""
        n = np.diff(self.bounds)[seqs]
        bounds = np.concatenate([[0], np.cumsum(n)])
        idx = np.arange(bounds[-1]) + np.repeat(self.bounds[seqs] - bounds[:-1], n)
        return Rounds(bounds, self.emitted[idx], self.calls[idx], self.call_tokens[idx])


class _Rollout:
    """S sequences rolled out round by round under one policy and acceptance process (the Monte
    Carlo executor's core; "engine" is reserved for the serving engine, e.g. vLLM)."""

    def __init__(self, policy: Policy, process: AcceptanceProcess, track: Track, S: int, rng: np.random.Generator):
        self.policy, self.process, self.track, self.rng = policy, process, track, rng
        self.S = S
        self.M = policy.n_models
        self.seq = np.arange(S)
        P = max(policy.max_draft, 1)
        self.counts = Counts.zeros(S, self.M, P)
        self.state = policy.init(S)
        self.has_stop = type(policy).stop is not Policy.stop
        self.finite = process.finite

    # ------------------------------------------------------------ one round

    def round(self, live: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Run one round for the ``live`` sequences at text positions ``pos``; return tokens emitted."""
        c = self.counts
        # Rounds whose drafter proposes nothing (a lookup without a match) draft nothing: the
        # target's step verifies no draft token and emits one. Drawn only when it can happen,
        # so processes that always propose keep their random stream.
        drafting = live & (self.rng.random(self.S) < self.process.match) if self.process.match < 1.0 else live
        if self.policy.kind == "tree":
            drafted, n_acc = self._tree_round(drafting)
        else:
            plan = self.policy.begin_round(self.state)
            if not plan:  # autoregressive step
                drafted = np.zeros(self.S, dtype=np.int64)
                n_acc = drafted
            elif self._fast(plan):
                drafted, n_acc = self._fast_round(plan[0], drafting)
            else:
                # A recorded text ends: no top-level draft runs past it (as in the real executor).
                cap = np.maximum(self.track.lengths - pos, 0) if self.finite else None
                prob, proposer, drafted = self._draft(0, plan, pos, drafting, top=True, cap=cap)
                n_acc = self._verify(prob, drafted, proposer, drafting)
            self.policy.end_round(self.state, drafted, n_acc)
        live_i = live.astype(np.int64)
        c.calls[:, 0] += live_i
        c.call_tokens[:, 0] += live_i * (drafted + 1)
        c.top_drafted += drafted * live_i
        c.top_accepted += n_acc * live_i
        emitted = (n_acc + 1) * live_i
        if self.finite:
            emitted = np.minimum(emitted, np.maximum(self.track.lengths - pos, 0))
        self._position_stats(drafted[live], n_acc[live])
        c.tokens += emitted
        c.rounds += live_i
        return emitted

    def _fast(self, plan: tuple[Block, ...]) -> bool:
        return (
            len(plan) == 1
            and not plan[0].inner
            and not self.has_stop
            and not self.finite
            and self.process.constant(plan[0].model, 0) is not None
        )

    def _fast_round(self, block: Block, live: np.ndarray):
        """min(Geometric, k) accepted tokens: P(at least i accepted) = α^i."""
        alpha = self.process.constant(block.model, 0)
        k = np.where(live, np.broadcast_to(np.asarray(block.steps, dtype=np.int64), (self.S,)), 0)
        n_acc = self._run_length(alpha, k)
        m = block.model
        c = self.counts
        c.calls[:, m] += k
        c.call_tokens[:, m] += k
        c.drafted[:, m] += k
        c.accepted[:, m] += n_acc
        return k, n_acc

    def _run_length(self, alpha: float, cap: np.ndarray) -> np.ndarray:
        """min(G, cap) per sequence, G the successes before the first failure of Bernoulli(α):
        P(G ≥ i) = α^i, sampled as floor(log u / log α) from one uniform each."""
        if alpha >= 1.0:
            return cap.copy()
        if alpha <= 0.0:
            return np.zeros(self.S, dtype=np.int64)
        with np.errstate(divide="ignore"):
            g = np.floor(np.log(self.rng.random(self.S)) / np.log(alpha))
        return np.minimum(g, cap).astype(np.int64)

    def _tree_round(self, live: np.ndarray):
        """A full tree of width w and depth d: a level is passed with 1 − Π_r (1 − α_r). Under a
        node budget smaller than the full tree, the budget's most valuable nodes
        (:mod:`draftsim.sim.budget_tree`, EAGLE-2's reranking)."""
        tree = self.policy
        if tree.choices is not None or tree.max_nodes < tree.nodes:
            return self._budget_round(live)
        ranks = np.array([self.process.rank_prob(r) for r in range(1, tree.width + 1)])
        level = 1.0 - np.prod(1.0 - ranks)
        n_acc = self._run_length(level, np.full(self.S, tree.depth, dtype=np.int64)) * live
        live_i = live.astype(np.int64)
        c = self.counts
        c.calls[:, 1] += tree.depth * live_i  # one drafter pass per level, all nodes of the level at once
        c.call_tokens[:, 1] += sum(tree.width**d for d in range(tree.depth)) * live_i
        c.drafted[:, 1] += tree.nodes * live_i
        c.accepted[:, 1] += n_acc
        nodes = np.full(self.S, tree.nodes, dtype=np.int64) * live_i
        return nodes, n_acc

    def _budget_round(self, live: np.ndarray):
        tree = self.policy
        if getattr(self, "_budget", None) is None:
            self._budget = tree.kept_tree(self.process.rank_prob)
        bt = self._budget
        n_acc = bt.sample(self.S, self.rng) * live
        live_i = live.astype(np.int64)
        c = self.counts
        levels = int(np.count_nonzero(bt.per_level[1:]))
        c.calls[:, 1] += levels * live_i  # one drafter pass per level over the previous level's kept nodes
        c.call_tokens[:, 1] += int(bt.per_level[:levels].sum()) * live_i
        c.drafted[:, 1] += bt.nodes * live_i
        c.accepted[:, 1] += n_acc
        return np.full(self.S, bt.nodes, dtype=np.int64) * live_i, n_acc

    # ------------------------------------------------------------ drafting and verification

    def _draft(self, verifier: int, plan: tuple[Block, ...], pos, live, top: bool, cap=None):
        """Build the draft ``plan`` proposes to ``verifier``: acceptance probabilities and
        proposers per draft position (S, L), and the draft lengths (at most ``cap``)."""
        S, c = self.S, self.counts
        L = max(plan_bound(plan), 1)
        prob = np.zeros((S, L))
        proposer = np.zeros((S, L), dtype=np.int64)
        length = np.zeros(S, dtype=np.int64)
        stopped = np.zeros(S, dtype=bool)
        for block in plan:
            steps = np.where(live, np.broadcast_to(np.asarray(block.steps, dtype=np.int64), (S,)), 0)
            m = block.model
            for t in range(int(steps.max(initial=0))):
                act = (t < steps) & ~stopped
                if cap is not None:
                    act &= length < cap
                if not act.any():
                    break
                if not block.inner:
                    p = self.track.prob(m, verifier, self.seq, pos + length, length)
                    idx = np.flatnonzero(act)
                    prob[idx, length[idx]] = p[idx]
                    proposer[idx, length[idx]] = m
                    c.calls[idx, m] += 1
                    c.call_tokens[idx, m] += 1
                    if top and self.has_stop:
                        obs = self.track.observe(self.process, p, self.seq, pos + length, self.rng, index=length)
                        stop = self.policy.stop(self.state, t, obs)
                        if stop is not None:
                            stopped |= act & stop
                    length += act
                else:
                    emitted = self._level_round(m, block.inner, pos + length, act)
                    if cap is not None:
                        emitted = np.minimum(emitted, np.maximum(cap - length, 0))
                    for u in range(int(emitted.max(initial=0))):
                        idx = np.flatnonzero(act & (u < emitted))
                        at = length[idx] + u
                        prob[idx, at] = self.track.prob(m, verifier, self.seq[idx], pos[idx] + at, at)
                        proposer[idx, at] = m
                    length += emitted
        return prob, proposer, length

    def _verify(self, prob, length, proposer, live) -> np.ndarray:
        """Accept draft positions until the first rejection; count per proposer."""
        cols = np.arange(prob.shape[1])
        ok = (self.rng.random(prob.shape) < prob) & (cols < length[:, None])
        n_acc = np.cumprod(ok, axis=1).sum(axis=1) * live
        proposed = cols < length[:, None]
        accepted = cols < n_acc[:, None]
        for m in np.unique(proposer[proposed]):
            mine = proposer == m
            self.counts.drafted[:, m] += (mine & proposed).sum(axis=1)
            self.counts.accepted[:, m] += (mine & accepted).sum(axis=1)
        return n_acc

    def _level_round(self, model: int, plan, pos, live) -> np.ndarray:
        """One speculative round of drafter ``model`` over its own cascade; tokens it emits."""
        prob, proposer, length = self._draft(model, plan, pos, live, top=False)
        n_acc = self._verify(prob, length, proposer, live)
        live_i = live.astype(np.int64)
        self.counts.calls[:, model] += live_i
        self.counts.call_tokens[:, model] += live_i * (length + 1)
        return (n_acc + 1) * live_i

    def _position_stats(self, drafted: np.ndarray, n_acc: np.ndarray) -> None:
        P = len(self.counts.pos_drafted)
        d = np.bincount(np.minimum(drafted, P), minlength=P + 1)
        a = np.bincount(np.minimum(n_acc, P), minlength=P + 1)
        # Position i (0-based) was drafted in rounds with drafted > i: a reversed cumulative sum.
        self.counts.pos_drafted += np.cumsum(d[::-1])[::-1][1:]
        self.counts.pos_accepted += np.cumsum(a[::-1])[::-1][1:]


def run(
    policy: Policy,
    process: AcceptanceProcess,
    n_sequences: int,
    tokens_per_sequence: int | None,
    rng: np.random.Generator,
    *,
    log: bool = False,
    progress=None,
) -> tuple[Counts, RoundLog | None]:
    """Simulate ``n_sequences`` independent sequences until each has emitted
    ``tokens_per_sequence`` tokens (for a trace: until its recorded text ends).

    ``progress`` (optional) is called with the number of tokens emitted in each iteration.
    Returns the counts and, when ``log`` is true, the :class:`RoundLog`.

    When rounds are i.i.d. (a memoryless policy under position-independent acceptance) and
    there are few sequences, rounds are drawn in large independent batches and dealt out
    to the sequences in order, instead of one round per sequence per iteration.
    """
    quota, width, iid = _quota(policy, process, n_sequences, tokens_per_sequence)
    if iid:
        return _run_iid(policy, process, quota, rng, log, progress)
    return _run_rounds(policy, process, quota, width, rng, log, progress)


def rounds(
    policy: Policy, process: AcceptanceProcess, n_sequences: int, tokens_per_sequence: int | None, rng: np.random.Generator
) -> Rounds:
    """Every round of :func:`run` (the same draws from ``rng``), flat: see :class:`Rounds`."""
    quota, width, iid = _quota(policy, process, n_sequences, tokens_per_sequence)
    if iid:
        pool, bounds = _deal(policy, process, quota, rng)
        used = bounds[-1]
        return Rounds(bounds, pool.tokens[:used], pool.calls[:used], pool.call_tokens[:used])
    _, log = _run_rounds(policy, process, quota, width, rng, True, None)
    live = np.stack(log.live)
    s_idx, r_idx = np.nonzero(live.T)  # sequence-major, rounds in order
    bounds = np.concatenate([[0], np.cumsum(np.bincount(s_idx, minlength=len(quota)))])
    return Rounds(bounds, np.stack(log.emitted)[r_idx, s_idx], np.stack(log.calls)[r_idx, s_idx],
                  np.stack(log.call_tokens)[r_idx, s_idx])


def _quota(policy: Policy, process: AcceptanceProcess, n_sequences: int, tokens_per_sequence: int | None):
    """Each sequence's tokens, the track's width, and whether rounds are drawn i.i.d. (see :func:`run`)."""
    if process.n_models is not None and policy.n_models > process.n_models:
        raise DraftsimError(
            f"the policy uses {policy.n_models} models but the acceptance process describes {process.n_models}"
        )
    finite = process.finite
    if finite:
        quota = np.asarray(process.lengths, dtype=np.int64)
        n_sequences = len(quota)
        width = int(quota.max()) + 1
    else:
        if tokens_per_sequence is None or tokens_per_sequence < 1:
            raise DraftsimError(f"tokens_per_sequence must be >= 1; got {tokens_per_sequence!r}")
        quota = np.full(n_sequences, int(tokens_per_sequence), dtype=np.int64)
        width = int(tokens_per_sequence) + max(policy.max_draft, 1) * 2 + 2
    iid = policy.memoryless and process.stationary_rounds and not finite and n_sequences < _IID_BELOW
    return quota, width, iid


def _run_rounds(policy, process, quota, width, rng, log, progress):
    """One round per live sequence per iteration."""
    n_sequences = len(quota)
    track = process.start(n_sequences, width, rng)
    engine = _Rollout(policy, process, track, n_sequences, rng)
    pos = np.zeros(n_sequences, dtype=np.int64)
    rounds = RoundLog() if log else None
    while True:
        live = pos < quota
        if not live.any():
            break
        before_calls = engine.counts.calls.copy() if log else None
        before_tokens = engine.counts.call_tokens.copy() if log else None
        emitted = engine.round(live, pos)
        pos += emitted
        if log:
            rounds.live.append(live)
            rounds.calls.append(engine.counts.calls - before_calls)
            rounds.call_tokens.append(engine.counts.call_tokens - before_tokens)
            rounds.emitted.append(emitted)
        if progress is not None:
            progress(int(emitted.sum()))
    return engine.counts, rounds


#: Below this many sequences, i.i.d. rounds are drawn in batches (see :func:`run`).
_IID_BELOW = 1024
_POOL_MAX = 1 << 18


def _deal(policy, process, quota, rng):
    """Draw i.i.d. rounds in pools (one engine lane per round) and deal them out in order:
    the pool's counts per round and each sequence's bounds (see :class:`Rounds`)."""
    S = len(quota)
    lanes: list[Counts] = []
    needed = int(quota.sum())
    produced = 0
    # Sequence s takes the rounds [start_s, end_s): the first that bring it to its quota. The pools are
    # drawn until every sequence is dealt: the tokens a round brings beyond its sequence's quota are not
    # the next one's, so Σ quota tokens may not be enough (9-token quotas of rounds of up to 8 tokens)
    bounds = np.zeros(S + 1, dtype=np.int64)
    dealt = 0
    mean = _one_uniform_per_round(policy, process, rng)  # tokens a round emits on average, when rounds can be drawn lazily
    while dealt < S:
        size = int(np.clip(needed - produced, 1024, _POOL_MAX))
        if mean:  # the pool's first rounds only, as many as the quota needs (see _one_uniform_per_round)
            drawn = 0
            while drawn < size and dealt < S:
                n = min(size - drawn, max(1024, int(max(needed - produced, 0) / mean * 1.05) + 64))
                engine = _Rollout(policy, process, process.start(n, 1, rng), n, rng)
                produced += int(engine.round(np.ones(n, dtype=bool), np.zeros(n, dtype=np.int64)).sum())
                lanes.append(engine.counts)
                drawn += n
                dealt = _deal_rounds(lanes, quota, bounds, dealt)
            rng.bit_generator.advance(size - drawn)  # the uniforms of the rounds not needed
            continue
        engine = _Rollout(policy, process, process.start(size, 1, rng), size, rng)
        emitted = engine.round(np.ones(size, dtype=bool), np.zeros(size, dtype=np.int64))
        lanes.append(engine.counts)
        produced += int(emitted.sum())
        dealt = _deal_rounds(lanes, quota, bounds, dealt)
    if len(lanes) == 1:
        pool = lanes[0]
    else:
        fields = ("tokens", "rounds", "calls", "call_tokens", "drafted", "accepted", "top_drafted", "top_accepted")
        pool = Counts(*(np.concatenate([getattr(c, f) for c in lanes]) for f in fields), lanes[0].pos_drafted, lanes[0].pos_accepted)
    return pool, bounds


def _deal_rounds(lanes: list, quota: np.ndarray, bounds: np.ndarray, dealt: int) -> int:
    """Deal the pool's rounds so far to sequences ``dealt``, ``dealt`` + 1, …, each the rounds that
    bring it to its quota, while the pool holds them (``bounds`` filled in place); returns the first
    sequence not dealt."""
    cum = np.concatenate([[0], np.cumsum(np.concatenate([c.tokens for c in lanes]))])
    total = cum[-1]
    for s in range(dealt, len(quota)):
        target = cum[bounds[s]] + quota[s]
        if target > total:
            return s
        bounds[s + 1] = np.searchsorted(cum, target, side="left")
    return len(quota)


def _one_uniform_per_round(policy, process, rng) -> float:
    """The mean tokens of a round when a pool's rounds each take exactly one uniform from
    ``rng``, in lane order, and nothing else (else 0): a one-block plan of a fixed length with a
    constant acceptance rate strictly between 0 and 1 (:meth:`_Rollout._fast_round`'s run
    length), no empty proposals, a track that draws nothing and a PCG64 stream (whose
    ``advance`` skips uniforms exactly). Then a pool's first rounds can be drawn alone and the
    stream advanced past the rest: the rounds and every later draw are the same as the whole
    pool's."""
    if not (isinstance(process, Bernoulli) and process.match >= 1.0 and isinstance(rng.bit_generator, np.random.PCG64)):
        return 0.0
    if policy.kind == "tree":
        return 0.0
    probe = _Rollout(policy, process, process.start(1, 1, rng), 1, rng)
    plan = policy.begin_round(probe.state)
    if not plan or not probe._fast(plan) or np.ndim(plan[0].steps) != 0:
        return 0.0
    alpha, k = process.constant(plan[0].model, 0), int(plan[0].steps)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha) if 0.0 < alpha < 1.0 else 0.0


def _run_iid(policy, process, quota, rng, log, progress):
    """:func:`run` by :func:`_deal`."""
    S = len(quota)
    pool, bounds = _deal(policy, process, quota, rng)
    used = slice(0, bounds[-1])
    starts = bounds[:-1]
    sums = lambda a: np.add.reduceat(a[used], starts, axis=0)  # noqa: E731
    P = len(pool.pos_drafted)
    d = np.bincount(np.minimum(pool.top_drafted[used], P), minlength=P + 1)
    a = np.bincount(np.minimum(pool.top_accepted[used], P), minlength=P + 1)
    counts = Counts(
        tokens=sums(pool.tokens),
        rounds=sums(pool.rounds),
        calls=sums(pool.calls),
        call_tokens=sums(pool.call_tokens),
        drafted=sums(pool.drafted),
        accepted=sums(pool.accepted),
        top_drafted=sums(pool.top_drafted),
        top_accepted=sums(pool.top_accepted),
        pos_drafted=np.cumsum(d[::-1])[::-1][1:],
        pos_accepted=np.cumsum(a[::-1])[::-1][1:],
    )
    if progress is not None:
        progress(int(counts.tokens.sum()))
    rounds = None
    if log:
        n_rounds = np.diff(bounds)
        R = int(n_rounds.max())
        r_idx = np.arange(bounds[-1]) - np.repeat(starts, n_rounds)
        s_idx = np.repeat(np.arange(S), n_rounds)
        M = pool.calls.shape[1]
        live = np.zeros((R, S), dtype=bool)
        live[r_idx, s_idx] = True
        calls = np.zeros((R, S, M), dtype=np.int64)
        calls[r_idx, s_idx] = pool.calls[used]
        call_tokens = np.zeros((R, S, M), dtype=np.int64)
        call_tokens[r_idx, s_idx] = pool.call_tokens[used]
        emitted = np.zeros((R, S), dtype=np.int64)
        emitted[r_idx, s_idx] = pool.tokens[used]
        rounds = RoundLog(list(live), list(calls), list(call_tokens), list(emitted))
    return counts, rounds
