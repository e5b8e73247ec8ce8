"""Paged KV cache: how many tokens fit, and how many blocks a request holds.

Memory is paged as in vLLM (Kwon et al., *PagedAttention*, SOSP 2023): the cache is a pool
of blocks of ``block_size`` token slots; a request holds ⌈tokens / block_size⌉ blocks. The
pool's capacity is what the device's usable memory leaves (:func:`memory_plan`):

    capacity = usable memory − weights (target + drafters on that device) − activations,

in units of one token's KV entries in every model that caches it: the target's and, for
drafters sharing the target's device, the drafters' (a drafter keeps its own cache of the same
tokens). The device that holds the drafters (device 0 of the target's tensor-parallel group)
is the tightest and sets the capacity. Activations are the peak working set of one step of
``max_num_batched_tokens`` tokens (hidden states, MLP intermediates and logits of the new
tokens; an estimate — vLLM measures it with a profiling run).

A running request reserves the slots of its draft window beyond its tokens (``lookahead`` =
the most tokens a step can add: k_max + 1, vLLM's lookahead slots), so a verification never
runs out of slots halfway; a request being prefilled holds the blocks of what it has
prefilled so far.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DraftsimError, as_count

__all__ = ["KVCache", "MemoryPlan", "memory_plan", "blocks_for"]


def blocks_for(tokens, block_size: int) -> np.ndarray:
    """⌈tokens / block_size⌉ (vectorised; a Python int for an int)."""
    if type(tokens) is int:
        return -(-tokens // block_size)
    return -(-np.asarray(tokens, dtype=np.int64) // block_size)


@dataclass(frozen=True)
class KVCache:
    """A pool of ``blocks`` blocks of ``block_size`` slots; running requests reserve
    ``lookahead`` slots beyond their tokens."""

    block_size: int
    blocks: int
    lookahead: int

    def __post_init__(self):
        as_count("block_size", self.block_size, minimum=1, maximum=4096)
        as_count("KV blocks", self.blocks, minimum=1)
        as_count("lookahead", self.lookahead, minimum=1)

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size

    def running_blocks(self, tokens) -> np.ndarray:
        """Blocks held by running requests with ``tokens`` in their cache (draft window reserved)."""
        return blocks_for(np.asarray(tokens) + self.lookahead, self.block_size)

    def check_request(self, prompt: int, output: int) -> None:
        """Raise unless one request of ``prompt`` + ``output`` tokens fits alone (say what fits)."""
        need = int(self.running_blocks(prompt + output))
        if need > self.blocks:
            fits = self.tokens - self.lookahead
            raise DraftsimError(
                f"memory too small for one request: the KV cache holds {self.tokens:,} tokens ({self.blocks:,} blocks of "
                f"{self.block_size}), a request of {prompt:,} prompt + {output:,} output tokens needs {need * self.block_size:,} "
                f"with its draft window of {self.lookahead} slots; requests fit while prompt + output <= {max(fits, 0):,} tokens "
                f"(shorten them, use more devices (--tp), a smaller drafter or --kv-tokens)")


@dataclass(frozen=True)
class MemoryPlan:
    """Where one device's memory goes (bytes) and the KV capacity it leaves (tokens)."""

    usable: float
    target_weights: float
    drafter_weights: float
    activations: float
    kv_bytes_per_token: float
    tokens: int

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("usable", "target_weights", "drafter_weights", "activations", "kv_bytes_per_token", "tokens")}

    def describe(self) -> str:
        gb = 1e9
        return (f"{self.usable / gb:.1f} GB usable − {self.target_weights / gb:.1f} GB target weights − "
                f"{self.drafter_weights / gb:.2f} GB drafter weights − {self.activations / gb:.2f} GB activations = "
                f"{self.tokens:,} KV tokens at {self.kv_bytes_per_token / 1e3:.1f} kB/token")


def _activation_bytes(model, tokens: int) -> float:
    """Peak activations of one step of ``tokens`` new tokens on one device of ``model`` (a
    RooflineModel): residual stream, QKV, MLP intermediates (×2 for the gate) and fp32 logits."""
    m, tp = model.model, model.tp
    per_token = (4 * m.hidden + 2 * m.intermediate / tp + (m.heads + 2 * m.kv_heads) * m.head_dim / tp) * model.bytes
    per_token += 4 * m.vocab / tp
    return float(tokens * per_token)


def memory_plan(target, drafters, *, max_batched_tokens: int, separate_drafter: bool = False) -> MemoryPlan | None:
    """The KV capacity of the target's devices for roofline cost models (None when the target's
    cost model knows no memory: a profile or a linear model; give the capacity directly)."""
    drafters = [d for d in drafters if hasattr(d, "weight_bytes_per_device")]  # Max-Gram / bigram: no weights
    if not hasattr(target, "weight_bytes_per_device"):
        return None
    hw = target.hardware
    usable = hw.memory * hw.usable_memory
    wt = float(target.weight_bytes_per_device())
    kv = float(target.kv_bytes_per_device(1, 1))
    wd = 0.0
    act = _activation_bytes(target, max_batched_tokens)
    if not separate_drafter:
        for d in drafters:
            wd += float(d.weight_bytes_per_device())
            kv += float(d.kv_bytes_per_device(1, 1))
            act = max(act, _activation_bytes(d, max_batched_tokens))
    free = usable - wt - wd - act
    if free <= 0:
        raise DraftsimError(
            f"memory too small: on {hw.name}, {wt / 1e9:.1f} GB of target weights + {wd / 1e9:.2f} GB of drafter weights + "
            f"{act / 1e9:.2f} GB of activations exceed the {usable / 1e9:.1f} GB usable per device; nothing is left for the "
            f"KV cache (add devices with --tp, put the drafter on its own device, or lower --max-num-batched-tokens)")
    return MemoryPlan(usable, wt, wd, act, kv, int(free // kv))
