"""Every real-run method on the embedded model: tokens/s, speedup, simulator error.

Run: ``.venv/bin/python benchmarks/bench_methods.py [--n 4] [--max-new-tokens 48] [--prompts code,arithmetic]``.
For each method, :func:`realrun.compare.measure` decodes the test prompts alternately with
plain autoregressive decoding (so each speedup is a ratio measured in one run), writes the
run trace and replays it in the simulator. Needs the distilled draft (``draftsim distill``).
"""

from __future__ import annotations

import argparse
import json

from analysis.reality import held_to_sim
from realrun.compare import measure
from realrun.methods import method_from
from realrun.models import load_model
from realrun.prompts import prompt_set

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
    args = parser.parse_args()
    target = load_model("smollm2", device="cpu")
    prompts = [p for s in args.prompts.split(",") for p in prompt_set(s, "test", args.n)]
    results = []
    print(f"{target.name}: {len(prompts)} test prompts ({args.prompts}), {args.max_new_tokens} new tokens, greedy")
    print(f"{'method':58s} {'tok/s':>6s} {'AR tok/s':>8s} {'speedup':>7s} {'tok/call':>8s} {'=target':>7s} {'sim counts':>10s} {'sim tok/s err':>13s}")
    for kind, drafter, policy, rule in METHODS:
        m = method_from(kind, target, drafter, policy, rule)
        r = held_to_sim(measure(target, m, prompts, args.max_new_tokens))
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
        counts = "exact" if c["counts_equal"] else f"{max(abs(e) for e in c['count_errors'].values()):.1%} off"
        print(f"{r['label'][:58]:58s} {r['tokens_per_second']:6.2f} {r['autoregressive_tokens_per_second']:8.2f} "
              f"{r['speedup']:6.2f}x {r['mean_accepted_length']:8.2f} {r['quality']['identical_to_target']:6.0%} "
              f"{counts:>10s} {c['tokens_per_second_error']:+12.1%}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
