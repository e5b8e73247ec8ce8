"""Optimisers: K matrices, the SpecDec++ MDP, the oracle, tree shapes and lenience choice."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from clirun import run
from hypothesis import example, given, settings
from hypothesis import strategies as st

from draftsim.sim import acceptance as A
from draftsim.sim import analytic, mdp, optimize, rules
from draftsim.sim import policies as P
from draftsim.sim.distributions import closed_classes
from draftsim.sim.errors import DraftsimError
from draftsim.sim.simulate import simulate

Z = 4.0
probs = st.floats(0.05, 0.99)


def system(draw_alphas, n):
    """An acceptance matrix over target + n drafters from a flat list of rates."""
    A_ = np.zeros((n + 1, n + 1))
    it = iter(draw_alphas)
    for j in range(1, n + 1):
        for i in range(j):
            A_[j, i] = next(it)
    return A_


# ---------------------------------------------------------------- K matrices


@pytest.mark.parametrize("K", [[[0, 4, 0], [0, 0, 10], [0, 0, 0]], [[0, 3, 5], [0, 0, 4], [0, 0, 0]], [[0, 2, 1, 6], [0, 0, 1, 6], [0, 0, 0, 3], [0, 0, 0, 0]]])
def test_kmatrix_closed_form_matches_simulation(K):
    n = len(K) - 1
    A_ = system([0.85, 0.7, 0.75, 0.5, 0.55, 0.6][: n * (n + 1) // 2], n)
    costs = [0.15, 0.04, 0.0][:n]
    r = simulate(P.VerticalCascade(K), A.Bernoulli(A_), costs, 300_000, seed=3)
    expected = analytic.ewif_kmatrix(K, A_, [1.0] + costs)
    est = r.metrics["ewif"]
    assert abs(est.value - expected) <= Z * est.se


def test_kmatrix_special_cases():
    A_ = system([0.85, 0.5, 0.55], 2)
    assert analytic.ewif_kmatrix([[0, 4, 0], [0, 0, 10], [0, 0, 0]], A_, [1, 0.15, 0]) == pytest.approx(analytic.ewif_vertical(0.85, 0.15, 4, 0.55, 0, 10))
    assert analytic.ewif_kmatrix([[0, 3, 5], [0, 0, 0], [0, 0, 0]], A_, [1, 0.15, 0.02]) == pytest.approx(
        analytic.ewif_horizontal([(0.85, 0.15), (0.5, 0.02)], [3, 5])
    )


@settings(max_examples=25, deadline=None)
@given(st.lists(probs, min_size=3, max_size=3), st.floats(0.02, 0.4), st.floats(0.0, 0.05))
def test_exact_kmatrix_search_matches_brute_force(alphas, c1, c2):
    A_ = system(alphas, 2)
    k_max = 6
    result = optimize.kmatrix_exact(A_, [c1, c2], k_max)
    best = max(
        analytic.ewif_kmatrix([[0, a, b], [0, 0, d], [0, 0, 0]], A_, [1, c1, c2])
        for a, b, d in itertools.product(range(k_max + 1), repeat=3)
        if a + b > 0
    )
    assert result.ewif == pytest.approx(max(best, 1.0), rel=1e-12)
    grid = optimize.kmatrix_grid(A_, [c1, c2], k_max)
    assert grid.ewif <= result.ewif * (1 + 1e-12)


def test_exact_search_three_drafters_and_grid_baseline():
    A_ = system([0.85, 0.7, 0.75, 0.5, 0.55, 0.6], 3)
    exact = optimize.kmatrix_exact(A_, [0.15, 0.04, 0.0], 8)
    grid = optimize.kmatrix_grid(A_, [0.15, 0.04, 0.0], 8)
    assert exact.ewif >= grid.ewif - 1e-12
    assert exact.evaluations > grid.evaluations
    assert analytic.ewif_kmatrix(exact.K, A_, [1, 0.15, 0.04, 0.0]) == pytest.approx(exact.ewif)


@given(st.floats(0.0, 1.0), st.floats(0.0, 2.0), st.integers(0, optimize.EXACT_ENTRY_MAX))
@example(0.99999, 0.0, 4)  # found by hypothesis: the K matrix's 1 - a^k cancelled near a = 1 (1.2e-12 apart)
def test_one_drafter_kmatrix_is_the_best_fixed_k(alpha, c, k_max):
    """With one drafter the K matrix is [[0, k], [0, 0]] ([CSD]'s 1x1 [[k]]): the exact search
    finds the closed form's best fixed k and its EWIF (a different k only at an exact tie)."""
    A_ = system([alpha], 1)
    result = optimize.kmatrix_exact(A_, [c], k_max)
    k, best = analytic.optimal_k(alpha, c, k_max)
    assert result.K.shape == (2, 2) and result.K[1].tolist() == [0, 0] and result.K[0, 0] == 0
    assert result.ewif == pytest.approx(float(best), rel=1e-12, abs=0)
    if result.K[0, 1] != k:  # a tie: both draft lengths give the optimum
        assert analytic.ewif(alpha, c, int(result.K[0, 1])) == pytest.approx(analytic.ewif(alpha, c, int(k)), rel=1e-12)
    grid = optimize.kmatrix_grid(A_, [c], k_max)
    assert 0 <= grid.K[0, 1] <= k_max and grid.ewif <= result.ewif * (1 + 1e-12)


def test_one_drafter_kmatrix_examples():
    A_ = system([0.6], 1)
    assert optimize.kmatrix_exact(A_, [0.05]).K.tolist() == [[0, 4], [0, 0]]
    assert optimize.kmatrix_exact(system([0.0], 1), [0.5]).K.tolist() == [[0, 0], [0, 0]]  # drafting never helps
    zero = optimize.kmatrix_grid(A_, [0.05], k_max=0)  # the grid may not start outside 0..k_max
    assert zero.K.tolist() == [[0, 0], [0, 0]] and zero.ewif == 1.0


@pytest.mark.parametrize("k_max", ["20", "0"])
def test_optimize_kmatrix_one_drafter_cli(capsys, k_max):
    status, out, err = run(capsys, "optimize", "kmatrix", "--cost", "0.05", "--alpha", "0.6", "--k-max", k_max, "--json")
    assert status == 0, err
    data = json.loads(out)
    k, best = analytic.optimal_k(0.6, 0.05, int(k_max))
    assert data["exact"]["K"] == [[0, int(k)], [0, 0]] and data["exact"]["ewif"] == pytest.approx(float(best), rel=1e-12)
    assert data["best_single_drafter"] == {"drafter": 1, "k": int(k), "ewif": pytest.approx(float(best), rel=1e-12)}
    assert data["grid"]["ewif"] <= data["exact"]["ewif"] * (1 + 1e-12)
    status, out, err = run(capsys, "optimize", "kmatrix", "--cost", "0.05", "--alpha", "0.6", "--k-max", k_max)
    assert status == 0 and "exact search (optimum)" in out, err


def test_mc_evaluator_uses_common_random_numbers():
    A_ = system([0.85, 0.5, 0.55], 2)
    ev = optimize.mc_evaluator(A.Bernoulli(A_), [0.15, 0.0], tokens=20_000, seed=5)
    K = np.array([[0, 2, 0], [0, 0, 3], [0, 0, 0]])
    assert ev(K) == ev(K)
    result = optimize.kmatrix_grid(A_, [0.15, 0.0], 6, evaluate=ev)
    assert result.ewif > 1.0


@given(probs, probs, st.floats(0.0, 0.5), st.floats(0.0, 0.5), st.floats(0.0, 1.0), st.integers(1, 12))
def test_theorem_4_4_no_random_interpolation_beats_deterministic(a1, a2, c1, c2, lam, k):
    """[CSD] Theorem 4.4: drafting each position with drafter 1 w.p. λ, else drafter 2, never
    beats the best deterministic horizontal allocation (same bound on the draft length)."""
    # E[tokens] with i.i.d. mixing: α per position = λ a1 + (1 − λ) a2; E[cost] likewise.
    a_mix = lam * a1 + (1 - lam) * a2
    c_mix = lam * c1 + (1 - lam) * c2
    mixed = analytic.ewif(a_mix, c_mix, k)
    best = analytic.optimal_horizontal([(a1, c1), (a2, c2)], k).ewif
    assert mixed <= best * (1 + 1e-12)


# ---------------------------------------------------------------- the MDP and the oracle


def test_mdp_bernoulli_is_best_fixed_k():
    sol = mdp.solve_bernoulli(0.8, 0.05, 1.0, 32)
    k = np.arange(33)
    assert sol.latency_per_token == pytest.approx(((k * 0.05 + 1) / analytic.expected_tokens(0.8, k)).min(), rel=1e-12)
    assert sol.threshold["is_threshold"]


MARKOV = ([[0.95, 0.05], [0.2, 0.8]], [0.95, 0.3])


def test_mdp_optimal_no_worse_than_every_fixed_k_and_threshold():
    T, a = MARKOV
    opt = mdp.solve_markov(T, a, 0.05, 1.0, 16)
    for k in range(0, 17):
        assert opt.latency_per_token <= mdp.solve_markov(T, a, 0.05, 1.0, 16, ("fixed", k)).latency_per_token + 1e-12
    for h in np.linspace(0, 1, 21):
        assert opt.latency_per_token <= mdp.solve_markov(T, a, 0.05, 1.0, 16, ("threshold", h)).latency_per_token + 1e-12
    cmp = mdp.compare_policies(T, a, 0.05, 1.0, 16, thresholds=np.linspace(0, 1, 21))
    assert cmp["oracle"] <= cmp["optimal"] <= cmp["best_threshold"]["latency_per_token"] <= cmp["autoregressive"]
    assert cmp["optimal"] <= cmp["best_fixed_k"]["latency_per_token"]


@st.composite
def regime_chains(draw):
    """A stochastic matrix over 1-3 regimes with one closed class (some rows may be absorbing)."""
    n = draw(st.integers(1, 3))
    while True:
        rows = [draw(st.lists(st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.0]), min_size=n, max_size=n)) for _ in range(n)]
        T = np.array([np.asarray(r) / sum(r) if sum(r) else np.eye(n)[i] for i, r in enumerate(rows)])
        if len(closed_classes(T)) == 1:
            return T


