"""Serving metrics: what the replicas record, the summary of a run, confidence intervals over
independent replications, and the Chrome trace-event timeline.

Definitions (vLLM's benchmark_serving and DistServe's goodput):

* TTFT — time to first token: first token out − arrival (queueing and prefill included);
* TPOT — time per output token after the first: (finish − first token) / (output − 1);
* ITL — inter-token latency: the gaps between consecutive emissions of a request (a
  speculative step emits several tokens at once: one gap per step, as a streaming client sees);
* E2E — end-to-end latency: finish − arrival;
* throughput — output tokens emitted per second at the steady state: over the window from the
  warm-up's end (MSER-5) to the last arrival, so that neither the warm-up nor the drain counts
  (:mod:`draftsim.sim.serving.steady`); request throughput likewise (requests finished in it);
* goodput — requests per second that meet both SLOs (TTFT ≤ ``ttft`` and TPOT ≤ ``tpot``):
  request throughput × the share of the latency sample meeting them (0 for an overloaded run,
  whose queue grows without bound);
* steady state — ``steady`` (the run settled), ``overloaded`` (its waiting queue grows: no SLO
  holds), ``steady_reason`` (why not; "" when steady), ``steady_tested`` (False: fewer than 50
  requests or all arriving at once — the whole run is then measured), ``warmup_s`` (seconds cut
  after the first arrival), ``window_s`` (seconds measured), ``measured_requests`` (the latency
  sample: requests arriving in the window and served before the drain); ``whole_run`` keeps
  throughput, request throughput and goodput over the whole run (first arrival to last finish);
* spec_decode — vLLM's speculative-decoding counters: ``num_drafts`` (rounds that drafted),
  ``num_draft_tokens``, ``num_accepted_tokens``, ``num_accepted_tokens_per_pos`` and
  ``mean_acceptance_length`` = 1 + accepted / drafts (tokens per verification), plus
  ``draft_acceptance_rate`` = accepted / draft tokens.

Each latency is summarised by mean, p50, p90 and p99 over the latency sample (ITL over every
gap of the run: the recorder keeps no emission times); mean batch, busy share and KV use are
over the steps' time inside the window (max batch and max KV use over the run). With several
replications every number comes with the half-width of its 95% Student-t confidence interval
across them; the flags combine as all steady, any overloaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import DraftsimError, as_positive
from ..files import atomic_write_json
from .steady import SteadyState, emitted_between, steady_state

__all__ = ["Recorder", "RunRecord", "SLO", "summarize_run", "combine", "LATENCIES", "write_chrome_trace", "TIMELINE_SCHEMA"]

LATENCIES = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p99")
TIMELINE_SCHEMA = "draftsim.serving-timeline"
TIMELINE_VERSION = 1


@dataclass(frozen=True)
class SLO:
    """Service-level objectives in seconds (inf: none)."""

    ttft: float = float("inf")
    tpot: float = float("inf")

    def __post_init__(self):
        for name in ("ttft", "tpot"):
            v = getattr(self, name)
            if not (v == float("inf") or (np.isfinite(v) and v > 0)):
                as_positive(f"SLO {name}", v)


class Recorder:
    """Accumulates what the replicas did, as chunks of arrays (one per window)."""

    def __init__(self, max_draft: int):
        self.P = max(max_draft, 1)
        self._spec: list = []
        self._itl: list = []
        self._windows: list = []  # per window: the arguments of steps()

    def itl(self, gaps: np.ndarray) -> None:
        self._itl.append(np.asarray(gaps, dtype=np.float64))

    def spec(self, drafted: np.ndarray, accepted: np.ndarray, verified: np.ndarray | None = None) -> None:
        """Drafted and accepted tokens of rounds (counted at the end: :meth:`spec_counters`);
        ``verified`` (same shape) marks the rounds that were verified (default: all). The
        counters are sums, so the rounds are kept as they come and picked out at the end."""
        drafted = np.asarray(drafted)
        if verified is None:
            verified = np.ones(drafted.shape, dtype=bool)
        self._spec.append((drafted.ravel(), np.asarray(accepted).ravel(), np.asarray(verified).ravel()))

    def spec_counters(self) -> dict:
        """vLLM's speculative-decoding counters over every verified round."""
        d = a = np.zeros(0, dtype=np.int64)
        if self._spec:
            d, a, verified = (np.concatenate(x) for x in zip(*self._spec))
            d, a = d[verified].astype(np.int64), a[verified].astype(np.int64)
        P = self.P
        dc = np.bincount(np.minimum(d, P), minlength=P + 1)
        ac = np.bincount(np.minimum(a, P), minlength=P + 1)
        drafts, draft_tokens, accepted = int((d > 0).sum()), int(d.sum()), int(a.sum())
        return {
            "num_drafts": drafts,
            "num_draft_tokens": draft_tokens,
            "num_accepted_tokens": accepted,
            # position i (0-based) was drafted / accepted in the rounds with more than i
            "num_draft_tokens_per_pos": np.cumsum(dc[::-1])[::-1][1:].tolist(),
            "num_accepted_tokens_per_pos": np.cumsum(ac[::-1])[::-1][1:].tolist(),
            "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
            "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else float("nan"),
        }

    def steps(self, replica, start, duration, draft, batch, tokens, kv, waiting) -> None:
        """A window's steps on replica ``replica`` ((n,) arrays; ``kv`` None: unlimited pool) with
        ``waiting`` requests queued (put together by :meth:`step_arrays`)."""
        self._windows.append((replica, start, duration, draft, batch, tokens, kv, waiting))

    def step_arrays(self) -> dict:
        """Every recorded step: replica, start, duration, draft (seconds of the drafters' calls),
        batch, tokens, kv (blocks held; -1: unlimited pool), waiting."""
        if not self._windows:
            return {k: np.zeros(0) for k in ("replica", "start", "duration", "draft", "batch", "tokens", "kv", "waiting")}
        replica, start, duration, draft, batch, tokens, kv, waiting = zip(*self._windows)
        n = np.array([len(x) for x in start])
        col = lambda chunks, dtype: np.concatenate(chunks).astype(dtype, copy=False)  # noqa: E731
        return {
            "replica": np.repeat(np.array(replica, dtype=np.int32), n),
            "start": col(start, np.float64),
            "duration": col(duration, np.float64),
            "draft": col(draft, np.float64),
            "batch": col(batch, np.int32),
            "tokens": col(tokens, np.int64),
            "kv": col([np.full(m, -1) if k is None else k for m, k in zip(n, kv)], np.int64),
            "waiting": np.repeat(np.array(waiting, dtype=np.int32), n),
        }

    def itl_values(self) -> np.ndarray:
        return np.concatenate(self._itl) if self._itl else np.zeros(0)


