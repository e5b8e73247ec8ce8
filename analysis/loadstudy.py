"""Serving studies: speculation against load, the crossover where it stops paying, and the
serving simulator's figures (latency CDFs, batch size and KV use over time, speedup vs load).

:func:`sweep_qps` serves the same workloads (common random numbers: one seed, the same
requests and rounds at every load, arrivals at the asked rates) with the drafting policy and
with plain autoregressive decoding (no drafter loaded: its memory goes to the KV cache), and
reports speedup = mean E2E latency without speculation / with it; :func:`crossover` finds the
load where the speedup falls through 1 (linear in log QPS between the two sweep points
around it).
(:func:`draftsim.analysis.demo.serving_study` is the demo's short study built on these.)
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..sim import policies  # noqa: E402
from ..sim.controllers import NoControl  # noqa: E402
from ..sim.errors import DraftsimError  # noqa: E402
from ..sim.serving import ServingConfig, run_replications  # noqa: E402
from .figures import save_figure  # noqa: E402

__all__ = ["autoregressive", "sweep_qps", "crossover", "latency_cdfs", "load_over_time", "speedup_vs_load"]


def autoregressive(config: ServingConfig) -> ServingConfig:
    """``config`` without speculation: plain decoding, no drafter (its memory goes to the KV cache),
    the target priced as the engine runs a server that does not speculate (``plain_target``)."""
    return replace(config, policy=policies.Autoregressive(), drafters=[], controller=NoControl(),
                   target=config.target if config.plain_target is None else config.plain_target, plain_target=None)


def sweep_qps(config: ServingConfig, make_workload, qps_values, *, seed: int = 0, replications: int = 1, progress=None,
              metric: str = "e2e") -> list[dict]:
    """One row per QPS: the speculative and autoregressive summaries and the speedups
    (mean E2E, mean TPOT, throughput), all at the steady state, and whether both runs reached
    it (``steady``, ``steady_reason``). ``make_workload(rng, qps)`` draws a workload."""
    qps_values = [float(q) for q in qps_values]
    if not qps_values or any(not (np.isfinite(q) and q > 0) for q in qps_values):
        raise DraftsimError(f"--sweep-qps needs rates > 0; got {qps_values}")
    ar_config = autoregressive(config)
    rows = []
    for q in sorted(set(qps_values)):
        spec = run_replications(config, lambda rng, q=q: make_workload(rng, q), seed=seed, replications=replications,
                                progress=progress, keep_runs=False)
        ar = run_replications(ar_config, lambda rng, q=q: make_workload(rng, q), seed=seed, replications=replications,
                              progress=progress, keep_runs=False)
        s, a = spec.summary, ar.summary
        rows.append({
            "qps": q,
            "speedup": a[metric]["mean"] / s[metric]["mean"],
            "tpot_speedup": a["tpot"]["mean"] / s["tpot"]["mean"],
            "throughput_ratio": s["throughput"] / a["throughput"],
            # both runs settled (draftsim.sim.serving.steady); else why not (speculation's reason first)
            "steady": bool(s.get("steady", True) and a.get("steady", True)),
            "steady_reason": next((x.get("steady_reason", "") for x in (s, a) if not x.get("steady", True)), ""),
            "spec": s,
            "ar": a,
        })
    return rows


def crossover_row(rows: list[dict], key: str = "speedup") -> int | None:
    """The index of the first row where ``key`` falls through 1 (below 1 after a row at or above
    it): the crossover lies between that row and the one before; None if it never does."""
    return next((i for i in range(1, len(rows)) if rows[i][key] < 1 <= rows[i - 1][key]), None)


def crossover(rows: list[dict], key: str = "speedup") -> float | None:
    """The QPS where ``key`` first falls through 1 (log-linear interpolation between the rows
    around it, :func:`crossover_row`); None if it never does within the sweep (nan if it is below
    1 already at the lowest load)."""
    if not rows:
        return None
    if rows[0][key] < 1:
        return float("nan")
    i = crossover_row(rows, key)
    if i is None:
        return None
    (q0, s0), (q1, s1) = ((rows[j]["qps"], rows[j][key]) for j in (i - 1, i))
    x0, x1 = np.log(q0), np.log(q1)
    f = (s0 - 1) / (s0 - s1)
    # within the bracket: exp(log q) need not give q back to the last bit
    return float(min(max(np.exp(x0 + f * (x1 - x0)), q0), q1))


def _plain_log_ticks(ax) -> None:
    """Log-scale x ticks written as plain numbers (2, 5, 10, 0.5), not as 2×10⁰."""
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(fmt)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))


#: Characters per line of a load figure's title (wrapped: at 10 pt about this many fit a 6.4-inch figure).
TITLE_WIDTH = 70


def speedup_vs_load(path, rows: list[dict], title: str = "", cross: float | None = None) -> Path:
    """Speedup of speculation over none against load; the crossover marked (its label in the
    upper corner, clear of the lines), the loads not at steady state ringed, the title wrapped
    to the figure's width (a long target name was clipped)."""
    q = [r["qps"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(q, [r["speedup"] for r in rows], marker="o", label="E2E latency speedup")
    ax.plot(q, [r["tpot_speedup"] for r in rows], marker="s", ls="--", label="TPOT speedup")
    unsteady = [r for r in rows if not r.get("steady", True)]
    if unsteady:
        ax.scatter([r["qps"] for r in unsteady], [r["speedup"] for r in unsteady], s=160, facecolors="none", edgecolors="crimson",
                   linewidths=1.2, zorder=3, label="not at steady state")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    if cross is not None and np.isfinite(cross):
        ax.axvline(cross, color="crimson", lw=1.0, label=f"crossover ≈ {cross:.3g} req/s")
    ax.set_xscale("log")
    _plain_log_ticks(ax)
    ax.set_xlabel("load (requests/s)")
    ax.set_ylabel("speedup over no speculation")
    # each of the title's own lines wrapped on its own (its line breaks kept)
    lines = (title or "Speculative decoding under load").splitlines()
    ax.set_title("\n".join(w for line in lines for w in textwrap.wrap(line, TITLE_WIDTH)), fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    return save_figure(fig, path)


def latency_cdfs(path, runs: dict, slo=None, title: str = "") -> Path:
    """CDFs of TTFT, TPOT and E2E latency, one line per labelled run (a RunRecord; put the
    baseline beside speculation); ``slo`` (:class:`~draftsim.sim.serving.metrics.SLO`) draws
    its finite objectives as vertical lines."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for label, run in runs.items():
        ttft = run.first_token - run.arrival
        multi = run.output > 1
        tpot = (run.finish[multi] - run.first_token[multi]) / (run.output[multi] - 1)
        e2e = run.finish - run.arrival
        for ax, x in zip(axes, (ttft, tpot, e2e)):
            x = np.sort(x[np.isfinite(x)])
            ax.plot(x * 1e3, np.arange(1, len(x) + 1) / max(len(x), 1), label=label)
    limits = (getattr(slo, "ttft", np.inf), getattr(slo, "tpot", np.inf), np.inf) if slo is not None else (np.inf,) * 3
    for ax, name, limit in zip(axes, ("TTFT", "TPOT", "E2E latency"), limits):
        if np.isfinite(limit):
            ax.axvline(limit * 1e3, color="crimson", lw=1.0, ls="--", label=f"SLO {limit * 1e3:g} ms")
            ax.legend(fontsize=8, loc="lower right")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_xscale("log")
        _plain_log_ticks(ax)
        ax.set_title(name)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("fraction of requests")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(title or "Latency distributions")
    return save_figure(fig, path)


def load_over_time(path, run, kv_blocks: int | None = None, title: str = "") -> Path:
    """Batch size, waiting requests and KV use over time (replica 0 of a run), the warm-up and
    the drain that the steady-state figures leave out shaded (:mod:`draftsim.sim.serving.steady`)."""
    from ..sim.serving.steady import steady_state

    s = run.steps
    mine = s["replica"] == 0
    t = s["start"][mine]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ss = steady_state(run.arrival, run.admitted, run.finish)
    if ss.tested:
        first, last = float(np.nanmin(run.arrival)), float(np.nanmax(run.finish))
        ax.axvspan(first, ss.start, color="grey", alpha=0.15, lw=0, label="warm-up (cut)")
        ax.axvspan(ss.end, last, color="grey", alpha=0.3, lw=0, label="drain (cut)")
    ax.step(t, s["batch"][mine], where="post", lw=0.8, label="batch size")
    ax.step(t, s["waiting"][mine], where="post", lw=0.8, label="waiting")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests")
    blocks = kv_blocks or run.kv_blocks
    if blocks and (s["kv"][mine] >= 0).any():
        ax2 = ax.twinx()
        ax2.plot(t, s["kv"][mine] / blocks * 100, color="tab:green", lw=0.8, label="KV use")
        ax2.set_ylabel("KV cache used (%)")
        ax2.set_ylim(0, 100)
        ax2.legend(loc="upper right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(title or "Batch size, waiting requests and KV use over time (replica 0)")
    return save_figure(fig, path)
