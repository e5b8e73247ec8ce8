"""The time axis of a ragged batch cache: how wide the KV cache a serving step attends over is.

A paged server (vLLM) reads each sequence's own blocks, so a step costs what its contexts
cost. A server that keeps the whole batch in **one dense cache** — one row per sequence,
slots shared along the time axis, as :mod:`draftsim.realrun.serving` does with a Hugging Face
``DynamicCache`` — computes every row over the cache's full width, and that width is not the
longest context:

* a step appends every row's new tokens at the same slots (right-padded to the most new
  tokens of any row); the rejected draft tokens stay behind as masked *stale* slots;
* before each forward the stale tail after every row's last live slot is cut off (a slice);
* joiners are prefilled apart and merged in (the shorter time axis padded); leavers' rows
  are dropped, their slots stay;
* when the stale share of the axis exceeds ``compact_ratio`` (and it holds at least
  ``compact_min`` slots) the cache is compacted: every row's live slots gathered to the left.

So the width drifts above the longest context by up to ``1 / (1 − compact_ratio)`` (×2 at
the real server's 0.5) and falls back at a compaction. On a CPU, where a forward's time is
affine in the width it attends over (the cache is copied and read every step), pricing a
step at its longest context instead underprices some stretches of a run by 10% and more.
:class:`RaggedLayout` replays that bookkeeping for the serving simulator's steps;
``analysis.servecheck`` sets it from the real run's trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DraftsimError

__all__ = ["RaggedLayout", "LayoutState"]


@dataclass(frozen=True)
class RaggedLayout:
    """The dense ragged cache's compaction rule (the real server's ``compact_ratio`` and
    ``compact_min``)."""

    compact_ratio: float = 0.5
    compact_min: int = 64

    def __post_init__(self):
        if not 0.0 <= float(self.compact_ratio) < 1.0:
            raise DraftsimError(f"compact_ratio {self.compact_ratio!r}: must be in [0, 1)")
        if int(self.compact_min) < 0:
            raise DraftsimError(f"compact_min {self.compact_min!r}: must be ≥ 0")

    def steps(self, state: "LayoutState", lanes: np.ndarray, active: np.ndarray, n: np.ndarray, e: np.ndarray,
              c: np.ndarray, joined: np.ndarray, leaves: np.ndarray) -> tuple[np.ndarray, np.ndarray, list]:
        """Widths of a window of steps over ``lanes`` (request ids), as the dense cache has them.

        active, n, e, c : (W, B) whether a lane decodes in a step, its new tokens, the tokens it
                          emits and its live context before the step (what its row holds)
        joined          : (B,) the tokens a lane's prefill in step 0 left in the cache (it is
                          merged in at that step's end); NaN for lanes already in the cache
        leaves          : (B,) the step a lane finishes in (−1 or ≥ W: none in the window)

        Returns the width each step's forward attends over (W,) (0 where nothing decodes),
        whether the step compacted (W,), and the state after each step (W snapshots, for
        :meth:`LayoutState.after`)."""
        W, B = active.shape
        width = np.zeros(W)
        compacted = np.zeros(W, dtype=bool)
        snaps = []
        end = state.ends(lanes)  # per lane: one past its last live slot (NaN: not in the cache)
        length = state.length
        for w in range(W):
            act = active[w]
            slots = np.full(B, np.nan)  # per row, its slots until the next step's rollback
            if act.any():
                T = float(np.nanmax(end[act]))  # the stale tail is cut before the forward
                width[w] = T
                length = T + float(n[w][act].max())
                slots = np.where(act, c[w] + n[w], slots)
                end = np.where(act, T + e[w], end)  # the rollback keeps the emitted tokens' slots
            if w == 0 and not np.isnan(joined).all():
                length = max(length, float(np.nanmax(joined)))  # merged: the shorter axis padded
                slots = np.where(np.isnan(joined), slots, joined)
                end = np.where(np.isnan(joined), end, joined)
            gone = leaves == w
            end = np.where(gone, np.nan, end)
            slots = np.where(gone, np.nan, slots)
            held = ~np.isnan(slots)
            if np.isnan(end).all():
                length = 0.0
            elif held.any() and length >= self.compact_min:
                longest = float(np.nanmax(slots))
                if 1.0 - longest / length > self.compact_ratio:
                    compacted[w] = True
                    length = longest
                    # every row's slots now start at 0; the rollback then keeps what it emitted
                    end = np.where(act & held, c[w] + e[w], end)
            snaps.append((end.copy(), length))
        return width, compacted, snaps


class LayoutState:
    """Per request, one past its last live slot in the dense cache, and the cache's length
    (its time axis, stale tail included) — kept by a replica between windows."""

    def __init__(self, requests: int):
        self._end = np.full(requests, np.nan)
        self.length = 0.0

    def ends(self, lanes: np.ndarray) -> np.ndarray:
        return self._end[lanes].astype(np.float64)

    def after(self, lanes: np.ndarray, snap: tuple) -> None:
        """Keep the snapshot of the last committed step."""
        end, self.length = snap
        self._end[lanes] = end
