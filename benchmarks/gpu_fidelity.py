"""The GPU fidelity study of issue 28, item 3, as one command: profile → serve → check-serve on a
bandwidth-bound model, writing ``figures/gpu-<device>/`` with a README.

    python benchmarks/gpu_fidelity.py [--device cuda] [--hardware h100-sxm] [--out DIR]
                                      [--target random:llama-3.1-8b] [--cost random:qwen2.5-0.5b]
                                      [--rate 0.8] [--k 4] [--requests 64] [--output-len 128]
                                      [--max-batch 32] [--repeats 3] [--dtype bfloat16]

What runs (every step a ``draftsim`` command, printed before it runs, so each number can be
reproduced alone):

1. **single stream** — ``draftsim profile --path server-static`` at batch 1 (the static cache's
   forward, as ``run --static-cache`` makes it) of the target and of the controlled drafter's cost
   model, then ``draftsim run`` (speculative, the controlled drafter, ``--static-cache``) with a trace, then ``draftsim check-sim --profile`` of that trace: predicted against measured
   tokens/s (goal: median error ≤ 3%);
2. **serving** — ``benchmarks/bench_real_serving.py`` with ``--static-cache``, the controlled
   drafter and ``--hardware``: a server-path profile of the steps and prefills, the capacity, three
   loads (light, medium, saturated) served ``--repeats`` times each and checked by
   ``check-serve`` against the profile (goal: median over TTFT, TPOT, E2E p50 and throughput ≤ 5%,
   each ≤ 10%, against the mean of the repeats) and against the catalog roofline with engine
   overheads and no measurement (reported beside it), then the QPS sweep with and without
   speculation;
3. **README** — the tables and the setup (device, versions, models, commands) in
   ``<out>/README.md``; the results as JSON beside it.

Split over calls when a call's time is bounded (a lent GPU: 10 minutes a call): ``--skip serving``
first, then ``--skip single`` (profiles already written are kept, and ``bench_real_serving.py``
runs with ``--reuse``, keeping every complete trace), as many times as it takes. Walked end to end
on this CPU (``--device cpu --target random:smollm2-135m --cost random:smollm2-135m:1 --requests 6
--output-len 16 --max-batch 4 --repeats 2``, 11 minutes); its numbers say nothing of a GPU.

The models are random-weight catalog shapes (``random:NAME``, no download): the target is
bandwidth-bound on one GPU, and the controlled drafter proposes the target's own greedy
continuation kept at ``--rate`` per position (a wrong token otherwise), each draft token a
batched forward of the cost model — real timing, known acceptance. Nothing here needs a GPU to
*run* (``--device cpu --target random:smollm2-360m --cost random:smollm2-135m`` walks every
step on a CPU, slowly); the goals are the GPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRAFTSIM = [sys.executable, "-m", "draftsim.cli"]


def sh(cmd: list[str], log: list, stream: bool = False) -> str:
    """Run a command (draftsim's through this interpreter); print it; return its stdout (with
    ``stream``, also printed line by line as it comes, so a run stopped by a time limit still
    leaves its log)."""
    shown = ["draftsim", *cmd[len(DRAFTSIM):]] if cmd[: len(DRAFTSIM)] == DRAFTSIM else cmd
    print("$ " + " ".join(shlex.quote(x) for x in shown), flush=True)
    t0 = time.time()
    if stream:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines = []
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)
        code, stdout, stderr = proc.wait(), "".join(lines), ""
    else:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        code, stdout, stderr = out.returncode, out.stdout, out.stderr
    if code != 0:
        raise SystemExit(f"command failed ({code}): {(stderr or '').strip()}")
    log.append({"command": " ".join(shown), "seconds": round(time.time() - t0, 1)})
    return stdout or ""


def device_name(device: str) -> str:
    """The accelerator's name (``torch.cuda.get_device_name``), or the CPU's."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def slug(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``: the folder name figures/gpu-<slug>."""
    words = [w for w in name.lower().replace("nvidia", "").split() if w]
    return words[0] if words else "device"


