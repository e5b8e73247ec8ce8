"""Exact output distributions by enumeration: lossless methods keep the target's distribution,
lossy rules produce exactly their π, and deliberately broken verifiers are caught."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from toy import models

from draftsim.sim import rules
from draftsim.sim.distributions import warp
from draftsim.sim.exact import BlockProcess, TableModel, TreeProcess, VerticalProcess, autoregressive, max_abs_difference

TOL = 1e-9
ks = st.integers(0, 3)
ns = st.integers(1, 3)


def lossless_gap(process, target, n) -> float:
    """The check every lossless method must pass: max |process − autoregressive target|."""
    got = process.distribution(n)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    return max_abs_difference(got, autoregressive(target, n))


def expected_round_length(target, draft, k, context=()) -> float:
    """1 + Σ_i P(the first i drafts are accepted), computed independently of the processes:
    P(accept x_1..x_i) sums Π_j min(q_j(x_j), p_j(x_j)) over draft sequences (SD)."""

    def accepted(ctx, depth):
        if depth == 0:
            return 1.0
        both = np.minimum(draft(ctx), target(ctx))
        return sum(both[x] * accepted(ctx + (x,), depth - 1) for x in np.flatnonzero(both > 0))

    return 1.0 + sum(accepted(tuple(context), i) for i in range(1, k + 1))


def round_length_gap(process, target, draft, k) -> float:
    """The speed check: |E[tokens per round] − 1 − Σ_i P(first i accepted)|."""
    mean = sum(len(emitted) * pr for emitted, pr in process.round(()))
    return abs(mean - expected_round_length(target, draft, k))


# ---------------------------------------------------------------- lossless methods


@given(models(2), ks, ns)
def test_sd_block_keeps_target_distribution(ms, k, n):
    target, draft = ms
    process = BlockProcess(target, draft, rules.SD(), k)
    assert lossless_gap(process, target, n) < TOL
    assert round_length_gap(process, target, draft, k) < TOL


@given(models(3), st.integers(0, 2), st.integers(0, 2), st.floats(0.2, 5.0), ns)
def test_vertical_cascade_with_inner_leniency_is_lossless(ms, n_inner, k_inner, leniency, n):
    target, d1, d2 = ms
    process = VerticalProcess(target, d1, d2, rules.Leniency(leniency), n_inner, k_inner)
    assert lossless_gap(process, target, n) < TOL


@pytest.mark.slow  # 10.3 s measured (pytest --durations, 2-core machine)
@given(models(2), st.lists(st.integers(1, 3), min_size=1, max_size=2), st.booleans(), st.integers(1, 3))
def test_tree_verification_is_lossless(ms, widths, replacement, n):
    target, draft = ms
    assert lossless_gap(TreeProcess(target, draft, tuple(widths), replacement), target, n) < TOL


@given(models(2), st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.sampled_from([None, 1, 2]), ks)
def test_temperature_and_top_k_applied_to_both_models(ms, temperature, top_k, k):
    """Warping q and p the same way: SD keeps the *warped* target's distribution."""
    target, draft = ms
    w = lambda row: warp(row, temperature, top_k)  # noqa: E731
    wt = TableModel(target.vocab, seed=target.seed, concentration=target.concentration, zeros=target.zeros, warp=w)
    wd = TableModel(draft.vocab, seed=draft.seed, concentration=draft.concentration, zeros=draft.zeros, warp=w)
    assert lossless_gap(BlockProcess(wt, wd, rules.SD(), k), wt, 2) < TOL


# ---------------------------------------------------------------- lossy rules


def rule_strategy():
    alpha = st.floats(0.0, 0.95)
    return st.one_of(
        alpha.map(rules.Lossy),
        alpha.map(rules.Chow),
        alpha.map(rules.Diff),
        alpha.map(rules.OPT),
        alpha.map(rules.TokenV1),
        alpha.map(rules.TokenV2),
        alpha.map(rules.TokenV3),
        st.tuples(alpha, st.sampled_from(["tv", "kl", "nll"])).map(lambda a: rules.BiLD(*a)),
        st.floats(0.3, 4.0).map(rules.Leniency),
    )


@given(models(2), rule_strategy(), st.integers(1, 3))
def test_block_verification_outputs_pi_exactly(ms, rule, k):
    """The first verified token of a block follows π(q_1, p_1) exactly, for every rule."""
    target, draft = ms
    got = BlockProcess(target, draft, rule, k).distribution(1)
    pi = rule.target(draft(()), target(()))
    for y in range(target.vocab):
        assert got.get((y,), 0.0) == pytest.approx(pi[y], abs=TOL)


