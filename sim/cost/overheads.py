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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import unknown

__all__ = ["EngineOverheads", "ENGINES", "SchedulerDefaults", "default_engine", "engine_overheads", "pad_tokens", "vllm_capture_sizes"]

#: The engines' overheads and their sources.
ENGINES_FILE = Path(__file__).parent.parent / "data" / "engines.json"


def vllm_capture_sizes(largest: int = 512) -> tuple[int, ...]:
    """vLLM's CUDA-graph capture sizes (tokens): 1, 2, 4, then every 8 below 256, then every 16
    up to ``largest`` (vllm/config/compilation.py, sim/data/engines.json)."""
    return tuple([1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16)))


@dataclass(frozen=True)
class SchedulerDefaults:
    """What an engine's scheduler does when its user sets nothing, on one device (each value cited
    in sim/data/engines.json under the engine's ``scheduler``): the most running requests, the
    token budget of a step, whether prompts are prefilled in chunks within it, the KV block size
    in tokens and the share of device memory the engine takes."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    block_size: int
    gpu_memory_utilization: float
    entry_point: str = ""

    def describe(self) -> str:
        return (f"max_num_seqs {self.max_num_seqs}, max_num_batched_tokens {self.max_num_batched_tokens:,}, chunked prefill "
                f"{'on' if self.chunked_prefill else 'off'}, block {self.block_size}, gpu-memory-utilization {self.gpu_memory_utilization:g}")


def _tier(tiers: list[dict], memory_gb: float, name: str) -> dict:
    """The first tier whose device conditions ``memory_gb`` (10^9 bytes) and ``name`` meet."""
    gib = memory_gb * 1e9 / 2**30
    for tier in tiers:
        if gib < float(tier.get("min_memory_gib", 0.0)):
            continue
        if any(x in name.lower() for x in tier.get("exclude_names", ())):
            continue
        return tier
    return tiers[-1]


@dataclass(frozen=True)
class EngineOverheads:
    """One engine's overheads (see the module docstring)."""

    name: str
    per_step: float = 0.0
    per_draft_forward: float = 0.0
    graph_tokens: tuple[int, ...] | None = None
    source: str = ""
    #: how far a forward's memory and compute times overlap (1: the roofline's max; 0: their sum)
    overlap: float = 1.0
    #: measured tensor-parallel all-reduce times: {"hardware": [names], "message_bytes": [...], "us": {tp: [...]}} or None
    allreduce: dict | None = None
    #: whether the per-step host work runs beside the forward (max, not sum) in a server without / with speculation
    plain_overlap: bool = False
    speculative_overlap: bool = False
    #: drafting methods (sim/cost/methods.py names) verified by batch expansion
    batch_expansion: tuple[str, ...] = ()
    #: the engine's version these values describe (said in every output)
    version: str = ""
    #: the scheduler's defaults by device (engines.json ``scheduler``: tiers by device memory)
    scheduler_entry: dict | None = None

    @property
    def label(self) -> str:
        """The engine and its version, as outputs name it (``vllm v0.10.1``)."""
        return f"{self.name} {self.version}".strip() if self.name != "none" else "none (the roofline alone)"

    def scheduler(self, hardware=None) -> SchedulerDefaults:
        """The scheduler's defaults of this engine on ``hardware`` (a catalog HardwareSpec; None:
        no known device, the smallest tier)."""
        s = self.scheduler_entry or ENGINES["none"].scheduler_entry
        tier = _tier(s["tiers"], 0.0 if hardware is None else float(hardware.memory) / 1e9, "" if hardware is None else hardware.name)
        seqs = min(int(tier["max_num_seqs"]), int(tier["max_num_batched_tokens"]))
        return SchedulerDefaults(seqs, int(tier["max_num_batched_tokens"]), bool(s["chunked_prefill"]), int(s["block_size"]),
                                 float(s["gpu_memory_utilization"]), s.get("entry_point", ""))

    def host_overlap(self, speculative: bool) -> bool:
        """Whether a server of this kind hides its per-step host work behind the forward."""
        return self.speculative_overlap if speculative else self.plain_overlap

    def allreduce_for(self, hardware: str, tp: int):
        """(message bytes, seconds) of the engine's measured all-reduce on ``hardware`` at ``tp``
        devices, or None where it measured none (the roofline's latency + bytes / bandwidth)."""
        ar = self.allreduce
        if ar is None or hardware not in ar["hardware"] or str(tp) not in ar["us"]:
            return None
        return tuple(float(x) for x in ar["message_bytes"]), tuple(float(x) * 1e-6 for x in ar["us"][str(tp)])

    def describe(self) -> str:
        if self.name == "none":
            return "engine: none (the roofline alone, no engine overheads)"
        pad = f", CUDA graphs padded to {len(self.graph_tokens)} sizes up to {self.graph_tokens[-1]} tokens" if self.graph_tokens else ""
        if self.overlap < 1.0:
            pad += ", memory and compute time " + ("added" if self.overlap == 0 else f"overlapping {self.overlap:g}")
        if self.allreduce:
            pad += f", all-reduces at their measured times on {', '.join(self.allreduce['hardware'])}"
        if self.plain_overlap or self.speculative_overlap:
            kinds = [k for k, on in (("without", self.plain_overlap), ("with", self.speculative_overlap)) if on]
            pad += f", per-step host work overlapped with the forward {' and '.join(kinds)} speculation"
        if self.batch_expansion:
            pad += f", {', '.join(self.batch_expansion)} proposals verified by batch expansion"
        return (f"engine: {self.label} ({self.per_step * 1e3:.2f} ms per step, {self.per_draft_forward * 1e3:.2f} ms per draft "
                f"forward{pad}; {self.source})")


def _load() -> dict[str, EngineOverheads]:
    doc = json.loads(ENGINES_FILE.read_text())["engines"]
    out = {}
    for name, e in doc.items():
        graphs = e.get("graph_capture_tokens")
        out[name] = EngineOverheads(name, float(e["per_step_us"]) * 1e-6, float(e["per_draft_forward_us"]) * 1e-6,
                                    vllm_capture_sizes() if graphs else None,
                                    "per step: " + (e["per_step_source"]["repo"] + " " + e["per_step_source"]["path"]
                                                    if isinstance(e.get("per_step_source"), dict) else e.get("source", "")),
                                    float(e.get("forward_overlap", 1.0)), e.get("allreduce"),
                                    bool(e.get("host_overlap", {}).get("plain", False)),
                                    bool(e.get("host_overlap", {}).get("speculative", False)),
                                    tuple(e.get("batch_expansion", {}).get("methods", ())), str(e.get("version", "")),
                                    e.get("scheduler"))
    return out


#: Every engine of sim/data/engines.json by name.
ENGINES = _load()


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
