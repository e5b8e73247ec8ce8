"""Where a serving run's step time goes: the mean step of its steady-state window, split into the
target's forward (verifying the drafts, and the prefill chunks), the drafters' calls, the engine's
per-step host time, the fixed per-call overhead and the CUDA-graph padding.

The serving simulator records every step's seconds and its drafters' seconds
(:meth:`draftsim.sim.serving.metrics.Recorder.step_arrays`); the target's call is the rest. That
call is split post hoc by :func:`draftsim.sim.cost.callparts.split_calls` from the recorded
tokens of the call and the same cost model that priced it — exact for the roofline (fixed time and
padding depend on the call's tokens alone), the padding left inside the forward for the measured
operator model, and the whole call a forward for a measured profile (see that module). The parts of
every step add up to its recorded duration, so their means add up to the mean step.

The steps averaged are those that start inside the run's steady-state window
(:func:`draftsim.sim.serving.steady.steady_state`: warm-up and drain cut, as every rate of the
summary), on every replica; a run too small to test is measured whole. Drafting is one part: the
recorder keeps the drafters' seconds per step but not their number of calls, so the engine's
per-draft-forward host time stays inside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..sim.cost.callparts import SPLIT_NOTES, split_basis, split_calls
from ..sim.serving.steady import steady_state

__all__ = ["PART_LABELS", "StepPart", "StepBreakdown", "step_breakdown"]

#: The parts of a step, in order, with what each holds.
PART_LABELS = {
    "target_forward": "target forward (verification and prefill chunks, GPU)",
    "drafting": "drafting (the drafters' calls, their engine host time included)",
    "host": "engine host time per step",
    "call_overhead": "fixed call overhead (launches, hardware entry)",
    "padding": "CUDA-graph padding of the target's call",
}


@dataclass(frozen=True)
class StepPart:
    """One part of the mean step: its name (a key of :data:`PART_LABELS`), milliseconds per step
    and share of the mean step; ``ms`` None where the cost model does not separate it."""

    name: str
    ms: float | None
    share: float | None

    @property
    def label(self) -> str:
        return PART_LABELS[self.name]


@dataclass(frozen=True)
class StepBreakdown:
    """The mean step of a run's steady-state window, part by part (see the module docstring).

    step_ms : mean step, milliseconds (the parts' ``ms`` add up to it)
    steps   : steps averaged (those starting inside the window, on every replica)
    parts   : one :class:`StepPart` per key of :data:`PART_LABELS`, in its order
    window  : which steps were averaged, in words
    split   : how the target's call was split (:data:`draftsim.sim.cost.callparts.SPLIT_NOTES`)
    """

    step_ms: float
    steps: int
    parts: tuple[StepPart, ...]
    window: str
    split: str

    def part(self, name: str) -> StepPart:
        return next(p for p in self.parts if p.name == name)

    def to_dict(self) -> dict:
        return {"step_ms": self.step_ms, "steps": self.steps, "window": self.window, "split": self.split,
                "parts": {p.name: {"ms_per_step": p.ms, "share": p.share} for p in self.parts}}

    def line(self) -> str:
        """One line: the mean step and each separated part's share and milliseconds."""
        shown = [f"{p.name.replace('_', ' ')} {p.share:.1%} ({p.ms:.3g} ms)" for p in self.parts if p.ms is not None]
        return f"mean step {self.step_ms:.3g} ms over {self.steps:,} steps: " + ", ".join(shown)


def step_breakdown(run, config, which: str = "") -> StepBreakdown | None:
    """The breakdown of ``run`` (a :class:`~draftsim.sim.serving.RunRecord`) served under
    ``config`` (its :class:`~draftsim.sim.serving.ServingConfig`: the target's cost model and the
    engine that priced the run); None for a run without steps. ``which`` names the run in the
    window's words (e.g. "the first replication")."""
    s = run.steps
    duration = np.asarray(s["duration"], dtype=np.float64)
    if not len(duration):
        return None
    ss = steady_state(run.arrival, run.admitted, run.finish)
    if ss.tested:
        keep = (s["start"] >= ss.start) & (s["start"] < ss.end)
        window = f"steps starting in the steady-state window ({ss.start:.3g} s to {ss.end:.3g} s)"
        if not keep.any():
            keep = np.ones(len(duration), dtype=bool)
            window = "every step (none starts inside the steady-state window)"
    else:
        keep = np.ones(len(duration), dtype=bool)
        window = "every step (a run too small to test for a steady state is measured whole)"
    if which:
        window += f", {which}"
    duration = duration[keep]
    draft = np.asarray(s["draft"], dtype=np.float64)[keep]
    tokens = np.asarray(s["tokens"], dtype=np.float64)[keep]
    engine = getattr(config, "engine", None)
    host = float(getattr(engine, "per_step", 0.0) or 0.0)
    split = split_calls(config.target, tokens, duration - draft, engine_host=host)
    means = {"target_forward": split["forward"], "drafting": draft, "host": split["host"], "call_overhead": split["overhead"],
             "padding": split["padding"]}
    step = float(duration.mean())
    parts = []
    for name in PART_LABELS:
        v = means[name]
        ms = None if v is None else float(v.mean()) * 1e3
        parts.append(StepPart(name, ms, None if ms is None else (ms / (step * 1e3) if step > 0 else float("nan"))))
    return StepBreakdown(step * 1e3, int(len(duration)), tuple(parts), window, SPLIT_NOTES[split_basis(config.target)])
