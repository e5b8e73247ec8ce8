"""analysis.reality: how fast the machine ran during a measurement (run_speed).

Replaying real runs (check_run, check_tree_run, held_to_sim) needs real models and is
tested in tests/sim/test_replay.py and tests/realrun/test_executor.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from draftsim.analysis.reality import run_speed
from draftsim.sim.cost import ProfileCost


def profile() -> ProfileCost:
    B, N, C = (1, 2), (1, 4, 16), (0, 64, 256)
    b, n, c = np.meshgrid(B, N, C, indexing="ij")
    return ProfileCost("target", B, N, C, 0.01 + 0.001 * b * n + 1e-5 * b * c)


def call(model, n, seconds, kind="verify"):
    return SimpleNamespace(model=model, n_tokens=n, seconds=seconds, kind=kind)


def test_run_speed_prices_the_target_calls_at_their_contexts():
    p = profile()
    prompts = [[call(0, 16, 0.05, "prefill"), call(1, 1, 9.0, "draft"), call(0, 1, 0.03), call(0, 1, 0.03)]]
    out = run_speed(prompts, p)
    priced = float(p.shape_time(1, 16, 0)) + float(p.shape_time(1, 1, 16)) + float(p.shape_time(1, 1, 17))
    assert out["priced_seconds"] == pytest.approx(priced)  # the drafter's call is not the target's
    assert out["measured_seconds"] == pytest.approx(0.11)
    assert out["factor"] == pytest.approx(0.11 / priced)


def test_run_speed_unknown_without_calls_or_outside_the_grid():
    p = profile()
    assert run_speed(None, p) is None and run_speed([[]], p) is None
    assert run_speed([[call(0, 1, 0.1), call(0, 300, 0.1)]], p) is None  # 300 new tokens: beyond the grid
    assert run_speed([[call(1, 1, 0.1)]], p) is None
