"""The KV cache of the real executors: one class, :class:`BatchKV`, with rollback.

**Ragged batch** (:class:`BatchKV`): one ``DynamicCache`` holds every running sequence's
keys and values, one row per sequence, slots shared along the time axis. A forward feeds
each row its own number of new tokens (right-padded to the longest), with per-sequence
position ids and an explicit 4-D attention mask: a query sees the valid slots of its own
row and the new tokens at or before it. Rejected draft tokens and padding stay in the cache
as *stale* slots, masked out (keys carry their rotary position, so slots may sit anywhere);
the stale tail after every row's last live slot is cut off before each forward
(:meth:`BatchKV.trim`, a slice: at batch 1 no stale slot survives a step); when stale slots
exceed a fraction of the cache the batched server compacts it
(:attr:`draftsim.realrun.serving.Server.compact_ratio`) — every row's valid slots gathered to
the left — so attention stops paying for them. Joiners are prefilled in a cache of their own
and merged in (rows padded to the longer time axis); leavers' rows are dropped.

**Batch of one** (:class:`CachedLM`, the single-stream executors' cache): the same class with
one row that follows the context it is asked about — rolled back to its longest prefix
shared with the context (after rejections, at any level) and trimmed, so only the rest is
fed; a row without stale slots is the model's plain causal call. Tree attention
(:class:`draftsim.realrun.trees.TreeForward`) feeds it through :meth:`BatchKV.attend`.

The model runs its decoder on the new tokens only and its output head on the rows asked
for (for Llama-family models exactly what the model's own forward computes).
"""

from __future__ import annotations

from typing import Sequence

from ..sim.errors import DraftsimError
from .kvfeeds import feed_lengths, output_head, pack_feeds, shared_prefix, split_rows
from .models import LoadedModel, cache_arg

__all__ = ["BatchKV", "CachedLM", "make_kv", "release_kv"]


def make_kv(loaded: LoadedModel, rows: int = 1, graphs: bool | None = None):
    """The cache ``loaded`` executes through: a :class:`~draftsim.realrun.statickv.StaticKV` of
    ``rows`` rows when the model is set to a static cache (``static_tokens``), else a
    :class:`BatchKV` (which grows as it goes). ``graphs`` overrides the model's setting (False:
    a cache used once, e.g. a prefill's). A static cache handed back by :func:`release_kv` is
    reused, emptied — its buffers and CUDA graphs with it (a graph is bound to its buffers)."""
    if loaded.static_tokens is None:
        return BatchKV(loaded)
    from .statickv import StaticKV

    graphs = loaded.graphs if graphs is None else graphs
    free = loaded.kv_pool.get((rows, graphs))
    while free:
        kv = free.pop()
        if kv.tokens >= loaded.static_tokens:  # one made for a longer setting serves too
            kv.ids = []
            return kv
    return StaticKV(loaded, rows, loaded.static_tokens, graphs=graphs)


def release_kv(kv) -> None:
    """Hand a cache back when its generation is over (a static one is kept for reuse)."""
    from .statickv import StaticKV

    if isinstance(kv, StaticKV):
        pool = kv.loaded.kv_pool.setdefault((kv.capacity, kv.graphs_setting), [])
        if kv not in pool and len(pool) < 4:
            pool.append(kv)