@settings(max_examples=40, deadline=None)
@given(regime_chains(), st.lists(st.floats(0.0, 0.99), min_size=3, max_size=3), st.sampled_from([0.02, 0.1, 0.4]))
def test_mdp_optimum_never_worse_than_a_fixed_k_on_any_single_class_chain(T, alphas, c):
    """Absorbing or transient regimes included: the optimum is the best policy, so no fixed k
    (nor autoregression) beats it under the same model."""
    a = alphas[:len(T)]
    opt = mdp.solve_markov(T, a, c, 1.0, 8).latency_per_token
    for k in range(9):
        assert opt <= mdp.solve_markov(T, a, c, 1.0, 8, ("fixed", k)).latency_per_token + 1e-9


def test_closed_classes_and_multichain_refusal():
    assert closed_classes([[1.0, 0.0], [0.0, 1.0]]) == [[0], [1]]
    assert closed_classes([[1.0, 0.0], [0.5, 0.5]]) == [[0]]
    assert closed_classes([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.2, 0.2, 0.6]]) == [[0, 1]]
    with pytest.raises(DraftsimError, match=r"regimes \{0\} and \{1\}"):
        mdp.solve_markov([[1.0, 0.0], [0.0, 1.0]], [0.9, 0.3], 0.05, 1.0, 8)
    with pytest.raises(DraftsimError, match="closed classes"):
        A.MarkovModulated([[1.0, 0.0], [0.0, 1.0]], [0.9, 0.3])


