"""``draftsim run``: decode real prompts with a real target, autoregressively or speculatively."""

from __future__ import annotations

import argparse

import numpy as np

from analysis.table import format_table
from sim.analytic import swi
from sim.errors import DraftsimError
from sim.policies import POLICY_HELP, parse_policy

from .. import args as a
from ..progress import count_bar


def register(sub, common) -> None:
    p = sub.add_parser("run", parents=[common], help="decode prompts with real models (ar or speculative decoding)",
                       description="Run a sim policy on real models and measure tokens/s against autoregressive decoding "
                       "of the same prompts (measured alternately, prompt by prompt).",
                       epilog=POLICY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--method", choices=["ar", "sd"], default="sd")
    p.add_argument("--drafter", default="maxgram", help="maxgram, bigram, distilled or a neural model")
    p.add_argument("--policy", default="fixed:k=4")
    p.add_argument("--prompts", default="code")
    p.add_argument("--n", type=a.count("n", 1, 10_000), default=5)
    p.add_argument("--max-new-tokens", type=a.count("max_new_tokens", 1, 4096), default=64)
    p.add_argument("--temperature", type=a.cost("temperature"), default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=a.count("top_k", 1, 1_000_000))
    p.add_argument("--seed", type=a.count("seed"), default=0)
    p.add_argument("--cost", type=a.cost("cost"), help="drafter cost coefficient for SWI (default: measured)")
    p.add_argument("--device", default="auto")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from realrun.drafters import Bigram
    from realrun.executor import Sampling, generate
    from realrun.models import load_model
    from realrun.prompts import SETS, format_prompt, prompt_set

    from .traces import _drafter

    target = load_model(args.model, device=args.device)
    policy = parse_policy(args.policy) if args.method == "sd" else parse_policy("ar")
    drafter = None
    if args.method == "sd":
        bigram = Bigram.fit([format_prompt(p, target.tokenizer) for s in SETS for p in prompt_set(s, "train")], target.vocab_size)
        drafter = _drafter(args.drafter, target, bigram)
    sampling = Sampling(args.temperature, args.top_k)
    rng = np.random.default_rng(args.seed)
    prompts = prompt_set(args.prompts, "test", args.n)
    spec = {"tokens": 0, "seconds": 0.0, "target_calls": 0, "draft_calls": 0, "drafted": 0, "accepted": 0}
    base = {"tokens": 0, "seconds": 0.0}
    with count_bar(len(prompts), "decoding") as bar:
        for prompt in prompts:
            ids = format_prompt(prompt, target.tokenizer)
            ar = generate(target, ids, args.max_new_tokens, sampling=sampling, rng=rng)
            base["tokens"] += ar.tokens
            base["seconds"] += ar.seconds
            if args.method == "sd":
                log = generate(target, ids, args.max_new_tokens, policy, drafter, sampling, rng=rng)
                spec["tokens"] += log.tokens
                spec["seconds"] += log.seconds
                spec["target_calls"] += log.target_calls
                spec["draft_calls"] += log.draft_calls
                spec["drafted"] += sum(r["drafted"] for r in log.rounds)
                spec["accepted"] += sum(r["accepted"] for r in log.rounds)
            bar.update(1)
    ar_rate = base["tokens"] / base["seconds"]
    out = {"method": args.method, "policy": repr(policy), "drafter": args.drafter if drafter else None,
           "autoregressive_tokens_per_second": ar_rate, "prompts": len(prompts)}
    if args.method == "sd":
        rate = spec["tokens"] / spec["seconds"]
        cost = args.cost
        if cost is None:
            cost = 0.0  # refined by the cost profiler of a later issue; Max-Gram and bigram are ~free
        out.update({
            "tokens_per_second": rate, "speedup": rate / ar_rate,
            "mean_accepted_length": spec["tokens"] / max(spec["target_calls"], 1),
            "acceptance_rate": spec["accepted"] / max(spec["drafted"], 1),
            "counts": {k: spec[k] for k in ("target_calls", "draft_calls", "drafted", "accepted", "tokens")},
            "swi": float(swi([spec["target_calls"], spec["draft_calls"]], [1.0, cost], max(spec["tokens"], 1))),
            "swi_cost": cost,
        })
    if args.json:
        a.emit_json(out)
        return 0
    print(f"{target.name} on {len(prompts)} {args.prompts} test prompts, {args.max_new_tokens} new tokens, "
          f"{'greedy' if sampling.greedy else f'temperature {args.temperature:g}'}")
    rows = [["autoregressive", ar_rate, 1.0, 1.0, "-"]]
    if args.method == "sd":
        rows.append([f"{policy!r} with {args.drafter}", out["tokens_per_second"], out["speedup"], out["mean_accepted_length"], f"{out['swi']:.3f}"])
    print(format_table(["method", "tokens/s", "speedup", "tokens/target call", f"SWI (c={args.cost or 0:g})"], rows))
    if args.method == "sd":
        c = out["counts"]
        print(f"target calls {c['target_calls']}, draft calls {c['draft_calls']}, drafted {c['drafted']}, accepted {c['accepted']} "
              f"({out['acceptance_rate']:.1%})")
    return 0
