"""analysis.demo: the demo's steps, each checked against what it claims (``draftsim demo``
end to end, figures included, is tested in tests/test_cli.py)."""

from __future__ import annotations

import numpy as np
import pytest
from pngcheck import png_size

from draftsim.analysis import demo
from draftsim.sim import analytic
from draftsim.sim.plan import plan

Z = 4.0


@pytest.mark.parametrize("setting", demo.REFERENCE_SETTINGS, ids=lambda s: s.name)
def test_confirm_holds_the_plan_against_simulation(setting):
    best = plan(list(setting.drafters), mag_alpha=setting.mag_alpha, k_max=16)[0]
    out = demo.confirm(setting, best, tokens=60_000, seed=1)
    assert out["setting"] == setting.name and out["strategy"] == best.description
    assert abs(out["simulated_ewif"] - out["analytic_ewif"]) <= Z * out["se"]


def test_optimisation_step(tmp_path):
    out = demo.optimisation_step(tmp_path, ratios=(0.05, 0.2), k_max=8)
    A, costs = np.array(demo.CASCADE["A"]), [1.0] + demo.CASCADE["costs"]
    exact, grid = out["kmatrix"]["exact"], out["kmatrix"]["grid"]
    assert exact["ewif"] >= grid["ewif"] - 1e-12
    assert analytic.ewif_kmatrix(np.array(exact["K"]), A, costs) == pytest.approx(exact["ewif"])
    for row in out["mdp"]:
        assert row["oracle"] <= row["optimal"] <= row["best_fixed_k"]["latency_per_token"] + 1e-12
    assert png_size(out["figure"])


def test_replay_step_on_the_embedded_trace():
    out = demo.replay_step(k_max=4)
    assert out["sequences"] > 0 and out["tokens"] > 0 and out["rows"]
    for row in out["rows"]:
        assert row["ewif"] > 0 and row["tokens_per_call"] >= 1.0
        if row["oracle_speedup"] is not None:  # Theorem 4.1's oracle bounds every policy on the same flags
            assert row["ewif"] <= row["oracle_speedup"] * (1 + 1e-9)
