"""Speculation controllers: per batch step, cap what the drafting policies may draft.

A serving engine runs every request's drafting policy (:mod:`draftsim.sim.policies`) inside a batch.
Under load, drafting costs more than it saves (the target's verification of Σ(k_i + 1)
tokens turns compute-bound), so a controller looks at the step — its batch size and the
requests' contexts — and returns a cap on the tokens each request may propose; 0 turns
speculation off for the step (every request decodes one token). The same controller objects
serve the serving simulator (:mod:`draftsim.sim.serving`) and a real batched server.

Protocol: ``bind(policy, process, target, drafters, max_batch)`` once (checks, tables), then
``caps(batch, context)`` with arrays of the steps' batch sizes and mean contexts returns one
cap per step (:data:`NO_CAP` = unlimited). ``batch_dependent`` says whether the cap can change
when the batch does.

Controllers (mini-language :data:`CONTROLLER_HELP`):

* ``none`` — the policies draft as they like;
* ``disable:above=B`` — no drafting in steps of more than B sequences (vLLM's
  ``speculative_disable_by_batch_size``);
* ``table:k=1-8:4,9-32:2,33-:0`` — k per batch-size range (vLLM's dynamic speculative decoding
  tables); ranges must start at 1 and leave no gap and no overlap;
* ``goodput[:kmax=8]`` — SmartSpec (Liu et al., *Optimizing Speculative Decoding for Serving
  Large Language Models Using Goodput*, 2024, §4): the k maximising the expected tokens
  emitted per unit step time, B·E[tokens | k] / T(B, k), where E[tokens | k] = 1 + Σ_{i≤k}
  Π_{j≤i} α_j under the acceptance model (α_j by draft position; a constant α gives
  (1 − α^{k+1}) / (1 − α), Leviathan et al. eq. 1) and T(B, k) = k drafter steps over the
  batch + one target call of B(k + 1) tokens at the batch's context, from the cost models.
  It models chain drafts of drafter 1 (for a tree policy a cap is a depth: the serving
  simulator then verifies the nodes of the kept levels).
"""

from __future__ import annotations

import re

import numpy as np

from .acceptance import Positional
from .errors import DraftsimError, as_count
from .params import Entry, Param, Parametrised, Registry, ascii_int

__all__ = ["Controller", "NoControl", "DisableAbove", "KTable", "Goodput", "CONTROLLERS", "CONTROLLER_HELP", "parse_controller",
           "NO_CAP", "expected_tokens"]

#: A cap that caps nothing.
NO_CAP = 1 << 20


def expected_tokens(process, k) -> np.ndarray:
    """E[tokens emitted by a round drafting k tokens with drafter 1] = 1 + Σ_{i≤k} Π_{j≤i} α_j
    (accepted prefix + the bonus/correction token), for each k of ``k`` (array)."""
    k = np.asarray(k, dtype=np.int64)
    kmax = int(k.max(initial=0))
    const = process.constant(1, 0)
    if const is not None:
        a = np.full(max(kmax, 1), const)
    elif isinstance(process, Positional):
        a = process.alphas[np.minimum(np.arange(max(kmax, 1)), len(process.alphas) - 1)]
    else:
        a = np.full(max(kmax, 1), float(process.stationary_alpha()))
    prefix = np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(a))])
    return prefix[k]


class Controller(Parametrised):
    """Base class: no cap."""

    batch_dependent = False

    def bind(self, policy, process, target, drafters, max_batch: int) -> None:
        return None

    def caps(self, batch: np.ndarray, context: np.ndarray) -> np.ndarray:
        return np.full(np.shape(batch), NO_CAP, dtype=np.int64)

    def cap(self, batch: int, context: int = 0) -> int:
        """The cap of one step of ``batch`` sequences at mean context ``context`` (for
        executors that step one batch at a time)."""
        return int(self.caps(np.array([int(batch)]), np.array([int(context)]))[0])


class NoControl(Controller):
    """The policies draft as they like."""


class DisableAbove(Controller):
    """No drafting in steps with more than ``above`` sequences."""

    batch_dependent = True

    def __init__(self, above: int):
        self.above = int(as_count("disable above", above, minimum=0, maximum=1 << 20))

    def caps(self, batch, context):
        return np.where(np.asarray(batch) > self.above, 0, NO_CAP).astype(np.int64)


_RANGE = re.compile(r"\s*([0-9]+)\s*(?:(-)\s*([0-9]*))?\s*:\s*([0-9]+)\s*", re.ASCII)


