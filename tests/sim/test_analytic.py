"""Closed forms of sim.analytic: hand-computed values, brute-force enumeration, properties."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftsim.sim import analytic
from draftsim.sim.errors import DraftsimError

probs = st.floats(0.0, 1.0, allow_nan=False)
costs = st.floats(0.0, 2.0, allow_nan=False)
ks = st.integers(0, 12)


# ---------------------------------------------------------------- brute-force references


def brute_force_positional(alphas, costs_):
    """E[tokens]/cost by enumerating every accept/reject pattern of the k positions."""
    k = len(alphas)
    expected = 0.0
    for pattern in itertools.product((True, False), repeat=k):
        prob = math.prod(a if ok else 1 - a for a, ok in zip(alphas, pattern))
        accepted = next((i for i, ok in enumerate(pattern) if not ok), k)
        expected += prob * (accepted + 1)  # accepted prefix + correction/bonus token
    return expected / (1 + sum(costs_))


def inner_round_lengths(alpha_inner, k):
    """Distribution of the tokens L one inner round emits: {L: P(L)} for L = 1..k+1."""
    return {a + 1: (alpha_inner**a) * ((1 - alpha_inner) if a < k else 1.0) for a in range(k + 1)}


def brute_force_vertical(alpha, c_d1, n, alpha_inner, c_d2, k):
    """Enumerate the n inner rounds' lengths, then every target accept/reject pattern."""
    lengths = inner_round_lengths(alpha_inner, k)
    expected = 0.0
    for combo in itertools.product(lengths.items(), repeat=n):
        prob = math.prod(p for _, p in combo)
        t = sum(l for l, _ in combo)
        expected += prob * brute_force_positional([alpha] * t, []) if t else prob
    return expected / (1 + n * c_d1 + n * k * c_d2)


# ---------------------------------------------------------------- hand-computed values


def test_expected_tokens_hand_values():
    assert analytic.expected_tokens(0.5, 2) == pytest.approx(1.75, rel=1e-15)
    assert analytic.expected_tokens(0.0, 7) == 1.0
    assert analytic.expected_tokens(1.0, 7) == 8.0
    assert analytic.expected_tokens(0.8, 0) == 1.0


def test_ewif_hand_values():
    assert analytic.ewif(0.5, 0.1, 2) == pytest.approx(1.75 / 1.2, rel=1e-15)
    assert analytic.ewif(0.8, 0.05, 8) == pytest.approx((1 - 0.8**9) / 0.2 / 1.4, rel=1e-15)
    assert analytic.ewif(1.0, 0.0, 5) == 6.0


def test_ewif_positional_hand_value():
    assert analytic.ewif_positional([0.5, 0.8], [0.1, 0.2]) == pytest.approx((1 + 0.5 + 0.4) / 1.3)
    assert analytic.ewif_positional(np.zeros(0), np.zeros(0)) == 1.0


def test_ewif_vertical_hand_value():
    # L = 1 or 2 with probability 1/2 each; E[1 + a + ... + a^L] = (1.5 + 1.75) / 2.
    assert analytic.ewif_vertical(0.5, 0.1, 1, 0.5, 0.0, 1) == pytest.approx(1.625 / 1.1, rel=1e-14)


def test_swi_hand_value():
    # 100 tokens: 30 target calls (cost 1) and 120 draft calls (cost 0.05) -> 100 / 36.
    assert analytic.swi([30, 120], [1.0, 0.05], 100) == pytest.approx(100 / 36)
    assert analytic.swi([100], [1.0], 100) == 1.0


def test_latency_matches_round_accounting():
    # Fixed k: per round k draft calls and one target call emit E tokens.
    alpha, k, t_d, t_t = 0.7, 5, 0.002, 0.03
    discard, verify = analytic.fixed_k_rates(alpha, k)
    tokens = analytic.expected_tokens(alpha, k)
    assert analytic.latency_per_token(t_d, t_t, discard, verify) == pytest.approx((k * t_d + t_t) / tokens)


