"""Measured cost profiles: forward times on a grid of batch × new tokens × context.

``draftsim profile`` (:mod:`draftsim.realrun.profiling`) measures a model on this machine and writes
a profile file; :class:`ProfileCost` reads it back and answers the cost interface by
interpolation between grid points:

* at each context grid point multilinear in log(time) over log(batch) and log(new tokens),
  so power laws between grid points are followed exactly; between context grid points linear
  in time (a call's attention FLOPs and KV-cache reads grow linearly with its context, so an
  affine cost is followed exactly — interpolating in log–log space overpriced mid-grid
  contexts by ~6% at batch 16 on this CPU);
* monotone (by default): the stored medians are first made non-decreasing along each axis
  (running maximum; noise that says a bigger call took less time is dropped), and
  multilinear interpolation of data monotone along each axis stays monotone along each axis.
  That is an assumption, and on this CPU a false one for some shapes: a forward of 16 token
  rows costs ~25% less than one of 12–15 (the GEMM library switches kernels at 16 rows), so
  pricing measured shapes as they are (``monotone=False``, what ``check-serve`` does) keeps
  the medians as measured;
* no extrapolation: a shape outside the grid raises :class:`~draftsim.sim.errors.DraftsimError` naming
  the value and the grid's range (``extrapolate="clamp"`` answers with the nearest edge
  instead and :meth:`ProfileCost.outside` flags such shapes).

A ragged batch is priced as the uniform batch of its active sequences with the mean new
tokens and mean context of those sequences (exact for uniform batches).

A timed forward computes the output head (logits) at every new token. Callers that keep
fewer rows — a prefill needs the last row only, a drafter catching up on accepted tokens one
— ask ``shape_time(..., rows=r)``: with the optional **last-row table** (``last_row_seconds``:
the same calls at batch 1 computing the last row's logits only, measured by ``draftsim
profile``) each row not kept saves (t(1, n, c) − t_last(1, n, c)) / (n − 1); without it,
every row is priced.

File format (JSON, ``schema`` "draftsim.cost-profile", ``version`` 1): the grid axes,
median seconds and spread (half the inter-quartile range) per grid point, repeats, the
drafters' proposal seconds per token, optionally the last-row table (``last_row_seconds``,
new tokens × context at batch 1; files without it price every row), and a fingerprint of the model (name, dtype,
architecture hash), of the machine (CPU/GPU model, cores, torch version) and of the forward
call timed (``path``: ``model`` or ``server``, see :attr:`ProfileCost.path`). Written
atomically, validated on read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import DraftsimError, as_count, shown
from ..files import atomic_write_json, parse_json, read_text
from .base import BatchStats, CostModel

__all__ = ["PATHS", "PROFILE_SCHEMA", "PROFILE_VERSION", "STATIC_MIN_WIDTH", "ProfileCost", "load_profile", "pow2", "static_new_tokens", "static_shape"]

PROFILE_SCHEMA = "draftsim.cost-profile"
PROFILE_VERSION = 1
_AXES = ("batch", "new_tokens", "context")
_LUT_MAX = 1 << 20  # integer axes up to this size are looked up in a table


@dataclass(eq=False)
class ProfileCost(CostModel):
    """Measured forward times of one model on one machine (see the module docstring).

    seconds, spread : arrays (len(batch), len(new_tokens), len(context)) of medians and half
    inter-quartile ranges; drafters : proposal seconds per token of cheap drafters (Max-Gram,
    bigram) by name; fingerprint : {"model": {...}, "machine": {...}}.
    """

    model: str
    batch: tuple
    new_tokens: tuple
    context: tuple
    seconds: np.ndarray
    spread: np.ndarray | None = None
    repeats: int = 1
    dtype: str = "float32"
    device: str = "cpu"
    fingerprint: dict = field(default_factory=dict)
    drafters: dict = field(default_factory=dict)
    created: str = ""
    extrapolate: str = "refuse"
    last_row_seconds: np.ndarray | None = None
    #: Interpolate between the medians made non-decreasing along each axis (robust to noise;
    #: the default), or between the medians as measured: on a CPU a forward of 16 token rows
    #: can cost less than one of 15 (the GEMM library switches kernels), which a monotone
    #: table prices as the dearer one.
    monotone: bool = True

    def __post_init__(self):
        axes = []
        for name in _AXES:
            v = np.asarray(getattr(self, name))
            lo = 0 if name == "context" else 1
            if v.ndim != 1 or len(v) < 1 or not np.issubdtype(v.dtype, np.integer) or (v < lo).any() or (np.diff(v) <= 0).any():
                raise DraftsimError(f"profile {name} axis must be strictly increasing integers >= {lo}; got {v.tolist()}")
            axes.append(v)
            setattr(self, name, tuple(int(x) for x in v))
        shape = tuple(len(a) for a in axes)
        self.seconds = np.asarray(self.seconds, dtype=np.float64)
        if self.seconds.shape != shape:
            raise DraftsimError(f"profile seconds must have shape {shape} (batch x new_tokens x context); got {self.seconds.shape}")
        if not (np.isfinite(self.seconds).all() and (self.seconds > 0).all()):
            raise DraftsimError("profile seconds must be finite and > 0")
        if self.spread is not None:
            self.spread = np.asarray(self.spread, dtype=np.float64)
            if self.spread.shape != shape:
                raise DraftsimError(f"profile spread must have shape {shape}; got {self.spread.shape}")
        self._last = None
        if self.last_row_seconds is not None:
            last = np.asarray(self.last_row_seconds, dtype=np.float64)
            if last.shape != shape[1:] or not (np.isfinite(last).all() and (last > 0).all()):
                raise DraftsimError(f"profile last_row_seconds must hold finite times > 0 of shape {shape[1:]} (new_tokens x context)")
            if self.batch[0] != 1:
                raise DraftsimError("a profile's last_row_seconds are batch-1 calls: its batch axis must start at 1")
            self.last_row_seconds = last
            self._last = ProfileCost(self.model, (1,), self.new_tokens, self.context, last[None], extrapolate="clamp",
                                     monotone=self.monotone)
        if self.extrapolate not in ("refuse", "clamp"):
            raise DraftsimError(f"extrapolate must be 'refuse' or 'clamp'; got {self.extrapolate!r}")
        mono = self.seconds
        for ax in range(3 if self.monotone else 0):
            mono = np.maximum.accumulate(mono, axis=ax)
        self._log_t = np.log(mono).ravel()
        self._strides = (shape[1] * shape[2], shape[2], 1)
        # log(batch), log(new tokens); context linear (its cost is affine in the context)
        self._coords = [np.log(axes[0].astype(np.float64)), np.log(axes[1].astype(np.float64)), axes[2].astype(np.float64)]
        self._luts = [self._lut(i, a) for i, a in enumerate(axes)]
        self.name = f"profile of {self.model} ({self.dtype}, {self.device})"

    # -- interpolation ---------------------------------------------------------------------------
    def _lut(self, axis: int, grid: np.ndarray):
        """(cell index, weight) for every integer 0..max of the axis (fast path)."""
        hi = int(grid[-1])
        if hi > _LUT_MAX:
            return None
        x = np.arange(hi + 1)
        return self._locate_float(axis, x.astype(np.float64), clamp=True)

    def _locate_float(self, axis: int, x: np.ndarray, clamp: bool):
        g = self._coords[axis]
        if len(g) == 1:
            return np.zeros(x.shape, dtype=np.int64), np.zeros(x.shape)
        lx = x if axis == 2 else np.log(np.maximum(x, 1e-300))
        pos = np.interp(lx, g, np.arange(len(g), dtype=np.float64))
        i = np.minimum(pos.astype(np.int64), len(g) - 2)
        return i, pos - i

    def _locate(self, axis: int, x: np.ndarray):
        grid = (self.batch, self.new_tokens, self.context)[axis]
        lut = self._luts[axis]
        if lut is not None and np.issubdtype(x.dtype, np.integer):
            xi = np.clip(x, 0, grid[-1])
            return lut[0][xi], lut[1][xi]
        return self._locate_float(axis, np.asarray(x, dtype=np.float64), clamp=True)

    def _table2(self):
        """Seconds at every integer (batch, new tokens) up to the grid's ends and every
        context grid point, flattened; None when that table would be large."""
        if not hasattr(self, "_t2"):
            nb, nn = self.batch[-1] + 1, self.new_tokens[-1] + 1
            self._t2 = None
            if nb * nn * len(self.context) <= (1 << 22) and self._luts[0] is not None and self._luts[1] is not None:
                b, n, c = np.meshgrid(np.arange(nb), np.arange(nn), np.asarray(self.context), indexing="ij")
                saved, self.extrapolate = self.extrapolate, "clamp"
                try:
                    self._t2 = self.lookup(b.astype(np.float64), n.astype(np.float64), c.astype(np.float64)).ravel()
                finally:
                    self.extrapolate = saved
        return self._t2

    def outside(self, batch, new_tokens, context) -> np.ndarray:
        """Whether each shape lies outside the measured grid (broadcast)."""
        out = np.zeros(np.broadcast_shapes(np.shape(batch), np.shape(new_tokens), np.shape(context)), dtype=bool)
        for name, x in zip(_AXES, (batch, new_tokens, context)):
            grid = getattr(self, name)
            out |= (np.asarray(x) < grid[0]) | (np.asarray(x) > grid[-1])
        return out

    def _check_inside_axis(self, name: str, lo, hi) -> None:
        grid = getattr(self, name)
        if self.extrapolate == "refuse" and (lo < grid[0] or hi > grid[-1]):
            bad = lo if lo < grid[0] else hi
            raise DraftsimError(f"{name} {_fmt(bad)} is outside the profile's grid [{grid[0]}, {grid[-1]}] for {self.model}; "
                                "measure a wider grid (draftsim profile) or use the roofline")

    def lookup(self, batch, new_tokens, context) -> np.ndarray:
        """Interpolated seconds at uniform shapes (arrays broadcast; integer arrays take a
        table-lookup fast path); shapes outside the grid are refused (or clamped)."""
        b, n, c = (np.asarray(v) for v in (batch, new_tokens, context))
        for name, x in zip(_AXES, (b, n, c)):
            if x.size:
                self._check_inside_axis(name, x.min(), x.max())
        return self._lookup(b, n, c)

    def _lookup(self, b: np.ndarray, n: np.ndarray, c: np.ndarray) -> np.ndarray:
        table = self._table2() if all(np.issubdtype(v.dtype, np.integer) for v in (b, n, c)) else None
        if table is not None and self._luts[2] is not None:
            # batch and new tokens by table, then one interpolation along context
            cols = len(self.context)
            if self.extrapolate != "refuse":  # refused shapes never get here: they lie inside the tables
                b, n, c = np.clip(b, 0, self.batch[-1]), np.clip(n, 0, self.new_tokens[-1]), np.clip(c, 0, self.context[-1])
            shape = np.broadcast_shapes(b.shape, n.shape, c.shape)
            b, n, c = (np.atleast_1d(x) for x in np.broadcast_arrays(b, n, c))
            k = np.multiply(b, (self.new_tokens[-1] + 1) * cols, dtype=np.int64)  # few fresh arrays: first-touch page faults dominate
            tmp = np.multiply(n, cols, dtype=np.int64)
            k += tmp
            k += self._luts[2][0].take(c, out=tmp)
            w2 = self._luts[2][1].take(c)
            lo = table.take(k)
            if cols > 1:  # linear in time along context
                k += 1
                hi = table.take(k)
                hi -= lo
                hi *= w2
                lo += hi
            return lo.reshape(shape)[()]
        (i0, w0), (i1, w1), (i2, w2) = self._locate(0, b), self._locate(1, n), self._locate(2, c)
        s0, s1, s2 = self._strides
        base = i0 * s0 + i1 * s1 + i2 * s2
        lt = self._log_t
        d0 = s0 if len(self.batch) > 1 else 0
        d1 = s1 if len(self.new_tokens) > 1 else 0
        d2 = s2 if len(self.context) > 1 else 0
        # at the two context grid points around c: log time over log new tokens, then log batch;
        # then linear in time along context (as the table path above)
        def along1(k):
            return lt[k] + w1 * (lt[k + d1] - lt[k])
        def at_context(k):
            lo = along1(k)
            return np.exp(lo + w0 * (along1(k + d0) - lo))
        lo = at_context(base)
        return (lo + w2 * (at_context(base + d2) - lo))[()]

    def row_saving(self, new_tokens, context) -> np.ndarray:
        """Seconds a call of ``new_tokens`` at ``context`` saves per logit row it does not
        compute (0 without a last-row table, and for one-token calls)."""
        n = np.maximum(np.asarray(new_tokens, dtype=np.float64), 1.0)
        if self._last is None:
            return np.zeros(np.shape(n))[()]
        # outside the grid: the saving per row at its edge
        ng = np.clip(n, self.new_tokens[0], self.new_tokens[-1])
        c = np.clip(np.asarray(context, dtype=np.float64), self.context[0], self.context[-1])
        saved = self.lookup(1.0, ng, c) - self._last.lookup(1.0, ng, c)
        return np.where((n > 1) & (ng > 1), np.maximum(saved, 0.0) / np.maximum(ng - 1, 1.0), 0.0)[()]

    # -- the cost interface ----------------------------------------------------------------------
    def shape_time(self, batch, new_tokens, context=0, rows=None) -> np.ndarray:
        """Seconds of a call of ``batch`` sequences × ``new_tokens`` at ``context``; ``rows``:
        logit rows kept per sequence (default all new tokens; see the module docstring)."""
        t = self._shape_time(batch, new_tokens, context)
        if rows is None or self._last is None:
            return t
        b, n = np.asarray(batch, dtype=np.float64), np.asarray(new_tokens, dtype=np.float64)
        dropped = b * (n - np.minimum(np.asarray(rows, dtype=np.float64), n))
        # never below a one-token call of the same batch and context (it computes no less): a
        # saving measured once on a loaded machine, taken over many dropped rows, could price a
        # call at less than nothing
        floor = self._shape_time(batch, np.ones_like(n), context)
        return np.maximum(t - dropped * self.row_saving(n, context), np.minimum(floor, t))[()]

    def static_time(self, batch, new_tokens, context, rows=None, max_rows=None, max_tokens=None) -> np.ndarray:
        """Seconds of a call through a static cache (:func:`static_shape`): the grid point of the
        same padded shape — the largest batch, new tokens and context of the grid that pad to it —
        as measured, or with ``rows`` logit rows kept per sequence as :meth:`shape_time` (the
        cache's output head runs on the rows asked for, not the padding's); NaN where the grid
        holds no point of that shape. A static cache's time is a step
        function of its padded shape, so interpolating between grid points of different shapes
        misprices it (5 new tokens run as 8: interpolated between 4 and 8 they were priced ~12%
        under on an H200)."""
        B, n, c = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (batch, new_tokens, context)))
        key = np.stack(static_shape(B, n, c, max_rows, max_tokens), axis=-1).reshape(-1, 3)
        r = None if rows is None else np.broadcast_to(np.asarray(rows, dtype=np.float64), B.shape).reshape(-1)
        gb, gn, gc = (np.asarray(x, dtype=np.float64) for x in (self.batch, self.new_tokens, self.context))
        out = np.full(len(key), np.nan)
        shapes, inverse = np.unique(key, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        for j, (bb, nb, tb) in enumerate(shapes):
            ib = gb[pow2(gb) == bb]  # a grid point ran in the profiler's own cache, padded but not capped
            inn = gn[pow2(gn) == nb]
            ic = gc[np.asarray(static_shape(1, nb, gc, None, max_tokens)[2]) == tb] if len(inn) else gc[:0]
            if not (len(ib) and len(inn) and len(ic)):
                continue
            sel = inverse == j
            kept = None if r is None else np.minimum(r[sel], inn.max())  # rows of the grid point's batch
            out[sel] = self.shape_time(ib.max(), inn.max(), ic.max(), rows=kept)
        return out.reshape(B.shape)

    def _shape_time(self, batch, new_tokens, context=0) -> np.ndarray:
        values = [np.asarray(v) for v in (batch, new_tokens, context)]
        for name, v, lo in zip(_AXES, values, (1, 1, 0)):
            if not np.issubdtype(v.dtype, np.integer):  # integer arrays need only the range checks below
                as_count(name, v, minimum=lo)
            elif v.size:
                vmin = v.min()
                if vmin < lo:
                    as_count(name, v, minimum=lo)  # raises, naming the value
                self._check_inside_axis(name, vmin, v.max())
        return self._lookup(*values)

    def _time(self, stats: BatchStats) -> np.ndarray:
        active = stats.sequences > 0
        b = np.where(active, stats.sequences, self.batch[0])
        n = np.where(active, stats.mean_new_tokens, self.new_tokens[0])
        c = np.where(active, stats.mean_context, self.context[0])
        return self.rows_adjusted(self.lookup(b, n, c), stats)

    def rows_adjusted(self, t, stats: BatchStats) -> np.ndarray:
        """``t`` (a call's time with logits at every new token) for the logit rows ``stats``
        keeps (no change without a last-row table or ``stats.rows``)."""
        if stats.rows is None or self._last is None:
            return t
        dropped = np.maximum(stats.tokens - stats.rows, 0.0)
        adjusted = t - dropped * self.row_saving(stats.mean_new_tokens, stats.mean_context)
        # never below a one-token call of the same batch and context, as shape_time (it computes no less): a
        # saving measured once on a loaded machine, taken over a long prefill's rows, priced it below nothing
        # (a negative step time, 'Negative delay' in the serving replay)
        b = np.clip(np.maximum(np.asarray(stats.sequences, dtype=np.float64), 1.0), self.batch[0], self.batch[-1])
        c = np.clip(np.asarray(stats.mean_context, dtype=np.float64), self.context[0], self.context[-1])
        floor = self._lookup(b, np.ones_like(b), c + np.zeros_like(b))
        return np.maximum(adjusted, np.minimum(floor, t))

    def _bound(self, stats: BatchStats) -> np.ndarray:
        # measured: no decomposition; call it overhead-bound where it costs no more than a
        # one-token call of the same batch would (the flat part of the step), else compute
        t = self._time(stats)
        b = np.where(stats.sequences > 0, stats.sequences, self.batch[0])
        t1 = self.lookup(np.clip(b, self.batch[0], self.batch[-1]), self.new_tokens[0], self.context[0])
        return np.where(t <= 1.05 * t1, 1, 3)

    # -- files -----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "schema": PROFILE_SCHEMA, "version": PROFILE_VERSION, "model": self.model, "dtype": self.dtype, "device": self.device,
            "created": self.created, "fingerprint": self.fingerprint, "repeats": self.repeats,
            "batch": list(self.batch), "new_tokens": list(self.new_tokens), "context": list(self.context),
            "seconds": self.seconds.tolist(), "spread": None if self.spread is None else self.spread.tolist(),
            "drafters": self.drafters,
            **({"last_row_seconds": self.last_row_seconds.tolist()} if self.last_row_seconds is not None else {}),
        }

    def save(self, path) -> None:
        """Write the profile atomically (temp file + rename)."""
        atomic_write_json(path, self.to_dict())

    @property
    def path(self) -> str:
        """The forward call the profile timed (``draftsim profile --path``): ``model`` (the
        model's own call; profiles that do not say) or ``server`` (the batched serving loop's)."""
        return str(self.fingerprint.get("path", "model"))

    def check_fingerprint(self, model: dict | None = None, machine: dict | None = None) -> None:
        """Raise unless the profile was measured for ``model`` on ``machine`` (the keys given)."""
        for what, expected in (("model", model), ("machine", machine)):
            if not expected:
                continue
            have = self.fingerprint.get(what, {})
            diff = [k for k, v in expected.items() if have.get(k) != v]
            if diff:
                k = diff[0]
                raise DraftsimError(f"the profile was measured for another {what}: {k} is {have.get(k)!r} in the profile, "
                                    f"{expected[k]!r} here; measure this one with draftsim profile")


#: The smallest attention width a static cache's forward uses (slots): :mod:`draftsim.realrun.statickv`
#: runs at these shapes, the simulator prices them (:func:`static_shape`).
#: What a profile times: ``model`` — the model's own forward over a ``DynamicCache`` (no
#: attention mask: the single-stream executors' calls); ``server`` — the batched serving
#: loop's forward (:meth:`draftsim.realrun.kvcache.BatchKV.forward`: for several rows an
#: explicit ragged attention mask and position ids per row; one row without stale slots is
#: the model's plain causal call; the logit rows picked after the decoder), the calls
#: ``draftsim serve`` makes and ``check-serve`` prices; ``server-static`` — the same loop
#: through the static cache (:class:`draftsim.realrun.statickv.StaticKV`: fixed shapes, each
#: shape a CUDA graph on a CUDA device), as ``draftsim serve --static-cache`` runs it;
#: ``server-prefill`` — a joiner's prefill as that server runs it (``Server._prefill``): a fresh
#: one-row static cache per call, run eagerly (a cache used once captures no CUDA graph), at
#: batch 1 and context 0 only. On an H200 the graphed ``server-static`` calls priced the served
#: prefills 24-28 ms short each (figures/gpu-h200, third lease).
PATHS = ("model", "server", "server-static", "server-prefill")

STATIC_MIN_WIDTH = 16


def pow2(x) -> np.ndarray:
    """The next power of two ≥ x (elementwise, at least 1): a static cache's padded sizes."""
    return 2.0 ** np.ceil(np.log2(np.maximum(np.asarray(x, dtype=np.float64), 1.0)))


def static_new_tokens(new_tokens, longest, max_tokens):
    """The new tokens per row a static cache computes a call at (:meth:`StaticKV.forward
    <draftsim.realrun.statickv.StaticKV.forward>`, and check-serve's price of a joiner's prefill, at
    ``longest`` 0): the next power of two, unless that would take the longest row (``longest``
    tokens) past the cache's ``max_tokens`` slots, when the call runs at its own length."""
    padded = pow2(new_tokens)
    return np.where(np.asarray(longest, dtype=np.float64) + padded <= max_tokens, padded, np.asarray(new_tokens, dtype=np.float64))


def static_shape(batch, new_tokens, context, max_rows=None, max_tokens=None):
    """The padded shape (B, N, T) a static cache (:class:`draftsim.realrun.statickv.StaticKV`)
    computes a call of ``batch`` rows × ``new_tokens`` at ``context`` (its longest row) at: the
    batch to the next power of two (at most ``max_rows``'), the new tokens likewise, and attention
    over the next power of two ≥ the longest row after the padded call, at least
    :data:`STATIC_MIN_WIDTH` slots, at most the cache's ``max_tokens``' (arrays broadcast)."""
    Nb = pow2(new_tokens)
    Bb = pow2(batch) if max_rows is None else np.minimum(pow2(batch), pow2(max_rows))
    Tb = np.maximum(pow2(np.asarray(context, dtype=np.float64) + Nb), STATIC_MIN_WIDTH)
    if max_tokens:
        Tb = np.minimum(Tb, pow2(max(int(max_tokens), STATIC_MIN_WIDTH)))
    return Bb, Nb, Tb


def load_profile(path, extrapolate: str = "refuse", monotone: bool = True) -> ProfileCost:
    """Read and validate a profile file written by :meth:`ProfileCost.save` (``monotone``: see
    :attr:`ProfileCost.monotone`)."""
    # one line naming the file for invalid JSON, nesting past the bound and integers past Python's digit limit
    doc = parse_json(read_text(path, "profile file", fifo=False), f"profile {path}")
    if not isinstance(doc, dict) or doc.get("schema") != PROFILE_SCHEMA:
        raise DraftsimError(f"{path} is not a draftsim cost profile (schema {PROFILE_SCHEMA!r})")
    if doc.get("version") != PROFILE_VERSION:
        raise DraftsimError(f"{path}: profile version {doc.get('version')!r} is not supported (this draftsim reads {PROFILE_VERSION})")
    missing = [k for k in ("model", "batch", "new_tokens", "context", "seconds", "fingerprint") if k not in doc]
    if missing:
        raise DraftsimError(f"{path}: profile is missing field(s) {', '.join(missing)}")
    _check_fields(doc, path)
    try:
        return ProfileCost(
            model=doc["model"], batch=doc["batch"], new_tokens=doc["new_tokens"], context=doc["context"],
            seconds=doc["seconds"], spread=doc.get("spread"), repeats=doc.get("repeats", 1), dtype=doc.get("dtype", ""),
            device=doc.get("device", ""), fingerprint=doc["fingerprint"] or {}, drafters=doc.get("drafters") or {},
            created=doc.get("created", ""), extrapolate=extrapolate,
            last_row_seconds=doc.get("last_row_seconds"), monotone=monotone,
        )
    except (TypeError, ValueError) as exc:
        raise DraftsimError(f"{path}: invalid profile: {exc}") from None


#: The bounds of a profile file's values: grid axes (as a step table's), seconds per call (a
#: forward faster than a nanosecond or slower than a million seconds is no measurement: a
#: denormal time overflowed the cost coefficients), repeats.
_AXIS_MAX = 2**24
_SECONDS = (1e-9, 1e6)
_REPEATS_MAX = 10**6


def _number_array(doc: dict, key: str, path) -> np.ndarray | None:
    """A profile's nested list of numbers ``key`` as floats (None when absent or null); booleans,
    strings and integers past float range refused in one line naming the file and the field."""
    value = doc.get(key)
    if value is None:
        return None
    stack = [value]
    while stack:  # every leaf a number, never a boolean (JSON's true is no count or time)
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, bool) or not isinstance(x, (int, float)) or (isinstance(x, int) and abs(x).bit_length() > 1023):
            raise DraftsimError(f"{path}: profile field '{key}' holds {shown(x)}; valid: numbers (nested lists of them)")
    try:
        return np.asarray(value, dtype=np.float64)
    except ValueError:  # ragged lists: the shape check names them
        return None


