"""Iteration-level scheduling in the style of vLLM: running and waiting queues, a token budget
per step, chunked prefill, preemption by recompute.

At every step boundary :meth:`Scheduler.schedule` decides what the next step runs:

1. every running request that has finished its prefill decodes (one speculative round);
   its KV blocks must cover its tokens plus the draft window. When blocks run out, the
   running request its queue gives up first (FCFS: the latest admitted) is **preempted by
   recompute**: its blocks are freed, it returns to the head of the waiting queue, and when
   readmitted it prefills its prompt *and* the tokens it had generated (nothing generated is
   lost or generated twice);
2. running requests in the middle of a chunked prefill get their next chunk;
3. waiting requests are admitted in queue order (:data:`QUEUES`: ``fcfs`` by arrival,
   ``priority`` lower class first, then arrival, ``shortest-first`` shortest prefill first)
   while there are fewer than ``max_num_seqs`` running, the step's token budget
   ``max_num_batched_tokens`` is not spent and their first chunk's blocks are free. The
   queue head blocks the rest (no skipping), as in vLLM.

Decodes charge the budget k_max + 1 tokens each (the draft window), prefills their chunk.
Without chunked prefill a prompt must fit the budget whole.

State of every request lives in a :class:`RequestTable` (arrays over the run's requests), and
only the scheduler writes it: :meth:`Scheduler.add` (an arrival), :meth:`Scheduler.schedule`
(admissions, preemptions) and :meth:`Scheduler.update` (what executing a plan did: its prefill
chunks, the tokens and rounds of the requests that decoded, when, and which stopped early),
called by the serving simulator's replica once per window of steps and by the real server
once per step. Everyone else reads read-only views. Two rules are written once here and read
by both executors: the blocks a request holds (:meth:`KVCache.request_blocks`) and what a
speculation controller sees of a step (:func:`controller_view`).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from ..errors import DraftsimError, as_count
from .kvcache import KVCache

__all__ = ["SchedulerConfig", "RequestTable", "StepPlan", "Outcome", "Scheduler", "controller_view", "RequestQueue", "FCFSQueue", "PriorityQueue",
           "ShortestFirstQueue", "QUEUES", "SCHEDULING_POLICIES"]

@dataclass(frozen=True)
class SchedulerConfig:
    """vLLM's scheduler limits (same names)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    chunked_prefill: bool = True
    policy: str = "fcfs"
    block_size: int = 16

    def __post_init__(self):
        as_count("max_num_seqs", self.max_num_seqs, minimum=1, maximum=1 << 16)
        as_count("max_num_batched_tokens", self.max_num_batched_tokens, minimum=1, maximum=1 << 24)
        as_count("block_size", self.block_size, minimum=1, maximum=4096)
        if self.policy not in SCHEDULING_POLICIES:
            raise DraftsimError(f"scheduling policy must be one of {', '.join(SCHEDULING_POLICIES)}; got {self.policy!r}")


