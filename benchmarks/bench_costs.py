"""Cost models over 10^6 (batch, new tokens, context) shapes: roofline and profile lookup; the operator model per call.

Run: ``.venv/bin/python benchmarks/bench_costs.py``. The roofline (Llama-3-8B on 2x H100,
bf16) is evaluated vectorised over 10^6 shapes and, for comparison, shape by shape in a Python
loop over a sample (scaled to 10^6); a measured-profile table (4 x 6 x 5 grid) is looked up
at 10^6 shapes inside its grid. Each figure is the best of several repeats; ratios come from
this one run. Targets (issue 13): roofline <= 0.1 s and >= 100x the loop, lookup <= 0.05 s.

With the ``operators`` extra installed, last: the operator model (Llama-3.1-8B on one H100, the
vLLM tables, ``--engine vllm``) per call of 1, 64 and 4,096 shapes, inside its decode-attention
table (batch <= 128, context <= 2,047) and mostly outside it (batch <= 1,024, context <= 100,000:
every batch row anchored at its own edge, sim/cost/operators.py ``_anchored``), each beside the
roofline's time for the same shapes and as a ratio to it.
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
    operator_calls(rng, args.repeat)


def operator_calls(rng, repeat: int) -> None:
    """The operator model's time per call beside the roofline's (module docstring); skipped without the tables."""
    import importlib.metadata

    from draftsim.sim.cost.assembly import Deployment, assemble
    from draftsim.sim.cost.kernel_tables import PACKAGE, PINNED_VERSION

    try:
        importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        print(f"operator model: skipped ({PACKAGE} {PINNED_VERSION} not installed)")
        return
    ops = assemble(Deployment(target="llama-3.1-8b", hardware="h100-sxm", overheads="vllm", cost_model="operators")).target
    roof = assemble(Deployment(target="llama-3.1-8b", hardware="h100-sxm", overheads="vllm")).target
    print("operator model (llama-3.1-8b, h100-sxm, vllm tables) per call, beside the roofline's:")
    for where, (bmax, cmax) in (("inside the decode table", (128, 2047)), ("mostly outside it", (1024, 100_000))):
        for size in (1, 64, 4096):
            b, n, c = rng.integers(1, bmax + 1, size), rng.integers(1, 5, size), rng.integers(0, cmax + 1, size)
            reps = max(3, 400 // size)
            t_ops = best_time(lambda: [ops.shape_time(b, n, c) for _ in range(reps)], repeat) / reps  # noqa: B023
            t_roof = best_time(lambda: [roof.shape_time(b, n, c) for _ in range(reps)], repeat) / reps  # noqa: B023
            print(f"  {where:<24} {size:5,} shapes: {t_ops * 1e3:8.3f} ms   roofline {t_roof * 1e3:7.3f} ms   ({t_ops / t_roof:5.1f}x)")


if __name__ == "__main__":
    main()
