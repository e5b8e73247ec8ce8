"""Drafters: one interface for Max-Gram, bigram tables, n-gram and suffix lookup, and neural draft models.

In the spirit of transformers' ``CandidateGenerator``, a drafter

* ``propose(context, k, prompt_len)`` → up to k draft tokens and the distributions they came
  from (with the drafter's confidence in each, where it is not the token's probability);
* ``feedback(n_accepted)`` → learns from the verification (a no-op here);
* ``finish(prompt, output)`` → a request is over (suffix decoding keeps its output for later ones);
* ``predict_along(ids, start)`` → its next-token distribution at every position t ≥ start of
  a given text, conditioned on ``ids[:t]`` (teacher forcing; what traces record).

Distributions are :class:`Rows`: dense (a numpy array over the vocabulary, neural drafters)
or sparse (a few ids with probabilities, Max-Gram and bigram tables; an empty row where a
lookup drafter proposes nothing).

The lookup drafters :class:`NGram` and :class:`Suffix` propose *up to* k tokens and often
none: with no match in the context they propose nothing, and the round is a plain decoding
step (the target verifies zero draft tokens). Their rows are one-hot — a deterministic draft —
so speculative sampling accepts a proposed token x with probability p(x) and otherwise
samples the residual p without x, renormalised: the target's distribution exactly.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..sim.errors import DraftsimError
from ..sim.registry import METHODS as REGISTRY
from .models import parse_controlled  # noqa: F401 - where the drafters' users have always imported it from

__all__ = ["Rows", "Drafter", "MaxGram", "Bigram", "NGram", "Suffix", "NeuralDraft", "Controlled", "parse_controlled", "accept_prob",
           "STATISTICAL_DRAFTERS", "lookup_drafter",
           "one_hot_rows"]


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
    speculative sampling accepts a token drafted from q against target p (0 where q is an
    empty row: nothing was proposed)."""
    if q.dense is not None:
        return 1.0 - 0.5 * np.abs(p - q.dense).sum(axis=1)
    out = np.empty(len(q))
    for i, (ids, pr) in enumerate(q.sparse):
        if not len(ids):  # nothing proposed here (a lookup drafter without a match): nothing to accept
            out[i] = 0.0
            continue
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

    def finish(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """A request with this ``prompt`` generated ``output`` (a no-op but for :class:`Suffix`)."""
        return None

    def prepare(self, prompt: Sequence[int], continuation: Sequence[int]) -> None:
        """The target's own greedy ``continuation`` of ``prompt``, recorded before a timed run
        (a no-op but for :class:`Controlled`)."""
        return None

    #: Whether :meth:`prepare` must see every prompt's continuation before the drafter proposes.
    needs_continuations = False

    @property
    def batch_model(self):
        """The model whose batched forwards the drafter's proposals cost in batched serving
        (:class:`draftsim.realrun.serving.Server`: one forward per draft position over the rows
        still drafting, with a KV cache of its own): a neural drafter's own model; the
        controlled drafter's cost model; else None (a lookup's time is its own)."""
        return self.loaded if self.neural else None

    def model_ids(self, ids: Sequence[int]) -> list:
        """Target token ids as :attr:`batch_model` reads them (the same ids but for
        :class:`Controlled`, whose cost model's vocabulary may be smaller than the target's)."""
        return ids

    def serve_proposal(self, context: Sequence[int], k: int, prompt_len: int) -> list | None:
        """Batched serving: the tokens this drafter proposes when its :attr:`batch_model`'s
        forwards only cost time (the controlled drafter), else None (the model's own argmax)."""
        return None


def one_hot_rows(vocab: int, tokens: Sequence[int], conf=None) -> Rows:
    """Sparse one-hot rows for a deterministic drafter's ``tokens`` (none: an empty proposal)."""
    rows = [(np.array([t], dtype=np.int64), np.array([1.0])) for t in tokens]
    return Rows(vocab, sparse=rows, conf=None if conf is None else np.asarray(conf, dtype=np.float64))


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


class NGram(Drafter):
    """vLLM's ``ngram`` proposer (prompt lookup; vLLM v1 ``NgramProposer``,
    ``vllm/v1/spec_decode/ngram_proposer.py``): the longest n-gram with ``min_n`` ≤ n ≤
    ``max_n`` (vLLM's ``prompt_lookup_min`` / ``prompt_lookup_max``) that ends the context and
    occurred earlier in it — prompt and generated text alike, an occurrence may overlap the
    suffix itself; of several, the earliest — and the up to k tokens that followed it (fewer
    where the context ends). **No match: no proposal** — the round is a plain decoding step.
    Deterministic (one-hot rows, confidence 1); cost ≈ 0 (one scan of the context).
    """

    name = "ngram"

    def __init__(self, vocab: int, min_n: int = 2, max_n: int = 4):
        if not (isinstance(min_n, int) and isinstance(max_n, int) and 1 <= min_n <= max_n):
            raise DraftsimError(f"ngram needs 1 <= prompt_lookup_min <= prompt_lookup_max; got {min_n}, {max_n}")
        self.vocab = vocab
        self.min_n, self.max_n = min_n, max_n

    def match(self, ids: np.ndarray, length: int | None = None) -> tuple[int, int] | None:
        """(j, n) for the context ``ids[:length]`` (L tokens): the longest n in [min_n, max_n]
        with ``ids[j − n : j] == ids[L − n : L]`` for some j < L, and the smallest such j — the
        position the proposal starts at; None without one."""
        L = len(ids) if length is None else length
        if L < 2:
            return None
        j = np.flatnonzero(ids[: L - 1] == ids[L - 1]) + 1  # occurrences of the last token, ending before L
        if not j.size:
            return None
        best = (int(j[0]), 1)
        for n in range(2, min(self.max_n, L - 1) + 1):
            j = j[j >= n]
            j = j[ids[j - n] == ids[L - n]]
            if not j.size:
                break
            best = (int(j[0]), n)
        return best if best[1] >= self.min_n else None

    def _proposal(self, ids: np.ndarray, L: int, k: int) -> list[int]:
        hit = self.match(ids, L)
        return [] if hit is None else ids[hit[0] : min(hit[0] + k, L)].tolist()

    def propose(self, context, k, prompt_len=None):
        ids = np.asarray(context, dtype=np.int64)
        out = self._proposal(ids, len(ids), k)
        return out, one_hot_rows(self.vocab, out)

    def predict_along(self, ids, start):
        """The token it would propose first at each position (an empty row where it proposes none)."""
        ids = np.asarray(ids, dtype=np.int64)
        return one_hot_rows_or_empty(self.vocab, [self._proposal(ids, t, 1) for t in range(start, len(ids))])


class Suffix(Drafter):
    """Suffix decoding (SuffixDecoding, Oliaro et al., arXiv 2411.04975; vLLM's ``suffix`` method,
    which runs Arctic Inference's implementation). Two sources of text, as the paper's two
    suffix trees: the request's own text (prompt and output so far, the per-request tree) and
    the outputs of up to ``max_cached`` earlier requests (the global tree; :meth:`finish` adds
    one, oldest evicted first). A suffix tree of depth ``max_depth`` counts how often each
    token followed each pattern; the same counts come here from the pattern's occurrences in
    the text, found by a scan instead of stored in a tree (only earlier occurrences: the
    pattern's own place at the end of the context is not counted).

    For each pattern length m = 1, 2, … (the context's last m tokens, while they occur), the
    proposal follows the most frequent continuation (ties: the smaller id): a token's
    estimated probability is its count over the occurrences that reached it, the path's the
    product; the walk stops before the path's probability falls below ``min_prob`` or at
    min(k, ⌊``spec_factor`` · m⌋, ``max_depth`` − m) tokens. Of all pattern lengths and both
    sources the path with the highest score — Σ of its probabilities, the expected number of
    accepted tokens — is proposed; it may be empty. Defaults are vLLM's
    (``suffix_decoding_max_tree_depth`` 24, ``_max_cached_requests`` 10000,
    ``_max_spec_factor`` 1.0, ``_min_token_prob`` 0.1). Confidence (:attr:`Rows.conf`): the
    path's probability at each token. Deterministic: one-hot rows.
    """

    name = "suffix"

    def __init__(self, vocab: int, max_depth: int = 24, spec_factor: float = 1.0, min_prob: float = 0.1,
                 max_cached: int = 10000):
        if max_depth < 2 or spec_factor <= 0 or not 0.0 <= min_prob <= 1.0 or max_cached < 0:
            raise DraftsimError("suffix needs max_depth >= 2, spec_factor > 0, 0 <= min_prob <= 1 and max_cached >= 0; "
                                f"got {max_depth}, {spec_factor}, {min_prob}, {max_cached}")
        self.vocab = vocab
        self.max_depth, self.spec_factor, self.min_prob = max_depth, spec_factor, min_prob
        self.cached: deque = deque(maxlen=max_cached) if max_cached else deque(maxlen=0)

    def finish(self, prompt, output):
        if len(output) and self.cached.maxlen:
            self.cached.append(np.asarray(output, dtype=np.int64))

    def _walk(self, texts: list, ends: list, limit: int) -> tuple[list[int], list[float]]:
        """Follow the most frequent continuation from the occurrences ``ends`` (per text, the
        positions just after each occurrence) for at most ``limit`` tokens."""
        out, probs, prob = [], [], 1.0
        while len(out) < limit:
            total = sum(len(e) for e in ends)
            nxt = [t[e[e < len(t)]] for t, e in zip(texts, ends)]
            seen = np.concatenate(nxt) if nxt else np.zeros(0, dtype=np.int64)
            if not total or not seen.size:
                break
            ids, counts = np.unique(seen, return_counts=True)
            best = int(np.argmax(counts))
            p = prob * counts[best] / total
            if p < self.min_prob:
                break
            tok = int(ids[best])
            out.append(tok)
            probs.append(float(p))
            prob = p
            ends = [e[e < len(t)][t[e[e < len(t)]] == tok] + 1 for t, e in zip(texts, ends)]
        return out, probs

    def _best(self, ctx: np.ndarray, texts: list, k: int) -> tuple[list[int], list[float], float]:
        """The best-scoring path over ``texts`` (the first may be the context itself, whose
        final position is the pattern's own place and not an occurrence)."""
        L = len(ctx)
        best: tuple[list[int], list[float], float] = ([], [], 0.0)
        if L < 1 or not texts:
            return best
        # Occurrence ends of the length-1 pattern, per text.
        ends = []
        for t in texts:
            e = np.flatnonzero(t == ctx[-1]) + 1
            ends.append(e[e < L] if t is ctx else e)
        for m in range(1, min(self.max_depth - 1, L) + 1):
            if m > 1:
                ends = [e[e >= m] for e in ends]
                ends = [e[t[e - m] == ctx[L - m]] for t, e in zip(texts, ends)]
            if not any(len(e) for e in ends):
                break
            limit = min(k, int(self.spec_factor * m + 1e-6), self.max_depth - m)
            if limit < 1:
                continue
            toks, probs = self._walk(texts, ends, limit)
            score = float(sum(probs))
            if score > best[2]:
                best = (toks, probs, score)
        return best

    def _proposal(self, ctx: np.ndarray, k: int) -> tuple[list[int], list[float]]:
        own = self._best(ctx, [ctx], k)
        earlier = self._best(ctx, list(self.cached), k)
        toks, probs, _ = own if own[2] >= earlier[2] else earlier
        return toks, probs

    def propose(self, context, k, prompt_len=None):
        toks, probs = self._proposal(np.asarray(context, dtype=np.int64), k)
        return toks, one_hot_rows(self.vocab, toks, probs)

    def predict_along(self, ids, start):
        """The token it would propose with a budget of one at each position (an empty row
        where it proposes none), from the requests :meth:`finish` has seen so far."""
        ids = np.asarray(ids, dtype=np.int64)
        return one_hot_rows_or_empty(self.vocab, [self._proposal(ids[:t], 1)[0] for t in range(start, len(ids))])


def one_hot_rows_or_empty(vocab: int, firsts: list[list[int]]) -> Rows:
    """Per position a one-hot row for the first proposed token, or an empty row for none."""
    rows = [(np.array(f[:1], dtype=np.int64), np.ones(len(f[:1]))) for f in firsts]
    return Rows(vocab, sparse=rows)


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


class Controlled(Drafter):
    """Prescribed acceptance on real models: the drafter proposes the target's own greedy
    continuation, recorded before the timed run (:meth:`prepare`), keeping draft position j with
    the conditional probability ``rates[j]`` (the last rate repeats) and proposing a wrong token
    from the first position it does not keep, so a greedy verification accepts exactly the kept
    prefix: acceptance is known whatever the models. Its cost is real: each draft token runs one
    forward of ``cost`` (a drafter-sized model, random weights will do) on the context's last
    token. Timing real, acceptance controlled, at any model size — what vLLM's synthetic
    rejection sampler is for. Greedy decoding only (a sampled target has no one continuation)."""

    name = "controlled"
    needs_continuations = True

    def __init__(self, vocab: int, rates: Sequence[float], cost=None, seed: int = 0, name: str | None = None):
        self.vocab = int(vocab)
        self.rates = np.asarray(rates, dtype=np.float64)
        if self.rates.size == 0 or np.any((self.rates < 0) | (self.rates > 1)):
            raise DraftsimError(f"controlled acceptance rates must lie in [0, 1]; got {list(rates)}")
        self.cost = cost
        self.rng = np.random.default_rng(seed)
        self.refs: dict = {}
        self._kv = None  # the cost model's one-row static cache, where it runs through one
        if name:
            self.name = name

    def prepare(self, prompt, continuation) -> None:
        """Record ``continuation`` for ``prompt`` (the longest one given, when a prompt comes twice)."""
        key = tuple(int(t) for t in prompt)
        if len(continuation) >= len(self.refs.get(key, ())):
            self.refs[key] = [int(t) for t in continuation]

    @property
    def batch_model(self):
        return self.cost

    def model_ids(self, ids):
        # the cost model reads target ids folded into its own vocabulary (its output is never used)
        v = self.cost.vocab_size if self.cost is not None else self.vocab
        return ids if v >= self.vocab else [int(t) % v for t in ids]

    def serve_proposal(self, context, k, prompt_len) -> list:
        """The kept prefix of the recorded continuation, then one wrong token (see the class docstring)."""
        if prompt_len is None:
            raise DraftsimError("the controlled drafter needs to know where the prompt ends")
        ref = self.refs.get(tuple(int(t) for t in context[:prompt_len]))
        if ref is None:
            raise DraftsimError("the controlled drafter has no recorded continuation of this prompt: it drafts in draftsim run "
                                "and draftsim serve (greedy), which decode each prompt autoregressively first")
        at = len(context) - prompt_len
        tokens, kept = [], True
        for j in range(min(k, max(len(ref) - at, 0))):
            kept = kept and bool(self.rng.random() < self.rates[min(j, len(self.rates) - 1)])
            true = ref[at + j]
            tokens.append(true if kept else (true + 1) % self.vocab)
        return tokens

    def propose(self, context, k, prompt_len=None):
        tokens = self.serve_proposal(context, k, prompt_len)
        self._spend(context, len(tokens))
        return tokens, one_hot_rows(self.vocab, tokens)

    def _spend(self, context, n: int) -> None:
        """One forward of the cost model per draft token (its output is not used): a one-token call
        at context 0, plainly, or where the cost model is set to a static cache (``run
        --static-cache``), through a one-row static cache (a CUDA graph on a GPU) emptied after
        each call — what ``profile --path server-static`` times at batch 1, context 0."""
        if self.cost is None or n == 0:
            return
        import torch

        if self.cost.static_tokens is not None:
            from .kvcache import make_kv

            if self._kv is None:
                self._kv = make_kv(self.cost, 1)
                self._kv.add_rows(1)
            feed = [self.model_ids(context[-1:])]
            for _ in range(n):
                self._kv.forward(feed, [1])
                self._kv.rollback(0, [], 0)
            return
        ids = torch.tensor([self.model_ids(context[-1:])], device=self.cost.device)
        with torch.inference_mode():
            for _ in range(n):
                self.cost.model(ids)


#: Drafters that are statistics of the text, not neural models: the registry's lookup methods with a
#: drafter here (:mod:`draftsim.sim.registry`, ``real_drafter``). Max-Gram and bigram tables always
#: propose; ``ngram`` and ``suffix`` (vLLM's and SGLang's names) propose nothing where the context has
#: no match.
STATISTICAL_DRAFTERS = tuple(m.name for m in REGISTRY.values() if m.pricing == "lookup" and m.real_drafter)


def lookup_drafter(name: str, vocab: int, bigram: "Bigram | None" = None) -> Drafter:
    """The lookup drafter ``name`` (one of :data:`STATISTICAL_DRAFTERS`) over ``vocab`` token ids, of
    the class the registry names: Max-Gram falls back to ``bigram`` (the [CSD] setting) and ``bigram``
    is that table itself, so both need it fitted; ``ngram`` and ``suffix`` start empty."""
    if name not in STATISTICAL_DRAFTERS:
        raise DraftsimError(f"{name!r} is not a lookup drafter; they are {', '.join(STATISTICAL_DRAFTERS)}")
    cls = globals()[REGISTRY[name].real_drafter]
    if cls in (MaxGram, Bigram) and bigram is None:
        raise DraftsimError(f"the {name} drafter needs a fitted bigram table")
    if cls is Bigram:
        return bigram
    return cls(vocab, fallback=bigram) if cls is MaxGram else cls(vocab)
