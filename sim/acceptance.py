"""Acceptance processes: was a drafted token accepted, and what could a policy observe?

A process answers, for a token proposed by model ``m`` to verifier ``v`` (0 = target,
1, 2, … drafters) at text position ``t`` of sequence ``s`` and draft index ``i`` within the
round, the probability that it is accepted. The engines draw the accept/reject outcome
from it. Token acceptances are independent given these probabilities.

Alongside, each process says what a policy may observe about a drafted token
(:meth:`AcceptanceProcess.observe`): the true conditional acceptance probability, a noisy
prediction of it (for SpecDec++-style stopping; logit-normal noise of scale ``pred_noise``)
and a draft confidence (for confidence-based stopping; noise ``conf_noise``).

Processes are immutable descriptions; :meth:`AcceptanceProcess.start` makes the per-run
state (a :class:`Track`), e.g. the hidden regimes of a Markov-modulated process.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from .acceptance_rates import conditional_from_cumulative
from .distributions import stationary
from .errors import DraftsimError, as_cost, as_probability, unknown

__all__ = ["AcceptanceProcess", "Track", "Bernoulli", "Positional", "MarkovModulated", "TraceDriven"]


def _logit_noise(prob: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    if scale == 0:
        return prob
    with np.errstate(divide="ignore"):
        logit = np.log(prob) - np.log1p(-prob)
    return 1.0 / (1.0 + np.exp(-(logit + scale * rng.standard_normal(np.shape(prob)))))


class Track:
    """Per-run state of a process over ``n_seq`` sequences; :meth:`prob` is vectorised."""

    #: Per-sequence number of tokens the process describes (None: unbounded).
    lengths: np.ndarray | None = None

    def prob(self, proposer: int, verifier: int, seq: np.ndarray, pos: np.ndarray, index: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def observe(self, process: "AcceptanceProcess", prob: np.ndarray, seq: np.ndarray, pos: np.ndarray, rng, index=None) -> dict:
        """What the drafter observes about tokens drafted at ``pos``, ``index`` into the
        draft (default: the process's noise model)."""
        return process.observe(prob, rng)


class AcceptanceProcess:
    """Base class. Subclasses implement :meth:`start` (and :meth:`constant` when they can)."""

    def __init__(self, pred_noise: float = 0.0, conf_noise: float = 0.0, rank_alphas: Sequence[float] | None = None, match: float = 1.0):
        self.pred_noise = float(as_cost("pred_noise", pred_noise))
        self.conf_noise = float(as_cost("conf_noise", conf_noise))
        self.rank_alphas = None if rank_alphas is None else tuple(as_probability("rank_alphas", rank_alphas).tolist())
        #: probability that a round's drafter proposes anything at all: a lookup drafter (n-gram,
        #: suffix) finds no match otherwise, and the round is a plain decode step — no draft call,
        #: no draft token verified, one token out. Acceptance applies given a proposal.
        self.match = float(as_probability("match", match))

    #: Largest model index the process describes (drafters 1..n_models-1); None: any.
    n_models: int | None = None
    #: True when acceptance does not depend on the text position (only on the pair and the
    #: draft index), so that rounds are i.i.d. under a memoryless policy.
    stationary_rounds = False
    #: True when the process describes texts of given lengths (a trace): the engines stop
    #: each sequence where its text ends instead of at a token budget.
    finite = False

    def start(self, n_seq: int, max_len: int, rng: np.random.Generator) -> Track:
        raise NotImplementedError

    def constant(self, proposer: int, verifier: int) -> float | None:
        """The acceptance probability if it is the same at every position (else None)."""
        return None

    def rank_prob(self, rank: int) -> float:
        """P(candidate of rank r ≥ 1 is accepted | the earlier ones were rejected), for trees.

        From ``rank_alphas`` when given; otherwise rank 1 gets the drafter→target rate and
        later ranks 0 (a chain).
        """
        if self.rank_alphas is not None:
            return self.rank_alphas[rank - 1] if rank <= len(self.rank_alphas) else 0.0
        if rank == 1:
            value = self.constant(1, 0)
            if value is None:
                raise DraftsimError(f"{type(self).__name__} needs rank_alphas for tree policies")
            return value
        return 0.0

    def observe(self, prob: np.ndarray, rng: np.random.Generator) -> dict:
        """What a policy may observe about drafted tokens with true acceptance ``prob``."""
        return {
            "prob": prob,
            "pred": _logit_noise(prob, self.pred_noise, rng),
            "conf": _logit_noise(prob, self.conf_noise, rng),
        }

    def stationary_alpha(self) -> float:
        """Long-run drafter→target acceptance rate."""
        raise NotImplementedError

    def __repr__(self) -> str:
        def show(v):  # at 4 significant digits: 1 - 0.95 reads 0.05, not 0.050000000000000044
            if isinstance(v, np.ndarray):
                return np.vectorize(lambda x: float(f"{x:.4g}"))(v).tolist() if v.dtype.kind == "f" and v.size else v.tolist()
            return float(f"{v:.4g}") if isinstance(v, float) else v

        skip = {"n_models", "data", "lengths", "source", "confidence"}
        params = ", ".join(
            f"{k}={show(v)!r}"
            for k, v in vars(self).items()
            if not k.startswith("_") and k not in skip and v is not None and not (isinstance(v, float) and v == 0.0)
            and not (k == "match" and v == 1.0)
        )
        return f"{type(self).__name__}({params})"


def _pair_matrix(alpha) -> np.ndarray:
    """A scalar α (drafter 1 → target) or a square matrix A[m, v]."""
    arr = as_probability("alpha", alpha)
    if arr.ndim == 0:
        return arr
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] < 2:
        raise DraftsimError(f"alpha must be a scalar or a square matrix A[proposer, verifier]; got shape {arr.shape}")
    return arr


