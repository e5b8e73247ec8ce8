"""optimal_k over a grid of 10^6 (alpha, c) points: vectorised numpy against a Python loop.

Run: ``.venv/bin/python benchmarks/bench_analytic.py [--points N] [--k-max K]``. Both timings
are taken in this one run and their ratio printed (machines are noisy: compare ratios).
Goal (issue 2): grid <= 0.2 s and >= 100x the loop.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from draftsim.sim import analytic


def plain_loop(alphas, costs, k_max):
    """What a user would write: the closed-form EWIF for every k at every point, keep the best."""
    out_k = []
    out_v = []
    for alpha, c in zip(alphas, costs):
        best, best_k = 1.0, 0
        for k in range(1, k_max + 1):
            tokens = k + 1.0 if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
            value = tokens / (c * k + 1.0)
            if value > best:
                best, best_k = value, k
        out_k.append(best_k)
        out_v.append(best)
    return np.array(out_k), np.array(out_v)


def incremental_loop(alphas, costs, k_max):
    """The algorithm of ``analytic.optimal_k`` (running sum of α^i), one point at a time."""
    out_k = []
    out_v = []
    for alpha, c in zip(alphas, costs):
        best, best_k = 1.0, 0
        power, tokens = 1.0, 1.0
        for k in range(1, k_max + 1):
            power *= alpha
            tokens += power
            value = tokens / (c * k + 1.0)
            if value > best:
                best, best_k = value, k
        out_k.append(best_k)
        out_v.append(best)
    return np.array(out_k), np.array(out_v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--k-max", type=int, default=32, help="default 32, as optimal_k's own")
    parser.add_argument("--repeat", type=int, default=5, help="best of REPEAT for the vectorised grid")
    args = parser.parse_args()
    side = int(round(args.points**0.5))
    alpha, cost = np.meshgrid(np.linspace(0.0, 0.99, side), np.linspace(0.0, 0.5, side))
    alpha, cost = alpha.ravel(), cost.ravel()

    grid_times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        k_vec, v_vec = analytic.optimal_k(alpha, cost, args.k_max)
        grid_times.append(time.perf_counter() - t0)
    t_grid = min(grid_times)

    alpha_list, cost_list = alpha.tolist(), cost.tolist()
    loops = {}
    for name, fn in (("plain loop (closed form per k)", plain_loop), ("loop, same algorithm", incremental_loop)):
        t0 = time.perf_counter()
        k_loop, v_loop = fn(alpha_list, cost_list, args.k_max)
        loops[name] = time.perf_counter() - t0
        # Ties within rounding may pick a neighbouring k; the optimal value must agree.
        assert np.allclose(v_vec, v_loop, rtol=1e-12), f"{name}: optimal EWIF disagrees"
        assert np.mean(k_vec == k_loop) > 0.999, f"{name}: optimal k disagrees"

    print(f"optimal_k over {alpha.size:,} (alpha, c) points, k = 0..{args.k_max}")
    print(f"  numpy grid                      : {t_grid:7.3f} s  (best of {args.repeat}; goal <= 0.2 s)")
    for name, t in loops.items():
        print(f"  {name:32s}: {t:7.3f} s  ratio {t / t_grid:6.1f}x")
    print("  goal: >= 100x the plain loop")


if __name__ == "__main__":
    main()