@given(models(2), rule_strategy(), st.integers(1, 3))
def test_block_verification_two_tokens_follow_pi_then_pi_or_bonus(ms, rule, k):
    """Two tokens: the second is a drafted position (π) when k ≥ 2 and the first was accepted,
    the bonus (p) when k = 1 and accepted, or a fresh round's first token (π) after a rejection."""
    target, draft = ms
    got = BlockProcess(target, draft, rule, k).distribution(2)
    q0, p0 = draft(()), target(())
    a = rule.acceptance(q0, p0)
    for x in range(target.vocab):
        accepted = q0[x] * a[x]
        corrected = rule.target(q0, p0)[x] - accepted
        q1, p1 = draft((x,)), target((x,))
        second_if_accepted = rule.target(q1, p1) if k >= 2 else p1
        expected = accepted * second_if_accepted + corrected * rule.target(q1, p1)
        for y in range(target.vocab):
            assert got.get((x, y), 0.0) == pytest.approx(expected[y], abs=TOL)


# ---------------------------------------------------------------- mutation controls


class AlwaysAccept(rules.SD):
    """Broken: accepts every drafted token."""

    lossless = False

    def acceptance(self, q, p):
        return np.ones_like(np.asarray(q, dtype=float))

    def accept_prob(self, q, p, x):
        return np.ones(np.shape(x))


class ResidualIsP(rules.SD):
    """Broken: resamples from p instead of norm(max(0, p − q)) after a rejection."""

    def residual(self, q, p):
        return np.asarray(p, dtype=float)


class NoBonus(BlockProcess):
    """Broken: emits no bonus token when every draft is accepted."""

    def bonus(self, p, emitted, prob):
        yield emitted, prob


class GSDCodeTree(TreeProcess):
    """The GSD paper code's acceptance: min(1, p/q) for every child against the original p."""

    def after_rejection(self, residual, proposal):
        return residual


class IIDResidualOnDistinctCandidates(TreeProcess):
    """Broken: candidates drawn without replacement, verified as if i.i.d."""

    def assumed_proposal(self, q, used):
        return q


class NaiveVertical(VerticalProcess):
    """Broken: the target verifies lenient proposals against d1's raw distribution."""

    def proposal_row(self, inner_output, d1_row, is_bonus):
        return d1_row


MODELS = [TableModel(4, seed=11), TableModel(4, seed=12, zeros=0.25), TableModel(4, seed=13, concentration=0.5)]


@pytest.mark.parametrize(
    "name, process",
    [
        ("always accept", BlockProcess(MODELS[0], MODELS[1], AlwaysAccept(), 2)),
        ("residual = p", BlockProcess(MODELS[0], MODELS[1], ResidualIsP(), 2)),
        ("GSD-code tree acceptance", GSDCodeTree(MODELS[0], MODELS[1], (2, 2), True)),
        ("i.i.d. residual, distinct candidates", IIDResidualOnDistinctCandidates(MODELS[0], MODELS[1], (3,), False)),
        ("vertical, target checks d1's row", NaiveVertical(MODELS[0], MODELS[1], MODELS[2], rules.Leniency(3.0), 2, 2)),
    ],
)
def test_mutation_controls_are_caught(name, process):
    """The same check as for the real methods fails — by far more than its tolerance."""
    gap = lossless_gap(process, MODELS[0], 3)
    assert gap > 1e3 * TOL, f"{name}: broken verifier not detected (gap {gap:g})"


def test_missing_bonus_is_caught_by_the_round_length_check():
    """Dropping the bonus token keeps the output distribution (only speed is lost), so the
    distribution check cannot see it; the round-length check of the same SD test does."""
    process = NoBonus(MODELS[0], MODELS[1], rules.SD(), 2)
    assert lossless_gap(process, MODELS[0], 3) < TOL
    assert round_length_gap(process, MODELS[0], MODELS[1], 2) > 1e3 * TOL


@given(models(2), st.integers(1, 3))
def test_always_accept_is_caught_whenever_models_differ(ms, k):
    target, draft = ms
    if np.abs(target(()) - draft(())).max() > 1e-3:
        got = BlockProcess(target, draft, AlwaysAccept(), k).distribution(1)
        assert max_abs_difference(got, autoregressive(target, 1)) > TOL


def test_round_probabilities_sum_to_one():
    target, draft = MODELS[0], MODELS[1]
    for process in (
        BlockProcess(target, draft, rules.OPT(0.3), 3),
        VerticalProcess(target, draft, MODELS[2], rules.Leniency(2.0), 2, 2),
        TreeProcess(target, draft, (2, 1), False),
    ):
        assert sum(pr for _, pr in process.round(())) == pytest.approx(1.0, abs=1e-12)
