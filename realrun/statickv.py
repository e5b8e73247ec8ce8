"""A static KV cache with fixed shapes: the GPU-grade execution path of the real executors.

:class:`StaticKV` has the interface of :class:`~draftsim.realrun.kvcache.BatchKV` (rows,
rollback, ragged forwards, tree attention, rows joining and leaving) over buffers allocated once:
per layer, keys and values of ``rows`` × KV heads × ``tokens`` × head size. Each row keeps its
tokens in slots 0, 1, … (a row is always compact: a rollback shortens it and the next forward
overwrites the stale slots), so a query at position p sees exactly the slots ≤ p of its row: the
mask is a ragged causal one.

**Fixed shapes.** A forward runs on a padded batch of ``B`` rows (the next bucket ≥ the rows:
1, 2, 4, 8, … up to the capacity), ``N`` new tokens per row (the next power of two ≥ the longest
feed) and attends over the first ``T`` slots (the next power of two ≥ the longest row after it,
at least 16); padding writes land in a row's own slots past its end (stale, overwritten later)
and padding rows are scratch rows of the buffer. So a serving run meets a few dozen shapes.

**CUDA graphs.** On a CUDA device (``graphs=True``, the default there) each shape's decoder
forward — new tokens in, hidden states out, keys and values written into the static buffers —
is captured once as a CUDA graph (after two warm-up runs on a side stream, with the call's
own inputs: writing the same keys twice is harmless) and replayed with its inputs copied into
the graph's static input tensors: one launch instead of one per kernel, which is what takes a
small model's step from launch-bound to bandwidth-bound. The output head runs eagerly on the
rows asked for. On a CPU the same fixed-shape path runs without capture (and is what the tests
hold to the eager path: the same tokens, the same logits within float tolerance).
"""

from __future__ import annotations

from typing import Sequence

from ..sim.cost.profile import STATIC_MIN_WIDTH as MIN_WIDTH  # the shape rule's one definition, priced there
from ..sim.cost.profile import static_new_tokens
from ..sim.errors import DraftsimError
from .kvfeeds import feed_lengths, output_head, pack_feeds, shared_prefix, split_rows
from .models import LoadedModel, cache_arg

__all__ = ["StaticKV", "bucket"]

def bucket(n: int, cap: int | None = None, floor: int = 1) -> int:
    """The next power of two ≥ ``n`` (at least ``floor``), capped at ``cap``."""
    b, n = 1, max(int(n), int(floor))
    while b < n:
        b *= 2
    return b if cap is None else min(b, cap)


class _RowCache:
    """What a transformers decoder calls as its cache for one forward: each layer's new keys
    and values scattered into the static buffers at their rows' slots; the attention gets the
    buffers' first ``T`` slots of the first ``B`` rows."""

    def __init__(self, kv: "StaticKV", B: int, T: int, write):
        self.kv, self.B, self.T, self.write = kv, B, T, write
        self.is_compileable = False

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        K = self.kv.keys[layer_idx][: self.B, :, : self.T]
        V = self.kv.values[layer_idx][: self.B, :, : self.T]
        index = self.write[:, None, :, None].expand(-1, K.shape[1], -1, K.shape[3])
        K.scatter_(2, index, key_states.to(K.dtype))
        V.scatter_(2, index, value_states.to(V.dtype))
        return K, V

    def get_seq_length(self, layer_idx: int = 0) -> int:  # positions are always given; never asked for them
        return self.T


