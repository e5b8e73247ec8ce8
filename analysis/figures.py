"""Figures of the analytic planner, written as PNG files."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.patches
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..sim import analytic  # noqa: E402
from ..sim.files import atomic_write  # noqa: E402


def save_figure(fig, path) -> Path:
    """Lay out ``fig``, write it to ``path`` atomically (a failed or interrupted write leaves no
    temporary and an older file as it was; the format follows the suffix) and close it."""
    path = Path(path)
    try:
        fig.tight_layout()
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".").lower() or "png"))
    finally:
        plt.close(fig)
    return path


def ewif_vs_k(path: Path, alphas=(0.6, 0.7, 0.8, 0.9), costs=(0.02, 0.1, 0.25), k_max: int = 16) -> Path:
    """EWIF against the draft length k, one panel per cost c, one line per α ([CSD] Cor. 4.2)."""
    k = np.arange(k_max + 1)
    fig, axes = plt.subplots(1, len(costs), figsize=(4.2 * len(costs), 3.6), sharey=True)
    for ax, c in zip(np.atleast_1d(axes), costs):
        for a in alphas:
            values = analytic.ewif(a, c, k)
            best_k, best = analytic.optimal_k(a, c, k_max)
            (line,) = ax.plot(k, values, marker="o", ms=3, label=f"α = {a:g}")
            ax.plot([best_k], [best], marker="*", ms=12, color=line.get_color())
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_title(f"c = {c:g}")
        ax.set_xlabel("draft length k")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("EWIF (speedup)")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.suptitle("Expected walltime improvement factor against k (★ = optimal k)")
    return save_figure(fig, path)


def optimal_k_map(path: Path, k_max: int = 32, n: int = 400) -> Path:
    """Map of the optimal k over the (α, c) plane, with EWIF contours."""
    alpha = np.linspace(0.0, 0.99, n)
    cost = np.linspace(0.0, 0.5, n)
    A, C = np.meshgrid(alpha, cost)
    best_k, best = analytic.optimal_k(A, C, k_max)
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    # Band edges between integer k, finer where most of the plane lies (small k).
    edges = [e for e in (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128) if e < k_max]
    levels = np.array(edges + [k_max]) - 0.5
    levels = np.append(levels, k_max + 0.5)
    norm = matplotlib.colors.BoundaryNorm(levels, 256)
    mesh = ax.contourf(A, C, best_k, levels=levels, cmap="viridis", norm=norm)
    contours = ax.contour(A, C, best, levels=[1.1, 1.5, 2, 3, 4, 6], colors="white", linewidths=0.8)
    ax.clabel(contours, fmt=lambda v: f"EWIF {v:g}", fontsize=7)
    bar = fig.colorbar(mesh, ax=ax, ticks=[e for e in edges if e <= k_max] + [k_max])
    bar.set_label(f"optimal draft length k (≤ {k_max}; 0 = don't speculate)")
    ax.set_xlabel("acceptance rate α")
    ax.set_ylabel("cost coefficient c")
    ax.set_title("Optimal draft length over (α, c)")
    return save_figure(fig, path)


def timeline(path: Path, tl, max_entries: int = 400) -> Path:
    """Gantt chart of a DES timeline: one row per request, bars coloured by phase."""
    n = min(len(tl), max_entries)
    colors = {"draft+verify": "tab:blue", "draft": "tab:orange", "verify": "tab:blue"}
    fig, ax = plt.subplots(figsize=(9, 0.35 * (max(tl.request[:n], default=0) + 2) + 1.5))
    for i in range(n):
        ax.barh(tl.request[i], tl.end[i] - tl.start[i], left=tl.start[i], height=0.6 if tl.resource[i] == "device" else 0.3,
                color=colors.get(tl.phase[i], "grey"), edgecolor="none")
    handles = [matplotlib.patches.Patch(color=c, label=p) for p, c in colors.items() if p in set(tl.phase[:n])]
    ax.legend(handles=handles, fontsize=8, loc="upper right")
    ax.set_xlabel("time (cost units)")
    ax.set_ylabel("request")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title(f"DES timeline (first {n} of {len(tl)} phases)")
    return save_figure(fig, path)


def _cost_ratio_axes(ax, ylabel: str, title: str) -> None:
    ax.set_xscale("log")
    ax.set_xlabel("t_draft / t_target")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def threshold_vs_cost(path: Path, sweep: list[dict], comparisons: list[dict]) -> Path:
    """Left: the optimal threshold h* per regime against t_draft/t_target. Right: speedup of
    the MDP optimum, the best threshold, the best fixed k and the oracle."""
    ratios = [s["ratio"] for s in sweep]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    regimes = sorted(sweep[0]["structure"]["per_regime"])
    for r in regimes:
        lo = [s["structure"]["per_regime"][r]["h_low"] for s in sweep]
        hi = [s["structure"]["per_regime"][r]["h_high"] for s in sweep]
        mid = [np.nan if (a is None or b is None) else 0.5 * (a + b) for a, b in zip(lo, hi)]
        ax1.plot(ratios, mid, marker="o", label=f"regime {r}")
    _cost_ratio_axes(ax1, "h*: keep drafting while 1 − Π p ≤ h*", "Optimal stopping threshold (SpecDec++ MDP)")
    ar = np.array([c["autoregressive"] for c in comparisons])
    for key, label in (("optimal", "MDP optimum"), ("best_threshold", "best threshold"), ("best_fixed_k", "best fixed k"), ("oracle", "oracle")):
        lat = np.array([c[key] if np.isscalar(c[key]) else c[key]["latency_per_token"] for c in comparisons])
        ax2.plot(ratios, ar / lat, marker="o", ms=3, label=label)
    _cost_ratio_axes(ax2, "speedup over autoregressive", "Policies on the same Markov-modulated workload")
    return save_figure(fig, path)
