"""Every real-run method on the embedded model: tokens/s, speedup, simulator error.

Run: ``.venv/bin/python benchmarks/bench_methods.py [--n 4] [--max-new-tokens 48] [--prompts code,arithmetic]
[--threads 1] [--profile P.json --profile D.json]``.
For each method, :func:`draftsim.realrun.compare.measure` decodes the test prompts alternately with
plain autoregressive decoding (so each speedup is a ratio measured in one run), writes the
run trace and replays it in the simulator. Needs the distilled draft (``draftsim distill``).

The replay is priced with the run's own calls unless ``--profile`` gives measured cost
tables (``draftsim profile --model smollm2`` and ``--model distilled``, taken separately and
with the same ``--threads``): then the simulator's tokens/s is a prediction out of sample, and
the last lines give the median and worst error over every replayable method (issue 15's
goal: ≤ 3% median, ≤ 6% worst) — as priced by the profiles, and with the profiles re-stated
at the machine's speed during each run (``speed``: the autoregressive runs interleaved with
the method, their target calls measured over profiled, :func:`draftsim.analysis.reality.run_speed`;
this machine drifts by several percent within minutes).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from draftsim.analysis.reality import held_to_sim
from draftsim.realrun.compare import measure
from draftsim.realrun.methods import method_from
from draftsim.realrun.models import load_model
from draftsim.realrun.prompts import prompt_set
from draftsim.sim.cost.profile import load_profile

METHODS = [
    ("sd", "maxgram", "fixed:k=4", None),
    ("sd", "distilled", "fixed:k=4", None),
    ("sd", "distilled", "heuristic:k=4,kmax=16", None),
    ("sd", "distilled", "confidence:tau=0.4,kmax=8", None),
    ("csd", "distilled,maxgram", "vertical:n=2,k=4,leniency=2", None),
    ("csd", "distilled,maxgram", "horizontal:counts=3,3", None),
    ("cascade", "distilled", "fixed:k=4", "opt:alpha=0.5"),
    ("cascade", "distilled", "fixed:k=4", "chow:alpha=0.5"),
    ("ssd", "distilled", "tree:width=1,depth=4", None),
    ("tsd", "distilled", "tree:width=3,depth=4,sib=0.1,nodes=40", None),
    ("gsd", "distilled", "tree:width=3,depth=4,sib=0.1,nodes=40,merge=2", None),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--prompts", default="code,arithmetic")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--threads", type=int, help="torch CPU threads (the profiles must use the same)")
    parser.add_argument("--profile", action="append", default=[], help="price the replays with this draftsim profile (repeat)")
    parser.add_argument("--methods", help="indices into the method list to run, comma-separated (default all)")
    args = parser.parse_args()
    profiles = [load_profile(p, monotone=False) for p in args.profile]  # as check-sim prices (draftsim.commands.running)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    methods = METHODS if not args.methods else [METHODS[int(i)] for i in args.methods.split(",")]
    target = load_model("smollm2", device="cpu")
    prompts = [p for s in args.prompts.split(",") for p in prompt_set(s, "test", args.n)]
    results = []
    pricing = "profiles " + ", ".join(f"{p.model} ({f})" for p, f in zip(profiles, args.profile)) if profiles else "the run's own calls"
    print(f"{target.name}: {len(prompts)} test prompts ({args.prompts}), {args.max_new_tokens} new tokens, greedy; "
          f"replays priced with {pricing}; load {os.getloadavg()[0]:.2f}")
    print(f"{'method':58s} {'tok/s':>6s} {'AR tok/s':>8s} {'speedup':>7s} {'tok/call':>8s} {'=target':>7s} {'sim counts':>10s} {'sim tok/s err':>13s}"
          + (f" {'speed':>6s} {'err at speed':>12s}" if profiles else ""))
    errors, at_speed = [], []
    for kind, drafter, policy, rule in methods:
        m = method_from(kind, target, drafter, policy, rule)
        run = measure(target, m, prompts, args.max_new_tokens)
        names = set(run.trace.models())  # each run is priced by the profiles of its own models
        r = held_to_sim(run, profiles=[p for p in profiles if p.model in names or set(p.drafters) & names])
        c = r["sim_check"]
        results.append(r)
        if not c["replayable"]:
            t = r["tree_check"]
            print(f"{r['label'][:58]:58s} {r['tokens_per_second']:6.2f} {r['autoregressive_tokens_per_second']:8.2f} "
                  f"{r['speedup']:6.2f}x {r['mean_accepted_length']:8.2f} {r['quality']['identical_to_target']:6.0%} "
                  f"  tree: {r['tree']['drafted_nodes']} nodes ({r['tree']['expanded_nodes']} expanded, {r['tree']['merged_nodes']} merged), "
                  f"merged paths {r['tree']['merged_path_share']:.0%}; optimiser: {t['optimiser']['nodes']} nodes, "
                  f"{t['optimiser']['expected_accepted_per_round']:.2f} acc/round, {t['optimiser']['tokens_per_second']:.1f} tok/s modelled",
                  flush=True)
            continue
        errors.append(c["tokens_per_second_error"])
        speed = ""
        if "tokens_per_second_error_at_run_speed" in c:
            at_speed.append(c["tokens_per_second_error_at_run_speed"])
            speed = f" {c['run_speed_factor']:6.3f} {c['tokens_per_second_error_at_run_speed']:+12.1%}"
        if c.get("tree"):  # a tree run's replay predicts tokens per round from its per-level acceptance
            counts = f"{c['tokens_per_round_error']:+.1%} tpr"
        else:
            counts = "exact" if c["counts_equal"] else f"{max(abs(e) for e in c['count_errors'].values()):.1%} off"
        print(f"{r['label'][:58]:58s} {r['tokens_per_second']:6.2f} {r['autoregressive_tokens_per_second']:8.2f} "
              f"{r['speedup']:6.2f}x {r['mean_accepted_length']:8.2f} {r['quality']['identical_to_target']:6.0%} "
              f"{counts:>10s} {c['tokens_per_second_error']:+12.1%}{speed}", flush=True)
    if errors:
        e = np.abs(errors)
        print(f"simulator tokens/s error over {len(e)} replayed methods: median |error| {np.median(e):.1%}, worst {e.max():.1%} "
              f"(priced with {pricing}); load {os.getloadavg()[0]:.2f}")
    if at_speed:
        e = np.abs(at_speed)
        print(f"at the machine's speed during each run (the profile re-stated by the interleaved autoregressive runs' target "
              f"calls, column 'speed' = their measured / profiled time): median |error| {np.median(e):.1%}, worst {e.max():.1%}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