@dataclass
class RunRecord:
    """Everything one replication produced (per request, per step, counters)."""

    arrival: np.ndarray
    admitted: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    preemptions: np.ndarray
    rounds: np.ndarray
    prefills: np.ndarray
    itl: np.ndarray
    steps: dict
    spec: dict
    kv_blocks: int | None
    replicas: int
    meta: dict = field(default_factory=dict)


def _stats(x: np.ndarray) -> dict:
    x = x[np.isfinite(x)]
    if not x.size:
        return {k: float("nan") for k in STATS}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def summarize_run(run: RunRecord, slo: SLO = SLO(), steady: bool = True) -> dict:
    """The metrics of one replication at its steady state (see the module docstring and
    :mod:`draftsim.sim.serving.steady`): latencies over the latency sample, rates over the
    window; ``whole_run`` keeps the rates over the whole run (first arrival to last finish).
    ``steady=False`` measures the whole run instead, every request and the drain — as
    ``vllm bench serve`` does, for comparing a replay with a measured run request for request."""
    if steady:
        ss = steady_state(run.arrival, run.admitted, run.finish)
    else:
        end = float(np.nanmax(run.finish))
        ss = SteadyState(float(np.nanmin(run.arrival)), end, end, 0.0, True, False,
                         "not applied: the whole run is measured, warm-up and drain included", False)
    ttft = run.first_token - run.arrival
    e2e = run.finish - run.arrival
    multi = run.output > 1
    tpot = np.full(len(e2e), np.nan)
    tpot[multi] = (run.finish[multi] - run.first_token[multi]) / (run.output[multi] - 1)
    ok = (ttft <= slo.ttft) & (np.nan_to_num(tpot, nan=0.0) <= slo.tpot)
    first, last = float(np.nanmin(run.arrival)), float(np.nanmax(run.finish))
    whole = last - first if last > first else float("nan")
    steps = run.steps
    if ss.tested:
        a, b = ss.start, ss.end
        span = b - a if b > a else float("nan")
        sample = (run.arrival >= a) & (run.arrival <= ss.latency_end)
        tokens = emitted_between(run.first_token, run.finish, run.output, a, b)
        done = int(((run.finish >= a) & (run.finish <= b)).sum())
        in_window = (steps["start"] < b) & (steps["start"] + steps["duration"] > a)
        overlap = np.minimum(steps["start"] + steps["duration"], b) - np.maximum(steps["start"], a)
    else:
        span = whole
        sample = np.ones(len(e2e), dtype=bool)
        tokens, done = float(run.output.sum()), len(run.output)
        in_window = np.ones(len(steps["duration"]), dtype=bool)
        overlap = steps["duration"]
    attainment = float(ok[sample].mean()) if sample.any() else float("nan")
    if ss.overloaded:  # its queue, and so its TTFT, grows without bound: in the long run no request meets the SLOs
        attainment = 0.0
    batch, duration = steps["batch"][in_window], overlap[in_window]  # each step's time inside the window
    busy = float(duration.sum())
    out = {name: _stats(v[sample]) for name, v in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))}
    out["itl"] = _stats(run.itl)
    out = {k: out[k] for k in LATENCIES}
    out["queue"] = _stats((run.admitted - run.arrival)[sample])
    out["throughput"] = float(tokens / span)
    out["request_throughput"] = float(done / span)
    out["goodput"] = out["request_throughput"] * attainment
    out["slo_attainment"] = attainment
    out["requests"] = int(len(run.output))
    out["output_tokens"] = int(run.output.sum())
    out["steps"] = int(len(steps["duration"]))
    out["busy"] = busy / max(run.replicas, 1) / span
    out["mean_batch"] = float((batch * duration).sum() / busy) if busy > 0 else float("nan")
    out["max_batch"] = int(steps["batch"].max(initial=0))
    if run.kv_blocks:
        used = steps["kv"][in_window] / run.kv_blocks
        out["kv_utilisation"] = float((used * duration).sum() / busy) if busy > 0 else float("nan")
        out["kv_utilisation_max"] = float((steps["kv"] / run.kv_blocks).max(initial=0.0))
    out["preemptions"] = int(run.preemptions.sum())
    out["spec_decode"] = dict(run.spec)
    out["steady"] = bool(ss.steady)
    out["overloaded"] = bool(ss.overloaded)
    out["steady_reason"] = ss.reason
    out["steady_tested"] = bool(ss.tested)
    out["warmup_s"] = float(ss.warmup)
    out["window_s"] = float(span)
    out["measured_requests"] = int(sample.sum())
    out["whole_run"] = {"throughput": float(run.output.sum() / whole), "request_throughput": float(len(run.output) / whole),
                        "goodput": float(ok.sum() / whole), "duration_s": whole}
    return out


