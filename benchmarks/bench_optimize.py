"""Optimiser timings: exact K-matrix search (n = 3), the MDP (K_max = 32), the tree DP (budget 64).

Run: ``.venv/bin/python benchmarks/bench_optimize.py``. Goals (issue 5): each <= 1 s.
Best of three runs each, from this one process.
"""

from __future__ import annotations

import time

import numpy as np

from draftsim.sim import mdp, optimize


def best_of(fn, repeat=3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    A = np.zeros((4, 4))
    A[1, 0], A[2, 0], A[3, 0] = 0.85, 0.7, 0.5
    A[2, 1], A[3, 1], A[3, 2] = 0.75, 0.55, 0.6
    costs = [0.15, 0.04, 0.0]
    t_exact, exact = best_of(lambda: optimize.kmatrix_exact(A, costs, 20))
    t_grid, grid = best_of(lambda: optimize.kmatrix_grid(A, costs, 20))
    t_mdp, sol = best_of(lambda: mdp.solve_markov([[0.95, 0.05], [0.2, 0.8]], [0.95, 0.3], 0.05, 1.0, 32))
    t_tree, tree = best_of(lambda: optimize.tree_shape([0.6, 0.4, 0.3, 0.2], 64, lambda n: 1 + 0.002 * n))
    print(f"{'optimiser':48s} {'seconds':>8s}  result")
    print(f"{'exact K-matrix search, 3 drafters, entries <= 20':48s} {t_exact:8.3f}  EWIF {exact.ewif:.4f}, {exact.evaluations:,} evaluations (goal <= 1 s)")
    print(f"{'halving grid search (baseline)':48s} {t_grid:8.3f}  EWIF {grid.ewif:.4f}, {grid.evaluations} evaluations")
    print(f"{'MDP, 2 Markov regimes, K_max = 32':48s} {t_mdp:8.3f}  latency/token {sol.latency_per_token:.4f} (goal <= 1 s)")
    print(f"{'tree DP, budget 64, 4 ranks':48s} {t_tree:8.3f}  {tree.size} nodes, {tree.tokens_per_time:.4f} tokens/time (goal <= 1 s)")


if __name__ == "__main__":
    main()
