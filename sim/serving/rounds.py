"""Every request's speculative rounds, drawn by the Monte Carlo engine before they are served.

What happens inside a round — tokens drafted, accepted, emitted, and the drafters' forward
calls — is decided by the request's drafting policy (:mod:`draftsim.sim.policies`) under its acceptance
process (:mod:`draftsim.sim.acceptance`), not by the clock. So, as :mod:`draftsim.sim.des` does, the rounds of each
request are drawn with :func:`draftsim.sim.montecarlo.run` (one sequence per request: its own Markov
regimes, or its own recorded sequence of a trace) and the server consumes them in order: one
round per decode step. The server never re-implements a policy.

Requests are drawn lazily, in blocks of consecutive ids, each block from its own random stream
(:func:`round_stream`): a request's rounds depend on the seed and its id only — not on the load,
the scheduler or the other requests. That makes comparisons across loads, schedulers and
controllers use common random numbers.

A controller's cap c applies to a drawn round exactly for flat drafts of one drafter (fixed k,
threshold, confidence stopping): drafting stops at min(drafted, c) and the accepted prefix is
min(accepted, c), the same draws decide both. A round of a cascade is cut proportionally (its
drafters' calls scaled by the kept fraction). A capped request emits fewer tokens per round
and may run out of drawn rounds; further rounds are drawn for it from a separate stream (for
a trace, from a Bernoulli process at the trace's mean acceptance: the recorded sequence is
spent). Stateful policies (the heuristic schedule) and position-dependent processes see their
rounds in the order drawn, uncapped — an approximation only when a controller caps them.
"""

from __future__ import annotations

import numpy as np

from .. import montecarlo
from ..acceptance import AcceptanceProcess, Bernoulli
from ..policies import Policy

__all__ = ["RoundBook", "round_stream", "BLOCK"]

#: Requests per block of the round book (one random stream each).
BLOCK = 1024
#: Requests per Monte Carlo call inside a block (grouped by similar token quotas).
_GROUP = 256
_EXTRA = 1 << 30  # stream id of the rounds drawn for exhausted requests


def round_stream(seed: int, replication: int, block: int) -> np.random.Generator:
    """The random stream of block ``block`` of the round book of one replication."""
    return np.random.default_rng([int(seed), int(replication), 7, int(block)])


