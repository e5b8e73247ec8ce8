"""Capacity planning: the largest request rate whose serving simulation meets SLOs.

Vidur's configuration search binary-searches the largest QPS that meets a latency SLO; so does
this, generically: :func:`find_capacity` brackets (doubling or halving from a start rate) and
bisects (geometric midpoints) any ``evaluate(qps) -> (meets, metrics)``, assuming that a
higher rate never helps latency. :func:`replicated` builds ``evaluate`` from a per-seed
``meets_slo(qps, seed)`` that returns either a bool (the rate meets the SLOs when every
replication does) or a dict of metrics (the rate meets them when the mean of each SLO metric
over the replications is within its bound). The seeds are the same at every rate (common
random numbers), which keeps the comparison between rates sharp.

A capacity spec is a sweep spec (:mod:`draftsim.analysis.sweep`) of a kind that has a request-rate
option, plus a ``[capacity]`` table::

    [capacity]
    slo = { ttft_p99 = 1.0, tpot_p50 = 0.05 }  # metric name -> upper bound
    start = 1.0          # first rate tried (requests/s; default 1, moved within minimum..maximum)
    minimum = 0.01       # below this the configuration is reported with capacity 0 (default: 10 requests a run)
    maximum = 1000.0     # above this the search stops, capacity ">= maximum" (default: 1e6 requests in the longest run, <= 1e4)
    tolerance = 0.02     # stop when high / low - 1 <= tolerance
    throughput = "throughput"   # metric in output tokens/s, reported at capacity
    price_per_hour = 2.5        # optional: price of one device-hour -> cost per 1M tokens
    devices = ["replicas", "tp"]  # options whose product is the number of devices (default 1)
    compare = "policy"   # the axis drawn as side-by-side bars in the figure (default: policy)
    load = 40.0          # optional: a target load (requests/s) -> the fewest replicas that meet the SLOs at it
    latency = "e2e_mean" # the latency whose crossover is reported (default e2e_mean, or latency_mean)
    max_lengthening = 8  # an unsettled run is rerun at 2x, 4x, ... up to this many times the spec's length

**Checked before any run** (:func:`settings`, :func:`check_search`; one line naming the field and
what is valid, nothing written): every key's type and range; the bisection fits
``max_evaluations``; a load needs at most :data:`MAX_REPLICAS` replicas of ``maximum``, and a kind
with a ``replicas`` option; per configuration, a run at ``minimum`` and at the load expects at
least :data:`MIN_RUN_REQUESTS` requests, the longest run (``maximum`` or the load at
``max_lengthening`` times the length) at most :data:`MAX_RUN_REQUESTS`, and the kind accepts the
configuration at those rates and lengths. Without ``minimum`` / ``maximum`` the spec's durations
set them to those bounds.

With ``load``, each configuration's single-replica capacity c gives a first guess of
⌈load / c⌉ replicas, which is then checked by simulating that many replicas (round-robin) at the
load itself; the search gallops away from the guess (g − 1, g − 2, g − 4, ..., or up) to a bracket
and bisects it, so it simulates O(log |answer − guess|) counts, to the fewest replicas that meet
the SLOs (the kind needs a ``replicas`` option; at most :data:`MAX_REPLICAS`). The row reports
them, the devices they take (replicas × the configuration's ``devices``) and the margin at
that count, replicas × c / load − 1.

**Crossover.** Each search also keeps its configuration's ``latency`` (mean over the
replications) at every rate it simulated (``latency_curve``). :func:`crossovers` pairs each
configuration with the one of its group (the same values of every other axis) that does not
speculate (``compare`` = policy, a policy drafting nothing: ``ar``, ``fixed:k=0``) and finds,
from those already simulated rates — no new simulation — the single-replica load where
speculation stops paying: where the baseline's latency over speculation's falls through 1
(each curve interpolated linearly in log latency against log rate over the rates both searches
covered; their log ratio is then piecewise linear, and its first zero is the crossover). The bracketing of both searches walks the
same doubling grid from ``start``, so the two curves share those rates.

**Steady state.** A kind whose results say whether a run settled (``steady``, ``overloaded``:
the serve kind, :mod:`draftsim.sim.serving.steady`) has every rate judged at its steady state: a
rate meets the SLOs only when every replication settled and none is overloaded. A rate whose
runs did not settle (warm-up not over, the queue not growing) is rerun at twice the spec's
``duration`` (or ``requests``), then four times, ... up to ``max_lengthening`` times (default 8;
one of 1, 2, 4, ..., 64); still unsettled there, it fails. An overloaded rate (its waiting queue
grows) fails at once. Each lengthening is noted (``notes``), so the answer does not hang on the
spec's duration: a 60 s spec and a 600 s one find the same capacity within their intervals.

**Confidence.** With two or more replications, each SLO metric's 95% half-width over them rides
along (``<metric>_ci95``). :func:`capacity_interval` turns them into the capacity's 95% interval:
from the highest simulated rate where the SLOs are surely met (mean + half-width within the
bound) to the lowest where they surely fail (mean − half-width over it), simulating a few more
rates beyond the bracket when none does and between each end and the nearest unsure rate, to
the search's tolerance (:func:`confirm_interval`); it always holds the bisection's bracket. With a load, the margin's interval is
replicas × that interval / load − 1, and a margin whose interval reaches 0 (or whose SLOs are
not surely met at the load) is *within the noise*: :func:`recommend` does not call it a win.
The recommendation breaks ties on devices, then on the steady-state cost per 1M tokens at
capacity (costs whose intervals overlap tie), then on the latency at the load.

Row fields (one row per configuration, Parquet; :data:`CAPACITY_COLUMNS`):
``capacity_qps`` (0: even ``minimum`` fails), ``bracket_low``/``bracket_high`` (the bisection's
last bracket; high inf: ``maximum`` still meets), ``capacity_ci_low``/``capacity_ci_high`` (95%
interval; None with one replication), ``evaluations``, ``lengthening`` (the run-length factor at
capacity), ``throughput_at_capacity`` (steady-state output tokens/s), ``devices``,
``cost_per_million_tokens``; with a load ``replicas_for_load``, ``devices_for_load``,
``load_margin`` and its ``load_margin_low``/``load_margin_high``, ``margin_within_noise``
(1/0; None without intervals), ``latency_at_load``, ``mean_batch_at_load`` (the mean batch a replica
runs there, where the kind reports ``mean_batch``: the published evidence an answer carries is matched
on it, sim/evidence.py); ``<metric>_at_capacity`` per SLO metric;
text: ``latency_curve`` and ``notes`` (JSON lists).

Each configuration (point) is one task of the sweep machinery — run in parallel across
configurations, stored as Parquet, resumable.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from ..sim.errors import DraftsimError, parse_number, parse_seconds, suggest
from .sweep import Kind, Outcome, Spec, Summary, Task, as_metric, check_size, derive_seed, lookup, one_line, run_tasks, validate_points

CAPACITY_KEYS = ("slo", "start", "minimum", "maximum", "tolerance", "throughput", "price_per_hour", "devices", "compare",
                 "max_evaluations", "load", "latency", "max_lengthening")
#: Columns of a capacity result, before the SLO metrics at capacity (see the module docstring).
CAPACITY_COLUMNS = ("capacity_qps", "bracket_low", "bracket_high", "capacity_ci_low", "capacity_ci_high", "evaluations",
                    "lengthening", "throughput_at_capacity", "devices", "cost_per_million_tokens", "replicas_for_load",
                    "devices_for_load", "load_margin", "load_margin_low", "load_margin_high", "margin_within_noise",
                    "latency_at_load", "mean_batch_at_load")
#: Text columns of a capacity result: the latency at every rate simulated, JSON [[rate, latency], ...]; the runs
#: lengthened or found overloaded, JSON ["...", ...].
CAPACITY_TEXT_COLUMNS = ("latency_curve", "notes")
#: Metrics of a kind that say whether a run settled (:mod:`draftsim.sim.serving.steady`); read when the kind has them.
STEADY_METRICS = ("steady", "overloaded")
#: Options a run is lengthened by (doubled) when it did not settle, in order of preference.
LENGTH_OPTIONS = ("duration", "requests")


@dataclass
class Capacity:
    """The result of a search: ``qps`` meets the SLOs (0 when even ``minimum`` fails), ``high``
    does not (``inf`` when ``maximum`` still meets them); ``metrics`` were measured at ``qps``;
    ``evaluations`` lists (qps, meets, metrics) in the order tried."""

    qps: float
    low: float
    high: float
    metrics: dict
    evaluations: list = field(default_factory=list)


def find_capacity(evaluate: Callable[[float], tuple[bool, dict]], start: float = 1.0, minimum: float = 1e-3,
                  maximum: float = 1e6, tolerance: float = 0.02, max_evaluations: int = 64,
                  on_step: Callable[[Step], None] | None = None) -> Capacity:
    """The largest rate in [minimum, maximum] meeting the SLOs, to relative ``tolerance``.

    Bracketing: from ``start``, double while the rate meets the SLOs (or halve while it does
    not) until the two sides differ; then bisect at geometric midpoints until
    ``high / low - 1 <= tolerance``. Assumes meeting the SLOs is monotone in the rate.
    ``on_step(step)`` is told after each rate (:class:`Step`: the bracket it leaves).
    """
    if not (0 < minimum <= start <= maximum and math.isfinite(maximum)):
        raise DraftsimError(f"capacity search needs 0 < minimum <= start <= maximum < inf; got minimum {minimum!r}, "
                            f"start {start!r}, maximum {maximum!r}")
    if not 0 < tolerance < 1:
        raise DraftsimError(f"capacity tolerance must lie in (0, 1); got {tolerance!r}")
    trail: list = []
    seen: dict = {}

    def check(q: float) -> bool:
        if len(trail) >= max_evaluations:
            raise DraftsimError(f"the capacity search did not converge in {max_evaluations} evaluations (last bracket "
                                f"{trail[-1][0]:.4g}); raise max_evaluations or tolerance")
        ok, metrics = evaluate(q)
        trail.append((q, bool(ok), dict(metrics)))
        seen[q] = dict(metrics)
        return bool(ok)

    def told(phase: str, q: float, low: float, high: float) -> None:
        if on_step is not None:
            ok, metrics = trail[-1][1], trail[-1][2]
            on_step(Step(phase, q, ok, metrics, low, high, len(trail), bisections_left(low, high, tolerance)))

    q = start
    if check(q):
        low = q
        told("bracketing", q, low, math.inf)
        while True:
            if low >= maximum:
                return Capacity(low, low, math.inf, seen[low], trail)
            q = min(low * 2.0, maximum)
            if not check(q):
                high = q
                told("bracketing", q, low, high)
                break
            low = q
            told("bracketing", q, low, math.inf)
    else:
        high = q
        told("bracketing", q, 0.0, high)
        while True:
            if high <= minimum:
                return Capacity(0.0, 0.0, high, {}, trail)
            q = max(high / 2.0, minimum)
            if check(q):
                low = q
                told("bracketing", q, low, high)
                break
            high = q
            told("bracketing", q, 0.0, high)
    while high / low - 1.0 > tolerance:
        mid = math.sqrt(low * high)
        if check(mid):
            low = mid
        else:
            high = mid
        told("bisecting", mid, low, high)
    return Capacity(low, low, high, seen[low], trail)


def bisections_left(low: float, high: float, tolerance: float) -> int | None:
    """How many geometric bisections take the bracket [low, high] within ``tolerance`` (None
    while it is open: low 0 or high inf)."""
    if not (0 < low < high < math.inf):
        return None
    halvings = math.log2(math.log(high / low)) - math.log2(math.log1p(tolerance))  # finite even for a denormal tolerance
    return max(0, math.ceil(halvings - 1e-9))


@dataclass(frozen=True)
class Step:
    """One rate of a search as progress sees it: the ``phase`` (bracketing, bisecting, interval,
    replicas), the ``rate`` (or replica count) tried, whether it met the SLOs and its mean
    metrics, the bracket [``low``, ``high``] after it (0 / inf: still open), the evaluations so
    far and the bisections still needed (None: unknown)."""

    phase: str
    rate: float
    ok: bool
    metrics: dict
    low: float
    high: float
    evaluations: int
    left: int | None = None


class Progress:
    """The progress lines of one configuration's search, "LABEL: what [N s]" (seconds since the
    configuration started), told to ``say`` (None: silent): each rate simulated with its verdict,
    the SLO metrics against their bounds and the bracket it leaves (:meth:`step`), and each run
    lengthened or found overloaded (:meth:`__call__`)."""

    def __init__(self, say: Callable[[str], None] | None, label: str, slo: Mapping[str, float]):
        self.say, self.label, self.slo, self.t0 = say, label, dict(slo), time.perf_counter()

    def __call__(self, text: str) -> None:
        if self.say is not None:
            self.say(f"{self.label}: {text} [{time.perf_counter() - self.t0:.0f} s]")

    def step(self, step: Step, load: float | None = None) -> None:
        if self.say is None:
            return
        m = step.metrics
        if m.get("overloaded") is not None and m["overloaded"] > 0:
            verdict = "overloaded (queue still growing)"
        elif not settled(m):
            verdict = "not settled"
        else:
            verdict = "meets the SLOs" if step.ok else "misses the SLOs"
        detail = ", ".join(f"{name} {_fmt(m.get(name))}/{bound:g}" for name, bound in self.slo.items())
        top = "inf" if math.isinf(step.high) else f"{step.high:.4g}"
        if step.phase == "replicas":
            what = f"{step.rate:g} replica(s) at {load:g} req/s"
            fewest = f"fewest in ({step.low:g}, {step.high:g}]" if math.isfinite(step.high) else f"more than {step.low:g}"
        elif step.phase == INTERVAL_PHASE:
            what, fewest = f"rate {step.rate:.4g} req/s", f"interval so far [{step.low:.4g}, {top}]"
        else:
            what = f"rate {step.rate:.4g} req/s"
            fewest = "capacity " + (f"below {top}" if step.low <= 0 else
                                    f">= {step.low:.4g}" if math.isinf(step.high) else f"in [{step.low:.4g}, {top}]")
        left = f", ~{step.left} more" if step.left else ""
        self(f"{step.phase}: {what} {verdict} ({detail}); {fewest}{left} (evaluation {step.evaluations})")


def replicated(meets_slo: Callable[[float, int], object], seeds: Sequence[int], slo: Mapping[str, float] | None = None
               ) -> Callable[[float], tuple[bool, dict]]:
    """``evaluate(qps)`` over replications: ``meets_slo(qps, seed)`` returns a bool (the rate
    passes when every seed passes) or metrics (it passes when each SLO metric's mean over the
    seeds is finite and <= its bound in ``slo``). Returns (passes, mean metrics)."""
    if not seeds:
        raise DraftsimError("a capacity search needs at least one replication seed")

    def evaluate(qps: float) -> tuple[bool, dict]:
        results = [meets_slo(qps, s) for s in seeds]
        if all(isinstance(r, bool) for r in results):
            return all(results), {"fraction_meeting": sum(results) / len(results)}
        if not all(isinstance(r, Mapping) for r in results):
            raise DraftsimError("meets_slo must return a bool or a mapping of metrics for every seed")
        names = set().union(*results)
        values = {n: np.array([float("nan") if r.get(n) is None else float(r[n]) for r in results]) for n in names}
        means = {n: float(np.mean(v)) for n, v in values.items()}
        if slo is None:
            raise DraftsimError("meets_slo returned metrics: give the SLO bounds (metric -> upper bound)")
        missing = [m for m in slo if m not in means]
        if missing:
            raise DraftsimError(f"the simulation did not report SLO metric(s) {', '.join(missing)}")
        for m in slo:
            means[f"{m}_ci95"] = half_width(values[m])
        ok = all(math.isfinite(means[m]) and means[m] <= bound for m, bound in slo.items()) and settled(means)
        return ok, means

    return evaluate


def half_width(values: Sequence[float]) -> float:
    """Half-width of the 95% Student-t interval of the mean of ``values`` (nan for fewer than two)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return float("nan")
    from scipy import stats

    return float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def settled(metrics: Mapping[str, float]) -> bool:
    """Every replication reached a steady state and none is overloaded (true for metrics that
    carry no ``steady`` / ``overloaded`` flags: kinds without a steady-state test)."""
    steady, overloaded = metrics.get("steady"), metrics.get("overloaded")
    return (steady is None or steady >= 1.0) and (overloaded is None or not overloaded > 0.0)