class BatchKV:
    """A ragged batch of sequences in one ``DynamicCache`` (see the module docstring).

    Per row (sequence) ``ids[r]`` are the tokens its cache holds, in order, and ``slots[r]``
    the cache slot of each; ``valid`` (rows, T) marks the live slots (all others are padding
    or stale). The model runs its decoder on the new tokens only and its output head on the
    rows asked for.
    """

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.cache = None
        self.valid = None  # bool tensor (rows, T)
        self.ids: list[list[int]] = []
        self.slots: list[list[int]] = []
        self.pad = int(loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0)

    @property
    def rows(self) -> int:
        return len(self.ids)

    @property
    def length(self) -> int:
        """Slots along the time axis (valid and stale)."""
        return 0 if self.valid is None else int(self.valid.shape[1])

    @property
    def live(self) -> int:
        """Valid slots over all rows."""
        return sum(len(s) for s in self.slots)

    @property
    def stale_fraction(self) -> float:
        """The share of the time axis a compaction would remove: slots past the longest row's
        live ones (ragged rows stay padded to the longest)."""
        if self.rows == 0 or self.length == 0:
            return 0.0
        return 1.0 - max(len(s) for s in self.slots) / self.length

    def rollback(self, row: int, context: Sequence[int], limit: int) -> int:
        """Mask out row ``row``'s slots past its longest prefix shared with ``context`` (at most
        ``limit`` tokens) and return that prefix's length."""
        held = self.ids[row]
        keep = shared_prefix(held, context, limit)
        if keep < len(held):
            drop = self.slots[row][keep:]
            self.valid[row, drop] = False
            del held[keep:]
            del self.slots[row][keep:]
        return keep

    def forward(self, feeds: Sequence[Sequence[int]], keep: Sequence[int], hidden: bool = False):
        """Feed row r the tokens ``feeds[r]`` (ragged; empty: nothing) on top of what it holds
        and return, per row, the next-token logits after each of its last ``keep[r]`` fed
        tokens, a (keep[r], V) float tensor (row j follows all but ``keep[r] − 1 − j`` of them);
        with ``hidden``, also the last layer's hidden states there, (keep[r], H) per row.

        A batch of one row without stale slots is the plain causal case: the model builds its
        own mask and positions (the single-stream executors' call, bit for bit)."""
        import torch

        B, lens, N = feed_lengths(feeds, self.rows)
        if N == 0:
            return split_rows(None, None, [0] * B, hidden)
        T = self.length
        ids, pos, ar = pack_feeds(feeds, self.ids, B, N, self.pad)
        new_valid = ar[None, :] < torch.as_tensor(lens)[:, None]  # (B, N)
        key_valid = new_valid if self.valid is None else torch.cat([self.valid, new_valid], dim=1)  # (B, T + N)
        allowed = None
        if B > 1 or not bool(key_valid.all()):
            causal = torch.ones((N, T + N), dtype=torch.bool)
            causal[:, T:] = torch.tril(torch.ones((N, N), dtype=torch.bool))
            allowed = key_valid[:, None, :] & causal[None]  # (B, N, T + N)
            allowed[:, ar, T + ar] = True  # every query sees itself (padding queries included: no empty row)
        rows = [(r, j) for r in range(B) for j in range(lens[r] - keep[r], lens[r])]
        logits, states = self._run(ids, None if allowed is None else pos, allowed, rows, hidden)
        self.valid = key_valid
        for r, f in enumerate(feeds):
            self.ids[r].extend(int(t) for t in f)
            self.slots[r].extend(range(T, T + len(f)))
        return split_rows(logits, states, keep, hidden)

    def attend(self, tokens: Sequence[int], positions: Sequence[int], allowed, keep: int):
        """Batch of one with an attention pattern of the caller's (tree attention): feed
        ``tokens`` at position ids ``positions``, query i seeing the slots where ``allowed[i]``
        (a (N, T + N) bool tensor over the time axis, then the new tokens) is true; the logits
        after the last ``keep`` of them, a (keep, V) float tensor. The new slots are live until
        a :meth:`rollback` finds them off the context."""
        import torch

        if self.rows != 1:
            raise DraftsimError(f"attend feeds a batch of one row; this one has {self.rows}")
        N, T = len(tokens), self.length
        ids = torch.as_tensor([list(tokens)], dtype=torch.long)
        logits, _ = self._run(ids, torch.as_tensor([list(positions)], dtype=torch.long), allowed[None],
                              [(0, j) for j in range(N - keep, N)], False)
        new_valid = torch.ones((1, N), dtype=torch.bool)
        self.valid = new_valid if self.valid is None else torch.cat([self.valid, new_valid], dim=1)
        self.ids[0].extend(int(t) for t in tokens)
        self.slots[0].extend(range(T, T + N))
        return logits

    def _run(self, ids, pos, allowed, rows: list, hidden: bool):
        """The model's decoder over ``ids`` (B, N) on top of the cache, at position ids ``pos``
        with query–key pattern ``allowed`` (B, N, T + N) (both None: the model's own causal
        ones), and its output head on ``rows`` ((row, index) pairs): (logits, hidden states or
        None), one row each."""
        import torch
        from transformers import DynamicCache

        model, dev = self.loaded.model, self.loaded.device
        mask = None
        if allowed is not None:
            dtype = next(model.parameters()).dtype
            mask = torch.zeros((allowed.shape[0], 1, *allowed.shape[1:]), dtype=dtype)
            mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
            mask = mask.to(dev)
        if self.cache is None:
            self.cache = DynamicCache()
        with torch.inference_mode():
            decoder = model.get_decoder()
            out = decoder(input_ids=ids.to(dev), attention_mask=mask, position_ids=None if pos is None else pos.to(dev),
                          use_cache=True, **{cache_arg(decoder): self.cache})
            logits, states = output_head(self.loaded, out.last_hidden_state, rows)
        return logits, states if hidden else None

    def add_rows(self, n: int, front: bool = False) -> None:
        """Add ``n`` empty rows (to be filled by a later forward), after the others or before them."""
        import torch

        def join(mine, extra):
            return [*extra, *mine] if front else [*mine, *extra]

        self.ids = join(self.ids, [[] for _ in range(n)])
        self.slots = join(self.slots, [[] for _ in range(n)])
        if self.valid is not None:
            self.valid = torch.cat(join([self.valid], [torch.zeros((n, self.length), dtype=torch.bool)]))
            for layer in self._layers():
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    setattr(layer, name, torch.cat(join([t], [t.new_zeros((n, *t.shape[1:]))])))

    def merge(self, other: "BatchKV") -> None:
        """Append ``other``'s rows (their slots keep their places; the shorter time axis is padded)."""
        import torch

        if other.rows == 0:
            return
        if other.cache is None:  # rows that hold nothing yet
            self.add_rows(other.rows)
            return
        if self.cache is None:  # rows that hold nothing yet go first, as empty rows of other's shape
            mine = self.rows
            self.cache, self.valid, self.ids, self.slots = other.cache, other.valid, other.ids, other.slots
            if mine:
                self.add_rows(mine, front=True)
            return
        T = max(self.length, other.length)

        def pad(t, axis):
            extra = T - t.shape[axis]
            if extra == 0:
                return t
            shape = list(t.shape)
            shape[axis] = extra
            return torch.cat([t, t.new_zeros(shape)], dim=axis)

        for mine, theirs in zip(self._layers(), other._layers()):
            mine.keys = torch.cat([pad(mine.keys, 2), pad(theirs.keys, 2)])
            mine.values = torch.cat([pad(mine.values, 2), pad(theirs.values, 2)])
        self.valid = torch.cat([pad(self.valid, 1), pad(other.valid, 1)])
        self.ids += other.ids
        self.slots += other.slots

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in this order); the others leave the batch."""
        import torch

        rows = list(rows)
        if not rows:
            self.cache, self.valid, self.ids, self.slots = None, None, [], []
            return
        if rows == list(range(self.rows)):
            return
        if self.valid is None:  # rows that hold nothing yet
            self.ids = [self.ids[r] for r in rows]
            self.slots = [self.slots[r] for r in rows]
            return
        idx = torch.as_tensor(rows, dtype=torch.long)
        for layer in self._layers():
            layer.keys = layer.keys[idx.to(layer.keys.device)]
            layer.values = layer.values[idx.to(layer.values.device)]
        self.valid = self.valid[idx]
        self.ids = [self.ids[r] for r in rows]
        self.slots = [self.slots[r] for r in rows]

    def trim(self) -> None:
        """Cut the time axis after the last slot any row still uses: the stale tail a rollback
        leaves (at batch 1, every rejected draft token) goes at the price of a slice, so
        attention never pays for it; stale slots between live ones wait for :meth:`compact`."""
        if self.rows == 0 or self.valid is None:
            return
        T = max((s[-1] + 1 for s in self.slots if s), default=0)
        if T == 0:  # every row rolled back to nothing
            self.cache, self.valid = None, None
            return
        if T >= self.length:
            return
        for layer in self._layers():
            for name in ("keys", "values"):
                setattr(layer, name, getattr(layer, name)[:, :, :T])
        self.valid = self.valid[:, :T]

    def compact(self) -> None:
        """Gather every row's valid slots to the left; the time axis shrinks to the longest row."""
        import torch

        if self.rows == 0:
            return
        T = max(len(s) for s in self.slots)
        index = torch.zeros((self.rows, T), dtype=torch.long)
        for r, s in enumerate(self.slots):
            if s:
                index[r, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        for layer in self._layers():
            for name in ("keys", "values"):
                t = getattr(layer, name)
                g = index.to(t.device)[:, None, :, None].expand(t.shape[0], t.shape[1], T, t.shape[3])
                setattr(layer, name, torch.gather(t, 2, g))
        self.valid = torch.arange(T)[None, :] < torch.as_tensor([len(s) for s in self.slots])[:, None]
        self.slots = [list(range(len(s))) for s in self.slots]

    def _layers(self):
        return [] if self.cache is None else [layer for layer in self.cache.layers if getattr(layer, "is_initialized", True)]


class CachedLM:
    """One sequence's cache: a :class:`BatchKV` of one row that follows the context it is
    asked about (see the module docstring). ``ids`` are the tokens it holds, ``fed`` the
    tokens the last call fed."""

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.kv = make_kv(loaded, 1)
        self.kv.add_rows(1)
        self.fed = 0

    @property
    def ids(self) -> list[int]:
        return self.kv.ids[0]

    def release(self) -> None:
        """The generation is over: hand the cache back (see :func:`release_kv`)."""
        release_kv(self.kv)

    def rollback(self, context: list[int], limit: int) -> int:
        """Drop the cached slots past the longest prefix shared with ``context`` (at most
        ``limit`` tokens) — the one place the cache shrinks — and return that prefix's length."""
        keep = self.kv.rollback(0, context, limit)
        self.kv.trim()
        return keep

    def logits(self, context: list[int], n_rows: int = 1, hidden: bool = False):
        """Next-token logits after each of the last ``n_rows`` prefixes of ``context``
        (row j follows ``context[: len(context) - n_rows + 1 + j]``), as a (n_rows, V) tensor;
        with ``hidden``, also the last layer's hidden states at those positions."""
        need = len(context) - n_rows  # the cache may hold at most this much of the context
        if need < 0:
            raise DraftsimError(f"asked for {n_rows} rows of a {len(context)}-token context")
        keep = self.rollback(context, need)
        new = context[keep:]
        out = self.kv.forward([new], [n_rows], hidden=hidden)
        self.fed = len(new)
        if hidden:
            return out[0][0], out[1][0]
        return out[0]
