"""Serving traces: what a real batched serving run did, step by step and request by request.

A member of the trace family (:class:`sim.traces.TraceSchema`, schema ``draftsim.serve``):
the same folder layout, manifest, atomic checksummed commits and validated reader as run
traces and recordings. Four tables, each holding one record below per row (the Parquet
schemas derive from the dataclass fields, :func:`sim.records.arrow_schema`):

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

from sim.errors import DraftsimError
from sim.records import arrow_schema, columns, from_table
from sim.traces import TraceFolder, TraceSchema, TraceWriter

__all__ = ["Step", "Member", "RequestRecord", "TokenRecord", "SERVE_RECORDS", "SERVE", "ServeTraceWriter", "ServeTrace", "serving_metrics"]


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
                    ("target", "drafter", "policy", "controller", "sampling", "seed", "max_batch", "requests"))


class ServeTraceWriter:
    """Commit a serving run chunk by chunk (see the module docstring).

    ``add(log, finished)`` is the server's ``on_step``: it commits when ``every`` seconds of
    run time passed since the last commit; ``close(log)`` commits the rest and marks the
    trace complete. Commit time is spent inside the run's steps and shows as overhead.
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

    def add(self, log, finished) -> None:
        if self.clock() - self.last >= self.every:
            self.commit(log)

    def commit(self, log) -> None:
        steps = log.steps[self.steps_done:]
        members = log.members[self.members_done:]
        reqs = log.requests[self.requests_done:]
        ids = {r.request for r in reqs}
        tokens = [t for t in log.tokens if t.request in ids]
        if not steps and not reqs:
            return
        tables = {"steps": columns(steps, Step), "members": columns(members, Member), "requests": columns(reqs, RequestRecord),
                  "tokens": columns(tokens, TokenRecord)}
        self.writer.commit(f"chunk-{self.chunks:05d}", {"steps": len(steps), "requests": len(reqs)}, tables)
        self.chunks += 1
        self.steps_done, self.members_done, self.requests_done = len(log.steps), len(log.members), len(log.requests)
        self.last = self.clock()

    def close(self, log, **metadata) -> None:
        self.commit(log)
        self.writer.update_metadata(complete=True, **metadata)


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

_QUANTILES = (("p50", 50), ("p90", 90), ("p99", 99))


def _stats(values) -> dict:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"mean": float("nan"), **{name: float("nan") for name, _ in _QUANTILES}}
    return {"mean": float(v.mean()), **{name: float(np.percentile(v, q)) for name, q in _QUANTILES}}


def serving_metrics(requests: list, tokens: list, members: list, steps: list) -> dict:
    """Latency, throughput and speculative-decoding metrics of a serving run (seconds).

    * ``ttft`` = first token − arrival; ``e2e`` = finish − arrival;
    * ``tpot`` = (finish − first token) / (output tokens − 1), requests of ≥ 2 tokens;
    * ``itl`` = gaps between a request's successive emissions (tokens accepted together in
      one step arrive together: one gap per step, as vLLM's streaming benchmark sees it);
    * ``throughput`` = output tokens / (last finish − first arrival);
    * ``spec_decode`` under vLLM's names: ``num_drafts`` (rounds that drafted),
      ``num_draft_tokens``, ``num_accepted_tokens``, ``accepted_per_position`` (rounds whose
      i-th draft token was accepted), ``draft_acceptance_rate`` and
      ``mean_acceptance_length`` = 1 + accepted / drafts.
    """
    by_req: dict = {}
    for t in tokens:
        by_req.setdefault(t.request, []).append(t.time)
    itl = []
    for times in by_req.values():
        distinct = np.unique(np.asarray(times))
        itl.extend(np.diff(distinct).tolist())
    ttft = [r.first_token - r.arrival for r in requests]
    e2e = [r.finish - r.arrival for r in requests]
    tpot = [(r.finish - r.first_token) / (r.output_tokens - 1) for r in requests if r.output_tokens > 1]
    out_tokens = sum(r.output_tokens for r in requests)
    span = (max(r.finish for r in requests) - min(r.arrival for r in requests)) if requests else float("nan")
    drafts = [m for m in members if not m.prefill and m.drafted > 0]
    drafted = sum(m.drafted for m in drafts)
    accepted = sum(m.accepted for m in drafts)
    longest = max((m.drafted for m in drafts), default=0)
    per_pos = [sum(1 for m in drafts if m.accepted > i) for i in range(longest)]
    batch = [s.batch for s in steps if s.batch]
    return {
        "requests": len(requests), "output_tokens": out_tokens, "duration": span,
        "ttft": _stats(ttft), "tpot": _stats(tpot), "itl": _stats(itl), "e2e": _stats(e2e),
        "throughput": out_tokens / span if requests and span > 0 else float("nan"),
        "mean_batch": float(np.mean(batch)) if batch else 0.0,
        "steps": len(steps), "decode_steps": len(batch),
        "spec_decode": {"num_drafts": len(drafts), "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
                        "accepted_per_position": per_pos,
                        "draft_acceptance_rate": accepted / drafted if drafted else float("nan"),
                        "mean_acceptance_length": 1 + accepted / len(drafts) if drafts else 1.0},
    }