def slo_ratio(metrics: Mapping[str, float], slo: Mapping[str, float], side: float = 0.0) -> float:
    """max over the SLO metrics of (mean + ``side`` × its 95% half-width) / bound: <= 1 meets the
    SLOs (side 0), surely meets them (side +1), or may still meet them (side −1). An unsettled or
    overloaded rate, or a missing metric, gives inf (one replication: no half-width, taken as 0)."""
    if not settled(metrics):
        return math.inf
    worst = -math.inf
    for m, bound in slo.items():
        mean = metrics.get(m)
        if mean is None or not math.isfinite(mean):
            return math.inf
        ci = metrics.get(f"{m}_ci95")
        ci = ci if ci is not None and math.isfinite(ci) else 0.0
        worst = max(worst, (mean + side * ci) / bound)
    return worst


def capacity_interval(cap: Capacity, slo: Mapping[str, float]) -> tuple[float, float] | None:
    """The 95% interval of a capacity, from the rates its search simulated: from the highest rate
    that surely meets the SLOs (the SLO ratio's upper confidence limit, :func:`slo_ratio` side
    +1, within 1 there and at every lower simulated rate; 0 when the lowest does not) to the
    lowest rate that surely fails them (its lower limit, side −1, above 1; inf when none does),
    widened to hold the bisection's bracket. Simulated rates only, no interpolation: a latency
    curve bends upwards near capacity, and a line between two rates would cut the upper end
    short. None without half-widths (one replication)."""
    points = sorted((q, m) for q, _, m in cap.evaluations)
    finite = lambda v: v is not None and math.isfinite(v)  # noqa: E731
    if not points or not any(finite(m.get(f"{x}_ci95")) for _, m in points for x in slo):
        return None
    low = 0.0
    for q, m in points:
        if slo_ratio(m, slo, +1.0) > 1.0:
            break
        low = q
    high = next((q for q, m in points if slo_ratio(m, slo, -1.0) > 1.0), math.inf)
    return min(low, cap.low), max(high, cap.high)


