"""``draftsim distill``: train a small draft for a target on the CPU."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from .. import args as a
from ..config import add_options, check, from_namespace, option
from .table import summary


@dataclass(kw_only=True)
class DistillConfig:
    """``draftsim distill``: a draft made of the target's first layers, trained to match it."""

    target: str = option("smollm2", "target model (default: the embedded smollm2; --model: the old spelling)", aliases=("--model",))
    layers: int = option(4, "layers kept from the target (default 4)", type=a.count("layers", 1, 64))
    minutes: float = option(15.0, "wall-clock budget (default 15)", type=a.positive("minutes", a.MAX_MINUTES))
    prompts_per_set: int = option(16, type=a.count("prompts_per_set", 1, 1000))
    max_new_tokens: int = option(96, type=a.count("max_new_tokens", 1, 2048))
    lr: float = option(3e-4, type=a.positive("lr", a.MAX_LR))
    seed: int = option(0, type=a.count("seed"))
    device: str = option("auto", "auto (CUDA when present), cpu or cuda[:N]")


def register(sub, common) -> None:
    p = sub.add_parser("distill", parents=[common], help=summary("distill"),
                       description="Truncate the target to its first --layers layers and train them to match the target's "
                       "next-token distributions on text it generated from the train prompts. Saved to the cache; "
                       "use it with --drafter distilled.")
    add_options(p, DistillConfig)
    p.set_defaults(run=run)


def distill_draft(config: DistillConfig, progress=None, log=print):
    """Distil ``config``'s draft into the cache; returns :class:`draftsim.realrun.distill.DistillResult`
    (``progress(step, loss, elapsed, budget)`` and ``log(message)`` are told as it trains)."""
    from draftsim.realrun.distill import distill
    from draftsim.realrun.models import load_model

    check(config)
    a.model_name("--target", config.target)
    a.device(config.device)
    target = load_model(config.target, device=config.device)
    return distill(target, layers=config.layers, minutes=config.minutes, n_per_set=config.prompts_per_set,
                   max_new_tokens=config.max_new_tokens, lr=config.lr, seed=config.seed, progress=progress, log=log)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    config = from_namespace(DistillConfig, args)
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    with tqdm(total=int(config.minutes * 60), desc="distilling", unit="s", disable=None, leave=False) as bar:

        def progress(step, loss, elapsed, budget):
            bar.n = min(int(elapsed), bar.total)
            bar.set_postfix(step=step, kl=f"{loss:.3f}")
            bar.refresh()

        result = distill_draft(config, progress, log)
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
