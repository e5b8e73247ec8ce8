"""Monte Carlo and DES engines against the closed forms, against each other, and themselves."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim import acceptance as A
from draftsim.sim import analytic
from draftsim.sim import policies as P
from draftsim.sim.errors import DraftsimError
from draftsim.sim.simulate import simulate

Z = 4.0  # agreement within Z standard errors

# (policy, process, drafter costs, analytic EWIF)
SETTINGS = [
    (P.FixedK(k), A.Bernoulli(a), c, analytic.ewif(a, c, k))
    for a, c, k in [(0.8, 0.05, 5), (0.6, 0.1, 3), (0.9, 0.02, 10), (0.5, 0.2, 1), (0.95, 0.0, 16), (0.3, 0.01, 2), (0.0, 0.1, 4), (1.0, 0.1, 6)]
] + [
    (P.HorizontalCascade((1, 2), counts), A.Bernoulli([[0, 0, 0], [a1, 0, 0], [a2, 0, 0]]), [c1, c2], analytic.ewif_horizontal([(a1, c1), (a2, c2)], counts))
    for a1, c1, a2, c2, counts in [(0.85, 0.15, 0.65, 0.02, (3, 5)), (0.9, 0.3, 0.5, 0.01, (2, 2)), (0.7, 0.1, 0.6, 0.05, (1, 6)), (0.8, 0.1, 0.7, 0.0, (4, 0))]
] + [
    (
        P.VerticalCascade([[0, n, 0], [0, 0, k], [0, 0, 0]]),
        A.Bernoulli([[0, 0, 0], [a, 0, 0], [0.0, a_in, 0]]),
        [c1, c2],
        analytic.ewif_vertical(a, c1, n, a_in, c2, k),
    )
    for a, c1, n, a_in, c2, k in [
        (0.85, 0.15, 4, 0.55, 0.0, 10),
        (0.7, 0.1, 2, 0.6, 0.0, 3),
        (0.9, 0.2, 3, 0.8, 0.01, 5),
        (0.6, 0.05, 1, 0.5, 0.0, 2),
        (0.8, 0.3, 5, 0.9, 0.0, 8),
        (0.75, 0.1, 3, 0.0, 0.0, 4),
    ]
] + [
    (P.Autoregressive(), A.Bernoulli(0.7), 0.1, 1.0),
    (P.FixedK(4), A.Positional([0.8]), 0.05, analytic.ewif(0.8, 0.05, 4)),
    (P.FixedK(3), A.Positional([0.9, 0.7, 0.5]), [0.1], analytic.ewif_positional([0.9, 0.7, 0.5], [0.1] * 3)),
]


@pytest.mark.slow  # 41.0 s measured (pytest --durations, 2-core machine, total of 48 items)
@pytest.mark.parametrize("engine", ["mc", "des"])
@pytest.mark.parametrize("policy, process, costs, expected", SETTINGS, ids=[repr(s[0]) for s in SETTINGS])
def test_engines_agree_with_analytic_ewif(engine, policy, process, costs, expected):
    kw = {"requests": 32} if engine == "des" else {}
    r = simulate(policy, process, costs, 200_000, engine=engine, seed=7, **kw)
    est = r.metrics["ewif"]
    assert abs(est.value - expected) <= Z * est.se + 1e-12, f"{est} vs {expected}"
    # SWI equals EWIF under constant per-call costs.
    assert r.metrics["swi"].value == pytest.approx(est.value, rel=1e-12)


@pytest.mark.slow  # 7.5 s measured (pytest --durations, 2-core machine)
def test_largest_disagreement_is_reported(capsys):
    """Print the largest |simulated − analytic| / SE over the settings (for the closing note)."""
    worst = max(
        abs(r.metrics["ewif"].value - expected) / max(r.metrics["ewif"].se, 1e-300)
        for policy, process, costs, expected in SETTINGS
        for r in [simulate(policy, process, costs, 200_000, seed=11)]
        if r.metrics["ewif"].se > 0
    )
    print(f"largest MC disagreement with the analytic EWIF: {worst:.2f} standard errors")
    assert worst <= Z


def test_rates_match_fixed_k_formulas():
    r = simulate(P.FixedK(6), A.Bernoulli(0.75), 0.05, 400_000, seed=3)
    discard, verify = analytic.fixed_k_rates(0.75, 6)
    for name, expected in (("discard_rate", discard), ("verification_rate", verify), ("tokens_per_call", analytic.expected_tokens(0.75, 6))):
        est = r.metrics[name]
        assert abs(est.value - expected) <= Z * est.se, (name, est, expected)
    # Acceptance by position: P(position i accepted | drafted) = α^(i+1) / α^i ... = cumulative α^(i+1)
    np.testing.assert_allclose(r.acceptance_by_position, 0.75 ** np.arange(1, 7), atol=0.01)


def test_des_one_request_agrees_with_mc_time_per_token():
    policy, process = P.FixedK(5), A.Bernoulli(0.8)
    mc = simulate(policy, process, 0.05, 300_000, seed=1)
    des = simulate(policy, process, 0.05, 300_000, engine="des", seed=2)
    t_mc = mc.metrics["latency_per_token"]
    t_des = des.requests["makespan"] / des.tokens
    assert abs(t_des - t_mc.value) <= Z * t_mc.se * np.sqrt(2) * 3  # DES alone has no SE: 1 sequence
    assert des.requests["utilisation"]["device"] == pytest.approx(1.0)


def test_markov_process_reproduces_stationary_acceptance():
    """Along the text, the fraction of positions whose token would be accepted is the
    stationary rate π·α. (Per *drafted* token it differs: which positions get drafted
    depends on earlier acceptances — a bonus position is never drafted.)"""
    process = A.MarkovModulated([[0.95, 0.05], [0.2, 0.8]], [0.95, 0.3])
    expected = process.stationary_alpha()
    assert expected == pytest.approx(0.8 * 0.95 + 0.2 * 0.3)
    rng = np.random.default_rng(4)
    n_seq, length = 400, 2000
    track = process.start(n_seq, length, rng)
    seq = np.repeat(np.arange(n_seq), length)
    pos = np.tile(np.arange(length), n_seq)
    accepted = rng.random(seq.size) < track.prob(1, 0, seq, pos, np.zeros_like(pos))
    per_seq = accepted.reshape(n_seq, length).mean(axis=1)
    se = per_seq.std(ddof=1) / np.sqrt(n_seq)
    assert abs(per_seq.mean() - expected) <= Z * se
    np.testing.assert_allclose(np.bincount(track.regimes.ravel(), minlength=2) / track.regimes.size, [0.8, 0.2], atol=0.01)


@pytest.mark.slow  # 11.8 s measured (pytest --durations, 2-core machine)
def test_same_seed_identical_results():
    for policy, process in [
        (P.FixedK(5), A.Bernoulli(0.8)),
        (P.Threshold(0.6, 12), A.MarkovModulated([[0.9, 0.1], [0.3, 0.7]], [0.9, 0.4], pred_noise=0.5)),
        (P.Heuristic(), A.Bernoulli(0.7)),
    ]:
        for engine in ("mc", "des"):
            a = simulate(policy, process, 0.05, 50_000, engine=engine, seed=42, requests=4)
            b = simulate(policy, process, 0.05, 50_000, engine=engine, seed=42, requests=4)
            assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
            np.testing.assert_array_equal(a.counts.calls, b.counts.calls)


@pytest.mark.slow  # 14.4 s measured (pytest --durations, 2-core machine)
def test_threshold_and_confidence_policies_stop_early_when_acceptance_drops():
    process = A.MarkovModulated([[0.9, 0.1], [0.1, 0.9]], [0.95, 0.2], pred_noise=0.0, conf_noise=0.0)
    fixed = simulate(P.FixedK(8), process, 0.05, 200_000, seed=5)
    thr = simulate(P.Threshold(0.5, 8), process, 0.05, 200_000, seed=5)
    conf = simulate(P.ConfidenceStop(0.5, 8), process, 0.05, 200_000, seed=5)
    assert thr.metrics["discard_rate"].value < fixed.metrics["discard_rate"].value
    assert conf.metrics["discard_rate"].value < fixed.metrics["discard_rate"].value
    assert thr.metrics["ewif"].value > fixed.metrics["ewif"].value


def test_heuristic_schedule():
    policy = P.Heuristic(k=3, k_max=10)
    state = policy.init(3)
    policy.end_round(state, np.array([3, 3, 3]), np.array([3, 1, 0]))
    np.testing.assert_array_equal(state["K"], [5, 2, 2])
    policy.end_round(state, np.array([5, 2, 2]), np.array([0, 0, 0]))
    np.testing.assert_array_equal(state["K"], [4, 1, 1])


def test_tree_policy_matches_level_acceptance():
    ranks = [0.6, 0.5]
    level = 1 - (1 - 0.6) * (1 - 0.5)
    r = simulate(P.Tree(2, 3), A.Bernoulli(0.6, rank_alphas=ranks), 0.02, 200_000, seed=6)
    est = r.metrics["tokens_per_call"]
    assert abs(est.value - analytic.expected_tokens(level, 3)) <= Z * est.se


def test_trace_driven_replay_counts():
    """Hand-computed: flags 1,1,0,1 | 1 with k = 2 emit rounds (1,1)+bonus ... see below."""
    # Sequence: positions 0..5 with greedy match flags.
    flags = [np.array([1, 1, 0, 1, 1, 0], dtype=float)]
    r = simulate(P.FixedK(2), A.TraceDriven(flags), 0.1, 6)
    # Round 1 at pos 0: drafts pos 0,1 -> both accepted, bonus at pos 2 -> 3 tokens.
    # Round 2 at pos 3: drafts pos 3,4 -> both accepted, bonus at pos 5 -> 3 tokens. Done (6).
    c = r.counts
    assert c.tokens.tolist() == [6] and c.rounds.tolist() == [2]
    assert c.calls[0].tolist() == [2, 4] and c.top_accepted.tolist() == [4]
    flags = [np.array([1, 0, 1, 1, 1], dtype=float)]
    r = simulate(P.FixedK(3), A.TraceDriven(flags), 0.1, 5)
    # Round 1: pos 0 ok, pos 1 rejected -> 2 tokens. Round 2 at pos 2: 2,3,4 ok -> 3 drafted + bonus,
    # capped at the end of the text (3 tokens).
    assert r.counts.tokens.tolist() == [5] and r.counts.rounds.tolist() == [2]
    assert r.counts.top_accepted.tolist() == [4] and r.counts.top_drafted.tolist() == [6]


def test_des_timeline_and_concurrency(tmp_path):
    r = simulate(P.FixedK(4), A.Bernoulli(0.8), 0.1, 20_000, engine="des", requests=8, rate=0.05, separate_drafter=True, timeline=True, seed=3)
    tl = r.timeline
    assert len(tl) > 0 and set(tl.resource) == {"device", "drafter"}
    # The target's device never runs two verifications at once.
    spans = sorted((s, e) for s, e, res in zip(tl.start, tl.end, tl.resource) if res == "device")
    assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:]))
    assert 0 < r.requests["utilisation"]["device"] <= 1
    assert r.requests["latency_p50"] <= r.requests["latency_p99"]
    path = r.save_timeline(tmp_path / "tl.json")
    data = json.loads(path.read_text())
    assert data["version"] == 1 and len(data["start"]) == len(tl)


def test_linear_cost_model_changes_ewif_not_swi():
    from draftsim.sim.cost.linear import CallCost, Costs

    costs = Costs((CallCost(1.0, 0.05), CallCost(0.05)))
    r = simulate(P.FixedK(8), A.Bernoulli(0.8), costs, 100_000, seed=1)
    assert r.metrics["ewif"].value < r.metrics["swi"].value


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: P.parse_policy("fastest:k=3"), "unknown policy 'fastest'"),
        (lambda: P.parse_policy("fixed:k"), "expected KEY=VALUE"),
        (lambda: P.parse_policy("fixed:q=3"), "unknown parameter 'q'"),
        (lambda: P.parse_policy("fixed:k=x"), "k='x' is not a valid value"),
        (lambda: P.parse_policy("fixed"), "policy fixed needs k"),
        (lambda: P.parse_policy("fixed:k=-1"), "k must be an integer in [0, 256]; got -1"),
        (lambda: P.VerticalCascade([[0, 2], [0, 0], [0, 0]]), "K must be a square matrix"),
        (lambda: P.VerticalCascade([[0, -2], [0, 0]]), "K must be an integer in [0, 256]"),
        (lambda: P.VerticalCascade([[0, 1], [1, 0]]), "strictly upper triangular"),
        (lambda: simulate(P.FixedK(3), A.Bernoulli(0.8), [], 100), "cost"),
        (lambda: simulate(P.HorizontalCascade((1, 2), (2, 2)), A.Bernoulli(0.8), [0.1], 100), "costs were given for 2"),
        (lambda: simulate(P.FixedK(3), A.Bernoulli(0.8), 0.1, 100, engine="des", rate=0), "rate must be finite and > 0"),
        (lambda: simulate(P.FixedK(3), A.Bernoulli(0.8), 0.1, 100, engine="gpu"), "engine must be one of"),
        (lambda: A.MarkovModulated([[0.5, 0.4], [0.1, 0.9]], [0.9, 0.1]), "rows must sum to 1"),
        (lambda: A.Bernoulli([[0.5, 0.4, 0.1]]), "square matrix"),
    ],
)
def test_bad_input(call, fragment):
    with pytest.raises(DraftsimError) as info:
        call()
    assert fragment in str(info.value)


def test_policy_mini_language_round_trip():
    assert P.parse_policy("fixed:k=5") == P.FixedK(5)
    assert P.parse_policy("ar") == P.Autoregressive()
    assert P.parse_policy("threshold:h=0.7,kmax=12") == P.Threshold(0.7, 12)
    assert P.parse_policy("horizontal:counts=3,5") == P.HorizontalCascade((1, 2), (3, 5))
    assert P.parse_policy("vertical:n=4,k=10,leniency=2") == P.VerticalCascade([[0, 4, 0], [0, 0, 10], [0, 0, 0]], 2.0)
    assert P.parse_policy("vertical:K=0,4,0;0,0,10;0,0,0") == P.VerticalCascade([[0, 4, 0], [0, 0, 10], [0, 0, 0]])
    assert P.parse_policy("tree:width=2,depth=3") == P.Tree(2, 3)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 8), st.floats(0.01, 0.99), st.integers(1, 300), st.integers(1, 400), st.integers(0, 2**32 - 1))
def test_lazy_pools_draw_the_same_rounds_and_leave_the_stream_where_the_whole_pool_would(k, alpha, n, tokens, seed):
    """montecarlo._deal draws only the rounds a quota needs when each round takes one uniform,
    and skips the rest of the pool's uniforms: bit-identical rounds and later draws."""
    from draftsim.sim import montecarlo

    policy, process = P.FixedK(k), A.Bernoulli(alpha)
    assert montecarlo._one_uniform_per_round(policy, process, np.random.default_rng(0)) > 0
    lazy_rng, full_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    lazy = montecarlo.rounds(policy, process, n, tokens, lazy_rng)
    real = montecarlo._one_uniform_per_round
    try:
        montecarlo._one_uniform_per_round = lambda *a: 0.0
        full = montecarlo.rounds(policy, process, n, tokens, full_rng)
    finally:
        montecarlo._one_uniform_per_round = real
    for name in ("bounds", "emitted", "calls", "call_tokens"):
        np.testing.assert_array_equal(getattr(lazy, name), getattr(full, name), err_msg=name)
    np.testing.assert_array_equal(lazy_rng.random(3), full_rng.random(3))