#: The phase of the steps :func:`confirm_interval` simulates.
INTERVAL_PHASE = "95% interval"
#: Most rates simulated beyond the bisection to find and sharpen the ends of the capacity's interval.
MAX_INTERVAL_EVALUATIONS = 6


def confirm_interval(evaluate: Callable[[float], tuple[bool, dict]], cap: Capacity, s,
                     on_step: Callable[[Step], None] | None = None) -> tuple[float, float] | None:
    """:func:`capacity_interval`, after simulating the rates it needs: while no simulated rate
    surely fails the SLOs, twice the highest one (up to ``s.maximum``); while none surely meets
    them, half the lowest (down to ``s.minimum``); then, while an end is further than
    ``s.tolerance`` from the nearest simulated rate the SLOs' band straddles, their geometric
    midpoint (a bisection of each end). At most :data:`MAX_INTERVAL_EVALUATIONS` more rates,
    added to ``cap.evaluations``; one inside the bracket narrows it (``cap`` is updated).
    ``on_step(step)`` is told after each (its bracket: the interval so far)."""
    for _ in range(MAX_INTERVAL_EVALUATIONS):
        interval = capacity_interval(cap, s.slo)
        if interval is None:
            return None
        low, high = interval
        rates = sorted({q for q, _, _ in cap.evaluations})
        unsure_above = [q for q, _, m in cap.evaluations if q > low and slo_ratio(m, s.slo, +1.0) > 1.0]
        unsure_below = [q for q, _, m in cap.evaluations if q < high and slo_ratio(m, s.slo, -1.0) <= 1.0]
        if math.isinf(high) and math.isfinite(cap.high) and rates[-1] < s.maximum:
            q = min(rates[-1] * 2.0, s.maximum)
        elif low <= 0.0 and cap.qps > 0 and rates[0] > s.minimum:
            q = max(rates[0] / 2.0, s.minimum)
        elif low > 0.0 and unsure_above and min(unsure_above) / low - 1.0 > s.tolerance:
            q = math.sqrt(low * min(unsure_above))
        elif math.isfinite(high) and unsure_below and high / max(unsure_below) - 1.0 > s.tolerance:
            q = math.sqrt(max(unsure_below) * high)
        else:
            return interval
        if q in rates:
            return interval
        ok, metrics = evaluate(q)
        cap.evaluations.append((q, bool(ok), dict(metrics)))
        if cap.low < q < cap.high:  # inside the bracket: it moves (monotone in the rate, as the bisection assumes)
            if ok:
                cap.qps = cap.low = q
                cap.metrics = dict(metrics)
            else:
                cap.high = q
        if on_step is not None:
            now = capacity_interval(cap, s.slo) or (cap.low, cap.high)
            on_step(Step(INTERVAL_PHASE, q, bool(ok), dict(metrics), now[0], now[1], len(cap.evaluations)))
    return capacity_interval(cap, s.slo)


# --- capacity specs --------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """A checked ``[capacity]`` table."""

    slo: dict
    start: float = 1.0
    minimum: float = 1e-3
    maximum: float = 1e4
    tolerance: float = 0.02
    throughput: str | None = "throughput"
    price_per_hour: float | None = None
    devices: tuple[str, ...] = ()
    compare: str | None = None
    max_evaluations: int = 64
    load: float | None = None
    latency: str | None = None
    max_lengthening: int = 8


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise DraftsimError(f"[capacity] {name} must be a finite number > 0; got {value!r}")
    return float(value)