@pytest.mark.slow  # 11.4 s measured (pytest --durations, 2-core machine)
@pytest.mark.parametrize("rule", [("fixed", 6), ("threshold", 0.7)])
def test_mdp_policy_evaluation_matches_simulation(rule):
    T, a = MARKOV
    exact = mdp.solve_markov(T, a, 0.05, 1.0, 16, rule).latency_per_token
    policy = P.FixedK(rule[1]) if rule[0] == "fixed" else P.Threshold(rule[1], 16)
    est = simulate(policy, A.MarkovModulated(T, a), 0.05, 2_000_000, seed=11, n_sequences=32).metrics["latency_per_token"]
    assert abs(est.value - exact) <= Z * est.se


def test_mdp_positional_and_trace():
    sol = mdp.solve_positional([0.9, 0.8, 0.6, 0.4], 0.1, 1.0, 8)
    k = int(sol.policy.split()[1])
    alphas = np.array([0.9, 0.8, 0.6, 0.4, 0.4, 0.4, 0.4, 0.4])
    lat = [(j * 0.1 + 1) / (1 + np.cumprod(alphas[:j]).sum()) for j in range(9)]
    assert sol.latency_per_token == pytest.approx(min(lat)) and k == int(np.argmin(lat))
    rng = np.random.default_rng(0)
    probs = [rng.uniform(0.2, 1.0, 200) for _ in range(3)]
    opt = mdp.solve_trace(probs, 0.05, 1.0, 12)
    for k in range(0, 13):
        assert opt.latency_per_token <= mdp.solve_trace(probs, 0.05, 1.0, 12, ("fixed", k)).latency_per_token + 1e-12
    for h in (0.3, 0.6, 0.9):
        assert opt.latency_per_token <= mdp.solve_trace(probs, 0.05, 1.0, 12, ("threshold", h)).latency_per_token + 1e-12


