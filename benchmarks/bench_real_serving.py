"""Real batched serving held to the serving simulator, and where speculation pays on this machine.

    python benchmarks/bench_real_serving.py [--out DIR] [--threads 1] [--requests 20] [--output-len 32]
                                            [--profile PROFILE.json] [--skip fidelity,batching,sweep]
                                            [--device cpu|cuda] [--dtype float32|bfloat16] [--repeats 3]
                                            [--drafter controlled:0.8@MODEL --k 4] [--static-cache] [--hardware HW]

Every run is a ``draftsim`` command (printed before it runs), so each number can be
reproduced alone. Steps:

1. **profile** — two ``draftsim profile --path server`` of the target on this machine (the
   serving loop's own forward call): the steps' (every batch size to 16, few new tokens,
   cache widths to 768) and the prefills' (batch 1, up to 512 tokens); unless ``--profile``;
2. **plan** — the draft length k for Max-Gram from the planner (:func:`draftsim.sim.plan.plan`): α =
   Max-Gram's greedy match rate with SmolLM2 in the embedded trace, c = Max-Gram's proposal
   time per token (the profile) over the target's one-token call, and the target's
   verification cost v(n) = t(n)/t(1) at batch 1 from the profile;
3. **capacity** — a saturated run (every request at t = 0) of speculative serving gives the
   request rate the server sustains;
4. **fidelity** — speculative serving at three loads (0.25, 0.6 and 1.5 × capacity: light to
   saturated), each checked with ``draftsim check-serve --profile``: relative errors of TTFT,
   TPOT, E2E (p50, p90) and throughput; the goals: median over {TTFT p50, TPOT p50, E2E p50,
   throughput} ≤ 5%, each of them ≤ 10%, p90s ≤ 15%;
5. **batching** — throughput at saturation against single-stream decoding (``--max-batch 1``)
   of the same requests, autoregressive and speculative (goal: ≥ 2×);
6. **sweep** — a QPS sweep with and without speculation, real and predicted side by side:
   the speedup of speculation (E2E p50 without / with, and throughput with / without) against
   load, and where it crosses 1 (figure ``serving_crossover.png``).

The speculative runs draft with Max-Gram unless ``--drafter`` names another (then ``--k`` is
required: the planner's α and c are Max-Gram's); ``--static-cache`` serves through static caches
and profiles that path (``profile --path server-static``); ``--hardware HW`` also checks every
fidelity run against the catalog roofline of ``--model`` on HW with engine overheads and no
measurement (``check-serve --hardware``). ``benchmarks/gpu_fidelity.py`` runs this with the
controlled drafter on random-weight catalog models for the GPU study.

Prints tables; writes ``results.json`` and the figure to ``--out``. The CPU may be shared:
``uptime`` is printed with every table, and the numbers are only as steady as the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DRAFTSIM = [sys.executable, "-m", "draftsim.cli"]


def sh(args: list[str], log) -> dict:
    """Run a draftsim command with --json; print it; return its JSON."""
    cmd = ["draftsim", *args]
    print("$ " + " ".join(shlex.quote(a) for a in cmd), flush=True)
    t0 = time.time()
    out = subprocess.run([*DRAFTSIM, *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"command failed ({out.returncode}): {out.stderr.strip()}")
    log.append({"command": " ".join(cmd), "seconds": time.time() - t0})
    return json.loads(out.stdout)


def whole(summary: dict) -> dict:
    """The rates of a saturated run (every request at once) over the whole run, first arrival to
    last finish: a burst has no steady state, and its window (the few milliseconds its arrivals
    span) holds no finished token, so the steady-state rates read 0."""
    return summary.get("whole_run") or summary


#: Models loaded by the runs of ``--in-process`` (draftsim.commands.serve.serve's ``models``): weights,
#: static caches and CUDA graphs kept from one run to the next.
MODELS: dict = {}


def serve_json(a, args: list[str], log) -> dict:
    """A ``draftsim serve ... --json`` run: its own process, or (``--in-process``) a call in this
    one that keeps the models it loaded for the next (the same options, parsed by draftsim's own
    parser)."""
    if not a.in_process:
        return sh(args, log)
    from draftsim.cli import build_parser
    from draftsim.commands.serve import ServeConfig, serve
    from draftsim.config import from_namespace

    cmd = ["draftsim", *args]
    print("$ " + " ".join(shlex.quote(x) for x in cmd) + "    # in this process", flush=True)
    t0 = time.time()
    out = serve(from_namespace(ServeConfig, build_parser().parse_args(args)), models=MODELS).to_dict()
    log.append({"command": " ".join(cmd), "seconds": time.time() - t0, "in_process": True})
    return json.loads(json.dumps(out, default=float))


def uptime() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def serve_args(a, qps: float, drafter: str, policy: str, trace: Path | None, max_batch: int | None = None) -> list[str]:
    args = ["serve", "--model", a.model, "--qps", f"{qps:g}", "--requests", str(a.requests), "--output-len", f"fixed:{a.output_len}",
            "--max-batch", str(max_batch or a.max_batch), "--seed", str(a.seed), "--drafter", drafter, "--policy", policy, "--json"]
    if a.threads:
        args += ["--threads", str(a.threads)]
    args += device_args(a)
    if a.static_cache:
        args += ["--static-cache"]
    if trace is not None:
        args += ["--trace", str(trace)]
    return args


def device_here(device: str | None) -> bool:
    """Whether this machine has ``device`` (a CUDA device, or the CPU)."""
    if not device or not device.startswith("cuda"):
        return True
    import torch

    return torch.cuda.is_available()


def device_args(a) -> list[str]:
    """``--device``/``--dtype`` for every command that runs the model (omitted: the command's default)."""
    return [*(["--device", a.device] if a.device else []), *(["--dtype", a.dtype] if a.dtype else [])]


def fresh(path: Path, reuse: bool = False) -> Path | None:
    """A new trace folder; with ``reuse``, None when a complete trace is already there."""
    if reuse and (path / "manifest.json").exists():
        from draftsim.realrun.servetrace import ServeTrace

        if ServeTrace(path).complete:
            return None
    if path.exists():
        import shutil

        shutil.rmtree(path)
    return path


def served(a, trace: Path, qps: float, drafter: str, policy: str, log) -> dict:
    """Serve into ``trace`` (``--reuse``: keep a complete trace there and read its metrics)."""
    if fresh(trace, a.reuse) is None:
        from draftsim.realrun.servetrace import ServeTrace, serving_metrics

        t = ServeTrace(trace)
        print(f"(reusing {trace})")
        return serving_metrics(*(t.records(x) for x in ("requests", "tokens", "members", "steps")))
    return serve_json(a, serve_args(a, qps, drafter, policy, trace), log)


def static_grid(batch: str, new: str, context: str) -> tuple[str, str, str]:
    """The step profile's grid for a static cache, which computes padded shapes only
    (:func:`draftsim.sim.cost.profile.static_shape`): batches and new tokens at their powers of two,
    and per attention width from 16 to the one the largest context reaches one context, ``width -
    largest new tokens``, whose call pads to that width at every new-token count. ``check-serve``
    prices each step at the grid point of its padded shape, so other points are repeats. The H200
    float32 study's 378-point grid (batches 24 and 48, 3 and 6 new tokens, contexts every 128) did
    not finish in 537 s; this one has 192 points (6 batches × 4 new-token counts × 8 widths)."""
    from draftsim.sim.cost.profile import STATIC_MIN_WIDTH, pow2

    def ints(text):
        return [int(x) for x in text.split(",") if x.strip()]

    batches = sorted({int(pow2(b)) for b in ints(batch)})
    news = sorted({int(pow2(n)) for n in ints(new)})
    top = int(pow2(max(ints(context)) + news[-1]))
    # context 0 runs at the smallest width each new-token count pads to; every wider one, w - the most new tokens
    # (pads to w at every count, as w/2 < w - most + 1 once w > 2 x most - 2)
    contexts, w = [0], 2 * max(STATIC_MIN_WIDTH, news[-1])
    while w <= top:
        contexts.append(w - news[-1])
        w *= 2
    return ",".join(map(str, batches)), ",".join(map(str, news)), ",".join(map(str, contexts))


def check(a, trace: Path, log, profile: bool | str = True) -> dict:
    """check-serve of a trace: costs from the profile, (``profile=False``) fitted to the run's own
    calls, or (``profile="roofline"``/``"operators"``) the catalog rooflines or the operator model
    with engine overheads on ``--hardware``."""
    given = ["--profile", str(a.profile)] + [x for p in (a.prefill_profile, getattr(a, "drafter_prefill_profile", None)) if p
                                              for x in ("--prefill-profile", str(p))]
    if getattr(a, "draft_profile", None):
        given += ["--draft-profile", str(a.draft_profile)]
    if profile in ("roofline", "operators"):
        given = ["--hardware", a.hardware, "--dtype", a.dtype or "float32", "--cost-model", profile]
    out = sh(["check-serve", str(trace), *(given if profile else []), "--json"], log)
    return {r["metric"]: r for r in out}


def error_table(fid: list, key: str) -> tuple[str, dict]:
    rows = []
    for f in fid:
        rows.append([f["load"], f["qps"], f["real"]["mean_batch"]] + [100 * f[key][m]["relative_error"] for m in
                    ("ttft_p50", "tpot_p50", "e2e_p50", "throughput", "ttft_p90", "tpot_p90", "e2e_p90")])
    text = table(rows, ["load", "qps", "batch", "TTFT p50", "TPOT p50", "E2E p50", "thru", "TTFT p90", "TPOT p90", "E2E p90"])
    p50 = [abs(f[key][m]["relative_error"]) for f in fid for m in ("ttft_p50", "tpot_p50", "e2e_p50", "throughput")]
    p90 = [abs(f[key][m]["relative_error"]) for f in fid for m in ("ttft_p90", "tpot_p90", "e2e_p90")]
    summary = {"median_p50_and_throughput": float(np.median(p50)), "worst_p50_and_throughput": float(max(p50)), "worst_p90": float(max(p90))}
    text += (f"\nmedian |error| over TTFT/TPOT/E2E p50 and throughput: {100 * summary['median_p50_and_throughput']:.1f}% (goal 5%), "
             f"worst {100 * summary['worst_p50_and_throughput']:.1f}% (goal 10%), worst p90 {100 * summary['worst_p90']:.1f}% (goal 15%)")
    return text, summary


REPEATED = ("ttft_p50", "tpot_p50", "e2e_p50", "throughput")
#: The fidelity loads, as multiples of the capacity: light, medium, saturated.
LOADS = (("light", 0.25), ("medium", 0.6), ("saturated", 1.5))


def measure(a, out: Path, capacity: float, policy: str, log, results: dict) -> None:
    """``--measure-only``: every fidelity trace (each load, each repeat) served and kept, nothing
    checked; ``measured.json`` says how to check them later (the capacity the loads were set from). It
    is written first, so a run stopped by a time limit resumes (``--reuse --capacity C``) without
    serving the saturated run again."""
    results["measure_only"] = {"capacity": capacity, "policy": policy,
                               "check_later": f"--reuse --capacity {capacity!r} --skip batching,sweep (and this run's other options)"}
    (out / "measured.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    for i in range(a.repeats):
        b = argparse.Namespace(**{**vars(a), "seed": a.seed + i})
        for name, f in LOADS:
            trace = out / (f"trace-{name}" + (f"-r{i}" if i else ""))
            real = served(b, trace, f * capacity, a.drafter, policy, log)
            print(f"served {trace.name}: {f * capacity:.3f} req/s, {real['throughput']:.1f} tokens/s, mean batch "
                  f"{real['mean_batch']:.2f} (load {uptime()})", flush=True)
    results["uptime_end"] = uptime()
    (out / "measured.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    print(f"measured only: check later with --reuse --capacity {capacity!r}; {out / 'measured.json'}")


def repeats_table(reps: dict) -> tuple[str, dict]:
    """Per load and metric: the mean of the repeats' measurements, their spread ((max − min) /
    mean), and the error of the mean prediction against the mean measurement."""
    rows, errors, spreads = [], [], []
    for load, runs in reps.items():
        for m in REPEATED:
            meas = np.array([r["check"][m]["measured"] for r in runs])
            pred = np.array([r["check"][m]["predicted"] for r in runs])
            err = pred.mean() / meas.mean() - 1.0
            spread = (meas.max() - meas.min()) / meas.mean()
            rows.append([load, m, meas.mean(), 100 * spread, pred.mean(), 100 * err])
            errors.append(abs(err))
            spreads.append(spread)
    text = table(rows, ["load", "metric", "measured (mean)", "repeats' spread %", "predicted (mean)", "error vs mean %"])
    summary = {"median_error_vs_mean": float(np.median(errors)), "worst_error_vs_mean": float(max(errors)),
               "median_spread": float(np.median(spreads)), "worst_spread": float(max(spreads))}
    text += (f"\nerror against the mean of the repeats: median {100 * summary['median_error_vs_mean']:.1f}%, worst "
             f"{100 * summary['worst_error_vs_mean']:.1f}%; the repeats' own spread: median {100 * summary['median_spread']:.1f}%, "
             f"worst {100 * summary['worst_spread']:.1f}%")
    return text, summary


def table(rows: list[list], headers: list[str]) -> str:
    from draftsim.analysis.table import format_table

    return format_table(headers, rows, floatfmt=".3f")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--drafter", default="maxgram", help="the speculative runs' drafter (default maxgram; e.g. "
                   "controlled:0.8@random:llama-3.2-1b: prescribed acceptance, each draft token a batched forward of the cost model; "
                   "other than maxgram, give --k)")
    p.add_argument("--static-cache", action="store_true", help="serve through static caches (CUDA graphs on a GPU) and profile "
                   "that path (profile --path server-static)")
    p.add_argument("--hardware", help="also price every checked run by the catalog roofline of --model on this catalog hardware, "
                   "with engine overheads and no measurement (check-serve --hardware): its error beside the profile's")
    p.add_argument("--out", default=str(ROOT / "figures" / "real-serving"))
    p.add_argument("--profile", help="the server-path profile of the steps (default: taken here)")
    p.add_argument("--prefill-profile", help="the server-path profile of the prefills (default: taken here, unless --profile)")
    p.add_argument("--profile-batch", default=",".join(str(b) for b in range(1, 17)), help="batch sizes of the step profile taken here")
    p.add_argument("--profile-context", default="0,128,256,384,512,768", help="contexts of the step profile taken here: up to "
                   "the longest a step attends over (prompt, output and draft; check-serve says when a run attends past it)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", help="cpu, cuda[:N] or auto, passed to every serve and profile (default: theirs)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="weights and activations for serve and profile (default float32)")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", type=int, help="Max-Gram draft length (default: the planner's)")
    p.add_argument("--sweep", default="0.15,0.3,0.6,1.0,1.5", help="sweep loads as multiples of the capacity")
    p.add_argument("--skip", default="", help="steps to skip: fidelity, batching, sweep")
    p.add_argument("--reuse", action="store_true", help="keep complete traces already in --out (re-check them only)")
    p.add_argument("--repeats", type=int, default=1, help="serve each fidelity load this many times (seeds seed, seed+1, ...): "
                   "errors against the mean of the repeats, with their own spread beside them (default 1)")
    p.add_argument("--in-process", action="store_true", help="serve every run in this process, the models loaded once (their "
                   "static caches and CUDA graphs kept): on an H200 a serving process took 75-90 s before its first request")
    p.add_argument("--measure-only", action="store_true", help="serve and profile only (no check-serve): on a lent GPU, whose "
                   "time is short; check the traces later on any machine with --reuse --capacity C (printed and in measured.json)")
    p.add_argument("--operators", action="store_true", help="with --hardware: also price every checked run by the operator model "
                   "(check-serve --hardware HW --cost-model operators; needs the operators extra)")
    p.add_argument("--capacity", type=float, help="requests/s the server sustains (default: measured by a saturated run)")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    log: list = []
    results: dict = {"commands": log, "uptime_start": uptime()}
    print(f"load average at start: {results['uptime_start']}")

    # 1. profile
    if a.profile is None:
        # two profiles of the server's forward: the steps' (every batch size: a CPU forward's time
        # is not smooth in its token rows — 16 rows cost less than 15, 22 and 26 more than 24 —,
        # so interpolating between batch sizes missed by 10-50%; few new tokens, as verification
        # feeds k + 1, each of them measured: the time steps between 3 and 4 tokens) and the
        # prefills' (batch 1, long calls, their last-row table). Contexts every 128 to 512 and
        # 768: the server's cache grows stale slots up to twice its longest context before a
        # compaction, and a CPU forward's cost is not linear between 128 and 512 (a 512 point
        # alone overpriced widths near 350 by ~12%)
        # Through a static cache the prefills are profiled as the server runs them (path server-prefill: eager, a fresh
        # one-row cache; the graphed server-static calls priced the H200's 24-28 ms short a joiner), up to the 1,024 tokens the
        # bundled prompts (up to ~880 tokens) pad to, and so is the drafter model's read of each prompt, which the server
        # times inside the prefill (a controlled drafter's cost model)
        a.profile, a.prefill_profile = str(out / "profile.json"), str(out / "profile-prefill.json")
        a.drafter_prefill_profile = a.draft_profile = None
        batch, new, context = a.profile_batch, "1,2,3,4,6,8", a.profile_context
        prefill_tokens = "1,2,4,8,16,32,48,64,96,128,192,256,384,512"
        step_path = prefill_path = "server"
        if a.static_cache:
            batch, new, context = static_grid(batch, new, context)
            prefill_tokens, step_path, prefill_path = prefill_tokens + ",768,1024", "server-static", "server-prefill"
        prefill_grid = ["--batch", "1", "--new-tokens", prefill_tokens, "--context", "0", "--repeats", "5"]
        grids = [(a.profile, a.model, step_path, ["--batch", batch, "--new-tokens", new, "--context", context, "--repeats", "3"]),
                 (a.prefill_profile, a.model, prefill_path, prefill_grid)]
        drafter_model = a.drafter.partition("@")[2] if a.drafter.startswith("controlled") else None
        if a.static_cache and drafter_model:
            a.drafter_prefill_profile = str(out / "profile-prefill-drafter.json")
            grids.append((a.drafter_prefill_profile, drafter_model, prefill_path, prefill_grid))
        if drafter_model:  # its batched calls, one token each (check-serve --draft-profile): on the H200 3.8 ms at 1 row, 17 at 32
            dbatch, dnew, dcontext = static_grid(a.profile_batch, "1,2", a.profile_context) if a.static_cache else (
                a.profile_batch, "1,2", a.profile_context)
            a.draft_profile = str(out / "profile-drafter.json")
            grids.append((a.draft_profile, drafter_model, step_path, ["--batch", dbatch, "--new-tokens", dnew, "--context", dcontext,
                                                                      "--repeats", "3"]))
        for path, model, kind, grid in grids:
            if not Path(path).exists() and path in (a.drafter_prefill_profile, a.draft_profile) and not device_here(a.device):
                # checking here what a GPU measured before these profiles were taken: priced without them, said
                print(f"(no {Path(path).name}: it was not measured, and {a.device} is not on this machine; checked without it)")
                a.drafter_prefill_profile = None if path == a.drafter_prefill_profile else a.drafter_prefill_profile
                a.draft_profile = None if path == a.draft_profile else a.draft_profile
                continue
            if not Path(path).exists():
                args = ["profile", "--model", model, "--path", kind, "--out", path, *grid, "--json"]
                if a.threads:
                    args += ["--threads", str(a.threads)]
                sh(args + device_args(a), log)
    from draftsim.sim.cost import load_profile

    prof = load_profile(a.profile, extrapolate="clamp")

    # 2. plan
    if a.drafter != "maxgram" and a.k is None:
        raise SystemExit(f"--drafter {a.drafter}: give --k (the planner's alpha and c are Max-Gram's)")
    from draftsim.sim.plan import PlannedDrafter, plan
    from draftsim.sim.traces import EMBEDDED_TRACE, Trace

    pairs = {(x["proposer"], x["verifier"]): x for x in Trace(EMBEDDED_TRACE).summary()["pairs"]}
    alpha = float(pairs[("maxgram", "target")]["greedy_match_rate"])
    per_token = float(prof.drafters.get("maxgram", {}).get("seconds_per_token", 0.0))
    c = per_token / float(prof.shape_time(1, 1, 128))
    # the target's verification cost v(n) = t(n)/t(1) from the profile (batch 1, context 128, n inside its grid)
    n = np.arange(1, min(17, max(prof.new_tokens)) + 1)
    t = prof.shape_time(1, n, 128)
    verify = (t / t[0]).tolist()
    best = [s for s in plan([PlannedDrafter("maxgram", alpha, c)], k_max=16, verify=verify) if s.kind in ("sd", "autoregressive")][0]
    k = a.k or int(best.params["k"])
    if a.drafter != "maxgram":
        results["plan_note"] = f"k = {k} given (--k); the plan above is Max-Gram's, not {a.drafter}'s"
    policy = f"fixed:k={k}"
    results["plan"] = {"alpha": alpha, "c": c, "verify": verify, "k": k, "ewif": best.ewif}
    print(f"planner: Max-Gram alpha {alpha:.3f} (embedded trace), c {c:.4f}, target v(2..4) = "
          f"{', '.join(f'{x:.2f}' for x in verify[1:4])} -> k = {k} (EWIF {best.ewif:.3f}); policy {policy}")
    if k == 0:
        raise SystemExit("the planner says speculation does not pay at all here (k = 0); pass --k to measure it anyway")

    # 3. capacity: every request at once
    sat = None
    if a.capacity is None or "batching" not in skip:
        sat = serve_json(a, serve_args(a, 1000.0, a.drafter, policy, None), log)
        print(f"saturated speculative serving: {whole(sat)['throughput']:.2f} tokens/s, {whole(sat)['request_throughput']:.3f} requests/s "
              f"(load {uptime()})")
    capacity = a.capacity or whole(sat)["request_throughput"]
    results["capacity"] = {"request_throughput": capacity, "throughput": whole(sat)["throughput"] if sat else None, "uptime": uptime()}

    # 4. fidelity at three loads
    if "fidelity" not in skip:
        if a.measure_only:
            measure(a, out, capacity, policy, log, results)
            return 0
        fid = []
        for name, f in LOADS:
            trace = out / f"trace-{name}"
            real = served(a, trace, f * capacity, a.drafter, policy, log)
            fid.append({"load": name, "qps": f * capacity, "real": real, "check": check(a, trace, log),
                        "check_fit": check(a, trace, log, profile=False), "uptime": uptime()})
            if a.hardware:
                fid[-1]["check_roofline"] = check(a, trace, log, profile="roofline")
                if a.operators:
                    fid[-1]["check_operators"] = check(a, trace, log, profile="operators")
        results["fidelity"] = {"runs": fid}
        kinds = [("check", f"costs from the profile {a.profile}"), ("check_fit", "costs fitted to each run's own calls (in-sample)")]
        if a.hardware:
            kinds.append(("check_roofline", f"the catalog roofline with engine overheads on {a.hardware} (no measurement)"))
            if a.operators:
                kinds.append(("check_operators", f"the operator model with engine overheads on {a.hardware} (no measurement of this device)"))
        for key, what in kinds:
            text, summary = error_table(fid, key)
            print(f"\nfidelity, {what} (relative error %, predicted vs measured; load {uptime()})")
            print(text)
            results["fidelity"][key] = summary
        if a.repeats > 1:
            reps = {f["load"]: [f] for f in fid}
            for i in range(1, a.repeats):
                b = argparse.Namespace(**{**vars(a), "seed": a.seed + i})
                for name, f in LOADS:
                    trace = out / f"trace-{name}-r{i}"
                    real = served(b, trace, f * capacity, a.drafter, policy, log)
                    reps[name].append({"load": name, "qps": f * capacity, "real": real, "check": check(b, trace, log), "uptime": uptime()})
            text, summary = repeats_table(reps)
            print(f"\nfidelity over {a.repeats} repeats per load (costs from the profile; load {uptime()})")
            print(text)
            results["fidelity"]["repeats"] = {"n": a.repeats, **summary, "runs": {k: [r["check"] for r in v] for k, v in reps.items()}}

    # 5. batching pays
    if "batching" not in skip:
        rows = []
        bat = {}
        for label, drafter, pol in (("autoregressive", "none", "ar"), (f"{a.drafter} {policy}", a.drafter, policy)):
            batched = sat if drafter == a.drafter else serve_json(a, serve_args(a, 1000.0, drafter, pol, None), log)
            single = serve_json(a, serve_args(a, 1000.0, drafter, pol, None, max_batch=1), log)
            ratio = whole(batched)["throughput"] / whole(single)["throughput"]
            bat[label] = {"batched": whole(batched)["throughput"], "single": whole(single)["throughput"], "ratio": ratio}
            rows.append([label, whole(single)["throughput"], whole(batched)["throughput"], ratio])
        print(f"\nbatching at saturation (output tokens/s; goal >= 2x; load {uptime()})")
        print(table(rows, ["decoding", "single stream", f"batched (max {a.max_batch})", "ratio"]))
        results["batching"] = bat

    # 6. sweep
    if "sweep" not in skip:
        loads = [float(x) for x in a.sweep.split(",")]
        sweep = []
        for f in loads:
            point = {"load": f, "qps": f * capacity}
            for label, drafter, pol in (("spec", a.drafter, policy), ("ar", "none", "ar")):
                trace = out / f"sweep-{label}-{f:g}"
                real = served(a, trace, f * capacity, drafter, pol, log)
                cmp = check(a, trace, log)
                fit = check(a, trace, log, profile=False)
                point[label] = {"real": {m: cmp[m]["measured"] for m in cmp}, "predicted": {m: cmp[m]["predicted"] for m in cmp},
                                "fitted": {m: fit[m]["predicted"] for m in fit}, "mean_batch": real["mean_batch"]}
            point["uptime"] = uptime()
            sweep.append(point)
        rows = []
        for s in sweep:
            r = [s["load"], s["qps"], s["spec"]["real"]["e2e_p50"], s["ar"]["real"]["e2e_p50"]]
            for src in ("real", "predicted", "fitted"):
                r.append(s["ar"][src]["e2e_p50"] / s["spec"][src]["e2e_p50"])
            for src in ("real", "predicted", "fitted"):
                r.append(s["spec"][src]["throughput"] / s["ar"][src]["throughput"])
            rows.append(r)
        print(f"\nspeculation against load: speedup = E2E p50 without / with, throughput with / without; predicted = costs "
              f"from the profile, fitted = costs fitted to each run (in-sample) (load {uptime()})")
        print(table(rows, ["load x cap", "qps", "E2E spec", "E2E ar", "speedup real", "predicted", "fitted", "thru real",
                           "predicted", "fitted"]))
        results["sweep"] = sweep
        figure(sweep, out / "serving_crossover.png", policy, prof.device or "cpu")
    results["uptime_end"] = uptime()
    with open(out / "results.json", "w") as fh:
        json.dump(results, fh, indent=1, default=float)
    print(f"\nresults: {out / 'results.json'}")
    return 0


def figure(sweep: list, path: Path, policy: str, device: str = "cpu") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qps = [s["qps"] for s in sweep]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for label, style in (("spec", "-"), ("ar", "--")):
        for src, marker in (("real", "o"), ("predicted", "x"), ("fitted", "+")):
            ax.plot(qps, [s[label][src]["e2e_p50"] for s in sweep], style, marker=marker,
                    label=f"{'Max-Gram ' + policy if label == 'spec' else 'no speculation'}, {src}", ms=5)
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("E2E latency p50 (s)")
    ax.legend(fontsize=8)
    ax = axes[1]
    for src, marker in (("real", "o"), ("predicted", "x"), ("fitted", "+")):
        ax.plot(qps, [s["ar"][src]["e2e_p50"] / s["spec"][src]["e2e_p50"] for s in sweep], marker=marker,
                label={"real": "real", "predicted": "simulator, profile costs", "fitted": "simulator, costs fitted to the run"}[src])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("speedup of speculation (E2E p50 without / with)")
    ax.legend(fontsize=8)
    fig.suptitle(f"Where speculation pays: real serving vs the serving simulator (SmolLM2, {device.upper()})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"figure: {path}")


if __name__ == "__main__":
    raise SystemExit(main())
