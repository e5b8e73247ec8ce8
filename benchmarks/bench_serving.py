"""Benchmark of the serving simulator (sim.serving).

The reference run: one simulated hour at 10 requests/s (Poisson), 512-token prompts and
256-token outputs, fixed k = 4 under Bernoulli α = 0.8, Llama-2-7B drafted by SmolLM2-135M on
one H100 (roofline costs). Budget (issue 39): ≤ 5 s CPU per simulated hour (≥ 1.8M simulated
tokens/s); R replicas at R × the load ≤ 1.3 R × one replica's CPU. Then how the cost grows with
the load (open loop, 5 simulated minutes per rate), with the batch size (closed loop: N clients
keep N requests in the system) and with the replicas (R replicas at R × 10 req/s, round-robin
and least-outstanding), whether a window equals stepping one step at a time bit for bit over
random configurations, and where the time goes (cProfile, top functions).

The cost is per *window* (:mod:`draftsim.sim.serving.window`): a window is a few dozen numpy
calls whatever its steps and lanes. In open loop a window folds in the arrivals it foresees
(up to ``FOLD_ARRIVALS``, in two to four passes: ``window.fold``) where the scheduler would
admit them whole, and ends at the first it cannot; so at low load the cost follows the
arrivals, at high load the steps, and it grows slowly with the batch (the arrays get wider).
A replica's window does not end at another replica's arrivals (round-robin: it knows which
are its own; least-outstanding: an arrival routed to it reaches it while its window is under
way), so the cost grows linearly with R. Round-robin replicas fold their own arrivals as one
replica does (R replicas at R times the load cost about R times one). Least-outstanding ones
cannot foresee theirs: an arrival's replica is the one with the fewest unfinished requests at
its arrival, which depends on every replica's finishes up to then. Guessing the routes ahead
does not pay (predicting the next arrival's replica from the windows under way is right 95% of
the time, four arrivals ahead 58%; folding predicted arrivals cost 1.4/1.7/2.1x at 2/4/8
replicas). Instead the window under way **takes the arrival in when it comes** (``window.admit``):
where the scheduler would admit it whole at the next step boundary (a second arrival in a step
too, under FCFS), its lane and prefill are added to the window's sums in place and only the steps
it changes are priced anew (the steps before it do not move; its lane's (W, B) columns are drawn
once, when the window is committed: ``window.settle``; a test holds each result equal to the
window computed anew, array for array), and the window goes on; else the arrival cuts the
window, as before. Once the lanes a window was computed with have finished, a lane taken in
lengthens the window to its own last drawn round (``window._horizon``: the steps beyond are the
taken-in lanes' alone), so a window no longer ends with its longest lane: at 8 replicas 99.8% of
the arrivals are taken in and a window ends about every 37 arrivals (at ``WINDOW_MAX`` steps or
at an arrival it cannot take in). Least-outstanding then costs about what round-robin does per
arrival: 0.95-1.03, 1.00-1.05, 1.05-1.08x linear at 2, 4, 8 replicas over four runs, best of 2
each (it was 1.56-1.71x, and 1.74-1.98x with a window per arrival). Each taking-in costs ~70 us
(the two cost models over the ~76 steps its lane decodes in, ~40 us with building their sums;
adding its lane's sums and blocks, ~30 us) against one replica's fold of ~7 arrivals a window;
a router's question costs ~1 us a replica an arrival, the one cost that grows with R. Trees are
taken in alike (every lane's drafter makes the same calls of the same tokens: 0.85x linear at 4
replicas); a drafter whose calls differ between lanes (a pruned tree, a capped context) is not:
its window is made anew at each arrival, and not lengthened.

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


def same_run(a, b) -> bool:
    """Two runs' requests, steps, inter-token latencies and counters are equal bit for bit."""
    fields = ("arrival", "admitted", "first_token", "finish", "rounds", "preemptions", "prefills")
    if not all(np.array_equal(getattr(a, f), getattr(b, f)) for f in fields):
        return False
    oa, ob = (np.argsort(x.steps["replica"], kind="stable") for x in (a, b))
    if not all(np.array_equal(a.steps[k][oa], b.steps[k][ob]) for k in a.steps):
        return False
    return np.array_equal(np.sort(a.itl), np.sort(b.itl)) and all(np.array_equal(v, b.spec[k], equal_nan=True) for k, v in a.spec.items())