def test_oracle_bounds_every_policy_on_flags():
    rng = np.random.default_rng(1)
    flags = [(rng.random(400) < 0.75).astype(int) for _ in range(4)]
    oracle = mdp.oracle_latency(flags, 0.05, 1.0)
    # Hand count: N_target = rejections (+1 when a sequence ends in a match), N_discarded = 0.
    rej = sum(int((f == 0).sum()) for f in flags)
    ends = sum(int(f[-1] == 1) for f in flags)
    assert oracle["n_target"] == rej + ends and oracle["n_discarded"] == 0
    for policy in (P.FixedK(1), P.FixedK(4), P.FixedK(8), P.Heuristic()):
        r = simulate(policy, A.TraceDriven([f.astype(float) for f in flags]), 0.05, 1600)
        assert oracle["latency_per_token"] <= r.metrics["latency_per_token"].value + 1e-12
    trace_opt = mdp.solve_trace([f.astype(float) for f in flags], 0.05, 1.0, 16)
    assert oracle["latency_per_token"] <= trace_opt.latency_per_token + 1e-12


@settings(max_examples=40, deadline=None)
@given(st.floats(0.3, 0.95), st.floats(0.01, 0.3), st.floats(0.0, 0.1))
def test_cheaper_drafts_and_higher_alpha_never_shorten_the_optimal_k(alpha, c, delta):
    """Hypothesis: lowering the draft cost, or raising α, never shortens the optimal k."""
    k0, _ = analytic.optimal_k(alpha, c, 64)
    k_cheaper, _ = analytic.optimal_k(alpha, max(c - delta, 0.0), 64)
    k_better, _ = analytic.optimal_k(min(alpha + delta, 0.999), c, 64)
    assert k_cheaper >= k0 and k_better >= k0


