"""Lookup drafting on the real side: vLLM's ``ngram`` (prompt lookup) and suffix decoding.

The drafters against brute-force references (hypothesis); losslessness with a deterministic
(one-hot) draft by exact enumeration on a three-token vocabulary, with a broken verifier as the
mutation control; on tiny models: greedy output identical to the target's, sampling following
the target's exact distribution, empty proposals recorded (drafted 0) in run traces and
recorded traces, which replay."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.realrun.drafters import NGram, Rows, Suffix, accept_prob
from draftsim.sim.errors import DraftsimError
from draftsim.sim.exact import TableModel, autoregressive, max_abs_difference
from draftsim.sim.rules import SD

texts = st.lists(st.integers(0, 3), min_size=1, max_size=40)


# ---------------------------------------------------------------- the drafters against references


def ngram_reference(ctx: list[int], k: int, lo: int, hi: int) -> list[int]:
    """vLLM's rule written out: for n from hi down to lo, the earliest earlier occurrence
    (ending before the context does) of the context's last n tokens; the k tokens after it."""
    L = len(ctx)
    for n in range(min(hi, L - 1), lo - 1, -1):
        for start in range(0, L - n):  # occurrence ctx[start:start+n], ends at start+n <= L-1
            if ctx[start : start + n] == ctx[L - n :]:
                j = start + n
                return ctx[j : min(j + k, L)]
    return []


@given(texts, st.integers(1, 6), st.integers(1, 3), st.integers(0, 3))
def test_ngram_proposes_what_follows_the_earliest_longest_match(ctx, k, lo, extra):
    hi = lo + extra
    drafter = NGram(8, lo, hi)
    tokens, rows = drafter.propose(ctx, k)
    assert tokens == ngram_reference(ctx, k, lo, hi)
    assert len(rows) == len(tokens) <= k and list(rows.argmax()) == tokens
    if tokens:
        assert np.all(rows.prob(tokens) == 1.0)  # one-hot: a deterministic draft


def test_ngram_follows_vllms_documented_example():
    # vLLM's NgramProposer docstring: [1,2,3,4,2,3], min 2, max 3, k 4 -> [4, 2, 3].
    assert NGram(8, 2, 3).propose([1, 2, 3, 4, 2, 3], 4)[0] == [4, 2, 3]
    assert NGram(8, 2, 3).propose([1, 2, 3, 4, 5], 4)[0] == []  # no match: nothing
    assert NGram(8, 3, 3).propose([1, 2, 3, 4, 2, 3], 4)[0] == []  # only a 2-gram matches
    with pytest.raises(DraftsimError, match="prompt_lookup_min"):
        NGram(8, 3, 2)


def occurs(text: list[int], pattern: list[int], before: int | None = None) -> int:
    """How many times ``pattern`` occurs in ``text`` (ending at or before ``before``)."""
    end = len(text) if before is None else before
    return sum(text[i : i + len(pattern)] == pattern for i in range(0, end - len(pattern) + 1))


@given(texts, st.lists(texts, max_size=3), st.integers(1, 6), st.sampled_from([0.0, 0.1, 0.5]), st.sampled_from([0.5, 1.0, 2.0]))
@settings(max_examples=200)
def test_suffix_proposals_are_frequent_continuations_of_a_matched_pattern(ctx, earlier, k, min_prob, factor):
    """Every proposal continues a pattern (the context's last m tokens) in one source — the
    context itself (occurrences ending before its end) or the earlier outputs (pooled) — and is
    at most min(k, factor·m) long; its confidences are the path's probability: non-increasing,
    at least min_prob, each step's ratio the continuation's count over the pattern's."""
    drafter = Suffix(8, max_depth=24, spec_factor=factor, min_prob=min_prob)
    for out in earlier:
        drafter.finish([0], out)
    tokens, rows = drafter.propose(ctx, k)
    assert len(tokens) == len(rows) <= k
    if not tokens:
        return
    conf = rows.conf
    assert np.all(np.diff(conf) <= 1e-12) and conf[-1] >= min_prob - 1e-12 and conf[0] <= 1.0
    L = len(ctx)
    sources = [[ctx]] + ([earlier] if earlier else [])
    found = False
    for m in range(1, L + 1):
        if len(tokens) > int(factor * m + 1e-6):
            continue
        pattern = ctx[L - m :]
        for src in sources:
            # In the context itself only occurrences that end before the context does count.
            before = (lambda t: L - 1) if src[0] is ctx and len(src) == 1 else (lambda t: None)
            counts = [sum(occurs(t, pattern + tokens[:i], before(t) if i == 0 else (L if t is ctx else None)) for t in src)
                      for i in range(len(tokens) + 1)]
            if counts[0] and all(c > 0 for c in counts):
                ratios = np.cumprod([counts[i + 1] / counts[i] for i in range(len(tokens))])
                if np.allclose(ratios, conf):
                    found = True
    assert found, (ctx, earlier, tokens, conf)


