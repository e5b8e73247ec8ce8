"""The serving simulator: a workload through replicas behind a router, on one simpy clock.

    >>> from draftsim.sim.serving import ServingConfig, serve
    >>> from draftsim.sim.serving.workload import Fixed, Poisson, make_workload
    >>> from draftsim.sim import policies, acceptance
    >>> from draftsim.sim.cost import CallCost
    >>> import numpy as np
    >>> cfg = ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), CallCost(0.02, 1e-5), [CallCost(0.002)], kv_tokens=1 << 16)
    >>> wl = make_workload(arrivals=Poisson(), qps=2.0, requests=50, duration=None, prompt=Fixed(128), output=Fixed(64),
    ...                    rng=np.random.default_rng(0))
    >>> run = serve(cfg, wl, seed=0)
    >>> int(run.output.sum()), bool(np.all(np.isfinite(run.finish)))
    (3200, True)

simpy processes: the arrivals (open loop: one process walking the arrival times; closed
loop: one per client), and each replica's step loop (:mod:`draftsim.sim.serving.replica`). The
router places each request on arrival.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import simpy

from ..acceptance import AcceptanceProcess
from ..controllers import Controller, NoControl
from ..errors import DraftsimError, as_count
from ..policies import Policy
from .kvcache import KVCache, memory_plan
from .layout import RaggedLayout
from .metrics import SLO, Recorder, RunRecord, combine, summarize_run
from .replica import WINDOW_MAX, Engine, Replica
from .rounds import RoundBook
from .router import make_router
from .scheduler import RequestTable, Scheduler, SchedulerConfig
from .workload import ClosedLoop, Workload

__all__ = ["ServingConfig", "serve", "run_replications", "ServingResult", "workload_stream"]


@dataclass
class ServingConfig:
    """A server: the drafting policy and acceptance process, the models' cost models (target
    first; one per drafter of the policy), the speculation controller, the scheduler's limits,
    the KV capacity (``kv_tokens``; None: from the hardware when the cost models are
    rooflines, else unlimited), where the drafters run, replicas and router, and the SLOs."""

    policy: Policy
    process: AcceptanceProcess
    target: object
    drafters: list
    controller: Controller = field(default_factory=NoControl)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_tokens: int | None = None
    separate_drafter: bool = False
    replicas: int = 1
    router: str = "round-robin"
    slo: SLO = field(default_factory=SLO)
    window_max: int = WINDOW_MAX
    #: price the target's verification over a dense ragged cache's width (None: over the
    #: longest context, as a paged cache reads it); see :mod:`draftsim.sim.serving.layout`
    layout: RaggedLayout | None = None
    #: the target's cost model in this server without speculation (analysis.loadstudy.autoregressive), where the
    #: engine prices plain decoding apart (its scheduler overlaps host work only there); None: ``target``
    plain_target: object = None
    #: the serving engine (:class:`~draftsim.sim.cost.overheads.EngineOverheads`; None: none): the
    #: memory plan takes out the CUDA-graph memory its KV budget leaves out
    engine: object = None

    def __post_init__(self):
        self.replicas = int(as_count("replicas", self.replicas, minimum=1, maximum=1024))
        make_router(self.router)
        if self.kv_tokens is not None:
            self.kv_tokens = int(as_count("kv_tokens", self.kv_tokens, minimum=1))
        if self.policy.kind != "chain" and self.policy.kind != "tree":
            raise DraftsimError(f"unknown policy kind {self.policy.kind!r}")
        if len(self.drafters) < self.policy.n_models - 1:
            raise DraftsimError(f"the policy uses {self.policy.n_models - 1} drafter(s); give a cost model for each "
                                f"(got {len(self.drafters)})")
        self.controller.bind(self.policy, self.process, self.target, self.drafters, self.scheduler.max_num_seqs)

    @property
    def max_draft(self) -> int:
        return int(self.policy.max_draft)

    def kv_cache(self) -> tuple[KVCache | None, object]:
        """The KV pool of one replica and the memory plan it came from (None: unlimited)."""
        bs = self.scheduler.block_size
        plan = None
        tokens = self.kv_tokens
        if tokens is None:
            plan = memory_plan(self.target, self.drafters[: self.policy.n_models - 1],
                               max_batched_tokens=self.scheduler.max_num_batched_tokens, separate_drafter=self.separate_drafter,
                               engine=self.engine)
            if plan is None:
                return None, None
            tokens = plan.tokens
        blocks = tokens // bs
        if blocks < 1:
            raise DraftsimError(f"memory too small: the KV cache holds {tokens} tokens, less than one block of {bs}"
                                + (f" ({plan.describe()})" if plan else ""))
        return KVCache(bs, blocks, self.max_draft + 1), plan

    def check(self, workload: Workload) -> None:
        """Refuse a workload this server cannot serve (a request too large for memory or for
        the token budget without chunked prefill)."""
        kv, plan = self.kv_cache()
        total = workload.prompt + workload.output
        i = int(np.argmax(total))
        spec = getattr(self.target, "model", None)
        limit = getattr(spec, "max_context", 0) or 0
        if limit and len(total) and int(total[i]) + self.max_draft > limit:
            raise DraftsimError(f"a request of {int(workload.prompt[i]):,} prompt + {int(workload.output[i]):,} output tokens"
                                + (f" (+ a draft of {self.max_draft})" if self.max_draft else "")
                                + f" exceeds {spec.name}'s context of {limit:,} tokens (max_position_embeddings); shorten the requests")
        if kv is not None:
            try:
                kv.check_request(int(workload.prompt[i]), int(workload.output[i]))
            except DraftsimError as exc:
                raise DraftsimError(f"{exc}" + (f"; memory: {plan.describe()}" if plan else "")) from None
        cfg = self.scheduler
        n_models = self.policy.n_models
        for role, model in [("target", self.target), *(("drafter", d) for d in self.drafters[: n_models - 1])]:
            if not hasattr(model, "hardware"):  # measured profiles and fixed costs are finite by construction
                continue
            t = float(np.max(model.shape_time(1, cfg.max_num_batched_tokens, int(total.max()) if len(total) else 0)))
            if not np.isfinite(t):  # e.g. a utilisation so small that a call's time overflows
                raise DraftsimError(f"the {role}'s cost model ({getattr(model, 'name', model)}) prices a forward call of "
                                    f"{cfg.max_num_batched_tokens:,} tokens at {t} s; check its hardware numbers (mfu, mbu, bandwidth)")
        if not cfg.chunked_prefill and int(total.max()) > cfg.max_num_batched_tokens:
            raise DraftsimError(f"without chunked prefill a prefill (prompt + tokens to recompute after a preemption, up to "
                                f"{int(total.max()):,}) must fit max_num_batched_tokens = {cfg.max_num_batched_tokens:,}; "
                                f"raise it or enable chunked prefill")


def workload_stream(seed: int, replication: int) -> np.random.Generator:
    """The random stream a replication's workload is drawn from."""
    return np.random.default_rng([int(seed), int(replication), 1])