class _ConstantTrack(Track):
    def __init__(self, matrix: np.ndarray):
        self.matrix = matrix

    def prob(self, proposer, verifier, seq, pos, index):
        value = self.matrix if self.matrix.ndim == 0 else self.matrix[proposer, verifier]
        return np.full(np.shape(seq), float(value))


class Bernoulli(AcceptanceProcess):
    """Every token proposed by m to v is accepted with probability α[m, v], independently.

    ``alpha`` is a scalar (the same for every pair: one drafter) or a matrix A[m, v] over
    models 0 (target), 1, … (drafters), drafter-to-drafter pairs included.
    """

    stationary_rounds = True

    def __init__(self, alpha, **kwargs):
        super().__init__(**kwargs)
        self.alpha = _pair_matrix(alpha)
        self.n_models = None if self.alpha.ndim == 0 else self.alpha.shape[0]

    def start(self, n_seq, max_len, rng):
        return _ConstantTrack(self.alpha)

    def constant(self, proposer, verifier):
        return float(self.alpha if self.alpha.ndim == 0 else self.alpha[proposer, verifier])

    def stationary_alpha(self):
        return self.constant(1, 0)


class _PositionalTrack(Track):
    def __init__(self, alphas: np.ndarray):
        self.alphas = alphas

    def prob(self, proposer, verifier, seq, pos, index):
        return self.alphas[np.minimum(index, len(self.alphas) - 1)]