class StaticKV:
    """A batch of sequences in static buffers (see the module docstring).

    ``rows``: the most sequences it holds at once (its buffers' rows); ``tokens``: the most
    tokens a sequence holds (prompt, output and a draft window). ``ids[r]`` are row r's tokens;
    its slots are 0 … len − 1."""

    def __init__(self, loaded: LoadedModel, rows: int, tokens: int, graphs: bool | None = None):
        import torch

        self.loaded = loaded
        self.capacity, self.tokens = int(rows), int(bucket(tokens, floor=MIN_WIDTH))
        if self.capacity < 1:
            raise DraftsimError(f"a static cache needs at least one row; got {rows}")
        cfg = loaded.model.config
        layers = int(cfg.num_hidden_layers)
        heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        dtype = next(loaded.model.parameters()).dtype
        dev = loaded.device
        R = bucket(self.capacity)  # padded batches reach the next bucket
        self.keys = [torch.zeros((R, heads, self.tokens, head_dim), dtype=dtype, device=dev) for _ in range(layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.ids: list[list[int]] = []
        self.pad = int(loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0)
        self.graphs_setting = graphs  # as asked (None: on a CUDA device), the key a released cache is reused by
        self.graphs = (str(dev).startswith("cuda")) if graphs is None else bool(graphs)
        if self.graphs and not str(dev).startswith("cuda"):
            raise DraftsimError("CUDA graphs need a CUDA device")
        self._captured: dict = {}
        self._pool = None

    # -- the BatchKV interface -------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return len(self.ids)

    @property
    def slots(self) -> list[list[int]]:
        return [list(range(len(r))) for r in self.ids]

    @property
    def length(self) -> int:
        """Slots along the time axis in use (the longest row)."""
        return max((len(r) for r in self.ids), default=0)

    @property
    def live(self) -> int:
        return sum(len(r) for r in self.ids)

    @property
    def stale_fraction(self) -> float:
        """Rows are always compact: nothing for a compaction to remove."""
        return 0.0

    def compact(self) -> None:
        """Nothing to do: every row's live slots are 0 … len − 1."""

    def trim(self) -> None:
        """Nothing to do: attention widths follow the longest row."""

    def rollback(self, row: int, context: Sequence[int], limit: int) -> int:
        """Shorten row ``row`` to its longest prefix shared with ``context`` (at most ``limit``
        tokens); that prefix's length."""
        keep = shared_prefix(self.ids[row], context, limit)
        del self.ids[row][keep:]
        return keep

    def add_rows(self, n: int, front: bool = False) -> None:
        """Add ``n`` empty rows after the others (or before them)."""
        if self.rows + n > self.capacity:
            raise DraftsimError(f"the static cache holds {self.capacity} rows; {self.rows + n} asked")
        if front and self.rows:
            order = list(range(n, n + self.rows))
            self._move(list(range(self.rows)), order)
            self.ids = [[] for _ in range(n)] + self.ids
        else:
            self.ids += [[] for _ in range(n)]

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in this order); the others leave (their buffer rows are reused)."""
        rows = list(rows)
        if rows != list(range(len(rows))):
            self._move(rows, list(range(len(rows))))
        self.ids = [self.ids[r] for r in rows]

    def merge(self, other: "StaticKV") -> None:
        """Append ``other``'s rows (copied into this cache's buffers)."""
        if other.rows == 0:
            return
        if self.rows + other.rows > self.capacity:
            raise DraftsimError(f"the static cache holds {self.capacity} rows; {self.rows + other.rows} asked")
        T = other.length
        if T > self.tokens:
            raise DraftsimError(f"a sequence of {T} tokens does not fit the static cache's {self.tokens}")
        at = self.rows
        for mine, theirs in ((self.keys, other.keys), (self.values, other.values)):
            for m, t in zip(mine, theirs):
                m[at: at + other.rows, :, :T].copy_(t[: other.rows, :, :T])
        self.ids += [list(r) for r in other.ids]

    def forward(self, feeds: Sequence[Sequence[int]], keep: Sequence[int], hidden: bool = False, graph: bool = True):
        """As :meth:`BatchKV.forward`: feed row r the tokens ``feeds[r]`` and return, per row,
        the next-token logits after each of its last ``keep[r]`` fed tokens (with ``hidden``,
        also the last layer's hidden states there). ``graph=False``: run this shape eagerly,
        capturing no CUDA graph (a call made once, e.g. a profile's context fill)."""
        import torch

        B, lens, N = feed_lengths(feeds, self.rows)
        if N == 0:
            return split_rows(None, None, [0] * B, hidden)
        if max(len(r) + n for r, n in zip(self.ids, lens)) > self.tokens:
            raise DraftsimError(f"a sequence outgrows the static cache's {self.tokens} tokens; give it more (tokens=...)")
        longest = max(len(r) for r in self.ids)
        # padded to a power of two, or at its own width where that would overflow the buffer
        Bb, Nb = bucket(B, bucket(self.capacity)), int(static_new_tokens(N, longest, self.tokens))
        need = longest + Nb
        Tb = min(bucket(need, floor=MIN_WIDTH), self.tokens)
        ids, pos, ar = pack_feeds(feeds, self.ids, Bb, Nb, self.pad)  # scratch rows (beyond B) write their own first slots
        allowed = torch.arange(Tb)[None, None, :] <= pos[:, :, None]  # the ragged causal mask
        rows = [(r, j) for r in range(B) for j in range(lens[r] - keep[r], lens[r])]
        logits, states = self._run(ids, pos, allowed, rows, hidden, graph=graph)
        for r, f in enumerate(feeds):
            self.ids[r].extend(int(t) for t in f)
        return split_rows(logits, states, keep, hidden)

    def attend(self, tokens: Sequence[int], positions: Sequence[int], allowed, keep: int):
        """Batch of one with the caller's attention pattern (tree attention): as
        :meth:`BatchKV.attend`; ``allowed`` is (N, T + N) over the row's slots, then the new
        tokens (written at slots T …)."""
        import torch

        if self.rows != 1:
            raise DraftsimError(f"attend feeds a batch of one row; this one has {self.rows}")
        N, T = len(tokens), len(self.ids[0])
        if T + N > self.tokens:
            raise DraftsimError(f"a sequence outgrows the static cache's {self.tokens} tokens; give it more (tokens=...)")
        Tb = min(bucket(T + N, floor=MIN_WIDTH), self.tokens)
        ids = torch.as_tensor([list(tokens)], dtype=torch.long)
        mask = torch.zeros((1, N, Tb), dtype=torch.bool)
        mask[0, :, : T + N] = torch.as_tensor(allowed)[:, : T + N]
        write = torch.arange(T, T + N)[None]
        logits, _ = self._run(ids, torch.as_tensor([list(positions)], dtype=torch.long), mask, [(0, j) for j in range(N - keep, N)],
                              False, write=write, graph=False)
        self.ids[0].extend(int(t) for t in tokens)
        return logits

    def precapture(self, max_new: int) -> int:
        """Capture (on a CUDA device) the graph of every shape a decoding step can take: padded
        batches up to the capacity, 1 … ``max_new`` new tokens per row (bucketed), attention widths
        up to the buffer's — before a timed run, so no step pays for a capture. Writes only the
        scratch slots of empty rows: call it before any row holds tokens. The graphs captured."""
        import torch

        if not self.graphs:
            return 0
        if self.rows:
            raise DraftsimError("precapture before any row holds tokens")
        dev = self.loaded.device
        n = 0
        B = 1
        while B <= bucket(self.capacity):
            N = 1
            while N <= bucket(max_new):
                T = bucket(N, floor=MIN_WIDTH)
                while T <= self.tokens:
                    ids = torch.full((B, N), self.pad, dtype=torch.long, device=dev)
                    pos = torch.arange(N, device=dev).repeat(B, 1)
                    allowed = torch.arange(T, device=dev)[None, None, :] <= pos[:, :, None]
                    with torch.inference_mode():
                        self._replay(ids, pos, pos, allowed)
                    n += 1
                    T *= 2
                N *= 2
            B *= 2
        return n

    # -- the forward -----------------------------------------------------------------------------
    def _decoder(self, ids, pos, write, allowed):
        """The decoder's hidden states over ``ids`` (B, N) at positions ``pos``, its keys and
        values written at slots ``write``, query–key pattern ``allowed`` (B, N, T)."""
        import torch

        model = self.loaded.model
        dtype = self.keys[0].dtype
        mask = torch.zeros((allowed.shape[0], 1, *allowed.shape[1:]), dtype=dtype, device=allowed.device)
        mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        decoder = model.get_decoder()
        cache = _RowCache(self, ids.shape[0], allowed.shape[-1], write)
        out = decoder(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_arg(decoder): cache})
        return out.last_hidden_state

    def _run(self, ids, pos, allowed, rows: list, hidden: bool, write=None, graph: bool = True):
        import torch

        dev = self.loaded.device
        ids, pos, allowed = ids.to(dev), pos.to(dev), allowed.to(dev)
        write = pos if write is None else write.to(dev)
        with torch.inference_mode():
            if self.graphs and graph:
                states_all = self._replay(ids, pos, write, allowed)
            else:
                states_all = self._decoder(ids, pos, write, allowed)
            logits, states = output_head(self.loaded, states_all, rows)
        return logits, states if hidden else None

    def _replay(self, ids, pos, write, allowed):
        """The decoder through a CUDA graph of this shape (captured on first use)."""
        import torch

        key = (tuple(ids.shape), allowed.shape[-1])
        got = self._captured.get(key)
        if got is None:
            static = {"ids": ids.clone(), "pos": pos.clone(), "write": write.clone(), "allowed": allowed.clone()}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up: the same keys written at the same slots
                    self._decoder(static["ids"], static["pos"], static["write"], static["allowed"])
            torch.cuda.current_stream().wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                static["out"] = self._decoder(static["ids"], static["pos"], static["write"], static["allowed"])
            got = self._captured[key] = (graph, static)
        graph, static = got
        static["ids"].copy_(ids)
        static["pos"].copy_(pos)
        static["write"].copy_(write)
        static["allowed"].copy_(allowed)
        graph.replay()
        return static["out"]

    def _move(self, src: list, dst: list) -> None:
        """Copy buffer rows ``src`` to rows ``dst`` (all layers; the used slots)."""
        import torch

        T = self.length
        if T == 0:
            return
        s = torch.as_tensor(src, device=self.keys[0].device)
        d = torch.as_tensor(dst, device=self.keys[0].device)
        for buffers in (self.keys, self.values):
            for b in buffers:
                b[d, :, :T] = b[s, :, :T].clone()
