"""Verification rules (sim.rules): each rule's output distribution, the papers' lemmas, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from toy import row_pairs

from draftsim.sim import rules
from draftsim.sim.distributions import tv_distance, warp
from draftsim.sim.errors import DraftsimError

alphas = st.floats(0.0, 0.95)


def all_rules(alpha: float):
    return [
        rules.SD(),
        rules.Lossy(alpha),
        rules.Chow(alpha),
        rules.Diff(alpha),
        rules.OPT(alpha),
        rules.TokenV1(alpha),
        rules.TokenV2(alpha),
        rules.TokenV3(alpha),
        rules.BiLD(alpha, "tv"),
        rules.BiLD(alpha, "kl"),
        rules.BiLD(alpha, "nll"),
    ]


@given(row_pairs(), alphas)
def test_every_rule_outputs_its_target(qp, alpha):
    """Speculative sampling towards π (accept min(1, π/q), residual norm(max(0, π − q))) outputs π."""
    q, p = qp
    for rule in all_rules(alpha):
        pi = rule.target(q, p)
        assert pi.sum() == pytest.approx(1.0, abs=1e-12), rule
        assert (pi >= -1e-15).all(), rule
        np.testing.assert_allclose(rule.output(q, p), pi, atol=1e-12, err_msg=repr(rule))


@given(row_pairs(), alphas)
def test_rejection_rate_is_tv_to_target(qp, alpha):
    q, p = qp
    for rule in all_rules(alpha):
        assert rule.rejection_rate(q, p) == pytest.approx(tv_distance(q, rule.target(q, p)), abs=1e-12)


@given(row_pairs(), alphas)
def test_deferral_rules_reject_with_delta_times_tv(qp, alpha):
    """[SC] Lemma 5: P(reject) = δ(q, p)·TV(p, q)."""
    q, p = qp
    for rule in (rules.Chow(alpha), rules.Diff(alpha), rules.OPT(alpha), rules.BiLD(alpha)):
        delta = float(rule.defer(q, p))
        assert rule.rejection_rate(q, p) == pytest.approx(delta * tv_distance(p, q), abs=1e-12)


@given(row_pairs(), st.floats(0.0, 0.99))
def test_lossy_lemma3_accept_residual_equals_closed_form(qp, alpha):
    """[SC] Lemma 3: with the normalising β, accept min(1, p/((1−α)q)) + residual norm(max(0, p/β − q))
    outputs max{min{q, p/(1−α)}, p/β}."""
    q, p = qp
    rule = rules.Lossy(alpha)
    beta = rule.normalising_beta(q, p)
    closed = rule.closed_form(q, p)
    assert beta >= 1 - alpha - 1e-12
    assert closed.sum() == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(rule.output(q, p), closed, atol=1e-9)
    # The same β passed explicitly gives the same distribution through the accept/residual form.
    if np.isfinite(beta):
        np.testing.assert_allclose(rules.Lossy(alpha, beta).target(q, p), closed, atol=1e-9)


@given(row_pairs())
def test_lossy_alpha0_is_sd(qp):
    q, p = qp
    np.testing.assert_allclose(rules.Lossy(0.0).target(q, p), p, atol=1e-12)


@given(row_pairs(), alphas)
def test_token_v3_equals_closed_form(qp, alpha):
    q, p = qp
    rule = rules.TokenV3(alpha)
    np.testing.assert_allclose(rule.target(q, p), rule.closed_form(q, p), atol=1e-15)
    np.testing.assert_allclose(rule.output(q, p), rule.closed_form(q, p), atol=1e-12)


@given(row_pairs(), st.floats(0.1, 10.0))
def test_leniency_output_and_losslessness(qp, l):
    q, p = qp
    rule = rules.Leniency(l)
    out = rule.output(q, p)
    assert out.sum() == pytest.approx(1.0, abs=1e-12)
    expected = np.minimum(q, l * p) + (1 - np.minimum(q, l * p).sum()) * rule.residual(q, p)
    np.testing.assert_allclose(out, expected, atol=1e-12)
    np.testing.assert_allclose(rules.Leniency(1.0).output(q, p), p, atol=1e-12)


@given(row_pairs(), alphas)
def test_extremes_of_deferral_rules(qp, alpha):
    q, p = qp
    # Chow at alpha = 1 never defers (π = q); at alpha = 0 it defers unless q is one-hot.
    np.testing.assert_allclose(rules.Chow(1.0).target(q, p), q)
    if q.max() < 1:
        np.testing.assert_allclose(rules.Chow(0.0).target(q, p), p)


def test_rules_on_hand_example():
    q = np.array([0.6, 0.3, 0.1])
    p = np.array([0.2, 0.5, 0.3])
    # TV = 0.4; max q = 0.6, max p = 0.5.
    assert rules.Chow(0.3).defer(q, p)  # 0.6 < 0.7
    assert not rules.Chow(0.5).defer(q, p)
    assert not rules.Diff(0.0).defer(q, p)  # 0.6 < 0.5 is false
    assert not rules.OPT(0.1).defer(q, p)
    # TokenV3(0.5): keep tokens with p >= 0.25: {1, 2}; q mass handed over: 0.6.
    np.testing.assert_allclose(rules.TokenV3(0.5).target(q, p), [0.6 * 0.2, 0.3 + 0.6 * 0.5, 0.1 + 0.6 * 0.3])
    np.testing.assert_allclose(rules.SD().acceptance(q, p), [1 / 3, 1.0, 1.0])
    np.testing.assert_allclose(rules.SD().residual(q, p), [0.0, 0.5, 0.5])


def test_warp_temperature_and_top_k():
    row = np.array([0.5, 0.3, 0.15, 0.05])
    np.testing.assert_allclose(warp(row, 1.0), row)
    np.testing.assert_allclose(warp(row, 0.0), [1, 0, 0, 0])
    hot = warp(row, 0.5)
    np.testing.assert_allclose(hot, row**2 / (row**2).sum())
    np.testing.assert_allclose(warp(row, 1.0, top_k=2), [0.625, 0.375, 0, 0])
    np.testing.assert_allclose(warp(np.array([0.25, 0.25, 0.25, 0.25]), 1.0, top_k=2), [0.5, 0.5, 0, 0])
    batch = warp(np.stack([row, row[::-1]]), 2.0, top_k=3)
    assert batch.shape == (2, 4) and np.allclose(batch.sum(-1), 1)


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda: rules.Lossy(1.0), "alpha must lie in [0, 1); got 1.0"),
        (lambda: rules.Lossy(0.5, 0.2), "beta must be >= 1 - alpha = 0.5; got 0.2"),
        (lambda: rules.Lossy(-0.1), "alpha must lie in [0, 1]"),
        (lambda: rules.Chow(1.5), "alpha must lie in [0, 1]; got 1.5"),
        (lambda: rules.OPT(float("nan")), "got nan"),
        (lambda: rules.BiLD(-1.0), "alpha must be finite and >= 0"),
        (lambda: rules.BiLD(0.1, "euclid"), "discrepancy must be one of"),
        (lambda: rules.Leniency(0.0), "leniency must be finite and > 0"),
        (lambda: warp(np.array([0.5, 0.5]), -1.0), "temperature must be finite and >= 0"),
        (lambda: warp(np.array([0.5, 0.5]), 1.0, top_k=0), "top_k must be an integer >= 1"),
    ],
)
def test_bad_rule_parameters(make, fragment):
    with pytest.raises(DraftsimError, match=None) as info:
        make()
    assert fragment in str(info.value)


# ---------------------------------------------------------------- greedy decoding with a rule


@given(row_pairs(), alphas, st.floats(1.0, 50.0))
def test_greedy_rules(qp, alpha, leniency):
    """Greedy verification emits the mode of π and keeps a draft only when it is that mode;
    SD's mode is argmax p (lossless); leniency l ≥ 1 keeps at least what SD keeps."""
    from draftsim.sim.verify import verify_block_greedy

    q, p = qp
    x = int(q.argmax())
    for rule in all_rules(alpha):
        choice = int(rule.greedy_choice(q, p))
        assert choice == int(rule.target(q, p).argmax())
        assert bool(rule.greedy_accept(q, p, x)) == (x == choice)
        res = verify_block_greedy(np.array([x]), np.stack([p, p]), rule, q[None, :])
        assert int(res.n_accepted) == int(x == choice)
        assert int(res.token) == (int(p.argmax()) if x == choice else choice)
    assert int(rules.SD().greedy_choice(q, p)) == int(p.argmax())
    lenient = rules.Leniency(leniency)
    assert bool(lenient.greedy_accept(q, p, x)) >= (x == int(p.argmax()))
    assert int(lenient.greedy_choice(q, p)) == int(p.argmax())


def test_parse_rule():
    assert rules.parse_rule("opt:alpha=0.5") == rules.OPT(0.5)
    assert rules.parse_rule("bild:alpha=1,d=kl") == rules.BiLD(1.0, "kl")
    assert rules.parse_rule("leniency:l=2") == rules.Leniency(2.0)
    assert rules.parse_rule("lossy:alpha=0.1,beta=1") == rules.Lossy(0.1, 1.0)
    assert rules.parse_rule("SD") == rules.SD()
    for bad, message in (("chow", "needs alpha"), ("foo", "unknown rule"), ("chow:alpha=x", "not a valid value"),
                         ("chow:beta=1", "unknown parameter"), ("chow:alpha=2", "alpha"), ("chow:alpha=0.1,alpha=0.2", "twice")):
        with pytest.raises(DraftsimError, match=message):
            rules.parse_rule(bad)
