"""benchmarks/bench_real_serving.py's static-cache profile grid: every padded shape a step can take."""

from __future__ import annotations

from benchscript import load_script
from hypothesis import given, settings
from hypothesis import strategies as st


def _bench():
    return load_script("benchmarks/bench_real_serving.py")


BENCH = _bench()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.integers(0, 1536))
def test_the_static_grid_holds_every_padded_shape_a_step_can_take(B, n, c):
    """For the grid the GPU study asks for (batches to 32, k + 1 ≤ 8 new tokens, contexts to 1,536),
    every step of B ≤ 32 rows × n new tokens at context c has a grid point of its padded shape, so
    ``check-serve`` never interpolates between shapes; and the grid has no two points of one shape."""
    from draftsim.sim.cost.profile import static_shape

    batch, new, context = BENCH.static_grid("1,2,4,8,16,24,32", "1,2,3,4,6,8", "0,128,256,384,512,768,1024,1280,1536")
    gb, gn, gc = ([int(x) for x in s.split(",")] for s in (batch, new, context))
    shapes = [tuple(static_shape(b, m, x)) for b in gb for m in gn for x in gc]
    assert len(shapes) == len(set(shapes)) == 6 * 4 * 8
    want = tuple(static_shape(min(B, 32), n, c))
    assert want in set(shapes)
