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

State of every request lives in a :class:`RequestTable` (arrays over the run's requests).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import DraftsimError, as_count
from .kvcache import KVCache, blocks_for

__all__ = ["SchedulerConfig", "RequestTable", "StepPlan", "Scheduler", "RequestQueue", "FCFSQueue", "PriorityQueue",
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
    """Per-request state of one run (arrays indexed by request id).

    prompt, output : tokens of the prompt and tokens to generate (the first comes from the prefill)
    priority       : class (lower is served first under the ``priority`` policy)
    arrival        : time the request reached its replica (NaN before)
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

    def __init__(self, prompt: np.ndarray, output: np.ndarray, priority: np.ndarray):
        n = len(prompt)
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self.output = np.asarray(output, dtype=np.int64)
        self.priority = np.asarray(priority, dtype=np.int64)
        self.arrival = np.full(n, np.nan)
        self.generated = np.zeros(n, dtype=np.int64)
        self.prefilled = np.zeros(n, dtype=np.int64)
        self.need = self.prompt.copy()
        self.decoding = np.zeros(n, dtype=bool)
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.admitted = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.replica = np.full(n, -1, dtype=np.int64)
        self.rounds = np.zeros(n, dtype=np.int64)
        self.prefills = np.zeros(n, dtype=np.int64)
        self.last_emit = np.full(n, np.nan)

    def __len__(self) -> int:
        return len(self.prompt)


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
    """One replica's queues and KV pool (see the module docstring)."""

    def __init__(self, config: SchedulerConfig, table: RequestTable, kv: KVCache | None):
        self.config, self.table, self.kv = config, table, kv
        self.running: list[int] = []
        self.waiting: RequestQueue = QUEUES[config.policy](table)
        self.preemptions = 0

    # -- queues -----------------------------------------------------------------------------
    def add(self, rid: int) -> None:
        self.waiting.push(rid)

    def _victim(self) -> int:
        """Index into ``running`` of the request to preempt (the queue's policy says which)."""
        return self.waiting.victim(self.running)

    # -- KV accounting ----------------------------------------------------------------------
    def held_blocks(self, rids=None) -> int:
        """Blocks the running requests hold (decoding: tokens + draft window; prefilling: what
        is prefilled)."""
        if self.kv is None:
            return 0
        rids = self.running if rids is None else rids
        if not rids:
            return 0
        t, r = self.table, np.asarray(rids)
        dec = t.decoding[r]
        tokens = np.where(dec, t.prompt[r] + t.generated[r] + self.kv.lookahead, t.prefilled[r])
        return int(blocks_for(tokens, self.kv.block_size).sum())

    def _preempt(self, index: int, plan: StepPlan) -> None:
        t = self.table
        rid = self.running.pop(index)
        t.decoding[rid] = False
        t.prefilled[rid] = 0
        t.need[rid] = t.prompt[rid] + t.generated[rid]
        t.preemptions[rid] += 1
        self.preemptions += 1
        self.waiting.push(rid, front=True)
        plan.preempted.append(rid)

    # -- one step -----------------------------------------------------------------------------
    def schedule(self, draft_window: int) -> StepPlan:
        """Plan the next step; ``draft_window`` = k_max + 1 tokens charged per decode."""
        cfg, t, kv = self.config, self.table, self.kv
        plan = StepPlan()
        # 1. decodes, preempting until the running requests' blocks fit
        used = self.held_blocks()
        if kv is not None:
            while self.running and used > kv.blocks:
                self._preempt(self._victim(), plan)
                used = self.held_blocks()
        budget = cfg.max_num_batched_tokens
        for rid in self.running:
            if t.decoding[rid]:
                plan.decode.append(rid)
                budget -= draft_window
        # 2. continuing chunked prefills
        for rid in self.running:
            if t.decoding[rid]:
                continue
            chunk = self._chunk(rid, budget, used)
            if chunk <= 0:
                continue
            plan.prefill.append((rid, chunk, int(t.prefilled[rid])))
            used += self._chunk_blocks(rid, chunk)
            budget -= chunk
        if not plan.decode and not plan.prefill and len(self.running) > 1:
            # partial prefills holding every block and none able to go on: make room
            self._preempt(self._victim(), plan)
            return self.schedule(draft_window)
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
            t.prefilled[rid] = 0
            plan.prefill.append((rid, chunk, 0))
            used += self._chunk_blocks(rid, chunk)
            budget -= chunk
        return plan

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
            slots = (int(blocks_for(done, kv.block_size)) + kv.blocks - used) * kv.block_size
            chunk = min(chunk, slots - done)
            if chunk == left and done + chunk + kv.lookahead > slots:
                chunk = min(left - 1, slots - done)
            if chunk <= 0:
                return -1
        return chunk

    def _chunk_blocks(self, rid: int, chunk: int) -> int:
        """Blocks added by prefilling ``chunk`` more tokens (the draft window is reserved with
        the last chunk)."""
        t, kv = self.table, self.kv
        if kv is None:
            return 0
        done = int(t.prefilled[rid])
        after = done + chunk + (kv.lookahead if done + chunk >= t.need[rid] else 0)
        bs = kv.block_size
        return -(-after // bs) + (-done // bs)  # ⌈after / bs⌉ − ⌈done / bs⌉, in Python ints