class RequestTable:
    """Per-request state of one run (arrays indexed by request id), read-only to all but the
    scheduler (which writes through ``_w``, the same arrays writable).

    prompt, output : tokens of the prompt and tokens to generate (the first comes from the prefill)
    priority       : class (lower is served first under the ``priority`` policy)
    arrival        : time the request reached its replica (NaN before)
    replica        : the replica it reached (-1 before)
    generated      : output tokens emitted so far
    prefilled      : tokens of the current prefill done (prompt + generated at admission)
    need           : tokens the current prefill must process
    decoding       : prefill done, the request decodes
    first_token, finish, admitted : times (NaN until they happen)
    preemptions    : times the request was preempted
    rounds         : speculative rounds it has used (its place in the round book)
    prefills       : prefills it completed (1 + recomputations after preemptions while decoding)
    last_emit      : time of its latest output token (NaN before the first)
    """

    FIELDS = ("prompt", "output", "priority", "arrival", "replica", "generated", "prefilled", "need", "decoding", "first_token",
              "finish", "admitted", "preemptions", "rounds", "prefills", "last_emit")

    def __init__(self, prompt: np.ndarray, output: np.ndarray, priority: np.ndarray):
        n = len(prompt)
        prompt = np.array(prompt, dtype=np.int64)
        w = self._w = SimpleNamespace(
            prompt=prompt, output=np.array(output, dtype=np.int64), priority=np.array(priority, dtype=np.int64),
            arrival=np.full(n, np.nan), replica=np.full(n, -1, dtype=np.int64), generated=np.zeros(n, dtype=np.int64),
            prefilled=np.zeros(n, dtype=np.int64), need=prompt.copy(), decoding=np.zeros(n, dtype=bool),
            first_token=np.full(n, np.nan), finish=np.full(n, np.nan), admitted=np.full(n, np.nan),
            preemptions=np.zeros(n, dtype=np.int64), rounds=np.zeros(n, dtype=np.int64), prefills=np.zeros(n, dtype=np.int64),
            last_emit=np.full(n, np.nan))
        for name in self.FIELDS:
            view = getattr(w, name).view()
            view.flags.writeable = False
            setattr(self, name, view)

    def __len__(self) -> int:
        return len(self.prompt)

    def state(self) -> dict:
        """A copy of every field (to compare two tables)."""
        return {name: getattr(self, name).copy() for name in self.FIELDS}


@dataclass
class StepPlan:
    """What the next step runs.

    decode   : request ids that decode (one speculative round each)
    prefill  : (request id, chunk tokens, tokens already prefilled) per prefill chunk
    blocked  : why the waiting queue's head was not admitted ("seqs", "kv", "budget") or None
    """

    decode: list = field(default_factory=list)
    prefill: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    blocked: str | None = None


@dataclass(slots=True)
class Outcome:
    """What executing a plan did: one step, or a window of steps that starts with the plan and
    goes on decoding the same requests (no scheduling in between).

    prefill_time : when the plan's prefill chunks are done (the end of its first step): a chunk
                   that completes its request's prefill gives the request's next token then
    rid          : the requests that decoded ((k,) ints, each once; a request whose prefill the
                   plan completed may be among them, decoding after the first step)
    tokens       : output tokens each emitted by decoding (a completed prefill's token not counted)
    rounds       : speculative rounds each used
    last         : when each one's latest token came out (read where ``tokens`` > 0)
    stopped      : (k,) bools, or None for none: the request ended before its output budget
                   (an end-of-sequence token; a request of ``rid`` with no tokens may stop on its
                   prefill's token)
    admissions   : requests that arrived during a window of steps and that a later step of it
                   admitted, each prefilling whole in that step (each was the only request
                   waiting then): (request, the step's start, its end), in order; they may be
                   among ``rid`` from the next step on
    """

    prefill_time: float
    rid: np.ndarray
    tokens: np.ndarray
    rounds: np.ndarray
    last: np.ndarray
    stopped: np.ndarray | None = None
    admissions: list = field(default_factory=list)


