"""What a cost model's model holds in device memory: the one record every cost model answers.

:meth:`draftsim.sim.cost.base.CostModel.memory` returns a :class:`MemoryFootprint` (bytes per
device of the devices the model runs on) or None where the memory is not known — a measured
profile or a fixed/linear cost prices time only. A model that holds nothing on the device (a
lookup drafter on the CPU, self-speculation reading the target's own cache) answers
:data:`NOTHING`. :func:`draftsim.sim.serving.kvcache.memory_plan` sums these; it never probes a
model for attributes.

Activations are the working set of one step per new token (:func:`activation_bytes_per_token`):
an estimate, as vLLM measures its peak with a profiling run (``profile_run``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DraftsimError

__all__ = ["MemoryFootprint", "NOTHING", "activation_bytes_per_token"]


@dataclass(frozen=True)
class MemoryFootprint:
    """One model's memory per device, in bytes.

    weights             : parameters resident on each device (shards at tensor parallelism)
    kv_per_token        : KV cache per cached token on each device (0: the model caches nothing)
    activation_per_token: peak working set of one step per new token (hidden states, projections'
                          outputs, logits)
    attached            : runs inside the target's forward on the target's devices (a drafting
                          head), so it shares them whatever the placement of draft models
    """

    weights: float = 0.0
    kv_per_token: float = 0.0
    activation_per_token: float = 0.0
    attached: bool = False

    def __post_init__(self):
        for key in ("weights", "kv_per_token", "activation_per_token"):
            v = float(getattr(self, key))
            if not v >= 0.0 or v == float("inf"):  # also refuses nan
                raise DraftsimError(f"memory footprint: {key} must be a finite number of bytes >= 0; got {v!r}")
            object.__setattr__(self, key, v)


#: A model that holds nothing on the device (lookups run on the CPU).
NOTHING = MemoryFootprint()


def activation_bytes_per_token(model, tp: int, dtype_bytes: float) -> float:
    """Peak activations per new token of one step of ``model`` (a catalog ``ModelSpec``) on one
    of ``tp`` devices: the residual stream (×4: input, attention output, MLP output, the
    residual), QKV, the MLP's intermediates (×2 for the gate) and fp32 logits (4 bytes each)."""
    m = model
    per_token = (4 * m.hidden + 2 * m.intermediate / tp + (m.heads + 2 * m.kv_heads) * m.head_dim / tp) * dtype_bytes
    return float(per_token + 4 * m.vocab / tp)