def serve(config: ServingConfig, workload: Workload, *, seed: int = 0, replication: int = 0, arrivals=None, progress=None,
          max_in_flight: int | None = None) -> RunRecord:
    """Serve ``workload`` once. ``arrivals`` is a :class:`ClosedLoop` for closed-loop clients
    (the workload's arrival times are then ignored); ``progress(n)`` is called as requests
    finish. ``max_in_flight`` caps the requests sent and unfinished (a client's concurrency
    limit, ``vllm bench serve --max-concurrency``): an open-loop request arriving at the cap
    waits at the client, in arrival order, until one finishes."""
    config.check(workload)
    process, policy = config.process, config.policy
    output = workload.output.copy()
    if process.finite:
        lengths = np.asarray(process.lengths, dtype=np.int64)
        quota = lengths[np.arange(len(output)) % len(lengths)]
        output = quota + 1
    else:
        quota = output - 1
    table = RequestTable(workload.prompt, output, workload.priority)
    book = RoundBook(policy, process, quota, seed=seed, replication=replication)
    env = simpy.Environment()
    recorder = Recorder(config.max_draft)
    closed = isinstance(arrivals, ClosedLoop)
    capped = max_in_flight is not None and not closed
    kv, plan = config.kv_cache()
    if kv is not None:
        i = int(np.argmax(table.prompt + table.output))
        kv.check_request(int(table.prompt[i]), int(table.output[i]))
    n = len(table)
    # times are kept exact (simpy's clock adds delays and may be an ulp off): a request reaches
    # its replica at its arrival time, or when the client could send it (the previous one sent,
    # a request finished), or when a closed-loop client's previous request finished plus its
    # think time
    state = {"next": 0, "done": 0, "slot": None, "sent": 0.0, "freed": 0.0}
    heap: list = []
    finish_events: dict = {}

    R = config.replicas
    round_robin = config.router == "round-robin"

    def next_arrival(replica: int) -> float:
        """The next arrival replica ``replica`` stops its window at: open loop under round-robin
        routing, the next request it receives (request i goes to replica i mod R); else the
        next request anyone receives (one replica); none under least-outstanding routing (its
        window takes an arrival sent to it in where it can, and one it cannot cuts it: stopping
        at a guess, the 4R-th next arrival, ended a window every four arrivals or so)."""
        if closed:
            while heap and heap[0] < env.now:
                heapq.heappop(heap)
            return heap[0] if heap else np.inf
        i = state["next"]
        if capped and i - state["done"] >= max_in_flight:
            return np.inf  # sent when a request finishes (a finish cuts the window)
        if capped:
            return max(float(workload.arrival[i]), state["sent"], state["freed"]) if i < n else np.inf
        if R > 1:
            if not round_robin:
                return np.inf
            i = i + (replica - i) % R
        return float(workload.arrival[i]) if i < n else np.inf

    def on_finish(rid: int) -> None:
        state["done"] += 1
        at = float(table.finish[rid])
        state["freed"] = max(state["freed"], at)
        if state["slot"] is not None:
            state["slot"].succeed(at)
            state["slot"] = None
        if progress is not None:
            progress(1)
        ev = finish_events.pop(rid, None)
        if ev is not None:
            ev.succeed(at)

    foreseen = not (closed or capped or (R > 1 and not round_robin))

    def upcoming(replica: int, count: int):
        """The next ``count`` arrivals to replica ``replica`` (ids, times): open loop, they are
        known (round-robin: request i goes to replica i mod R)."""
        i = state["next"]
        if R > 1:
            i = i + (replica - i) % R
        ids = np.arange(i, min(n, i + count * R), R)
        return ids, workload.arrival[ids]

    engine = Engine(env=env, table=table, book=book, target=config.target, drafters=list(config.drafters), controller=config.controller,
                    max_draft=config.max_draft, recorder=recorder, separate_drafter=config.separate_drafter, closed_loop=closed or capped,
                    next_arrival=next_arrival, foreseen=foreseen, upcoming=upcoming if foreseen else None, on_finish=on_finish, window_max=config.window_max,
                    tree_nodes=_tree_nodes(policy, config.process), layout=config.layout)
    replicas = [Replica(r, engine, Scheduler(config.scheduler, table, kv, replica=r)) for r in range(config.replicas)]
    router = make_router(config.router)

    def submit(rid: int, at: float) -> None:
        replicas[router.pick(replicas)].submit(rid, at)

    def open_loop():
        for rid in range(n):
            at = max(float(workload.arrival[rid]), state["sent"])
            delay = at - env.now
            if delay > 0:
                yield env.timeout(delay)
            while capped and rid - state["done"] >= max_in_flight:
                state["slot"] = env.event()
                at = max(at, (yield state["slot"]))
            state["next"], state["sent"] = rid + 1, at
            submit(rid, at)

    def client(c: int, ids: list, think: np.ndarray):
        at = 0.0
        for j, rid in enumerate(ids):
            if j and think[j] > 0:
                at += think[j]
                heapq.heappush(heap, at)
                if at > env.now:
                    yield env.timeout(at - env.now)
            finish_events[rid] = env.event()
            submit(rid, at)
            at = yield finish_events[rid]

    if closed:
        think = arrivals.think_times(n, workload_stream(seed, replication + (1 << 16)))
        k = min(arrivals.clients, n)
        for c in range(k):
            ids = list(range(c, n, k))
            env.process(client(c, ids, think[ids]))
    else:
        env.process(open_loop())
    env.run()
    if state["done"] != n:  # pragma: no cover - a scheduler bug, never a user error
        raise RuntimeError(f"the server stopped with {n - state['done']} of {n} requests unfinished")
    spec = recorder.spec_counters()
    meta = {"policy": repr(policy), "process": repr(process), "controller": repr(config.controller),
            "target": getattr(config.target, "name", repr(config.target))}
    if plan is not None:
        meta["memory"] = plan.describe()
    t = table.state()  # the record's own arrays (the table's are read-only views)
    return RunRecord(arrival=t["arrival"], admitted=t["admitted"], first_token=t["first_token"], finish=t["finish"],
                     prompt=t["prompt"], output=t["output"], preemptions=t["preemptions"], rounds=t["rounds"], prefills=t["prefills"],
                     itl=recorder.itl_values(), steps=recorder.step_arrays(), spec=spec, kv_blocks=kv.blocks if kv else None,
                     replicas=config.replicas, meta=meta)


