"""The cost interface: how long one forward call of one model over a batch takes.

A forward call (a *step* of a serving engine) processes a batch of sequences; sequence i
brings ``n_i`` new tokens (1 for a decoding step, k+1 for a verification, hundreds for a
prefill chunk) on top of ``c_i`` tokens already in its KV cache. Every backend answers

    forward_time(new_tokens, context) -> seconds

with ``new_tokens`` and ``context`` arrays shaped ``(calls, batch)`` (any leading shape; the
last axis is the batch). Ragged batches are padded with ``new_tokens == 0``: a slot with no new
tokens is absent and its context is ignored. The answer has the leading shape ``(calls,)``.
``bound`` says what limits each call: ``"overhead"`` (fixed per-call software/launch time),
``"memory"`` (bytes moved), ``"compute"`` (FLOPs), or ``"idle"`` for an empty call.

A call depends on its batch only through four sums (:class:`BatchStats`): active sequences
B, new tokens N = Σ n_i, cached tokens Σ c_i over active sequences and query–key pairs
Σ n_i (c_i + (n_i + 1) / 2) (causal attention inside the new tokens). Backends implement
``_time(stats)`` and ``_bound(stats)``; :meth:`CostModel.shape_time` evaluates uniform batches
(B sequences of n new tokens on c cached tokens each) without materialising the batch axis,
which is what sweeps over millions of shapes use.

The papers' cost coefficient c (draft call / target call, Cascade Speculative Drafting §2,
SpecDec++ §3) is the ratio of two models' one-token calls: :func:`coefficient`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import DraftsimError, as_count

if TYPE_CHECKING:
    from .memory import MemoryFootprint

__all__ = ["BOUNDS", "BatchStats", "CostModel", "coefficient"]

_min = np.minimum.reduce  # (ndarray.min without its wrapper)

#: What limits a call, as returned by :meth:`CostModel.bound` (index = the code of ``_bound``).
BOUNDS = ("idle", "overhead", "memory", "compute")


@dataclass(frozen=True)
class BatchStats:
    """The sums a forward call's time depends on; arrays of one common shape (one per call).

    sequences : active sequences B (those with at least one new token)
    tokens    : new tokens N = Σ n_i
    cached    : Σ c_i over active sequences (KV entries read besides the new ones)
    pairs     : Σ n_i (c_i + (n_i + 1) / 2), the query–key pairs of causal attention
    rows      : logit rows the call keeps (None: one per new token); a prefill keeps one.
                A profile with a last-row table prices the rows not kept as saved; other
                backends price every new token
    padded    : optional (..., 3) array: the decoding sequences as a right-padded batch —
                their number, the most new tokens and the longest context among them
    prefill   : optional (..., 2) array: the prefilling sequences and their new tokens.
                The backends price the sums above; a model of a server that pads its batch
                and prefills apart (``analysis.servecheck.StepCost``, ``step_shape``) reads these two
    """

    sequences: np.ndarray
    tokens: np.ndarray
    cached: np.ndarray
    pairs: np.ndarray
    rows: np.ndarray | None = None
    padded: np.ndarray | None = None
    prefill: np.ndarray | None = None

    @classmethod
    def of_batch(cls, new_tokens, context=0) -> "BatchStats":
        """Sums over the last (batch) axis of ``new_tokens`` and ``context`` (broadcast)."""
        n = as_count("new_tokens", new_tokens)
        c = as_count("context", context)
        if n.ndim == 0:
            n = n[None]
        n, c = np.broadcast_arrays(n, c)
        active = n > 0
        nf = n.astype(np.float64)
        cf = np.where(active, c, 0).astype(np.float64)
        return cls(
            sequences=active.sum(axis=-1).astype(np.float64),
            tokens=nf.sum(axis=-1),
            cached=cf.sum(axis=-1),
            pairs=(nf * (cf + (nf + 1.0) / 2.0)).sum(axis=-1),
        )

    @classmethod
    def of_shape(cls, batch, new_tokens, context=0) -> "BatchStats":
        """Uniform batches: ``batch`` sequences of ``new_tokens`` new tokens on ``context`` cached
        tokens each (arrays broadcast against each other). Sizes must be >= 1 (context >= 0)."""
        b, n, c = (_sizes(name, x, lo) for name, x, lo in (("batch", batch, 1), ("new_tokens", new_tokens, 1), ("context", context, 0)))
        tokens = b * n
        pairs = n + 1.0
        pairs *= 0.5
        pairs = (pairs + c) * tokens  # out of place: c and tokens may have more dimensions than n
        b, tokens, cached, pairs = np.broadcast_arrays(b, tokens, b * c, pairs)
        return cls(sequences=b, tokens=tokens, cached=cached, pairs=pairs)

    @property
    def mean_new_tokens(self) -> np.ndarray:
        """New tokens per active sequence (0 for an empty call)."""
        return np.divide(self.tokens, self.sequences, out=np.zeros_like(self.tokens), where=self.sequences > 0)

    @property
    def mean_context(self) -> np.ndarray:
        """Cached tokens per active sequence (0 for an empty call)."""
        return np.divide(self.cached, self.sequences, out=np.zeros_like(self.cached), where=self.sequences > 0)


def _sizes(name: str, x, minimum: int) -> np.ndarray:
    """``x`` as float64 after checking integers >= minimum (integer arrays: one min pass)."""
    return checked_sizes(name, x, minimum).astype(np.float64)


def checked_sizes(name: str, x, minimum: int) -> np.ndarray:
    """``x`` as an integer array of values >= minimum; integer input costs one min pass
    (no copy), other input the full :func:`~draftsim.sim.errors.as_count` check."""
    arr = np.asarray(x)
    if np.issubdtype(arr.dtype, np.integer) and not np.issubdtype(arr.dtype, np.bool_):
        if arr.size and arr.min() < minimum:
            as_count(name, arr, minimum=minimum)  # raises, naming the first bad value
        return arr
    return as_count(name, arr, minimum=minimum)


class CostModel:
    """Seconds of one forward call of one model over a batch (see the module docstring).

    Subclasses implement ``_time(stats) -> seconds`` and ``_bound(stats) -> int codes into
    BOUNDS``; both receive a :class:`BatchStats` and return arrays of its shape. An empty call
    (no active sequence) takes 0 s and is ``"idle"`` in every backend.
    """

    #: A short human-readable description (model, hardware, backend).
    name: str = "cost model"
    #: Whether the model reads a step's make-up (``BatchStats.padded``/``prefill``); the
    #: serving simulator fills those only for such models (they cost a step its time).
    step_shape: bool = False

    def _time(self, stats: BatchStats) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _bound(self, stats: BatchStats) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- batches: (calls, batch) arrays -------------------------------------------------------
    def forward_time(self, new_tokens, context=0) -> np.ndarray:
        """Seconds per call; ``new_tokens`` and ``context`` are (..., batch) integer arrays
        (broadcast; 0 new tokens = empty slot). Returns shape (...)."""
        return self.stats_time(BatchStats.of_batch(new_tokens, context))

    def bound(self, new_tokens, context=0) -> np.ndarray:
        """What limits each call: an array of strings from :data:`BOUNDS`, shape (...)."""
        return self.stats_bound(BatchStats.of_batch(new_tokens, context))

    # -- uniform shapes: (batch, new tokens, context) broadcast -------------------------------
    def shape_time(self, batch, new_tokens, context=0) -> np.ndarray:
        """Seconds of a call over ``batch`` sequences with ``new_tokens`` each on ``context``
        cached tokens each; the three broadcast against each other."""
        return self.stats_time(BatchStats.of_shape(batch, new_tokens, context))

    def shape_bound(self, batch, new_tokens, context=0) -> np.ndarray:
        """:meth:`bound` for uniform shapes."""
        return self.stats_bound(BatchStats.of_shape(batch, new_tokens, context))

    def one_token(self, context: int = 0) -> float:
        """Seconds of a one-sequence, one-token call at ``context`` (a decoding step)."""
        return float(self.shape_time(1, 1, context))

    # -- device memory ---------------------------------------------------------------------------
    def memory(self) -> "MemoryFootprint | None":
        """What the model holds in device memory (:class:`~draftsim.sim.cost.memory.MemoryFootprint`),
        or None where it is not known (a measured profile, a fixed or linear cost: give the KV
        capacity directly). Backends that know their weights and KV cache override it."""
        return None

    # -- shared plumbing -----------------------------------------------------------------------
    def stats_time(self, stats: BatchStats) -> np.ndarray:
        t = np.asarray(self._time(stats), dtype=np.float64)
        sequences = stats.sequences
        if _min(sequences, axis=None, initial=np.inf) <= 0:  # empty calls take 0 s
            t = np.where(sequences <= 0, 0.0, t)
        return t[()]

    def stats_bound(self, stats: BatchStats) -> np.ndarray:
        codes = np.where(stats.sequences > 0, self._bound(stats), 0)
        out = np.asarray(BOUNDS, dtype=object)[np.asarray(codes)]
        return out if isinstance(out, str) else out[()]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def coefficient(drafter: CostModel, target: CostModel, batch=1, new_tokens=1, context=0) -> np.ndarray:
    """Cost coefficient c = t_draft / t_target of one call each at the same shape
    (Cascade Speculative Drafting §2 and SpecDec++ §3 use batch 1, one new token)."""
    t = target.shape_time(batch, new_tokens, context)
    if np.any(t <= 0):
        raise DraftsimError("the target's call must take time > 0 to define a cost coefficient")
    return (drafter.shape_time(batch, new_tokens, context) / t)[()]