class Positional(AcceptanceProcess):
    """Acceptance α_i by draft index i within the round (i = 1, 2, …; the last value repeats):
    conditional rates c_i = P(token i accepted | tokens 1..i−1 accepted).

    Its ``repr`` echoes the rates in the convention they were given in: conditional, or
    cumulative a_i (vLLM's: :meth:`from_cumulative`, or ``cumulative``, the same rates as given,
    kept for the echo only); ``drafts``, the policy's longest draft when known, makes it say
    which given positions no round reaches."""

    stationary_rounds = True

    def __init__(self, alphas, *, drafts: int | None = None, cumulative=None, **kwargs):
        super().__init__(**kwargs)
        arr = as_probability("alphas", alphas)
        if arr.ndim != 1 or arr.size == 0:
            raise DraftsimError(f"alphas must be a non-empty 1-d sequence; got shape {arr.shape}")
        self.alphas = arr
        # what the repr echoes: the same rates as given (``cumulative``, when they came so)
        self._given = ("conditional", arr) if cumulative is None else ("cumulative", as_probability("cumulative rates", cumulative))
        self._drafts = None if drafts is None else int(drafts)

    @classmethod
    def from_cumulative(cls, cumulative, **kwargs) -> "Positional":
        """The process of cumulative rates a_i = P(tokens 1..i all accepted) (vLLM's per-position
        acceptance), echoed as such."""
        given = as_probability("cumulative rates", cumulative)
        return cls(conditional_from_cumulative(given), cumulative=given, **kwargs)

    def __repr__(self) -> str:
        convention, values = self._given
        rates = f"{convention}={[float(f'{x:.4g}') for x in values]!r}"
        text = re.sub(r"alphas=\[[^\]]*\]", lambda _: rates, super().__repr__(), count=1)
        if self._drafts is not None and values.size > self._drafts:
            unused = f"{self._drafts + 1}" + (f"-{values.size}" if values.size > self._drafts + 1 else "")
            text = text[:-1] + f"; positions {unused} unused: the policy drafts at most {self._drafts})"
        return text

    def start(self, n_seq, max_len, rng):
        return _PositionalTrack(self.alphas)

    def rank_prob(self, rank):
        if self.rank_alphas is not None:
            return super().rank_prob(rank)
        return float(self.alphas[0]) if rank == 1 else 0.0

    def stationary_alpha(self):
        return float(self.alphas.mean())


class _MarkovTrack(Track):
    def __init__(self, regimes: np.ndarray, alphas: np.ndarray):
        self.regimes = regimes
        self.alphas = alphas

    def prob(self, proposer, verifier, seq, pos, index):
        pos = np.minimum(pos, self.regimes.shape[1] - 1)
        return self.alphas[self.regimes[seq, pos]]


class MarkovModulated(AcceptanceProcess):
    """Hidden regimes (e.g. easy/hard) along the token index, a Markov chain with matrix
    ``transition``; a token at a position in regime r is accepted with ``alphas[r]``.

    The regime path is a property of the text: drafted tokens at positions t, t+1, … see
    the regimes of those positions, and the chain starts from ``initial`` (default: its
    stationary distribution). This is the context-dependent acceptance SpecDec++ targets.
    """

    def __init__(self, transition, alphas, initial=None, **kwargs):
        super().__init__(**kwargs)
        T = as_probability("transition", transition)
        if T.ndim != 2 or T.shape[0] != T.shape[1]:
            raise DraftsimError(f"transition must be a square matrix; got shape {T.shape}")
        if not np.allclose(T.sum(axis=1), 1.0, atol=1e-9):
            raise DraftsimError(f"transition rows must sum to 1; got sums {T.sum(axis=1).tolist()}")
        a = as_probability("alphas", alphas)
        if a.shape != (T.shape[0],):
            raise DraftsimError(f"alphas must have one entry per regime ({T.shape[0]}); got shape {a.shape}")
        self.transition = T
        self.alphas = a
        self.initial = self.stationary() if initial is None else as_probability("initial", initial)
        if self.initial.shape != a.shape or not np.isclose(self.initial.sum(), 1.0):
            raise DraftsimError("initial must be a distribution over the regimes")

    def stationary(self) -> np.ndarray:
        """The stationary distribution of the regime chain."""
        return stationary(self.transition)

    def stationary_alpha(self) -> float:
        return float(self.stationary() @ self.alphas)

    def start(self, n_seq, max_len, rng):
        cdf = np.cumsum(self.transition, axis=1)
        regimes = np.empty((n_seq, max_len), dtype=np.int8)
        state = np.searchsorted(np.cumsum(self.initial), rng.random(n_seq), side="right")
        state = np.minimum(state, len(self.alphas) - 1)
        u = rng.random((n_seq, max_len))
        for t in range(max_len):
            regimes[:, t] = state
            state = np.minimum((cdf[state] <= u[:, t, None]).sum(axis=1), len(self.alphas) - 1)
        return _MarkovTrack(regimes, self.alphas)


