"""What a priced forward call's seconds are made of: the GPU's forward, the CUDA-graph padding,
the engine's per-step host time and the fixed per-call overhead.

A cost model answers one number per call (:mod:`draftsim.sim.cost.base`). :func:`split_calls`
takes calls already priced — their new tokens and their seconds, as the serving simulator
records its steps — and says how much of each is which, from the model's own terms:

* ``host``: the serving engine's per-step host time (scheduling, input preparation, sampling:
  ``per_step_us`` of sim/data/engines.json), which :func:`~draftsim.sim.cost.assembly.assemble`
  adds to the target's fixed overhead. Where the engine overlaps that work with the forward (the
  model's ``floor``: a call takes max(forward, host)), a call the host bound is host time whole
  (its forward ran beside it) and a call its forward bound holds no host time: the parts follow the
  critical path.
* ``overhead``: the rest of the call's fixed time — the hardware entry's per-call and per-layer
  overhead (framework and kernel launches, sim/data/hardware.json).
* ``padding``: what running the dense operators at the next CUDA-graph capture size costs over
  running them at the call's own tokens (:func:`~draftsim.sim.cost.overheads.pad_tokens`).
* ``forward``: the rest — the GPU time of the call's own tokens: its GEMMs, attention, experts and
  collectives.

The split is exact where the model's terms depend on the call's tokens only: the fixed time is a
constant per call, and the roofline's padding depends on the call's tokens alone (its dense
operators' curve and all-reduces are functions of the token count), so it needs neither the
contexts nor the batch's make-up. A drafting head's fixed time is its own (the engine's
per-draft-forward time) plus its roofline parts'. The measured operator model's padding also moves its logit rows
and its eager/graphed all-reduce tables, which the tokens alone do not give: there ``padding`` is
None and the padding stays inside ``forward`` (said in :data:`SPLIT_NOTES`). A measured profile or
a linear cost holds its host time inside its measurement: everything is ``forward``.

The four parts add up to the calls' seconds up to float rounding (``forward`` is what is left).
"""

from __future__ import annotations

import copy

import numpy as np

from .base import BatchStats, CostModel
from .methods import HeadCost
from .operators import OperatorModel
from .roofline import RooflineModel

__all__ = ["PARTS", "SPLIT_NOTES", "split_calls", "split_basis"]

#: The parts of a call, in the order outputs list them.
PARTS = ("forward", "padding", "host", "overhead")

#: What each kind of split holds (``split_basis`` names one).
SPLIT_NOTES = {
    "roofline": "fixed time, engine host time and CUDA-graph padding from the roofline's own terms (exact)",
    "operators": "fixed time and engine host time from the operator model's terms (exact); CUDA-graph padding not separated "
                 "(inside the forward: it moves logit rows and all-reduce tables the recorded tokens do not give)",
    "head": "a drafting head's fixed time (its layers' per-call overhead) and the engine's per-draft-forward host time from its "
            "terms (exact); its CUDA-graph padding not separated (inside the forward)",
    "whole": "a measured or fitted cost holds its host time inside its measurement: the whole call is its forward",
}


def split_basis(model: CostModel) -> str:
    """Which split :func:`split_calls` makes for ``model`` (a key of :data:`SPLIT_NOTES`)."""
    if isinstance(model, OperatorModel):
        return "operators"
    if isinstance(model, RooflineModel):
        return "roofline"
    if isinstance(model, HeadCost):
        return "head"
    return "whole"


def _fixed(model: CostModel) -> float:
    """Seconds every call of ``model`` spends on its fixed terms: a roofline's per-call and per-layer
    overhead; a head's own (the engine's per-draft-forward time) plus its roofline parts'."""
    if isinstance(model, RooflineModel):
        return float(model.overhead + model.overhead_per_layer * model.model.layers)
    return float(model.overhead) + sum(_fixed(p) for p in model.parts if isinstance(p, RooflineModel))


def split_calls(model: CostModel, tokens, seconds, engine_host: float = 0.0) -> dict[str, np.ndarray | None]:
    """The parts (:data:`PARTS`) of calls of ``model`` with ``tokens`` new tokens each that took
    ``seconds`` (arrays of one shape, as the model priced them; an empty call has 0 tokens and 0 s).
    ``engine_host``: the engine's host seconds per call the assembly put into the model's fixed
    overhead (a target's per-step time, a drafter's per-draft-forward time; 0 for no engine).
    ``padding`` is None where not separated."""
    N = np.asarray(tokens, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    N, t = np.broadcast_arrays(N, t)
    zero = np.zeros(t.shape)
    basis = split_basis(model)
    if basis == "whole":
        return {"forward": t.copy(), "padding": None, "host": zero, "overhead": zero.copy()}
    on = N > 0
    fixed = _fixed(model)
    padding = _padding(model, N) if basis == "roofline" else None
    if getattr(model, "floor", 0.0):  # host work beside the forward: a call takes max(forward, floor)
        host_bound = on & (t <= model.floor * (1.0 + 1e-12))
        host = np.where(host_bound, t, 0.0)
        forward_bound = on & ~host_bound
        overhead = np.where(forward_bound, fixed, 0.0)
        if padding is not None:
            padding = np.where(forward_bound, padding, 0.0)
    else:
        h = min(float(engine_host), fixed)
        host = np.where(on, h, 0.0)
        overhead = np.where(on, fixed - h, 0.0)
        if padding is not None:
            padding = np.where(on, padding, 0.0)
    forward = t - host - overhead - (0.0 if padding is None else padding)
    return {"forward": forward, "padding": padding, "host": host, "overhead": overhead}


def _padding(model: RooflineModel, N: np.ndarray) -> np.ndarray:
    """Seconds the roofline adds by running calls of N tokens at their capture size: the model's
    time with its capture sizes less its time without, at any batch of N tokens (the difference
    is the dense operators' and all-reduces' terms, functions of N alone)."""
    if model.graph_tokens is None:
        return np.zeros(N.shape)
    graphed = copy.copy(model)
    graphed.floor = 0.0
    eager = copy.copy(graphed)
    eager.graph_tokens = None
    n = np.maximum(N, 1.0)
    stats = BatchStats(np.ones(n.shape), n, np.zeros(n.shape), n)
    return np.asarray(graphed.stats_time(stats) - eager.stats_time(stats), dtype=np.float64)
