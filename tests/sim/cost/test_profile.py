"""sim.cost.profile: measured profiles interpolated.

Grid hits, round trips, monotonicity, affine context, last-row tables, refusal outside the
grid, ragged batches and fingerprints are tested in tests/test_costs.py; this file adds that
the integer table path and the float path interpolate alike between grid points, the
record's checks and what a profile says limits a call.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftsim.sim.cost import ProfileCost
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
