"""Scheduler.update (sim.serving.scheduler): the one place a request's state changes after a step.

The serving simulator's replica tells the scheduler what a *window* of steps did in one call
(``sim.serving.replica.outcome``: the lanes' tokens, rounds and latest times, vectorised); the
real server tells it what each step did (``realrun.serving.step_outcome``, from its running
rows). Here the same steps — plans, tokens per request per step, step times — go through both
paths, each into its own scheduler: after every window the two request tables, running lists
and waiting queues are equal, field by field and bit for bit, and the next plans are the same.
Whatever the queue, the KV pool (preemptions by recompute), chunked prefill and window lengths.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.realrun.serving import ServeRequest, _Live, step_outcome
from draftsim.sim.serving.kvcache import KVCache
from draftsim.sim.serving.replica import outcome
from draftsim.sim.serving.scheduler import Outcome, RequestTable, Scheduler, SchedulerConfig
from draftsim.sim.serving.window import Lanes

WINDOW = 4  # draft window: k_max + 1


def same_state(a: Scheduler, b: Scheduler) -> None:
    sa, sb = a.table.state(), b.table.state()
    for name in RequestTable.FIELDS:
        np.testing.assert_array_equal(sa[name], sb[name], err_msg=name)
    assert a.running == b.running and a.preemptions == b.preemptions
    assert len(a.waiting) == len(b.waiting) and (not a.waiting or a.waiting.head() == b.waiting.head())


def same_plan(p, q) -> None:
    assert (p.decode, p.prefill, p.preempted, p.blocked) == (q.decode, q.prefill, q.preempted, q.blocked)


def window_outcome(sched: Scheduler, plan, steps: list, now: float, ends: np.ndarray):
    """The simulator's path: the window's lanes (the plan's decodes, then the requests whose
    prefill the plan completes and that go on decoding) and their tokens step by step, as a
    window holds them, through the replica's ``outcome``."""
    t = sched.table
    join = [r for r, c, d in plan.prefill if d + c >= t.need[r] and t.generated[r] + 1 < t.output[r]]
    rid = np.array(plan.decode + join, dtype=np.int64)
    first = np.array([0] * len(plan.decode) + [1] * len(join), dtype=np.int64)
    generated = t.generated[rid] + first
    remaining = t.output[rid] - generated
    emitted = np.array([[step.get(int(r), 0) for r in rid] for step in steps], dtype=np.int64).reshape(len(steps), len(rid))
    lanes = Lanes(rid, first, generated, remaining, t.prompt[rid] + generated, first * 0, first + len(steps))
    win = SimpleNamespace(lanes=lanes, cum=np.add.accumulate(emitted, axis=0), active=emitted > 0)
    return outcome(win, len(steps), now + ends)


