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
replica computes a *window* of consecutive steps at once (:mod:`draftsim.sim.serving.window`).
The simpy process holds one timeout per window; an arrival it could not foresee (closed-loop
clients of another replica) wakes it, and it keeps only the steps that started before the
arrival. The result is the same as stepping one iteration at a time (``window_max = 1``), bit
for bit: a step's price depends on its own batch sums only, and the replica's clock adds the
steps' times one by one in both (times are kept exact, not read from simpy's clock, which adds
delays).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np
import simpy

from ..controllers import Controller
from .kvcache import KVCache
from .layout import LayoutState, RaggedLayout
from .metrics import Recorder
from .rounds import RoundBook
from .scheduler import Outcome, RequestTable, Scheduler
from .window import FOLD_ARRIVALS, Lanes, Window, admit, compute, settle

__all__ = ["Replica", "Engine", "WINDOW_MAX", "outcome"]

_max = np.maximum.reduce

#: Most steps computed in one window.
WINDOW_MAX = 512

#: the value a window's wake event carries when the window ended (an arrival's is its time)
_ENDED = object()


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
    #: callable(replica index): the time of the next arrival this replica's window stops at (inf:
    #: none); where ``foreseen`` it is the next request this replica receives, else a guess (an
    #: arrival that reaches the replica earlier wakes it and cuts its window there)
    next_arrival: object = None
    foreseen: bool = True
    #: callable(replica index, count): the ids and times of the next ``count`` arrivals to the
    #: replica, where they are foreseen (open loop: its window folds them in); None: not known
    upcoming: object = None
    #: the fold's guesses of what an admission delays (:func:`draftsim.sim.serving.window.fold`),
    #: by shape: they only speed the search up, the passes check every placement
    guesses: dict = field(default_factory=dict)
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


