"""analysis.servecheck: the pieces check-serve builds its prediction from — robust fits of
the server's calls, the realised acceptance of a served run, the loop's busy gaps.

``check_serve`` on a real served trace, StepCost's pricing and a robust fit with stalls are
tested in tests/realrun/test_real_serving.py (real models).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from draftsim.analysis.servecheck import AffineCost, busy_gaps, realised_process, robust_nnls
from draftsim.sim.cost import BatchStats


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.0, 2.0), min_size=3, max_size=3), st.integers(0, 1000))
def test_robust_nnls_recovers_exact_nonnegative_coefficients(coef, seed):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(60), rng.uniform(1, 50, 60), rng.uniform(0, 10, 60)])
    fit = robust_nnls(X, X @ np.array(coef))
    np.testing.assert_allclose(X @ fit, X @ np.array(coef), rtol=1e-7, atol=1e-9)
    assert np.all(fit >= 0)


def test_a_few_stalls_do_not_drag_the_fit():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 64, 300).astype(float)
    y = 0.01 + 0.002 * n + rng.normal(0, 1e-4, 300)
    y[::50] += 0.5  # six stalls of a busy machine
    a, b = robust_nnls(np.column_stack([np.ones(300), n]), y)
    plain = np.linalg.lstsq(np.column_stack([np.ones(300), n]), y, rcond=None)[0]
    assert a == pytest.approx(0.01, abs=1e-3) and b == pytest.approx(0.002, rel=0.02)
    assert abs(plain[0] - 0.01) > 10 * abs(a - 0.01)


def test_affine_cost_fits_and_prices_batch_sums():
    rng = np.random.default_rng(1)
    B = rng.integers(1, 8, 100)
    N = B * rng.integers(1, 6, 100)
    P = N * rng.integers(10, 500, 100)
    seconds = 0.02 + 0.001 * B + 0.0005 * N + 0.003 * P / 1e3
    cost = AffineCost.fit(B, N, P, seconds)
    assert (cost.a, cost.b, cost.c, cost.d) == pytest.approx((0.02, 0.001, 0.0005, 0.003), rel=1e-6, abs=1e-9)
    stats = BatchStats.of_batch([[3, 3]], [[100, 200]])
    assert cost.stats_time(stats)[0] == pytest.approx(0.02 + 0.002 + 0.003 + 0.003 * float(stats.pairs[0]) / 1e3)


def test_realised_process_replays_each_requests_rounds():
    """Request 7 (6 output tokens: 5 after the first) had rounds drafting 3 (2 accepted, 3
    emitted) and 3 (all accepted, 4 emitted: only 2 fit)."""
    requests = [SimpleNamespace(request=7, output_tokens=6), SimpleNamespace(request=3, output_tokens=2)]
    members = [SimpleNamespace(step=0, request=7, prefill=True, drafted=0, accepted=0, emitted=1),
               SimpleNamespace(step=1, request=7, prefill=False, drafted=3, accepted=2, emitted=3),
               SimpleNamespace(step=2, request=7, prefill=False, drafted=3, accepted=3, emitted=4),
               SimpleNamespace(step=1, request=3, prefill=False, drafted=3, accepted=0, emitted=1)]
    process = realised_process(requests, members, 3)
    assert process.n_sequences == 2 and list(process.lengths) == [1, 5]  # in request-id order
    first, second = process.data[(1, 0)]
    assert first.tolist() == [0.0] and second.tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    r3, r7 = process.rounds[(1, 0)]
    np.testing.assert_array_equal(r3, [[0.0, np.nan, np.nan]])  # the draft beyond the output is not recorded
    np.testing.assert_array_equal(r7[0], [1.0, 1.0, 0.0])  # round starts at output position 0 and 3
    np.testing.assert_array_equal(r7[3], [1.0, 1.0, np.nan])
    assert np.isnan(r7[[1, 2, 4]]).all()


def test_busy_gaps_count_only_time_with_work_to_do():
    steps = [SimpleNamespace(start=0.0, end=1.0), SimpleNamespace(start=1.2, end=2.0), SimpleNamespace(start=5.5, end=6.0)]
    # one request running until 2.0, the next arriving at 5.0 (the server sleeps until then)
    requests = [SimpleNamespace(arrival=0.0, admitted=0.0, finish=2.0), SimpleNamespace(arrival=5.0, admitted=5.5, finish=6.0)]
    np.testing.assert_allclose(busy_gaps(steps, requests), [0.2, 0.5, 0.0])


def _bucketed_profile():
    """A profile of the static path on a grid whose times are a function of the padded shape only
    (batch and new tokens to the next power of two, attention to the next power of two >= the
    longest row after the call, at least 16): what a static cache computes."""
    from draftsim.sim.cost import ProfileCost
    from draftsim.sim.cost.profile import pow2

    batch, new, context = (1, 2, 4, 8, 16, 24, 32), (1, 2, 3, 4, 6, 8), (0, 128, 256, 384, 512, 768, 1024, 1280)

    def shape_time(b, n, c):
        return 1e-3 * (5.0 + 0.2 * pow2(b) + 0.1 * pow2(n) + 1e-3 * pow2(b) * np.maximum(pow2(c + pow2(n)), 16))

    B, N, C = np.meshgrid(batch, new, context, indexing="ij")
    return ProfileCost(model="m", batch=batch, new_tokens=new, context=context, seconds=shape_time(B, N, C), extrapolate="clamp"), \
        shape_time


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 32), st.integers(1, 8), st.integers(0, 1270 - 8))
def test_a_static_cache_step_is_priced_at_its_padded_shape(B, n, c):
    """StepCost with static_rows prices a verification at the grid point of its padded shape
    (exact on a profile that is a function of the padded shape, wherever the grid holds a point of
    that shape)."""
    from draftsim.analysis.servecheck import StepCost
    from draftsim.sim.cost.profile import pow2

    prof, truth = _bucketed_profile()
    T = max(pow2(c + pow2(n)), 16)
    assume(any(max(pow2(g + pow2(n)), 16) == T for g in prof.context))  # the grid holds a point of this padded shape
    static = StepCost(prof, 0.0, 0.0, 4, static_rows=32, static_tokens=1270)
    got = float(static._static(B, n, c))
    assert got == pytest.approx(float(truth(B, n, c)), rel=1e-12)


def test_interpolating_between_padded_shapes_underprices_a_static_step():
    from draftsim.analysis.servecheck import StepCost

    prof, truth = _bucketed_profile()
    plain, static = StepCost(prof, 0.0, 0.0, 4), StepCost(prof, 0.0, 0.0, 4, static_rows=32, static_tokens=1270)
    want = float(truth(17, 1, 600))  # 32 rows x 1 token over 1,024 slots
    assert float(static._static(17, 1, 600)) == pytest.approx(want, rel=1e-12)
    assert float(plain._call(17, 1, 600)) < 0.7 * want  # mostly the 16-row bucket's time


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 900), st.integers(1, 3))
def test_a_static_cache_prefill_is_priced_at_the_tokens_it_computes(n, joiners):
    """A joiner's prefill through a static cache computes its prompt padded to the next power of two
    where that fits the cache, else at its own length (StaticKV.forward); the step's prefills are
    priced there, joiner by joiner, on a prefill profile whose time is a function of the tokens
    computed (the H200's: 48 prompt tokens cost what 64 do)."""
    from draftsim.analysis.servecheck import StepCost
    from draftsim.sim.cost import ProfileCost
    from draftsim.sim.cost.profile import pow2

    new = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    prefill = ProfileCost(model="m", batch=(1,), new_tokens=new, context=(0,),
                          seconds=np.array([[[1e-3 * (2.0 + 0.1 * t)] for t in new]]), extrapolate="clamp")
    prof, _ = _bucketed_profile()
    width = 1000
    static = StepCost(prof, 0.0, 0.0, 4, prefill=prefill, static_rows=32, static_tokens=width)
    computed = pow2(n) if pow2(n) <= width else n
    assert float(static._prefill_tokens(n)) == computed
    stats = BatchStats(np.float64(joiners), np.float64(joiners * n), np.float64(0.0), np.float64(0.0),
                       padded=np.zeros(3), prefill=np.array([joiners, joiners * n], dtype=np.float64))
    # a padded count is a grid point, priced as measured; a prompt run at its own length, as the profile interpolates it
    each = 1e-3 * (2.0 + 0.1 * computed) if computed in new else float(prefill.lookup(1.0, float(computed), 0.0))
    assert float(static._time(stats)) == pytest.approx(joiners * each, rel=1e-9)
    ragged = StepCost(prof, 0.0, 0.0, 4, prefill=prefill)
    assert float(ragged._prefill_tokens(n)) == n  # a ragged cache computes the prompt as it is


def test_check_serve_prices_the_h200_traces_and_says_what_the_profile_misses():
    """The H200 serving runs of figures/gpu-h200 (2026-11-26) replayed on their own profile: the
    description says the profile's contexts stop at 768 while 97% of the saturated run's
    verifications attend further (the cause of its miss), and the replay keeps the measured side
    as served."""
    from pathlib import Path

    from draftsim.analysis.servecheck import check_serve

    root = Path(__file__).resolve().parents[2] / "figures" / "gpu-h200" / "serving"
    out = check_serve(root / "trace-capacity", root / "profile.json", prefill_profile=root / "profile-prefill.json")
    assert "97% of the verifications attend past the profile's largest context (768" in out["costs"]
    rows = {r["metric"]: r for r in out["metrics"]}
    assert rows["throughput"]["measured"] == pytest.approx(304.27, rel=1e-3)
    assert rows["tpot_p50"]["measured"] == pytest.approx(0.0936, rel=1e-2)


def test_a_shaped_drafters_calls_carry_their_padded_make_up_in_the_replay():
    """The serving replay hands a drafter priced at its padded shapes (DraftStepCost, step_shape) each
    call's make-up: its sequences, one new token, and the width of its step's verification plus the
    tokens drafted before it (the draft model's cache holds the same rows); and no prefill chunks
    (its read of a prompt is priced with the target's prefill)."""
    from draftsim.analysis.servecheck import DraftStepCost, StepCost
    from draftsim.sim import acceptance, policies
    from draftsim.sim.serving import ServingConfig, make_workload, serve
    from draftsim.sim.serving.workload import Poisson, parse_lengths

    prof, _ = _bucketed_profile()
    seen = []

    class Target(StepCost):
        def _time(self, stats):
            seen.append(("target", stats))
            return super()._time(stats)

    class Drafter(DraftStepCost):
        def _time(self, stats):
            seen.append(("drafter", stats))
            return super()._time(stats)

    cfg = ServingConfig(policies.FixedK(3), acceptance.Bernoulli(0.7), Target(prof, 0.0, 0.0, 3, static_rows=32),
                        [Drafter(prof, 0.0, 0.0, 3, static_rows=32)])
    wl = make_workload(arrivals=Poisson(), qps=30.0, requests=40, duration=None, prompt=parse_lengths("uniform:1,300"),
                       output=parse_lengths("uniform:2,60"), rng=np.random.default_rng(3))
    serve(cfg, wl, seed=3)
    # the window's pricing: a step's verification (its make-up given), then its drafter's calls (the windows' sizing guesses
    # price plain shapes in between)
    pairs = [(seen[i - 1][1], s) for i, (who, s) in enumerate(seen)
             if who == "drafter" and seen[i - 1][0] == "target" and seen[i - 1][1].padded is not None]
    assert len(pairs) > 10
    for target, draft in pairs:
        W = len(target.sequences)
        T = len(draft.sequences) // W
        assert T * W == len(draft.sequences) and draft.padded is not None
        np.testing.assert_array_equal(draft.padded[:, 0], draft.sequences)
        np.testing.assert_array_equal(draft.padded[:, 1], 1.0)
        np.testing.assert_array_equal(draft.padded[:, 2].reshape(T, W), target.padded[:, 2][None, :] + np.arange(T)[:, None])
        assert not np.any(draft.prefill) and np.all(draft.tokens == draft.sequences)  # no prefill chunks: one token a sequence