def _by_round(table, seq, pos, index):
    """Values recorded per (sequence, round start, draft index), NaN where none was."""
    start = np.asarray(pos) - np.asarray(index)
    ok = (start >= 0) & (start < table.shape[1]) & (np.asarray(index) < table.shape[2])
    out = np.full(np.shape(ok), np.nan)
    out[ok] = table[np.broadcast_to(seq, ok.shape)[ok], np.broadcast_to(start, ok.shape)[ok], np.broadcast_to(index, ok.shape)[ok]]
    return out


class _TraceTrack(Track):
    def __init__(self, probs: dict, lengths: np.ndarray, confidence: np.ndarray | None, rounds: dict | None = None, round_conf=None):
        self.probs = probs
        self.lengths = lengths
        self.confidence = confidence
        self.rounds = rounds or {}
        self.round_conf = round_conf

    def observe(self, process, prob, seq, pos, rng, index=None):
        if self.confidence is None:
            return process.observe(prob, rng)
        # The drafter's own probability of its token, as recorded: its confidence, and the
        # only acceptance prediction a drafter without a trained head has.
        conf = self.confidence[seq, np.minimum(pos, self.confidence.shape[1] - 1)]
        if self.round_conf is not None and index is not None:
            exact = _by_round(self.round_conf, seq, pos, index)
            conf = np.where(np.isnan(exact), conf, exact)
        return {"prob": prob, "pred": conf, "conf": conf}

    def prob(self, proposer, verifier, seq, pos, index):
        table = self.probs.get((proposer, verifier))
        if table is None:
            raise DraftsimError(f"the trace has no acceptance data for proposer {proposer} -> verifier {verifier}")
        pos = np.asarray(pos)
        inside = pos < table.shape[1]
        value = np.where(inside, table[seq, np.minimum(pos, table.shape[1] - 1)], 0.0)
        by_round = self.rounds.get((proposer, verifier))
        if by_round is not None:
            exact = _by_round(by_round, seq, pos, index)
            value = np.where(np.isnan(exact) | ~inside, value, exact)
        return value


def _stack_rounds(tables: list) -> np.ndarray:
    """Per-sequence (L, K) tables as one (S, L_max, K_max) array padded with NaN."""
    L = max(t.shape[0] for t in tables)
    K = max(t.shape[1] for t in tables)
    out = np.full((len(tables), max(L, 1), max(K, 1)), np.nan)
    for i, t in enumerate(tables):
        out[i, : t.shape[0], : t.shape[1]] = t
    return out