class Replica:
    """One serving engine instance: a scheduler, a KV pool and its step loop."""

    def __init__(self, index: int, engine: Engine, scheduler: Scheduler):
        self.index, self.engine, self.scheduler = index, engine, scheduler
        self.kv: KVCache | None = scheduler.kv
        self._idle: simpy.Event | None = None
        self._wake: simpy.Event | None = None
        self._pending: tuple | None = None  # the window under way: (step ends, finishing steps, steps kept, prefills finishing at step 0)
        self._done: list | None = None  # its finish times, sorted (outstanding() fills it)
        self._held: list = []  # (request, arrival) that came at the instant the next step is planned
        self._step_guess = 1e-3
        self._window: tuple | None = None  # the window under way where arrivals are not foreseen: (window, step starts, step ends)
        self._armed = 0  # counts the arming of the window's end (the latest one wakes the loop)
        self._layout = LayoutState(len(engine.table)) if engine.layout is not None else None
        self.process = engine.env.process(self._run())

    # -- the outside world -------------------------------------------------------------------
    def submit(self, rid: int, at: float) -> None:
        """Request ``rid`` reaches this replica at ``at`` (the simulated time, exactly: simpy's
        clock adds delays and may be an ulp off). Where arrivals are not foreseen (closed loop,
        a client's concurrency cap, least-outstanding routing) a request that reaches a busy
        replica joins the first step that starts after it: one that comes at the very instant
        the replica plans its next step (a finish sends it) is held until that step is planned,
        whichever of the two simpy runs first."""
        if self._pending is not None and not self.engine.foreseen:
            ends, _, n, _ = self._pending
            if at >= ends[n - 1]:
                self._held.append((rid, at))
                return
            if self._take_in(rid, at):
                return
        self.scheduler.add(rid, at)
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed(at)
        elif self._wake is not None and not self._wake.triggered:
            self._wake.succeed(at)

    def _take_in(self, rid: int, at: float) -> bool:
        """Take an unforeseen arrival into the window under way where the scheduler would admit
        it whole (:func:`~draftsim.sim.serving.window.admit`): the window goes on with it, its
        steps before the arrival's unchanged, and ends when its new steps do. False where it
        cannot (the arrival then wakes the replica and cuts the window)."""
        wake, state = self._wake, self._window
        if wake is None or wake.triggered or state is None:
            return False
        win, starts, _ = state
        new = admit(self.engine, self.scheduler, win, starts, rid, at)
        if new is None:
            return False
        self.scheduler.add(rid, at)
        clock = np.empty(new.W + 1)
        clock[0] = starts[0]
        clock[1:] = new.time
        np.add.accumulate(clock, out=clock)
        starts, ends = clock[:-1], clock[1:]
        self._window = (new, starts, ends)
        self._pending, self._done = (ends, new.finish, new.W, self._pending[3]), None
        self._arm(wake, float(ends[new.W - 1]))
        return True

    def _arm(self, wake: simpy.Event, end: float) -> None:
        """Wake the step loop with the window's end at ``end`` (an earlier arming no longer does)."""
        self._armed += 1
        armed = self._armed
        self.engine.env.timeout(max(end - self.engine.env.now, 0.0)).callbacks.append(
            lambda _, w=wake, a=armed: w.triggered or a != self._armed or w.succeed(_ENDED))

    def outstanding(self) -> int:
        """Requests here that have not finished by now (for least-outstanding routing): the
        scheduler's, less those the window under way has finished by now (a finish at this very
        instant has finished). The router asks every replica at every arrival, so the window's
        finish times are sorted once, on the first question, and each question is a bisection."""
        base = len(self.scheduler.running) + len(self.scheduler.waiting)
        if self._pending is None:
            return base
        done = self._done
        if done is None:
            ends, finish, n, first = self._pending
            done = self._done = sorted(ends[finish[finish < n]].tolist() + [float(ends[0])] * first)
        return base - bisect_right(done, self.engine.env.now) if done else base

    # -- the step loop --------------------------------------------------------------------------
    def _run(self):
        """The step loop. The replica keeps its own clock, ``now``: a step ends at its start plus
        its time, so the window's step ends are the running sums of [now, time_0, time_1, …]
        — the same additions, in the same order, as stepping one step at a time."""
        env, eng, sched = self.engine.env, self.engine, self.scheduler
        now = env.now
        while True:
            if not sched.running and not sched.waiting and self._held:  # nothing else to plan: they start now
                for rid, at in self._held:
                    sched.add(rid, at)
                self._held = []
            if not sched.running and not sched.waiting:
                self._idle = env.event()
                now = yield self._idle
                self._idle = None
                continue
            plan = sched.schedule(eng.lookahead, now)
            held, self._held = self._held, []
            for rid, at in held:  # they came as this step was planned: they join the next
                sched.add(rid, at)
            nxt = eng.next_arrival(self.index) if eng.next_arrival is not None else np.inf
            upcoming = eng.upcoming(self.index, FOLD_ARRIVALS + 1) if eng.upcoming is not None else None
            win = compute(eng, sched, plan, now, self._step_guess, self._layout, nxt, upcoming)
            nxt = win.next_arrival
            waiting = len(sched.waiting)  # during the window (arrivals join at its end)
            clock = np.empty(win.W + 1)
            clock[0] = now
            clock[1:] = win.time
            np.add.accumulate(clock, out=clock)
            starts, ends = clock[:-1], clock[1:]
            # the steps that start before the next arrival (a guess where not foreseen: the window
            # goes on, and an arrival here wakes the replica)
            n = max(1, np.count_nonzero(starts < nxt)) if eng.foreseen else win.W
            first = self._prefills_finishing(win)  # requests whose last token is their prefill's, out at step 0's end
            self._pending, self._done = (ends, win.finish, n, first), None
            if eng.foreseen:  # every arrival here is foreseen (the window stops at it)
                yield env.timeout(max(ends[n - 1] - env.now, 0.0))
            else:
                # one event, woken by the window's end or by an arrival (its time), whichever comes
                # first (a condition of the two costs more, and one is made per window); an arrival
                # the window takes in (_take_in) replaces the window and re-arms its end
                self._wake = wake = env.event()
                self._window = (win, starts, ends)
                self._arm(wake, float(ends[n - 1]))
                at = yield wake
                win, starts, ends = self._window
                self._window = None
                n = win.W
                if at is not _ENDED:  # an arrival nobody foresaw: keep the steps that started by then
                    n = max(1, np.count_nonzero(starts[:n] <= at))
                    self._pending, self._done = (ends, win.finish, n, first), None
                    self._wake = None
                    rest = ends[n - 1] - env.now
                    if rest > 0:
                        yield env.timeout(rest)
            self._wake = None
            self._commit(plan, win, n, starts, ends, waiting)
            self._pending = self._done = None
            self._step_guess = float(np.add.reduce(win.time[:n])) / n  # (np.mean's sum)
            now = float(ends[n - 1])

    def _commit(self, plan, win: Window, n: int, starts: np.ndarray, ends: np.ndarray, waiting: int) -> None:
        """Apply the window's first n steps (``starts``, ``ends``: each step's start and end):
        the requests' inter-token latencies and the speculative-decoding counters to the
        recorder, what the steps did to the scheduler (:meth:`Scheduler.update`, with
        :func:`outcome`), the steps to the recorder."""
        eng = self.engine
        settle(win, eng.book)  # the lanes taken in, into its arrays
        self._record_itl(win, n, ends)
        if len(win.lanes):  # the rounds verified (the counters are sums over them: the lanes' other steps are left out)
            act = win.active[:n]
            eng.recorder.spec(win.drafted[:n][act], win.accepted[:n][act])
        finished = self.scheduler.update(plan, outcome(win, n, ends))
        if win.layout is not None:
            self._layout.after(win.lanes.rid, win.layout[n - 1])
        eng.recorder.steps(self.index, starts[:n], win.time[:n], win.draft_time[:n], win.batch[:n],
                           win.tokens[:n], win.kv[:n] if win.kv is not None else None, waiting)
        if eng.on_finish is not None:
            for rid in finished:
                eng.on_finish(rid)

    def _prefills_finishing(self, win: Window) -> int:
        """How many of the window's step-0 prefill chunks complete a request that then has all its
        tokens (its one token is the prefill's): they finish at step 0's end, before any lane does
        (``Window.finish`` holds the lanes' finishes only)."""
        t, pre = self.engine.table, win.prefills
        return sum(1 for rid, comp in zip(pre.rid, pre.completes) if comp and t.generated[rid] + 1 >= t.output[rid])

    def _record_itl(self, win: Window, n: int, ends: np.ndarray) -> None:
        """The inter-token latencies of the window's first n steps (before the scheduler learns
        of them: they start from each request's latest token so far). A request prefilled anew
        after a preemption: from its latest token to its prefill's at step 0's end. A lane: from
        its latest token (a joining lane's came out at the end of step 0), then between its
        active steps (a lane decodes in a run of consecutive steps from its first)."""
        t, rec = self.engine.table, self.engine.recorder
        t0 = ends[0]
        pre = win.prefills
        for rid, comp in zip(pre.rid, pre.completes):
            if comp and not np.isnan(t.first_token[rid]):
                rec.itl(np.array([t0 - t.last_emit[rid]]))
        ln = win.lanes
        if not len(ln):
            return
        act = win.active[:n]
        out = ends[:n]  # when each step's tokens come out
        prev = np.empty((len(ln), n))
        prev[:, 0] = t.last_emit[ln.rid]
        prev[:, 1:] = out[:-1]
        if len(pre.join):  # joining lanes: their prefill's token, at step 0's end
            prev[len(ln) - len(pre.join):, 0] = t0
        rec.itl((out - prev)[act.T])