def test_fixed_k_rates_extremes():
    assert analytic.fixed_k_rates(1.0, 4) == (0.0, 0.2)
    discard, verify = analytic.fixed_k_rates(0.0, 4)
    assert (discard, verify) == (4.0, 1.0)


def test_accuracy_near_alpha_one():
    for alpha in (1 - 1e-12, 1 - 1e-9, 1 - 1e-6):
        direct = math.fsum(alpha**i for i in range(11))
        assert analytic.expected_tokens(alpha, 10) == pytest.approx(direct, rel=1e-13)
        brute = brute_force_vertical(alpha, 0.1, 2, 0.9, 0.0, 2)
        assert analytic.ewif_vertical(alpha, 0.1, 2, 0.9, 0.0, 2) == pytest.approx(brute, rel=1e-12)


def test_broadcasting_shapes():
    alpha = np.linspace(0, 1, 5)[:, None]
    c = np.array([0.0, 0.1, 0.2])
    assert analytic.ewif(alpha, c, 3).shape == (5, 3)
    k, v = analytic.optimal_k(alpha, c, 8)
    assert k.shape == v.shape == (5, 3)
    assert isinstance(analytic.ewif(0.5, 0.1, 3), float)
    assert analytic.ewif_vertical(alpha, c, np.arange(4)[:, None, None], 0.5, 0.0, 2).shape == (4, 5, 3)


# ---------------------------------------------------------------- brute force against closed forms


@given(st.lists(probs, min_size=0, max_size=7), st.data())
def test_positional_matches_enumeration(alphas, data):
    cs = data.draw(st.lists(costs, min_size=len(alphas), max_size=len(alphas)))
    expected = brute_force_positional(alphas, cs)
    assert analytic.ewif_positional(np.array(alphas), np.array(cs)) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@given(probs, st.integers(0, 8))
def test_expected_tokens_matches_enumeration(alpha, k):
    assert analytic.expected_tokens(alpha, k) == pytest.approx(brute_force_positional([alpha] * k, []), rel=1e-12)


@given(probs, costs, st.integers(0, 3), probs, costs, st.integers(0, 2))
def test_vertical_matches_enumeration(alpha, c1, n, a_in, c2, k):
    expected = brute_force_vertical(alpha, c1, n, a_in, c2, k)
    assert analytic.ewif_vertical(alpha, c1, n, a_in, c2, k) == pytest.approx(expected, rel=1e-11, abs=1e-14)


@given(st.lists(st.tuples(probs, costs), min_size=1, max_size=3), st.data())
def test_horizontal_equals_positional(drafters, data):
    counts = data.draw(st.lists(st.integers(0, 5), min_size=len(drafters), max_size=len(drafters)))
    alphas = [a for (a, _), k in zip(drafters, counts) for _ in range(k)]
    cs = [c for (_, c), k in zip(drafters, counts) for _ in range(k)]
    expected = analytic.ewif_positional(np.array(alphas), np.array(cs))
    assert analytic.ewif_horizontal(drafters, counts) == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------- properties


@given(probs, ks)
def test_expected_tokens_bounds(alpha, k):
    tokens = analytic.expected_tokens(alpha, k)
    assert 1.0 <= tokens <= k + 1 + 1e-12


@given(probs, probs, costs, st.integers(1, 12))
def test_ewif_increasing_in_alpha(a1, a2, c, k):
    lo, hi = sorted((a1, a2))
    assert analytic.ewif(lo, c, k) <= analytic.ewif(hi, c, k) * (1 + 1e-12)
    if hi - lo > 1e-6:  # strictly, where the difference is resolvable in float64
        assert analytic.ewif(lo, c, k) < analytic.ewif(hi, c, k)


@given(probs, costs, costs, st.integers(1, 12))
def test_ewif_decreasing_in_cost(alpha, c1, c2, k):
    lo, hi = sorted((c1, c2))
    assert analytic.ewif(alpha, hi, k) <= analytic.ewif(alpha, lo, k)
    if hi - lo > 1e-6:
        assert analytic.ewif(alpha, hi, k) < analytic.ewif(alpha, lo, k)