def _check_fields(doc: dict, path) -> None:
    """Every field a profile file is read for, typed and in range (:func:`load_profile`): one line
    naming the file, the field, its value and what is valid."""
    def bad(key, value, valid):
        return DraftsimError(f"{path}: profile field '{key}' is {shown(value)}; valid: {valid}")

    if isinstance(doc.get("version"), bool):
        raise bad("version", doc["version"], PROFILE_VERSION)
    if not isinstance(doc["model"], str) or not doc["model"].strip():
        raise bad("model", doc["model"], "the model's name (a non-empty string)")
    for key in ("dtype", "device", "created"):
        if key in doc and not isinstance(doc[key], str):
            raise bad(key, doc[key], "a string")
    repeats = doc.get("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= _REPEATS_MAX:
        raise bad("repeats", repeats, f"a whole number in [1, {_REPEATS_MAX:,}]")
    for key in _AXES:
        axis = _number_array(doc, key, path)
        lo = 0 if key == "context" else 1
        if axis is not None and axis.ndim == 1 and ((axis < lo) | (axis > _AXIS_MAX)).any():
            raise bad(key, doc[key], f"whole numbers in [{lo}, {_AXIS_MAX:,}], strictly increasing")
    for key in ("seconds", "spread", "last_row_seconds"):
        arr = _number_array(doc, key, path)
        if arr is None:
            continue
        lo, hi = (0.0, _SECONDS[1]) if key == "spread" else _SECONDS
        out = ~((arr >= lo) & (arr <= hi))
        if out.any():
            raise DraftsimError(f"{path}: profile field '{key}' holds {arr[out].flat[0]:g}; valid: seconds in [{lo:g}, {hi:g}]")
    fingerprint = doc["fingerprint"]
    if fingerprint is not None and not isinstance(fingerprint, dict):
        raise bad("fingerprint", fingerprint, "an object (model, machine, path)")
    for key in ("model", "machine"):
        if isinstance(fingerprint, dict) and not isinstance(fingerprint.get(key, {}), dict):
            raise bad(f"fingerprint.{key}", fingerprint[key], "an object")
    if isinstance(fingerprint, dict) and fingerprint.get("path", "model") not in PATHS:
        raise bad("fingerprint.path", fingerprint["path"], ", ".join(PATHS))
    drafters = doc.get("drafters")
    if drafters is not None and not isinstance(drafters, dict):
        raise bad("drafters", drafters, "an object: drafter name -> {\"seconds_per_token\": seconds}")
    for name, entry in (drafters or {}).items():
        t = entry.get("seconds_per_token") if isinstance(entry, dict) else None
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= _SECONDS[1]:
            raise bad(f"drafters.{name}", entry, f'{{"seconds_per_token": seconds in [0, {_SECONDS[1]:g}]}}')


def _fmt(x) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() else f"{x:g}"
