"""sim.cost.profile: measured profiles interpolated.

The integer table path and the float path interpolate alike between grid points, the
record's checks and what a profile says limits a call; at the end, grid hits, round trips,
monotonicity, affine context, last-row tables, refusal outside the grid, ragged batches and
fingerprints.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftsim.sim.cost import (
    BatchStats,
    CallCost,
    Costs,
    ProfileCost,
    load_profile,
)
from draftsim.sim.errors import DraftsimError

B, N, C = (1, 2, 4, 8), (1, 3, 8), (0, 100, 700)


def profile(**kw) -> ProfileCost:
    b, n, c = np.meshgrid(B, N, C, indexing="ij")
    seconds = 0.01 * b**0.6 * n**0.3 + 2e-5 * b * c
    return ProfileCost("p", B, N, C, seconds, **kw)


@given(st.integers(1, 8), st.integers(1, 8), st.integers(0, 700), st.booleans())
def test_integer_and_float_shapes_interpolate_alike(b, n, c, monotone):
    p = profile(monotone=monotone)
    assert float(p.shape_time(b, n, c)) == pytest.approx(float(p.lookup(float(b), float(n), float(c))), rel=1e-12)
    assert float(p.shape_time(np.array([b]), np.array([n]), np.array([c]))[0]) == pytest.approx(float(p.shape_time(b, n, c)), rel=1e-12)


@pytest.mark.parametrize("kw, match", [
    (dict(batch=(2, 1)), "batch axis must be strictly increasing integers >= 1"),
    (dict(new_tokens=(0, 3, 8)), "new_tokens axis"),
    (dict(context=(0.5, 100, 700)), "context axis"),
    (dict(seconds=np.ones((4, 3, 2))), "seconds must have shape \\(4, 3, 3\\)"),
    (dict(seconds=np.zeros((4, 3, 3))), "finite and > 0"),
    (dict(spread=np.ones(3)), "spread must have shape"),
    (dict(extrapolate="wrap"), "extrapolate must be 'refuse' or 'clamp'; got 'wrap'"),
])
def test_record_checks(kw, match):
    args = dict(batch=B, new_tokens=N, context=C, seconds=np.ones((4, 3, 3)))
    args.update(kw)
    with pytest.raises(DraftsimError, match=match):
        ProfileCost("p", **args)


def test_last_row_table_needs_batch_one():
    with pytest.raises(DraftsimError, match="batch axis must start at 1"):
        ProfileCost("p", (2, 4), N, C, np.ones((2, 3, 3)), last_row_seconds=np.ones((3, 3)))


def test_bound_is_overhead_on_the_flat_part_else_compute():
    p = profile()
    assert p.shape_bound(2, 1, 0) == "overhead" and p.shape_bound(2, 8, 0) == "compute"
    assert p.path == "model" and profile(fingerprint={"path": "server"}).path == "server"


# -- profiles: interpolation, the last-row table, files ---------------------------------------------

def toy_profile(**kw):
    B, N, C = (1, 2, 4), (1, 2, 4, 8), (0, 128, 512)
    b, n, c = np.meshgrid(B, N, C, indexing="ij")
    seconds = 0.01 + 0.001 * b * n + 1e-6 * b * c
    fp = {"model": {"name": "toy", "dtype": "float32"}, "machine": {"cpu": "x", "cores": 2, "device": "cpu"}}
    return ProfileCost("toy", B, N, C, seconds, spread=seconds * 0.01, repeats=3, fingerprint=fp,
                       drafters={"maxgram": {"seconds_per_token": 1e-5}}, **kw), seconds


def test_the_last_row_table_prices_the_logit_rows_a_call_keeps(tmp_path):
    # toy_profile: 0.01 + 0.001·b·n + 1e-6·b·c; the same calls keeping one row save 0.0004 per other row
    N, C = (1, 2, 4, 8), (0, 128, 512)
    n_, c_ = np.meshgrid(N, C, indexing="ij")
    last = 0.01 + 0.001 * n_ + 1e-6 * c_ - 0.0004 * (n_ - 1)
    prof, seconds = toy_profile(last_row_seconds=last)
    b, n, c = 2, 8, 128
    full = float(prof.shape_time(b, n, c))
    assert float(prof.shape_time(b, n, c, rows=n)) == pytest.approx(full, rel=1e-12)  # every row: the measured call
    assert float(prof.row_saving(n, c)) == pytest.approx(0.0004, rel=1e-9)
    assert float(prof.shape_time(b, n, c, rows=1)) == pytest.approx(full - b * 7 * 0.0004, rel=1e-9)
    assert float(prof.shape_time(1, 1, c, rows=1)) == pytest.approx(float(prof.shape_time(1, 1, c)))  # nothing to drop
    r = np.arange(1, 9)
    assert (np.diff(prof.shape_time(b, n, c, rows=r)) >= 0).all()  # more rows never cost less
    # the cost interface: a batch that keeps one row per sequence (prefills) costs the same as rows=1
    stats = BatchStats.of_shape(b, n, c)
    one_row = BatchStats(stats.sequences, stats.tokens, stats.cached, stats.pairs, rows=stats.sequences)
    assert float(prof.stats_time(one_row)) == pytest.approx(float(prof.shape_time(b, n, c, rows=1)), rel=1e-12)
    assert float(prof.stats_time(stats)) == pytest.approx(full, rel=1e-12)
    prof.save(tmp_path / "h.json")
    back = load_profile(tmp_path / "h.json")
    assert np.array_equal(back.last_row_seconds, last)
    assert float(back.shape_time(b, n, c, rows=1)) == float(prof.shape_time(b, n, c, rows=1))
    plain, _ = toy_profile()  # no last-row table: rows are ignored (every row priced)
    assert float(plain.shape_time(b, n, c, rows=1)) == full
    for bad in (last[:2], last * np.nan, -last):
        with pytest.raises(DraftsimError, match="last_row_seconds"):
            toy_profile(last_row_seconds=bad)


def test_profile_hits_its_grid_points_and_round_trips(tmp_path):
    prof, seconds = toy_profile()
    b, n, c = np.meshgrid(prof.batch, prof.new_tokens, prof.context, indexing="ij")
    np.testing.assert_allclose(prof.shape_time(b, n, c), seconds, rtol=1e-12)
    np.testing.assert_allclose(prof.lookup(b * 1.0, n * 1.0, c * 1.0), seconds, rtol=1e-12)  # float path = table path
    prof.save(tmp_path / "p.json")
    back = load_profile(tmp_path / "p.json")
    assert back.monotone and not load_profile(tmp_path / "p.json", monotone=False).monotone
    assert (back.batch, back.new_tokens, back.context) == (prof.batch, prof.new_tokens, prof.context)
    np.testing.assert_array_equal(back.seconds, prof.seconds)
    assert back.fingerprint == prof.fingerprint and back.drafters == prof.drafters
    rng = np.random.default_rng(1)
    q = rng.integers(1, 5, 100), rng.integers(1, 9, 100), rng.integers(0, 513, 100)
    np.testing.assert_array_equal(back.shape_time(*q), prof.shape_time(*q))


@given(b=st.integers(1, 4), n=st.integers(1, 8), c=st.integers(0, 512), db=st.integers(0, 3), dn=st.integers(0, 7), dc=st.integers(0, 512))
def test_profile_interpolation_is_monotone_even_over_noisy_data(b, n, c, db, dn, dc):
    prof, seconds = toy_profile()
    noisy = ProfileCost("toy", prof.batch, prof.new_tokens, prof.context, seconds * np.random.default_rng(0).uniform(0.8, 1.2, seconds.shape))
    for p in (prof, noisy):
        t = p.shape_time(b, n, c)
        assert p.shape_time(min(b + db, 4), n, c) >= t * (1 - 1e-12)
        assert p.shape_time(b, min(n + dn, 8), c) >= t * (1 - 1e-12)
        assert p.shape_time(b, n, min(c + dc, 512)) >= t * (1 - 1e-12)


@given(b=st.sampled_from([1, 2, 4]), n=st.sampled_from([1, 2, 4, 8]), c=st.integers(0, 512), frac=st.floats(0, 1))
def test_profile_follows_an_affine_cost_in_context_exactly(b, n, c, frac):
    """A call's attention and KV reads grow linearly with its context: between context grid
    points the profile interpolates time linearly, so an affine t(c) is priced exactly (at
    integer and fractional contexts, table and float paths alike), and between batch and
    new-token grid points power laws stay exact."""
    prof, seconds = toy_profile()  # 0.01 + 0.001·b·n + 1e-6·b·c: affine in c
    x = c + frac * (c < 512)
    assert float(prof.shape_time(b, n, c)) == pytest.approx(0.01 + 0.001 * b * n + 1e-6 * b * c, rel=1e-12)
    assert float(prof.lookup(float(b), float(n), x)) == pytest.approx(0.01 + 0.001 * b * n + 1e-6 * b * x, rel=1e-12)
    B, N, C = (1, 4), (1, 8), (0, 256)
    bb, nn, cc = np.meshgrid(B, N, C, indexing="ij")
    power = ProfileCost("p", B, N, C, 0.02 * bb**0.7 * nn**0.4 * (1 + cc / 256))
    bi, ni = (1 + 3 * frac), (1 + 7 * frac)
    assert float(power.lookup(bi, ni, 0.0)) == pytest.approx(0.02 * bi**0.7 * ni**0.4, rel=1e-9)


def test_a_profile_can_keep_its_medians_as_measured():
    """On a CPU a forward of 16 token rows can cost less than one of 12 (the GEMM library
    switches kernels): by default the profile lifts such a dip to the running maximum, with
    ``monotone=False`` (what check-serve prices with) every grid point answers its median."""
    B, N, C = (1, 2, 3, 4), (4,), (0, 128)
    t = np.array([[[0.08, 0.09]], [[0.11, 0.12]], [[0.14, 0.15]], [[0.12, 0.13]]])  # 16 rows cheaper than 12
    lifted, raw = ProfileCost("m", B, N, C, t), ProfileCost("m", B, N, C, t, monotone=False)
    assert float(lifted.shape_time(4, 4, 0)) == pytest.approx(0.14) and float(raw.shape_time(4, 4, 0)) == pytest.approx(0.12)
    b, n, c = np.meshgrid(B, N, C, indexing="ij")
    np.testing.assert_allclose(raw.shape_time(b, n, c), t, rtol=1e-12)
    np.testing.assert_allclose(raw.lookup(b * 1.0, n * 1.0, c * 1.0), t, rtol=1e-12)
    assert float(raw.lookup(3.5, 4.0, 64.0)) < float(lifted.lookup(3.5, 4.0, 64.0))


def test_profile_refuses_or_flags_shapes_outside_its_grid():
    prof, _ = toy_profile()
    with pytest.raises(DraftsimError, match=r"batch 8 is outside the profile's grid \[1, 4\]"):
        prof.shape_time(8, 1, 0)
    with pytest.raises(DraftsimError, match="context 650"):
        prof.forward_time([[1, 1]], [[600, 700]])  # priced at the mean context, 650
    clamp, _ = toy_profile(extrapolate="clamp")
    assert clamp.shape_time(8, 1, 0) == pytest.approx(float(clamp.shape_time(4, 1, 0)))
    assert clamp.outside([1, 8], 1, 0).tolist() == [False, True]


def test_ragged_batch_is_priced_at_its_means():
    prof, _ = toy_profile()
    assert prof.forward_time([[2, 2, 0]], [[128, 128, 0]])[0] == pytest.approx(float(prof.shape_time(2, 2, 128)))


def test_profile_fingerprint_and_bad_files(tmp_path):
    prof, _ = toy_profile()
    prof.check_fingerprint(machine={"cpu": "x"})
    with pytest.raises(DraftsimError, match="another machine: cpu"):
        prof.check_fingerprint(machine={"cpu": "y"})
    path = tmp_path / "p.json"
    prof.save(path)
    doc = json.loads(path.read_text())
    for change, msg in (({"version": 99}, "version 99"), ({"schema": "x"}, "not a draftsim cost profile"),
                        ({"seconds": [[[1.0]]]}, "shape"), ({"batch": [2, 1, 4]}, "strictly increasing")):
        path.write_text(json.dumps({**doc, **change}))
        with pytest.raises(DraftsimError, match=msg):
            load_profile(path)
    path.write_text("{")
    with pytest.raises(DraftsimError, match="profile .* is not valid JSON"):
        load_profile(path)


def test_costs_from_a_profile_stay_inside_its_grid():
    prof, _ = toy_profile()  # new tokens up to 8
    costs = Costs.from_models([prof, CallCost(0.001)], batch=2, context=128)
    assert costs.models[0].single == pytest.approx(1.0)
    assert costs.models[0].a + 8 * costs.models[0].b == pytest.approx(float(prof.shape_time(2, 8, 128) / prof.shape_time(2, 1, 128)), rel=0.05)  # linear at grid points, log-interpolated between


@given(st.floats(0.01, 0.99), st.integers(1, 4), st.integers(9, 4000), st.integers(0, 600))
def test_a_call_keeping_fewer_rows_never_costs_less_than_a_one_token_call(fast, S, n, context):
    """A last-row table measured once on a loaded machine can say a call keeping one row costs a
    small share (``fast``) of the call keeping all; taken over a long prefill's dropped rows (S
    sequences × n tokens past the grid, priced as the grid's largest calls scaled, as
    ``check-serve`` does), the saving once priced the call below nothing: a negative step,
    simpy's 'Negative delay' in the serving replay. ``rows_adjusted``, like ``shape_time``, never
    goes below a one-token call of the same batch and context, nor above the call as given."""
    N, C = (1, 2, 4, 8), (0, 128, 512)
    n_, c_ = np.meshgrid(N, C, indexing="ij")
    full = 0.01 + 0.001 * n_ + 1e-6 * c_  # the toy profile at batch 1
    prof, _ = toy_profile(last_row_seconds=np.where(n_ > 1, full * fast, full))
    c = min(context, 512)
    t = float(prof.shape_time(4, 8, c)) * S * n / 32  # the call of S x n tokens, scaled from the grid's largest
    stats = BatchStats(np.array([float(S)]), np.array([float(S * n)]), np.array([float(S * c)]), np.array([0.0]),
                       rows=np.array([float(S)]))
    got = float(prof.rows_adjusted(np.array([t]), stats)[0])
    one = float(prof.shape_time(S, 1, c))
    assert min(one, t) - 1e-15 <= got <= t + 1e-15 and got > 0
