"""A window of a replica's steps, computed at once.

Between scheduling events nothing about the batch changes but its contexts, so a replica
(:mod:`draftsim.sim.serving.replica`) computes a *window* of consecutive steps at once,
vectorised over (steps, lanes) with numpy: the first step may carry prefill chunks, the others
are decodes. A window ends before the first step that starts at or after the next known arrival
(a new request joins the batch at the first step boundary after it arrives), before the KV pool
would overflow, when a request runs out of drawn rounds, and — when a finish can change what
comes next (requests waiting, a running prefill waiting for blocks, a batch-dependent
controller, closed-loop clients) — after the first step in which a request finishes. The result is the same as stepping one iteration at a
time (``window_max = 1``; ``tests/test_serving_replica.py`` holds the two equal).

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

from dataclasses import dataclass

import numpy as np

from ..controllers import NO_CAP, Controller
from ..cost.base import BatchStats
from .scheduler import controller_view

__all__ = ["Prefills", "Lanes", "Window", "prefills", "lanes", "span", "draw", "cap", "progress", "cut", "price",
           "step_stats", "unit_stats", "uniform_unit_stats", "compute"]


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

    def truncate(self, W: int) -> None:
        """Keep the first W steps."""
        self.W = W
        for name in ("valid", "active", "drafted", "accepted", "emitted", "cum", "before", "context", "batch", "index", "drafted_raw"):
            setattr(self, name, getattr(self, name)[:W])
        if self.caps is not None:
            self.caps = self.caps[:W]
        if self.kv is not None:
            self.kv = self.kv[:W]


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


def cut(win: Window, *, cut_at_finish: bool, kv, held_first: int, held_throughout: int) -> int:
    """The steps the window keeps: up to a lane's last drawn round unless it finishes first,
    after the first finish when ``cut_at_finish``, and before the first step whose KV blocks
    exceed the pool. Besides the lanes', blocks are held by running requests that are not lanes:
    in step 0 (``held_first``) the prefill chunks that complete in it, in every step
    (``held_throughout``) the prefills waiting for their next chunk. Fills ``win.kv``."""
    ln, W = win.lanes, win.W
    keep = W
    if len(ln):
        if int(_min(ln.reach)) < W:  # a lane that does not finish stops at its last drawn round
            keep = int(_min(np.where(win.finish >= W, ln.reach, W)))
        if cut_at_finish:
            keep = min(keep, int(_min(win.finish)) + 1)
    if cut_at_finish and win.prefills.finishing:
        keep = 1
    if kv is not None:
        blocks = kv.request_blocks(win.context)
        held = np.add.reduce(blocks * win.active, axis=1)
        if held_throughout:
            held += held_throughout
        held[0] += held_first
        over = held[1:] > kv.blocks
        if np.count_nonzero(over):
            keep = min(keep, int(over.argmax()) + 1)
        win.kv = held
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
    target = step_stats(n_t, c_t, pre.sums, shape=engine.target.step_shape, width=width, lane_sums=lane_sums)
    time = np.asarray(engine.target.stats_time(target), dtype=np.float64)
    draft_time = None
    for m, model in enumerate(engine.drafters[: book.D]):
        # a drafter prefills its own cache with the target's prefills, unless it shares the target's (self-speculation)
        draft_pre = pre.sums if engine.max_draft > 0 and getattr(model, "own_prefill", True) else None
        cap_ctx = getattr(model, "context_cap", None)  # a drafter attending to a window of its cache (self-speculation)
        calls = _draft_calls(win, book, m, engine.tree_nodes is not None)
        T = max(int(_max(calls, axis=None, initial=0)), 1 if draft_pre is not None else 0)
        if T == 0:
            continue
        # all of this drafter's calls of the window in one cost-model call: rows (t, w); call t of
        # step w batches the lanes making more than t calls, each at its context + the tokens before
        k = np.arange(T)[:, None, None]
        B = len(ln.rid)
        if book.flat[m] and cap_ctx is None and not np.count_nonzero(calls != T * active):
            # every decoding lane makes all T calls: call t's sums are the lanes' (the target's
            # before its prefill chunks) with t more cached tokens each — integers, exact
            seqs, cached = lane_sums
            stats = uniform_unit_stats(seqs, cached, T, draft_pre)
        elif book.flat[m]:  # one token per call
            on = calls > k
            ctx = c_t + k if cap_ctx is None else np.minimum(c_t + k, cap_ctx)
            stats = unit_stats(on.reshape(T * W, B), ctx.reshape(T * W, B), draft_pre)
        else:
            on = calls > k
            per_call = -(-book.call_tokens[:, m].take(win.index, mode="clip") // np.maximum(_raw_calls(win, book, m), 1))
            ctx = c_t + k * per_call if cap_ctx is None else np.minimum(c_t + k * per_call, cap_ctx)
            stats = step_stats((on * per_call).reshape(T * W, B), ctx.reshape(T * W, B), draft_pre)
        per_call = np.asarray(model.stats_time(stats), dtype=np.float64).reshape(T, W)
        calls_time = per_call[0].copy()
        for t in range(1, T):  # call by call, in order: a step's sum whatever the window's shape (a reduction may pair terms)
            calls_time += per_call[t]
        draft_time = calls_time if draft_time is None else draft_time + calls_time
    if draft_time is None:
        draft_time = np.zeros(W)
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
               width: np.ndarray | None = None, lane_sums: list | None = None) -> BatchStats:
    """BatchStats of calls (rows) over sequences (columns) with new tokens ``n`` and contexts
    ``c`` ((R, B) arrays of integers; no checks: the replica builds valid ones); ``pre`` =
    (sequences, tokens, cached, pairs) of prefill chunks added to the first row. Logit rows: one
    per verified token, one per prefill chunk. With ``shape``, also the step's make-up
    (``padded``, ``prefill``); ``width``: the cache width the padded batch attends over
    (default: its longest context). ``lane_sums``, a list, receives the rows' sequences and
    cached tokens before the prefill chunks are added.

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
    padded = prefill = None
    if shape:
        longest = _max(cached, axis=-1, initial=0.0) if width is None else width
        padded = np.stack([sums[0], _max(nf, axis=-1, initial=0.0), longest], axis=-1)
        prefill = np.zeros((R, 2))
        if pre is not None:
            prefill[0] = pre[0], pre[1]
    return _record(sums, pre, padded, prefill)


