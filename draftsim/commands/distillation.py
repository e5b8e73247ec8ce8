"""``draftsim distill``: train a small draft for a target on the CPU."""

from __future__ import annotations

import argparse

from .. import args as a


def register(sub, common) -> None:
    p = sub.add_parser("distill", parents=[common], help="train a small draft model for the target (knowledge distillation)",
                       description="Truncate the target to its first --layers layers and train them to match the target's "
                       "next-token distributions on text it generated from the train prompts. Saved to the cache; "
                       "use it with --drafter distilled.")
    p.add_argument("--target", "--model", dest="model", default="smollm2", help="target model (default: the embedded smollm2)")
    p.add_argument("--layers", type=a.count("layers", 1, 64), default=4, help="layers kept from the target (default 4)")
    p.add_argument("--minutes", type=a.positive("minutes"), default=15.0, help="wall-clock budget (default 15)")
    p.add_argument("--prompts-per-set", type=a.count("prompts_per_set", 1, 1000), default=16)
    p.add_argument("--max-new-tokens", type=a.count("max_new_tokens", 1, 2048), default=96)
    p.add_argument("--lr", type=a.positive("lr"), default=3e-4)
    p.add_argument("--seed", type=a.count("seed"), default=0)
    p.add_argument("--device", default="auto")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from tqdm import tqdm

    from draftsim.realrun.distill import distill
    from draftsim.realrun.models import load_model

    a.model_name("--target", args.model)
    a.device(args.device)
    target = load_model(args.model, device=args.device)
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    with tqdm(total=int(args.minutes * 60), desc="distilling", unit="s", disable=None, leave=False) as bar:

        def progress(step, loss, elapsed, budget):
            bar.n = min(int(elapsed), bar.total)
            bar.set_postfix(step=step, kl=f"{loss:.3f}")
            bar.refresh()

        result = distill(target, layers=args.layers, minutes=args.minutes, n_per_set=args.prompts_per_set,
                         max_new_tokens=args.max_new_tokens, lr=args.lr, seed=args.seed, progress=progress, log=log)
    out = {"path": str(result.path), "layers": result.layers, "steps": result.steps, "seconds": result.seconds,
           "train_tokens": result.train_tokens, "before": result.before, "after": result.after}
    if args.json:
        a.emit_json(out)
    else:
        print(f"distilled draft saved to {result.path}: {result.layers} layers, {result.steps} steps on {result.train_tokens} tokens "
              f"in {result.seconds / 60:.1f} min")
        print(f"acceptance against the target (test prompts): greedy agreement {result.before['greedy_match']:.3f} -> "
              f"{result.after['greedy_match']:.3f}; 1-TV {result.before['accept_prob']:.3f} -> {result.after['accept_prob']:.3f}")
    return 0
