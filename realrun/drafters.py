"""Drafters: one interface for Max-Gram, bigram tables and neural draft models.

In the spirit of transformers' ``CandidateGenerator``, a drafter

* ``propose(context, k, prompt_len)`` → up to k draft tokens and the distributions they came
  from (with the drafter's confidence in each, where it is not the token's probability);
* ``feedback(n_accepted)`` → learns from the verification (a no-op here);
* ``predict_along(ids, start)`` → its next-token distribution at every position t ≥ start of
  a given text, conditioned on ``ids[:t]`` (teacher forcing; what traces record).

Distributions are :class:`Rows`: dense (a numpy array over the vocabulary, neural drafters)
or sparse (a few ids with probabilities, Max-Gram and bigram tables).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..sim.errors import DraftsimError

__all__ = ["Rows", "Drafter", "MaxGram", "Bigram", "NeuralDraft", "accept_prob"]


@dataclass
class Rows:
    """Next-token distributions at a run of positions: ``dense`` (T, V) or ``sparse`` lists."""

    vocab: int
    dense: np.ndarray | None = None
    sparse: list | None = None  # [(ids int64 array, probs float array)] per position
    #: Per position, the drafter's confidence in the token it proposes there, when that is not
    #: the row's probability of it (a deterministic drafter's rows are one-hot: Max-Gram's
    #: confidence is a function of its match length). None: the row's probability.
    conf: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.dense) if self.dense is not None else len(self.sparse)

    def argmax(self) -> np.ndarray:
        if self.dense is not None:
            return self.dense.argmax(axis=1)
        return np.array([ids[np.argmax(pr)] if len(ids) else -1 for ids, pr in self.sparse], dtype=np.int64)

    def prob(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens)
        if self.dense is not None:
            return self.dense[np.arange(len(tokens)), tokens]
        out = np.zeros(len(tokens))
        for i, ((ids, pr), t) in enumerate(zip(self.sparse, tokens)):
            hit = np.flatnonzero(ids == t)
            out[i] = pr[hit[0]] if hit.size else 0.0
        return out

    def top(self, k: int) -> tuple[list, list]:
        """Per position the k most probable ids and their probabilities."""
        if self.dense is not None:
            idx = np.argpartition(-self.dense, min(k, self.vocab - 1), axis=1)[:, :k]
            pr = np.take_along_axis(self.dense, idx, axis=1)
            order = np.argsort(-pr, axis=1, kind="stable")
            idx, pr = np.take_along_axis(idx, order, axis=1), np.take_along_axis(pr, order, axis=1)
            return [list(map(int, r)) for r in idx], [list(map(float, r)) for r in pr]
        ids_out, pr_out = [], []
        for ids, pr in self.sparse:
            order = np.argsort(-pr, kind="stable")[:k]
            ids_out.append([int(i) for i in ids[order]])
            pr_out.append([float(p) for p in pr[order]])
        return ids_out, pr_out

    def row(self, i: int) -> np.ndarray:
        """Position i as a dense distribution."""
        if self.dense is not None:
            return self.dense[i]
        out = np.zeros(self.vocab)
        ids, pr = self.sparse[i]
        out[ids] = pr
        return out


def accept_prob(p: np.ndarray, q: Rows) -> np.ndarray:
    """1 − TV(p, q) per position, over the full vocabulary: the exact probability that
    speculative sampling accepts a token drafted from q against target p."""
    if q.dense is not None:
        return 1.0 - 0.5 * np.abs(p - q.dense).sum(axis=1)
    out = np.empty(len(q))
    for i, (ids, pr) in enumerate(q.sparse):
        on = p[i, ids]
        # TV = ½(Σ_supp |p − q| + mass of p off the support)
        out[i] = 1.0 - 0.5 * (np.abs(on - pr).sum() + max(0.0, 1.0 - on.sum()))
    return out


class Drafter:
    """Base class (see the module docstring). The executors read these attributes directly;
    a subclass overrides the ones that differ."""

    #: Its name in logs, traces and tables.
    name = "drafter"
    #: True for a causal LM the executors run themselves (one forward call per token, a KV
    #: cache; :class:`NeuralDraft`); False for a statistical drafter, whose :meth:`propose`
    #: gives all of a block's tokens at once.
    neural = False
    #: Size of the vocabulary its token ids index; None: it proposes ids it has seen in the
    #: context (the executors refuse a drafter whose vocabulary differs from the target's).
    vocab: int | None = None
    #: The loaded model of a neural drafter (:class:`draftsim.realrun.models.LoadedModel`), else None.
    loaded = None
    #: The tokenizer whose ids it proposes, else None (a statistical drafter proposes the
    #: target's ids): the executors refuse one that maps ids differently from the target's.
    tokenizer = None
    #: A SpecDec++ acceptance head (:mod:`draftsim.realrun.head`) for a neural drafter, else None.
    head = None

    def predict_along(self, ids: Sequence[int], start: int) -> Rows:
        raise NotImplementedError

    def propose(self, context: Sequence[int], k: int, prompt_len: int | None = None) -> tuple[list[int], Rows]:
        """Up to ``k`` tokens to follow ``context``, whose first ``prompt_len`` tokens are the
        prompt (None: all of it), and the rows they were proposed from."""
        raise NotImplementedError

    def feedback(self, n_accepted: int) -> None:
        return None


class Bigram(Drafter):
    """P(next | previous token) estimated by counting; unseen contexts fall back to the
    unigram distribution of the same text. Sparse rows."""

    name = "bigram"

    def __init__(self, vocab: int, counts: dict | None = None, top: int = 32):
        self.vocab = vocab
        self.top_n = top
        self.counts: dict[int, Counter] = defaultdict(Counter, counts or {})
        self.unigram: Counter = Counter()
        self._rows: dict = {}  # previous token -> its distribution (the counts are fixed once fitted)

    @classmethod
    def fit(cls, sequences: Sequence[Sequence[int]], vocab: int, top: int = 32) -> "Bigram":
        model = cls(vocab, top=top)
        for seq in sequences:
            model.unigram.update(seq)
            for a, b in zip(seq[:-1], seq[1:]):
                model.counts[int(a)][int(b)] += 1
        if not model.unigram:
            raise DraftsimError("a bigram table needs some text to count")
        return model

    def distribution(self, prev: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``top`` most frequent followers of ``prev`` (ids, probabilities), computed once per token."""
        prev = int(prev)
        row = self._rows.get(prev)
        if row is None:
            table = self.counts.get(prev) or self.unigram
            common = table.most_common(self.top_n)
            ids = np.array([t for t, _ in common], dtype=np.int64)
            pr = np.array([c for _, c in common], dtype=np.float64)
            row = self._rows[prev] = (ids, pr / pr.sum())
        return row

    def predict_along(self, ids, start):
        return Rows(self.vocab, sparse=[self.distribution(ids[t - 1]) for t in range(start, len(ids))])

    def propose(self, context, k, prompt_len=None):
        out, rows, ctx = [], [], list(context)
        for _ in range(k):
            d = self.distribution(ctx[-1])
            tok = int(d[0][0])
            out.append(tok)
            rows.append(d)
            ctx.append(tok)
        return out, Rows(self.vocab, sparse=rows)


