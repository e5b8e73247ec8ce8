"""The per-position convention (cumulative, conditional, mean acceptance length, vLLM's draft
acceptance rate) and its conversions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim import simulate
from draftsim.sim.acceptance import Positional
from draftsim.sim.acceptance_rates import (
    conditional_from_cumulative,
    conditional_from_mean_length,
    cumulative_from_conditional,
    draft_acceptance_rate,
    mean_length,
    mean_length_from_draft_rate,
)
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import FixedK

rates = st.floats(0.0, 1.0, allow_nan=False)
conditionals = st.lists(rates, min_size=1, max_size=12)
positive = st.lists(st.floats(0.01, 1.0), min_size=1, max_size=12)


# ------------------------------------------------------------------ the convention


@given(conditionals)
def test_cumulative_rates_never_increase_and_stay_probabilities(c):
    a = cumulative_from_conditional(c)
    assert a.shape == (len(c),)
    assert np.all((a >= 0) & (a <= 1))
    assert np.all(np.diff(a) <= 0)
    assert a[0] == c[0]


@given(conditionals)
def test_cumulative_to_conditional_and_back_is_exact(c):
    a = cumulative_from_conditional(c)
    np.testing.assert_allclose(cumulative_from_conditional(conditional_from_cumulative(a)), a, rtol=1e-12, atol=1e-15)


@given(positive)
def test_conditional_to_cumulative_and_back_recovers_the_rates(c):
    np.testing.assert_allclose(conditional_from_cumulative(cumulative_from_conditional(c)), c, rtol=1e-9)


def test_conditional_after_a_zero_cumulative_rate_is_zero():
    np.testing.assert_array_equal(conditional_from_cumulative([0.5, 0.0, 0.0]), [0.5, 0.0, 0.0])


@given(conditionals)
def test_mean_length_lies_in_one_to_k_plus_one_and_matches_the_draft_rate(c):
    a = cumulative_from_conditional(c)
    k = len(c)
    L = mean_length(a)
    assert 1.0 <= L <= k + 1 + 1e-12
    r = draft_acceptance_rate(a)
    assert 0.0 <= r <= 1.0
    assert mean_length_from_draft_rate(r, k) == pytest.approx(L, abs=1e-12)


def test_identities_on_a_hand_example():
    # vLLM issue 19254's log line: per-position 0.615, 0.464, 0.383 -> mean acceptance length 2.46
    a = [0.615, 0.464, 0.383]
    assert mean_length(a) == pytest.approx(2.462)
    assert draft_acceptance_rate(a) == pytest.approx(1.462 / 3)
    np.testing.assert_allclose(conditional_from_cumulative(a), [0.615, 0.464 / 0.615, 0.383 / 0.464])
    # i.i.d. alpha: L = (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, §3.1)
    assert mean_length(cumulative_from_conditional([0.8] * 5)) == pytest.approx((1 - 0.8**6) / 0.2)


def test_vectorised_over_leading_axes():
    c = np.array([[0.9, 0.8], [0.5, 0.5]])
    np.testing.assert_allclose(cumulative_from_conditional(c), [[0.9, 0.72], [0.5, 0.25]])
    np.testing.assert_allclose(mean_length(cumulative_from_conditional(c)), [2.62, 1.75])
    out = conditional_from_mean_length(np.array([1.5, 2.0, 3.0]), 2)
    assert out.shape == (3, 2)
    np.testing.assert_allclose(mean_length(cumulative_from_conditional(out)), [1.5, 2.0, 3.0], atol=1e-12)


@given(st.integers(1, 16), st.floats(0.0, 1.0))
def test_constant_rate_from_mean_length_reproduces_it(k, u):
    L = 1.0 + u * k
    c = conditional_from_mean_length(L, k)
    assert c.shape == (k,)
    assert np.all(c == c[0])
    assert mean_length(cumulative_from_conditional(c)) == pytest.approx(L, abs=1e-12)


@given(st.integers(1, 12), st.floats(0.0, 1.0))
def test_constant_rate_from_mean_length_recovers_the_rate(k, alpha):
    L = mean_length(cumulative_from_conditional([alpha] * k))
    assert conditional_from_mean_length(L, k)[0] == pytest.approx(alpha, abs=1e-6)


@given(st.integers(2, 12), st.floats(0.01, 1.0), st.floats(0.0, 1.0))
def test_first_rate_and_mean_length_recover_the_rest(k, first, rest):
    L = mean_length(cumulative_from_conditional([first] + [rest] * (k - 1)))
    c = conditional_from_mean_length(L, k, first=first)
    assert c[0] == first
    assert mean_length(cumulative_from_conditional(c)) == pytest.approx(L, abs=1e-12)
    assert c[1] == pytest.approx(rest, abs=1e-5 / first)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: mean_length([0.9, 0.8], k=3), r"2 per-position values but k=3 needs 3"),
        (lambda: cumulative_from_conditional([0.9], k=2), r"1 per-position values but k=2"),
        (lambda: draft_acceptance_rate([0.5, 0.6]), r"must not increase.*0\.5 at position 1 then 0\.6 at position 2"),
        (lambda: conditional_from_cumulative([0.5, 0.6]), r"must not increase"),
        (lambda: mean_length([1.2]), r"must lie in \[0, 1\]; got 1\.2"),
        (lambda: mean_length([]), r"one rate per draft position"),
        (lambda: conditional_from_mean_length(4.5, 3), r"\[1, k\+1\] = \[1, 4\] for k=3; got 4\.5"),
        (lambda: conditional_from_mean_length(0.9, 3), r"got 0\.9"),
        (lambda: conditional_from_mean_length(1.9, 3, first=0.2), r"\[1 \+ c1, 1 \+ k\*c1\] for k=3 and c1=0\.2"),
        (lambda: conditional_from_mean_length(2.0, 0), r"k must be an integer in \[1, 1024\]; got 0"),
        (lambda: mean_length_from_draft_rate(1.5, 3), r"draft acceptance rate must lie in \[0, 1\]; got 1\.5"),
    ],
)
def test_bad_input_names_the_value_and_the_valid_range(call, match):
    with pytest.raises(DraftsimError, match=match):
        call()


@settings(max_examples=12)
@given(st.lists(st.floats(0.05, 0.98), min_size=1, max_size=5), st.integers(0, 2**31))
def test_positional_takes_conditional_rates_and_the_simulator_reports_cumulative_ones(c, seed):
    """A Monte Carlo of Positional(c) run through simulate: its per-position acceptance is
    the cumulative rate a_i, its tokens per target call the mean acceptance length and its
    acceptance rate vLLM's draft acceptance rate."""
    k = len(c)
    a = cumulative_from_conditional(c)
    r = simulate(FixedK(k), Positional(c), 0.05, 64_000, seed=seed, n_sequences=16)
    se = np.maximum(r.acceptance_by_position_se[:k], 1e-3)
    assert np.all(np.abs(r.acceptance_by_position[:k] - a) < 5 * se)
    tpc = r.metrics["tokens_per_call"]
    assert abs(tpc.value - mean_length(a)) < 5 * max(tpc.se, 2e-3)
    rate = r.metrics["acceptance_rate"]
    assert abs(rate.value - draft_acceptance_rate(a)) < 5 * max(rate.se, 2e-3)