#: Keys of a summary merged by :func:`combine` as flags, not averaged: all steady, any overloaded.
FLAGS = ("steady", "overloaded", "steady_tested")


def _t95(n: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


def combine(summaries: list[dict]) -> dict:
    """Means over replications; every number gets ``ci95`` (half-width; nan for one replication)."""
    n = len(summaries)
    if n == 0:
        raise DraftsimError("no replication to combine")
    t = _t95(n) if n > 1 else float("nan")

    def merge(values: list):
        first = values[0]
        if isinstance(first, dict):
            return {k: merge([v[k] for v in values]) for k in first}
        if isinstance(first, list):
            width = max(len(v) for v in values)
            return [float(np.mean([v[i] for v in values if i < len(v)])) for i in range(width)]
        arr = np.array(values, dtype=np.float64)
        return float(arr.mean()) if not isinstance(first, int) or n > 1 else first

    flags = {k: [s[k] for s in summaries] for k in FLAGS if k in summaries[0]}
    reasons = [s.get("steady_reason", "") for s in summaries]
    summaries = [{k: v for k, v in s.items() if k not in FLAGS and k != "steady_reason"} for s in summaries]
    out = merge(summaries)
    if flags:
        out["steady"] = all(flags["steady"])
        out["overloaded"] = any(flags["overloaded"])
        out["steady_tested"] = all(flags["steady_tested"])
        unsteady = [r for r, ok in zip(reasons, flags["steady"]) if not ok]
        untested = [r for r, ok in zip(reasons, flags.get("steady_tested", [True] * n)) if not ok]  # too short to test
        out["steady_reason"] = (unsteady or untested or reasons)[0]
        out["untested_replications"] = len(untested)
        out["steady_replications"] = int(sum(flags["steady"]))

    def ci(values: list):
        first = values[0]
        if isinstance(first, dict):
            return {k: ci([v[k] for v in values]) for k in first if not isinstance(first[k], list)}
        arr = np.array(values, dtype=np.float64)
        return float(t * arr.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")

    out["ci95"] = {k: ci([s[k] for s in summaries]) for k in summaries[0] if not isinstance(summaries[0][k], list)}
    out["replications"] = n
    return out


def write_chrome_trace(path, runs: list[RunRecord], max_steps: int = 200_000) -> dict:
    """Write the steps of the first replication as Chrome trace-event JSON (Perfetto,
    chrome://tracing): per replica a target track (verification + prefill) and a drafter
    track, and counters of batch size, KV blocks and waiting requests. At most ``max_steps``
    steps are written (the first ones). Written atomically; returns what was written."""
    run = runs[0]
    s = run.steps
    order = np.argsort(s["start"], kind="stable")[:max_steps]
    events = []
    for r in range(run.replicas):
        events.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"replica {r}"}})
        events.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": "drafter"}})
        events.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 1, "args": {"name": "target"}})
    us = 1e6
    for i in order.tolist():
        r = int(s["replica"][i])
        t0, dur, dr = float(s["start"][i]), float(s["duration"][i]), float(s["draft"][i])
        if dr > 0:
            events.append({"name": "draft", "ph": "X", "pid": r, "tid": 0, "ts": t0 * us, "dur": dr * us})
        events.append({"name": "verify", "ph": "X", "pid": r, "tid": 1, "ts": (t0 + dr) * us, "dur": (dur - dr) * us,
                       "args": {"batch": int(s["batch"][i]), "tokens": int(s["tokens"][i])}})
        counters = {"batch": int(s["batch"][i]), "waiting": int(s["waiting"][i])}
        if s["kv"][i] >= 0:
            counters["kv_blocks"] = int(s["kv"][i])
        events.append({"name": "load", "ph": "C", "pid": r, "ts": t0 * us, "args": counters})
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"schema": TIMELINE_SCHEMA, "version": TIMELINE_VERSION, "steps": int(len(order)),
                         "steps_total": int(len(s["start"])), **{k: str(v) for k, v in run.meta.items()}}}
    path = atomic_write_json(path, doc, indent=None, mkdir=False)
    return {"path": str(path), "steps": int(len(order)), "steps_total": int(len(s["start"]))}