def test_suffix_examples_and_the_global_cache():
    d = Suffix(16)
    assert d.propose([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], 4)[0] == [3, 4, 1, 2]
    assert d.propose([5, 6, 7], 4)[0] == []  # nothing repeats, nothing cached
    d.finish([0], [9, 6, 7, 8, 10])  # an earlier request's output
    tokens, rows = d.propose([5, 6, 7], 4)
    assert tokens == [8, 10] and list(rows.conf) == [1.0, 1.0]  # "6 7" was followed by "8 10"
    low = Suffix(16, min_prob=0.6)
    # "1" was followed by 2, 3 and 2: 2 with probability 2/3 (and "7 1" never occurred)
    tokens, rows = low.propose([1, 2, 5, 1, 3, 6, 1, 2, 7, 1], 3)
    assert tokens == [2] and rows.conf[0] == pytest.approx(2 / 3)
    assert Suffix(16, min_prob=0.7).propose([1, 2, 5, 1, 3, 6, 1, 2, 7, 1], 3)[0] == []
    assert Suffix(16, max_cached=0).finish([0], [1, 2]) is None
    with pytest.raises(DraftsimError, match="max_depth"):
        Suffix(16, max_depth=1)


def test_empty_rows_accept_nothing():
    """A position where the lookup proposes nothing: draft −1, probability 0, acceptance 0."""
    rows = NGram(4, 2, 2).predict_along([0, 1, 2, 3, 0, 1, 0, 1], 4)
    assert list(rows.argmax()) == [-1, -1, 2, -1]  # only "0 1" recurs: 2 followed it
    p = np.full((4, 4), 0.25)
    assert list(accept_prob(p, rows)) == [0.0, 0.0, 0.25, 0.0]
    assert isinstance(rows, Rows) and rows.prob([-1, -1, 2, -1]).tolist() == [0.0, 0.0, 1.0, 0.0]


# ---------------------------------------------------------------- losslessness by exact enumeration


class LookupProcess:
    """Speculative sampling with a lookup drafter: per round the drafter proposes up to k
    tokens from the context (deterministic, possibly none); each is verified against the
    target's row with the rule's acceptance of a one-hot q; a rejection emits from the residual,
    a fully accepted proposal the target's bonus token. Enumerated exactly."""

    def __init__(self, target, drafter, k: int, rule=SD()):
        self.target, self.drafter, self.k, self.rule = target, drafter, k, rule

    def one_hot(self, x: int) -> np.ndarray:
        q = np.zeros(self.target.vocab)
        q[x] = 1.0
        return q

    def accept(self, q, p, x):
        return float(self.rule.acceptance(q, p)[x])

    def residual(self, q, p):
        return self.rule.residual(q, p)

    def round(self, context):
        draft = self.drafter.propose(list(context), self.k)[0]
        out = []

        def walk(i, ctx, emitted, prob):
            p = self.target(ctx)
            if i == len(draft):
                out.extend((emitted + (y,), prob * py) for y, py in enumerate(p))
                return
            x = draft[i]
            q = self.one_hot(x)
            a = self.accept(q, p, x)
            if a < 1:
                out.extend((emitted + (z,), prob * (1 - a) * rz) for z, rz in enumerate(self.residual(q, p)))
            if a > 0:
                walk(i + 1, ctx + (x,), emitted + (x,), prob * a)

        walk(0, tuple(context), (), 1.0)
        return out

    def distribution(self, n: int, prefix=()):
        dist = defaultdict(float)

        def go(generated, prob):
            if len(generated) >= n:
                dist[generated[:n]] += prob
                return
            for emitted, pr in self.round(tuple(prefix) + generated):
                if pr > 0:
                    go(generated + emitted, prob * pr)

        go((), 1.0)
        return dict(dist)


class AcceptsEveryLookup(LookupProcess):
    """Mutation control: takes a proposed token whenever the target could emit it at all."""

    def accept(self, q, p, x):
        return 1.0 if p[x] > 0 else 0.0


LOOKUPS = [lambda: NGram(3, 1, 3), lambda: NGram(3, 2, 2), lambda: Suffix(3, min_prob=0.0), lambda: Suffix(3)]


@given(st.integers(0, 10_000), st.sampled_from(range(len(LOOKUPS))), st.integers(1, 3),
       st.lists(st.integers(0, 2), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None)
def test_lookup_drafting_keeps_the_targets_distribution_exactly(seed, which, k, prefix):
    target = TableModel(3, seed=seed, concentration=0.7, zeros=0.3)
    process = LookupProcess(target, LOOKUPS[which](), k)
    got = process.distribution(3, tuple(prefix))
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    assert max_abs_difference(got, autoregressive(target, 3, tuple(prefix))) < 1e-12


def test_the_exact_check_catches_a_verifier_that_accepts_every_lookup():
    target = TableModel(3, seed=7, concentration=0.7)
    prefix = (0, 1, 0, 1, 0)
    for process in (AcceptsEveryLookup(target, NGram(3, 1, 3), 2), AcceptsEveryLookup(target, Suffix(3, min_prob=0.0), 2)):
        assert max_abs_difference(process.distribution(3, prefix), autoregressive(target, 3, prefix)) > 1e-2