@st.composite
def setups(draw):
    n = draw(st.integers(1, 12))
    prompt = draw(st.lists(st.integers(1, 90), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    priority = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    gaps = draw(st.lists(st.floats(0.0, 0.2), min_size=n, max_size=n))
    chunked = draw(st.booleans())
    budget = draw(st.integers(WINDOW, 300)) if chunked else 400
    cfg = SchedulerConfig(max_num_seqs=draw(st.integers(1, 6)), max_num_batched_tokens=budget, chunked_prefill=chunked,
                          policy=draw(st.sampled_from(["fcfs", "priority", "shortest-first"])), block_size=draw(st.sampled_from([1, 4, 16])))
    blocks = draw(st.one_of(st.none(), st.integers(8, 60)))
    return prompt, output, priority, np.cumsum(gaps), cfg, blocks, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=80, deadline=None)
@given(setups())
def test_a_window_and_its_steps_leave_the_same_state(setup):
    prompt, output, priority, arrival, cfg, blocks, seed = setup
    kv = KVCache(cfg.block_size, blocks, WINDOW) if blocks is not None else None
    if kv is not None and any(kv.request_blocks(p + o) > kv.blocks for p, o in zip(prompt, output)):
        kv = None
    rng = np.random.default_rng(seed)
    make = lambda: Scheduler(cfg, RequestTable(np.array(prompt), np.array(output), np.array(priority)), kv)  # noqa: E731
    sim, real = make(), make()
    live = {rid: _Live(rid, ServeRequest(rid, float(arrival[rid]), (1,) * p, o), [1] * p) for rid, (p, o) in enumerate(zip(prompt, output))}
    n, arrived, now, finished = len(prompt), 0, 0.0, set()

    def arrive():
        nonlocal arrived
        while arrived < n and arrival[arrived] <= now:
            sim.add(arrived, float(arrival[arrived]))
            real.add(arrived, float(arrival[arrived]))
            arrived += 1

    plan = None  # a plan the real path got that ended the simulator's window: the next window's
    for _ in range(10_000):
        if plan is None:
            arrive()
            if not real.running and not real.waiting:
                if arrived == n:
                    break
                now = float(arrival[arrived])
                continue
            plan = real.schedule(WINDOW, now)
        same_plan(sim.schedule(WINDOW, now), plan)
        first_plan, start, steps, ends = plan, now, [], []
        lanes = set(plan.decode) | {r for r, c, d in plan.prefill if d + c >= real.table.need[r]}
        step_plan, plan, snapshot = first_plan, None, None
        limit = int(rng.integers(1, 7))
        while True:  # the window: its first step runs the plan, the others go on decoding the same requests
            decoded = [live[r] for r in step_plan.decode]
            tokens = {}
            for r in decoded:
                k = min(int(rng.integers(1, WINDOW + 1)), r.req.max_new_tokens - len(r.output))
                r.output.extend([7] * k)
                tokens[r.rid] = k
            joiners = [live[r] for r, c, d in step_plan.prefill if d + c >= real.table.need[r]]
            for r in joiners:
                r.output.append(7)
            for r in decoded + joiners:
                r.done = len(r.output) >= r.req.max_new_tokens
            ends.append((ends[-1] if ends else 0.0) + float(rng.uniform(0.01, 0.05)))
            now = start + ends[-1]
            left = real.update(step_plan, step_outcome(real, decoded, joiners, now))
            assert sorted(left) == sorted(r.rid for r in decoded + joiners if r.done)
            finished.update(left)
            steps.append(tokens)
            arrive()  # an arrival ends the window (its steps started before it)
            if len(steps) >= limit or not real.running or real.waiting:
                break
            snapshot = (real.table.state(), list(real.running), real.preemptions)
            plan = real.schedule(WINDOW, now)
            if plan.prefill or plan.preempted or set(plan.decode) != lanes - finished:
                break  # the scheduler changes the batch: the window ends before this step
            step_plan, plan = plan, None
        sim_left = sim.update(first_plan, window_outcome(sim, first_plan, steps, start, np.array(ends)))
        assert set(sim_left) == lanes & finished
        if plan is None:
            same_state(sim, real)
        else:  # the real path has planned the next step already: the state it planned from
            table, running, preemptions = snapshot
            for name, value in sim.table.state().items():
                np.testing.assert_array_equal(value, table[name], err_msg=name)
            assert sim.running == running and sim.preemptions == preemptions
    else:
        raise AssertionError("the schedulers stalled")
    assert finished == set(range(n))
    same_state(sim, real)
    assert (sim.table.generated == sim.table.output).all() and np.isfinite(sim.table.finish).all()


def test_a_request_that_stops_early_finishes_at_its_last_token():
    """The real server's rows may end on an end-of-sequence token before their budget: the
    outcome says so (``stopped``) and the scheduler finishes them then — a decoding row, and a
    joiner whose prefill's token is the end."""
    t = RequestTable(np.array([5, 6, 7]), np.array([10, 10, 10]), np.zeros(3, dtype=np.int64))
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), t, None)
    sched.add(0, 0.0)
    sched.add(1, 0.0)
    plan = sched.schedule(WINDOW, 0.0)
    rows = {rid: _Live(rid, ServeRequest(rid, 0.0, (1,) * 5, 10), [1] * 5) for rid in range(3)}
    for r in rows.values():
        r.output.append(7)
    assert sched.update(plan, step_outcome(sched, [], [rows[0], rows[1]], 0.5)) == []
    sched.add(2, 0.6)
    plan = sched.schedule(WINDOW, 1.0)
    assert plan.decode == [0, 1] and [p[0] for p in plan.prefill] == [2]
    rows[0].output.extend([7, 7])
    rows[1].output.extend([7, 7, 7])
    rows[1].done = True  # its third token is the end of sequence
    rows[2].done = True  # its prefill's token is the end of sequence
    left = sched.update(plan, step_outcome(sched, [rows[0], rows[1]], [rows[2]], 1.5))
    assert sorted(left) == [1, 2] and sched.running == [0]
    np.testing.assert_array_equal(t.generated, [3, 4, 1])
    np.testing.assert_array_equal(t.finish[1:], [1.5, 1.5])
    assert np.isnan(t.finish[0]) and t.last_emit[0] == 1.5 and t.rounds.tolist() == [1, 1, 0]


def test_only_the_scheduler_writes_the_table():
    t = RequestTable(np.array([5]), np.array([3]), np.zeros(1, dtype=np.int64))
    for name in RequestTable.FIELDS:
        with pytest.raises(ValueError, match="read-only"):
            getattr(t, name)[0] = 1
    sched = Scheduler(SchedulerConfig(), t, None)
    sched.add(0, 2.0)
    plan = sched.schedule(WINDOW, 2.5)
    assert sched.update(plan, Outcome(3.0, np.array([0]), np.array([0]), np.array([0]), np.array([3.0]))) == []
    assert (t.arrival[0], t.admitted[0], t.first_token[0], t.generated[0]) == (2.0, 2.5, 3.0, 1)
