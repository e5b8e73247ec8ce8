"""Serving traces: what a real batched serving run did, step by step and request by request.

A member of the trace family (:class:`draftsim.sim.traces.TraceSchema`, schema ``draftsim.serve``):
the same folder layout, manifest, atomic checksummed commits and validated reader as run
traces and recordings. Four tables, each holding one record below per row (the Parquet
schemas derive from the dataclass fields, :func:`draftsim.sim.records.arrow_schema`):

``steps`` (:class:`Step`)
    one forward step of the server: a prefill of the joiners or a decoding step of the
    running batch — its members, new tokens, contexts, drafted/accepted/emitted tokens,
    drafter and target seconds and the wall time outside model calls;
``members`` (:class:`Member`)
    per step and batch member: new tokens fed to the target, its cached context, drafted,
    accepted and emitted tokens (a decoding step's row is one speculative round);
``requests`` (:class:`RequestRecord`)
    per finished request: arrival, admission, first token, finish, lengths;
``tokens`` (:class:`TokenRecord`)
    per output token: its id, the time it was emitted and the step that emitted it.

Times are seconds from the start of the run (``time.perf_counter``). The server commits a
*chunk* every few seconds (:class:`ServeTraceWriter`): the steps since the last commit and
the requests that finished meanwhile, each chunk one atomic commit; a run killed at any
point leaves a valid trace of its committed chunks with ``metadata["complete"]`` false.
Such a run cannot be continued (its clock is gone); the reader says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..sim.errors import DraftsimError
from ..sim.records import arrow_schema, columns, from_table
from ..sim.traces import TraceFolder, TraceSchema, TraceWriter

__all__ = ["Step", "Member", "RequestRecord", "TokenRecord", "SERVE_RECORDS", "SERVE", "ServeTraceWriter", "ServeTrace", "run_record", "serving_metrics"]


@dataclass(slots=True)
class Step:
    """One step of the server, as the serving simulator's replica models it: a speculative
    round of each of the ``batch`` running sequences (drafting, then one batched verification
    by the target) and the prefill of ``prefills`` joiners (their prompts in a batched forward
    of their own; their first token comes out at the end of the step).

    ``new_tokens`` are the tokens fed to the target for verification over the batch (padding
    excluded), ``context`` the target's cached tokens before the step over the batch,
    ``prefill_tokens`` the joiners' prompt tokens; ``emitted`` counts first tokens too;
    ``k_cap`` is the longest draft any member was allowed (−1 without decoding members).
    ``overhead_seconds`` = (end − start) − draft − target − prefill seconds: the server's
    own time in the step (verification arithmetic, batching, cache compaction, bookkeeping;
    Max-Gram's lookups are draft time).
    """

    step: int
    start: float
    end: float
    batch: int
    prefills: int
    new_tokens: int
    context: int
    prefill_tokens: int
    drafted: int
    accepted: int
    emitted: int
    k_cap: int
    draft_seconds: float
    target_seconds: float
    prefill_seconds: float
    overhead_seconds: float
    compacted: bool  #: the target's cache was compacted at the end of the step
    waiting: int  #: requests that had arrived and were not admitted when the step began


@dataclass(slots=True)
class Member:
    """One sequence in one step: its prefill (``new_tokens`` = its prompt) or a round."""

    step: int
    request: int
    prefill: bool
    new_tokens: int  #: tokens fed to the target (prompt; or uncached tokens + draft)
    context: int  #: tokens already in the target's cache for it
    drafted: int
    accepted: int
    emitted: int  #: tokens added to its output (accepted + the target's, cut at EOS and the budget)


@dataclass(slots=True)
class RequestRecord:
    """A finished request."""

    request: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    max_new_tokens: int
    admitted: float  #: when it joined the batch (its prefill step began after this)
    first_token: float
    finish: float
    prefill_step: int


@dataclass(slots=True)
class TokenRecord:
    """One output token of a request."""

    request: int
    index: int
    token: int
    time: float
    step: int


#: The serving-trace tables and the record each row holds.
SERVE_RECORDS = {"steps": Step, "members": Member, "requests": RequestRecord, "tokens": TokenRecord}

#: Serving traces (``draftsim serve --trace``).
SERVE = TraceSchema("draftsim.serve", 1, {name: arrow_schema(rec) for name, rec in SERVE_RECORDS.items()},
                    ("target", "drafter", "policy", "controller", "sampling", "seed", "max_batch", "requests"),
                    {"target": ("a string", lambda v: isinstance(v, str)),
                     "drafter": ("a string or null", lambda v: v is None or isinstance(v, str)),
                     "policy": ("a string", lambda v: isinstance(v, str)),
                     "controller": ("a string", lambda v: isinstance(v, str)),
                     "sampling": ("an object", lambda v: isinstance(v, dict)),
                     "seed": ("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
                     "max_batch": ("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
                     "requests": ("a list of [arrival, prompt tokens, new tokens(, priority)] rows",
                                  lambda v: isinstance(v, list) and all(isinstance(r, list) and 3 <= len(r) <= 4 for r in v)),
                     "kv_tokens": ("an integer >= 1 or null", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)),
                     "block_size": ("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)})


class ServeTraceWriter:
    """Commit a serving run chunk by chunk (see the module docstring).

    ``add(log, finished)`` is the server's ``on_step``: it commits when ``every`` seconds of
    run time passed since the last commit; ``close(log)`` commits the rest and marks the
    trace complete. A chunk's records are copied between two steps and written by one
    background thread (a Parquet chunk costs ~0.15 s of a 2-core CPU; the serving loop would
    otherwise pause that long), in order; a failed write is raised at the next ``add`` or
    at ``close``. What pause remains ``draftsim check-serve`` counts as the server's own time
    (:func:`draftsim.analysis.servecheck.busy_gaps`).
    """

    def __init__(self, path, metadata: dict, every: float = 5.0, clock=None):
        import time
        from pathlib import Path

        path = Path(path)
        if path.exists() and not (path.is_dir() and not any(path.iterdir())):
            raise DraftsimError(f"{path} already exists; serving traces are not resumed (a run's clock cannot be continued): "
                                "choose another --trace or remove it")
        self.writer = TraceWriter(path, {**metadata, "complete": False}, schema=SERVE)
        self.every = every
        self.clock = clock or time.perf_counter
        self.last = self.clock()
        self.steps_done = 0
        self.members_done = 0
        self.requests_done = 0
        self.chunks = 0
        self.pending = None  # the background write in flight

    def add(self, log, finished) -> None:
        if self.clock() - self.last >= self.every:
            self.commit(log, wait=False)

    def commit(self, log, wait: bool = True) -> None:
        """Commit the records added since the last commit (in the background unless ``wait``)."""
        steps = log.steps[self.steps_done:]
        members = log.members[self.members_done:]
        reqs = log.requests[self.requests_done:]
        ids = {r.request for r in reqs}
        tokens = [t for t in log.tokens if t.request in ids]
        self.steps_done, self.members_done, self.requests_done = len(log.steps), len(log.members), len(log.requests)
        self.last = self.clock()
        if steps or reqs:
            name, info = f"chunk-{self.chunks:05d}", {"steps": len(steps), "requests": len(reqs)}
            self.chunks += 1
            self._finish_pending()

            def write():
                tables = {"steps": columns(steps, Step), "members": columns(members, Member),
                          "requests": columns(reqs, RequestRecord), "tokens": columns(tokens, TokenRecord)}
                self.writer.commit(name, info, tables)

            if wait:
                write()
            else:
                self.pending = _Write(write)
        if wait:
            self._finish_pending()

    def _finish_pending(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.join()

    def close(self, log, **metadata) -> None:
        self.commit(log)
        self.writer.update_metadata(complete=True, **metadata)


class _Write:
    """One background chunk write: started at once; ``join`` waits and re-raises its error."""

    def __init__(self, fn):
        import threading

        self.error = None

        def run():
            try:
                fn()
            except BaseException as exc:  # surfaced by join()
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


class ServeTrace(TraceFolder):
    """A validated serving trace (schema ``draftsim.serve``)."""

    schema = SERVE

    @property
    def complete(self) -> bool:
        return bool(self.metadata.get("complete"))

    def require_complete(self) -> None:
        """Raise unless the run finished (a killed run leaves a valid but partial trace)."""
        if not self.complete:
            done = self.tables["requests"].num_rows
            planned = len(self.metadata.get("requests", [])) or "?"
            raise DraftsimError(f"serving trace {self.path} is incomplete: the run stopped after {done} of {planned} requests "
                                "(killed?); serve again into a new --trace")

    def records(self, table: str) -> list:
        """The rows of ``table`` (steps, members, requests, tokens) as records, in commit order."""
        if table not in SERVE_RECORDS:
            raise DraftsimError(f"table must be one of {', '.join(SERVE_RECORDS)}; got {table!r}")
        return from_table(self.tables[table], SERVE_RECORDS[table])


# ---------------------------------------------------------------- metrics

def run_record(requests: list, tokens: list, members: list, steps: list, meta: dict | None = None):
    """The run as the serving simulator records one (:class:`draftsim.sim.serving.metrics.RunRecord`),
    so that both are summarised by the same code (:func:`draftsim.sim.serving.metrics.summarize_run`)."""
    from ..sim.serving.metrics import RunRecord

    reqs = sorted(requests, key=lambda r: r.request)
    index = {r.request: i for i, r in enumerate(reqs)}
    n = len(reqs)
    rounds = np.zeros(n, dtype=np.int64)
    prefills = np.zeros(n, dtype=np.int64)  # a preempted request is prefilled again when readmitted (recompute)
    drafted, accepted = [], []
    for m in members:
        if m.request not in index:
            continue
        if m.prefill:
            prefills[index[m.request]] += 1
        else:
            rounds[index[m.request]] += 1
            drafted.append(m.drafted)
            accepted.append(m.accepted)
    prefills = np.maximum(prefills, 1)
    times: dict = {}
    for t in tokens:
        times.setdefault(t.request, []).append(t.time)
    itl = np.concatenate([np.diff(np.unique(np.asarray(v))) for v in times.values()]) if times else np.zeros(0)
    d, a = np.asarray(drafted, dtype=np.int64), np.asarray(accepted, dtype=np.int64)
    width = int(d.max(initial=0))
    spec = {"num_drafts": int((d > 0).sum()), "num_draft_tokens": int(d.sum()), "num_accepted_tokens": int(a.sum()),
            "num_accepted_tokens_per_pos": [int((a > i).sum()) for i in range(width)],
            "mean_acceptance_length": 1.0 + a.sum() / (d > 0).sum() if (d > 0).any() else 1.0,
            "draft_acceptance_rate": a.sum() / d.sum() if d.sum() else float("nan")}

    def col(name, dtype=np.float64):
        return np.array([getattr(r, name) for r in reqs], dtype=dtype)

    st = {"replica": np.zeros(len(steps), dtype=np.int32), "start": np.array([s.start for s in steps]),
          "duration": np.array([s.end - s.start for s in steps]), "draft": np.array([s.draft_seconds for s in steps]),
          "batch": np.array([s.batch + s.prefills for s in steps], dtype=np.int32),
          "tokens": np.array([s.new_tokens + s.prefill_tokens for s in steps], dtype=np.int64),
          "kv": np.full(len(steps), -1, dtype=np.int64), "waiting": np.array([s.waiting for s in steps], dtype=np.int32)}
    return RunRecord(arrival=col("arrival"), admitted=col("admitted"), first_token=col("first_token"), finish=col("finish"),
                     prompt=col("prompt_tokens", np.int64), output=col("output_tokens", np.int64), preemptions=prefills - 1,
                     rounds=rounds, prefills=prefills, itl=itl, steps=st, spec=spec, kv_blocks=None, replicas=1,
                     meta=dict(meta or {}))


def serving_metrics(requests: list, tokens: list, members: list, steps: list) -> dict:
    """The serving simulator's metrics of a real run (:func:`draftsim.sim.serving.metrics.summarize_run`
    of :func:`run_record`): TTFT, TPOT, ITL, E2E (mean, p50, p90, p99, seconds), throughput
    (output tokens / (last finish − first arrival)), mean batch and vLLM's spec-decode counters."""
    from ..sim.serving.metrics import summarize_run

    return summarize_run(run_record(requests, tokens, members, steps))