def settings(spec: Spec, kind: Kind) -> Settings:
    """The ``[capacity]`` table of ``spec`` checked against ``kind``."""
    if kind.rate_option is None:
        raise DraftsimError(f"kind {kind.name} has no request-rate option; a capacity search needs kind serve (or simulate with engine des)")
    table = spec.capacity
    if not table:
        raise DraftsimError("a capacity spec needs a [capacity] table with slo = { metric = bound, ... }")
    unknown = [k for k in table if k not in CAPACITY_KEYS]
    if unknown:
        raise DraftsimError(f"unknown [capacity] key {unknown[0]!r}; valid keys: {', '.join(CAPACITY_KEYS)}")
    slo = table.get("slo")
    if not isinstance(slo, dict) or not slo:
        raise DraftsimError(f"[capacity] slo must be a table of metric = upper bound; got {slo!r}")
    for m, bound in slo.items():
        if m not in kind.metrics:
            raise DraftsimError(f"[capacity] slo: unknown metric {m!r} for kind {kind.name}; valid metrics: {', '.join(kind.metrics)}")
        _positive(f"slo.{m}", bound)
    out = {"slo": {m: float(b) for m, b in slo.items()}}
    for name in ("start", "minimum", "maximum", "tolerance", "price_per_hour", "load"):
        if name in table:
            out[name] = _positive(name, table[name])
    longest = table.get("max_lengthening", 8)
    if isinstance(longest, bool) or longest not in (1, 2, 4, 8, 16, 32, 64):
        raise DraftsimError(f"[capacity] max_lengthening must be one of 1, 2, 4, 8, 16, 32, 64 (runs are doubled); got {longest!r}")
    durations = [d for d in (_seconds_or_none(p.config.get("duration")) for p in spec.points())  # bad ones: refused with their point
                 if d is not None and math.isfinite(d) and d > 0]
    why = {"minimum": "", "maximum": ""}
    if durations:  # defaults every run can hold: MIN_RUN_REQUESTS at the lowest rate, MAX_RUN_REQUESTS at the longest
        if "minimum" not in out:
            out["minimum"] = max(Settings.minimum, MIN_RUN_REQUESTS / min(durations))
            why["minimum"] = f" (the default: {MIN_RUN_REQUESTS} requests over duration {min(durations):g} s)"
        if "maximum" not in out:
            out["maximum"] = min(Settings.maximum, MAX_RUN_REQUESTS / (max(durations) * longest))
            why["maximum"] = f" (the default: {MAX_RUN_REQUESTS:,} requests over duration {max(durations):g} s x {longest})"
    out.setdefault("start", min(max(Settings.start, out.get("minimum", Settings.minimum)), out.get("maximum", Settings.maximum)))
    s = Settings(**out)
    if not s.minimum <= s.maximum:
        raise DraftsimError(f"[capacity] minimum {s.minimum:g} req/s{why['minimum']} exceeds maximum {s.maximum:g}{why['maximum']}: "
                            "give minimum <= maximum")
    if not s.minimum <= s.start <= s.maximum:
        raise DraftsimError(f"[capacity] start {s.start:g} req/s must lie in [minimum {s.minimum:g}{why['minimum']}, maximum "
                            f"{s.maximum:g}{why['maximum']}] (minimum <= start <= maximum)")
    if not s.tolerance < 1:
        raise DraftsimError(f"[capacity] tolerance must lie in (0, 1); got {s.tolerance:g}")
    throughput = table.get("throughput", "throughput" if "throughput" in kind.metrics else None)
    if throughput is not None and throughput not in kind.metrics:
        raise DraftsimError(f"[capacity] throughput: unknown metric {throughput!r}; valid metrics: {', '.join(kind.metrics)}")
    devices = table.get("devices", [])
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise DraftsimError(f"[capacity] devices must be a list of option names; got {devices!r}")
    compare = table.get("compare", "policy" if "policy" in spec.axes else None)
    if compare is not None and compare not in spec.axes:
        raise DraftsimError(f"[capacity] compare = {compare!r} is not a varied option; axes: {', '.join(spec.axes) or 'none'}")
    max_ev = table.get("max_evaluations", 64)
    if isinstance(max_ev, bool) or not isinstance(max_ev, int) or not 2 <= max_ev <= 1000:
        raise DraftsimError(f"[capacity] max_evaluations must be an integer in [2, 1000]; got {max_ev!r}")
    if s.price_per_hour is not None and throughput is None:
        raise DraftsimError("[capacity] price_per_hour needs a throughput metric (output tokens/s)")
    rate = kind.rate_option
    if rate in spec.base or rate in spec.axes:
        raise DraftsimError(f"the capacity search sets {rate}; remove it from the spec")
    if s.load is not None and "replicas" in spec.axes:
        raise DraftsimError("[capacity] load searches the replicas itself: remove replicas from the varied options")
    latency = table.get("latency", next((m for m in ("e2e_mean", "latency_mean") if m in kind.metrics), None))
    if latency is not None and latency not in kind.metrics:
        raise DraftsimError(f"[capacity] latency: unknown metric {latency!r}; valid metrics: {', '.join(kind.metrics)}")
    return Settings(out["slo"], s.start, s.minimum, s.maximum, s.tolerance, throughput, s.price_per_hour,
                    tuple(d.replace("-", "_") for d in devices), compare, max_ev, s.load, latency, longest)


#: Fewest requests a run at the search's lowest rate (or at the load) may expect: fewer, and a Poisson
#: draw may hold none (the serving simulator refuses a run without requests).
MIN_RUN_REQUESTS = 10
#: Most requests one run of a search may expect; its longest is the highest rate (or the load) at
#: ``max_lengthening`` times the spec's length. The serving simulator's own budget (serve-sim: 1 ms
#: and ~4 kB per request of a few hundred tokens, 1 h and 4 GB) refuses runs of a few million.
MAX_RUN_REQUESTS = 1_000_000


def search_evaluations(s: Settings) -> int:
    """The most rates :func:`find_capacity` simulates under ``s``: the start, doublings to
    ``maximum`` or halvings to ``minimum``, then the bisection of a bracket of ratio 2 to the
    tolerance."""
    doublings = max(math.log2(s.maximum / s.start), math.log2(s.start / s.minimum))
    return 1 + math.ceil(doublings - 1e-9) + (bisections_left(1.0, 2.0, s.tolerance) or 0)


def check_search(spec: Spec, kind: Kind, s: Settings, points: Sequence, labels: Mapping[int, str] | None = None) -> None:
    """Every run the search of ``spec`` may make, checked before any runs (one line naming the
    field and what is valid): the bisection fits ``max_evaluations``; a load needs no more than
    :data:`MAX_REPLICAS` replicas of ``maximum`` each; per configuration, a run at ``minimum``
    (and at the load) expects at least :data:`MIN_RUN_REQUESTS` requests, and the longest run
    — ``maximum`` (or the load) at ``max_lengthening`` times the length — at most
    :data:`MAX_RUN_REQUESTS`; and ``kind.validate`` accepts the configuration at those rates and
    lengths (with the load, at that many replicas). A refusal names the configuration by its
    ``labels[point]`` (default "point N (axis=value, ...)")."""
    need = search_evaluations(s)
    if need > s.max_evaluations:
        brackets = need - (bisections_left(1.0, 2.0, s.tolerance) or 0)
        room = s.max_evaluations - brackets
        fits = f"tolerance {suggest(2.0 ** (0.5 ** room) - 1.0, '>=', 2)}" if room > 0 else "a narrower minimum..maximum"  # room 0: tolerance 1, not valid
        raise DraftsimError(f"[capacity] tolerance {s.tolerance:g} from start {s.start:g} over [{s.minimum:g}, {s.maximum:g}] req/s "
                            f"may need {need} evaluations, more than max_evaluations {s.max_evaluations}: give {fits}, or raise "
                            "max_evaluations (at most 1000)")
    if s.load is not None and s.load > s.maximum * MAX_REPLICAS:
        raise DraftsimError(f"[capacity] load {s.load:g} req/s needs more than {MAX_REPLICAS:,} replicas of at most maximum "
                            f"{s.maximum:g} req/s each: give load {suggest(s.maximum * MAX_REPLICAS, '<=', 4)}, or raise maximum")
    checked: set = set()
    for p in points:
        option, base = run_length(p.config)
        where = (labels or {}).get(p.index) or f"point {p.index} ({', '.join(f'{k}={v!r}' for k, v in p.values.items()) or 'the base configuration'})"
        if option == "duration" and isinstance(base, (int, float)):
            for name, rate in (("minimum", s.minimum), ("load", s.load)):
                if rate is not None and rate * base < MIN_RUN_REQUESTS * (1 - 1e-9):  # (the defaults sit on the bounds)
                    raise DraftsimError(f"[capacity] {name} {rate:g} req/s over duration {base:g} s expects {rate * base:.3g} requests "
                                        f"per run, fewer than {MIN_RUN_REQUESTS} ({where}): give {name} "
                                        f"{suggest(MIN_RUN_REQUESTS / base, '>=')}, or duration {suggest(MIN_RUN_REQUESTS / rate, '>=')} s")
            for name, rate in (("maximum", s.maximum), ("load", s.load)):
                longest = None if rate is None else rate * base * s.max_lengthening
                if longest is not None and longest > MAX_RUN_REQUESTS * (1 + 1e-9):
                    raise DraftsimError(f"[capacity] {name} {rate:g} req/s over duration {base:g} s x max_lengthening "
                                        f"{s.max_lengthening} expects {longest:.3g} requests in the longest run, more than "
                                        f"{MAX_RUN_REQUESTS:,} ({where}): give {name} "
                                        f"{suggest(MAX_RUN_REQUESTS / s.max_lengthening / base, '<=', 4)}, or a shorter duration or max_lengthening")
        elif option == "requests" and isinstance(base, (int, float)) and base * s.max_lengthening > MAX_RUN_REQUESTS:
            raise DraftsimError(f"[capacity] requests {base:g} x max_lengthening {s.max_lengthening} is {base * s.max_lengthening:.3g} "
                                f"requests in the longest run, more than {MAX_RUN_REQUESTS:,} ({where}): give requests <= "
                                f"{MAX_RUN_REQUESTS // s.max_lengthening:,}, or a smaller max_lengthening")
        longest = _scaled(p.config, option, base, s.max_lengthening)
        runs = [("minimum", {**p.config, kind.rate_option: s.minimum}), ("maximum", {**longest, kind.rate_option: s.maximum})]
        if s.load is not None:
            replicas = p.config.get("replicas", 1)
            runs.append(("load", {**longest, kind.rate_option: s.load, "replicas": replicas * 2 if isinstance(replicas, int) else 2}))
        for name, config in runs:
            try:
                validate_once(kind, config, checked)
            except DraftsimError as exc:
                value = getattr(s, name)
                raise DraftsimError(f"[capacity] {name} {value:g} req/s: {where} would be refused there: "
                                    f"{' '.join(str(exc).split())}") from None


