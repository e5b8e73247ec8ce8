"""Figures of a sweep: a heat map of a metric over two axes, or lines over one axis.

Input is :func:`draftsim.analysis.sweep.aggregate`'s {(x[, y]): (mean, se, n)}; PNG written atomically.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .figures import save_figure  # noqa: E402


def _order(values) -> list:
    """Axis values sorted numerically when they are numbers, else in text order."""
    values = list(dict.fromkeys(values))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return sorted(values, key=str)


def _note(averaged, fixed=None) -> str:
    where = "".join(f", {k} = {v}" for k, v in (fixed or {}).items())
    return f"{where} (mean over replications{', ' + ', '.join(averaged) if averaged else ''})"


def heatmap(path, groups: dict, x: str, y: str, metric: str, averaged=(), fixed=None) -> Path:
    """Mean ``metric`` with ``x`` across and ``y`` down, each cell annotated."""
    xs, ys = _order(k[0] for k in groups), _order(k[1] for k in groups)
    grid = np.full((len(ys), len(xs)), np.nan)
    for (xv, yv), (mean, _, _) in groups.items():
        grid[ys.index(yv), xs.index(xv)] = mean
    fig, ax = plt.subplots(figsize=(max(4.5, 0.75 * len(xs) + 2), max(3.2, 0.45 * len(ys) + 1.5)))
    im = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis")
    fig.colorbar(im, ax=ax, label=metric)
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([f"{v:.4g}" if isinstance(v, float) else str(v) for v in xs], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(ys)))
    ax.set_yticklabels([f"{v:.4g}" if isinstance(v, float) else str(v) for v in ys], fontsize=8)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if grid.size <= 400:
        finite = grid[np.isfinite(grid)]
        mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
        for i in range(len(ys)):
            for j in range(len(xs)):
                if math.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.3g}", ha="center", va="center", fontsize=7,
                            color="black" if grid[i, j] > mid else "white")
    ax.set_title(metric + _note(averaged, fixed), fontsize=9)
    return save_figure(fig, path)


def lines(path, groups: dict, x: str, y: str | None, metric: str, averaged=(), fixed=None) -> Path:
    """Mean ``metric`` against ``x`` (± one standard error), one line per ``y`` value."""
    xs = _order(k[0] for k in groups)
    series = _order(k[1] for k in groups) if y is not None else [None]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for s in series:
        keys = [(xv, s) if y is not None else (xv,) for xv in xs]
        pts = [(i, xv, groups[k]) for i, (xv, k) in enumerate(zip(xs, keys)) if k in groups]
        pos = [xv if numeric else i for i, xv, _ in pts]
        mean = np.array([g[0] for _, _, g in pts])
        se = np.array([g[1] if math.isfinite(g[1]) else 0.0 for _, _, g in pts])
        ax.errorbar(pos, mean, yerr=se, marker="o", ms=3, capsize=2, label=f"{y}={s}" if y is not None else None)
    if numeric and min(xs) > 0 and max(xs) / min(xs) >= 20:
        ax.set_xscale("log")
    if not numeric:
        ax.set_xticks(range(len(xs)))
        ax.set_xticklabels([str(v) for v in xs], rotation=20, ha="right", fontsize=8)
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    if y is not None:
        ax.legend(fontsize=8)
    ax.set_title(metric + _note(averaged, fixed), fontsize=9)
    return save_figure(fig, path)
