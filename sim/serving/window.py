"""A window of a replica's steps, computed at once.

Between scheduling events nothing about the batch changes but its contexts, so a replica
(:mod:`draftsim.sim.serving.replica`) computes a *window* of consecutive steps at once,
vectorised over (steps, lanes) with numpy: the first step may carry prefill chunks, the others
are decodes — and, in open loop, the whole prefills of the arrivals the window folds in
(:func:`fold`: where the scheduler would admit one whole at the first step boundary after it,
it prefills in that step and decodes from the next). A window ends before the first step that
starts at or after the next arrival it does not fold (a new request joins the batch at the
first step boundary after it arrives), before the KV pool would overflow, when a request runs
out of drawn rounds, and — when a finish can change what comes next (requests waiting, a
running prefill waiting for blocks, a batch-dependent controller, closed-loop clients) — after
the first step in which a request finishes. The result is the same as stepping one iteration
at a time, bit for bit (``window_max = 1``; ``tests/sim/serving/test_replica.py`` holds the two
equal).

Where arrivals are not foreseen (least-outstanding routing), the window under way **takes one
in** when it comes (:func:`admit`), where the scheduler would admit it whole: its prefill and
lane are added to the window's sums in place, the steps it changes priced anew (:func:`_add_lane`;
its (W, B) columns are drawn when the window is committed: :func:`settle`), and — once the lanes
the window was computed with have finished — the window lengthens to the new lane's last drawn
round (:func:`_horizon`). ``tests/sim/serving/test_least_outstanding.py`` holds each such window
equal to the one computed anew with the arrival folded in (:func:`_with_folds`).

The window is computed along four seams:

* **lanes** (:func:`lanes`): the requests that decode — the plan's decodes from step 0, then the
  prefills that complete in step 0 from step 1 — with their tokens and drawn rounds;
* **rounds** (:func:`draw`, :func:`cap`, :func:`progress`): each lane's round in each step from
  the round book (:mod:`draftsim.sim.serving.rounds`), capped by the speculation controller
  (:mod:`draftsim.sim.controllers`), and how many tokens the lanes have out step by step (a
  lane stops when its tokens are out);
* **cuts** (:func:`cut`): where the window must end;
* **pricing** (:func:`price`): each step's forward calls — the drafters' calls (drafter m's
  t-th call batches the lanes that make at least t + 1 calls), then the target's verification
  of Σ(k_i + 1) tokens and the prefill chunks — priced by the cost models
  (:mod:`draftsim.sim.cost`).

Every sum a cost model reads (:class:`~draftsim.sim.cost.base.BatchStats`) is a sum of
integers, computed in integers and exact in float64: the order of summation cannot change a
step's time.

Glossary of a window's arrays: W steps × B lanes; ``valid`` (a drawn round is there),
``active`` (the lane decodes in the step: a valid round and tokens left), ``cum`` (tokens of
the lane's rounds up to and including the step, not cut at the request's end), ``before``
(the same, before the step), ``finish`` (the step a lane emits its last token in; W or more: not
in the window).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..controllers import NO_CAP, Controller
from ..cost.base import BatchStats
from .scheduler import controller_view

__all__ = ["Prefills", "Lanes", "Window", "prefills", "lanes", "span", "draw", "cap", "progress", "cut", "price",
           "step_stats", "unit_stats", "uniform_unit_stats", "uniform_call_stats", "compute", "admit", "settle"]


# ------------------------------------------------------------------------------------- records

@dataclass(slots=True)
class Prefills:
    """The prefill chunks of a window's first step, in the plan's order.

    rid, chunk, done : request, tokens of the chunk, tokens prefilled before it
    completes        : whether the chunk ends the request's prefill (its first token comes out)
    join, join_cached: the completing requests that go on decoding (lanes from step 1), and the
                       tokens their cache holds after the chunk
    finishing        : a completing chunk emits its request's last token
    sums             : (sequences, tokens, cached, pairs) of the chunks as :class:`BatchStats`
                       counts them, added to the first step's call; None without chunks
    """

    rid: list
    chunk: list
    done: list
    completes: list
    join: list
    join_cached: list
    finishing: bool
    sums: tuple | None

    @property
    def partial(self) -> bool:
        """A chunk leaves its prefill unfinished (the next step depends on the scheduler)."""
        return not all(self.completes)


@dataclass(slots=True)
class Lanes:
    """The requests that decode in a window, one lane each ((B,) arrays): the plan's decodes,
    then the prefills completing in step 0. Every lane has tokens left (``remaining`` ≥ 1).

    rid       : request ids
    first     : the first step the lane decodes in (0; 1 for a completing prefill)
    generated : output tokens out before its first step
    remaining : tokens it has still to emit
    context   : prompt + generated (its cache before its first step)
    base      : round-book index of its round in step w is ``base + w``
    reach     : the step after its last drawn round (first + rounds left)
    """

    rid: np.ndarray
    first: np.ndarray
    generated: np.ndarray
    remaining: np.ndarray
    context: np.ndarray
    base: np.ndarray
    reach: np.ndarray

    def __len__(self) -> int:
        return len(self.rid)


@dataclass(slots=True)
class Window:
    """W steps over B lanes: their rounds ((W, B) arrays, see the module's glossary), what each
    step costs and holds ((W,) arrays), and what committing its first n steps needs.

    index             : the round book's index of each lane's round (meaningless where not valid)
    drafted, accepted : tokens of each lane's round (after the controller's cap; meaningless
                        where not ``active``); ``drafted_raw`` before the cap
    caps              : (W, 1) the controller's cap per step (None: no cap in the window)
    emitted           : tokens each round emits (capped, 0 where not valid)
    finish            : (B,) the step a lane emits its last token in (≥ W: not in the window)
    context           : each lane's cache before each step (its prompt and the tokens out)
    time, draft_time  : seconds of each step, and of its drafters' calls
    batch             : sequences in each step (decoding lanes and prefill chunks)
    tokens            : new tokens of the target's call in each step
    kv                : KV blocks held in each step (None: unlimited pool)
    layout            : the ragged cache's state after each step (None: priced as paged)
    """

    W: int
    prefills: Prefills
    lanes: Lanes
    valid: np.ndarray
    active: np.ndarray
    drafted: np.ndarray
    accepted: np.ndarray
    emitted: np.ndarray
    cum: np.ndarray
    before: np.ndarray
    finish: np.ndarray
    context: np.ndarray
    batch: np.ndarray
    index: np.ndarray
    drafted_raw: np.ndarray
    caps: np.ndarray | None = None
    time: np.ndarray | None = None
    draft_time: np.ndarray | None = None
    tokens: np.ndarray | None = None
    kv: np.ndarray | None = None
    layout: list | None = None
    #: arrivals folded into the window: (request, step its whole prefill runs in), in arrival
    #: order; it decodes from the next step (a lane)
    folds: list = field(default_factory=list)
    #: (4, W) the folded prefills' (sequences, tokens, cached, pairs) per step (None: none)
    fold_sums: np.ndarray | None = None
    #: the time of the first arrival to the replica not folded (the window stops before it)
    next_arrival: float = np.inf
    #: what taking in an arrival nobody foresaw needs (:func:`admit`): the plan, its prefill
    #: chunks and lanes and the blocks others hold, as the window was computed from them (None:
    #: the window cannot take one in; such an arrival cuts it)
    base: tuple | None = None
    #: what :func:`price` summed, for :func:`admit` to add a lane to: the lanes' own (5, W) sums
    #: of the target's calls (before the prefill chunks), their most new tokens and longest context
    #: per step, and each drafter's calls per step where every lane makes all of them (None: the
    #: window must be priced anew)
    priced: tuple | None = None
    #: the lanes :func:`admit` took in whose (W, B) columns are not in the arrays yet (:func:`settle`
    #: puts them there): (request, first step, round-book start, rounds, tokens left, prompt)
    taken: list = field(default_factory=list)
    #: :func:`_add_lane`'s per-step sums with room beyond W (:func:`_room`; None: not made yet)
    spare: dict | None = None

    def truncate(self, W: int) -> None:
        """Keep the first W steps."""
        self.W = W
        for name in ("valid", "active", "drafted", "accepted", "emitted", "cum", "before", "context", "batch", "index", "drafted_raw"):
            setattr(self, name, getattr(self, name)[:W])
        for name in ("caps", "kv", "time", "draft_time", "tokens"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name)[:W])
        if self.fold_sums is not None:
            self.fold_sums = self.fold_sums[:, :W]


# ----------------------------------------------------------------------------------- the seams

#: the ufuncs' reductions (what ndarray.min and ndarray.max call, without their wrappers)
_min, _max = np.minimum.reduce, np.maximum.reduce


def prefills(plan, table) -> Prefills:
    """The plan's prefill chunks (a few per step: plain Python)."""
    rid, chunk, done, completes, join, join_cached = [], [], [], [], [], []
    finishing = False
    tokens = cached = pairs = 0
    for r, c, d in plan.prefill:
        comp = bool(d + c >= table.need[r])
        rid.append(r)
        chunk.append(c)
        done.append(d)
        completes.append(comp)
        if comp:
            if table.generated[r] + 1 >= table.output[r]:  # the prefill's token is the last
                finishing = True
            else:
                join.append(r)
                join_cached.append(d + c)
        tokens += c
        cached += d
        pairs += c * (2 * d + c + 1) // 2  # Σ n (c + (n + 1) / 2) over the chunk's tokens
    sums = (len(rid), float(tokens), float(cached), float(pairs)) if rid else None
    return Prefills(rid, chunk, done, completes, join, join_cached, finishing, sums)


