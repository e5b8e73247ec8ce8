"""Samplers against exact distributions (chi-square), determinism, greedy variants, bad input.

Chi-square tests use fixed seeds, so each outcome is deterministic; each is run at
significance 1e-3, i.e. a fresh seed would fail a correct sampler with probability 1e-3.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from draftsim.sim import rules
from draftsim.sim.distributions import sample
from draftsim.sim.errors import DraftsimError
from draftsim.sim.exact import BlockProcess, TableModel, TreeProcess, round_distribution
from draftsim.sim.tree import TokenTree, draw_candidates, verify_tree, verify_tree_greedy
from draftsim.sim.verify import verify_block, verify_block_greedy

SIGNIFICANCE = 1e-3
N_SAMPLES = 100_000


def chi_square_pvalue(counts: dict, probs: dict) -> float:
    """Pearson chi-square of observed counts against exact probabilities (cells merged to E ≥ 5)."""
    keys = sorted(set(probs) | set(counts))
    n = sum(counts.values())
    for k in keys:
        assert probs.get(k, 0.0) > 0 or counts.get(k, 0) == 0, f"sampled impossible outcome {k}"
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    expected = np.array([probs.get(k, 0.0) * n for k in keys])
    order = np.argsort(expected)
    observed, expected = observed[order], expected[order]
    # Merge the smallest cells until every expected count is at least 5.
    merged_o, merged_e, acc_o, acc_e = [], [], 0.0, 0.0
    for o, e in zip(observed, expected):
        acc_o, acc_e = acc_o + o, acc_e + e
        if acc_e >= 5:
            merged_o.append(acc_o)
            merged_e.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:
        merged_o[-1] += acc_o
        merged_e[-1] += acc_e
    merged_e = np.array(merged_e) * (sum(merged_o) / sum(merged_e))
    return float(stats.chisquare(merged_o, merged_e).pvalue)


def sample_block_rounds(target, draft, rule, k, n_samples, seed):
    """n_samples independent first rounds with verify_block (batched); returns outcome counts."""
    rng = np.random.default_rng(seed)
    vocab = target.vocab
    tokens = np.zeros((n_samples, k), dtype=np.int64)
    q_rows = np.zeros((n_samples, k, vocab))
    p_rows = np.zeros((n_samples, k + 1, vocab))
    contexts = [()] * n_samples
    for i in range(k + 1):
        # Rows per distinct context, looked up for every sample.
        distinct = {c: j for j, c in enumerate(dict.fromkeys(contexts))}
        idx = np.array([distinct[c] for c in contexts])
        p_rows[:, i] = np.stack([target(c) for c in distinct])[idx]
        if i == k:
            break
        q_rows[:, i] = np.stack([draft(c) for c in distinct])[idx]
        tokens[:, i] = sample(q_rows[:, i], rng)
        contexts = [c + (int(t),) for c, t in zip(contexts, tokens[:, i])]
    result = verify_block(tokens, q_rows, p_rows, rule, rng)
    counts: dict = {}
    for row, n_acc, tok in zip(tokens, result.n_accepted, result.token):
        key = tuple(int(t) for t in row[:n_acc]) + (int(tok),)
        counts[key] = counts.get(key, 0) + 1
    return counts


TARGET = TableModel(4, seed=21)
DRAFT = TableModel(4, seed=22, zeros=0.25)


@pytest.mark.parametrize(
    "rule",
    [rules.SD(), rules.Lossy(0.3), rules.OPT(0.2), rules.TokenV3(0.4), rules.Leniency(2.0), rules.Chow(0.4)],
    ids=repr,
)
def test_block_sampler_matches_exact_round_distribution(rule):
    exact = round_distribution(BlockProcess(TARGET, DRAFT, rule, 2))
    counts = sample_block_rounds(TARGET, DRAFT, rule, 2, N_SAMPLES, seed=1)
    assert chi_square_pvalue(counts, exact) > SIGNIFICANCE


def test_chi_square_catches_a_broken_sampler():
    """Control: the same test rejects samples from an always-accepting verifier."""

    class AlwaysAccept(rules.SD):
        def accept_prob(self, q, p, x):
            return np.ones(np.shape(x))

    exact = round_distribution(BlockProcess(TARGET, DRAFT, rules.SD(), 2))
    counts = sample_block_rounds(TARGET, DRAFT, AlwaysAccept(), 2, N_SAMPLES, seed=1)
    assert chi_square_pvalue(counts, exact) < 1e-12


def sample_tree_rounds(widths, replacement, n_samples, seed):
    """Draw a tree per sample (candidates per node as TreeProcess does) and verify it."""
    rng = np.random.default_rng(seed)
    counts: dict = {}
    for _ in range(n_samples):
        tokens, parents, contexts = [], [], [()]
        frontier = [(-1, ())]
        for width in widths:
            nxt = []
            for parent, ctx in frontier:
                for x in draw_candidates(DRAFT(ctx), width, rng, replacement):
                    tokens.append(x)
                    parents.append(parent)
                    contexts.append(ctx + (x,))
                    nxt.append((len(tokens) - 1, ctx + (x,)))
            frontier = nxt
        tree = TokenTree(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64))
        q = np.stack([DRAFT(c) for c in contexts])
        p = np.stack([TARGET(c) for c in contexts])
        result = verify_tree(tree, q, p, rng, replacement=replacement)
        key = result.tokens + (result.token,)
        counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.slow  # 117.6 s measured (pytest --durations, 2-core machine)
@pytest.mark.parametrize("replacement", [True, False], ids=["iid", "without-replacement"])
def test_tree_sampler_matches_exact_round_distribution(replacement):
    widths = (2, 2)
    exact = round_distribution(TreeProcess(TARGET, DRAFT, widths, replacement))
    counts = sample_tree_rounds(widths, replacement, N_SAMPLES, seed=2)
    assert chi_square_pvalue(counts, exact) > SIGNIFICANCE


# ---------------------------------------------------------------- determinism and greedy


def test_same_generator_state_same_outcome():
    rng_rows = np.random.default_rng(0)
    q = rng_rows.dirichlet(np.ones(50), size=(64, 5))
    p = rng_rows.dirichlet(np.ones(50), size=(64, 6))
    tokens = sample(q, rng_rows)
    for rule in (rules.SD(), rules.OPT(0.3), rules.Lossy(0.2)):
        a = verify_block(tokens, q, p, rule, np.random.default_rng(123))
        b = verify_block(tokens, q, p, rule, np.random.default_rng(123))
        np.testing.assert_array_equal(a.n_accepted, b.n_accepted)
        np.testing.assert_array_equal(a.token, b.token)
    tree = TokenTree.chain(tokens[0])
    qt = np.concatenate([q[0], q[0, :1]])
    pt = p[0]
    assert verify_tree(tree, qt, pt, np.random.default_rng(5)) == verify_tree(tree, qt, pt, np.random.default_rng(5))


def test_batched_equals_rowwise_outcome_shapes():
    rng = np.random.default_rng(3)
    q = rng.dirichlet(np.ones(8), size=(10, 3))
    p = rng.dirichlet(np.ones(8), size=(10, 4))
    tokens = sample(q, rng)
    result = verify_block(tokens, q, p, rules.SD(), rng)
    assert result.n_accepted.shape == (10,) and result.token.shape == (10,)
    assert ((0 <= result.n_accepted) & (result.n_accepted <= 3)).all()
    single = verify_block(tokens[0], q[0], p[0], rules.SD(), rng)
    assert np.ndim(single.n_accepted) == 0 and 0 <= single.token < 8


def test_greedy_block_and_tree():
    p = np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.5, 0.25, 0.25]])
    assert verify_block_greedy([1, 0, 2], p) == verify_block_greedy(np.array([1, 0, 2]), p)
    r = verify_block_greedy([1, 0, 2], p)
    assert (r.n_accepted, r.token) == (3, 0)  # all accepted, bonus = argmax of the last row
    r = verify_block_greedy([1, 2, 2], p)
    assert (r.n_accepted, r.token) == (1, 0)
    # Tree: root children 2 and 1; node 1 (token 1) has children 1 and 0.
    tree = TokenTree(np.array([2, 1, 1, 0]), np.array([-1, -1, 1, 1]))
    rows = np.array([[0.1, 0.7, 0.2], [1, 0, 0], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.2, 0.5, 0.3]])
    r = verify_tree_greedy(tree, rows)
    assert r.path == (1, 3) and r.tokens == (1, 0) and r.token == 1


def test_sampling_with_one_hot_target_equals_greedy():
    """Temperature 0 through the sampling path gives the greedy result for any draft."""
    rng = np.random.default_rng(9)
    p_soft = rng.dirichlet(np.ones(6), size=(200, 4))
    p = np.eye(6)[p_soft.argmax(-1)]
    q = rng.dirichlet(np.ones(6), size=(200, 3))
    tokens = sample(q, rng)
    sampled = verify_block(tokens, q, p, rules.SD(), rng)
    greedy = verify_block_greedy(tokens, p)
    np.testing.assert_array_equal(sampled.n_accepted, greedy.n_accepted)
    np.testing.assert_array_equal(sampled.token, greedy.token)


# ---------------------------------------------------------------- bad input


GOOD_Q = np.array([[0.5, 0.5, 0.0]])
GOOD_P = np.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: verify_block([0], [[0.5, 0.6, 0.0]], GOOD_P, rng=RNG), "q rows must sum to 1 within 1e-06"),
        (lambda: verify_block([0], [[1.2, -0.2, 0.0]], GOOD_P, rng=RNG), "finite probabilities >= 0"),
        (lambda: verify_block([0], GOOD_Q, GOOD_P[:1], rng=RNG), "p must have shape (..., k+1, V)"),
        (lambda: verify_block([0, 1], GOOD_Q, GOOD_P, rng=RNG), "p must have shape"),
        (lambda: verify_block([3], GOOD_Q, GOOD_P, rng=RNG), "tokens must be an integer in [0, 2]; got 3"),
        (lambda: verify_block([2], GOOD_Q, GOOD_P, rng=RNG), "has probability 0 under q"),
        (lambda: verify_block([0], np.array([[0.5, 0.5]]), GOOD_P, rng=RNG), "vocabulary axis of length 3"),
        (lambda: verify_block([0], GOOD_Q, GOOD_P), "explicit numpy.random.Generator"),
        (lambda: verify_block([0.5], GOOD_Q, GOOD_P, rng=RNG), "tokens must be an integer"),
        (lambda: TokenTree(np.array([1, 2]), np.array([-1, 5])), "parents[1] must be -1 (root) or an earlier node"),
        (lambda: verify_tree_greedy(TokenTree.chain([0]), GOOD_P[:1]), "shape (n_nodes + 1, V)"),
    ],
)
def test_bad_input(call, fragment):
    with pytest.raises(DraftsimError) as info:
        call()
    assert fragment in str(info.value)
