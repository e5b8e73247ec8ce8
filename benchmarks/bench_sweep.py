"""Sweep scaling: 1 against 2 worker processes, and Ray's overhead per point.

Run: ``.venv/bin/python benchmarks/bench_sweep.py [--points 200] [--tokens 40000]``.

1. **Scaling** — one sweep of ``--points`` discrete-event simulations (``draftsim simulate
   --engine des``: 16 requests arriving as a Poisson stream sharing the target, fixed k = 4,
   Bernoulli acceptance, ``--tokens`` tokens each) run with 1 worker (in this process) and with
   2 worker processes, into two folders; the results must be identical and the ratio of the
   wall times is the speed-up (goal on a 2-core machine: >= 1.8x). The serving simulator
   (``draftsim serve-sim``, kind ``serve``) is used instead when ``--kind serve`` is given and
   the build has it.
2. **Ray overhead** — 1-second points (a point that sleeps, so the figure is the
   orchestration alone and not CPU contention) through the process pool and through a local
   Ray cluster with the same number of CPUs; overhead per point = (wall x slots - work) /
   points, as a fraction of the point's second (goal: <= 10 %). Ray's start-up is timed
   apart; it is paid once per sweep.

All figures come from one run; the machine load (``os.getloadavg``) is printed with them,
because the CPU may be shared.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from analysis import sweep as sw
from draftsim.sweepkinds import KINDS


def sleep_run(config: dict, seed: int | None) -> dict:
    """A point that takes ``config['seconds']`` of wall time and no CPU."""
    time.sleep(config["seconds"])
    return {"slept": config["seconds"]}


def check_nothing(config: dict) -> None:
    return None


SLEEP = sw.Kind("sleep", check_nothing, sleep_run, {"slept": "slept"}, ("slept",), seed_option=None)


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def scaling_spec(kind: str, points: int, tokens: int) -> sw.Spec:
    if kind == "serve":
        data = {"version": 1, "kind": "serve", "seed": 1, "metrics": ["ttft_p99", "tpot_p50", "throughput"],
                "base": {"duration": 30.0}, "grid": {"qps": {"start": 0.5, "stop": 20.0, "num": points}}}
    else:
        data = {"version": 1, "kind": "simulate", "seed": 1, "metrics": ["ewif", "latency_p99", "throughput"],
                "base": {"engine": "des", "policy": "fixed:k=4", "cost": [0.05], "requests": 16, "tokens": tokens},
                "grid": {"alpha": {"start": 0.5, "stop": 0.9, "num": points // 4}, "rate": [0.002, 0.005, 0.01, 0.02]}}
    return sw.parse_spec(data, KINDS)


def timed_sweep(spec: sw.Spec, kind: sw.Kind, out: Path, **kw) -> tuple[float, sw.Summary]:
    t0 = time.perf_counter()
    summary = sw.run_sweep(spec, kind, out, **kw)
    return time.perf_counter() - t0, summary


def stored(out: Path) -> dict:
    table = sw.load(out)
    return {c: table.column(c).to_pylist() for c in table.column_names if c not in ("seconds", "cpu_seconds")}


def cpu_used(out: Path) -> float:
    """CPU seconds the points of a sweep folder used (their own runs, in the workers)."""
    return float(sw.numeric(sw.load(out), "cpu_seconds").sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=40000, help="tokens per simulate point")
    ap.add_argument("--kind", choices=["simulate", "serve"], default="simulate")
    ap.add_argument("--ray-points", type=int, default=24, help="1-second points for the Ray overhead")
    ap.add_argument("--skip-ray", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        spec = scaling_spec(args.kind, args.points, args.tokens)
        kind = KINDS[spec.kind]
        print(f"scaling: {spec.n_tasks} {spec.kind} points ({load()})")
        t1, s1 = timed_sweep(spec, kind, tmp / "w1", workers=1)
        c1 = cpu_used(tmp / "w1")
        print(f"  1 worker : {t1:7.2f} s wall, {c1:6.1f} CPU s in points -> {c1 / t1:.2f} cores busy "
              f"({c1 / spec.n_tasks * 1e3:.0f} CPU ms a point, {s1.failed} failed)  {load()}")
        t2, s2 = timed_sweep(spec, kind, tmp / "w2", workers=2)
        c2 = cpu_used(tmp / "w2")
        print(f"  2 workers: {t2:7.2f} s wall, {c2:6.1f} CPU s in points -> {c2 / t2:.2f} cores busy "
              f"({c2 / spec.n_tasks * 1e3:.0f} CPU ms a point, {s2.failed} failed)  {load()}")
        same = stored(tmp / "w1") == stored(tmp / "w2")
        print(f"  speed-up 2 workers / 1: {t1 / t2:.2f}x wall (goal >= 1.8x); results identical: {same}")
        print(f"  parallel efficiency: {(c2 / t2) / 2:.0%} of 2 cores (1 worker: {c1 / t1:.0%} of 1 core); "
              f"CPU per point 2 workers / 1: {c2 / c1:.2f}")
        if args.skip_ray or not sw.ray_available():
            print("ray: skipped" + ("" if args.skip_ray else " (Ray is not installed: pip install 'draftsim[ray]')"))
            return
        n, slots = args.ray_points, 2
        sleep = sw.parse_spec({"version": 1, "kind": "sleep", "base": {"seconds": 1.0}, "grid": {"i": list(range(n))}},
                              {"sleep": SLEEP})
        tp, _ = timed_sweep(sleep, SLEEP, tmp / "pool", workers=slots)
        t0 = time.perf_counter()
        ray, _ = sw.start_ray(None, slots)
        t_start = time.perf_counter() - t0
        tr, _ = timed_sweep(sleep, SLEEP, tmp / "ray", workers=slots, ray=True)
        ray.shutdown()
        ideal = n / slots
        over_pool = (tp - ideal) * slots / n
        over_ray = (tr - ideal) * slots / n
        print(f"ray overhead: {n} points of 1 s on {slots} slots (ideal {ideal:.1f} s)  {load()}")
        print(f"  process pool: {tp:6.2f} s -> {over_pool * 1e3:6.1f} ms a point ({over_pool:.1%} of 1 s; pool start-up included)")
        print(f"  ray         : {tr:6.2f} s -> {over_ray * 1e3:6.1f} ms a point ({over_ray:.1%} of 1 s; goal <= 10%); "
              f"ray.init {t_start:.1f} s once per sweep")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
