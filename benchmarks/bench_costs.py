"""Cost models over 10^6 (batch, new tokens, context) shapes: roofline and profile lookup.

Run: ``.venv/bin/python benchmarks/bench_costs.py``. The roofline (Llama-3-8B on 2x H100,
bf16) is evaluated vectorised over 10^6 shapes and, for comparison, shape by shape in a Python
loop over a sample (scaled to 10^6); a measured-profile table (4 x 6 x 5 grid) is looked up
at 10^6 shapes inside its grid. Each figure is the best of several repeats; ratios come from
this one run. Targets (issue 13): roofline <= 0.1 s and >= 100x the loop, lookup <= 0.05 s.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from timing import best_time

from draftsim.sim.cost import ProfileCost, RooflineModel, default_catalog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=1_000_000)
    parser.add_argument("--loop-sample", type=int, default=5_000, help="shapes timed one by one (scaled up)")
    parser.add_argument("--repeat", type=int, default=15, help="best of this many runs (a busy machine preempts single runs)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = args.shapes
    cat = default_catalog()
    roof = RooflineModel(cat.model("llama-3-8b"), cat.hardware_spec("h100-sxm"), "bfloat16", tp=2)
    b, k, c = rng.integers(1, 257, n), rng.integers(1, 17, n), rng.integers(0, 8193, n)

    t_roof = best_time(lambda: roof.shape_time(b, k, c), args.repeat)

    B, N, C = (1, 2, 4, 8), (1, 2, 4, 8, 16, 32), (0, 128, 512, 2048, 8192)
    g = np.meshgrid(B, N, C, indexing="ij")
    prof = ProfileCost("bench", B, N, C, roof.shape_time(*g))
    pb, pk, pc = rng.integers(1, 9, n), rng.integers(1, 33, n), rng.integers(0, 8193, n)
    t_prof = best_time(lambda: prof.shape_time(pb, pk, pc), args.repeat)

    # ragged batches, as a serving simulator asks: 10^4 steps x 64 slots, some empty
    steps, slots = 10_000, 64
    nt = rng.integers(0, 6, (steps, slots))
    ctx = rng.integers(0, 8192, (steps, slots))
    t_steps = best_time(lambda: roof.forward_time(nt, ctx), args.repeat)

    m = args.loop_sample
    bl, kl, cl = b[:m].tolist(), k[:m].tolist(), c[:m].tolist()
    t_loop = best_time(lambda: [roof.shape_time(x, y, z) for x, y, z in zip(bl, kl, cl)], 2) * n / m
    vec = roof.shape_time(b[:m], k[:m], c[:m])
    loop = np.array([float(roof.shape_time(x, y, z)) for x, y, z in zip(bl, kl, cl)])
    assert np.allclose(vec, loop, rtol=1e-12), "vectorised and per-shape rooflines disagree"

    load = os.getloadavg()
    print(f"{n:,} shapes; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"roofline, vectorised:          {t_roof:.4f} s   (target <= 0.1 s: {'ok' if t_roof <= 0.1 else 'MISSED'})")
    print(f"roofline, per-shape loop:      {t_loop:.2f} s   (from {m:,} shapes, scaled)")
    print(f"  vectorised / loop speed-up:  {t_loop / t_roof:.0f}x   (target >= 100x: {'ok' if t_loop / t_roof >= 100 else 'MISSED'})")
    print(f"profile lookup, vectorised:    {t_prof:.4f} s   (target <= 0.05 s: {'ok' if t_prof <= 0.05 else 'MISSED'})")
    print(f"roofline, ragged batches:      {t_steps:.4f} s   for {steps:,} steps x {slots} slots (forward_time)")


if __name__ == "__main__":
    main()
