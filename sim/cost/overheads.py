"""Serving-engine overheads the roofline does not see (``--overheads NAME``; sim/data/engines.json).

An engine spends time in every step outside the forward passes — scheduling, preparing inputs,
sampling, rejection sampling — and runs small batches as CUDA graphs captured at fixed sizes, so
a forward computes its batch padded up to the next captured size. :class:`EngineOverheads`
holds, per engine, with the measurement each value comes from:

* ``per_step`` seconds, added once per step to the target's forward (one target call per step);
* ``per_draft_forward`` seconds, added to each draft model's forward beyond its roofline;
* ``graph_tokens``, the captured batch sizes in tokens (None: no padding): a forward of N ≤ the
  largest tokens computes its dense operators at the smallest captured size ≥ N (attention over
  the real tokens' contexts only);
* ``host_overlap``, per server kind (``plain``: no speculation; ``speculative``), whether the
  engine's scheduler prepares the next step while the GPU runs this one (SGLang's overlap
  scheduler): the step then takes max(forward, per_step), not their sum. The serving simulator
  prices a server without speculation by :meth:`Assembly.plain_target`;
* ``batch_expansion``, the drafting methods whose proposals the engine verifies by batch
  expansion (vLLM V0 before its MQA scorer served them): every draft position a sequence of its
  own, so the verification's attention reads each position's whole context
  (``RooflineModel(kv_per_query=True)``).

They apply to roofline-priced models (:class:`~draftsim.sim.cost.roofline.RooflineModel`); a measured
profile already holds its engine's costs. ``--overheads none`` is the roofline alone.

The engines themselves — one :class:`~draftsim.sim.registry.EngineOverheads` per entry of the
file, read through its schema, the capture sizes as data — are the engine registry,
:mod:`draftsim.sim.registry`; this module says what they do to a price.
"""

from __future__ import annotations

import numpy as np

from ..errors import unknown
from ..registry import ENGINES, ENGINES_FILE, EngineOverheads, SchedulerDefaults

__all__ = ["EngineOverheads", "ENGINES", "ENGINES_FILE", "SchedulerDefaults", "default_engine", "engine_overheads", "pad_tokens"]


def engine_overheads(name: str) -> EngineOverheads:
    """The overheads of engine ``name`` (one line naming the valid ones otherwise)."""
    try:
        return ENGINES[str(name).strip().lower()]
    except KeyError:
        raise unknown("engine", name, list(ENGINES)) from None


def default_engine(hardware) -> str:
    """The engine a deployment runs when none is named: ``vllm`` on catalog GPUs (what a serving
    team deploys), ``none`` on a CPU or on hardware calibrated to measured steps (whose fitted
    overhead already holds the measured engine's costs)."""
    if getattr(hardware, "calibration", None) is not None or getattr(hardware, "kind", "gpu") != "gpu":
        return "none"
    return "vllm"


def pad_tokens(tokens: np.ndarray, sizes: tuple[int, ...] | None) -> np.ndarray:
    """Each call's tokens padded up to the smallest captured size that holds them; calls larger
    than every size (and empty calls) as they are."""
    if sizes is None:
        return tokens
    grid = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(tokens, dtype=np.float64)
    i = np.searchsorted(grid, t, side="left")
    inside = (t > 0) & (i < len(grid))
    return np.where(inside, grid[np.minimum(i, len(grid) - 1)], t)
