"""analysis.loadstudy: speculation against load, the crossover and the serving figures.

The ``serve-sim --sweep-qps`` command (JSON and the marked crossover) is tested in
tests/draftsim/commands/test_servesim.py; this file tests the functions directly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pngcheck import png_size

from draftsim.analysis.loadstudy import crossover, latency_cdfs, load_over_time, speedup_vs_load, sweep_qps
from draftsim.sim import acceptance, policies
from draftsim.sim.cost import CallCost
from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving import ServingConfig, serve
from draftsim.sim.serving.workload import Fixed, Poisson, make_workload


@given(st.lists(st.floats(0.1, 3.0), min_size=1, max_size=10))
def test_crossover_is_where_the_speedup_first_falls_through_one(speedups):
    rows = [{"qps": 2.0**i, "speedup": s} for i, s in enumerate(speedups)]
    q = crossover(rows)
    if speedups[0] < 1:
        assert math.isnan(q)
        return
    falls = [i for i in range(1, len(speedups)) if speedups[i] < 1 <= speedups[i - 1]]
    if not falls:
        assert q is None
        return
    i = falls[0]
    lo, hi = rows[i - 1]["qps"], rows[i]["qps"]
    assert lo <= q <= hi * (1 + 1e-12)
    # on the log-linear segment through the two points, the speedup at q is 1
    f = math.log(q / lo) / math.log(hi / lo)
    assert speedups[i - 1] + f * (speedups[i] - speedups[i - 1]) == pytest.approx(1.0, abs=1e-9)


def test_crossover_without_rows():
    assert crossover([]) is None


def config() -> ServingConfig:
    return ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), CallCost(0.02, 2e-4), [CallCost(0.002)], kv_tokens=1 << 16)


def make(rng, qps):
    return make_workload(arrivals=Poisson(), qps=qps, requests=40, duration=None, prompt=Fixed(64), output=Fixed(32), rng=rng)


def test_sweep_qps_compares_with_plain_decoding_on_the_same_requests():
    rows = sweep_qps(config(), make, [8.0, 1.0, 1.0], seed=2)
    assert [r["qps"] for r in rows] == [1.0, 8.0]  # sorted, once each
    for r in rows:
        assert r["speedup"] == pytest.approx(r["ar"]["e2e"]["mean"] / r["spec"]["e2e"]["mean"])
        assert r["throughput_ratio"] == pytest.approx(r["spec"]["throughput"] / r["ar"]["throughput"])
        assert r["spec"]["requests"] == r["ar"]["requests"] == 40
        assert r["ar"]["spec_decode"]["num_drafts"] == 0 and r["spec"]["spec_decode"]["num_drafts"] > 0
    assert rows[0]["speedup"] > 1  # a cheap, well-accepted drafter helps at low load
    for bad in ([], [0.0], [float("inf")], [-1.0]):
        with pytest.raises(DraftsimError, match="--sweep-qps needs rates > 0"):
            sweep_qps(config(), make, bad)


def test_serving_figures(tmp_path):
    run = serve(config(), make(np.random.default_rng(0), 4.0), seed=0)
    rows = [{"qps": q, "speedup": s, "tpot_speedup": s * 1.1} for q, s in ((1, 1.5), (4, 1.1), (16, 0.8))]
    assert png_size(speedup_vs_load(tmp_path / "s.png", rows, cross=crossover(rows)))
    assert png_size(latency_cdfs(tmp_path / "c.png", {"k=4": run}))
    assert png_size(load_over_time(tmp_path / "l.png", run))
