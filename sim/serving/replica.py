"""One replica: a simpy process that runs the scheduler's steps on the models' devices.

A **step** (one iteration of the engine) runs, for the batch the scheduler chose:

1. the drafters: for every decoding request, its round's drafter calls — drafter m's t-th
   call batches the requests that make at least t + 1 calls — at each request's context, and
   the drafters' share of the step's prefill chunks (a drafter keeps its own KV cache);
2. the target: one forward call over Σ(k_i + 1) verification tokens of the decoding requests
   (each at its own context) and the prefill chunks (each at the context prefilled so far).

Its duration is the sum of those forward calls' times from the cost models
(:mod:`draftsim.sim.cost`; the draft of a step needs the previous step's verification, so drafting and
verification are serial also when the drafter has a device of its own — that only frees the
target's memory). The rounds are the requests' pre-drawn rounds (:mod:`draftsim.sim.serving.rounds`),
capped per step by the speculation controller (:mod:`draftsim.sim.controllers`).

**Windows.** Between scheduling events nothing about the batch changes but its contexts, so the
replica computes a *window* of consecutive steps at once, vectorised over (steps, requests)
with numpy: the first step may carry prefill chunks, the others are decodes. A window ends
before the first step that starts at or after the next known arrival (a new request joins the
batch at the first step boundary after it arrives), before the KV pool would overflow, when a
request runs out of drawn rounds, and — when a finish can change what comes next (requests
waiting, a batch-dependent controller, closed-loop clients) — after the first step in which
a request finishes. The simpy process holds one timeout per window; an arrival it could not
foresee (closed-loop clients of another replica) wakes it, and it keeps only the steps that
started before the arrival. The result is the same as stepping one iteration at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from ..controllers import NO_CAP, Controller
from ..cost.base import BatchStats
from .kvcache import KVCache, blocks_for
from .layout import LayoutState, RaggedLayout
from .metrics import Recorder
from .rounds import RoundBook
from .scheduler import RequestTable, Scheduler, StepPlan

__all__ = ["Replica", "Engine", "WINDOW_MAX"]

#: Most steps computed in one window.
WINDOW_MAX = 512


@dataclass
class Engine:
    """What every replica of a server shares: the models' costs, the policy's bound, the
    controller, the request table, the round book and the recorder."""

    env: simpy.Environment
    table: RequestTable
    book: RoundBook
    target: object
    drafters: list
    controller: Controller
    max_draft: int
    recorder: Recorder
    separate_drafter: bool = False
    closed_loop: bool = False
    next_arrival: object = None  # callable: the next known arrival time (inf: none)
    on_finish: object = None  # callable(rid) when a request's last token is out
    window_max: int = WINDOW_MAX
    #: for a tree policy, nodes of a full tree of depth 0, 1, …, depth (what a capped tree verifies)
    tree_nodes: np.ndarray | None = None
    #: a dense ragged batch cache: the target's verification is priced over its width
    #: (:mod:`draftsim.sim.serving.layout`) instead of the longest context
    layout: RaggedLayout | None = None

    @property
    def lookahead(self) -> int:
        return self.max_draft + 1


class _Window:
    """The arrays of one window (steps × lanes) and what committing its first n steps does."""

    __slots__ = ("W", "lanes", "s", "gen0", "rem", "active", "e", "d", "a", "cum", "time", "draft_time", "batch", "tokens",
                 "kv", "finish_step", "plan", "prefill_done", "layout")


def _stats(n: np.ndarray, c: np.ndarray, pre=None, shape: bool = False, width: np.ndarray | None = None) -> BatchStats:
    """BatchStats over the last axis of new tokens ``n`` and contexts ``c`` (no checks: the
    replica builds valid arrays); ``pre`` = (sequences, tokens, cached, pairs) of prefill
    chunks added to the first row. Logit rows: one per verified token, one per prefill chunk.
    With ``shape``, also the step's make-up (``padded``, ``prefill``); ``width``: the cache
    width the padded batch attends over (default: its longest context)."""
    act = n > 0
    nf = n.astype(np.float64)
    cf = c * act
    pairs = nf + 1.0
    pairs *= 0.5
    pairs += cf
    pairs *= nf
    out = [act.sum(axis=-1).astype(np.float64), nf.sum(axis=-1), cf.sum(axis=-1).astype(np.float64), pairs.sum(axis=-1)]
    rows = out[1].copy()
    padded = prefill = None
    if shape:
        longest = cf.max(axis=-1, initial=0).astype(np.float64) if width is None else width
        padded = np.stack([out[0], nf.max(axis=-1, initial=0.0), longest], axis=-1)
        prefill = np.zeros(out[0].shape + (2,))
    if pre is not None:
        for x, v in zip(out, pre):
            x[0] += v
        rows[0] += pre[0]
        if shape:
            prefill[0] = pre[0], pre[1]
    return BatchStats(*out, rows=rows, padded=padded, prefill=prefill)


class Replica:
    """One serving engine instance: a scheduler, a KV pool and its step loop."""

    def __init__(self, index: int, engine: Engine, scheduler: Scheduler):
        self.index, self.engine, self.scheduler = index, engine, scheduler
        self.kv: KVCache | None = scheduler.kv
        self._idle: simpy.Event | None = None
        self._wake: simpy.Event | None = None
        self._pending_finish = np.zeros(0)
        self._step_guess = 1e-3
        self._layout = LayoutState(len(engine.table)) if engine.layout is not None else None
        self.process = engine.env.process(self._run())

    # -- the outside world -------------------------------------------------------------------
    def submit(self, rid: int) -> None:
        """A request reaches this replica now."""
        self.engine.table.replica[rid] = self.index
        self.scheduler.add(rid)
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()
        elif self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def outstanding(self) -> int:
        """Requests here that have not finished by now (for least-outstanding routing)."""
        done = int(np.searchsorted(self._pending_finish, self.engine.env.now, side="right"))
        return len(self.scheduler.running) + len(self.scheduler.waiting) - done

    # -- the step loop --------------------------------------------------------------------------
    def _run(self):
        env, eng, sched = self.engine.env, self.engine, self.scheduler
        while True:
            if not sched.running and not sched.waiting:
                self._idle = env.event()
                yield self._idle
                self._idle = None
                continue
            plan = sched.schedule(eng.lookahead)
            now = env.now
            for rid, _, _ in plan.prefill:
                if np.isnan(eng.table.admitted[rid]):
                    eng.table.admitted[rid] = now
            win = self._window(plan, now)
            waiting = len(sched.waiting)  # during the window (arrivals join at its end)
            starts = np.concatenate([[0.0], np.cumsum(win.time)[:-1]])
            ends = starts + win.time
            nxt = eng.next_arrival() if eng.next_arrival is not None else np.inf
            n = max(1, int(np.searchsorted(now + starts, nxt, side="left")))
            n = min(n, win.W)
            fin = win.finish_step
            self._pending_finish = np.sort(now + ends[fin[(fin >= 0) & (fin < n)]])
            planned = now + ends[n - 1]
            if not eng.closed_loop:  # open loop: every arrival is foreseen (the window stops at it)
                yield env.timeout(ends[n - 1])
            else:
                self._wake = env.event()
                yield env.timeout(ends[n - 1]) | self._wake
            if env.now < planned:  # woken by an arrival nobody foresaw
                n = max(1, int(np.searchsorted(now + starts[:n], env.now, side="left")))
                self._pending_finish = np.sort(now + ends[fin[(fin >= 0) & (fin < n)]])
                self._wake = None
                rest = now + ends[n - 1] - env.now
                if rest > 0:
                    yield env.timeout(rest)
            self._wake = None
            self._commit(win, n, now, starts, ends, waiting)
            self._pending_finish = np.zeros(0)
            self._step_guess = float(win.time[:n].mean())

    # -- one window ------------------------------------------------------------------------------
    def _window(self, plan: StepPlan, now: float) -> _Window:
        eng, t, book, sched = self.engine, self.engine.table, self.engine.book, self.scheduler
        L = eng.lookahead
        n_prefill = len(plan.prefill)
        pf = np.array(plan.prefill, dtype=np.int64).reshape(n_prefill, 3)
        p_rid, p_chunk, p_done = pf[:, 0], pf[:, 1], pf[:, 2]
        completes = (p_done + p_chunk) >= t.need[p_rid]
        finishing = completes & (t.generated[p_rid] + 1 >= t.output[p_rid])  # the prefill's token is the last
        joining = completes & ~finishing
        pre = (n_prefill, float(p_chunk.sum()), float(p_done.sum()), float((p_chunk * (p_done + (p_chunk + 1) / 2.0)).sum()))
        # lanes: decoding requests (from step 0) and prefills that complete now (from step 1)
        join = p_rid[joining]
        for rid in join.tolist():
            book.ensure(rid)
        n_dec = len(plan.decode)
        lanes = np.concatenate([np.array(plan.decode, dtype=np.int64), join]) if len(join) else np.array(plan.decode, dtype=np.int64)
        s = np.zeros(len(lanes), dtype=np.int64)
        s[n_dec:] = 1
        gen0 = t.generated[lanes] + s
        rem = t.output[lanes] - gen0
        used = t.rounds[lanes]
        avail = book.count[lanes] - used
        if (avail <= 0).any():
            for j in np.flatnonzero(avail <= 0).tolist():  # a capped request spent its drawn rounds
                book.extend(int(lanes[j]), int(rem[j]))
            avail = book.count[lanes] - used
        base = book.start[lanes] + used
        prompt = t.prompt[lanes]
        waiting = bool(sched.waiting)
        cut_at_finish = waiting or eng.controller.batch_dependent or eng.closed_loop
        partial = n_prefill > 0 and not completes.all()
        # how many steps to compute
        if partial or (waiting and plan.blocked == "budget") or not len(lanes):
            W = 1
        else:
            span = rem + s
            W = int(span.min() if cut_at_finish else span.max())
            nxt = eng.next_arrival() if eng.next_arrival is not None else np.inf
            if np.isfinite(nxt):
                W = min(W, int((nxt - now) / max(self._step_guess, 1e-9) * 1.25) + 2)
            W = max(1, min(W, eng.window_max, int((s + np.maximum(avail, 0)).max(initial=1))))
        B = len(lanes)
        w = np.arange(W)[:, None]
        local = w - s[None, :]
        valid = (local >= 0) & (local < avail[None, :])
        idx = base[None, :] + np.clip(local, 0, np.maximum(avail - 1, 0)[None, :])
        d_raw = book.drafted[idx]
        a = book.accepted[idx]
        e = book.emitted[idx]
        batch = valid.sum(axis=1)
        batch[0] += n_prefill
        d = d_raw
        capped = False
        if type(eng.controller).caps is not Controller.caps:
            ctx_mean = float((prompt + gen0).mean()) if B else 0.0
            cap = eng.controller.caps(batch, np.full(W, ctx_mean))[:, None]
            if (cap < NO_CAP).any():
                capped = True
                if eng.tree_nodes is not None:  # a cap on a tree cuts its depth
                    depth = len(eng.tree_nodes) - 1
                    d = np.where(cap < depth, eng.tree_nodes[np.minimum(cap, depth)], d_raw)
                else:
                    d = np.minimum(d_raw, cap)
                a = np.minimum(a, cap)
                e = np.minimum(e, a + 1)
        e = np.where(valid, e, 0)
        cum = np.cumsum(e, axis=0)
        before = cum - e
        active = valid & (before < rem[None, :])
        e_eff = np.where(active, np.minimum(e, rem[None, :] - before), 0)
        done = active & (cum >= rem[None, :])
        finish_step = np.where(done.any(axis=0), done.argmax(axis=0), -1)
        # cuts: a lane out of drawn rounds, the first finish, the KV pool
        W_eff = W
        starved = (~done.any(axis=0)) & (s + avail < W) & (rem > 0)
        if starved.any():
            W_eff = min(W_eff, int((s + avail)[starved].min()))
        if cut_at_finish:
            if finishing.any():
                W_eff = 1
            elif (finish_step >= 0).any():
                W_eff = min(W_eff, int(finish_step[finish_step >= 0].min()) + 1)
        ctx = prompt[None, :] + gen0[None, :] + before
        kv = None
        if self.kv is not None:
            held = np.where(active, blocks_for(ctx + L, self.kv.block_size), 0).sum(axis=1)
            if len(sched.running) > len(lanes):
                in_lanes = set(lanes.tolist())
                held[0] += sched.held_blocks([r for r in sched.running if r not in in_lanes])
            if joining.any():
                # the joining prefills hold their prefill's blocks in step 0
                held[0] += int(blocks_for(p_done[joining] + p_chunk[joining] + L, self.kv.block_size).sum())
            over = np.flatnonzero(held[1:] > self.kv.blocks)
            if over.size:
                W_eff = min(W_eff, int(over[0]) + 1)
            kv = held
        W_eff = max(W_eff, 1)
        if W_eff < W:
            W = W_eff
            valid, active, e_eff, d, a, done, ctx, batch = (x[:W] for x in (valid, active, e_eff, d, a, done, ctx, batch))
            finish_step = np.where(finish_step < W, finish_step, -1)
            kv = kv[:W] if kv is not None else None
        # step times
        n_t = np.where(active, d + 1, 0)
        c_t = ctx - 1
        width = layout = None
        if self._layout is not None:
            joined = np.full(B, np.nan)
            if len(join):
                done_len = dict(zip(p_rid.tolist(), (p_done + p_chunk).tolist()))
                joined[n_dec:] = [done_len[r] for r in join.tolist()]
            width, _, layout = eng.layout.steps(self._layout, lanes, active, n_t, e_eff, c_t, joined, finish_step)
        target_stats = _stats(n_t, c_t, pre if n_prefill else None, shape=eng.target.step_shape, width=width)
        time = eng.target.stats_time(target_stats).astype(np.float64)
        draft_time = np.zeros(W)
        for m, model in enumerate(eng.drafters):
            if m >= book.D:
                break
            calls_raw = book.calls[idx[:W], m]
            per_call = 1 if book.flat[m] else -(-book.call_tokens[idx[:W], m] // np.maximum(calls_raw, 1))
            if capped and eng.tree_nodes is not None:
                calls = np.minimum(calls_raw, cap[:W])  # one drafter pass per kept level
            elif capped:
                calls = np.where(d_raw[:W] > 0, -(-calls_raw * d // np.maximum(d_raw[:W], 1)), 0)
            else:
                calls = calls_raw
            calls = np.where(active, calls, 0)
            # a drafter that may draft keeps its own cache: it prefills with the target
            T = max(int(calls.max(initial=0)), 1 if n_prefill and eng.max_draft > 0 else 0)
            if T == 0:
                continue
            # all of this drafter's calls of the window in one cost-model call: rows (t, w)
            k = np.arange(T)[:, None, None]
            if book.flat[m]:
                n_k = (calls[None] > k).reshape(T * W, B)
                c_k = (c_t[None] + k).reshape(T * W, B)
            else:
                n_k = np.where(calls[None] > k, per_call[None], 0).reshape(T * W, B)
                c_k = (c_t[None] + k * per_call[None]).reshape(T * W, B)
            st = _stats(n_k, c_k, pre if n_prefill and eng.max_draft > 0 else None)
            draft_time += model.stats_time(st).reshape(T, W).sum(axis=0)
        time = time + draft_time
        win = _Window()
        win.W, win.lanes, win.s, win.gen0, win.rem = W, lanes, s, gen0, rem
        win.active, win.e, win.d, win.a = active, e_eff, d, a
        win.time, win.draft_time, win.batch, win.kv = time, draft_time, batch, kv
        win.tokens = n_t.sum(axis=1)
        win.tokens[0] += int(pre[1])
        win.finish_step = finish_step
        win.plan = plan
        win.prefill_done = (p_rid, p_chunk, completes)
        win.layout = layout
        return win

    def _commit(self, win: _Window, n: int, now: float, starts: np.ndarray, ends: np.ndarray, waiting: int) -> None:
        eng, t, sched, rec = self.engine, self.engine.table, self.scheduler, self.engine.recorder
        finished = []
        # prefills (step 0)
        p_rid, p_chunk, completes = win.prefill_done
        t0 = now + ends[0]
        for rid, chunk, comp in zip(p_rid.tolist(), p_chunk.tolist(), completes.tolist()):
            t.prefilled[rid] += chunk
            if comp:
                t.decoding[rid] = True
                t.generated[rid] += 1
                t.prefills[rid] += 1
                if np.isnan(t.first_token[rid]):
                    t.first_token[rid] = t0
                else:
                    rec.itl(np.array([t0 - t.last_emit[rid]]))
                t.last_emit[rid] = t0
                if t.generated[rid] >= t.output[rid]:
                    t.finish[rid] = t0
                    finished.append(rid)
        # decodes
        lanes = win.lanes
        if len(lanes):
            act = win.active[:n]
            e = win.e[:n]
            used = act.sum(axis=0)
            t.rounds[lanes] += used
            t.generated[lanes] = np.where(win.s <= n - 1, win.gen0 + e.sum(axis=0), t.generated[lanes])
            # inter-token latencies: per lane, the gaps between its emitting steps
            j_idx, w_idx = np.nonzero(act.T)
            if j_idx.size:
                times = now + ends[w_idx]
                first = np.ones(j_idx.size, dtype=bool)
                first[1:] = j_idx[1:] != j_idx[:-1]
                prev = np.empty_like(times)
                prev[1:] = times[:-1]
                prev[first] = t.last_emit[lanes[j_idx[first]]]
                rec.itl(times - prev)
                last = np.flatnonzero(np.append(first[1:], True))
                t.last_emit[lanes[j_idx[last]]] = times[last]
            fin = (win.finish_step >= 0) & (win.finish_step < n)
            for j in np.flatnonzero(fin).tolist():
                rid = int(lanes[j])
                t.finish[rid] = now + ends[win.finish_step[j]]
                finished.append(rid)
            d, a = win.d[:n][act], win.a[:n][act]
            rec.spec(d, a)
        for rid in finished:
            sched.running.remove(rid)
        if win.layout is not None:
            self._layout.after(win.lanes, win.layout[n - 1])
        rec.steps(self.index, now + starts[:n], win.time[:n], win.draft_time[:n], win.batch[:n], win.tokens[:n],
                  win.kv[:n] if win.kv is not None else None, waiting)
        if eng.on_finish is not None:
            for rid in finished:
                eng.on_finish(rid)