class RoundBook:
    """Rounds of every request: flat columns, request r's rounds at ``start[r]:start[r]+count[r]``.

    Columns (one entry per round): ``drafted`` tokens proposed to the target, ``accepted`` of
    them, ``emitted`` tokens (accepted + bonus/correction), and per drafter m = 1, 2, …
    ``calls[:, m-1]`` forward calls and ``call_tokens[:, m-1]`` tokens they processed.

    ``quota[r]`` is the number of tokens request r's rounds must emit (its output tokens but
    the prefill's); a trace-driven process replays recorded sequence ``r % n`` (its length is
    the quota).
    """

    def __init__(self, policy: Policy, process: AcceptanceProcess, quota: np.ndarray, *, seed: int, replication: int = 0):
        self.policy, self.process = policy, process
        self.quota = np.asarray(quota, dtype=np.int64)
        self.seed, self.replication = int(seed), int(replication)
        n = len(self.quota)
        self.D = max(policy.n_models - 1, 0)
        self.start = np.zeros(n, dtype=np.int64)
        self.count = np.zeros(n, dtype=np.int64)
        self._drawn = np.zeros((n + BLOCK - 1) // BLOCK, dtype=bool)
        self._size = 0
        cap = 1 << 12
        self.drafted = np.zeros(cap, dtype=np.int32)
        self.accepted = np.zeros(cap, dtype=np.int32)
        self.emitted = np.zeros(cap, dtype=np.int32)
        self.calls = np.zeros((cap, self.D), dtype=np.int32)
        self.call_tokens = np.zeros((cap, self.D), dtype=np.int32)
        self._extra_rng = round_stream(seed, replication, _EXTRA)
        #: per drafter: every call processes one token (flat drafting), so far
        self.flat = [True] * self.D
        self._passes: dict = {}

    # -- storage --------------------------------------------------------------------------
    def _append(self, d, a, e, c, ct) -> int:
        n = len(d)
        need = self._size + n
        if need > len(self.drafted):
            cap = max(need, 2 * len(self.drafted))
            for name in ("drafted", "accepted", "emitted"):
                old = getattr(self, name)
                new = np.zeros(cap, dtype=old.dtype)
                new[: self._size] = old[: self._size]
                setattr(self, name, new)
            for name in ("calls", "call_tokens"):
                old = getattr(self, name)
                new = np.zeros((cap, self.D), dtype=old.dtype)
                new[: self._size] = old[: self._size]
                setattr(self, name, new)
        s = self._size
        self.drafted[s:need], self.accepted[s:need], self.emitted[s:need] = d, a, e
        if self.D:
            self.calls[s:need], self.call_tokens[s:need] = c, ct
            for m in range(self.D):
                if self.flat[m] and np.any(c[:, m] != ct[:, m]):
                    self.flat[m] = False
        self._size = need
        return s

    # -- drawing --------------------------------------------------------------------------
    def ensure(self, rid: int) -> None:
        """Draw the block holding request ``rid`` unless it is drawn."""
        b = rid // BLOCK
        if not self._drawn[b]:
            self._draw_block(b)

    def _draw_block(self, b: int) -> None:
        self._drawn[b] = True
        ids = np.arange(b * BLOCK, min((b + 1) * BLOCK, len(self.quota)))
        rng = round_stream(self.seed, self.replication, b)
        if self.process.finite:
            self._draw_trace(ids)
            return
        order = ids[np.argsort(self.quota[ids], kind="stable")]
        order = order[self.quota[order] > 0]
        for g in range(0, len(order), _GROUP):
            group = order[g: g + _GROUP]
            self._store(group, montecarlo.rounds(self.policy, self.process, len(group), int(self.quota[group].max()), rng))

    def _store(self, ids, drawn: montecarlo.Rounds) -> None:
        """Store request ``ids[s]``'s rounds from sequence s of ``drawn``: those that start before
        its quota is out."""
        quota = self.quota[ids]
        n = np.diff(drawn.bounds)
        seq = np.repeat(np.arange(len(ids)), n)
        e = drawn.emitted
        out = np.concatenate([[0], np.cumsum(e)])  # tokens out before each round, over all sequences
        keep = out[:-1] - out[drawn.bounds[seq]] < quota[seq]
        ct = drawn.call_tokens[keep]
        d = np.maximum(ct[:, 0] - 1, 0)
        e = e[keep]
        a = np.minimum(np.maximum(e - 1, 0), d)
        start = self._append(d, a, e, drawn.calls[keep, 1:], ct[:, 1:])
        counts = np.bincount(seq[keep], minlength=len(ids))
        self.start[ids] = start + np.concatenate([[0], np.cumsum(counts)[:-1]])
        self.count[ids] = counts

    def _draw_trace(self, ids) -> None:
        n_rec = self.process.n_sequences
        for p in np.unique(ids // n_rec):
            p = int(p)
            if p not in self._passes:
                rng = round_stream(self.seed, self.replication, (1 << 20) + p)
                self._passes[p] = montecarlo.rounds(self.policy, self.process, n_rec, None, rng)
            mine = ids[ids // n_rec == p]
            self._store(mine, self._passes[p].take(mine % n_rec))

    def extend(self, rid: int, tokens: int) -> None:
        """Draw rounds emitting at least ``tokens`` more tokens for ``rid`` after its unused ones
        (a capped request ran out); the unused rounds move to the end of the columns."""
        ptr_rounds = slice(self.start[rid], self.start[rid] + self.count[rid])
        old = (self.drafted[ptr_rounds].copy(), self.accepted[ptr_rounds].copy(), self.emitted[ptr_rounds].copy(),
               self.calls[ptr_rounds].copy(), self.call_tokens[ptr_rounds].copy())
        process = self.process
        if process.finite:
            process = Bernoulli(process.stationary_alpha())
        drawn = montecarlo.rounds(self.policy, process, 1, int(max(tokens, 1)), self._extra_rng)
        ct = drawn.call_tokens
        d = np.maximum(ct[:, 0] - 1, 0)
        a = np.minimum(np.maximum(drawn.emitted - 1, 0), d)
        start = self._append(old[0], old[1], old[2], old[3], old[4])
        self._append(d, a, drawn.emitted, drawn.calls[:, 1:], ct[:, 1:])
        self.start[rid] = start
        self.count[rid] = len(old[0]) + len(d)

    @property
    def rounds(self) -> int:
        """Rounds stored (drawn so far)."""
        return self._size