def random_config(rng: np.random.Generator):
    """A random small serving setup (policy, costs, controller, scheduler, KV pool, cache layout,
    arrivals, replicas, router) and its workload."""
    from draftsim.sim.controllers import parse_controller
    from draftsim.sim.cost import CallCost
    from draftsim.sim.serving import SchedulerConfig
    from draftsim.sim.serving.layout import RaggedLayout
    from draftsim.sim.serving.workload import parse_lengths

    pols = [(policies.Autoregressive(), acceptance.Bernoulli(0.8)), (policies.FixedK(3), acceptance.Bernoulli(0.7)),
            (policies.Threshold(0.5, k_max=6), acceptance.MarkovModulated([[0.9, 0.1], [0.3, 0.7]], [0.9, 0.4], pred_noise=0.3)),
            (policies.Heuristic(2, 8), acceptance.Positional([0.9, 0.8, 0.6]))]
    pol, process = pols[rng.integers(len(pols))]
    base = config()
    target, drafter = (base.target, base.drafters[0]) if rng.random() < 0.5 else (CallCost(0.02, 1e-4), CallCost(0.002))
    controller = "none" if pol.n_models == 1 else ["none", "disable:above=3", "table:k=1-2:3,3-:1", "goodput"][rng.integers(4)]
    chunked, budget = bool(rng.random() < 0.5), int(rng.integers(256, 4096))
    layout = [None, RaggedLayout(0.5, 64), RaggedLayout(0.2, 8)][rng.integers(3)]
    arrivals = ["poisson", "closed", "closed-think"][rng.integers(3)]
    cfg = ServingConfig(pol, process, target, [drafter] * (pol.n_models - 1), controller=parse_controller(controller),
                        kv_tokens=[1 << 20, 1500, 6000][rng.integers(3)], replicas=int(rng.integers(1, 4)),
                        router=["round-robin", "least-outstanding"][rng.integers(2)], layout=layout,
                        scheduler=SchedulerConfig(max_num_seqs=int(rng.integers(1, 25)), max_num_batched_tokens=budget,
                                                  chunked_prefill=chunked, policy=["fcfs", "priority"][rng.integers(2)]))
    arr = {"poisson": Poisson(), "closed": ClosedLoop(4), "closed-think": ClosedLoop(6, 0.05)}[arrivals]
    prompt_max = 600 if chunked else min(600, budget - 120)
    wl = make_workload(arrivals=arr, qps=float(rng.uniform(2, 120)) if arrivals == "poisson" else None, requests=40, duration=None,
                       prompt=parse_lengths(f"uniform:1,{prompt_max}"), output=parse_lengths("uniform:1,120"),
                       rng=np.random.default_rng(int(rng.integers(1 << 31))), priorities=3)
    return cfg, wl, (arr if arrivals != "poisson" else None)


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
    per_hour = cpu * 3600 / hour
    print(f"reference: {hour / 3600:g} simulated hour(s) at 10 req/s, 512/256 tokens, fixed k=4, Bernoulli 0.8, "
          f"{cfg.target.name} + {cfg.drafters[0].name}")
    print(f"  {len(wl):,} requests, {tokens:,} output tokens, {s['steps']:,} steps, mean batch {s['mean_batch']:.1f}, "
          f"TPOT {s['tpot']['mean'] * 1e3:.2f} ms, E2E p99 {s['e2e']['p99'] * 1e3:.0f} ms")
    print(f"  CPU {cpu:.2f} s (wall {wall:.2f} s): {per_hour:.2f} s per simulated hour (budget 5: {'OK' if per_hour <= 5 else 'OVER'}), "
          f"{tokens / cpu:,.0f} simulated tokens/s (budget 1.8M: {'OK' if tokens / cpu >= 1.8e6 else 'UNDER'}), "
          f"{s['steps'] / cpu:,.0f} steps/s")

    repeats = 1 if args.quick else 2
    print(f"\ncost against replicas (open loop, R replicas at R x 10 req/s, 300 simulated seconds, best CPU of {repeats}; "
          "ratio = CPU / (R x one replica's); budget <= 1.3):")
    print(f"  {'router':>17} {'replicas':>8} {'requests':>9} {'steps':>8} {'mean batch':>10} {'CPU s':>7} {'ratio':>6}")
    worst = 0.0
    for router in ("round-robin", "least-outstanding"):
        one = None
        for replicas in (1, 2, 4, 8):
            rcfg = dataclasses.replace(cfg, replicas=replicas, router=router)
            w = open_loop(10.0 * replicas, 300.0, seed=4)
            r, c, _ = timed(rcfg, w)
            for _ in range(repeats - 1):  # the machine may be shared: the least disturbed run
                c = min(c, timed(rcfg, w)[1])
            st = summarize_run(r)
            one = c if one is None else one
            ratio = c / (replicas * one)
            worst = max(worst, ratio)
            print(f"  {router:>17} {replicas:8d} {len(w):9,} {st['steps']:8,} {st['mean_batch']:10.1f} {c:7.2f} {ratio:6.2f}")
    print(f"  worst ratio {worst:.2f} ({'OK' if worst <= 1.3 else 'OVER'})")

    configs = 8 if args.quick else 24
    rng = np.random.default_rng(39)
    same = 0
    for _ in range(configs):
        rcfg, w, arr = random_config(rng)
        same += same_run(serve(rcfg, w, seed=1, arrivals=arr), serve(dataclasses.replace(rcfg, window_max=1), w, seed=1, arrivals=arr))
    print(f"\nwindow == step-by-step (window_max=1) over {configs} random configurations (policies, linear/roofline costs, controllers, "
          f"scheduler limits, KV pools, cache layouts, open/closed loop, 1-3 replicas, both routers): {same}/{configs} bit-identical")

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