def device_count(config: dict, names: Sequence[str]) -> float:
    """Product of the configuration's values for the ``devices`` options (absent ones count 1)."""
    n = 1.0
    for name in names:
        value = config.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise DraftsimError(f"[capacity] devices: option {name} must be a positive number; got {value!r}")
        n *= value
    return n


def lengthened(evaluate_at: Callable[[object, int], tuple[bool, dict]], s: Settings, option: str | None, base,
               describe: Callable[[object], str], notes: list,
               progress: Callable[[str], None] | None = None) -> Callable[[object], tuple[bool, dict]]:
    """``evaluate(point)`` that reruns a point whose runs did not settle (``steady`` < 1, not
    overloaded) at twice the length, up to ``s.max_lengthening`` times the spec's (the
    ``option``'s ``base`` value; None: no option to lengthen). ``evaluate_at(point, factor)`` runs
    the point at ``factor`` times the length. Each lengthening, and each overloaded point, is
    said in ``notes`` (and told to ``progress``); the metrics carry the ``lengthening`` used."""
    def note(text: str) -> None:
        notes.append(text)
        if progress is not None:
            progress(text)

    def evaluate(point) -> tuple[bool, dict]:
        factor = 1
        while True:
            ok, metrics = evaluate_at(point, factor)
            steady, overloaded = metrics.get("steady"), metrics.get("overloaded")
            if overloaded is not None and overloaded > 0:
                note(f"{describe(point)}: overloaded at {_length(option, base, factor)} (queue still growing): does not meet the SLOs")
                break
            if steady is None or steady >= 1.0:
                break
            if option is None or factor >= s.max_lengthening:
                why = "nothing to lengthen (give duration or requests)" if option is None else f"the longest allowed ({s.max_lengthening}x)"
                note(f"{describe(point)}: not steady at {_length(option, base, factor)}, {why}: counted as not meeting the SLOs")
                break
            # (not overloaded: that is said above) its occupancy still moved half-way through while its queue did not grow
            note(f"{describe(point)}: not settled at {_length(option, base, factor)} (the requests in the system still moved; "
                 f"the queue did not grow): rerun at {_length(option, base, factor * 2)}")
            factor *= 2
        metrics["lengthening"] = float(factor)
        return ok, metrics

    return evaluate


def _length(option: str | None, base, factor: int) -> str:
    if option is None:
        return "the spec's length"
    unit = " s" if option == "duration" else " requests"
    return f"{base * factor:g}{unit}" + (f" ({factor}x)" if factor > 1 else "")