@given(probs, costs, ks)
def test_positional_constant_equals_ewif(alpha, c, k):
    value = analytic.ewif_positional(np.full(k, alpha), np.full(k, c))
    assert value == pytest.approx(analytic.ewif(alpha, c, k), rel=1e-12)


@given(probs, costs, st.integers(0, 20), probs, costs)
def test_vertical_with_k0_equals_ewif(alpha, c1, n, a_in, c2):
    assert analytic.ewif_vertical(alpha, c1, n, a_in, c2, 0) == pytest.approx(analytic.ewif(alpha, c1, n), rel=1e-12)


@given(probs, costs, st.integers(0, 24))
def test_optimal_k_is_the_argmax(alpha, c, k_max):
    k, value = analytic.optimal_k(alpha, c, k_max)
    values = analytic.ewif(alpha, c, np.arange(k_max + 1))
    assert value == pytest.approx(values.max(), rel=1e-12)
    assert 0 <= k <= k_max
    assert analytic.ewif(alpha, c, k) == pytest.approx(values.max(), rel=1e-12)


@given(st.lists(st.tuples(st.floats(0.05, 0.99), st.floats(0.0, 0.5)), min_size=1, max_size=3), st.integers(0, 5))
def test_optimal_horizontal_is_exact(drafters, k_max):
    """Exhaustive over every assignment of drafters to positions (any order), total ≤ k_max."""
    plan = analytic.optimal_horizontal(drafters, k_max)
    best = 1.0
    for k in range(1, k_max + 1):
        for seq in itertools.product(range(len(drafters)), repeat=k):
            best = max(best, brute_force_positional([drafters[i][0] for i in seq], [drafters[i][1] for i in seq]))
    assert plan.ewif == pytest.approx(best, rel=1e-12)
    realised = analytic.ewif_horizontal([drafters[i] for i in plan.order], list(plan.counts)) if plan.order else 1.0
    assert realised == pytest.approx(plan.ewif, rel=1e-12)
    assert plan.k <= k_max


@given(st.lists(st.tuples(probs, costs), min_size=1, max_size=4), st.integers(0, 20))
def test_optimal_horizontal_never_worse_than_a_single_drafter(drafters, k_max):
    plan = analytic.optimal_horizontal(drafters, k_max)
    for alpha, c in drafters:
        _, single = analytic.optimal_k(alpha, c, k_max)
        assert plan.ewif >= single * (1 - 1e-12)


@given(probs, costs, probs, costs, st.integers(0, 6))
def test_optimal_vertical_is_near_argmax(alpha, c1, a_in, c2, k_max):
    plan = analytic.optimal_vertical(alpha, c1, a_in, c2, k_max)
    n, k = np.meshgrid(np.arange(k_max + 1), np.arange(k_max + 1), indexing="ij")
    values = analytic.ewif_vertical(alpha, c1, n, a_in, c2, k)
    assert plan.ewif >= values.max() * (1 - 1e-6)
    assert analytic.ewif_vertical(alpha, c1, plan.n, a_in, c2, plan.k) == pytest.approx(plan.ewif)