def lanes(plan, pre: Prefills, table, book) -> Lanes:
    """The window's lanes; a lane that has spent its drawn rounds (a capped request) gets more
    from the round book."""
    for r in pre.join:
        book.ensure(r)
    rid = np.array(plan.decode + pre.join, dtype=np.int64)
    first = np.zeros(len(rid), dtype=np.int64)
    first[len(plan.decode):] = 1
    generated = table.generated[rid] + first
    remaining = table.output[rid] - generated
    used = table.rounds[rid]
    left = book.count[rid] - used
    if np.count_nonzero(left <= 0):
        for j in (left <= 0).nonzero()[0].tolist():
            book.extend(int(rid[j]), int(remaining[j]))
        left = book.count[rid] - used
    return Lanes(rid, first, generated, remaining, table.prompt[rid] + generated, book.start[rid] + used - first, first + left)


def span(ln: Lanes, pre: Prefills, plan, *, waiting: bool, cut_at_finish: bool, now: float, next_arrival: float,
         step_guess: float, window_max: int) -> int:
    """How many steps to compute: one when the next step depends on the scheduler (a partial
    prefill; a waiting queue blocked by the token budget, or by a preemption, after which the
    scheduler admits again; no lane); else until the first lane finishes (``cut_at_finish``) or
    the last, a quarter beyond the next arrival at the last window's mean step time, and at most
    ``window_max`` and the lanes' drawn rounds."""
    if (pre.rid and pre.partial) or (waiting and (plan.blocked == "budget" or plan.preempted)) or not len(ln):
        return 1
    ends = ln.remaining + ln.first
    W = int(_min(ends) if cut_at_finish else _max(ends))
    if np.isfinite(next_arrival):
        W = min(W, int((next_arrival - now) / max(step_guess, 1e-9) * 1.25) + 2)
    return max(1, min(W, window_max, int(_max(ln.reach))))


def draw(ln: Lanes, W: int, book, pre: Prefills) -> Window:
    """Each lane's round in each of W steps, from the round book."""
    w = np.arange(W)[:, None]
    index = ln.base + w  # clipped into the book by take: meaningless where not valid
    valid = (w >= ln.first) & (w < ln.reach)
    drafted = book.drafted.take(index, mode="clip")
    return Window(W=W, prefills=pre, lanes=ln, valid=valid, active=valid, drafted=drafted, accepted=book.accepted.take(index, mode="clip"),
                  emitted=book.emitted.take(index, mode="clip"), cum=None, before=None, finish=None, context=None, batch=None,
                  index=index, drafted_raw=drafted)


def cap(win: Window, controller: Controller, tree_nodes: np.ndarray | None, running: int) -> None:
    """The controller's cap per step, from what it sees of the step (:func:`controller_view`:
    the ``running`` requests, the decoding lanes' mean context at the step's start): a flat
    draft stops at the cap and its accepted prefix is cut there; a tree is cut to the cap's
    depth (it verifies the nodes of the kept levels). A step's context depends on the caps of
    the steps before it: the caps are iterated to their fixed point (step w's is right once
    the steps before it are; a cap that reads no context is right at once)."""
    if type(controller).caps is Controller.caps:
        return
    ln = win.lanes
    emitted_raw = win.emitted * win.valid
    before = np.zeros_like(emitted_raw)
    caps = None
    for _ in range(win.W + 1):
        decoding = win.valid & (before < ln.remaining)
        new = controller.caps(*controller_view(running, ln.context + before, decoding))[:, None]
        if caps is not None and np.array_equal(new, caps):
            break
        caps = new
        if not (caps < NO_CAP).any():
            return
        accepted = np.minimum(win.accepted, caps)
        emitted = np.minimum(emitted_raw, accepted + 1)
        before = np.add.accumulate(emitted, axis=0) - emitted
    win.caps = caps
    if tree_nodes is not None:
        depth = len(tree_nodes) - 1
        win.drafted = np.where(caps < depth, tree_nodes[np.minimum(caps, depth)], win.drafted_raw)
    else:
        win.drafted = np.minimum(win.drafted_raw, caps)
    win.accepted = np.minimum(win.accepted, caps)
    win.emitted = np.minimum(win.emitted, win.accepted + 1)


def progress(win: Window) -> None:
    """Tokens out step by step; a lane decodes while it has tokens left, and finishes in the
    first step its rounds reach its remaining tokens."""
    rem = win.lanes.remaining
    e = win.emitted * win.valid
    win.emitted = e
    win.cum = np.add.accumulate(e, axis=0)
    win.before = win.cum - e
    win.context = win.lanes.context + win.before
    win.active = win.valid & (win.before < rem)
    win.finish = np.add.reduce(win.cum < rem, axis=0)
    win.batch = np.add.reduce(win.active, axis=1)
    win.batch[0] += len(win.prefills.rid)
    if win.fold_sums is not None:
        win.batch += win.fold_sums[0].astype(np.int64)


