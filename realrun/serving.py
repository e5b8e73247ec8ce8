"""Real batched serving: continuous batching with speculative decoding on Hugging Face models.

The real counterpart of the serving simulator (:mod:`draftsim.sim.serving`). :class:`Server` admits
requests as they arrive in wall-clock time, prefills them, and decodes the running batch
one *step* at a time with the same policy objects as every other executor
(:mod:`draftsim.sim.policies`, chain policies with one drafter) and a per-step speculation
controller (:mod:`draftsim.sim.controllers`) that may cap the draft length for the whole batch:

1. **admit** — requests whose arrival time has passed join the waiting queue of the serving
   simulator's own scheduler (:class:`draftsim.sim.serving.scheduler.Scheduler`, limits from
   :func:`server_scheduler`: up to ``max_batch`` running sequences, whole-prompt prefills,
   first come first served unless another queue is asked for), which plans the step: the
   running sequences decode, the requests it admits prefill. The server executes that plan
   (:meth:`Server._step`: draft, verify, prefill, emit, record) and tells the scheduler what
   the step did (:meth:`~draftsim.sim.serving.scheduler.Scheduler.update`, from
   :func:`step_outcome`), so ``draftsim check-serve`` prices the very schedule the server ran;
2. **prefill** — in the same step, each joiner's prompt in a forward of the target of its
   own (and of a neural drafter); the target's row after the prompt gives each joiner its
   first token (time to first token), out when the step ends;
3. **decode** — the drafter proposes for the whole batch (Max-Gram and bigram per
   sequence; a neural drafter in batched forwards, one per draft position), the target
   verifies every sequence's block in ONE batched forward, and each sequence accepts its
   own number of tokens with the verification core (:mod:`draftsim.sim.verify`): ``verify_greedy_ids``
   at temperature 0, ``verify_block`` (lossless speculative sampling, [SC] Algorithm 4 with
   the SD rule) when sampling, with a generator per request so that a request's tokens do
   not depend on what else is in the batch;
4. finished sequences (EOS or their token budget) leave; waiting ones join at the next step.

**KV pool** (``kv_tokens``, ``block_size``): optionally the scheduler keeps the serving
simulator's paged pool (:class:`draftsim.sim.serving.kvcache.KVCache`: a running request holds
⌈(its tokens + the draft window) / block_size⌉ blocks, a prefill what it has prefilled) and
admits, and preempts, by it exactly as in the simulator. The server executes a preemption as
vLLM's recompute does: the victim's rows leave the caches, it rejoins the waiting queue at its
front, and when it is admitted again its prompt and every token it generated are prefilled
anew (the prefill's row gives its next token; greedy output equals an uninterrupted run's).
The pool is a budget the scheduler enforces, not the caches' physical layout: the ragged
caches below hold each row's context plus stale slots at the batch's width, so their bytes are
rows × width, while the pool counts each request's own tokens rounded up to blocks (what a
paged cache such as vLLM's would hold); ``check_memory`` bounds the ragged caches' worst case.

**KV cache**: the running sequences' keys and values live in one ragged
:class:`~draftsim.realrun.kvcache.BatchKV` per model (one row per sequence; rejected draft
tokens stay as stale slots, masked, trimmed before each forward and compacted when they pass
:attr:`Server.compact_ratio` of the time axis). Joiners are prefilled in a cache of their
own and merged in; leavers' rows are dropped.

Lossless: with the SD rule the output of every request is the target's own greedy output
for its prompt (temperature 0) or follows the target's distribution (sampling), whatever
the batch composition. Batched fp32 forwards are not bit-identical to single-sequence
ones (other matmul shapes sum in another order; logits differ in the last bits), so a
near-tie between the two best tokens can flip; the tests compare greedy outputs and
explain any flip by the gap.

Everything the server does is recorded (:mod:`draftsim.realrun.servetrace`): per step its batch,
new tokens, contexts, drafter and target time and the wall time outside model calls; per
request its arrival, admission, first token, every token's time and finish, and per round
its drafted and accepted tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..sim.errors import DraftsimError
from ..sim.policies import Autoregressive, Policy
from ..sim.rules import SD
from ..sim.serving.kvcache import KVCache
from ..sim.serving.layout import RaggedLayout
from ..sim.serving.scheduler import Outcome, RequestTable, Scheduler, SchedulerConfig, controller_view
from ..sim.verify import verify_block, verify_greedy_ids
from .drafters import Drafter
from .executor import Sampling, check_drafters
from .kvcache import BatchKV, make_kv, release_kv
from .memory import available_memory
from .models import LoadedModel, sync
from .servetrace import Member, RequestRecord, Step, TokenRecord

__all__ = ["ServeRequest", "Server", "ServeLog", "step_outcome", "server_scheduler", "server_pool", "kv_bytes_per_token", "check_requests", "check_memory", "available_memory",
           "prompt_pool", "requests_from"]

_now = time.perf_counter


@dataclass(frozen=True)
class ServeRequest:
    """One request: ``id``, ``arrival`` (seconds after the run starts), the ``prompt``'s token
    ids, the most tokens it may generate (``max_new_tokens``; EOS may end it earlier) and its
    ``priority`` class (lower is served first under the ``priority`` queue, as in the serving
    simulator's request table)."""

    id: int
    arrival: float
    prompt: tuple
    max_new_tokens: int
    priority: int = 0


# ---------------------------------------------------------------- checks

def kv_bytes_per_token(loaded: LoadedModel) -> int:
    """Bytes of keys and values one token takes in ``loaded``'s cache (all layers)."""
    cfg = loaded.model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    width = next(loaded.model.parameters()).element_size()
    return int(2 * cfg.num_hidden_layers * kv_heads * head_dim * width)


def check_requests(target: LoadedModel, requests: Sequence[ServeRequest]) -> None:
    """Raise unless every request has a prompt, a budget >= 1, an arrival >= 0 and fits the
    target's context (prompt + new tokens + a draft block's worth of stale slots is not
    counted: stale slots hold no positions)."""
    if not requests:
        raise DraftsimError("no requests to serve")
    limit = getattr(target.model.config, "max_position_embeddings", None)
    ids = set()
    for r in requests:
        if r.id in ids:
            raise DraftsimError(f"request id {r.id} appears twice")
        ids.add(r.id)
        if not r.prompt:
            raise DraftsimError(f"request {r.id} has an empty prompt")
        if r.max_new_tokens < 1:
            raise DraftsimError(f"request {r.id} asks for {r.max_new_tokens} new tokens; at least 1")
        if not (np.isfinite(r.arrival) and r.arrival >= 0):
            raise DraftsimError(f"request {r.id} arrives at {r.arrival!r}; arrival times are finite and >= 0 s")
        if limit is not None and len(r.prompt) + r.max_new_tokens > limit:
            raise DraftsimError(f"request {r.id}: prompt of {len(r.prompt)} tokens + {r.max_new_tokens} new tokens exceeds "
                                f"{target.name}'s context of {limit} positions")


def check_memory(models: Sequence[LoadedModel], requests: Sequence[ServeRequest], max_batch: int, max_draft: int,
                 available: int | None = None) -> int:
    """Raise unless ``max_batch`` of the longest requests fit in memory: each model's KV cache
    for prompt + new tokens + a draft block per sequence, twice over (a compaction or a
    merge copies the cache), within 80% of what is free. Returns the bytes needed."""
    if max_batch < 1:
        raise DraftsimError(f"max_batch must be >= 1; got {max_batch}")
    longest = max(len(r.prompt) + r.max_new_tokens for r in requests) + max_draft + 1
    per_token = sum(kv_bytes_per_token(m) for m in models)
    need = 2 * max_batch * longest * per_token
    free = available_memory(models[0].device) if available is None else available
    if need > 0.8 * free:
        fit = int(0.8 * free // (2 * longest * per_token))
        raise DraftsimError(f"a batch of {max_batch} sequences of up to {longest} tokens needs {_mib(need)} of KV cache; "
                            f"{_mib(free)} is free, enough for max_batch <= {fit}")
    return need


def _mib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


# ---------------------------------------------------------------- the server

@dataclass
class _Live:
    """A running request: its index in the run's request table (``rid``), its context
    (prompt + output), policy state and generator; its record once it finished."""

    rid: int
    req: ServeRequest
    context: list
    output: list = field(default_factory=list)
    state: dict = field(default_factory=dict)
    rng: np.random.Generator | None = None
    times: list = field(default_factory=list)  # per output token: the time it was emitted
    steps: list = field(default_factory=list)  # per output token: the step that emitted it
    admitted: float = 0.0
    prefill_step: int = -1
    done: bool = False
    record: RequestRecord | None = None


@dataclass
class _Round:
    """The decoding rows' speculative round in one step (lists in row order): the draft
    length each may use (``ks``, after the controller's cap), its draft (tokens and, when
    sampling, the rows they were drawn from), the tokens fed to the target and the prefix of
    its context the cache kept, the verification's (accepted, next token), and the drafter's
    and target's seconds."""

    ks: list = field(default_factory=list)
    drafts: list = field(default_factory=list)
    feeds: list = field(default_factory=list)
    kept: list = field(default_factory=list)
    results: list = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0


@dataclass
class _Joined:
    """The joiners prefilled in one step: the requests, the tokens each prefilled, the first
    token each got, their caches (to merge into the batch's) and the prefill's seconds."""

    live: list
    tokens: list = field(default_factory=list)
    firsts: list = field(default_factory=list)
    kv: BatchKV | None = None
    dkv: BatchKV | None = None
    seconds: float = 0.0


@dataclass
class ServeLog:
    """What a serving run did: per step (:class:`~draftsim.realrun.servetrace.Step`), per step and
    member (:class:`~draftsim.realrun.servetrace.Member`), per request
    (:class:`~draftsim.realrun.servetrace.RequestRecord`) and per output token
    (:class:`~draftsim.realrun.servetrace.TokenRecord`); ``outputs`` maps request id to its tokens and
    ``seconds`` is the run's wall time."""

    steps: list = field(default_factory=list)
    members: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    outputs: dict = field(default_factory=dict)
    seconds: float = 0.0
    preemptions: list = field(default_factory=list)  #: (step, request id) of each preemption, in order


def _capped(controller, batch: int, k: int, context: int) -> int:
    """The draft length a controller (:class:`draftsim.sim.controllers.Controller`, or a callable of
    the batch size) allows a sequence in a step of ``batch`` sequences at mean ``context``."""
    if controller is None:
        return k
    cap = controller.cap(batch, context) if hasattr(controller, "cap") else controller(batch)
    return k if cap is None else max(0, min(k, int(cap)))


def server_scheduler(max_batch: int, scheduling: str = "fcfs", block_size: int = 16) -> SchedulerConfig:
    """The real server's scheduler limits: at most ``max_batch`` running sequences, no token
    budget per step and whole-prompt prefills (a joiner's prefill is a forward call of its
    own), the waiting queue in ``scheduling`` order, KV blocks of ``block_size`` tokens (when
    the server has a pool). The serving simulator runs the same scheduler when it checks a real
    run (``draftsim check-serve``)."""
    return SchedulerConfig(max_num_seqs=max_batch, max_num_batched_tokens=1 << 24, chunked_prefill=False, policy=scheduling,
                           block_size=block_size)


def server_pool(kv_tokens: int | None, block_size: int, max_draft: int) -> KVCache | None:
    """The scheduler's KV pool for ``kv_tokens`` tokens in blocks of ``block_size`` (None: no
    pool), each running request reserving a draft window of ``max_draft + 1`` slots."""
    if kv_tokens is None:
        return None
    blocks = int(kv_tokens) // int(block_size)
    if blocks < 1:
        raise DraftsimError(f"--kv-tokens {kv_tokens} holds less than one block of {block_size} tokens; give at least {block_size}")
    return KVCache(int(block_size), blocks, int(max_draft) + 1)


def step_outcome(scheduler: Scheduler, decoded: list, joiners: list, t: float) -> Outcome:
    """What one step did, for :meth:`Scheduler.update`: the rows that decoded (``decoded``, the
    batch before the step) emitted their new tokens in one round each at ``t``; every row that
    ended before its budget (an end-of-sequence token) stopped, a joiner too (on its prefill's
    token: it decoded nothing). The joiners' prefills are the plan's."""
    t_gen = scheduler.table.generated
    rows = decoded + [r for r in joiners if r.done and len(r.output) < r.req.max_new_tokens]
    n = len(decoded)
    rid = np.array([r.rid for r in rows], dtype=np.int64)
    tokens = np.array([len(r.output) - int(t_gen[r.rid]) for r in decoded] + [0] * (len(rows) - n), dtype=np.int64)
    rounds = np.array([1] * n + [0] * (len(rows) - n), dtype=np.int64)
    stopped = np.array([r.done and len(r.output) < r.req.max_new_tokens for r in rows], dtype=bool)
    return Outcome(t, rid, tokens, rounds, np.full(len(rows), t), stopped)


class Server:
    """Continuous batching with speculative decoding on real models (module docstring).

    ``policy`` is a chain policy of :mod:`draftsim.sim.policies` with at most one drafter and no inner
    blocks (autoregressive, fixed k, heuristic, confidence, threshold); ``controller`` an
    object with ``cap(batch_size) -> int | None`` (or a callable): the most tokens any
    sequence may draft in a step of that batch size (None: no cap). ``seed`` seeds each
    request's generator (``default_rng([seed, request id])``). ``scheduling`` names the
    waiting queue's order (:data:`draftsim.sim.serving.scheduler.QUEUES`); the scheduler's
    limits are :func:`server_scheduler`'s.
    """

    #: Compact a cache when compaction would shorten its time axis by this fraction (and it
    #: holds at least :attr:`compact_min` slots): attention over stale slots costs as much as
    #: over live ones, a compaction copies the live ones once. The simulator's
    #: :class:`~draftsim.sim.serving.layout.RaggedLayout` replays the same rule (:attr:`layout`).
    compact_ratio = RaggedLayout.compact_ratio
    compact_min = RaggedLayout.compact_min

    def __init__(self, target: LoadedModel, drafter: Drafter | None = None, policy: Policy | None = None, controller=None,
                 sampling: Sampling = Sampling(), max_batch: int = 8, seed: int = 0, stop_at_eos: bool = True,
                 clock: Callable[[], float] = _now, sleep: Callable[[float], None] = time.sleep, scheduling: str = "fcfs",
                 kv_tokens: int | None = None, block_size: int = 16):
        self.policy = policy or Autoregressive()
        if self.policy.kind != "chain":
            raise DraftsimError(f"{self.policy!r} is a {self.policy.kind} policy; batched serving runs chain policies")
        plan = self.policy.begin_round(self.policy.init(1))
        if self.policy.n_models > 2 or any(b.inner or b.model != 1 for b in plan):
            raise DraftsimError(f"{self.policy!r} drafts with several models; batched serving runs policies of one drafter "
                                "(ar, fixed, heuristic, confidence, threshold)")
        need = self.policy.n_models - 1
        if need and drafter is None:
            raise DraftsimError(f"{self.policy!r} needs a drafter")
        if not need and drafter is not None:
            raise DraftsimError(f"{self.policy!r} drafts nothing; drop the drafter or give a drafting policy")
        if drafter is not None:
            check_drafters(target, [drafter])
            if drafter.head is not None:
                raise DraftsimError("batched serving does not run acceptance heads")
            if drafter.needs_continuations and not sampling.greedy:
                raise DraftsimError(f"drafter {drafter.name} proposes the target's greedy output; serve it at temperature 0")
        if not isinstance(max_batch, (int, np.integer)) or max_batch < 1:
            raise DraftsimError(f"max_batch must be an integer >= 1; got {max_batch!r}")
        self.target, self.drafter, self.controller = target, drafter, controller
        self.sampling, self.max_batch, self.seed, self.stop_at_eos = sampling, int(max_batch), int(seed), stop_at_eos
        self.eos = target.tokenizer.eos_token_id if stop_at_eos else None
        self.clock, self.sleep = clock, sleep
        self.has_stop = type(self.policy).stop is not Policy.stop
        self.max_draft = self.policy.max_draft
        self.scheduling = server_scheduler(self.max_batch, scheduling, block_size)
        self.pool = server_pool(kv_tokens, block_size, self.max_draft)
        #: the model whose batched forwards drafting runs (:attr:`draftsim.realrun.drafters.Drafter.batch_model`), else None
        self.draft_model = drafter.batch_model if drafter is not None else None

    @property
    def models(self) -> list[LoadedModel]:
        """The models the server runs forwards of: the target, then :attr:`draft_model` if any."""
        return [self.target] + ([self.draft_model] if self.draft_model is not None else [])

    def _record_continuations(self, requests: Sequence[ServeRequest]) -> None:
        """Before the clock: every distinct prompt's greedy continuation, decoded by an
        autoregressive server of the same target and batch limit (all requests at once), for a
        drafter that proposes the target's own output (the controlled drafter). Batched, as the
        timed run is: its rows see the same batched arithmetic, so a near-tie decides alike more
        often than against single-sequence decoding."""
        longest: dict = {}
        for r in requests:
            longest[r.prompt] = max(longest.get(r.prompt, 0), r.max_new_tokens)
        probe = [ServeRequest(i, 0.0, prompt, n) for i, (prompt, n) in enumerate(longest.items())]
        ar = Server(self.target, None, Autoregressive(), max_batch=self.max_batch, seed=self.seed, stop_at_eos=self.stop_at_eos,
                    clock=self.clock, sleep=lambda _: None)
        log = ar.run(probe, check=False)
        release_kv(ar.kv)  # a static cache goes back to its model's pool: the timed server takes it, graphs and all
        for r in probe:
            self.drafter.prepare(r.prompt, log.outputs[r.id])

    @property
    def layout(self) -> RaggedLayout:
        """The cache's compaction rule, as the serving simulator replays it."""
        return RaggedLayout(self.compact_ratio, self.compact_min)

    # ------------------------------------------------------------ the loop

    def run(self, requests: Sequence[ServeRequest], on_step: Callable | None = None, check: bool = True) -> ServeLog:
        """Serve ``requests`` (arrival times relative to the start of the run) to the end.

        Each step, the requests that have arrived join the scheduler's waiting queue and the
        scheduler (:class:`draftsim.sim.serving.scheduler.Scheduler`, limits from
        :func:`server_scheduler`) plans the step: its decodes (every running request) and the
        prefills of the requests it admits; :meth:`_step` executes that plan.
        ``on_step(log, finished)`` is called after every step with the requests that just
        finished (a trace writer commits from there; a progress bar advances)."""
        requests = sorted(requests, key=lambda r: (r.arrival, r.id))
        if check:
            check_requests(self.target, requests)
            models = self.models
            check_memory(models, requests, self.max_batch, self.max_draft)
        if self.pool is not None:
            longest = max(requests, key=lambda r: len(r.prompt) + r.max_new_tokens)
            self.pool.check_request(len(longest.prompt), longest.max_new_tokens)
        log = ServeLog()
        n = len(requests)
        table = RequestTable(np.array([len(r.prompt) for r in requests]), np.array([r.max_new_tokens for r in requests]),
                             np.array([r.priority for r in requests], dtype=np.int64))
        scheduler = Scheduler(self.scheduling, table, self.pool)  # without a pool check_memory bounds the dense cache's worst case
        stash: dict[int, _Live] = {}  # preempted requests, by rid, until they are admitted again
        arrived = 0  # requests[:arrived] have reached the scheduler
        live: list[_Live] = []  # the running requests, in the caches' row order (the scheduler's running order)
        if self.drafter is not None and self.drafter.needs_continuations:  # first: its static cache, released, is the timed one
            self._record_continuations(requests)
        self.kv = make_kv(self.target, self.max_batch)
        self.dkv = make_kv(self.draft_model, self.max_batch) if self.draft_model is not None else None
        self._warm_up()  # a process's first calls set up its libraries and memory: not the first requests' time
        self.start = self.clock()
        while arrived < n or scheduler.running or scheduler.waiting:
            now = self._t()
            while arrived < n and requests[arrived].arrival <= now:
                scheduler.add(arrived, requests[arrived].arrival)
                arrived += 1
            if not scheduler.running and not scheduler.waiting:
                self.sleep(max(0.0, requests[arrived].arrival - now))
                continue
            plan = scheduler.schedule(self.max_draft + 1, now)
            if plan.preempted:
                self._preempt(log, live, plan.preempted, stash)
            if plan.decode != [r.rid for r in live]:  # pragma: no cover - a scheduler bug
                raise RuntimeError(f"the scheduler planned decodes {plan.decode} for a batch holding {[r.rid for r in live]}")
            joiners = [stash.pop(rid, None) or _Live(rid, requests[rid], list(requests[rid].prompt), state=self.policy.init(1),
                                                      admitted=now, prefill_step=len(log.steps),
                                                      rng=np.random.default_rng([self.seed, requests[rid].id]))
                       for rid, _, _ in plan.prefill]
            decoded = list(live)
            finished, t = self._step(log, live, joiners, len(scheduler.running), len(scheduler.waiting))
            left = scheduler.update(plan, step_outcome(scheduler, decoded, joiners, t))
            if sorted(left) != sorted(r.rid for r in finished):  # pragma: no cover - a scheduler bug
                raise RuntimeError(f"the scheduler finished {sorted(left)}; the server, {sorted(r.rid for r in finished)}")
            if on_step is not None:
                on_step(log, [r.record for r in finished])
        log.seconds = self._t()
        for kv in (self.kv, self.dkv):  # static caches back to their models' pools: a later run in this process takes them
            if kv is not None:
                release_kv(kv)
        return log

    def _t(self) -> float:
        return self.clock() - self.start

    def _warm_up(self) -> None:
        """Untimed forwards of every model before the clock starts, as a serving engine warms up:
        a prefill, then decoding steps of two rows. A process's first calls set up CUDA's
        libraries; on a CPU its first prefill cost 1.6x the profile's and its first seconds of
        steps ~5% more (SmolLM2, one thread)."""
        for kv in (self.kv, self.dkv):  # static caches on a CUDA device: every step's shape captured as a graph now
            if kv is not None and getattr(kv, "graphs", False):
                kv.precapture(self.max_draft + 1)
        for loaded in self.models:
            kv = make_kv(loaded, 2, graphs=False)
            kv.add_rows(2)
            kv.forward([[kv.pad] * 64, [kv.pad] * 3], [1, 1])
            for _ in range(4):
                kv.forward([[kv.pad] * 2, [kv.pad]], [2, 1])
        sync(self.target.device)

    def _synced(self) -> float:
        """:meth:`_t` once the device has run every queued kernel (CUDA is asynchronous: a
        forward's time must not leak into the next thing timed)."""
        sync(self.target.device)
        return self._t()

    def _finish(self, log: ServeLog, r: _Live, t: float) -> None:
        """Record a finished request (its :class:`RequestRecord` also in ``r.record``) and its tokens."""
        r.done = True
        r.record = RequestRecord(r.req.id, r.req.arrival, len(r.req.prompt), len(r.output), r.req.max_new_tokens, r.admitted,
                                 r.times[0], t, r.prefill_step)
        log.requests.append(r.record)
        log.outputs[r.req.id] = list(r.output)
        if self.drafter is not None:  # suffix decoding learns from finished requests (a no-op for other drafters)
            self.drafter.finish(r.req.prompt, r.output)
        for i, (tok, when, step) in enumerate(zip(r.output, r.times, r.steps)):
            log.tokens.append(TokenRecord(r.req.id, i, int(tok), when, step))

    def _append(self, r: _Live, new: list, t: float, step: int) -> list:
        """Append ``new`` to ``r``'s output, cut at its budget and after EOS; what was kept."""
        new = new[: r.req.max_new_tokens - len(r.output)]
        if self.eos is not None and self.eos in new:
            new = new[: new.index(self.eos) + 1]
            r.done = True
        r.output.extend(new)
        r.context.extend(new)
        r.times.extend([t] * len(new))
        r.steps.extend([step] * len(new))
        if len(r.output) >= r.req.max_new_tokens:
            r.done = True
        return new

    def _pick(self, r: _Live, logits) -> int:
        """A token from the target's row: argmax (greedy) or a sample of the warped row."""
        if self.sampling.greedy:
            return int(logits.argmax())
        p = self.sampling.rows(logits[None, :])[0]
        return int(r.rng.choice(len(p), p=p / p.sum()))

    def _preempt(self, log: ServeLog, live: list, rids: list, stash: dict) -> None:
        """Execute the scheduler's preemptions (recompute, as vLLM does): the victims' rows leave
        the caches and the batch; each keeps its output, policy state and generator in
        ``stash`` until it is admitted again, when its prompt and output are prefilled anew."""
        gone = set(rids)
        keep = [i for i, r in enumerate(live) if r.rid not in gone]
        for r in live:
            if r.rid in gone:
                stash[r.rid] = r
                log.preemptions.append((len(log.steps), r.req.id))
        self.kv.keep_rows(keep)
        if self.dkv is not None:
            self.dkv.keep_rows(keep)
        live[:] = [live[i] for i in keep]

    def _leave(self, log: ServeLog, live: list, t: float) -> list:
        """Drop finished requests from the batch and the caches (recorded); them."""
        done = [i for i, r in enumerate(live) if r.done]
        if not done:
            return []
        out = [live[i] for i in done]
        for r in out:
            self._finish(log, r, t)
        keep = [i for i, r in enumerate(live) if not r.done]
        self.kv.keep_rows(keep)
        if self.dkv is not None:
            self.dkv.keep_rows(keep)
        live[:] = [live[i] for i in keep]
        return out

    # ------------------------------------------------------------ one step

    def _step(self, log: ServeLog, live: list, joiners: list, running: int, waiting: int = 0) -> tuple[list, float]:
        """One step, as the serving simulator's replica runs it: a speculative round of every
        running sequence (:meth:`_draft`, then one batched :meth:`_verify`) and the
        :meth:`_prefill` of the joiners (their own forwards; their first token comes out at the
        end of the step, and they decode from the next step on). Every token of the step is
        :meth:`_emit`-ted when the step ends; then the finished requests leave, the caches may
        be compacted and the step is recorded (:meth:`_record`). ``running``: the scheduler's
        running requests in the step (what the speculation controller sees as its batch,
        :func:`~draftsim.sim.serving.scheduler.controller_view`). Returns the finished requests
        and when the step's tokens came out."""
        step, batch = len(log.steps), len(live)
        t0 = self._t()
        rnd = self._draft(live, running)
        if live:
            self._verify(live, rnd)
        joined = self._prefill(joiners)
        t1 = self._t()  # the step's tokens come out
        self._emit(log, live, rnd, joined, t1, step)
        if joined.live:
            self.kv.merge(joined.kv)
            if joined.dkv is not None:
                self.dkv.merge(joined.dkv)
            live.extend(joined.live)
        finished = self._leave(log, live, t1)
        compacted = self._compact()
        self._record(log, step, t0, batch, rnd, joined, compacted, waiting)
        return finished, t1

    def _draft(self, live: list, running: int) -> _Round:
        """Every running sequence's draft: its policy's draft length, capped by the controller
        (which sees the step as :func:`~draftsim.sim.serving.scheduler.controller_view` makes
        it: the ``running`` requests, the decoding ones' mean context) and its budget, proposed
        by the drafter (statistical: per sequence; a model's: batched)."""
        rnd = _Round()
        if not live:
            return rnd
        for r in live:
            plan = self.policy.begin_round(r.state)
            k = sum(int(np.asarray(b.steps).reshape(-1)[0]) for b in plan)
            k = min(k, r.req.max_new_tokens - len(r.output) - 1)
            rnd.ks.append(max(k, 0))
        batch, context = controller_view(running, np.array([[len(r.context) for r in live]]), np.ones((1, len(live)), dtype=bool))
        rnd.ks = [_capped(self.controller, int(batch[0]), k, int(context[0])) for k in rnd.ks]
        if self.drafter is None or max(rnd.ks) == 0:
            rnd.drafts = [([], []) for _ in live]
        elif self.draft_model is not None:
            rnd.drafts, rnd.draft_seconds = self._draft_neural(live, rnd.ks)
        else:
            c0 = self._synced()
            rnd.drafts = [self._draft_statistical(r, k) if k else ([], []) for r, k in zip(live, rnd.ks)]
            rnd.draft_seconds = self._synced() - c0
        return rnd

    def _verify(self, live: list, rnd: _Round) -> None:
        """The target verifies every sequence's block in one forward (each row rolled back to
        its context first); each accepts its own number of tokens (greedy: ``verify_greedy_ids``;
        sampling: ``verify_block`` with the SD rule and the request's generator)."""
        for i, (r, (tokens, _)) in enumerate(zip(live, rnd.drafts)):
            keep = self.kv.rollback(i, r.context, len(r.context) - 1)
            rnd.kept.append(keep)
            rnd.feeds.append(r.context[keep:] + tokens)
        self.kv.trim()
        c0 = self._synced()
        rows = self.kv.forward(rnd.feeds, [len(tokens) + 1 for tokens, _ in rnd.drafts])
        rnd.target_seconds = self._synced() - c0
        for r, (tokens, q), logits in zip(live, rnd.drafts, rows):
            if self.sampling.greedy:
                res = verify_greedy_ids(np.asarray(tokens, dtype=np.int64), logits.argmax(dim=-1).cpu().numpy())
            else:
                p = self.sampling.rows(logits)
                qq = np.stack(q) if tokens else np.zeros((0, p.shape[1]))
                res = verify_block(np.asarray(tokens, dtype=np.int64), qq, p, SD(), r.rng, validate=False)
            rnd.results.append((int(res.n_accepted), int(res.token)))

    def _prefill(self, joiners: list) -> _Joined:
        """The joiners' prefills: one forward of the target per joiner (a padded batch of
        prompts of different lengths would compute every row at the longest prompt's length),
        its row after the prompt picking the first token; a neural drafter reads the prompt
        too, but its last token (the first draft feeds it). Their caches are merged into the
        batch's once the step's tokens are out."""
        joined = _Joined(joiners)
        if not joiners:
            return joined
        joined.kv = make_kv(self.target, len(joiners), graphs=False)  # caches used once: no graphs to capture
        joined.dkv = make_kv(self.draft_model, len(joiners), graphs=False) if self.dkv is not None else None
        c0 = self._synced()
        for r in joiners:
            one = make_kv(self.target, 1, graphs=False)
            one.add_rows(1)
            joined.firsts.append(self._pick(r, one.forward([r.context], [1])[0][0]))
            joined.tokens.append(len(r.context))
            joined.kv.merge(one)
            if joined.dkv is not None:
                one = make_kv(self.draft_model, 1, graphs=False)
                one.add_rows(1)
                one.forward([self.drafter.model_ids(r.context[:-1])], [0])
                joined.dkv.merge(one)
        joined.seconds = self._synced() - c0
        return joined

    def _emit(self, log: ServeLog, live: list, rnd: _Round, joined: _Joined, t: float, step: int) -> None:
        """The step's tokens at time ``t``: every decoding row's accepted tokens and the
        target's next one (the policy and the drafter learn how many were accepted), every
        joiner's first token; a member record each."""
        for i, (r, (tokens, _), (n, tok)) in enumerate(zip(live, rnd.drafts, rnd.results)):
            out = self._append(r, tokens[:n] + [tok], t, step)
            self.policy.end_round(r.state, np.array([len(tokens)]), np.array([n]))
            if self.drafter is not None:
                self.drafter.feedback(n)
            log.members.append(Member(step, r.req.id, False, len(rnd.feeds[i]), rnd.kept[i], len(tokens), n, len(out)))
        for r, tok, n in zip(joined.live, joined.firsts, joined.tokens):
            self._append(r, [tok], t, step)
            log.members.append(Member(step, r.req.id, True, n, 0, 0, 0, 1))

    def _compact(self) -> bool:
        """Compact the caches whose stale share passed the server's rule (:attr:`compact_ratio`,
        :attr:`compact_min`); whether the target's was."""
        compacted = False
        if self.kv.length >= self.compact_min and self.kv.stale_fraction > self.compact_ratio:
            self.kv.compact()
            compacted = True
        if self.dkv is not None and self.dkv.length >= self.compact_min and self.dkv.stale_fraction > self.compact_ratio:
            self.dkv.compact()
        return compacted

    def _record(self, log: ServeLog, step: int, t0: float, batch: int, rnd: _Round, joined: _Joined, compacted: bool,
                waiting: int) -> None:
        """The step's record (:class:`~draftsim.realrun.servetrace.Step`): its end once the
        device is done, its decoding members' sums and its time split into drafter, target,
        prefill and the server's own."""
        t2 = self._synced()
        mine = [m for m in log.members[-(batch + len(joined.live)):] if not m.prefill]
        log.steps.append(Step(step, t0, t2, batch, len(joined.live), sum(m.new_tokens for m in mine), sum(m.context for m in mine),
                              sum(joined.tokens), sum(m.drafted for m in mine), sum(m.accepted for m in mine),
                              sum(m.emitted for m in mine) + len(joined.live), max(rnd.ks) if rnd.ks else -1, rnd.draft_seconds,
                              rnd.target_seconds, joined.seconds,
                              (t2 - t0) - rnd.draft_seconds - rnd.target_seconds - joined.seconds, compacted, waiting))

    def _stops(self, r: _Live, index: int, conf: float) -> bool:
        """Whether the policy stops drafting after draft token ``index`` (its ``stop``, with the
        drafter's confidence as the prediction)."""
        if not self.has_stop:
            return False
        c = np.array([conf])
        stop = self.policy.stop(r.state, index, {"prob": conf, "pred": c, "conf": c})
        return stop is not None and bool(np.asarray(stop).reshape(-1)[0])

    def _stop_at(self, r: _Live, confs: Sequence[float]) -> int:
        """How many of the drafted tokens the policy keeps (its ``stop`` after each)."""
        for i, c in enumerate(confs):
            if self._stops(r, i, c):
                return i + 1
        return len(confs)

    def _draft_statistical(self, r: _Live, k: int):
        tokens, rows = self.drafter.propose(r.context, k, prompt_len=len(r.req.prompt))
        confs = rows.conf if rows.conf is not None else rows.prob(tokens)
        n = self._stop_at(r, list(map(float, confs)))
        tokens = list(tokens[:n])
        q = [rows.row(i) for i in range(n)] if not self.sampling.greedy else []
        return tokens, q

    def _draft_neural(self, live: list, ks: list):
        """Batched drafting: one forward of the drafter's model per draft position over the rows
        still drafting (first position: each row catches up on the tokens it has not seen). A
        drafter whose forwards only cost time (:meth:`~draftsim.realrun.drafters.Drafter.serve_proposal`:
        the controlled drafter) proposes its own tokens; the forwards run all the same."""
        B = len(live)
        tokens = [[] for _ in range(B)]
        qs = [[] for _ in range(B)]
        given = [self.drafter.serve_proposal(r.context, k, len(r.req.prompt)) if k else None for r, k in zip(live, ks)]
        if any(g is not None for g in given):
            ks = [len(g) if g is not None else 0 for g in given]
        active = [k > 0 for k in ks]
        if not any(active):
            return list(zip(tokens, qs)), 0.0
        ids = self.drafter.model_ids
        seconds = 0.0
        for j in range(max(ks)):
            feeds = []
            for i, r in enumerate(live):
                if not active[i]:
                    feeds.append([])
                elif j == 0:
                    keep = self.dkv.rollback(i, ids(r.context), len(r.context) - 1)
                    feeds.append(ids(r.context[keep:]))
                else:
                    feeds.append(ids(tokens[i][-1:]))
            if j == 0:
                self.dkv.trim()
            c0 = self._synced()
            rows = self.dkv.forward(feeds, [1 if a else 0 for a in active])
            seconds += self._synced() - c0
            for i, r in enumerate(live):
                if not active[i]:
                    continue
                logits = rows[i][0]
                if given[i] is not None:
                    tok, conf = given[i][j], 1.0
                elif self.sampling.greedy:
                    tok = int(logits.argmax())
                    conf = 1.0
                    if self.has_stop:
                        import torch

                        conf = float(torch.softmax(logits.double(), -1)[tok])
                else:
                    q = self.sampling.rows(logits[None, :])[0]
                    tok = int(r.rng.choice(len(q), p=q / q.sum()))
                    conf = float(q[tok])
                    qs[i].append(q)
                tokens[i].append(tok)
                if len(tokens[i]) >= ks[i] or self._stops(r, len(tokens[i]) - 1, conf):
                    active[i] = False
            if not any(active):
                break
        return list(zip(tokens, qs)), seconds


# ---------------------------------------------------------------- workloads of real prompts

def prompt_pool(target: LoadedModel, sets: Sequence[str] = ("code", "instructions", "docstrings", "arithmetic"), split: str = "test") -> list:
    """Token ids of the bundled prompts of ``sets`` (:mod:`draftsim.realrun.prompts`), formatted for
    ``target``, interleaved set by set."""
    from .prompts import format_prompt, prompt_set

    lists = [[format_prompt(p, target.tokenizer) for p in prompt_set(s, split)] for s in sets]
    out = []
    for i in range(max(len(x) for x in lists)):
        out.extend(x[i] for x in lists if i < len(x))
    return out


def requests_from(arrival, prompt_tokens, output_tokens, pool: Sequence[Sequence[int]], priority=None) -> list[ServeRequest]:
    """Serve requests for a workload (arrays of arrival seconds, prompt and output lengths, and
    optionally priority classes):
    request i's prompt is bundled prompt i (cycled), followed by the next ones and cut to its
    length when a length is asked for (``prompt_tokens[i]`` = 0: the bundled prompt as it is)."""
    if not pool:
        raise DraftsimError("no prompts to serve")
    out = []
    for i, (t, n, m) in enumerate(zip(arrival, prompt_tokens, output_tokens)):
        ids = list(pool[i % len(pool)])
        j = i + 1
        while n and len(ids) < n:
            ids.extend(pool[j % len(pool)])
            j += 1
        out.append(ServeRequest(i, float(t), tuple(ids[: int(n)] if n else ids), int(m), int(priority[i]) if priority is not None else 0))
    return out