def test_optimal_horizontal_reference_case():
    # A strong-but-dear drafter first, then a cheap one: the cascade beats both alone.
    drafters = [(0.85, 0.15), (0.65, 0.02)]
    plan = analytic.optimal_horizontal(drafters, 32)
    assert plan.order == (0, 1) and plan.counts == (3, 5)
    assert plan.ewif > max(analytic.optimal_k(a, c, 32)[1] for a, c in drafters)
    # A dominated drafter (worse and dearer) is never used.
    plan = analytic.optimal_horizontal([(0.6, 0.3), (0.8, 0.1)], 16)
    assert plan.order == (1,)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: analytic.ewif(1.2, 0.1, 3), "alpha must lie in [0, 1]; got 1.2"),
        (lambda: analytic.ewif(float("nan"), 0.1, 3), "got nan"),
        (lambda: analytic.ewif(0.5, -0.1, 3), "c must be a finite cost >= 0; got -0.1"),
        (lambda: analytic.ewif(0.5, 0.1, -1), "k must be an integer >= 0; got -1"),
        (lambda: analytic.ewif(0.5, 0.1, 2.5), "k must be an integer >= 0; got 2.5"),
        (lambda: analytic.ewif(0.5, 0.1, [1, 2, -3]), "got -3 at index 2"),
        (lambda: analytic.optimal_k(0.5, 0.1, 10**9), "k_max must be an integer in [0, 1024]"),
        (lambda: analytic.ewif("high", 0.1, 1), "alpha must be a number"),
        (lambda: analytic.ewif_positional([0.5], [0.1, 0.2]), "same number of positions"),
        (lambda: analytic.ewif_horizontal([(0.5, 0.1)], [1, 2]), "one entry per drafter"),
        (lambda: analytic.ewif_horizontal([(0.5,)], [1]), "(alpha, cost) pair"),
        (lambda: analytic.swi([0, 0], [1, 0.1], 5), "walltime of 0"),
        (lambda: analytic.latency_per_token(0.0, 1.0, 0.1, 0.2), "t_draft must be finite and > 0"),
        (lambda: analytic.optimal_horizontal([(0.5 + 0.05 * i, 0.01 * (i + 1)) for i in range(8)], 1024), "lower k_max"),
    ],
)
def test_bad_input_raises_project_error(call, fragment):
    with pytest.raises(DraftsimError) as info:
        call()
    assert isinstance(info.value, ValueError)
    assert fragment in str(info.value)


def test_optimal_k_vectorised_matches_brute_force_across_chunks():
    """More points than one scan chunk, in random order, so compaction and chunking both run."""
    rng = np.random.default_rng(7)
    alpha = rng.uniform(0, 1, 150_000)
    alpha[:100] = 1.0
    c = rng.uniform(0, 0.6, 150_000)
    k, value = analytic.optimal_k(alpha, c, 24)
    table = analytic.ewif(alpha[:, None], c[:, None], np.arange(25)[None, :])
    np.testing.assert_allclose(value, table.max(axis=1), rtol=1e-13)
    np.testing.assert_allclose(table[np.arange(alpha.size), k], value, rtol=1e-13)


# --- the target's verification cost v(n) (a measured t(n) / t(1)) in the planner -----------

_alpha = st.floats(0.0, 1.0)
_cost = st.floats(0.0, 2.0)


def _verify_table(steps):
    """v(1) = 1, then non-decreasing by the given steps."""
    return np.concatenate([[1.0], 1.0 + np.cumsum(steps)])


@given(_alpha, _cost, st.integers(0, 12))
def test_a_flat_verification_table_is_the_papers_ewif(alpha, c, k_max):
    ones = np.ones(k_max + 1)
    assert analytic.ewif(alpha, c, np.arange(k_max + 1), ones) == pytest.approx(analytic.ewif(alpha, c, np.arange(k_max + 1)), rel=1e-12)
    k1, v1 = analytic.optimal_k(alpha, c, k_max, ones)
    k0, v0 = analytic.optimal_k(alpha, c, k_max)
    assert v1 == pytest.approx(v0, rel=1e-12)
    assert analytic.ewif(alpha, c, k1) == pytest.approx(v0, rel=1e-12)


@given(_alpha, _cost, st.lists(st.floats(0.0, 1.0), min_size=1, max_size=16))
def test_priced_optimal_k_is_the_best_k_the_table_covers(alpha, c, steps):
    v = _verify_table(steps)
    k, value = analytic.optimal_k(alpha, c, 32, v)
    every = analytic.ewif(alpha, c, np.arange(v.size), v)  # k = 0 .. len(v) - 1
    assert 0 <= k <= v.size - 1
    assert value == pytest.approx(every.max(), rel=1e-12) and value == every[k]
    assert (every[:k] < value).all()  # ties go to the smallest k
    # a dearer verification never helps: the priced optimum is at most the free one
    assert value <= analytic.optimal_k(alpha, c, v.size - 1)[1] * (1 + 1e-12)