def outcome(win: Window, n: int, ends: np.ndarray) -> Outcome:
    """What the window's first n steps (ending at ``ends``) did, for :meth:`Scheduler.update`:
    the step-0 prefill chunks done at step 0's end, each lane's tokens (up to its remaining
    ones), rounds (its active steps) and latest token's time (a lane that has not decoded yet:
    its prefill's)."""
    ln = win.lanes
    out = ends[:n]
    if not len(ln):
        empty = np.zeros(0, dtype=np.int64)
        return Outcome(float(out[0]), empty, empty, empty, np.zeros(0))
    used = np.add.reduce(win.active[:n], axis=0)
    admitted = [(r, float(ends[k - 1]), float(ends[k])) for r, k in getattr(win, "folds", ()) if k < n]
    if int(_max(ln.first)) > n:  # lanes of arrivals placed in steps the replica does not keep
        keep = ln.first <= n
        ln = Lanes(*(x[keep] for x in (ln.rid, ln.first, ln.generated, ln.remaining, ln.context, ln.base, ln.reach)))
        used = used[keep]
        return Outcome(float(out[0]), ln.rid, np.minimum(win.cum[n - 1][keep], ln.remaining), used, out[ln.first + used - 1], None,
                       admitted)
    return Outcome(float(out[0]), ln.rid, np.minimum(win.cum[n - 1], ln.remaining), used, out[ln.first + used - 1], None, admitted)