def single_stream(a, out: Path, log: list) -> dict:
    """Profile both models at batch 1 through the static cache, as ``run --static-cache`` calls them; run; check-sim."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_real_serving import static_grid

    dev = ["--device", a.device, "--dtype", a.dtype]
    profiles = []
    # both through the static cache: the target's verification, and the controlled drafter's one-token forwards of its cost
    # model (realrun.drafters.Controlled._spend; plain forwards until the H200 run of 2026-11-26 showed them at 17.7 ms a
    # token where the static path takes 2.9 ms)
    for name, model, path_kind in (("target", a.target, "server-static"), ("cost", a.cost, "server-static")):
        path = out / f"profile-{name}-model.json"
        if not path.exists():
            # one context per attention width the static cache pads to (contexts 0, 256, 512, 1,024 missed width 256,
            # where three of the float32 H200 run's four prompts ran)
            _, new, contexts = static_grid("1", "1,2,4,8,16", "0,1024")
            sh([*DRAFTSIM, "profile", "--model", model, "--path", path_kind, "--batch", "1", "--new-tokens", new,
                "--context", contexts, "--repeats", "5", "--warmup", "3", "--drafters", "", "--out", str(path), *dev, "--json"],
               log)
        profiles.append(path)
    trace = out / "run-trace"
    drafter = f"controlled:{a.rate:g}@{a.cost}"
    if not (trace / "manifest.json").exists():
        sh([*DRAFTSIM, "run", "--target", a.target, "--method", "sd", "--drafter", drafter, "--policy", f"fixed:k={a.k}",
            "--static-cache", "--max-new-tokens", str(a.output_len), "--n", str(a.prompts), "--trace", str(trace), *dev, "--json"], log)
    if a.measure_only:
        return {"measured_only": str(trace)}
    checked = json.loads(sh([*DRAFTSIM, "check-sim", str(trace), *sum((["--profile", str(p)] for p in profiles), []), "--json"], log))
    return checked


def summary_table(results: dict, serving: dict | None) -> list[str]:
    """The study's numbers against its goals, one row per check."""
    rows = ["| check | median \\|error\\| | worst | goal |", "|---|---|---|---|"]
    single = results.get("single_stream")
    if single:
        err = single.get("tokens_per_second_error")
        rows.append(f"| single stream, tokens/s (check-sim, profiles of both models) | {abs(err):.1%} | {abs(err):.1%} | ≤ 3% |"
                    if err is not None else "| single stream | not replayable | | |")
    fid = (serving or {}).get("fidelity", {})
    for key, what, goal in (("check", "serving, profile-priced (TTFT, TPOT, E2E p50, throughput)", "≤ 5% median, ≤ 10% each"),
                            ("check_roofline", "serving, catalog roofline + engine overheads (no measurement)", "reported"),
                            ("check_operators", "serving, operator model (AIConfigurator's tables) + engine overheads (no measurement "
                             "of this device)", "reported"),
                            ("check_fit", "serving, costs fitted to each run (in-sample)", "reported")):
        if key in fid:
            f = fid[key]
            rows.append(f"| {what} | {f['median_p50_and_throughput']:.1%} | {f['worst_p50_and_throughput']:.1%} | {goal} |")
    rep = fid.get("repeats")
    if rep:
        rows.append(f"| serving, profile-priced, against the mean of {rep.get('n', '?')} repeats | {rep['median_error_vs_mean']:.1%} | "
                    f"{rep['worst_error_vs_mean']:.1%} | the repeats' own spread: median {rep['median_spread']:.1%}, worst "
                    f"{rep['worst_spread']:.1%} |")
    return rows


def versions() -> dict:
    """The versions that measure or check: Python, torch, transformers."""
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def _shown(v: dict) -> str:
    return f"python {v['python']}, torch {v['torch']}, transformers {v['transformers']}"