def cut(win: Window, *, cut_at_finish: bool, kv, held_first: int, held_throughout: int, held_steps: np.ndarray | None = None) -> int:
    """The steps the window keeps: up to a lane's last drawn round unless it finishes first,
    after the first finish when ``cut_at_finish``, before the first step whose KV blocks
    exceed the pool, and before the first step in which nothing runs (the replica idles: the
    lanes' drawn rounds may reach past their finishes). Besides the lanes', blocks are held by
    running requests that are not lanes: in step 0 (``held_first``) the prefill chunks that complete in it, in every step
    (``held_throughout``) the prefills waiting for their next chunk. Fills ``win.kv``."""
    held = None
    if kv is not None:
        blocks = kv.request_blocks(win.context)
        held = np.add.reduce(blocks * win.active, axis=1)
        if held_throughout:
            held += held_throughout
        if held_steps is not None:  # folded prefills, in their steps
            held += held_steps
        held[0] += held_first
    return _keep(win, cut_at_finish, kv, held)


def _keep(win: Window, cut_at_finish: bool, kv, held: np.ndarray | None) -> int:
    """:func:`cut`'s steps kept, from the KV blocks ``held`` in each step (None: no pool)."""
    ln, W = win.lanes, win.W
    keep = W
    if len(ln):
        if int(_min(ln.reach)) < W:  # a lane that does not finish stops at its last drawn round
            keep = int(_min(np.where(win.finish >= W, ln.reach, W)))
        if cut_at_finish:
            keep = min(keep, int(_min(win.finish)) + 1)
    if cut_at_finish and win.prefills.finishing:
        keep = 1
    if held is not None:
        over = held[1:] > kv.blocks
        if np.count_nonzero(over):
            keep = min(keep, int(over.argmax()) + 1)
        win.kv = held
    idle = win.batch[:keep] == 0  # nothing runs any more: the replica idles (stepping runs no empty step)
    if np.count_nonzero(idle):
        keep = int(idle.argmax())
    return max(keep, 1)


