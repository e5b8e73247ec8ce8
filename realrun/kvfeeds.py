"""What both KV caches of the real executors (:mod:`~draftsim.realrun.kvcache`'s ragged
:class:`~draftsim.realrun.kvcache.BatchKV` and :mod:`~draftsim.realrun.statickv`'s fixed-shape
:class:`~draftsim.realrun.statickv.StaticKV`) do alike: how much of a row's held context a new
call shares, how the rows' new tokens are packed into one right-padded feed, and how the
output head runs on the rows asked for."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..sim.errors import DraftsimError
from .models import LoadedModel

__all__ = ["shared_prefix", "feed_lengths", "pack_feeds", "split_rows", "output_head"]


def shared_prefix(held: Sequence[int], context: Sequence[int], limit: int) -> int:
    """The length of the longest common prefix of ``held`` and ``context``, at most ``limit``."""
    n = min(len(held), limit)
    if list(held[:n]) == list(context[:n]):
        return n
    return int(np.flatnonzero(np.asarray(held[:n]) != np.asarray(context[:n]))[0])


def feed_lengths(feeds: Sequence[Sequence[int]], rows: int) -> tuple[int, list[int], int]:
    """(rows fed, each feed's length, the longest), checked against the batch's ``rows``."""
    if len(feeds) != rows:
        raise DraftsimError(f"{len(feeds)} feeds for a batch of {rows} rows")
    lens = [len(f) for f in feeds]
    return len(feeds), lens, max(lens, default=0)


def pack_feeds(feeds: Sequence[Sequence[int]], held: Sequence[Sequence[int]], rows: int, width: int, pad: int):
    """The feeds as a (rows, width) tensor of token ids right-padded with ``pad``, and each
    token's position (row r's tokens follow the ``len(held[r])`` it holds; rows beyond the feeds
    count from 0)."""
    import torch

    ids = torch.full((rows, width), pad, dtype=torch.long)
    ar = torch.arange(width)
    pos = ar.repeat(rows, 1)
    for r, f in enumerate(feeds):
        if f:
            ids[r, : len(f)] = torch.as_tensor(list(f), dtype=torch.long)
        pos[r] += len(held[r])
    return ids, pos, ar


def split_rows(logits, states, keep: Sequence[int], hidden: bool):
    """A forward's logits (and hidden states) asked for, split per row: ``keep[r]`` rows each
    (None for a row that asked for none)."""
    out, out_h, at = [], [], 0
    for k in keep:
        out.append(logits[at: at + k] if k else None)
        out_h.append(states[at: at + k] if k and hidden else None)
        at += k
    return (out, out_h) if hidden else out


def output_head(loaded: LoadedModel, hidden_states, rows: list):
    """The model's output head on the ``rows`` ((row, index) pairs) of its last hidden states
    (B, N, H): (logits as float, hidden states), or (None, None) for no rows."""
    import torch

    if not rows:
        return None, None
    dev = hidden_states.device
    rr = torch.as_tensor([r for r, _ in rows], device=dev)
    jj = torch.as_tensor([j for _, j in rows], device=dev)
    states = hidden_states[rr, jj]  # (rows, H)
    return loaded.model.get_output_embeddings()(states).float(), states