# ---------------------------------------------------------------- trees and lenience


def brute_force_tree(p, n_nodes):
    """Best expected accepted tokens over all trees of n nodes (parents before children)."""
    best = 0.0
    for parents in itertools.product(*[range(-1, i) for i in range(n_nodes)]):
        rank, value, ok = {}, [0.0] * n_nodes, True
        for i, par in enumerate(parents):
            r = rank.get(par, 0)
            if r >= len(p):
                ok = False
                break
            rank[par] = r + 1
            value[i] = p[r] * (1.0 if par < 0 else value[par])
        if ok:
            best = max(best, sum(value))
    return best


@pytest.mark.parametrize("n_nodes", [1, 2, 3, 4, 5])
def test_tree_dp_matches_brute_force(n_nodes):
    ranks = [0.6, 0.5, 0.3]
    p = optimize._rank_probs(ranks)
    shape = optimize.tree_shape(ranks, n_nodes, cost=lambda n: 1.0 if n <= n_nodes + 1 else 1e9)
    # With a flat cost the best tree uses the whole budget.
    assert shape.expected_accepted == pytest.approx(brute_force_tree(p, n_nodes), rel=1e-12)


def test_tree_beats_chain_with_cheap_parallel_verification():
    ranks = [0.6, 0.4, 0.3, 0.2]
    cost = lambda n: 1.0 + 0.002 * n  # noqa: E731
    tree = optimize.tree_shape(ranks, 64, cost)
    chain = max((optimize.chain_value(ranks, k, cost) for k in range(65)), key=lambda s: s.tokens_per_time)
    assert tree.tokens_per_time >= chain.tokens_per_time
    assert tree.size <= 64


def test_choose_lenience_meets_budget():
    rng = np.random.default_rng(2)
    rows = [(rng.dirichlet(np.ones(8) * 0.5), rng.dirichlet(np.ones(8) * 0.5)) for _ in range(300)]
    for factory in (rules.Chow, rules.Diff, rules.OPT):
        out = optimize.choose_lenience(factory, rows, 0.1)
        assert out["rate"] <= 0.1 + 1e-9
        if out["alpha"] > 0:  # slightly less lenient would break the budget
            q = np.stack([r[0] for r in rows])
            p = np.stack([r[1] for r in rows])
            assert factory(max(out["alpha"] - 1e-3, 0)).rejection_rate(q, p).mean() > 0.1 - 1e-3
    with pytest.raises(DraftsimError):
        optimize.choose_lenience(rules.Chow, rows, 1.5)


def test_noisy_predictor_mdp_reduces_to_observed_and_is_bracketed():
    T, a = MARKOV
    # A noiseless predictor (identity emission) is the observed-regime MDP, for every policy.
    for rule in (None, ("fixed", 6), ("threshold", 0.7)):
        noisy = mdp.solve_noisy_markov(T, a, np.eye(2), a, 0.05, 1.0, 8, rule).latency_per_token
        assert noisy == pytest.approx(mdp.solve_markov(T, a, 0.05, 1.0, 8, rule).latency_per_token, rel=1e-10)
    E, values = mdp.predictor_emission(T, a, 1.0, 3)
    noisy = mdp.solve_noisy_markov(T, a, E, values, 0.05, 1.0, 8)
    observed = mdp.solve_markov(T, a, 0.05, 1.0, 8).latency_per_token
    blind = mdp.solve_noisy_markov(T, a, np.full((2, 2), 0.5), [0.8, 0.8], 0.05, 1.0, 8).latency_per_token
    assert observed <= noisy.latency_per_token <= blind
    # ... and no worse than any threshold on the noisy predictor.
    for h in (0.3, 0.5, 0.7, 0.9):
        assert noisy.latency_per_token <= mdp.solve_noisy_markov(T, a, E, values, 0.05, 1.0, 8, ("threshold", h)).latency_per_token + 1e-12
