"""Steady state of a serving run: where the warm-up ends, the window every rate and latency is
measured over, and whether the run settled at all.

A run starts empty and stops admitting arrivals at its last arrival; what a team sizes a
deployment on is the server in between, at its steady state. :func:`steady_state` finds it:

* **Series.** N(t), the requests in the system (arrived, not finished), time-averaged over
  1,000 equal bins of [first arrival, last arrival], exactly (:func:`occupancy`). N starts at 0
  and rises to its stationary level (Little's law: λ × mean E2E) — that rise is the warm-up,
  the batch filling up.
* **Warm-up: MSER-5** (White 1997, "An effective truncation heuristic for bias reduction in
  simulation output", Simulation 69(6):323–334; White, Cobb & Spratt 2000, "A comparison of five
  steady-state truncation heuristics for simulation", Proc. Winter Simulation Conference):
  batch the series in means of 5, and cut the d batches that minimise
  MSER(d) = Σ_{j>d} (Z_j − Z̄_d)² / (k − d)², the squared standard error of the mean of what
  is kept. d is searched over the first half of the batches only: near the end MSER is
  minimised by chance on a handful of batches, and a minimum at the half-way limit means the
  series was still moving — the MSER literature's rule that a truncation point in the second
  half of the data signals a run too short (White, Cobb & Spratt 2000; Hoad, Robinson & Davies
  2010, "Automating warm-up length estimation", J. Operational Research Society
  61(9):1389–1403). Then the run is **not steady**.
* **Queue growth.** Over [MSER-5's cut, last arrival], a least-squares trend through 10 batch means of the
  waiting requests W(t) (arrived, not yet admitted; batch means as near-independent
  observations: Law 2015, *Simulation Modeling and Analysis*, 5th ed., §9.5.3), tested
  one-sided at 95% (Student t, 8 degrees of freedom). A significant rise of W by more than 5% of
  the window's arrivals (and by at least one request) means the server admits less than 95% of
  what arrives: **overloaded** (its queue, and so its TTFT, grows without bound; no SLO holds at
  that rate however long the run): "queue still growing: overloaded, or run longer". MSER-5's
  half-way limit alone (the queue did not grow) says which test failed and how many mean E2E
  latencies the arrivals span: N(t) is correlated over about one E2E, so a run of a few dozen
  of them holds few independent batches and the half-way minimum comes by chance (300 requests
  at 4 req/s of Llama-2-70B, 17 E2Es: one replication in ten; none in 12 at 1,500). (The same test on N(t) is not used: with long-tailed output lengths its batch means
  stay correlated, and it flagged a quarter of stable 300 s runs of Llama-3.1-8B at 10 req/s.)
* **Fill time.** The warm-up lasts at least until the latencies S of the run leave at most 2%
  beyond it, E[(S − t)+] <= 0.02 E[S] (:func:`latency_tail`): a server that starts empty holds,
  at time t, the requests that arrived in the last S, so its occupancy (infinite-server queue:
  E[N(t)] = λ E[min(S, t)], Eick, Massey & Whitt 1993, "The physics of the Mt/G/∞ queue",
  Operations Research 41(4):731–742) and its token rate stay below their steady values by
  E[(S − t)+] / E[S]. Long-tailed output lengths make this longer than MSER-5 sees in a short
  run's noise. A fill time past half of the arrivals' span: **not steady** (run longer).
* **Window.** [warm-up end, last arrival]. Rates (output tokens/s, requests/s) are what the
  server did *inside* it: tokens emitted in the window / its length (a request emits its first
  token at ``first_token`` and the rest evenly until ``finish``; the error is confined to the
  few requests straddling the window's ends), so the drain after the last arrival is cut. At a
  steady state this is λ × mean output (flow balance), and overloaded it is the server's
  saturated rate, not the offered load — why it is preferred to counting the output of the
  requests that arrive in the window, which is the offered load whatever the server does.
* **Latency sample.** The requests arriving in [warm-up end, last arrival − mean E2E]: each is
  served while arrivals still come (a request arriving later finishes in the drain, with a
  shrinking batch, and would flatter TPOT). A window shorter than twice the mean E2E keeps
  fewer than half of its arrivals: **not steady** (run longer).

With fewer than :data:`MIN_REQUESTS` requests, or when every request arrives at once, nothing is
tested: the window is the whole run (first arrival to last finish) and ``tested`` is False.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["SteadyState", "steady_state", "mser", "occupancy", "trend", "emitted_between", "latency_tail", "describe",
           "MIN_REQUESTS", "NOT_SETTLED", "NOT_RISING"]

#: Fewest requests for a steady-state test (fewer: the whole run is measured, ``tested`` False).
MIN_REQUESTS = 50
#: Raw observations (time bins) of the series MSER-5 truncates: 200 batches of 5. (Fewer, as many
#: as the requests, made the half-way test fail by chance on a tenth of stable 55-request runs.)
BINS = 1000
#: MSER-5's batch size.
BATCH = 5
#: Batch means of the queue-growth trend test.
TREND_BATCHES = 10
#: The warm-up lasts at least until the latencies beyond it hold at most this share of their total.
FILL_SHARE = 0.02
#: A significant rise of W(t) over the window by more than this share of its arrivals: overloaded.
OVERLOAD_SHARE = 0.05
#: What a run whose queue still grows is told.
NOT_SETTLED = "queue still growing: overloaded, or run longer"
#: What a run is told whose occupancy still moved half-way through (MSER-5) while its queue did not grow.
NOT_RISING = "not settled: the requests in the system still moved half-way through the run"


@dataclass(frozen=True)
class SteadyState:
    """The measurement window of a run (seconds on the run's clock).

    ``start``..``end``: the window rates are measured over (warm-up cut before ``start``, the
    drain after ``end``); ``latency_end``: the requests arriving in [``start``, ``latency_end``]
    are the latency sample; ``warmup``: seconds cut after the first arrival; ``steady``: the run
    settled (False: ``reason`` says why); ``overloaded``: its waiting queue grows (no SLO holds);
    ``tested``: False when the run was too small to test (the window is then the whole run)."""

    start: float
    end: float
    latency_end: float
    warmup: float
    steady: bool
    overloaded: bool
    reason: str
    tested: bool

    @property
    def length(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return asdict(self)


def occupancy(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time average over each bin [edges[i], edges[i+1]] of #{j: start_j <= t < end_j}, exactly:
    a bin's integral is N(lo)·(hi − lo) + Σ_{lo < start_j <= hi} (hi − start_j) − Σ_{lo < end_j <= hi}
    (hi − end_j), summed per event into its own bin. (Differences of the running integral
    Σ (t − start_j) − Σ (t − end_j) at the two edges lose every digit on a bin 3e-14 wide at t = 160:
    hypothesis found an average of −4 intervals there.)"""
    s = np.sort(np.asarray(start, dtype=np.float64))
    e = np.sort(np.asarray(end, dtype=np.float64))
    edges = np.asarray(edges, dtype=np.float64)
    width = np.diff(edges)
    bins = len(width)
    alive = (np.searchsorted(s, edges[:-1], side="right") - np.searchsorted(e, edges[:-1], side="right")).astype(np.float64)

    def inside(t: np.ndarray) -> np.ndarray:
        """Σ over the events t in (lo, hi] of each bin of hi − t, each term within [0, width]."""
        i = np.searchsorted(edges, t, side="left") - 1
        ok = (i >= 0) & (i < bins)
        i = i[ok]
        return np.bincount(i, weights=np.clip(edges[i + 1] - t[ok], 0.0, width[i]), minlength=bins)

    integral = alive * width + inside(s) - inside(e)
    return np.divide(integral, width, out=np.zeros(bins), where=width > 0)


def mser(x: np.ndarray, batch: int = BATCH) -> tuple[int, bool]:
    """MSER-``batch`` truncation of series ``x`` (White 1997): (observations to cut, settled).
    ``settled`` is False when the minimum lies at the half-way limit of the search (the series
    was still moving: run longer). Trailing observations short of a batch are left out."""
    x = np.asarray(x, dtype=np.float64)
    k = len(x) // batch
    if k < 2:
        return 0, True
    z = x[: k * batch].reshape(k, batch).mean(axis=1)
    limit = k // 2
    stat = np.empty(limit + 1)
    for d in range(limit + 1):
        tail = z[d:]
        stat[d] = float(((tail - tail.mean()) ** 2).sum()) / len(tail) ** 2
    scale = float(np.abs(z).max()) + 1e-300
    best = int(np.flatnonzero(stat <= stat.min() + 1e-12 * scale**2 / k**2)[0])  # the first of equal minima
    return best * batch, best < limit


def trend(y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope of ``y`` against its index and its one-sided t statistic (inf for a
    perfect rise, 0 for a flat series)."""
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    x = np.arange(n, dtype=np.float64) - (n - 1) / 2
    sxx = float((x * x).sum())
    slope = float((x * (y - y.mean())).sum()) / sxx
    resid = y - y.mean() - slope * x
    dof = max(n - 2, 1)
    se = float(np.sqrt((resid * resid).sum() / dof / sxx))
    if se <= 1e-12 * (abs(slope) + float(np.abs(y).max()) + 1e-300):
        return slope, (np.inf if slope > 0 else 0.0)
    return slope, slope / se


def _t95_one_sided(dof: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.95, dof))


def emitted_between(first_token: np.ndarray, finish: np.ndarray, output: np.ndarray, a: float, b: float) -> float:
    """Output tokens emitted in [a, b]: each request's first at ``first_token``, the other
    ``output − 1`` evenly over (first_token, finish]."""
    first = np.asarray(first_token, dtype=np.float64)
    fin = np.asarray(finish, dtype=np.float64)
    out = np.asarray(output, dtype=np.float64)
    at_first = (first >= a) & (first <= b)
    rest = np.maximum(out - 1.0, 0.0)
    length = fin - first
    overlap = np.clip(np.minimum(fin, b) - np.maximum(first, a), 0.0, None)
    share = np.where(length > 0, overlap / np.where(length > 0, length, 1.0), at_first)  # all at once: with the first
    return float(at_first.sum()) + float((rest * share).sum())


def steady_state(arrival: np.ndarray, admitted: np.ndarray, finish: np.ndarray) -> SteadyState:
    """The measurement window of a run from its requests' arrival, admission and finish times
    (see the module docstring)."""
    arrival = np.asarray(arrival, dtype=np.float64)
    finish = np.asarray(finish, dtype=np.float64)
    admitted = np.asarray(admitted, dtype=np.float64)
    admitted = np.where(np.isfinite(admitted), admitted, finish)
    n = len(arrival)
    t0 = float(np.min(arrival)) if n else 0.0
    t1 = float(np.max(arrival)) if n else 0.0
    whole = float(np.max(finish)) if n else 0.0
    if n < MIN_REQUESTS:
        return SteadyState(t0, whole, whole, 0.0, True, False, f"not tested: fewer than {MIN_REQUESTS} requests; the whole run is measured",
                           False)
    if not t1 > t0:
        return SteadyState(t0, whole, whole, 0.0, True, False, "not tested: every request arrives at once; the whole run is measured", False)
    m = BINS
    edges = np.linspace(t0, t1, m + 1)
    in_system = occupancy(arrival, finish, edges)
    cut, settled = mser(in_system)
    mser_start = float(edges[cut])
    half = t0 + (t1 - t0) / 2
    growth, longer = [], []
    overloaded = False
    if not settled:
        growth.append("the requests in the system still rose half-way through the run")
    arrived = (arrival >= mser_start) & (arrival <= t1)
    count = int(arrived.sum())
    tested_queue = count >= 2 * TREND_BATCHES
    if tested_queue:
        bedges = np.linspace(mser_start, t1, TREND_BATCHES + 1)
        w_means = occupancy(arrival, admitted, bedges)
        slope, t = trend(w_means)
        rise = slope * (TREND_BATCHES - 1)
        if t > _t95_one_sided(TREND_BATCHES - 2) and rise > OVERLOAD_SHARE * count and rise >= 1.0:
            overloaded = True
            growth.insert(0, f"the waiting queue grew by {rise:.3g} requests in {t1 - mser_start:.3g} s: "
                             f"{1 - rise / count:.0%} of the arrivals admitted")
    fill = latency_tail(finish - arrival)
    start = max(mser_start, t0 + fill)
    if start > half:
        if not growth:
            longer.append(f"run longer: requests take up to {fill:.3g} s to finish, so the server fills for that long, more than "
                          f"half of the {t1 - t0:.3g} s of arrivals")
        start = half
    window = t1 - start
    arrived = (arrival >= start) & (arrival <= t1)
    count = int(arrived.sum())
    e2e = finish[arrived] - arrival[arrived]
    latency_end = t1 - float(e2e.mean()) if count else t1
    sample = int(((arrival >= start) & (arrival <= latency_end)).sum())
    if count and 2 * sample < count:
        latency_end = t1
        if not longer:
            longer.append(f"run longer: the {window:.3g} s window after the warm-up is shorter than twice the mean E2E latency "
                          f"({float(e2e.mean()):.3g} s)")
    if overloaded:
        reasons = [f"{NOT_SETTLED} ({'; '.join(growth)})"] + longer
    elif growth:  # MSER-5 alone: say which test failed, and that the queue test did not (or could not run)
        mean_e2e = float(np.mean(finish - arrival))
        queue = ("the waiting queue showed no significant growth (the overload test passed)" if tested_queue
                 else "too few arrivals after the cut to test the waiting queue")
        reasons = [f"{NOT_RISING}, run longer (MSER-5's warm-up cut fell at its half-way limit; the {t1 - t0:.3g} s of arrivals span "
                   f"{(t1 - t0) / mean_e2e:.3g} mean E2E latencies of {mean_e2e:.3g} s); {queue}"] + longer
    else:
        reasons = longer
    return SteadyState(start, t1, latency_end, start - t0, not reasons, overloaded, "; ".join(reasons), True)


def latency_tail(e2e: np.ndarray, share: float = FILL_SHARE) -> float:
    """The shortest t with E[(S − t)+] <= ``share`` × E[S] over latencies S: by then a server
    that started empty holds all but ``share`` of its steady-state occupancy (infinite-server
    queue started empty: E[N(t)] = λ E[min(S, t)]; Eick, Massey & Whitt 1993)."""
    e = np.sort(np.asarray(e2e, dtype=np.float64)[np.isfinite(e2e)])[::-1]
    if not e.size or e[0] <= 0:
        return 0.0
    # excess(t) = Σ (e_i − t)+ is piecewise linear and decreasing; at t = e_j it is Σ_{i<j} (e_i − e_j)
    csum = np.cumsum(e)
    j = np.arange(e.size)
    excess = np.concatenate([[0.0], csum[:-1]]) - j * e  # at t = e_j
    goal = share * float(e.sum())
    k = int(np.searchsorted(excess, goal, side="right"))  # excess rises as t = e_j falls
    if k == 0:
        return float(e[0])
    if k >= e.size:
        return max(float(e[-1] - (goal - excess[-1]) / e.size), 0.0)
    # between t = e_k and t = e_{k-1} the excess falls with slope k
    return float(e[k - 1] - (goal - excess[k - 1]) / k)


def describe(summary: dict) -> str:
    """One line on the steady state of a run's summary (or of replications combined): what was
    cut and measured, or the warning of a run that did not settle ("" for a summary without
    the steady-state keys)."""
    if "steady" not in summary:
        return ""
    if not summary["steady"]:
        reps = summary.get("replications", 1)
        which = f" ({reps - summary.get('steady_replications', 0)} of {reps} replications)" if reps > 1 else ""
        return f"WARNING: not at steady state{which}: {summary['steady_reason']}"
    if not summary.get("steady_tested", True):
        reps, untested = summary.get("replications", 1), summary.get("untested_replications", 1)
        which = f" ({untested} of {reps} replications)" if reps > 1 and untested < reps else ""
        return f"steady state {summary['steady_reason']}{which}"
    per = " per replication" if summary.get("replications", 1) > 1 else ""
    return (f"steady state: {summary['warmup_s']:.3g} s of warm-up (MSER-5) and the drain cut; rates over "
            f"{summary['window_s']:.3g} s, latencies over {summary['measured_requests']:.0f} requests{per}")