def _seconds_or_none(value) -> float | None:
    """A spec's duration in seconds (``60``, ``"1m"``), or None where it is no time (refused later, with its point)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return parse_seconds("duration", value) if isinstance(value, str) else None
    except DraftsimError:
        return None


def validate_once(kind: Kind, config: dict, checked: set) -> None:
    """``kind.validate(config)``, unless the same configuration was validated before (``checked``
    holds their keys; a search's points share most of their runs)."""
    key = json.dumps(config, sort_keys=True, default=str)
    if key in checked:
        return
    checked.add(key)
    kind.validate(config)


def run_length(config: Mapping) -> tuple[str | None, float | int | None]:
    """Which option sets a run's length (``duration`` or ``requests``) and its value as a number: a
    spec's ``duration = "2m"`` is read as every time is (:func:`~draftsim.sim.errors.parse_seconds`), so
    the search can check and lengthen it (it was multiplied as text)."""
    option = next((o for o in LENGTH_OPTIONS if config.get(o) is not None), None)
    base = config.get(option) if option else None
    if isinstance(base, str):
        base = parse_seconds("duration", base) if option == "duration" else parse_number(option, base)
    return option, base


def _scaled(config: dict, option: str | None, base, factor: int) -> dict:
    if option is None or factor == 1:
        return config
    value = base * factor
    return {**config, option: int(value) if option == "requests" else float(value)}


def search_task(run: Callable, rate_option: str, metric_paths: dict, s: Settings, spec_seed: int, replications: int,
                task: Task, say: Callable[[str], None] | None = None, labels: Mapping[int, str] | None = None) -> Outcome:
    """One configuration's capacity search in a worker (the task's row values: see the module
    docstring); ``say(line)`` is told its progress (:class:`Progress`), each line led by the
    configuration's ``labels[task.point]``."""
    t0, c0 = time.perf_counter(), time.process_time()
    progress = Progress(say, (labels or {}).get(task.point, f"configuration {task.point}"), s.slo)
    try:
        seeds = [derive_seed(spec_seed, task.point, r) for r in range(replications)]
        option, base = run_length(task.config)
        notes: list = []

        def at(qps: float, factor: int) -> tuple[bool, dict]:
            def meets(q: float, seed: int) -> dict:
                output = run({**_scaled(task.config, option, base, factor), rate_option: float(q)}, seed)
                return {m: as_metric(m, lookup(output, p)) for m, p in metric_paths.items()}
            return replicated(meets, seeds, s.slo)(qps)

        progress(f"searching from {s.start:.4g} req/s, {replications} replication(s) per rate, to {s.tolerance:.0%}")
        evaluate = lengthened(at, s, option, base, lambda q: f"{q:.4g} req/s", notes, progress)
        cap = find_capacity(evaluate, s.start, s.minimum, s.maximum, s.tolerance, s.max_evaluations, on_step=progress.step)
        interval = confirm_interval(evaluate, cap, s, on_step=progress.step)
        devices = device_count(task.config, s.devices)
        throughput = cap.metrics.get(s.throughput) if s.throughput else None
        cost = None
        if s.price_per_hour is not None and throughput and throughput > 0:
            cost = s.price_per_hour * devices / (throughput * 3600.0) * 1e6
        values = {"capacity_qps": cap.qps, "bracket_low": cap.low, "bracket_high": cap.high,
                  "capacity_ci_low": interval[0] if interval else None, "capacity_ci_high": interval[1] if interval else None,
                  "evaluations": float(len(cap.evaluations)), "lengthening": cap.metrics.get("lengthening"),
                  "throughput_at_capacity": throughput, "devices": devices, "cost_per_million_tokens": cost}
        values.update({f"{m}_at_capacity": cap.metrics.get(m) for m in s.slo})
        if s.latency:
            curve = sorted({q: m.get(s.latency) for q, _, m in cap.evaluations}.items())
            values["latency_curve"] = json.dumps([[q, v] for q, v in curve if v is not None and math.isfinite(v)])
        done = f"capacity {cap.qps:.4g} req/s" + (f", 95% [{interval[0]:.4g}, {interval[1]:.4g}]" if interval else "")
        if s.load is not None:
            def at_load(point, factor: int) -> tuple[bool, dict]:
                return replicated(meets_with_replicas(run, rate_option, metric_paths, _scaled(task.config, option, base, factor)),
                                  seeds, s.slo)(point)

            load_eval = lengthened(at_load, s, option, base, lambda p: f"{p[0]:g} replica(s) at {p[1]:.4g} req/s", notes, progress)
            found = replicas_for_load(task.config, cap.qps, s, load_eval, devices, interval,
                                      on_step=lambda step: progress.step(step, s.load), notes=notes)
            values.update(found)
            reps = found["replicas_for_load"]
            done += f"; {'no replica count found' if reps is None else f'{reps:g} replica(s)'} for {s.load:g} req/s"
        values["notes"] = json.dumps(notes)
        progress(f"done: {done}")
        return Outcome(task.id, values, None, time.perf_counter() - t0, time.process_time() - c0)
    except Exception as exc:  # recorded with its error; the other configurations go on
        progress(f"failed: {one_line(exc)}")
        return Outcome(task.id, {}, one_line(exc), time.perf_counter() - t0, time.process_time() - c0)


def meets_with_replicas(run: Callable, rate_option: str, metric_paths: dict, config: dict) -> Callable:
    """``meets((replicas, qps), seed)``: the configuration's metrics with that many replicas at that rate."""
    def meets(point, seed: int) -> dict:
        replicas, qps = point
        output = run({**config, "replicas": int(replicas), rate_option: float(qps)}, seed)
        return {m: as_metric(m, lookup(output, p)) for m, p in metric_paths.items()}
    return meets


#: Most replicas a load search tries (serve-sim's --replicas takes up to 1,024).
MAX_REPLICAS = 1024


def replicas_for_load(config: dict, capacity: float, s: Settings, evaluate: Callable, devices: float,
                      interval: tuple[float, float] | None = None, on_step: Callable[[Step], None] | None = None,
                      notes: list | None = None) -> dict:
    """The fewest replicas that meet the SLOs at ``s.load`` (see the module docstring);
    ``evaluate((replicas, qps))`` runs the configuration and returns (meets, metrics).

    From the first guess g = ⌈load / capacity⌉: if g meets, g − 1, g − 2, g − 4, ... are tried
    until one fails (or 1 meets), and if g fails, g + 1, g + 2, g + 4, ... until one meets (at
    most :data:`MAX_REPLICAS`); the bracket (fails, meets] is then bisected. Meeting the SLOs is
    assumed monotone in the replicas, so O(log |answer − g|) counts are simulated, never a walk
    one count at a time. A guess beyond :data:`MAX_REPLICAS`, or no count up to it meeting the
    SLOs, gives no replica count (said in ``notes``). With the capacity's 95% ``interval``, the
    margin's interval and whether it is within the noise: its interval reaches 0, or the SLOs
    are not surely met at the load with that many replicas (:func:`slo_ratio`). ``on_step`` is
    told each count tried (phase "replicas", its bracket (fails, meets])."""
    base = config.get("replicas", 1)
    none = {"replicas_for_load": None, "devices_for_load": None, "load_margin": None, "load_margin_low": None,
            "load_margin_high": None, "margin_within_noise": None, "latency_at_load": None, "mean_batch_at_load": None}
    if capacity <= 0:
        return none
    top = MAX_REPLICAS // base
    guess = max(1, math.ceil(s.load / capacity - 1e-9))
    if guess > top:
        if notes is not None:
            notes.append(f"{s.load:g} req/s at {capacity:.4g} req/s per replica needs about {guess:,} replicas, more than the "
                         f"{top:,} a load search tries: no replica count")
        return none
    seen: dict = {}
    fails, meets_at = 0, math.inf  # the bracket: `fails` replicas miss the SLOs (0: none tried), `meets_at` meet them

    def meets(n: int) -> bool:
        nonlocal fails, meets_at
        ok, metrics = evaluate((n * base, s.load))
        seen[n] = metrics
        if ok:
            meets_at = min(meets_at, n)
        else:
            fails = max(fails, n)
        if on_step is not None:
            on_step(Step("replicas", float(n * base), bool(ok), dict(metrics), float(fails * base), meets_at * base, len(seen),
                         math.ceil(math.log2(meets_at - fails)) if fails and math.isfinite(meets_at) and meets_at - fails > 1 else None))
        return ok

    step = 1
    if meets(guess):
        while fails == 0 and meets_at > 1:  # down: g - 1, g - 2, g - 4, ... (at least 1)
            meets(max(1, meets_at - step))
            step *= 2
    else:
        while math.isinf(meets_at):  # up: g + 1, g + 2, g + 4, ... (at most top)
            if fails >= top:
                if notes is not None:
                    notes.append(f"no count of replicas up to {top * base:,} meets the SLOs at {s.load:g} req/s: no replica count")
                return none
            meets(min(top, fails + step))
            step *= 2
    while meets_at - fails > 1:  # bisect (fails, meets_at]
        meets((fails + meets_at) // 2)
    r = int(meets_at)
    out = {**none, "replicas_for_load": float(r * base), "devices_for_load": float(r * devices), "load_margin": r * capacity / s.load - 1.0,
           "latency_at_load": seen[r].get(s.latency) if s.latency else None, "mean_batch_at_load": seen[r].get("mean_batch")}
    if interval is not None:
        low, high = r * interval[0] / s.load - 1.0, r * interval[1] / s.load - 1.0
        out.update({"load_margin_low": low, "load_margin_high": high if math.isfinite(high) else None,
                    "margin_within_noise": float(low <= 0.0 or slo_ratio(seen[r], s.slo, +1.0) > 1.0)})
    return out


def point_label(values: Mapping) -> str:
    """A configuration as its progress lines name it: its axes' values (lists joined by +)."""
    shown = lambda v: ("+".join(map(str, v)) or "none") if isinstance(v, (list, tuple)) else str(v)  # noqa: E731
    return ", ".join(f"{k}={shown(v)}" for k, v in values.items()) or "the configuration"


def run_capacity(spec: Spec, kind: Kind, out, workers: int = 1, ray: bool = False, ray_address: str | None = None,
                 resume: bool = False, force: bool = False, progress=None, say: Callable[[str], None] | None = None,
                 labels: Mapping[int, str] | None = None) -> tuple[Summary, Settings]:
    """Search the capacity of every configuration of ``spec`` (one task each) into ``out``; every
    input is checked first (:func:`settings`, :func:`check_search`). ``progress(done, failed,
    total)`` is told as configurations finish, ``say(line)`` each step within one (a picklable,
    module-level function: workers call it; lines are led by ``labels[point]``, default
    "[i/n] axis=value, ...")."""
    s = settings(spec, kind)
    check_size(spec, force)
    points = validate_points(spec, kind, {kind.rate_option: s.start})
    check_search(spec, kind, s, points)
    tasks = [Task(p.index, p.index, 0, derive_seed(spec.seed, p.index, 0), p.config) for p in points]
    names = list(dict.fromkeys([*s.slo, *([s.throughput] if s.throughput else []), *([s.latency] if s.latency else []),
                                *[f for f in (*STEADY_METRICS, "mean_batch") if f in kind.metrics]]))
    labels = {p.index: f"[{i + 1}/{len(points)}] {(labels or {}).get(p.index) or point_label(p.values)}" for i, p in enumerate(points)}
    worker = partial(search_task, kind.run, kind.rate_option, {m: kind.metrics[m] for m in names}, s, spec.seed, spec.replications,
                     say=say, labels=labels)
    columns = list(CAPACITY_COLUMNS) + [f"{m}_at_capacity" for m in s.slo]
    summary = run_tasks(spec, points, tasks, worker, columns, out, workers, ray, ray_address, resume, progress,
                        extra={"capacity": {"slo": s.slo, "tolerance": s.tolerance, "price_per_hour": s.price_per_hour}},
                        text_columns=CAPACITY_TEXT_COLUMNS)
    return summary, s


def _speculates(compare: str | None, value) -> bool | None:
    """Whether a configuration with this value of the compare axis drafts (None: not known)."""
    if compare != "policy" or not isinstance(value, str):
        return None
    from ..sim.policies import parse_policy

    try:
        return parse_policy(value).max_draft > 0
    except DraftsimError:
        return None


def curve_crossover(baseline: Sequence, speculation: Sequence) -> tuple[float | None, float, float] | None:
    """The load where speculation stops paying, from two latency curves [(rate, latency), ...]:
    (crossover or None when it pays over the whole overlap, nan when it never pays, and the
    overlap's ends); None when the curves do not overlap."""
    b = np.array(baseline, dtype=np.float64).reshape(-1, 2)
    p = np.array(speculation, dtype=np.float64).reshape(-1, 2)
    b, p = b[(b > 0).all(axis=1)], p[(p > 0).all(axis=1)]
    if len(b) == 0 or len(p) == 0:
        return None
    lo, hi = max(b[0, 0], p[0, 0]), min(b[-1, 0], p[-1, 0])
    if lo > hi:
        return None
    q = np.unique(np.concatenate([b[:, 0], p[:, 0]]))
    q = q[(q >= lo) & (q <= hi)]
    x = np.log(q)
    log_lat = lambda c: np.interp(x, np.log(c[:, 0]), np.log(c[:, 1]))  # noqa: E731
    g = log_lat(b) - log_lat(p)  # log speedup: piecewise linear in log rate between the union's rates
    if g[0] < 0:
        return float("nan"), float(lo), float(hi)
    for i in range(1, len(g)):
        if g[i] < 0 <= g[i - 1]:
            f = g[i - 1] / (g[i - 1] - g[i])
            return float(np.exp(x[i - 1] + f * (x[i] - x[i - 1]))), float(lo), float(hi)
    return None, float(lo), float(hi)


def crossovers(table, spec_axes: Sequence[str], s: Settings) -> dict:
    """Per row index of a speculative configuration with a non-speculative one in its group:
    (crossover, overlap low, overlap high) as :func:`curve_crossover` gives it."""
    data = {c: table.column(c).to_pylist() for c in table.column_names}
    if not s.compare or "latency_curve" not in data:
        return {}
    others = [a for a in spec_axes if a != s.compare]
    group = lambda i: tuple(str(data[a][i]) for a in others)  # noqa: E731
    ok = [data["status"][i] == "ok" and data["latency_curve"][i] for i in range(table.num_rows)]
    base = {group(i): i for i in range(table.num_rows) if ok[i] and _speculates(s.compare, data[s.compare][i]) is False}
    out = {}
    for i in range(table.num_rows):
        j = base.get(group(i))
        if ok[i] and j is not None and _speculates(s.compare, data[s.compare][i]):
            found = curve_crossover(json.loads(data["latency_curve"][j]), json.loads(data["latency_curve"][i]))
            if found is not None:
                out[i] = found
    return out


def crossover_text(found) -> str:
    """A crossover as the capacity table shows it."""
    cross, lo, hi = found
    if cross is None:
        return f"pays to {hi:.3g}"
    if not math.isfinite(cross):
        return f"never (from {lo:.3g})"
    return f"{cross:.3g}"


def table_rows(table, spec_axes: Sequence[str], s: Settings) -> tuple[list[str], list[list]]:
    """Headers and rows of the capacity table (one row per configuration): the capacity, the
    bracket the bisection ended on and the 95% interval (results that carry them), the SLO
    metrics at capacity, with a load the replicas, devices and margin (with its interval,
    "noise" when it reaches 0), the run length the capacity was measured at when any was
    lengthened, throughput, cost and crossover."""
    cols = table.column_names
    data = {c: table.column(c).to_pylist() for c in cols}
    ok = [st == "ok" for st in data["status"]]
    intervals = "capacity_ci_low" in data
    longer = "lengthening" in data and any(o and (x or 1.0) > 1.0 for o, x in zip(ok, data["lengthening"]))
    headers = [*spec_axes, "capacity (req/s)"]
    if intervals:
        headers += ["bracket", "95% interval"]
    headers += [f"{m} at cap." for m in s.slo]
    if s.load is not None:
        headers += [f"replicas for {s.load:g} req/s", "devices", "margin"]
    if longer:
        headers.append("run length")
    if s.throughput:
        headers.append("tokens/s at cap.")
    if s.price_per_hour is not None:
        headers.append("$ per 1M tokens")
    cross = crossovers(table, spec_axes, s)
    if cross:
        headers.append("crossover (req/s)")
    rows = []
    for i in range(table.num_rows):
        row = [data[a][i] for a in spec_axes]
        if not ok[i]:
            rows.append(row + [f"failed: {data['error'][i]}"] + [""] * (len(headers) - len(row) - 1))
            continue
        cap, high = data["capacity_qps"][i], data["bracket_high"][i]
        row.append(f">= {cap:.4g}" if high is None or math.isinf(high) else f"{cap:.4g}")
        if intervals:
            row.append(_range(data["bracket_low"][i], high))
            lo, hi = data["capacity_ci_low"][i], data["capacity_ci_high"][i]
            row.append("- (1 replication)" if lo is None else _range(lo, hi))
        row += [_fmt(data[f"{m}_at_capacity"][i]) for m in s.slo]
        if s.load is not None:
            reps = data["replicas_for_load"][i]
            row += ["none meets" if reps is None else f"{reps:.0f}", _fmt(data["devices_for_load"][i]), margin_text(
                {k: data[k][i] for k in ("load_margin", "load_margin_low", "load_margin_high", "margin_within_noise") if k in data})]
        if longer:
            row.append(f"{data['lengthening'][i] or 1.0:g}x")
        if s.throughput:
            row.append(_fmt(data["throughput_at_capacity"][i]))
        if s.price_per_hour is not None:
            row.append(_fmt(data["cost_per_million_tokens"][i]))
        if cross:
            row.append(crossover_text(cross[i]) if i in cross else "-")
        rows.append(row)
    return headers, rows


def _range(low, high) -> str:
    top = "inf" if high is None or not math.isfinite(high) else f"{high:.4g}"
    return f"[{low:.4g}, {top}]"


def margin_text(row: Mapping) -> str:
    """A load margin as the table shows it: "+7% [+3%, +11%]", "(noise)" when its interval
    reaches 0 (or the SLOs are not surely met at the load)."""
    m = row.get("load_margin")
    if m is None:
        return "-"
    text = f"{m:+.0%}"
    low = row.get("load_margin_low")
    if low is not None:
        high = row.get("load_margin_high")
        text += f" [{low:+.0%}, {'+inf' if high is None else f'{high:+.0%}'}]"
    if row.get("margin_within_noise"):
        text += " (noise)"
    return text


def where(row: Mapping, axes: Sequence[str], labels: Mapping[int, str] | None = None) -> str:
    """A result row's configuration as the output names it: ``labels[point]`` where given (the
    front door's "EAGLE-3 with k = 3", also on a rerun of its spec), else its axes' values."""
    label = (labels or {}).get(row.get("point"))
    return label or ", ".join(f"{a}={row[a]}" for a in axes) or "the configuration"


def lengthening_notes(table, axes: Sequence[str], labels: Mapping[int, str] | None = None) -> list[str]:
    """Per configuration, every run lengthened because it had not settled, and every rate found
    overloaded (the ``notes`` column), as lines "where: note" (:func:`where`)."""
    if "notes" not in table.column_names:
        return []
    out = []
    for r in table.to_pylist():
        if r.get("status") != "ok" or not r.get("notes"):
            continue
        out += [f"{where(r, axes, labels)}: {n}" for n in json.loads(r["notes"])]
    return out


#: The serve kind's latencies (in seconds): their SLO bounds are shown with a unit (:func:`slo_text`).
LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue")
#: The latencies bounded per token: a bound of a second or more on them is almost surely milliseconds.
PER_TOKEN = ("tpot", "itl")


def is_latency(metric: str, kind: str | None) -> bool:
    """Whether ``metric`` of ``kind`` is a latency in seconds (the serve kind's ttft_p99, tpot_p50, ...)."""
    return kind == "serve" and metric.split("_")[0] in LATENCIES


def seconds_text(value: float) -> str:
    """Seconds in the unit that reads best: "2 s", "60 ms", "500 us"."""
    if value >= 1.0:
        return f"{value:g} s"
    if value >= 1e-3:
        return f"{value * 1e3:g} ms"
    return f"{value * 1e6:g} us"


def slo_text(slo: Mapping[str, float], kind: str | None, le: str = "<=") -> str:
    """The SLO bounds as every capacity output echoes them, each latency with its unit:
    "ttft_p99 <= 2 s, tpot_p90 <= 60 ms" (another kind's metrics: their own numbers)."""
    return ", ".join(f"{m} {le} {seconds_text(b) if is_latency(m, kind) else f'{b:g}'}" for m, b in slo.items())


def slo_warnings(slo: Mapping[str, float], kind: str | None) -> list[str]:
    """A warning per per-token latency (TPOT, ITL) a spec bounds by 1 s or more: the spec's
    latencies are seconds, and 60 s a token is almost surely 60 ms meant."""
    return [f"[capacity] slo {m} = {b:g} bounds it by {b:g} s per token (a spec's latencies are in seconds); for {b:g} ms write "
            f"{m} = {b / 1e3:g}" for m, b in slo.items() if is_latency(m, kind) and m.split("_")[0] in PER_TOKEN and b >= 1.0]


def _fmt(value) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.4g}"


def figure(path, table, spec_axes: Sequence[str], s: Settings, kind: str | None = None,
           labels: Mapping[int, str] | None = None) -> Path:
    """Capacity per configuration as horizontal bars, one per configuration (named by
    ``labels[point]``, else by its axes' values), coloured by its value of ``compare`` (e.g.
    with and without speculation; the legend beside the plot, hiding nothing), with their 95%
    intervals as error bars and each value written past its interval; and cost per million
    tokens when a price is given. The title gives the SLOs with their units (``kind``'s latencies
    in seconds, :func:`slo_text`). Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {c: table.column(c).to_pylist() for c in table.column_names}
    n = table.num_rows
    ok = [st == "ok" for st in data["status"]]
    shown = lambda v: ("+".join(map(str, v)) or "none") if isinstance(v, (list, tuple)) else str(v)  # noqa: E731
    points = data.get("point", list(range(n)))
    names = [(labels or {}).get(points[i]) or " / ".join(shown(data[a][i]) for a in spec_axes) or "the configuration"
             for i in range(n)]
    series = list(dict.fromkeys(shown(data[s.compare][i]) for i in range(n))) if s.compare else []
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = [colours[series.index(shown(data[s.compare][i])) % len(colours)] if s.compare else colours[0] for i in range(n)]
    panels = [("capacity_qps", "capacity per replica (requests/s)")]
    if s.price_per_hour is not None:
        panels.append(("cost_per_million_tokens", f"$ per 1M output tokens (at ${s.price_per_hour:g} per device-hour)"))
    widest = max((len(x) for x in names), default=10)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels) + 0.07 * widest + (2.2 if series else 0.6),
                                                       max(2.4, 0.4 * n + 1.5)), sharey=True, squeeze=False)
    axes = axes[0]
    pos = np.arange(n)
    for ax, (column, title) in zip(axes, panels):
        lengths, lows, highs = [], [], []
        for i in range(n):
            v = data[column][i] if ok[i] else None
            v = v if v is not None and math.isfinite(v) else 0.0
            lo = data.get("capacity_ci_low", [None] * n)[i] if ok[i] and column == "capacity_qps" else None
            hi = data["capacity_ci_high"][i] if lo is not None else None
            lengths.append(v)
            lows.append(v - lo if lo is not None else 0.0)
            highs.append((hi if hi is not None and math.isfinite(hi) else v) - v if lo is not None else 0.0)
        xerr = np.array([lows, highs]) if any(lows) or any(highs) else None  # the 95% interval of each capacity
        ax.barh(pos, lengths, 0.7, xerr=xerr, capsize=3, color=colour)
        top = max([v + h for v, h in zip(lengths, highs)] + [0.0]) or 1.0
        for i, (v, h) in enumerate(zip(lengths, highs)):  # each value past the end of its interval
            ax.text(v + h + 0.01 * top, i, f"{v:.3g}" if ok[i] else "failed", va="center", fontsize=7)
        ax.set_xlim(0, top * 1.15)
        ax.set_xlabel(title, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(pos)
    axes[0].set_yticklabels(names, fontsize=8)
    axes[0].invert_yaxis()
    if series:
        from matplotlib.patches import Patch

        handles = [Patch(color=colours[j % len(colours)], label=v) for j, v in enumerate(series)]
        axes[-1].legend(handles=handles, title=s.compare, fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                        borderaxespad=0.0, frameon=False)
    fig.suptitle(f"largest request rate per replica meeting {slo_text(s.slo, kind, '≤')}"
                 + (" (bars: mean over replications; whiskers: 95% interval)" if "capacity_ci_low" in data else ""), fontsize=9)
    from .figures import save_figure

    return save_figure(fig, path)


def cheapest(table, axes, labels: Mapping[int, str] | None = None) -> str | None:
    """The configuration with the lowest cost per million output tokens at capacity (None without a price)."""
    rows = [r for r in table.to_pylist() if r["status"] == "ok" and r.get("cost_per_million_tokens") is not None]
    if not rows:
        return None
    r = min(rows, key=lambda r: r["cost_per_million_tokens"])
    name = where(r, axes, labels)
    lo, hi = _cost_interval(r)
    band = f" (95% {lo:.4g} to {hi:.4g})" if (lo, hi) != (r["cost_per_million_tokens"],) * 2 and math.isfinite(hi) else ""
    others = [x for x in rows if x is not r and _cost_interval(x)[0] <= hi]
    tie = f"; within the noise of {len(others)} other configuration(s)" if others and band else ""
    return f"{name}: {r['cost_per_million_tokens']:.4g} per 1M tokens{band} at {r['capacity_qps']:.4g} req/s per replica{tie}"


def _cost_interval(r: Mapping) -> tuple[float, float]:
    """The cost per 1M tokens at capacity over the capacity's 95% interval (cost ∝ 1 / capacity)."""
    cost, cap = r.get("cost_per_million_tokens"), r.get("capacity_qps")
    lo, hi = r.get("capacity_ci_low"), r.get("capacity_ci_high")
    if cost is None:
        return math.inf, math.inf
    if lo is None or not cap:
        return cost, cost
    return (cost * cap / hi if hi and math.isfinite(hi) else 0.0), (cost * cap / lo if lo > 0 else math.inf)


def recommend(table, axes: Sequence[str]) -> tuple[dict | None, list[dict]]:
    """The configuration that meets the load on the fewest devices, and the others within its
    noise. Candidates are the rows whose margin is a clear win (its 95% interval above 0: a
    margin within the noise is not a win; rows without intervals, one replication, count as
    clear). Ties on devices are broken on the steady-state cost per 1M tokens at capacity —
    unless the cost intervals overlap (then the costs tie) — then on the latency at the load,
    then by order. Returns (winner or None, rows with fewer devices whose margin is within the
    noise)."""
    rows = [r for r in table.to_pylist() if r["status"] == "ok" and r.get("devices_for_load") is not None]
    clear = [r for r in rows if not r.get("margin_within_noise")]
    if not clear:
        return None, rows
    fewest = min(r["devices_for_load"] for r in clear)
    tied = [r for r in clear if r["devices_for_load"] == fewest]
    cheapest_row = min(tied, key=lambda r: _cost_interval(r)[1] if r.get("cost_per_million_tokens") is None
                       else r["cost_per_million_tokens"])
    c_lo, c_hi = _cost_interval(cheapest_row)
    same_cost = [r for r in tied if r is cheapest_row or (_cost_interval(r)[0] <= c_hi and c_lo <= _cost_interval(r)[1])]
    latency = lambda r: r["latency_at_load"] if r.get("latency_at_load") is not None else math.inf  # noqa: E731
    best = min(same_cost, key=latency)
    noisy = [r for r in rows if r.get("margin_within_noise") and r["devices_for_load"] < fewest]
    return best, noisy


def fewest_devices(table, axes, labels: Mapping[int, str] | None = None) -> str | None:
    """The configuration that meets the load on the fewest devices (:func:`recommend`), with
    its replicas and margin's interval; the configurations that might need fewer but whose
    margin is within the noise are named as such."""
    best, noisy = recommend(table, axes)
    parts = []
    if best is not None:
        parts.append(f"{where(best, axes, labels)}: {best['replicas_for_load']:.0f} replica(s), {best['devices_for_load']:.0f} device(s), "
                     f"margin {margin_text(best)}")
    for r in noisy:
        parts.append(f"not a clear win: {where(r, axes, labels)} on {r['devices_for_load']:.0f} device(s), margin {margin_text(r)} "
                     "(within the noise: more replications or a longer run may settle it)")
    return "; ".join(parts) or None
