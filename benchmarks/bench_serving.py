"""Benchmark of the serving simulator (sim.serving).

The reference run: one simulated hour at 10 requests/s (Poisson), 512-token prompts and
256-token outputs, fixed k = 4 under Bernoulli α = 0.8, Llama-2-7B drafted by SmolLM2-135M on
one H100 (roofline costs). Budget: ≤ 5 s on one core (≥ 1.8M simulated tokens/s; issue 23 — it
took 14.9 s before; 5.6 s here now, 2.10x the code at 664b25e: not yet met). Then how the cost grows with the load (open loop, 5 simulated minutes per
rate), with the batch size (closed loop: N clients keep N requests in the system) and with the
replicas (R replicas at R × 10 req/s), and where the time goes (cProfile, top functions).

The cost is per *window* (:mod:`draftsim.sim.serving.window`): a window is a few dozen numpy
calls whatever its steps and lanes, and one ends at every arrival; so at low load the cost
follows the arrivals (about one window per request), at high load the steps, and it grows
slowly with the batch (the arrays get wider). Every replica's window ends at every arrival,
its own or another's, so R replicas at R times the load cost about R² of one.

Times are CPU seconds of this process (``time.process_time``: the machine may be shared);
wall seconds are printed beside them.

    python benchmarks/bench_serving.py [--quick] [--against COMMIT]

``--against COMMIT`` also runs the reference with the simulator of an earlier commit (its
``sim/`` folder, from ``git archive``; a commit with the ``draftsim.sim`` namespace, 664b25e or
later), alternately with this one, and prints both CPU times, their ratio and whether the runs
are bit-identical.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import importlib
import importlib.resources
import io
import pstats
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from pathlib import Path

import numpy as np

import draftsim.sim
from draftsim.sim import acceptance, policies
from draftsim.sim.cost import RooflineModel, default_catalog
from draftsim.sim.serving import ServingConfig, make_workload, serve, summarize_run
from draftsim.sim.serving.workload import ClosedLoop, Fixed, Poisson


def config() -> ServingConfig:
    cat = default_catalog()
    hw = cat.hardware_spec("h100-sxm")
    target = RooflineModel(cat.model("llama-2-7b"), hw)
    drafter = RooflineModel(cat.model("smollm2-135m"), hw)
    return ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), target, [drafter])


def sim_at(commit: str):
    """The ``sim`` package of ``commit``, importable beside this one (as ``draftsim_at.sim``)."""
    root = Path(__file__).resolve().parent.parent
    tar = subprocess.run(["git", "-C", str(root), "archive", commit, "sim"], check=True, capture_output=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="draftsim-at-"))
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(folder / "draftsim_at", filter="data")
    (folder / "draftsim_at" / "__init__.py").write_text("")
    init = folder / "draftsim_at" / "sim" / "__init__.py"  # its one-tree guard refuses a second copy: this one is on purpose
    init.write_text(init.read_text().replace('if __name__ != "draftsim.sim":', "if False:"))
    sys.path.insert(0, str(folder))
    old = importlib.import_module("draftsim_at.sim")
    catalog = importlib.import_module("draftsim_at.sim.cost.catalog")
    if hasattr(catalog, "resources"):  # its catalogs are its own data files, not this checkout's (whose entries it may not read)
        own = folder / "draftsim_at" / "sim"
        catalog.resources = types.SimpleNamespace(files=lambda name: own if name == "draftsim.sim" else importlib.resources.files(name))
    return old


def reference_run(sim, hour: float):
    """The reference run with the simulator package ``sim``: its record and CPU seconds."""
    names = ("acceptance", "policies", "cost", "serving", "serving.workload")
    acc, pol, cost, srv, wlm = (importlib.import_module(f"{sim.__name__}.{n}") for n in names)
    cat = cost.default_catalog()
    hw = cat.hardware_spec("h100-sxm")
    cfg = srv.ServingConfig(pol.FixedK(4), acc.Bernoulli(0.8), cost.RooflineModel(cat.model("llama-2-7b"), hw),
                            [cost.RooflineModel(cat.model("smollm2-135m"), hw)])
    wl = srv.make_workload(arrivals=wlm.Poisson(), qps=10.0, requests=None, duration=hour, prompt=wlm.Fixed(512),
                           output=wlm.Fixed(256), rng=np.random.default_rng(0))
    c0 = time.process_time()
    run = srv.serve(cfg, wl, seed=0)
    return run, time.process_time() - c0


def against(commit: str, hour: float, repeats: int = 3) -> None:
    """The reference run then (``commit``) and now, alternately; the best CPU time of each."""
    then = sim_at(commit)
    best = {"then": np.inf, "now": np.inf}
    runs = {}
    for _ in range(repeats):
        for label, sim in (("then", then), ("now", draftsim.sim)):
            runs[label], cpu = reference_run(sim, hour)
            best[label] = min(best[label], cpu)
    same = all(np.array_equal(getattr(runs["then"], f), getattr(runs["now"], f)) for f in ("finish", "first_token", "rounds", "itl"))
    tokens = int(runs["now"].output.sum())
    print(f"against {commit} (best of {repeats}, alternately): then {best['then']:.2f} s ({tokens / best['then']:,.0f} tokens/s), "
          f"now {best['now']:.2f} s ({tokens / best['now']:,.0f} tokens/s): {best['then'] / best['now']:.2f}x; "
          f"runs bit-identical: {same}\n")


def timed(cfg, wl, arrivals=None, seed=0):
    c0, w0 = time.process_time(), time.perf_counter()
    run = serve(cfg, wl, seed=seed, arrivals=arrivals)
    return run, time.process_time() - c0, time.perf_counter() - w0


def open_loop(qps: float, duration: float, seed: int = 0):
    return make_workload(arrivals=Poisson(), qps=qps, requests=None, duration=duration, prompt=Fixed(512), output=Fixed(256),
                         rng=np.random.default_rng(seed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a simulated quarter hour instead of an hour")
    ap.add_argument("--against", metavar="COMMIT", help="also time the reference run at COMMIT (see the module docstring)")
    args = ap.parse_args()
    cfg = config()
    hour = 900.0 if args.quick else 3600.0
    if args.against:
        against(args.against, hour)
    wl = open_loop(10.0, hour)
    run, cpu, wall = timed(cfg, wl)
    s = summarize_run(run)
    tokens = int(run.output.sum())
    print(f"reference: {hour / 3600:g} simulated hour(s) at 10 req/s, 512/256 tokens, fixed k=4, Bernoulli 0.8, "
          f"{cfg.target.name} + {cfg.drafters[0].name}")
    print(f"  {len(wl):,} requests, {tokens:,} output tokens, {s['steps']:,} steps, mean batch {s['mean_batch']:.1f}, "
          f"TPOT {s['tpot']['mean'] * 1e3:.2f} ms, E2E p99 {s['e2e']['p99'] * 1e3:.0f} ms")
    print(f"  CPU {cpu:.2f} s (wall {wall:.2f} s): {tokens / cpu:,.0f} simulated tokens/s, {s['steps'] / cpu:,.0f} steps/s, "
          f"{hour / cpu:,.0f} simulated seconds per second; budget 5 s per simulated hour -> "
          f"{'OK' if cpu * 3600 / hour <= 5 else 'OVER'} ({cpu * 3600 / hour:.1f} s per hour)")

    print("\ncost against load (open loop, 300 simulated seconds each):")
    print(f"  {'qps':>5} {'requests':>9} {'steps':>8} {'mean batch':>10} {'CPU s':>7} {'CPU s/sim h':>11} {'us/step':>8} {'us/request':>10}")
    for qps in (2.0, 5.0, 10.0, 20.0, 40.0):
        w = open_loop(qps, 300.0, seed=1)
        r, c, _ = timed(cfg, w)
        st = summarize_run(r)
        print(f"  {qps:5g} {len(w):9,} {st['steps']:8,} {st['mean_batch']:10.1f} {c:7.2f} {c * 12:11.1f} {c / st['steps'] * 1e6:8.1f} "
              f"{c / len(w) * 1e6:10.0f}")

    print("\ncost against batch size (closed loop, N clients, no think time, 2000 requests):")
    print(f"  {'clients':>7} {'mean batch':>10} {'steps':>8} {'CPU s':>7} {'us/step':>8} {'us/request':>10}")
    for clients in (1, 8, 32, 128, 256):
        arr = ClosedLoop(clients)
        w = make_workload(arrivals=arr, qps=None, requests=2000, duration=None, prompt=Fixed(512), output=Fixed(256),
                          rng=np.random.default_rng(2))
        r, c, _ = timed(cfg, w, arrivals=arr)
        st = summarize_run(r)
        print(f"  {clients:7d} {st['mean_batch']:10.1f} {st['steps']:8,} {c:7.2f} {c / st['steps'] * 1e6:8.1f} {c / len(w) * 1e6:10.0f}")

    print("\ncost against replicas (open loop, R replicas at R x 10 req/s, round-robin, 300 simulated seconds):")
    print(f"  {'replicas':>8} {'requests':>9} {'steps':>8} {'mean batch':>10} {'CPU s':>7} {'us/step':>8} {'us/request':>10}")
    for replicas in (1, 2, 4):
        rcfg = dataclasses.replace(cfg, replicas=replicas)
        w = open_loop(10.0 * replicas, 300.0, seed=4)
        r, c, _ = timed(rcfg, w)
        st = summarize_run(r)
        print(f"  {replicas:8d} {len(w):9,} {st['steps']:8,} {st['mean_batch']:10.1f} {c:7.2f} {c / st['steps'] * 1e6:8.1f} "
              f"{c / len(w) * 1e6:10.0f}")

    print("\nwhere the time goes (5 simulated minutes at 10 req/s, cProfile, top 12 by own time):")
    prof = cProfile.Profile()
    w = open_loop(10.0, 300.0, seed=3)
    prof.enable()
    serve(cfg, w, seed=3)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("ncalls"))
    print("\n".join("  " + ln for ln in lines[start: start + 13]))


if __name__ == "__main__":
    main()