def price(win: Window, engine, book, layout_state) -> None:
    """Seconds of each step: the drafters' calls, then the target's (see the module docstring).
    Fills ``time``, ``draft_time``, ``tokens`` and ``layout``."""
    W, ln, pre = win.W, win.lanes, win.prefills
    active = win.active
    n_t = (win.drafted + 1) * active  # verified tokens: the drafts and the bonus
    c_t = win.context - 1  # what the lane's cache holds before the step, but its newest token
    width = None
    if engine.layout is not None:
        joined = np.full(len(ln), np.nan)
        joined[len(ln) - len(pre.join):] = pre.join_cached
        e_eff = np.where(active, np.minimum(win.emitted, ln.remaining - win.before), 0)
        width, _, win.layout = engine.layout.steps(layout_state, ln.rid, active, n_t, e_eff, c_t, joined, win.finish)
    lane_sums = []  # (sequences, cached) of the decoding lanes per step, kept for the drafters
    parts = [] if width is None else None
    rows = win.fold_sums
    target = step_stats(n_t, c_t, pre.sums, shape=engine.target.step_shape, width=width, lane_sums=lane_sums, rows=rows, parts=parts)
    time = np.asarray(engine.target.stats_time(target), dtype=np.float64)
    draft_time = None
    uniform = []  # each drafter's (calls, tokens a call) where every decoding lane makes all of them (None: not so; tokens None: one)
    for m, model in enumerate(engine.drafters[: book.D]):
        # a drafter prefills its own cache with the target's prefills, unless it shares the target's (self-speculation)
        own = engine.max_draft > 0 and getattr(model, "own_prefill", True)
        draft_pre = pre.sums if own else None
        draft_rows = rows if own else None
        cap_ctx = getattr(model, "context_cap", None)  # a drafter attending to a window of its cache (self-speculation)
        calls = _draft_calls(win, book, m, engine.tree_nodes is not None)
        T = max(int(_max(calls, axis=None, initial=0)), 1 if draft_pre is not None or draft_rows is not None else 0)
        if T == 0:
            uniform.append(None)
            continue
        # all of this drafter's calls of the window in one cost-model call: rows (t, w); call t of
        # step w batches the lanes making more than t calls, each at its context + the tokens before
        k = np.arange(T)[:, None, None]
        B = len(ln.rid)
        if book.flat[m] and cap_ctx is None and not np.count_nonzero(calls != T * active):
            # every decoding lane makes all T calls: call t's sums are the lanes' (the target's
            # before its prefill chunks) with t more cached tokens each — integers, exact
            seqs, cached = lane_sums
            stats = uniform_unit_stats(seqs, cached, T, draft_pre, rows=draft_rows)
            uniform.append((T, None))
        elif book.flat[m]:  # one token per call
            on = calls > k
            ctx = c_t + k if cap_ctx is None else np.minimum(c_t + k, cap_ctx)
            stats = unit_stats(on.reshape(T * W, B), ctx.reshape(T * W, B), draft_pre, rows=draft_rows)
        else:
            on = calls > k
            per_call = -(-book.call_tokens[:, m].take(win.index, mode="clip") // np.maximum(_raw_calls(win, book, m), 1))
            ctx = c_t + k * per_call if cap_ctx is None else np.minimum(c_t + k * per_call, cap_ctx)
            stats = step_stats((on * per_call).reshape(T * W, B), ctx.reshape(T * W, B), draft_pre, rows=draft_rows)
            if cap_ctx is None and not np.count_nonzero(calls != T * active):  # every decoding lane makes all T calls:
                tokens = per_call * active  # of p tokens each? (a tree's levels at their mean width)
                p = int(_max(tokens, axis=None, initial=0))
                if p and not np.count_nonzero(tokens != p * active):
                    uniform.append((T, p))
        if len(uniform) <= m:
            uniform.append(None)
        if model.step_shape and book.flat[m] and target.padded is not None:
            stats = draft_shape(stats, target.padded[:, 2], T, 1)
        draft_time = _add_calls(draft_time, model.stats_time(stats), T, W)
    _timed(win, time, draft_time, target)
    win.priced = (*parts, uniform) if parts is not None and None not in uniform else None


def _add_calls(draft_time: np.ndarray | None, seconds, T: int, W: int) -> np.ndarray:
    """``draft_time`` plus a drafter's T calls per step (``seconds``, rows (t, w)), added call by
    call, in order: a step's sum whatever the window's shape (a reduction may pair terms)."""
    per_call = np.asarray(seconds, dtype=np.float64).reshape(T, W)
    calls_time = per_call[0].copy()
    for t in range(1, T):
        calls_time += per_call[t]
    return calls_time if draft_time is None else draft_time + calls_time


def _timed(win: Window, time: np.ndarray, draft_time: np.ndarray | None, target: BatchStats) -> None:
    """Fill the window's step times from the target's and the drafters' (None: no drafting)."""
    if draft_time is None:
        draft_time = np.zeros(win.W)
    win.time = time + draft_time
    win.draft_time = draft_time
    win.tokens = target.tokens.astype(np.int64)  # exact: sums of integers, the prefill chunks' in step 0


def _raw_calls(win: Window, book, m: int) -> np.ndarray:
    return book.calls[:, m].take(win.index, mode="clip")


def _draft_calls(win: Window, book, m: int, tree: bool) -> np.ndarray:
    """Drafter m's forward calls per (step, lane): the drawn round's, scaled down for a capped
    round (a capped tree: one call per kept level; a capped chain: the kept fraction)."""
    calls = _raw_calls(win, book, m)
    if win.caps is not None and tree:
        calls = np.minimum(calls, win.caps)
    elif win.caps is not None:
        d_raw = win.drafted_raw
        calls = np.where(d_raw > 0, -(-calls * win.drafted // np.maximum(d_raw, 1)), 0)
    return calls * win.active


def step_stats(n: np.ndarray, c: np.ndarray, pre: tuple | None = None, shape: bool = False,
               width: np.ndarray | None = None, lane_sums: list | None = None, rows: np.ndarray | None = None,
               parts: list | None = None) -> BatchStats:
    """BatchStats of calls (rows) over sequences (columns) with new tokens ``n`` and contexts
    ``c`` ((R, B) arrays of integers; no checks: the replica builds valid ones); ``pre`` =
    (sequences, tokens, cached, pairs) of prefill chunks added to the first row. Logit rows: one
    per verified token, one per prefill chunk. With ``shape``, also the step's make-up
    (``padded``, ``prefill``); ``width``: the cache width the padded batch attends over
    (default: its longest context). ``lane_sums``, a list, receives the rows' sequences and
    cached tokens before the prefill chunks are added. ``rows`` ((4, W) sums, or None): more
    prefill chunks, added to the first W rows (a window's folded arrivals, step by step).

    The sums are of integers below 2**53, exact in float64 in any order: one matrix-vector
    product with ones computes them all."""
    R, B = n.shape
    buf = np.empty((4, R, B))
    nf = buf[1]
    nf[...] = n  # tokens
    active = np.greater(nf, 0.0, out=buf[0])  # sequences
    cached = np.multiply(c, active, out=buf[2])
    pairs = np.multiply(c, 2.0, out=buf[3])  # twice n (c + (n + 1) / 2)
    pairs += nf
    pairs += 1.0
    pairs *= nf
    sums = np.empty((5, R))  # sequences, tokens, cached, pairs, rows
    np.matmul(buf.reshape(4 * R, B), _ones(B), out=sums[:4].reshape(4 * R))
    sums[3] *= 0.5
    sums[4] = sums[1]
    if lane_sums is not None:
        lane_sums += [sums[0].copy(), sums[2].copy()]
    longest = most = None
    if shape:
        longest = _max(cached, axis=-1, initial=0.0) if width is None else width
        most = _max(nf, axis=-1, initial=0.0)
    if parts is not None:
        parts += [sums.copy(), most, longest]
    return _shaped_record(sums, pre, rows, most, longest)


def draft_shape(stats: BatchStats, longest: np.ndarray, T: int, per_call: int) -> BatchStats:
    """A drafter's calls (rows (t, w), one new token each: ``per_call``) with their make-up, for a
    drafter whose cost reads it (``step_shape``, a static cache's profile): call t of step w as
    the right-padded batch of its sequences over the target's cache width at step w (``longest``,
    (W,)) plus the t tokens drafted before it — the draft model's cache holds the same rows under
    the same rules (rolled back, trimmed, compacted at the same stale share), so its width is taken
    as the target's (an approximation: their stale slots can differ). Its prefill chunks are
    none: such a drafter's read of a prompt is priced with the target's prefill
    (``own_prefill`` False)."""
    R = len(stats.sequences)
    padded = np.empty((R, 3))
    padded[:, 0] = stats.sequences
    padded[:, 1] = per_call
    padded[:, 2] = (np.asarray(longest, dtype=np.float64)[None, :] + per_call * _arange_column(T)).reshape(R)
    return BatchStats(stats.sequences, stats.tokens, stats.cached, stats.pairs, rows=stats.rows, padded=padded, prefill=np.zeros((R, 2)))


def _shaped_record(sums: np.ndarray, pre: tuple | None, rows: np.ndarray | None, most, longest) -> BatchStats:
    """:func:`_record` of the lanes' sums ``sums`` (5, R), with the step's make-up where ``most``
    (the most new tokens of a sequence per call) and ``longest`` (its longest context) are given."""
    padded = prefill = None
    if most is not None:
        R = sums.shape[1]
        padded = np.stack([sums[0], most, longest], axis=-1)
        prefill = np.zeros((R, 2))
        if pre is not None:
            prefill[0] = pre[0], pre[1]
        if rows is not None:
            prefill[: rows.shape[1]] += rows[:2].T
    return _record(sums, pre, padded, prefill, rows)


def unit_stats(on: np.ndarray, c: np.ndarray, pre: tuple | None = None, rows: np.ndarray | None = None) -> BatchStats:
    """:func:`step_stats` of calls of one new token per sequence: ``on`` (R, B) whether
    sequence j is in call i, at context ``c``. Pairs are then Σ (c + 1)."""
    R, B = on.shape
    buf = np.empty((2, R, B))
    buf[0] = on
    np.multiply(c, buf[0], out=buf[1])
    sums = np.empty((5, R))  # sequences, tokens, cached, pairs, rows
    np.matmul(buf.reshape(2 * R, B), _ones(B), out=sums[1:3].reshape(2 * R))  # sequences (as tokens), cached
    return _unit_record(sums, pre, rows)


def uniform_unit_stats(sequences: np.ndarray, cached: np.ndarray, T: int, pre: tuple | None = None,
                       rows: np.ndarray | None = None) -> BatchStats:
    """:func:`unit_stats` of T calls in each of W steps where every sequence of step w is in all
    T calls, one token each: ``sequences`` and ``cached`` ((W,) sums) are call 0's, call t adds
    t cached tokens per sequence. Rows (t, w), as :func:`unit_stats` orders them."""
    W = len(sequences)
    sums = np.empty((5, T, W))  # sequences, tokens, cached, pairs, rows
    sums[1] = sequences
    np.multiply(_arange_column(T), sequences, out=sums[2])
    sums[2] += cached
    return _unit_record(sums.reshape(5, T * W), pre, rows)


def uniform_call_stats(sequences: np.ndarray, cached: np.ndarray, T: int, p: int, pre: tuple | None = None) -> BatchStats:
    """:func:`step_stats` of T calls in each of W steps where every sequence of step w is in all T
    calls, with p new tokens each: ``sequences`` and ``cached`` ((W,) sums) are call 0's, call t
    adds t·p cached tokens per sequence; pairs Σ p (c + (p + 1) / 2) = p·cached + sequences·p(p + 1)/2
    (integers, exact in float64). Rows (t, w), as :func:`step_stats` orders them."""
    W = len(sequences)
    sums = np.empty((5, T, W))  # sequences, tokens, cached, pairs, rows
    sums[0] = sequences
    np.multiply(sequences, float(p), out=sums[1])
    np.multiply(_arange_column(T), sums[1], out=sums[2])
    sums[2] += cached
    np.multiply(sums[2], float(p), out=sums[3])
    sums[3] += sequences * float(p * (p + 1) // 2)
    sums[4] = sums[1]
    return _record(sums.reshape(5, T * W), pre)


def _unit_record(sums: np.ndarray, pre: tuple | None, rows: np.ndarray | None = None) -> BatchStats:
    """The record of one-token calls from ``sums`` (5, R) with its tokens and cached rows filled:
    sequences and logit rows are the tokens, pairs Σ (c + 1) = cached + sequences."""
    sums[0] = sums[1]
    np.add(sums[2], sums[1], out=sums[3])
    sums[4] = sums[1]
    return _record(sums, pre, rows=rows)


_COLUMNS: dict = {}


def _arange_column(T: int) -> np.ndarray:
    """0, 1, …, T − 1 as a (T, 1) float column (shared, read only)."""
    col = _COLUMNS.get(T)
    if col is None:
        col = _COLUMNS[T] = np.arange(T, dtype=np.float64)[:, None]
        col.flags.writeable = False
    return col


_ONES = np.ones(1024)
_ONES.flags.writeable = False


def _ones(n: int) -> np.ndarray:
    """A vector of n ones (a view of a shared one; read only)."""
    global _ONES
    if n > len(_ONES):
        _ONES = np.ones(max(n, 2 * len(_ONES)))
        _ONES.flags.writeable = False
    return _ONES[:n]


def _record(sums: np.ndarray, pre: tuple | None, padded=None, prefill=None, rows: np.ndarray | None = None) -> BatchStats:
    """The record of ``sums`` (5, R): sequences, tokens, cached, pairs and logit rows per call;
    the prefill chunks' sums ``pre`` added to the first call, ``rows`` ((4, W)) to the first W
    calls (one logit row per chunk)."""
    if pre is not None:
        sums[:, 0] += (pre[0], pre[1], pre[2], pre[3], pre[0])
    if rows is not None:
        W = rows.shape[1]
        sums[:4, :W] += rows
        sums[4, :W] += rows[0]
    return BatchStats(sums[0], sums[1], sums[2], sums[3], rows=sums[4], padded=padded, prefill=prefill)


# ------------------------------------------------------------------------------------ a window

#: Folding arrivals: the most arrivals a window takes in, and the most passes placing them.
FOLD_ARRIVALS = 12
FOLD_PASSES = 3


def compute(engine, scheduler, plan, now: float, step_guess: float, layout_state, next_arrival: float = np.inf,
            upcoming: tuple | None = None) -> Window:
    """The window that starts with ``plan`` at ``now`` (``step_guess``: the last window's mean
    step time, to stop near ``next_arrival``). ``upcoming`` (request ids and times of the next
    arrivals to this replica, when they are foreseen) lets the window fold them in
    (:func:`fold`)."""
    table, book = engine.table, engine.book
    pre = prefills(plan, table)
    ln = lanes(plan, pre, table, book)
    waiting = bool(scheduler.waiting)
    stalled = len(scheduler.running) > len(plan.decode) + len(plan.prefill)  # a prefill waits for blocks
    cut_at_finish = waiting or stalled or engine.controller.batch_dependent or engine.closed_loop
    first = throughout = 0
    kv = scheduler.kv
    if kv is not None:
        if len(scheduler.running) > len(ln):
            in_lanes = set(ln.rid.tolist()) | set(pre.join)
            chunked = set(pre.rid)
            others = [r for r in scheduler.running if r not in in_lanes]
            first = scheduler.held_blocks([r for r in others if r in chunked])
            throughout = scheduler.held_blocks([r for r in others if r not in chunked])
        first += sum(kv.request_blocks(int(c)) for c in pre.join_cached)  # the joiners' blocks, their prefills complete
    foldable = bool(len(ln) and not cut_at_finish and not stalled and not plan.preempted and engine.layout is None
                    and type(engine.controller).caps is Controller.caps and not (pre.rid and pre.partial))
    if foldable and upcoming is not None and len(upcoming[0]):
        return fold(engine, scheduler, plan, pre, ln, now, step_guess, upcoming, first, throughout)
    W = span(ln, pre, plan, waiting=waiting, cut_at_finish=cut_at_finish, now=now, next_arrival=next_arrival, step_guess=step_guess,
             window_max=engine.window_max)
    win = draw(ln, W, book, pre)
    cap(win, engine.controller, engine.tree_nodes, len(scheduler.running))
    progress(win)
    keep = cut(win, cut_at_finish=cut_at_finish, kv=kv, held_first=first, held_throughout=throughout)
    if keep < W:
        win.truncate(keep)
    price(win, engine, book, layout_state)
    win.next_arrival = next_arrival
    if foldable:
        win.base = (plan, pre, ln, first, throughout)
    return win


def admit(engine, scheduler, win: Window, starts: np.ndarray, rid: int, at: float) -> Window | None:
    """The window with request ``rid``, arrived unforeseen at ``at`` (least-outstanding routing
    sent it here), taken in where the scheduler would admit it whole: at the first step that
    starts at or after ``at`` (:func:`_admissible`; after the steps of the arrivals taken in
    before it). The steps before that one are the window's, unchanged: what ran by ``at`` does
    not move. The window then runs to :func:`_horizon` (beyond its end where its lane reaches
    further). None where it cannot be taken in (the arrival then cuts the window, ``win``
    untouched); else ``win`` itself, changed in place (:func:`_add_lane`)."""
    if win.base is None:
        return None
    W = win.W
    k = int(np.searchsorted(starts[:W], at, side="left"))
    last = win.folds[-1][1] if win.folds else 0
    # a second arrival in a step: FCFS admits the two in arrival order, as they are taken in
    if k >= W or last > k or (last == k and scheduler.config.policy != "fcfs"):
        return None
    joined = tokens = 0  # the arrivals taken in at step k before this one, and their prompts' tokens
    if last == k:
        joined, tokens = int(win.fold_sums[0, k]), int(win.fold_sums[1, k])
    decoding = int(win.batch[k]) - joined  # k >= 1: no step-0 chunk
    if not _admissible(engine.table, scheduler.config, engine.lookahead, rid, k, decoding, joined, tokens):
        return None
    engine.book.ensure(rid)
    horizon = _horizon(engine, win, rid, k)
    folds = win.folds + [(rid, k)]
    new = _add_lane(engine, scheduler, win, rid, k, horizon)
    if new is None or CHECK_ADMIT:
        # made anew over every lane: lengthened only where the arrival was taken in place (a
        # window made anew at every arrival, lengthened, would grow with each)
        plan, pre, ln, first, throughout = win.base
        anew = _with_folds(engine, scheduler, plan, pre, ln, W if new is None else horizon, folds, first, throughout)
        if new is not None:
            _assert_same_window(settle(new, engine.book), anew)
        anew.base, anew.next_arrival = win.base, win.next_arrival
        new = anew
    return new


#: compute every window :func:`admit` makes both ways and compare them (a check for the tests)
CHECK_ADMIT = False


def _assert_same_window(a: Window, b: Window) -> None:
    for name in ("W", "folds", "valid", "active", "drafted", "accepted", "emitted", "cum", "before", "finish", "context", "batch",
                 "index", "drafted_raw", "time", "draft_time", "tokens", "kv", "fold_sums"):
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x is not None and y is not None and np.array_equal(x, y), name
        else:
            assert x == y, name
    for name in ("rid", "first", "generated", "remaining", "context", "base", "reach"):
        assert np.array_equal(getattr(a.lanes, name), getattr(b.lanes, name)), "lanes." + name


def _horizon(engine, win: Window, rid: int, k: int) -> int:
    """The steps the window is computed over with ``rid`` taken in at step k: as far as its lane's
    drawn rounds reach (at most ``window_max``) where every lane of the window has finished in it
    — they decode no more, so the steps beyond are the taken-in lanes' alone, and the window
    outlasts its longest lane —, else its own W."""
    W, B = win.W, len(win.lanes)
    if B and int(_max(win.finish[:B])) >= W:
        return W
    return max(W, min(k + 1 + int(engine.book.count[rid]), engine.window_max))


#: a window's per-step arrays :func:`_add_lane` keeps with room beyond its W
_PER_STEP = ("batch", "kv", "time", "draft_time", "tokens")
_NEVER = 1 << 62  # the finish of a lane whose drawn rounds never emit its tokens


def _room(win: Window, cap: int) -> dict:
    """The window's per-step sums with room for ``cap`` steps (``win.spare``, made from its arrays
    on the first taking-in; zero beyond its W, where its own lanes have finished — its taken-in
    lanes' sums are added there too, so that a later one may lengthen the window): the arrays of
    :data:`_PER_STEP`, the prefills' rows, and its pricing's lane sums (``win.priced``)."""
    sp = win.spare
    if sp is None:
        W = win.W
        lane5, most, longest, _ = win.priced
        sp = {name: getattr(win, name)[:W] for name in _PER_STEP if getattr(win, name) is not None}
        sp["rows"] = win.fold_sums[:, :W] if win.fold_sums is not None else np.zeros((4, W))
        sp["lane5"] = lane5[:, :W]
        if most is not None:
            sp["most"], sp["longest"] = most[:W], longest[:W]
        sp["finish"] = win.finish.copy()  # its lanes' finishes (settle cuts them at the window's last horizon)
        sp["never"] = []  # the reach of the taken-in lanes that never finish
        win.spare = sp
    size = sp["batch"].shape[-1]
    if size < cap:
        cap = max(cap, 2 * size)
        for name, old in sp.items():
            if name not in ("finish", "never", "clip"):
                new = np.zeros(old.shape[:-1] + (cap,), dtype=old.dtype)
                new[..., :size] = old
                sp[name] = new
    return sp


def _add_lane(engine, scheduler, win: Window, rid: int, k: int, horizon: int) -> Window | None:
    """``win`` with request ``rid`` taken in at step k — its whole prefill in step k, a lane from
    step k + 1 — and run to step ``horizon`` (:func:`_horizon`), changed in place: what
    :func:`_with_folds` computes anew over every lane, bit for bit. Only the steps the arrival
    changes are touched: step k (its prefill) and the steps its lane decodes in. The window's
    step sums, blocks held and the lanes' sums its pricing kept (``win.priced``) get the lane's
    in those steps (sums of integers, exact in float64 in any order) — up to its last drawn
    round, beyond the window's end too (:func:`_room`) —, and those steps alone are priced anew
    (a step's price depends on its own sums only). The lane's (W, B) columns wait in
    ``win.taken`` until :func:`settle`. None, ``win`` untouched, where its pricing cannot take a
    lane in place (a drafter's calls are not every lane's, the lane makes more)."""
    if win.priced is None:
        return None
    uniform = win.priced[3]
    table, book, kv = engine.table, engine.book, scheduler.kv
    W = horizon
    f1 = k + 1
    start, count = int(book.start[rid]), int(book.count[rid])
    remaining = int(table.output[rid]) - 1
    prompt = int(table.prompt[rid])
    E = min(f1 + count, engine.window_max)  # its rounds that may be in the window: steps f1 .. E - 1
    n = max(E - f1, 0)
    rounds = slice(start, start + n)
    emitted = book.emitted[rounds]
    cum = np.add.accumulate(emitted)
    before = cum - emitted
    every = not n or int(before[-1]) < remaining  # it decodes in every round (the round book draws no more)
    active = True if every else before < remaining
    calls = book.calls[rounds]
    for m, (t, p) in enumerate(uniform):  # a drafter's calls (and their tokens) must stay every lane's
        if np.count_nonzero(calls[:, m] != t if every else (calls[:, m] != t) & active):
            return None
        if p is not None:
            tokens = -(-book.call_tokens[rounds, m] // np.maximum(calls[:, m], 1))
            if np.count_nonzero(tokens != p if every else (tokens != p) & active):
                return None
    # from here on, win is the new window
    sp = win.spare
    if sp is None or sp["batch"].shape[0] < max(E, W):
        sp = _room(win, max(E, W))
    finish = f1 + int(np.count_nonzero(cum < remaining)) if n and cum[-1] >= remaining else _NEVER
    B = len(win.lanes) + len(win.taken)
    fin = sp["finish"]
    if len(fin) <= B:
        fin = sp["finish"] = np.concatenate([fin, np.empty(max(B + 1, 16), dtype=np.int64)])
    fin[B] = finish
    win.finish = fin[: B + 1]  # not cut at W: settle cuts them where the window made anew does, at the steps it was computed over
    sp["clip"] = W
    win.taken.append((rid, f1, start, count, remaining, prompt))
    win.folds.append((rid, k))
    rows = sp["rows"]
    rows[:, k] += 1.0, prompt, 0.0, prompt * (prompt + 1) // 2
    lane = slice(f1, E)
    sp["batch"][lane] += active
    sp["batch"][k] += 1
    keep = W
    reach = f1 + count
    if finish == _NEVER:  # a lane that does not finish stops at its last drawn round (cut)
        sp["never"].append(reach)
    for r in sp["never"]:
        if r < W:
            keep = min(keep, r)
    if W > win.W:  # lengthened: nothing runs from the first step in which no lane decodes (the replica idles; cut)
        idle = sp["batch"][win.W:W] == 0
        if np.count_nonzero(idle):
            keep = min(keep, win.W + int(idle.argmax()))
    if kv is not None:
        held = sp["kv"]
        blocks = kv.request_blocks(before + (prompt + 1))
        held[lane] += blocks if every else blocks * active
        held[k] += kv.request_blocks(prompt)
        over = held[k:W] > kv.blocks
        if np.count_nonzero(over):
            keep = min(keep, k + int(over.argmax()))
    # its sums added to the lanes' (as step_stats sums a column: integers, exact in float64)
    if every:
        nf = np.add(book.drafted[rounds], 1.0)
        cached = np.add(before, float(prompt))  # its cache before the step, but its newest token
    else:
        nf = ((book.drafted[rounds] + 1) * active).astype(np.float64)
        cached = (before + prompt) * active
    lane5 = sp["lane5"]
    part = lane5[:, lane]
    part[0] += active
    part[1] += nf
    part[2] += cached
    pairs = cached * 2.0
    pairs += nf
    pairs += 1.0
    pairs *= nf
    pairs *= 0.5
    part[3] += pairs
    part[4] += nf
    most = sp.get("most")
    if most is not None:
        longest = sp["longest"]
        np.maximum(most[lane], nf, out=most[lane])
        np.maximum(longest[lane], cached, out=longest[lane])
    W = keep
    win.W = W
    for name in _PER_STEP:
        if name in sp:
            setattr(win, name, sp[name][:W])
    win.fold_sums = rows[:, :W]
    if win.valid.shape[0] > W:  # cut before the window's own end (settle lengthens them)
        for name in ("valid", "active", "drafted", "accepted", "emitted", "cum", "before", "context", "index", "drafted_raw"):
            setattr(win, name, getattr(win, name)[:W])
    # the steps it changes, priced anew: step k (its prefill) to its lane's last (the new ones among them)
    P = slice(k, min(max(E, f1), W))
    if P.start >= P.stop:  # the window ends before its prefill (the pool): nothing to price
        return win
    # the arrivals' prefills in those steps: in the first (its own and any taken in there before it;
    # those before are in earlier steps)
    pre = tuple(rows[:, k].tolist())
    target = _shaped_record(lane5[:, P].copy(), pre, None, None if most is None else most[P], None if most is None else longest[P])
    time = np.asarray(engine.target.stats_time(target), dtype=np.float64)
    draft_time = None
    w = P.stop - P.start
    for m, model in enumerate(engine.drafters[: book.D]):
        own = engine.max_draft > 0 and getattr(model, "own_prefill", True)
        T, p = uniform[m]
        if p is None:
            stats = uniform_unit_stats(lane5[0, P], lane5[2, P], T, pre if own else None)
            if model.step_shape and target.padded is not None:
                stats = draft_shape(stats, target.padded[:, 2], T, 1)
        else:
            stats = uniform_call_stats(lane5[0, P], lane5[2, P], T, p, pre if own else None)
        draft_time = _add_calls(draft_time, model.stats_time(stats), T, w)
    if draft_time is None:
        draft_time = np.zeros(w)
    win.time[P] = time + draft_time
    win.draft_time[P] = draft_time
    win.tokens[P] = target.tokens
    return win


def settle(win: Window, book) -> Window:
    """Put the lanes :func:`_add_lane` took in into the window's lanes and (W, B) arrays, as
    :func:`draw` and :func:`progress` make them (every lane's drawn anew over the W steps: the
    window's own lanes' columns may be shorter, where it was lengthened; the window takes arrivals
    in only where no controller caps its rounds). The replica settles a window before committing
    it. Returns ``win``."""
    if not win.taken:
        return win
    win.finish = np.minimum(win.finish, win.spare["clip"])
    rid, f1, start, count, remaining, prompt = np.array(win.taken, dtype=np.int64).T
    win.taken = []
    ln = win.lanes
    add = Lanes(rid, f1, np.ones(len(rid), dtype=np.int64), remaining, prompt + 1, start - f1, f1 + count)
    win.lanes = ln = Lanes(*(np.concatenate([getattr(ln, f), getattr(add, f)]) for f in Lanes.__slots__))
    (win.valid, win.active, win.drafted, win.accepted, win.emitted, win.cum, win.before, win.context,
     win.index) = _columns(ln, win.W, book, win.prefills)
    win.drafted_raw = win.drafted
    return win


def _columns(ln: Lanes, W: int, book, pre: Prefills) -> tuple:
    """The (W, B) arrays valid, active, drafted, accepted, emitted, cum, before, context and index
    of lanes ``ln`` as :func:`draw` and :func:`progress` make them (uncapped)."""
    part = draw(ln, W, book, pre)
    emitted = part.emitted * part.valid
    cum = np.add.accumulate(emitted, axis=0)
    before = cum - emitted
    return (part.valid, part.valid & (before < ln.remaining), part.drafted, part.accepted, emitted, cum, before, ln.context + before,
            part.index)


def _admissible(table, cfg, lookahead: int, r: int, k: int, dec: int, joined: int = 0, tokens: int = 0) -> bool:
    """Whether the scheduler admits request ``r``, the only one waiting, whole at step ``k`` of a
    window in which ``dec`` lanes decode and ``joined`` arrivals of ``tokens`` prompt tokens were
    admitted before it (FCFS: in arrival order): a step ran before it (k ≥ 1), fewer than
    ``max_num_seqs`` run, its prompt fits what is left of the step's token budget beside their
    verification tokens and those prompts, and it has more than one token to generate (its
    blocks: the window's cut)."""
    return (k >= 1 and table.output[r] >= 2 and dec + joined < cfg.max_num_seqs
            and table.prompt[r] <= cfg.max_num_batched_tokens - lookahead * dec - tokens)


def _with_folds(engine, scheduler, plan, pre: Prefills, ln: Lanes, W: int, folds: list, first: int, throughout: int) -> Window:
    """The window of W steps with the arrivals ``folds`` ((request, step) pairs) taken in: each
    prefills whole in its step and decodes from the next, a lane; priced; cut where a lane's
    drawn rounds end, the pool overflows or nothing runs any more (the replica idles)."""
    table, book, kv = engine.table, engine.book, scheduler.kv
    sums = steps_blocks = None
    if folds:
        rid = np.array([r for r, _ in folds], dtype=np.int64)
        k = np.array([w for _, w in folds], dtype=np.int64)
        for r in rid.tolist():
            book.ensure(r)
        f1 = k + 1
        prompt = table.prompt[rid]
        ln = Lanes(np.concatenate([ln.rid, rid]), np.concatenate([ln.first, f1]), np.concatenate([ln.generated, np.ones(len(rid), np.int64)]),
                   np.concatenate([ln.remaining, table.output[rid] - 1]), np.concatenate([ln.context, prompt + 1]),
                   np.concatenate([ln.base, book.start[rid] - f1]), np.concatenate([ln.reach, f1 + book.count[rid]]))
        sums = np.zeros((4, W))
        once = len(set(k.tolist())) == len(k)  # else two arrivals in a step (admit): their prefills add up
        pairs = prompt * (prompt + 1) // 2  # Σ n over the chunk's tokens, nothing cached before
        blocks = kv.request_blocks(prompt) if kv is not None else None  # a whole prefill reserves the draft window too
        if kv is not None:
            steps_blocks = np.zeros(W, dtype=np.int64)
        if once:
            sums[0, k], sums[1, k], sums[3, k] = 1.0, prompt, pairs
            if kv is not None:
                steps_blocks[k] = blocks
        else:
            np.add.at(sums[0], k, 1.0)
            np.add.at(sums[1], k, prompt)
            np.add.at(sums[3], k, pairs)
            if kv is not None:
                np.add.at(steps_blocks, k, blocks)
    win = draw(ln, W, book, pre)
    win.folds, win.fold_sums = list(folds), sums
    progress(win)
    keep = cut(win, cut_at_finish=False, kv=kv, held_first=first, held_throughout=throughout, held_steps=steps_blocks)
    if keep < W:
        win.truncate(keep)
    price(win, engine, book, None)
    return win


def _admissions(win: Window, now: float, upcoming: tuple, table, cfg, lookahead: int, extra=None) -> tuple[list, int, int]:
    """Where the window's steps put the upcoming arrivals: each joins at the first step that
    starts at or after it, and the scheduler would admit it there whole — the only request
    waiting, fewer than ``max_num_seqs`` running, its prompt within the step's token budget (its
    blocks: the window's cut), more than one token to generate, no other arrival in that step.
    Returns the admissions ((request, step) pairs, in arrival order), the index of the first
    arrival not admitted, and the step the window must end before (its W: the arrival comes
    after the window). ``extra`` = (prefill delay(request, step), lane delay), when given,
    guesses instead (the window's steps hold no admission): an admission delays the steps after
    it by its prefill's seconds, and each by one more lane's."""
    clock = np.empty(win.W + 1)
    clock[0] = now
    clock[1:] = win.time
    np.add.accumulate(clock, out=clock)
    starts = clock[:-1]
    rids, times = upcoming
    steps = np.searchsorted(starts, times, side="left").tolist() if extra is None else None
    decoding = np.add.reduce(win.active, axis=1)
    out, end = [], win.W
    if extra is not None:
        starts = starts.copy()
        prefill_delay, lane_delay = extra
        later = np.arange(1, win.W + 1, dtype=np.float64)
    for i, r in enumerate(rids.tolist()):
        k = steps[i] if extra is None else int(np.searchsorted(starts, times[i], side="left"))
        if k >= win.W:
            return out, i, end
        if out and out[-1][1] == k:  # two arrivals in one step: the scheduler admits them together, not a window
            out.pop()
            return out, i - 1, k
        if not _admissible(table, cfg, lookahead, r, k, int(decoding[k])):
            return out, i, k
        out.append((r, k))
        if extra is not None:  # the steps after k start later: its prefill, then one more lane in each
            starts[k + 1:] += prefill_delay(r, k) + lane_delay * later[: win.W - k - 1]
    return out, len(rids), end


def fold(engine, scheduler, plan, pre: Prefills, ln: Lanes, now: float, step_guess: float, upcoming: tuple, first: int,
         throughout: int) -> Window:
    """A window that takes in the arrivals it foresees (open loop, this replica's own): where
    the scheduler would admit one whole at the first step boundary after it and nothing else
    changes, the window goes on with its prefill in that step and a lane from the next.
    Placing an arrival needs the step times before it, which depend on the arrivals placed
    before it: a first pass without arrivals places the first exactly and guesses the others
    (:func:`_guess_delays`); each further pass, with them placed, checks each against its own
    step times and places them there, up to :data:`FOLD_PASSES`; the window keeps the steps
    before the first arrival placed elsewhere than they put it (those depend on earlier
    arrivals only, all placed right). The result is the scheduler's, step by step."""
    table, cfg, lookahead = engine.table, scheduler.config, engine.lookahead
    rids, times = upcoming
    rids, times = rids[:FOLD_ARRIVALS], times[:FOLD_ARRIVALS]
    ends = ln.remaining + ln.first
    W = int(_max(ends))
    if len(times):
        W = max(W, int((float(times[-1]) - now) / max(step_guess, 1e-9) * 1.25) + 2)
    W = max(1, min(W, engine.window_max))
    win = _with_folds(engine, scheduler, plan, pre, ln, W, [], first, throughout)
    implied, i, end = _admissions(win, now, (rids, times), table, cfg, lookahead)
    placed: list = []
    if implied:  # a first guess: each admission delays the steps after it by its prefill and a lane
        placed = _admissions(win, now, (rids, times), table, cfg, lookahead, _guess_delays(engine, win, rids))[0]
    for p in range(FOLD_PASSES):
        if placed:
            win = _with_folds(engine, scheduler, plan, pre, ln, W, placed, first, throughout)
            implied, i, end = _admissions(win, now, (rids, times), table, cfg, lookahead)
        j = 0
        while j < min(len(implied), len(placed)) and implied[j] == placed[j]:
            j += 1
        if j == len(placed) or p == FOLD_PASSES - 1:
            break
        placed = implied
    # the steps are right up to the first arrival placed elsewhere than they put it (the first
    # arrival's place depends on no other: at least it is right); the window keeps those
    K = end
    if j < len(implied):
        K = min(K, implied[j][1])
    if j < len(placed):
        K = min(K, placed[j][1])
    if K < win.W:
        win.truncate(max(K, 1))
    win.folds = placed[:j]  # the lanes of those placed later never decode in the steps kept
    win.next_arrival = _after(upcoming, j)
    return win


def _guess_delays(engine, win: Window, rids: np.ndarray):
    """A guess of what admitting each of ``rids`` adds to the steps after it: its prefill's
    seconds (the target's and the drafters' calls with its prompt's tokens on top of the
    window's mean step's, less without), and one more decoding lane's per step (at the window's
    mean batch and context, a full draft)."""
    models = [engine.target] + list(engine.drafters[: engine.book.D])
    cache = engine.guesses
    act = win.active
    lanes_steps = max(np.count_nonzero(act), 1)
    n = max(int(np.add.reduce(win.tokens)) // win.W, 1)
    prompts = engine.table.prompt[rids].tolist()
    new = sorted({p for p in prompts if ("prefill", n, p) not in cache})
    if new:
        tokens = np.array([n] + [n + p for p in new])
        prefill = 0.0
        for m in models:
            if not getattr(m, "own_prefill", True):  # a drafter whose prompt read is priced with the target's prefill
                continue
            t = np.asarray(m.shape_time(1, tokens, 0), dtype=np.float64)
            prefill = prefill + (t[1:] - t[0])
        cache.update(zip((("prefill", n, p) for p in new), np.atleast_1d(prefill).tolist()))
    delays = {r: cache[("prefill", n, p)] for r, p in zip(rids.tolist(), prompts)}
    b = max(round(lanes_steps / win.W), 1)
    ctx = (int(np.add.reduce(win.context[act])) // lanes_steps) >> 6 << 6  # to 64 tokens: a guess
    lane = cache.get(("lane", b, ctx))
    if lane is None:
        batch = np.array([b, b + 1])
        t = engine.target.shape_time(batch, engine.lookahead, ctx)
        lane = float(t[1] - t[0])
        for d in models[1:]:
            t = d.shape_time(batch, 1, ctx)
            lane += engine.max_draft * float(t[1] - t[0])
        lane = cache[("lane", b, ctx)] = max(lane, 0.0)
    return (lambda r, k: delays[r]), lane


def _after(upcoming: tuple, i: int) -> float:
    """The time of upcoming arrival i (inf: none)."""
    return float(upcoming[1][i]) if i < len(upcoming[1]) else np.inf
