"""A client's concurrency cap in the serving simulator (``serve(..., max_in_flight=)``: what
``vllm bench serve --max-concurrency`` does, replayed by ``check-serve --vllm-result``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.commands.servesim import ServeSimConfig, serving_config
from draftsim.sim.serving import serve
from draftsim.sim.serving.workload import Workload

CONFIG = serving_config(ServeSimConfig(target="llama-3.1-8b", hardware="h100-sxm", policy="fixed:k=2", alpha=0.7, requests=1,
                                        drafter_model=["eagle3"]))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.sampled_from([0.0, 0.01, 1.0]), st.integers(0, 2**31 - 1))
def test_the_cap_holds_order_and_arrivals(n, cap, gap, seed):
    """Never more than ``cap`` requests sent and unfinished; each sent no earlier than it arrived
    and in arrival order; every request served; without the cap binding (cap >= n) the run is the
    uncapped one."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(gap, n)) if gap else np.zeros(n)
    arrival -= arrival[0]
    wl = Workload(arrival, rng.integers(1, 400, n), rng.integers(1, 60, n), np.zeros(n, dtype=np.int64))
    rec = serve(CONFIG, wl, seed=seed, max_in_flight=cap)
    assert np.all(np.isfinite(rec.finish)) and np.all(rec.finish >= rec.arrival)
    sent = rec.arrival  # the replay's arrival is the send (vLLM times TTFT from it)
    assert np.all(sent >= arrival - 1e-12) and np.all(np.diff(sent) >= -1e-12)
    events = sorted([(t, 1) for t in sent] + [(t, -1) for t in rec.finish], key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([d for _, d in events])) <= cap
    if cap >= n:
        free = serve(CONFIG, wl, seed=seed)
        np.testing.assert_allclose(rec.finish, free.finish, rtol=1e-9, atol=1e-12)
