"""Paged KV cache: how many tokens fit, and how many blocks a request holds.

Memory is paged as in vLLM (Kwon et al., *PagedAttention*, SOSP 2023): the cache is a pool
of blocks of ``block_size`` token slots; a request holds ⌈tokens / block_size⌉ blocks. The
pool's capacity is what the device's usable memory leaves (:func:`memory_plan`):

    capacity = usable memory − weights (target + drafters on that device) − activations
               − CUDA graphs (where the engine's KV budget leaves them out),

in units of one token's KV entries in every model that caches it: the target's and, for
drafters sharing the target's device, the drafters' (a draft model keeps its own cache of the
same tokens; an EAGLE, EAGLE-3 or MTP head caches its decoder layer's K and V for every token,
vLLM allocating them in the same pool; a Medusa head caches nothing). Drafting heads always
share the target's devices. The device that holds the drafters (device 0 of the target's
tensor-parallel group) is the tightest and sets the capacity. Each model says what it holds
through one interface, :meth:`draftsim.sim.cost.base.CostModel.memory` (a
:class:`~draftsim.sim.cost.memory.MemoryFootprint`, or None where a profile or a linear model
does not know). Activations are the peak working set of one step of ``max_num_batched_tokens``
tokens (hidden states, MLP intermediates and logits of the new tokens, the largest model's;
an estimate — vLLM measures it with a profiling run).

A running request reserves the slots of its draft window beyond its tokens (``lookahead`` =
the most tokens a step can add: k_max + 1, vLLM's lookahead slots), so a verification never
runs out of slots halfway; a request being prefilled holds the blocks of what it has
prefilled so far.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DraftsimError, as_count

__all__ = ["KVCache", "MemoryPlan", "memory_plan", "graph_memory", "blocks_for"]


def blocks_for(tokens, block_size: int) -> np.ndarray:
    """⌈tokens / block_size⌉ (vectorised; a Python int for an int)."""
    if type(tokens) is int:
        return -(-tokens // block_size)
    return _ceil_div(np.asarray(tokens, dtype=np.int64), 0, block_size)


def _ceil_div(tokens: np.ndarray, extra, block_size: int) -> np.ndarray:
    """⌈(tokens + extra) / block_size⌉ of non-negative integers, in a new array."""
    out = tokens + (extra + (block_size - 1))
    if block_size & (block_size - 1):
        out //= block_size
    else:  # a power of two: a shift, the same integers
        out >>= int(block_size).bit_length() - 1
    return out


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

    def request_blocks(self, tokens, decoding=True):
        """The blocks a running request holds — the one rule of the pool: ⌈(tokens + lookahead) /
        block_size⌉ once its prefill is complete (``decoding``: the draft window reserved beyond
        the tokens in its cache), ⌈tokens / block_size⌉ while it prefills (what it has
        prefilled). A Python int for a Python int; vectorised over arrays of tokens (a window's
        (steps, lanes) contexts) and of ``decoding``."""
        if type(tokens) is int:
            return -(-(tokens + (self.lookahead if decoding else 0)) // self.block_size)
        if decoding is True or decoding is False:
            extra = self.lookahead if decoding else 0
        else:
            extra = self.lookahead * np.asarray(decoding, dtype=np.int64)
        return _ceil_div(np.asarray(tokens, dtype=np.int64), extra, self.block_size)

    def check_request(self, prompt: int, output: int) -> None:
        """Raise unless one request of ``prompt`` + ``output`` tokens fits alone (say what fits)."""
        need = self.request_blocks(int(prompt) + int(output))
        if need > self.blocks:
            fits = self.tokens - self.lookahead
            raise DraftsimError(
                f"memory too small for one request: the KV cache holds {self.tokens:,} tokens ({self.blocks:,} blocks of "
                f"{self.block_size}), a request of {prompt:,} prompt + {output:,} output tokens needs {need * self.block_size:,} "
                f"with its draft window of {self.lookahead} slots; requests fit while prompt + output <= {max(fits, 0):,} tokens "
                f"(shorten them, use more devices (--tp), a smaller drafter or --kv-tokens)")


@dataclass(frozen=True)
class MemoryPlan:
    """Where one device's memory goes (bytes) and the KV capacity it leaves (tokens).

    usable                     : the device memory the engine may take (the hardware's usable share)
    target_weights             : the target's weights on the device
    drafter_weights            : the drafters' weights on it: draft models sharing the device and
                                 drafting heads (EAGLE, EAGLE-3, Medusa, MTP), which always do
    activations                : the peak working set of one step of ``max_num_batched_tokens``
    kv_bytes_per_token         : KV bytes one cached token takes in every model that caches it
                                 (the target's and the drafters' on this device)
    tokens                     : KV capacity in tokens: what is left, in units of ``kv_bytes_per_token``
    drafter_kv_bytes_per_token : the drafters' share of ``kv_bytes_per_token``
    graph_memory               : the engine's CUDA graphs, where the engine takes them out of the
                                 KV cache's budget (``graph_note`` says how the engine accounts them)
    unknown                    : drafters whose memory is not known (measured profiles), not counted
    """

    usable: float
    target_weights: float
    drafter_weights: float
    activations: float
    kv_bytes_per_token: float
    tokens: int
    drafter_kv_bytes_per_token: float = 0.0
    graph_memory: float = 0.0
    graph_note: str = ""
    unknown: tuple[str, ...] = ()

    FIELDS = ("usable", "target_weights", "drafter_weights", "activations", "kv_bytes_per_token", "tokens",
              "target_kv_bytes_per_token", "drafter_kv_bytes_per_token", "graph_memory", "graph_note", "unknown")

    @property
    def target_kv_bytes_per_token(self) -> float:
        """The target's share of ``kv_bytes_per_token``."""
        return self.kv_bytes_per_token - self.drafter_kv_bytes_per_token

    @property
    def used(self) -> float:
        """Every byte the plan places: weights, activations, graphs and the KV cache's tokens."""
        return self.target_weights + self.drafter_weights + self.activations + self.graph_memory + self.tokens * self.kv_bytes_per_token

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.FIELDS}
        out["unknown"] = list(self.unknown)
        return out

    def describe(self) -> str:
        gb = 1e9
        kv = f"{self.kv_bytes_per_token / 1e3:.1f} kB/token"
        if self.drafter_kv_bytes_per_token or self.drafter_weights:
            kv += f" (target {self.target_kv_bytes_per_token / 1e3:.1f} + drafter {self.drafter_kv_bytes_per_token / 1e3:.1f})"
        graphs = f" − {self.graph_memory / gb:.2f} GB CUDA graphs"
        if self.graph_note:
            graphs += f" ({self.graph_note})"
        unknown = f"; memory of {', '.join(self.unknown)} not known, not counted" if self.unknown else ""
        return (f"{self.usable / gb:.1f} GB usable − {self.target_weights / gb:.1f} GB target weights − "
                f"{self.drafter_weights / gb:.2f} GB drafter weights − {self.activations / gb:.2f} GB activations{graphs} = "
                f"{self.tokens:,} KV tokens at {kv}{unknown}")