class TraceDriven(AcceptanceProcess):
    """Acceptance read from recorded sequences: per position, the probability that the token
    drafted there is accepted (e.g. 1 − TV(p, q)) or a greedy match flag (0/1).

    ``data`` is a list of 1-d arrays (one per recorded sequence; drafter 1 → target), or a
    dict {(proposer, verifier): list of arrays} for cascades. Each simulated sequence replays
    one recorded sequence and ends with it. ``confidence`` (per sequence and position) is
    what the drafter observed; without it, the noise models of the base class.

    A real run observes more than a value per position: a position drafted past a rejection
    is drafted again in the next round, from another context. ``rounds`` ({pair: list of
    (L, K) arrays}) and ``round_confidence`` (list of (L, K) arrays) hold values per round
    start and draft index (NaN where none was recorded); where present they take precedence,
    which lets a replay of a real run follow it exactly (:mod:`draftsim.analysis.reality`).
    """

    finite = True

    def __init__(self, data, confidence=None, rounds=None, round_confidence=None, **kwargs):
        super().__init__(**kwargs)
        self.rounds = rounds
        self.round_confidence = round_confidence
        pairs = data if isinstance(data, dict) else {(1, 0): data}
        self.confidence = None if confidence is None else [as_probability("confidence", c) for c in confidence]
        self.data = {}
        lengths = None
        for pair, seqs in pairs.items():
            seqs = [as_probability(f"trace {pair} sequence {i}", s) for i, s in enumerate(seqs)]
            if not seqs or any(s.ndim != 1 for s in seqs):
                raise DraftsimError(f"trace data for {pair} must be a non-empty list of 1-d arrays")
            these = np.array([len(s) for s in seqs])
            if lengths is not None and not np.array_equal(these, lengths):
                raise DraftsimError("every pair of a trace must cover the same sequences and lengths")
            lengths = these
            self.data[tuple(pair)] = seqs
        self.lengths = lengths

    @classmethod
    def from_trace(cls, trace, drafters: list[str] | None = None, kind: str = "prob", mode: str = "greedy", **kwargs) -> "TraceDriven":
        """Replay a recorded trace (a :class:`draftsim.sim.traces.Trace` or its path).

        ``drafters`` names the trace's drafters that play models 1, 2, … (default: the first
        one); every pair among them and the target that the trace holds is used. ``kind`` is
        ``"prob"`` (1 − TV(p, q), sampling) or ``"flag"`` (greedy match, greedy decoding).
        """
        from .traces import Trace

        trace = trace if isinstance(trace, Trace) else Trace(trace)
        names = drafters or trace.drafters()[:1]
        if not names:
            raise DraftsimError(f"trace {trace.path} records no drafter")
        missing = [n for n in names if n not in trace.drafters()]
        if missing:
            raise unknown("drafter", missing[0], trace.drafters(), known=f"trace {trace.path} has {', '.join(trace.drafters())}")
        models = ["target"] + list(names)
        available = set(trace.pairs())
        data = {}
        for m in range(1, len(models)):
            for v in range(m):
                if (models[m], models[v]) in available:
                    data[(m, v)] = trace.acceptance(models[m], models[v], kind=kind, mode=mode)
        if (1, 0) not in data:
            raise DraftsimError(f"trace {trace.path} has no {names[0]} -> target data")
        confidence = trace.column(names[0], "target", "q_draft", mode)
        process = cls(data, confidence=confidence, **kwargs)
        process.source = {"trace": str(trace.path), "drafters": list(names), "kind": kind, "mode": mode}
        return process

    @property
    def n_sequences(self) -> int:
        return len(self.lengths)

    def start(self, n_seq, max_len, rng):
        if n_seq != self.n_sequences:
            raise DraftsimError(f"a trace replays its {self.n_sequences} sequences; got n_seq={n_seq}")
        width = max(int(self.lengths.max()), 1)
        tables = {}
        for pair, seqs in self.data.items():
            table = np.zeros((len(seqs), width))
            for i, s in enumerate(seqs):
                table[i, : len(s)] = s
            tables[pair] = table
        conf = None
        if self.confidence is not None:
            conf = np.zeros((len(self.confidence), width))
            for i, c in enumerate(self.confidence):
                conf[i, : len(c)] = c
        rounds = {pair: _stack_rounds(tables) for pair, tables in (self.rounds or {}).items()}
        round_conf = _stack_rounds(self.round_confidence) if self.round_confidence is not None else None
        return _TraceTrack(tables, self.lengths.copy(), conf, rounds, round_conf)

    def stationary_alpha(self):
        return float(np.concatenate(self.data[(1, 0)]).mean())
