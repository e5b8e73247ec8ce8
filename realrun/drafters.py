"""Drafters: one interface for Max-Gram, bigram tables and neural draft models.

In the spirit of transformers' ``CandidateGenerator``, a drafter

* ``propose(context, k)`` → up to k draft tokens and the distributions they came from;
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

from sim.errors import DraftsimError

__all__ = ["Rows", "Drafter", "MaxGram", "Bigram", "NeuralDraft", "accept_prob"]


@dataclass
class Rows:
    """Next-token distributions at a run of positions: ``dense`` (T, V) or ``sparse`` lists."""

    vocab: int
    dense: np.ndarray | None = None
    sparse: list | None = None  # [(ids int64 array, probs float array)] per position

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
    """Base class (see the module docstring)."""

    name = "drafter"
    neural = False
    #: A SpecDec++ acceptance head (:mod:`realrun.head`) for a neural drafter, else None.
    head = None

    def predict_along(self, ids: Sequence[int], start: int) -> Rows:
        raise NotImplementedError

    def propose(self, context: Sequence[int], k: int) -> tuple[list[int], Rows]:
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
        table = self.counts.get(int(prev)) or self.unigram
        common = table.most_common(self.top_n)
        ids = np.array([t for t, _ in common], dtype=np.int64)
        pr = np.array([c for _, c in common], dtype=np.float64)
        return ids, pr / pr.sum()

    def predict_along(self, ids, start):
        return Rows(self.vocab, sparse=[self.distribution(ids[t - 1]) for t in range(start, len(ids))])

    def propose(self, context, k):
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
    match, fall back to a bigram table. Deterministic: rows are one-hot. Cost ≈ 0.
    """

    name = "maxgram"
    #: propose() takes the prompt length (the prompt is searched first).
    uses_prompt = True

    def __init__(self, vocab: int, max_n: int = 8, fallback: Bigram | None = None):
        self.vocab = vocab
        self.max_n = max_n
        self.fallback = fallback

    def _index(self, ids: Sequence[int], lo: int, hi: int) -> list[dict]:
        """For n = 1..max_n: n-gram ending before position i → i (the follower's position), lo ≤ i < hi."""
        idx = [dict() for _ in range(self.max_n + 1)]
        for i in range(lo, hi):
            for n in range(1, min(self.max_n, i) + 1):
                idx[n][tuple(ids[i - n : i])] = i
        return idx

    def _match(self, ids, t, prompt_idx, gen_idx) -> int | None:
        """Position whose token follows the longest suffix of ids[:t] seen before, or None."""
        for index in (prompt_idx, gen_idx):
            for n in range(min(self.max_n, t), 0, -1):
                pos = index[n].get(tuple(ids[t - n : t]))
                if pos is not None:
                    return pos
        return None

    def _fallback(self, prev: int) -> int:
        if self.fallback is None:
            return int(prev)  # repeat the last token
        return int(self.fallback.distribution(prev)[0][0])

    def predict_along(self, ids, start):
        ids = list(ids)
        prompt_idx = self._index(ids, 1, start)
        gen_idx = [dict() for _ in range(self.max_n + 1)]
        rows = []
        for t in range(start, len(ids)):
            pos = self._match(ids, t, prompt_idx, gen_idx)
            tok = ids[pos] if pos is not None else self._fallback(ids[t - 1])
            rows.append((np.array([tok], dtype=np.int64), np.array([1.0])))
            for n in range(1, min(self.max_n, t) + 1):  # ids[t] now follows these n-grams
                gen_idx[n][tuple(ids[t - n : t])] = t
        return Rows(self.vocab, sparse=rows)

    def propose(self, context, k, prompt_len: int | None = None):
        """Copy up to k tokens that followed the longest earlier match of the context's suffix."""
        ids = list(context)
        P = len(ids) if prompt_len is None else prompt_len
        prompt_idx = self._index(ids, 1, min(P, len(ids)))
        gen_idx = self._index(ids, min(P, len(ids)), len(ids))
        out = []
        pos = self._match(ids, len(ids), prompt_idx, gen_idx)
        if pos is not None:
            out = ids[pos : pos + k]
        while len(out) < k:  # extend by the fallback
            out.append(self._fallback((ids + out)[-1]))
        rows = [(np.array([t], dtype=np.int64), np.array([1.0])) for t in out]
        return out, Rows(self.vocab, sparse=rows)


class NeuralDraft(Drafter):
    """Any causal LM sharing the target's tokenizer (a :class:`realrun.models.LoadedModel`)."""

    neural = True

    def __init__(self, loaded, name: str | None = None, head=None):
        self.loaded = loaded
        self.name = name or loaded.name
        self.vocab = loaded.vocab_size
        #: Optional SpecDec++ acceptance head (:mod:`realrun.head`): its p̂ becomes the policy's prediction.
        self.head = head

    def predict_along(self, ids, start):
        import torch

        with torch.inference_mode():
            x = torch.tensor([list(ids)], device=self.loaded.device)
            logits = self.loaded.model(x).logits[0, start - 1 : len(ids) - 1].float()
            rows = torch.softmax(logits, dim=-1).cpu().numpy().astype(np.float64)
        return Rows(self.vocab, dense=rows)
