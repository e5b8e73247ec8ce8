"""Lookup drafting (``ngram``, ``suffix``) against Max-Gram on the embedded model: measured speedup
beside the planner's prediction.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_lookup.py [--sets edit,extract,code] [--n 4]
[--pilot 2] [--max-new-tokens 64] [--k 4] [--threads 1]``.

Per prompt set: the planner (:func:`draftsim.analysis.lookup.plan_lookup`) walks each lookup drafter
along the target's greedy outputs on ``--pilot`` *train* prompts and prices the rounds with a
profile of the target on this machine; then ``sd fixed:k=K`` with ``ngram``, ``suffix`` and
``maxgram`` is measured on ``--n`` *test* prompts by :func:`draftsim.realrun.compare.measure`
(autoregressive decoding interleaved prompt by prompt: each speedup is a ratio measured in one
run) and replayed in the simulator. Printed per row: tokens/s, speedup, tokens per target call,
drafted → accepted, the planner's prediction (pilot) and the same profile's price of the run's
own rounds, and whether the simulator's replay reproduced the counts.
"""

from __future__ import annotations

import argparse

import torch

from draftsim.analysis.lookup import plan_lookup, predict_run, run_pilot
from draftsim.analysis.reality import held_to_sim
from draftsim.analysis.table import format_table
from draftsim.realrun.compare import measure
from draftsim.realrun.methods import method_from
from draftsim.realrun.models import load_model
from draftsim.realrun.prompts import prompt_set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="edit,extract,code")
    parser.add_argument("--n", type=int, default=4, help="test prompts per set (measured)")
    parser.add_argument("--pilot", type=int, default=2, help="train prompts per set (the planner's pilot)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model("smollm2", device="cpu")
    rows = []
    for name in args.sets.split(","):
        pilot = run_pilot(target, prompt_set(name, "train", args.pilot), args.max_new_tokens, max(args.k, 6))
        plan = {(c.drafter, c.k): c for c in plan_lookup(target, pilot, ks=range(1, max(args.k, 6) + 1)).choices}
        best = max(plan.values(), key=lambda c: c.speedup)
        print(f"{name}: verify t(n)/t(1) = {[round(v / pilot.verify[0], 2) for v in pilot.verify]}; planner's best {best.drafter} "
              f"k={best.k} ({best.speedup:.2f}x)", flush=True)
        for drafter in ("ngram", "suffix", "maxgram"):
            m = measure(target, method_from("sd", target, drafter, f"fixed:k={args.k}"), prompt_set(name, "test", args.n), args.max_new_tokens)
            out = held_to_sim(m)
            lv = out["levels"][0]
            planned = plan.get((drafter, args.k))
            rows.append([name, drafter, out["tokens_per_second"], out["autoregressive_tokens_per_second"], out["speedup"],
                         out["mean_accepted_length"], f"{lv['drafted']} -> {lv['accepted']}",
                         f"{planned.speedup:.2f}" if planned else "-", f"{predict_run(pilot, m.trace):.2f}",
                         "identical" if out["sim_check"]["counts_equal"] else "differ", f"{out['quality']['identical_to_target']:.0%}"])
            print(format_table(["set", "drafter", "tokens/s", "AR tokens/s", "speedup", "tokens/call", "drafted -> accepted",
                                "planner (pilot)", "priced run", "sim counts", "= target"], rows[-1:]), flush=True)
    print()
    print(f"SmolLM2, {args.threads} thread(s), {args.n} test prompts per set, {args.max_new_tokens} new tokens, greedy, fixed:k={args.k}")
    print(format_table(["set", "drafter", "tokens/s", "AR tokens/s", "speedup", "tokens/call", "drafted -> accepted", "planner (pilot)",
                        "priced run", "sim counts", "= target"], rows))


if __name__ == "__main__":
    main()