def controller_view(running: int, context: np.ndarray, decoding: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What a speculation controller (:mod:`draftsim.sim.controllers`) sees of each step: its
    batch and its mean context, as ``Controller.caps`` reads them ((W,) ints).

    The batch is every running request of the step, its prefills included — ``running``, the
    scheduler's running list once the step is planned (constant over a window: a batch-dependent
    controller's window ends with the first finish). vLLM's does the same: its speculative
    decoding worker disables speculation when ``running_queue_size`` — the scheduler's
    ``len(self.running)`` after the step's admissions, prefills included — reaches
    ``speculative_disable_by_batch_size`` (vllm/core/scheduler.py ``SchedulerOutputs``,
    vllm/spec_decode/spec_decode_worker.py ``_should_disable_all_speculation``, vLLM v0).
    The context is the decoding requests' mean tokens in cache at the step's start (prompt and
    output so far; ``context`` and ``decoding`` are (W, B): step by request), in whole tokens
    (0 in a step that decodes nothing)."""
    decoding = np.asarray(decoding, dtype=bool)
    n = np.add.reduce(decoding, axis=1)
    total = np.add.reduce(np.where(decoding, context, 0), axis=1)
    mean = np.where(n > 0, total // np.maximum(n, 1), 0).astype(np.int64)
    return np.full(len(n), int(running), dtype=np.int64), mean


class RequestQueue:
    """The waiting requests in admission order, and which running request yields its memory
    first (one class per scheduling policy, registered in :data:`QUEUES` by name).

    push(rid)            : a request arrives (or is admitted back after a preemption: ``front``)
    head() / pop()       : the next request to admit, without / with taking it out
    victim(running)      : index into ``running`` (admission order) of the request to preempt
    """

    name = ""

    def __init__(self, table: RequestTable):
        self.table = table

    def __len__(self) -> int:
        raise NotImplementedError

    def __bool__(self) -> bool:
        return len(self) > 0

    def push(self, rid: int, front: bool = False) -> None:
        raise NotImplementedError

    def head(self) -> int:
        raise NotImplementedError

    def pop(self) -> int:
        raise NotImplementedError

    def victim(self, running: list) -> int:
        raise NotImplementedError

    def remove(self, rid: int) -> None:
        """Take ``rid`` out wherever it is (a window admitted it when it was the only one waiting;
        requests that arrived after it may be queued now)."""
        raise NotImplementedError


class FCFSQueue(RequestQueue):
    """First come, first served (vLLM's default): arrival order; a preempted request goes back
    to the head; the latest admitted running request is preempted first."""

    name = "fcfs"

    def __init__(self, table: RequestTable):
        super().__init__(table)
        self._fifo: deque = deque()

    def __len__(self) -> int:
        return len(self._fifo)

    def push(self, rid: int, front: bool = False) -> None:
        (self._fifo.appendleft if front else self._fifo.append)(rid)

    def head(self) -> int:
        return self._fifo[0]

    def pop(self) -> int:
        return self._fifo.popleft()

    def victim(self, running: list) -> int:
        return len(running) - 1

    def remove(self, rid: int) -> None:
        self._fifo.remove(rid)


class _KeyedQueue(RequestQueue):
    """A heap ordered by :meth:`key` (then request id): a preempted request keeps its place by
    its key; the running request of the largest key is preempted first."""

    def __init__(self, table: RequestTable):
        super().__init__(table)
        self._heap: list = []

    def key(self, rid: int) -> tuple:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, rid: int, front: bool = False) -> None:
        heapq.heappush(self._heap, (*self.key(rid), rid))

    def head(self) -> int:
        return self._heap[0][-1]

    def pop(self) -> int:
        return heapq.heappop(self._heap)[-1]

    def victim(self, running: list) -> int:
        return max(range(len(running)), key=lambda i: (*self.key(running[i]), running[i]))

    def remove(self, rid: int) -> None:
        self._heap = [e for e in self._heap if e[-1] != rid]
        heapq.heapify(self._heap)


class PriorityQueue(_KeyedQueue):
    """vLLM's ``priority`` policy: lower class first, then arrival."""

    name = "priority"

    def key(self, rid: int) -> tuple:
        t = self.table
        return int(t.priority[rid]), float(t.arrival[rid])


class ShortestFirstQueue(_KeyedQueue):
    """Shortest prefill first (the tokens its admission must prefill: the prompt, plus what it
    generated before a preemption), then arrival: short prompts do not wait behind long ones
    (shortest-job-first on what the scheduler knows; the output length is not known)."""

    name = "shortest-first"

    def key(self, rid: int) -> tuple:
        t = self.table
        return int(t.need[rid]), float(t.arrival[rid])


#: Scheduling policies by name: the waiting queue each one keeps.
QUEUES = {q.name: q for q in (FCFSQueue, PriorityQueue, ShortestFirstQueue)}
SCHEDULING_POLICIES = tuple(QUEUES)


class Scheduler:
    """One replica's queues and KV pool (see the module docstring); ``replica`` is its index
    (recorded in the table for the requests it receives)."""

    def __init__(self, config: SchedulerConfig, table: RequestTable, kv: KVCache | None, replica: int = 0):
        self.config, self.table, self.kv, self.replica = config, table, kv, int(replica)
        self._w = table._w
        self.running: list[int] = []
        self.waiting: RequestQueue = QUEUES[config.policy](table)
        self.preemptions = 0

    # -- queues -----------------------------------------------------------------------------
    def add(self, rid: int, now: float) -> None:
        """Request ``rid`` arrives at ``now``: it joins the waiting queue."""
        self._w.arrival[rid] = now
        self._w.replica[rid] = self.replica
        self.waiting.push(rid)

    def _victim(self) -> int:
        """Index into ``running`` of the request to preempt (the queue's policy says which)."""
        return self.waiting.victim(self.running)

    # -- KV accounting ----------------------------------------------------------------------
    def held_blocks(self, rids=None) -> int:
        """Blocks the running requests hold (:meth:`KVCache.request_blocks`: decoding, their
        tokens and the draft window; prefilling, what is prefilled)."""
        if self.kv is None:
            return 0
        rids = self.running if rids is None else rids
        if not rids:
            return 0
        t, r = self.table, np.asarray(rids)
        decoding = t.decoding[r]
        tokens = np.where(decoding, t.prompt[r] + t.generated[r], t.prefilled[r])
        return int(np.add.reduce(self.kv.request_blocks(tokens, decoding)))

    def _preempt(self, index: int, plan: StepPlan) -> None:
        w = self._w
        rid = self.running.pop(index)
        w.decoding[rid] = False
        w.prefilled[rid] = 0
        w.need[rid] = w.prompt[rid] + w.generated[rid]
        w.preemptions[rid] += 1
        self.preemptions += 1
        self.waiting.push(rid, front=True)
        plan.preempted.append(rid)

    # -- one step -----------------------------------------------------------------------------
    def schedule(self, draft_window: int, now: float = np.nan) -> StepPlan:
        """Plan the next step, starting at ``now``; ``draft_window`` = k_max + 1 tokens charged
        per decode."""
        cfg, t, kv = self.config, self.table, self.kv
        plan = StepPlan()
        # 1. decodes, preempting until the running requests' blocks fit
        used = self.held_blocks()
        if kv is not None:
            while self.running and used > kv.blocks:
                self._preempt(self._victim(), plan)
                used = self.held_blocks()
        decoding, prefilling = t.decoding, []
        for rid in self.running:
            (plan.decode if decoding[rid] else prefilling).append(rid)
        budget = cfg.max_num_batched_tokens - draft_window * len(plan.decode)
        # 2. continuing chunked prefills
        for rid in prefilling:
            chunk = self._chunk(rid, budget, used)
            if chunk <= 0:
                continue
            plan.prefill.append((rid, chunk, int(t.prefilled[rid])))
            used += self._chunk_blocks(rid, chunk)
            budget -= chunk
        if not plan.decode and not plan.prefill and len(self.running) > 1:
            # partial prefills holding every block and none able to go on: make room
            self._preempt(self._victim(), plan)
            return self.schedule(draft_window, now)
        # 3. admissions (none in a step that preempted: memory is short)
        while self.waiting:
            if plan.preempted:
                plan.blocked = "kv"
                break
            if len(self.running) >= cfg.max_num_seqs:
                plan.blocked = "seqs"
                break
            if budget <= 0:
                plan.blocked = "budget"
                break
            rid = self.waiting.head()
            chunk = self._chunk(rid, budget, used)
            if chunk == -1:
                plan.blocked = "kv"
                break
            if chunk <= 0:
                plan.blocked = "budget"
                break
            self.waiting.pop()
            self.running.append(rid)
            self._w.prefilled[rid] = 0
            if np.isnan(t.admitted[rid]):
                self._w.admitted[rid] = now
            plan.prefill.append((rid, chunk, 0))
            used += self._chunk_blocks(rid, chunk)
            budget -= chunk
        return plan

    def update(self, plan: StepPlan, outcome: Outcome) -> list:
        """Apply what executing ``plan`` did (:class:`Outcome`): its prefill chunks are done (a
        completed prefill decodes from now on, its token out at ``outcome.prefill_time``), the
        requests that decoded emitted their tokens and used their rounds, and those with all
        their tokens (or stopped) finish and leave. Returns the finished request ids: those
        finishing on their prefill's token in the plan's order, then the others in
        ``outcome.rid``'s."""
        w = self._w
        finished = []
        t0 = outcome.prefill_time
        for rid, chunk, _ in plan.prefill:
            w.prefilled[rid] += chunk
            if w.prefilled[rid] >= w.need[rid]:
                w.decoding[rid] = True
                w.generated[rid] += 1
                w.prefills[rid] += 1
                if np.isnan(w.first_token[rid]):
                    w.first_token[rid] = t0
                w.last_emit[rid] = t0
                if w.generated[rid] >= w.output[rid]:
                    w.finish[rid] = t0
                    finished.append(rid)
        for rid, start, end in outcome.admissions:
            self.waiting.remove(rid)
            self.running.append(rid)
            w.admitted[rid] = start
            w.prefilled[rid] = w.need[rid]
            w.decoding[rid] = True
            w.generated[rid] += 1
            w.prefills[rid] += 1
            w.first_token[rid] = w.last_emit[rid] = end
        rid = outcome.rid
        if len(rid):
            w.generated[rid] += outcome.tokens
            w.rounds[rid] += outcome.rounds
            out = outcome.tokens > 0
            if out.all():
                w.last_emit[rid] = outcome.last
            else:
                w.last_emit[rid[out]] = outcome.last[out]
            done = w.generated[rid] >= w.output[rid]
            if outcome.stopped is not None:
                done |= outcome.stopped
            if np.count_nonzero(done):
                for r in rid[done].tolist():
                    if np.isnan(w.finish[r]):  # not finished by its prefill's token above
                        w.finish[r] = w.last_emit[r]
                        finished.append(r)
        for r in finished:
            self.running.remove(r)
        return finished

    def _chunk(self, rid: int, budget: int, used: int) -> int:
        """Tokens of ``rid``'s prefill to run now (0: no budget, -1: no blocks)."""
        t, kv = self.table, self.kv
        left = int(t.need[rid] - t.prefilled[rid])
        if self.config.chunked_prefill:
            chunk = min(left, budget)
        else:
            chunk = left if left <= budget else 0
        if chunk <= 0:
            return 0
        if kv is not None and used + self._chunk_blocks(rid, chunk) > kv.blocks:
            if not self.config.chunked_prefill:
                return -1
            # the largest chunk whose blocks fit (one that completes also needs the draft window)
            done = int(t.prefilled[rid])
            slots = (kv.request_blocks(done, decoding=False) + kv.blocks - used) * kv.block_size
            chunk = min(chunk, slots - done)
            if chunk == left and done + chunk + kv.lookahead > slots:
                chunk = min(left - 1, slots - done)
            if chunk <= 0:
                return -1
        return chunk

    def _chunk_blocks(self, rid: int, chunk: int) -> int:
        """Blocks added by prefilling ``chunk`` more tokens (the draft window is reserved with
        the last chunk)."""
        kv = self.kv
        if kv is None:
            return 0
        done = int(self.table.prefilled[rid])
        after = done + chunk
        return kv.request_blocks(after, decoding=after >= self.table.need[rid]) - kv.request_blocks(done, decoding=False)