class KTable(Controller):
    """k by batch-size range: ``ranges`` is a list of (lo, hi or None for open, k)."""

    batch_dependent = True

    def __init__(self, k):
        ranges = _parse_table(k) if isinstance(k, str) else [tuple(r) for r in k]
        if not ranges:
            raise DraftsimError("a K table needs at least one range (e.g. 1-8:4,9-:0)")
        ranges = sorted(ranges, key=lambda r: r[0])
        if ranges[0][0] != 1:
            raise DraftsimError(f"a K table must start at batch size 1; its first range starts at {ranges[0][0]} (gap 1-{ranges[0][0] - 1})")
        for (lo, hi, _), (lo2, hi2, _) in zip(ranges, ranges[1:]):
            if hi is None or lo2 <= hi:
                raise DraftsimError(f"K table ranges overlap: {_fmt(lo, hi)} and {_fmt(lo2, hi2)}")
            if lo2 > hi + 1:
                raise DraftsimError(f"K table has a gap: batch sizes {hi + 1}-{lo2 - 1} are in no range")
        for lo, hi, _ in ranges:
            if hi is not None and hi < lo:
                raise DraftsimError(f"K table range {lo}-{hi} is empty (its end is below its start)")
        self.ranges = tuple(ranges)
        last = ranges[-1][1]
        size = (last if last is not None else ranges[-1][0]) + 1
        self._lut = np.zeros(size + 1, dtype=np.int64)
        for lo, hi, kk in ranges:
            self._lut[lo: (hi if hi is not None else size) + 1] = kk

    def bind(self, policy, process, target, drafters, max_batch):
        last = self.ranges[-1][1]
        if last is not None and last < max_batch:
            raise DraftsimError(f"the K table ends at batch size {last} but batches reach max_num_seqs = {max_batch}; "
                                f"end it with an open range (e.g. {last + 1}-:0)")

    def caps(self, batch, context):
        b = np.asarray(batch, dtype=np.int64)
        return self._lut[np.minimum(b, len(self._lut) - 1)]

    def __repr__(self):
        return "KTable(" + ",".join(f"{_fmt(lo, hi)}:{k}" for lo, hi, k in self.ranges) + ")"


def _fmt(lo, hi) -> str:
    return f"{lo}-" if hi is None else (f"{lo}" if hi == lo else f"{lo}-{hi}")


def _parse_table(text: str) -> list[tuple]:
    out = []
    for item in text.split(","):
        m = _RANGE.fullmatch(item)
        if not m:
            raise DraftsimError(f"K table entries are LO-HI:K, LO-:K (open) or N:K with ASCII digits; got {item.strip()!r} in {text!r}")
        lo, dash, hi, k = int(m[1]), m[2], m[3], int(m[4])
        if lo < 1:
            raise DraftsimError(f"K table batch sizes start at 1; got {item.strip()!r}")
        if k > 256:
            raise DraftsimError(f"K table k must be in [0, 256]; got {k} in {item.strip()!r}")
        out.append((lo, (int(hi) if hi else None) if dash else lo, k))
    return out


class Goodput(Controller):
    """SmartSpec's goodput-optimal k per step (see the module docstring); ``k_max`` bounds
    the search (default: the policy's own draft bound)."""

    batch_dependent = True

    def __init__(self, k_max: int | None = None):
        self.k_max = None if k_max is None else int(as_count("goodput kmax", k_max, minimum=1, maximum=64))
        self._cache: dict = {}

    def bind(self, policy, process, target, drafters, max_batch):
        bound = policy.max_draft
        if bound <= 0:
            raise DraftsimError("the goodput controller needs a drafting policy (the policy drafts nothing)")
        self._ks = np.arange(0, min(self.k_max or bound, bound) + 1)
        self._tokens = expected_tokens(process, self._ks)
        self._target = target
        self._drafter = drafters[0] if drafters else None
        self._cache = {}

    def best_k(self, batch: int, context: int) -> int:
        key = (int(batch), int(context) >> 6)
        hit = self._cache.get(key)
        if hit is None:
            b, c, ks = max(int(batch), 1), int(context), self._ks
            t = self._target.shape_time(b, ks + 1, c)
            if self._drafter is not None:
                t = t + ks * float(self._drafter.shape_time(b, 1, c))
            hit = int(ks[np.argmax(self._tokens / t)])
            self._cache[key] = hit
        return hit

    def caps(self, batch, context):
        b = np.asarray(batch, dtype=np.int64)
        c = np.asarray(context, dtype=np.int64)
        return np.array([self.best_k(x, y) for x, y in zip(b.tolist(), c.tolist())], dtype=np.int64).reshape(b.shape)

    def __repr__(self):
        return f"Goodput(k_max={self.k_max!r})"


#: The controller mini-language (``--controller``).
CONTROLLERS = Registry("controller", base=Controller, entries=[
    Entry("none", NoControl, (), (("none", "no cap: the policy drafts as it likes (default)"),)),
    Entry("disable", DisableAbove, (Param("above", ascii_int, required=True),),
          (("disable:above=32", "no drafting in steps of more than 32 sequences"),)),
    Entry("table", KTable, (Param("k", str, required=True),),
          (("table:k=1-8:4,9-32:2,33-:0", "k per batch-size range (vLLM dynamic SD); no gaps/overlaps"),)),
    Entry("goodput", Goodput, (Param("kmax", ascii_int, "k_max"),),
          (("goodput[:kmax=8]", "SmartSpec: the k maximising expected tokens per step time"),)),
])

CONTROLLER_HELP = CONTROLLERS.help


def parse_controller(spec: str) -> Controller:
    """A controller from the mini-language, e.g. ``disable:above=32``."""
    return CONTROLLERS.parse(spec)