class MaxGram(Drafter):
    """Max-Gram ([CSD] §3.3, Appendix A): find the longest suffix of the context (up to
    ``max_n`` tokens) that occurred earlier — in the prompt first, then in the generated
    text, the most recent occurrence — and propose the tokens that followed it. With no
    match, fall back to a bigram table (or, without one, repeat the last token).
    Deterministic: rows are one-hot. Cost ≈ 0.

    **Confidence** (:attr:`Rows.conf`, what :class:`draftsim.sim.policies.ConfidenceStop` reads): a
    token copied after a match of m tokens has confidence m / (m + 1); a fallback token
    (no match, or past the end of the matched continuation) has 0. A heuristic, not a
    probability ([CSD] gives Max-Gram none): the longer the repeated context, the likelier
    its continuation repeats too. So ``ConfidenceStop(tau, k)`` with 0 < τ ≤ ½ drafts the
    matched continuation (up to k tokens) and a single token where nothing matches — as
    transformers' prompt lookup proposes the continuation of a match and nothing without
    one; τ ∈ (½, ⅔] asks for a match of two tokens, and so on.
    """

    name = "maxgram"

    def __init__(self, vocab: int, max_n: int = 8, fallback: Bigram | None = None):
        self.vocab = vocab
        self.max_n = max_n
        self.fallback = fallback

    @staticmethod
    def confidence(match: int) -> float:
        """m / (m + 1) for a token copied after a match of ``match`` = m tokens (0: no match)."""
        return match / (match + 1.0)

    def _match(self, ids: np.ndarray, t: int, lo: int, hi: int) -> tuple[int, int] | None:
        """(i, n): the largest n ≤ max_n such that ``ids[i − n : i] == ids[t − n : t]`` for
        some i in [lo, hi), and the latest such i — the position whose token followed the
        longest earlier occurrence of the suffix of ``ids[:t]`` (hi ≤ t); None without one."""
        lo = max(lo, 1)
        if hi <= lo or t < 1:
            return None
        i = np.flatnonzero(ids[lo - 1 : hi - 1] == ids[t - 1]) + lo  # n = 1
        if not i.size:
            return None
        best = (int(i[-1]), 1)
        for n in range(2, min(self.max_n, t) + 1):
            i = i[i >= n]
            i = i[ids[i - n] == ids[t - n]]
            if not i.size:
                break
            best = (int(i[-1]), n)
        return best

    def _fallback(self, prev: int) -> int:
        if self.fallback is None:
            return int(prev)  # repeat the last token
        return int(self.fallback.distribution(prev)[0][0])

    def predict_along(self, ids, start):
        ids = np.asarray(ids, dtype=np.int64)
        rows, conf = [], []
        for t in range(start, len(ids)):
            hit = self._match(ids, t, 1, start) or self._match(ids, t, start, t)
            tok = int(ids[hit[0]]) if hit is not None else self._fallback(int(ids[t - 1]))
            rows.append((np.array([tok], dtype=np.int64), np.array([1.0])))
            conf.append(self.confidence(hit[1]) if hit is not None else 0.0)
        return Rows(self.vocab, sparse=rows, conf=np.array(conf))

    def propose(self, context, k, prompt_len=None):
        """Copy up to k tokens that followed the longest earlier match of the context's suffix
        (in the prompt, its first ``prompt_len`` tokens, before the generated text); fill up
        with the fallback."""
        ids = np.asarray(context, dtype=np.int64)
        L = len(ids)
        P = L if prompt_len is None else min(prompt_len, L)
        hit = self._match(ids, L, 1, P) or self._match(ids, L, P, L)
        out, conf = [], []
        if hit is not None:
            out = ids[hit[0] : hit[0] + k].tolist()
            conf = [self.confidence(hit[1])] * len(out)
        while len(out) < k:
            out.append(self._fallback(out[-1] if out else int(ids[-1])))
            conf.append(0.0)
        rows = [(np.array([t], dtype=np.int64), np.array([1.0])) for t in out]
        return out, Rows(self.vocab, sparse=rows, conf=np.array(conf))


class NeuralDraft(Drafter):
    """Any causal LM sharing the target's tokenizer (a :class:`draftsim.realrun.models.LoadedModel`)."""

    neural = True

    def __init__(self, loaded, name: str | None = None, head=None):
        self.loaded = loaded
        self.name = name or loaded.name
        self.vocab = loaded.vocab_size
        self.tokenizer = loaded.tokenizer
        #: Optional SpecDec++ acceptance head (:mod:`draftsim.realrun.head`): its p̂ becomes the policy's prediction.
        self.head = head

    def predict_along(self, ids, start):
        import torch

        with torch.inference_mode():
            x = torch.tensor([list(ids)], device=self.loaded.device)
            logits = self.loaded.model(x).logits[0, start - 1 : len(ids) - 1].float()
            rows = torch.softmax(logits, dim=-1).cpu().numpy().astype(np.float64)
        return Rows(self.vocab, dense=rows)