@given(_alpha, _cost, st.integers(0, 5), _alpha, st.floats(0.0, 0.5), st.integers(0, 4), st.lists(st.floats(0.0, 1.0), min_size=30, max_size=30))
def test_priced_vertical_cascade(alpha, c1, n, alpha_inner, c2, k, steps):
    v = _verify_table(steps)  # covers 31 >= n(k+1)+1 tokens
    # a flat table gives the closed form of [CSD]
    flat = analytic.ewif_vertical(alpha, c1, n, alpha_inner, c2, k, np.ones(31))
    assert flat == pytest.approx(analytic.ewif_vertical(alpha, c1, n, alpha_inner, c2, k), rel=1e-9, abs=1e-12)
    # k = 0: d1 drafts n tokens in n calls, plain SD with the same table
    assert analytic.ewif_vertical(alpha, c1, n, alpha_inner, c2, 0, v) == pytest.approx(analytic.ewif(alpha, c1, n, v), rel=1e-9)
    # by exhaustive enumeration of the inner rounds' lengths
    lengths = range(1, k + 2)
    p_len = {i: alpha_inner ** (i - 1) * (1 - alpha_inner) if i <= k else alpha_inner ** k for i in lengths}
    tokens = cost = 0.0
    for ls in itertools.product(lengths, repeat=n):
        p = math.prod(p_len[i] for i in ls)
        t = sum(ls)
        tokens += p * sum(alpha ** i for i in range(t + 1))
        cost += p * v[t]
    expect = tokens / (cost + n * c1 + n * k * c2)
    assert analytic.ewif_vertical(alpha, c1, n, alpha_inner, c2, k, v) == pytest.approx(expect, rel=1e-9, abs=1e-12)


@given(st.lists(st.tuples(_alpha, _cost), min_size=1, max_size=3), st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8))
def test_priced_horizontal_cascade_is_exhaustively_optimal(drafters, steps):
    v = _verify_table(steps)
    k_max = v.size - 1
    best = analytic.optimal_horizontal(drafters, 32, v)
    assert best.k <= k_max
    # every order and allocation of the drafters, scored position by position
    top = 0.0
    for order in itertools.permutations(range(len(drafters))):
        for counts in itertools.product(range(k_max + 1), repeat=len(drafters)):
            if sum(counts) <= k_max:
                alphas = [drafters[i][0] for i, c in zip(order, counts) for _ in range(c)]
                costs = [drafters[i][1] for i, c in zip(order, counts) for _ in range(c)]
                value = sum(math.prod(alphas[:j]) for j in range(len(alphas) + 1)) / (v[len(alphas)] + sum(costs))
                top = max(top, value)
    assert best.ewif == pytest.approx(top, rel=1e-9)


def test_planner_prices_the_verification():
    from draftsim.sim.plan import PlannedDrafter, plan

    d = [PlannedDrafter("maxgram", 0.3, 0.0)]
    free = [s for s in plan(d, k_max=16) if s.kind == "sd"][0]
    assert free.params["k"] == 16  # a free drafter and a free verification: draft as far as allowed
    v = 1.0 + 0.12 * np.arange(17)  # verifying n tokens costs 1 + 0.12 (n - 1) one-token calls
    priced = [s for s in plan(d, k_max=16, verify=v) if s.kind == "sd"][0]
    # k = 1: 1.3 / 1.12 = 1.161 beats k = 2: 1.39 / 1.24 = 1.121 and k = 0: 1
    assert priced.params["k"] == 1 and priced.ewif == pytest.approx(1.3 / 1.12)


@pytest.mark.parametrize("bad", [[], [[1.0, 2.0]], [2.0, 3.0], [1.0, 0.9], [1.0, float("nan")]])
def test_bad_verification_tables_are_refused(bad):
    with pytest.raises(DraftsimError, match="verify"):
        analytic.ewif(0.5, 0.1, 1, bad)


def test_a_draft_beyond_the_verification_table_is_refused():
    with pytest.raises(DraftsimError, match="covers 1..2 tokens"):
        analytic.ewif(0.5, 0.1, 2, [1.0, 1.5])
    with pytest.raises(DraftsimError, match="covers 1..3 tokens"):
        analytic.ewif_vertical(0.5, 0.1, 1, 0.5, 0.0, 2, [1.0, 1.2, 1.4])
