"""``vllm bench serve --save-result`` files: a run's workload and what it measured.

The layout is vLLM's (``vllm/benchmarks/serve.py`` at 009e6d4a, ``benchmark()`` and ``main()``;
older ``benchmarks/benchmark_serving.py`` files share it; docs/research/acceptance.json lists the
fields):

* setup: ``model_id``, ``num_prompts``, ``request_rate`` (req/s; the string ``"inf"`` when
  unlimited: all requests sent at once), ``burstiness`` (the gamma shape of the gaps, 1:
  Poisson), ``max_concurrency`` (a client-side cap on requests in flight, or null), and with a
  ramp-up ``ramp_up_strategy`` (then ``request_rate`` is not the rate the requests came at);
* results: ``duration`` (s), ``completed``, ``failed`` (newer versions), token totals and
  throughputs, and ``{mean,median,std,p99,...}_{ttft,tpot,itl,e2el}_ms``;
* with ``--save-detailed``, per request: ``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls``
  (lists of gaps, s), ``start_times`` (s, ``time.perf_counter`` when the request was sent, after
  the client's concurrency semaphore), ``errors``, and in newer versions ``latencies`` and
  ``queue_times`` (s spent waiting for that semaphore), which are kept without
  ``--save-detailed`` too.

**Failed requests.** vLLM writes the per-request arrays for *every* request it sent, failed ones
included (``[output.ttft for output in outputs]`` …), with a failed request's entries left at
``RequestFuncOutput``'s defaults — ``ttft`` 0.0, ``itl`` [], ``latency`` 0.0 (one that failed
mid-stream keeps the TTFT and gaps it had), ``output_lens`` 0 (``calculate_metrics`` appends 0 to
``actual_output_lens`` for it) — and its ``errors`` entry non-empty; ``completed`` counts the
successful ones only (``vllm/benchmarks/serve.py`` at 009e6d4a, ``calculate_metrics`` and
``benchmark()``; ``vllm/benchmarks/lib/endpoint_request_func.py`` at 02cfb534,
``RequestFuncOutput``). Files that hold the successful requests only (arrays of ``completed``
entries) are read too. The reader keeps the successful requests (``errors`` says which; without
it, the requests with output length 0, else those with latency 0).

**Zero metrics.** vLLM writes 0 for a metric whose list was empty (``np.mean(ttfts or 0)``: an
endpoint that does not stream has no TTFT, one-token outputs no TPOT): a ``*_ms`` field of 0 is
read as not measured, never compared.

Every field is checked where it is read — type, range, unit — and every refusal is one line
naming the file and the field; the file's size and nesting are bounded before it is parsed, and
values that would make a derived metric NaN or infinite (a zero rate, no output tokens, a rate
the file's own count and duration contradict) are refused here, before any output.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from .errors import K_MAX_LIMIT, DraftsimError
from .files import parse_json, read_text

__all__ = ["VllmBench", "read_vllm_bench", "MAX_BYTES", "MAX_REQUESTS", "MAX_TOKENS"]

#: The largest result file read (a detailed result of 100k requests is ~50 MB).
MAX_BYTES = 256 * 2**20
#: The most requests a result file may hold (a 256 MiB file holds fewer with its arrays).
MAX_REQUESTS = 10_000_000
#: The longest prompt or output of one request, in tokens (the longest context windows are 10M).
MAX_TOKENS = 1 << 24
#: The deepest JSON nesting of a result file (``itls``: a list of lists).
MAX_DEPTH = 4
#: A rate is refused when its arrival process would have sent the file's requests within the
#: file's duration with a probability below this (a Poisson or gamma process; see _check_rate).
RATE_PROBABILITY = 1e-9
OR_INF = " or 'inf'"


@dataclass(frozen=True)
class VllmBench:
    """A ``vllm bench serve`` result: its setup, the successful requests' arrays (when saved) and
    headline metrics (seconds)."""

    source: str
    model: str | None
    request_rate: float  #: requests/s (inf: all at once)
    max_concurrency: int | None  #: the client's cap on requests in flight (None: no cap)
    duration: float  #: s
    completed: int  #: successful requests (the arrays below hold these, in the order sent)
    input_lens: np.ndarray | None  #: prompt tokens per request
    output_lens: np.ndarray | None  #: output tokens per request
    ttfts: np.ndarray | None  #: s
    itls: list | None  #: per request, its inter-token gaps (s)
    start_times: np.ndarray | None  #: s, when each request was sent (after the client's cap)
    metrics: dict  #: the file's non-zero *_ms metrics in seconds, e.g. "median_ttft", "mean_tpot", "p99_itl"
    spec_rates: tuple | None = None  #: spec_decode_per_position_acceptance_rates (cumulative fractions, vLLM's) when the run speculated
    failed: int = 0  #: requests that failed (left out of the arrays)
    burstiness: float = 1.0  #: gamma shape of the arrival gaps (1: Poisson)
    queue_times: np.ndarray | None = None  #: s each request waited for the client's cap before it was sent
    ramp_up: str | None = None  #: the run's ramp-up strategy (its rate then varied)

    @property
    def detailed(self) -> bool:
        return self.input_lens is not None and self.output_lens is not None

    def mean_concurrency(self) -> float:
        """Requests in flight on average (Little's law: throughput × mean latency), for the
        decode batch a plain run's ITL was measured at."""
        e2e = self.metrics.get("mean_e2el")
        if e2e is None:
            tpot, ttft = self.metrics.get("mean_tpot"), self.metrics.get("mean_ttft")
            out = self.output_lens.mean() if self.output_lens is not None else None
            if tpot is None or ttft is None or out is None:
                raise DraftsimError(f"{self.source}: the mean concurrency needs mean_e2el_ms, or mean_ttft_ms, mean_tpot_ms and output_lens")
            e2e = ttft + tpot * (out - 1)
        return self.completed / self.duration * e2e


def _show(v) -> str:
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class _Fields:
    """Typed access to one result file's fields: every refusal names the file and the field."""

    def __init__(self, doc: dict, source: str):
        self.doc, self.source = doc, source

    def fail(self, key: str, what: str):
        raise DraftsimError(f"{self.source}: field '{key}' {what}")

    def bad(self, key: str, valid: str):
        self.fail(key, f"is {_show(self.doc.get(key))}; {valid}")

    def present(self, key: str) -> bool:
        return self.doc.get(key) is not None

    def number(self, key: str, *, low: float = 0.0, low_open: bool = False, inf: bool = False, valid: str | None = None) -> float | None:
        """A real number >= ``low`` (> with ``low_open``); ``inf`` admits the string "inf"
        (vLLM's unlimited rate) and JSON's Infinity."""
        if not self.present(key):
            return None
        v = self.doc[key]
        valid = valid or f"a number {'>' if low_open else '>='} {low:g}{OR_INF if inf else ''} is valid"
        if isinstance(v, str) and inf and v.strip().lower() in ("inf", "infinity"):
            return math.inf
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.bad(key, valid)
        try:
            f = float(v)
        except OverflowError:  # an integer too large for a float
            self.bad(key, valid)
        if math.isnan(f) or (math.isinf(f) and not (inf and f > 0)) or f < low or (low_open and f == low):
            self.bad(key, valid)
        return f

    def count(self, key: str, *, low: int = 0, high: int = MAX_REQUESTS) -> int | None:
        """A whole number in [low, high] (an integral float such as 20.0 too)."""
        if not self.present(key):
            return None
        v = self.doc[key]
        valid = f"a whole number from {low:,} to {high:,} is valid"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            self.bad(key, valid)
        if not low <= v <= high:
            self.bad(key, valid)
        return int(v)

    def array(self, key: str, length: int, *, integer: bool = False, high: float = math.inf, finite_any: bool = False) -> np.ndarray | None:
        """A per-request list of ``length`` numbers >= 0 (any finite with ``finite_any``),
        whole numbers <= ``high`` with ``integer``."""
        if not self.present(key):
            return None
        v = self.doc[key]
        if not isinstance(v, list):
            self.bad(key, f"a list of {length:,} per-request numbers is valid")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            i = next(i for i, x in enumerate(v) if not (isinstance(x, (int, float)) and not isinstance(x, bool)))
            self.fail(key, f"holds {_show(v[i])} at request {i}; per-request numbers are valid")
        try:
            arr = np.asarray(v, dtype=np.float64)
        except OverflowError:
            self.fail(key, "holds an integer too large for a number")
        ok = np.isfinite(arr) if finite_any else np.isfinite(arr) & (arr >= 0) & (arr <= high)
        if integer:
            ok &= arr == np.floor(arr)
        if not ok.all():
            i = int(np.argmin(ok))
            what = "finite numbers" if finite_any else (f"whole numbers from 0 to {high:,.0f}" if integer else "finite numbers >= 0")
            self.fail(key, f"holds {_show(v[i])} at request {i}; {what} are valid")
        return arr


def _rate_possible(n: int, rate: float, burstiness: float, duration: float) -> float:
    """The probability that an arrival process at ``rate`` (gamma gaps of shape ``burstiness``,
    vLLM's ``get_request``) sends ``n`` requests within ``duration``: the last is sent after n − 1
    gaps, a gamma variable of shape (n − 1)·burstiness and mean (n − 1)/rate."""
    from scipy.special import gammainc

    if n < 2 or math.isinf(rate):
        return 1.0
    x = duration * rate * burstiness  # the duration in units of the gaps' scale
    return float(gammainc((n - 1) * burstiness, x)) if math.isfinite(x) else 1.0


def _spec_rates(f: _Fields, key: str) -> tuple | None:
    """vLLM's per-position acceptance (cumulative: accepted at position i / drafts; fractions in
    vLLM's ``benchmark()``, percent in some versions), checked as the file's field."""
    from .acceptance_rates import conditional_from_cumulative

    if not f.present(key):
        return None
    v = f.doc[key]
    if not isinstance(v, list) or not v or len(v) > K_MAX_LIMIT:
        f.bad(key, f"a list of 1 to {K_MAX_LIMIT} per-position acceptance rates is valid")
    arr = f.array(key, len(v))
    percent = bool(arr.max() > 1.0)
    if percent and arr.max() > 100.0:
        i = int(np.argmax(arr))
        f.fail(key, f"holds {_show(v[i])} at position {i + 1}; rates in [0, 1] (or percent, [0, 100]) are valid")
    rates = arr / 100.0 if percent else arr
    try:
        conditional_from_cumulative(rates)
    except DraftsimError as exc:
        f.fail(key, f"is not vLLM's cumulative per-position acceptance: {exc}")
    return tuple(float(x) for x in rates)


def read_vllm_bench(path) -> VllmBench:
    """Read and check a ``vllm bench serve --save-result`` JSON file (module docstring)."""
    source = f"vllm result {path}"
    text = read_text(path, "vllm result", MAX_BYTES, fifo=False)
    try:
        doc = parse_json(text, source, max_depth=MAX_DEPTH)
    except DraftsimError as exc:
        if "(Extra data" in str(exc) and text.lstrip().startswith("{"):
            raise DraftsimError(f"{source} holds several results one after another (vllm bench serve --append-result); "
                                "give one result per file") from None
        raise
    if not isinstance(doc, dict):
        raise DraftsimError(f"{source}: a result file is a JSON object; got {type(doc).__name__}")
    f = _Fields(doc, source)
    if not f.present("completed"):
        f.fail("completed", "is missing (a vllm bench serve --save-result file has it)")
    completed = f.count("completed", low=1)
    failed = f.count("failed") or 0
    if not f.present("duration"):
        f.fail("duration", "is missing (a vllm bench serve --save-result file has it)")
    duration = f.number("duration", low_open=True, valid="a finite number of seconds > 0 is valid")
    rate = f.number("request_rate", low_open=True, inf=True, valid="a positive rate (requests/s) or 'inf' is valid")
    rate = math.inf if rate is None else rate
    burstiness = f.number("burstiness", low_open=True, valid="a finite gamma shape > 0 is valid (1: Poisson)")
    burstiness = 1.0 if burstiness is None else burstiness
    if burstiness > 1e6:
        f.bad("burstiness", "a finite gamma shape > 0 and <= 1e6 is valid (1: Poisson)")
    conc = f.count("max_concurrency", low=1)
    ramp = doc.get("ramp_up_strategy")
    if ramp is not None and not isinstance(ramp, str):
        f.bad("ramp_up_strategy", "'linear', 'exponential' or null is valid")
    num_prompts = f.count("num_prompts", low=1)

    metrics = {}
    for key in list(doc):
        if isinstance(key, str) and key.endswith("_ms") and doc[key] is not None:
            value = f.number(key, valid="a finite number of milliseconds >= 0 is valid")
            if math.isinf(value):
                f.bad(key, "a finite number of milliseconds >= 0 is valid")
            if value > 0:  # vLLM writes 0 for a metric with no values (module docstring)
                metrics[key[:-3]] = value / 1e3

    # per-request arrays: one common length, every request sent (or the successful ones only)
    keys = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "latencies", "queue_times", "errors")
    given = [k for k in keys if f.present(k)]
    lengths = {}
    for k in given:
        if not isinstance(doc[k], list):
            f.bad(k, "a list with one entry per request is valid")
        lengths[k] = len(doc[k])
    L = lengths[given[0]] if given else None
    for k in given:
        if lengths[k] != L:
            f.fail(k, f"has {lengths[k]:,} entries but '{given[0]}' has {L:,}; every per-request field has one entry per request")
    ok = None
    if L is not None:
        if failed and L not in (completed, completed + failed):
            f.fail(given[0], f"has {L:,} entries; 'completed' {completed:,} + 'failed' {failed:,} = {completed + failed:,} "
                             "(every request sent) or 'completed' are valid")
        if L < completed:
            f.fail(given[0], f"has {L:,} entries but 'completed' is {completed:,}; a detailed result has an entry per request")
        if num_prompts is not None and L > num_prompts:
            f.fail(given[0], f"has {L:,} entries but 'num_prompts' is {num_prompts:,}")
        if L == completed:
            ok = np.ones(L, dtype=bool)
        elif "errors" in given:
            errs = doc["errors"]
            if not all(e is None or isinstance(e, str) for e in errs):
                f.bad("errors", "a list of error strings ('' for a successful request) is valid")
            ok = np.array([not e for e in errs], dtype=bool)
            if ok.sum() != completed:
                f.fail("errors", f"marks {int(ok.sum()):,} requests successful (an empty error) but 'completed' is {completed:,}")
        elif "output_lens" in given:
            ok = f.array("output_lens", L, integer=True, high=MAX_TOKENS) > 0  # vLLM's 0 for a failed request
            if ok.sum() != completed:
                f.fail("output_lens", f"has {int(ok.sum()):,} requests with output but 'completed' is {completed:,} "
                                      f"(of {L:,} sent); an 'errors' field would say which failed")
        elif "latencies" in given:  # without --save-detailed newer vLLMs keep latencies: 0.0 for a failed request
            ok = f.array("latencies", L) > 0
            if ok.sum() != completed:
                f.fail("latencies", f"has {int(ok.sum()):,} requests with a latency but 'completed' is {completed:,} (of {L:,} sent)")
        else:
            f.fail(given[0], f"has {L:,} entries for {completed:,} completed requests, and no 'errors', 'output_lens' or 'latencies' "
                             "says which failed")

    def per_request(key, **kw):
        arr = f.array(key, L, **kw) if L is not None else None
        return arr[ok] if arr is not None else None

    input_lens = per_request("input_lens", integer=True, high=MAX_TOKENS)
    output_lens = per_request("output_lens", integer=True, high=MAX_TOKENS)
    ttfts = per_request("ttfts")
    start_times = per_request("start_times", finite_any=True)
    queue_times = per_request("queue_times")
    latencies = per_request("latencies")
    itls = None
    if "itls" in given:
        rows = doc["itls"]
        if not all(isinstance(r, list) for r in rows):
            i = next(i for i, r in enumerate(rows) if not isinstance(r, list))
            f.fail("itls", f"holds {_show(rows[i])} at request {i}; a list of inter-token gaps (s) per request is valid")
        flat = [x for r in rows for x in r]
        typed = all(type(x) is float or type(x) is int for x in flat)  # (bools are ints' subclass: refused)
        try:
            gaps = np.asarray(flat, dtype=np.float64) if typed else None
        except OverflowError:
            gaps = None
        if gaps is None or not (np.isfinite(gaps) & (gaps >= 0)).all():
            x = next(x for x in flat if not (type(x) in (int, float) and math.isfinite(x) and x >= 0))
            f.fail("itls", f"holds a gap of {_show(x)}; finite gaps >= 0 s are valid")
        itls = [r for r, good in zip(rows, ok) if good]

    # cross-field consistency
    if output_lens is not None and not output_lens.sum() > 0:
        f.fail("output_lens", f"is 0 for every one of the {completed:,} completed requests: no output to compare a replay with")
    if output_lens is not None and output_lens.max() <= 1:
        for key in ("mean_tpot", "median_tpot", "mean_itl", "median_itl"):
            if key in metrics:
                f.fail(f"{key}_ms", f"is {metrics[key] * 1e3:g} ms but every completed request has at most 1 output token "
                                    "('output_lens'): no token follows a first one")
    if ttfts is not None and metrics.get("mean_ttft") is not None and not ttfts.max() > 0:
        f.fail("ttfts", "is 0 for every completed request while 'mean_ttft_ms' is not; the two disagree")
    slack = duration * (1 + 1e-6) + 1e-3  # every request is sent and answered within the run
    for key, arr in (("ttfts", ttfts), ("latencies", latencies)):
        if arr is not None and arr.size and arr.max() > slack:
            i = int(np.argmax(arr))
            f.fail(key, f"holds {arr[i]:.6g} s (request {i} of the completed), longer than 'duration' {duration:.6g} s")
    for key, value in metrics.items():
        if not key.startswith("std_") and value > slack:
            f.fail(f"{key}_ms", f"is {value * 1e3:.6g} ms, longer than 'duration' {duration:.6g} s")
    if start_times is not None and completed > 1:
        span = float(start_times.max() - start_times.min())
        if span > duration * 1.01 + 1.0:
            f.fail("start_times", f"span {span:,.6g} s but 'duration' is {duration:,.6g} s; every request is sent within the run")
    sent = L if L is not None else completed + failed
    if ramp is None and _rate_possible(sent, rate, burstiness, duration) < RATE_PROBABILITY:
        f.fail("request_rate", f"is {rate:g} req/s, but {sent:,} requests were sent within 'duration' {duration:g} s "
                               f"({sent / duration:.4g} req/s); a rate that could have sent them is valid")
    spec = _spec_rates(f, "spec_decode_per_position_acceptance_rates")
    model = doc.get("model_id")
    return VllmBench(source, model if isinstance(model, str) else None, rate, conc, duration, completed, input_lens, output_lens,
                     ttfts, itls, start_times, metrics, spec, failed=failed, burstiness=burstiness, queue_times=queue_times,
                     ramp_up=ramp)