def unit_stats(on: np.ndarray, c: np.ndarray, pre: tuple | None = None) -> BatchStats:
    """:func:`step_stats` of calls of one new token per sequence: ``on`` (R, B) whether
    sequence j is in call i, at context ``c``. Pairs are then Σ (c + 1)."""
    R, B = on.shape
    buf = np.empty((2, R, B))
    buf[0] = on
    np.multiply(c, buf[0], out=buf[1])
    sums = np.empty((5, R))  # sequences, tokens, cached, pairs, rows
    np.matmul(buf.reshape(2 * R, B), _ones(B), out=sums[1:3].reshape(2 * R))  # sequences (as tokens), cached
    return _unit_record(sums, pre)


def uniform_unit_stats(sequences: np.ndarray, cached: np.ndarray, T: int, pre: tuple | None = None) -> BatchStats:
    """:func:`unit_stats` of T calls in each of W steps where every sequence of step w is in all
    T calls, one token each: ``sequences`` and ``cached`` ((W,) sums) are call 0's, call t adds
    t cached tokens per sequence. Rows (t, w), as :func:`unit_stats` orders them."""
    W = len(sequences)
    sums = np.empty((5, T, W))  # sequences, tokens, cached, pairs, rows
    sums[1] = sequences
    np.multiply(_arange_column(T), sequences, out=sums[2])
    sums[2] += cached
    return _unit_record(sums.reshape(5, T * W), pre)


def _unit_record(sums: np.ndarray, pre: tuple | None) -> BatchStats:
    """The record of one-token calls from ``sums`` (5, R) with its tokens and cached rows filled:
    sequences and logit rows are the tokens, pairs Σ (c + 1) = cached + sequences."""
    sums[0] = sums[1]
    np.add(sums[2], sums[1], out=sums[3])
    sums[4] = sums[1]
    return _record(sums, pre)


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


def _record(sums: np.ndarray, pre: tuple | None, padded=None, prefill=None) -> BatchStats:
    """The record of ``sums`` (5, R): sequences, tokens, cached, pairs and logit rows per call;
    the prefill chunks' sums ``pre`` added to the first call (one logit row each)."""
    if pre is not None:
        sums[:, 0] += (pre[0], pre[1], pre[2], pre[3], pre[0])
    return BatchStats(sums[0], sums[1], sums[2], sums[3], rows=sums[4], padded=padded, prefill=prefill)


# ------------------------------------------------------------------------------------ a window

def compute(engine, scheduler, plan, now: float, step_guess: float, layout_state, next_arrival: float = np.inf) -> Window:
    """The window that starts with ``plan`` at ``now`` (``step_guess``: the last window's mean
    step time, to stop near ``next_arrival``)."""
    table, book = engine.table, engine.book
    pre = prefills(plan, table)
    ln = lanes(plan, pre, table, book)
    waiting = bool(scheduler.waiting)
    stalled = len(scheduler.running) > len(plan.decode) + len(plan.prefill)  # a prefill waits for blocks
    cut_at_finish = waiting or stalled or engine.controller.batch_dependent or engine.closed_loop
    W = span(ln, pre, plan, waiting=waiting, cut_at_finish=cut_at_finish, now=now, next_arrival=next_arrival, step_guess=step_guess,
             window_max=engine.window_max)
    win = draw(ln, W, book, pre)
    cap(win, engine.controller, engine.tree_nodes, len(scheduler.running))
    progress(win)
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
    keep = cut(win, cut_at_finish=cut_at_finish, kv=kv, held_first=first, held_throughout=throughout)
    if keep < W:
        win.truncate(keep)
    price(win, engine, book, layout_state)
    return win
