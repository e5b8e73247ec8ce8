"""serve-sim parses its workload once at the boundary (draftsim.sim.serving.workload_spec.WorkloadSpec):
each length distribution is read from its text once per run, whatever the run does with it
(the budget estimate, the memory check, every replication's draw, the load sweep), and the
objects stand where the texts do."""

from __future__ import annotations

import numpy as np
import pytest

import draftsim.sim.serving as serving
import draftsim.sim.serving.workload as workload
import draftsim.sim.serving.workload_spec as ws
from draftsim.api import ServeSimConfig, serve_sim
from draftsim.commands import servesim
from draftsim.commands.servesim import workload_spec
from draftsim.sim.serving.workload import Fixed, Poisson, Uniform

BASE = dict(target="llama-3.1-8b", hardware="h100-sxm", drafter_model=["eagle3"], policy="fixed:k=3", alpha=0.7, requests=12,
            replications=2, prompt_len="uniform:16,64", output_len="fixed:8")


def counted(monkeypatch) -> list[str]:
    """The options each parse_lengths call reads, wherever the name was imported."""
    calls: list[str] = []
    real = workload.parse_lengths
    for module in (workload, serving, ws, servesim):
        if hasattr(module, "parse_lengths"):
            monkeypatch.setattr(module, "parse_lengths", lambda spec, option="length": calls.append(option) or real(spec, option))
    return calls


@pytest.mark.parametrize("extra", [dict(qps=4.0), dict(sweep_qps="2,4", requests=8, replications=1)])
def test_each_length_distribution_is_parsed_once_per_run(monkeypatch, extra):
    calls = counted(monkeypatch)
    serve_sim(ServeSimConfig(**{**BASE, **extra}))
    assert sorted(calls) == ["--output-len", "--prompt-len"]


def test_the_objects_stand_where_the_texts_do(monkeypatch):
    """A workload given as objects parses nothing and draws the same requests as its text."""
    text = workload_spec(ServeSimConfig(**BASE, qps=4.0))
    calls = counted(monkeypatch)
    objects = ws.WorkloadSpec.parse(arrivals=Poisson(), prompt_len=Uniform(16, 64), output_len=Fixed(8), requests=12)
    assert calls == [] and objects.requests == text.requests == 12
    a, b = (s.make(np.random.default_rng(3), 4.0) for s in (text, objects))
    assert np.array_equal(a.prompt, b.prompt) and np.array_equal(a.output, b.output) and np.array_equal(a.arrival, b.arrival)


def test_nothing_bounding_the_workload_takes_the_default_count():
    assert workload_spec(ServeSimConfig(**{**BASE, "requests": None})).requests == 1000
    assert workload_spec(ServeSimConfig(**{**BASE, "requests": None, "duration": 5.0})).requests is None