def readme(a, out: Path, name: str, results: dict) -> str:
    path = out / "serving" / "results.json"
    serving = json.loads(path.read_text()) if path.exists() else None
    here = versions()
    used = (results.get("measured_on") or {}).get("versions") or here
    lines = [f"# GPU fidelity: {a.target} drafted by controlled:{a.rate:g}@{a.cost} on {name}", "",
             f"Written by `benchmarks/gpu_fidelity.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Measured with "
             f"{_shown(used)}" + ("" if used == here else f"; checked with {_shown(here)}") + f"; device `{a.device}`, "
             f"{a.dtype}, static caches (CUDA graphs on a GPU); k = {a.k}, acceptance {a.rate:g} per position, {a.requests} requests "
             f"of {a.output_len} tokens, batches up to {a.max_batch}. Catalog hardware for the roofline check: `{a.hardware}`.", "",
             *summary_table(results, serving), "",
             "Files: `results.json` (this study), `serving/results.json` and `log.txt` (every table `bench_real_serving.py` printed), "
             + ("`serving/serving_crossover.png` (speculation against load, real and predicted), "
                if (out / "serving" / "serving_crossover.png").exists() else "") + "the profiles and traces.", "",
             "## Commands", ""]
    measured = results.get("measured_on")
    if measured and measured.get("commands") is not results["commands"]:
        lines += [f"Measured on {measured['device']} (`--measure-only`):", ""]
        lines += [f"    {c['command']}    # {c['seconds']} s" for c in measured["commands"]]
        lines += ["", "Checked (on any machine, reusing what was measured):", ""]
    lines += [f"    {c['command']}    # {c['seconds']} s" for c in results["commands"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--hardware", default="h100-sxm", help="catalog hardware of this device, for the roofline check")
    p.add_argument("--target", default="random:llama-3.1-8b")
    p.add_argument("--cost", default="random:qwen2.5-0.5b", help="the controlled drafter's cost model")
    p.add_argument("--rate", type=float, default=0.8, help="the controlled drafter's acceptance per position")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompts", type=int, default=4, help="prompts of the single-stream run")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", default="", help="single, serving")
    p.add_argument("--bench-args", default="", help="more options for bench_real_serving.py (e.g. \"--sweep 0.3,1 --skip batching\")")
    p.add_argument("--measure-only", action="store_true", help="profile and serve only, check nothing (a lent GPU's time is short): "
                   "run again without it, on any machine, with the same --out, to check what was measured")
    p.add_argument("--operators", action="store_true", help="also price the serving runs by the operator model on --hardware "
                   "(needs the operators extra)")
    p.add_argument("--out", help="default figures/gpu-<device>")
    a = p.parse_args()
    name = device_name(a.device)
    out = Path(a.out) if a.out else ROOT / "figures" / f"gpu-{slug(name)}"
    out.mkdir(parents=True, exist_ok=True)
    before = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    if before.get("device") and a.device.startswith("cuda") and not _has_cuda():
        name = before["device"]  # checking here what a GPU measured: the study's device is the GPU's
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    log: list = []
    results: dict = {"device": name, "args": vars(a), "commands": log, "load_average_start": list(os.getloadavg())}
    if a.measure_only:  # a resumed measurement keeps the commands of the calls before it
        log.extend((before.get("measured_on") or {}).get("commands", []))
        results["measured_on"] = {"device": name, "commands": log, "versions": versions()}
    elif before.get("measured_on"):
        results["measured_on"] = before["measured_on"]
    if "single" not in skip:
        results["single_stream"] = single_stream(a, out, log)
    if "serving" not in skip:
        serving = out / "serving"
        # every serving run in one process: the models load and capture their CUDA graphs once (a process of its own spent
        # 75-90 s before its first request on an H200, more than its requests took)
        extra = ["--measure-only", "--in-process"] if a.measure_only else []
        measured = serving / "measured.json"
        if measured.exists():  # resume or check what a measure-only run served: no saturated run again
            extra += ["--capacity", repr(json.loads(measured.read_text())["measure_only"]["capacity"]), "--skip", "batching,sweep"]
        if a.operators:
            extra += ["--operators"]
        text = sh([sys.executable, str(ROOT / "benchmarks" / "bench_real_serving.py"), "--model", a.target, "--drafter",
                   f"controlled:{a.rate:g}@{a.cost}", "--k", str(a.k), "--static-cache", "--hardware", a.hardware, "--device", a.device,
                   "--dtype", a.dtype, "--requests", str(a.requests), "--output-len", str(a.output_len), "--max-batch", str(a.max_batch),
                   "--repeats", str(a.repeats), "--profile-batch", ",".join(str(b) for b in (1, 2, 4, 8, 16, 24, 32, 48, 64)
                                                                             if b <= a.max_batch), "--threads", "0", "--out", str(serving),
                   # the bundled prompts (up to ~850 tokens of the random models' character tokenizer) and 128 outputs reach
                   # ~1,270 tokens: the H200 run of 2026-11-26 attended past a grid that stopped at 768 in 97% of its steps
                   "--profile-context", "0,128,256,384,512,768,1024,1280,1536",
                   "--reuse", *extra, *shlex.split(a.bench_args)], log, stream=True)
        (out / ("log-measure.txt" if a.measure_only else "log.txt")).write_text(text)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out / "README.md").write_text(readme(a, out, name, results))
    print(f"wrote {out}/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
