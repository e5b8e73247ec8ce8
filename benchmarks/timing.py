"""Timing helpers shared by the benchmark scripts."""

from __future__ import annotations

import time


def best_time(fn, repeat: int) -> float:
    """The fastest of ``repeat`` calls of ``fn`` (seconds): a busy machine preempts single runs."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