def graph_memory(engine) -> tuple[float, str]:
    """Bytes of ``engine``'s CUDA graphs that its KV budget leaves out, and how the engine accounts
    them (sim/data/engines.json, the engine's ``cuda_graph_memory``): (0, "") for no engine, the
    ``none`` engine or an engine that captures no graphs (``graph_tokens`` None)."""
    if engine is None or engine.graph_tokens is None:
        return 0.0, ""
    entry = _engine_entries().get(engine.name, {}).get("cuda_graph_memory") or {}
    return float(entry.get("bytes_in_kv_budget", 0.0)), str(entry.get("plan_note", ""))


_ENTRIES: dict = {}


def _engine_entries() -> dict:
    if not _ENTRIES:
        import json

        from ..cost.overheads import ENGINES_FILE

        _ENTRIES.update(json.loads(ENGINES_FILE.read_text())["engines"])
    return _ENTRIES


def memory_plan(target, drafters, *, max_batched_tokens: int, separate_drafter: bool = False, engine=None) -> MemoryPlan | None:
    """The KV capacity of the target's devices from what each cost model holds
    (:meth:`~draftsim.sim.cost.base.CostModel.memory`); None when the target's memory is not
    known (a profile or a linear model: give the capacity directly).

    Drafting heads always share the target's devices; draft models do unless
    ``separate_drafter``. ``engine`` (an :class:`~draftsim.sim.cost.overheads.EngineOverheads`;
    None: none) adds the CUDA-graph memory its KV budget leaves out (:func:`graph_memory`)."""
    own = target.memory()
    if own is None:
        return None
    hw = target.hardware
    usable = hw.memory * hw.usable_memory
    wd = kvd = 0.0
    act_per_token = own.activation_per_token
    unknown = []
    for d in drafters:
        f = d.memory()
        if f is None:
            unknown.append(str(d.name))
            continue
        if separate_drafter and not f.attached:
            continue
        wd += f.weights
        kvd += f.kv_per_token
        act_per_token = max(act_per_token, f.activation_per_token)
    wt, act = own.weights, act_per_token * max_batched_tokens
    graphs, note = graph_memory(engine)
    kv = own.kv_per_token + kvd
    free = usable - wt - wd - act - graphs
    if free <= 0:
        raise DraftsimError(
            f"memory too small: on {hw.name}, {wt / 1e9:.1f} GB of target weights + {wd / 1e9:.2f} GB of drafter weights + "
            f"{act / 1e9:.2f} GB of activations" + (f" + {graphs / 1e9:.2f} GB of CUDA graphs" if graphs else "") +
            f" exceed the {usable / 1e9:.1f} GB usable per device; nothing is left for the "
            f"KV cache (add devices with --tp, put the drafter on its own device, or lower --max-num-batched-tokens)")
    return MemoryPlan(usable, wt, wd, act, kv, int(free // kv), kvd, graphs, note, tuple(unknown))
