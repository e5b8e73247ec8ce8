"""Sweep scaling: 1 against 2 worker processes, and Ray's overhead per point.

Run: ``.venv/bin/python benchmarks/bench_sweep.py [--points 200] [--tokens 40000]``.

1. **Scaling** — one sweep of ``--points`` serving simulations (``draftsim serve-sim``:
   Qwen2.5-7B with a 0.5B drafter on an H100 by roofline, 30 s of Poisson arrivals at 1..16
   requests/s, no speculation and k = 2, 4, 6) run with 1 worker (in this process) and with 2
   worker processes, into two folders; the results must be identical and the ratio of the wall
   times is the speed-up (goal on a 2-core machine: >= 1.8x). ``--kind simulate`` uses
   discrete-event ``draftsim simulate`` points instead (16 requests, ``--tokens`` each).
2. **Orchestration and Ray overhead** — 1-second points that sleep (so the figure is the
   orchestration alone, not CPU contention): 1 against 2 pool workers, then a local Ray
   cluster with 2 CPUs, twice (the first sweep also starts Ray's worker processes; the second
   finds them warm); overhead per point = (wall x slots - work) / points, as a fraction of the
   point's second (goal: <= 10 %). ``ray.init`` is timed apart: it is paid once per run.

All figures come from one run; the machine load (``os.getloadavg``) and the cores the points
actually got (their CPU seconds over the wall time) are printed with them, because the CPU may
be shared — and how many cores two busy loops get in this session right before and after
the runs, which bounds the speed-up two workers can show: with Linux's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``)
every session gets an equal share of the CPUs, so while other sessions are busy a sweep's
workers together get that one share whatever their number, and the wall-time speed-up says
nothing about the sweep. The sleeping points measure the orchestration's own scaling.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from draftsim.analysis import sweep as sw
from draftsim.sweepkinds import KINDS


def sleep_run(config: dict, seed: int | None) -> dict:
    """A point that takes ``config['seconds']`` of wall time and no CPU."""
    time.sleep(config["seconds"])
    return {"slept": config["seconds"]}


def check_nothing(config: dict) -> None:
    return None


SLEEP = sw.Kind("sleep", check_nothing, sleep_run, {"slept": "slept"}, ("slept",), seed_option=None)


def spin(seconds: float) -> float:
    """Busy-loop for ``seconds`` of wall time; return the CPU seconds this process got."""
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        pass
    return time.process_time() - c0


def cores_available(processes: int, seconds: float = 2.0) -> float:
    """Cores that ``processes`` busy loops in this session get together right now (what a
    pool of that many workers can get at best on this machine, at this moment)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return sum(pool.map(spin, [seconds] * processes)) / seconds


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def scaling_spec(kind: str, points: int, tokens: int) -> sw.Spec:
    if kind == "serve":
        data = {"version": 1, "kind": "serve", "seed": 1, "metrics": ["ttft_p99", "tpot_p50", "throughput", "mean_acceptance_length"],
                "base": {"target": "qwen2.5-7b", "drafter": ["qwen2.5-0.5b"], "hardware": "h100-sxm", "alpha": 0.8,
                         "duration": 30.0, "prompt_len": "fixed:512", "output_len": "fixed:128", "replications": 1},
                "grid": {"qps": {"start": 1.0, "stop": 16.0, "num": points // 4, "scale": "log"},
                         "policy": ["ar", "fixed:k=2", "fixed:k=4", "fixed:k=6"]}}
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


def scaling(spec: sw.Spec, tmp: Path) -> None:
    kind = KINDS[spec.kind]
    one, two = cores_available(1), cores_available(2)
    print(f"machine now: 1 busy loop gets {one:.2f} cores, 2 busy loops get {two:.2f} together -> the best 2-worker "
          f"speed-up attainable now is about {two / one:.2f}x  ({load()})")
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
    two_after = cores_available(2)
    print(f"  2 busy loops after the runs: {two_after:.2f} cores; speed-up over what the machine gave: "
          f"{(t1 / t2) / (min(two, two_after) / one):.0%} of the attainable  ({load()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=40000, help="tokens per simulate point")
    ap.add_argument("--kind", choices=["simulate", "serve"], default="serve")
    ap.add_argument("--ray-points", type=int, default=24, help="1-second points for the Ray overhead")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--skip-scaling", action="store_true", help="only the orchestration and Ray overhead")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        if not args.skip_scaling:
            scaling(scaling_spec(args.kind, args.points, args.tokens), tmp)
        n, slots = args.ray_points, 2
        sleep = sw.parse_spec({"version": 1, "kind": "sleep", "base": {"seconds": 1.0}, "grid": {"i": list(range(n))}},
                              {"sleep": SLEEP})
        ideal = n / slots

        def over(t: float, per_slot: float = ideal) -> float:
            return (t - per_slot) * slots / n

        print(f"1-second points that sleep (orchestration alone, no CPU): {n} points  {load()}")
        t_one, _ = timed_sweep(sleep, SLEEP, tmp / "one", workers=1)
        tp, _ = timed_sweep(sleep, SLEEP, tmp / "pool", workers=slots)
        print(f"  1 worker {t_one:6.2f} s, 2 workers {tp:6.2f} s: speed-up {t_one / tp:.2f}x (ideal 2x)")
        print(f"  process pool: {over(tp) * 1e3:6.1f} ms a point ({over(tp):.1%} of 1 s; pool start-up included)")
        if args.skip_ray or not sw.ray_available():
            print("ray: skipped" + ("" if args.skip_ray else " (Ray is not installed: pip install 'draftsim[ray]')"))
            return
        t0 = time.perf_counter()
        ray, _ = sw.start_ray(None, slots)
        t_start = time.perf_counter() - t0
        cold, _ = timed_sweep(sleep, SLEEP, tmp / "ray-cold", workers=slots, ray=True)
        warm, _ = timed_sweep(sleep, SLEEP, tmp / "ray-warm", workers=slots, ray=True)
        ray.shutdown()
        print(f"  ray, warm workers: {warm:6.2f} s -> {over(warm) * 1e3:6.1f} ms a point ({over(warm):.1%} of 1 s; goal <= 10%)")
        print(f"  ray, first sweep : {cold:6.2f} s -> {over(cold) * 1e3:6.1f} ms a point ({over(cold):.1%}; Ray's worker processes "
              f"start); ray.init {t_start:.1f} s, once per run  {load()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
