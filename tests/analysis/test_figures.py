"""analysis.figures: the planner's figures are written as PNG files (their numbers come from
sim.analytic and sim.mdp, tested in tests/sim/test_analytic.py and tests/sim/test_optimize.py)."""

from __future__ import annotations

import numpy as np
from pngcheck import png_size

from draftsim.analysis import figures
from draftsim.sim import mdp
from draftsim.sim.des import Timeline


def test_ewif_and_optimal_k_figures(tmp_path):
    assert png_size(figures.ewif_vs_k(tmp_path / "e.png", alphas=(0.7,), costs=(0.1, 0.3), k_max=6))[0] > 500
    assert png_size(figures.optimal_k_map(tmp_path / "k.png", k_max=8, n=40))


def test_timeline_draws_a_row_per_request(tmp_path):
    tl = Timeline(request=[0, 0, 1], resource=["device", "device", "drafter"], phase=["draft", "verify", "draft+verify"],
                  start=[0.0, 1.0, 0.5], end=[1.0, 1.5, 2.0])
    assert png_size(figures.timeline(tmp_path / "t.png", tl, max_entries=2))


def test_threshold_figure_from_the_mdp(tmp_path):
    T, a = [[0.95, 0.05], [0.2, 0.8]], [0.95, 0.3]
    ratios = (0.05, 0.2)
    comparisons = [mdp.compare_policies(T, a, r, 1.0, 8, np.linspace(0, 1, 11)) for r in ratios]
    sweep = [{"ratio": r, "structure": c["optimal_threshold_structure"]} for r, c in zip(ratios, comparisons)]
    assert png_size(figures.threshold_vs_cost(tmp_path / "h.png", sweep, comparisons))
