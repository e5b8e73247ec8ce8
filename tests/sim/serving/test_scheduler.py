"""sim.serving.scheduler: the scheduler's step plans, driven directly (no replica, no clock).

A small driver executes each plan as a replica would and tells the scheduler what it did
(:meth:`Scheduler.update`: prefill chunks advance ``prefilled``; a completed prefill emits one
token; a decode emits 1..window tokens in one round) and checks, on random
workloads, what the module docstring states: the planned steps fit the KV pool and the token
budget, at most ``max_num_seqs`` run, admission follows the queue (FCFS with preempted
requests back at the head; ``priority``: lowest class, then arrival), nothing is admitted in a
step that preempted, and every request ends with exactly its output tokens. Whole serving runs
under the priority and shortest-first queues are at the end of this file; preemption counts and
Little's law are in tests/sim/serving/test_server.py.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_server import serving_config

from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving import make_workload, serve
from draftsim.sim.serving.kvcache import KVCache, blocks_for
from draftsim.sim.serving.scheduler import QUEUES, FCFSQueue, Outcome, RequestTable, Scheduler, SchedulerConfig
from draftsim.sim.serving.workload import Fixed, Poisson, parse_lengths


def planned_blocks(sched: Scheduler, t: RequestTable, plan) -> int:
    """Blocks the step's running requests need: decodes their tokens and draft window,
    prefills what they will have prefilled (with the window once the prefill completes)."""
    kv = sched.kv
    chunks = {rid: chunk for rid, chunk, _ in plan.prefill}
    total = 0
    for rid in sched.running:
        if t.decoding[rid]:
            tokens = t.prompt[rid] + t.generated[rid] + kv.lookahead
        else:
            done = t.prefilled[rid] + chunks.get(rid, 0)
            tokens = done + (kv.lookahead if done >= t.need[rid] else 0)
        total += int(blocks_for(tokens, kv.block_size))
    return total


def drive(cfg: SchedulerConfig, kv: KVCache | None, prompt, output, priority, arrive_step, window: int, seed: int):
    """Run the scheduler until every request finishes; check every plan; return the admission log."""
    n = len(prompt)
    t = RequestTable(np.array(prompt), np.array(output), np.array(priority))
    sched = Scheduler(cfg, t, kv)
    rng = np.random.default_rng(seed)
    model: deque = deque()  # the FCFS queue as the docstring states it
    waiting: set = set()
    admitted, finished, arrived = [], set(), 0
    for step in range(20_000):
        while arrived < n and arrive_step[arrived] <= step:
            sched.add(arrived, float(arrive_step[arrived]))
            model.append(arrived)
            waiting.add(arrived)
            arrived += 1
        if len(finished) == n:
            return admitted, t, sched
        before = set(sched.running)
        plan = sched.schedule(window, float(step))
        # preempted requests went back to the queue, the latest preempted at its head
        for rid in plan.preempted:
            assert rid in before and rid not in sched.running
            model.appendleft(rid)
            waiting.add(rid)
        new = [rid for rid, _, done in plan.prefill if rid not in before or rid in plan.preempted]
        if plan.preempted:
            assert not new, "nothing is admitted in a step that preempted"
        for rid in new:
            if cfg.policy == "fcfs":
                assert rid == model.popleft(), "FCFS admits the queue's head"
            else:
                best = min(waiting, key=lambda r: (t.priority[r], t.arrival[r], r))
                assert (t.priority[rid], t.arrival[rid]) == (t.priority[best], t.arrival[best])
                model.remove(rid)
            waiting.discard(rid)
            admitted.append(rid)
        assert len(sched.running) <= cfg.max_num_seqs
        assert set(plan.decode) <= set(sched.running) and all(t.decoding[r] for r in plan.decode)
        prefill_tokens = sum(chunk for _, chunk, _ in plan.prefill)
        assert prefill_tokens <= max(cfg.max_num_batched_tokens - window * len(plan.decode), 0)
        for rid, chunk, done in plan.prefill:
            assert chunk >= 1 and done == t.prefilled[rid] and done + chunk <= t.need[rid]
            if not cfg.chunked_prefill:
                assert chunk == t.need[rid] and done == 0
        if kv is not None:
            assert planned_blocks(sched, t, plan) <= kv.blocks
        # execute the plan
        rid = np.array(plan.decode, dtype=np.int64)
        left = t.output[rid] - t.generated[rid]
        tokens = np.minimum(rng.integers(1, window + 1, len(rid)), left)
        completing = [r for r, chunk, done in plan.prefill if done + chunk >= t.need[r]]
        running = list(sched.running)
        done_now = sched.update(plan, Outcome(step + 1.0, rid, tokens, np.ones(len(rid), dtype=np.int64), np.full(len(rid), step + 1.0)))
        assert set(done_now) == {r for r in running if t.generated[r] >= t.output[r]}
        assert all(t.decoding[r] and t.last_emit[r] == step + 1.0 for r in completing)
        assert all(t.finish[r] == step + 1.0 and r not in sched.running for r in done_now)
        finished.update(done_now)
        assert (t.generated <= t.output).all()
    raise AssertionError("the scheduler stalled: requests left unfinished")


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 14))
    prompt = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    priority = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    arrive = sorted(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)))
    return prompt, output, priority, arrive


@settings(max_examples=150, deadline=None)
@given(workloads(), st.integers(1, 6), st.integers(1, 300), st.booleans(), st.sampled_from(["fcfs", "priority"]),
       st.integers(1, 16), st.integers(2, 40), st.integers(0, 1000))
def test_plans_fit_the_pool_and_budget_and_follow_the_queue(wl, seqs, budget, chunked, policy, block, blocks, seed):
    prompt, output, priority, arrive = wl
    window = 5
    kv = KVCache(block, blocks, window)
    fits = [kv.request_blocks(p + o) <= kv.blocks for p, o in zip(prompt, output)]
    budget = max(budget, window) if chunked else max(budget, window + max(p + o for p, o in zip(prompt, output)))
    if not all(fits):
        with pytest.raises(DraftsimError, match="memory too small"):
            for p, o in zip(prompt, output):
                kv.check_request(p, o)
        return
    cfg = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget, chunked_prefill=chunked, policy=policy, block_size=block)
    admitted, t, sched = drive(cfg, kv, prompt, output, priority, arrive, window, seed)
    assert (t.generated == t.output).all()
    assert sorted(set(admitted)) == list(range(len(prompt)))
    assert len(admitted) == len(prompt) + int(t.preemptions.sum()) == len(prompt) + sched.preemptions


def test_fcfs_without_memory_pressure_admits_in_arrival_order():
    n = 10
    cfg = SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=64)
    admitted, t, sched = drive(cfg, None, [30] * n, [5] * n, [0] * n, list(range(n)), window=3, seed=0)
    assert admitted == list(range(n)) and sched.preemptions == 0


def test_priority_serves_the_lower_class_first():
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=256, policy="priority")
    admitted, _, _ = drive(cfg, None, [8] * 5, [3] * 5, [2, 1, 0, 1, 0], [0] * 5, window=2, seed=0)
    assert admitted == [2, 4, 1, 3, 0]


def test_preemption_frees_the_latest_admitted_and_readmits_it_first():
    """Two requests fill the pool; as they grow the later one is preempted by recompute: it
    prefills its prompt and what it had generated, then continues."""
    kv = KVCache(block_size=4, blocks=10, lookahead=2)
    t = RequestTable(np.array([12, 12]), np.array([20, 20]), np.zeros(2, dtype=np.int64))
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=100, block_size=4), t, kv)
    sched.add(0, 0.0)
    sched.add(1, 0.0)
    both, none = np.array([0, 1]), np.zeros(0, dtype=np.int64)
    plan = sched.schedule(3, 0.0)
    assert [p[0] for p in plan.prefill] == [0, 1] and not plan.preempted
    assert sched.update(plan, Outcome(1.0, none, none, none, np.zeros(0))) == []
    assert (t.decoding == [True, True]).all() and (t.generated == 1).all() and (t.admitted == 0.0).all()
    plan = sched.schedule(3, 1.0)
    assert plan.decode == [0, 1]
    sched.update(plan, Outcome(2.0, both, np.array([5, 5]), np.array([1, 1]), np.array([2.0, 2.0])))
    assert (t.generated == 6).all()  # 12 + 6 + 2 = 20 tokens: 5 blocks each, the pool is full
    assert sched.held_blocks() == 10
    plan = sched.schedule(3, 2.0)
    sched.update(plan, Outcome(3.0, both, np.array([1, 1]), np.array([1, 1]), np.array([3.0, 3.0])))
    assert (t.generated == 7).all()  # 6 blocks each: one must go
    plan = sched.schedule(3, 3.0)
    assert plan.preempted == [1] and plan.decode == [0] and plan.blocked == "kv"
    assert sched.running == [0] and t.need[1] == 12 + 7 and t.prefilled[1] == 0 and not t.decoding[1]
    assert sched.update(plan, Outcome(4.0, np.array([0]), np.array([13]), np.array([1]), np.array([4.0]))) == [0]
    assert t.finish[0] == 4.0 and sched.running == []
    plan = sched.schedule(3, 4.0)
    assert plan.prefill == [(1, 19, 0)]
    assert sched.update(plan, Outcome(5.0, none, none, none, np.zeros(0))) == []
    assert t.generated[1] == 8 and t.prefills[1] == 2 and t.first_token[1] == 1.0 and t.last_emit[1] == 5.0


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    t = RequestTable(np.array([50, 50]), np.array([4, 4]), np.zeros(2, dtype=np.int64))
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=60, chunked_prefill=False), t, None)
    sched.add(0, 0.0)
    sched.add(1, 0.0)
    plan = sched.schedule(3)
    assert plan.prefill == [(0, 50, 0)] and plan.blocked == "budget"


@pytest.mark.parametrize("kw, match", [
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(block_size=0), "block_size"),
    (dict(policy="lifo"), "scheduling policy must be one of fcfs, priority, shortest-first; got 'lifo'"),
])
def test_config_ranges(kw, match):
    with pytest.raises(DraftsimError, match=match):
        SchedulerConfig(**kw)


# -- whole runs: priority and shortest-first service, the request queues ----------------------------

def test_priority_scheduling_serves_class_0_first():
    wl = make_workload(arrivals=Poisson(), qps=40.0, requests=400, duration=None, prompt=Fixed(128), output=Fixed(64),
                       rng=np.random.default_rng(5), priorities=3)
    run = serve(serving_config(scheduler=SchedulerConfig(max_num_seqs=8, policy="priority")), wl, seed=5)
    wait = run.admitted - run.arrival
    by_class = [wait[wl.priority == c].mean() for c in range(3)]
    assert by_class[0] < by_class[1] < by_class[2]
    fcfs = serve(serving_config(scheduler=SchedulerConfig(max_num_seqs=8)), wl, seed=5)
    assert np.all(np.diff(fcfs.admitted[np.argsort(fcfs.arrival, kind="stable")]) >= 0)  # FCFS admits in arrival order


def test_shortest_first_admits_short_prompts_sooner():
    """Under load, shortest-first admits the short prompts ahead of the long ones that arrived
    before them: their mean wait falls below FCFS's, the long prompts' rises."""
    wl = make_workload(arrivals=Poisson(), qps=40.0, requests=300, duration=None, prompt=parse_lengths("uniform:16,1024"),
                       output=Fixed(64), rng=np.random.default_rng(2))
    short = wl.prompt < np.median(wl.prompt)
    waits = {}
    for queue in ("fcfs", "shortest-first"):
        run = serve(serving_config(scheduler=SchedulerConfig(max_num_seqs=8, policy=queue)), wl, seed=2)
        waits[queue] = run.admitted - run.arrival
    assert waits["shortest-first"][short].mean() < 0.5 * waits["fcfs"][short].mean()
    assert waits["shortest-first"][~short].mean() > waits["fcfs"][~short].mean()


def test_request_queues_order_and_victims():
    """Each queue's admission order and the running request it gives up first."""
    table = RequestTable(np.array([50, 10, 30, 10]), np.full(4, 8), np.array([2, 0, 1, 0]))
    table._w.arrival[:] = [0.0, 1.0, 2.0, 3.0]  # (only a scheduler writes the table: Scheduler.add records arrivals)
    order = {}
    for name, cls in QUEUES.items():
        q = cls(table)
        for rid in range(4):
            q.push(rid)
        order[name] = [q.pop() for _ in range(4)]
        assert not q
        assert q.victim([0, 1, 2, 3]) == {"fcfs": 3, "priority": 0, "shortest-first": 0}[name]
    assert order == {"fcfs": [0, 1, 2, 3], "priority": [1, 3, 2, 0], "shortest-first": [1, 3, 2, 0]}
    q = FCFSQueue(table)
    q.push(1)
    q.push(2, front=True)  # a preempted request goes back to the head
    assert q.head() == 2 and len(q) == 2
    with pytest.raises(DraftsimError, match="shortest-first"):
        SchedulerConfig(policy="lifo")