def _tree_nodes(policy: Policy, process=None) -> np.ndarray | None:
    """Nodes a tree round verifies when capped at depth 0, 1, …, depth: a full tree's, or under a
    node budget the kept nodes of the levels up to that depth (:mod:`draftsim.sim.budget_tree`)."""
    if policy.kind != "tree":
        return None
    kept = policy.kept_tree(process.rank_prob) if process is not None else None
    if kept is not None:
        per_level = kept.per_level
        per_level = np.concatenate([per_level, np.zeros(policy.depth + 1 - len(per_level), dtype=np.int64)])
        return np.concatenate([[0], np.cumsum(per_level[1:])]).astype(np.int64)
    return np.array([sum(policy.width**i for i in range(1, c + 1)) for c in range(policy.depth + 1)], dtype=np.int64)


@dataclass
class ServingResult:
    """Independent replications: their records, their summaries and the combined summary
    (means with 95% confidence half-widths under ``ci95``)."""

    runs: list
    summaries: list
    summary: dict


def run_replications(config: ServingConfig, make_workload, *, seed: int = 0, replications: int = 1, arrivals=None,
                     progress=None, keep_runs: bool = True) -> ServingResult:
    """``replications`` independent runs; ``make_workload(rng)`` draws each one's workload
    from :func:`workload_stream`."""
    replications = int(as_count("replications", replications, minimum=1, maximum=1000))
    runs, summaries = [], []
    for r in range(replications):
        wl = make_workload(workload_stream(seed, r))
        run = serve(config, wl, seed=seed, replication=r, arrivals=arrivals, progress=progress)
        summaries.append(summarize_run(run, config.slo))
        if keep_runs or r == 0:
            runs.append(run)
    return ServingResult(runs, summaries, combine(summaries))
