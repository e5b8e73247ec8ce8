"""``draftsim train-head``: SpecDec++'s acceptance-prediction head for a draft model."""

from __future__ import annotations

import argparse
from pathlib import Path

from draftsim.sim.errors import DraftsimError

from .. import args as a
from ..progress import count_bar


def register(sub, common) -> None:
    p = sub.add_parser("train-head", parents=[common], help="train SpecDec++'s acceptance-prediction head for a draft model",
                       description="Build training data from the target's responses to the train prompts (draft candidates "
                       "Y ~ q labelled min(1, p(Y)/q(Y)), token mixing), train a residual SiLU MLP on the frozen draft's last "
                       "hidden state by weighted BCE, report the binary KL on the test prompts, and save the head. Use it with "
                       "draftsim run --policy threshold:h=0.7 --head PATH.")
    p.add_argument("--target", "--model", dest="model", default="smollm2", help="target model")
    p.add_argument("--drafter", default="distilled", help="the draft model (neural: distilled, a checkpoint folder, tiny[:SEED])")
    p.add_argument("--out", required=True, help="folder to write the head to")
    p.add_argument("--depth", type=a.count("depth", 0, 16), default=2, help="residual blocks D (the head has D + 1 layers)")
    p.add_argument("--w-rej", type=a.positive("w_rej"), default=1.0, help="weight of the rejection term of the BCE (w_acc = 1)")
    p.add_argument("--mix", type=a.probability("mix"), default=0.5, help="token mixing: share of positions keeping the target's token")
    p.add_argument("--epochs", type=a.count("epochs", 1, 10_000), default=30)
    p.add_argument("--lr", type=a.positive("lr"), default=1e-3)
    p.add_argument("--prompts-per-set", type=a.count("prompts_per_set", 1, 1000), default=16)
    p.add_argument("--max-new-tokens", type=a.count("max_new_tokens", 1, 2048), default=96)
    p.add_argument("--seed", type=a.count("seed"), default=0)
    p.add_argument("--device", default="auto")
    p.set_defaults(run=run)


def check(args: argparse.Namespace) -> None:
    """Check every argument before a model loads. ``--out`` is replaced as a whole when the
    head is saved, so it must be new, empty or an earlier head (never a folder of other files)."""
    a.model_name("--target", args.model)
    a.drafter_names("--drafter", [args.drafter], neural_only=True)
    a.device(args.device)
    out = a.output_folder("--out", args.out)
    here = Path.cwd().resolve()
    if out.resolve() == here or out.resolve() in here.parents:
        raise DraftsimError(f"--out {args.out!r} is the current folder or one above it; the head is written as a folder of its own: give a new folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "head.json").is_file():
        raise DraftsimError(f"--out {args.out!r} is a folder with other files and no head in it; saving replaces the whole folder: "
                            "give a new folder, an empty one or an earlier head")


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from draftsim.realrun.distill import target_corpus
    from draftsim.realrun.drafters import Bigram, NeuralDraft
    from draftsim.realrun.head import binary_kl, head_data, save_head, train_head
    from draftsim.realrun.methods import make_drafter
    from draftsim.realrun.models import load_model

    check(args)
    target = load_model(args.model, device=args.device)
    drafter = make_drafter(args.drafter, target, Bigram(target.vocab_size))
    if not isinstance(drafter, NeuralDraft):
        raise DraftsimError(f"an acceptance head reads a neural draft's hidden states; {args.drafter} is not a neural model")
    rng = np.random.default_rng(args.seed)
    train = target_corpus(target, "train", args.prompts_per_set, args.max_new_tokens)
    test = target_corpus(target, "test", max(2, args.prompts_per_set // 4), args.max_new_tokens)
    with count_bar(len(train) + len(test), "labelling") as bar:
        data = head_data(target, drafter.loaded, train, args.mix, rng, progress=bar.update)
        held = head_data(target, drafter.loaded, test, 0.0, rng, progress=bar.update)  # evaluate on draft tokens only
    with count_bar(args.epochs, "training") as bar:
        head, history = train_head(data, args.depth, args.w_rej, args.epochs, args.lr, seed=args.seed, progress=bar.update)
    pred = head.predict(torch.from_numpy(held.features))
    constant = np.full(len(held), data.labels.mean())
    metrics = {"train_examples": len(data), "test_examples": len(held), "final_loss": history[-1],
               "binary_kl": binary_kl(held.labels, pred), "binary_kl_constant": binary_kl(held.labels, constant),
               "mean_label_test": float(held.labels.mean()), "mean_prediction_test": float(pred.mean())}
    meta = {"target": target.name, "w_rej": args.w_rej, "mix": args.mix, "epochs": args.epochs, "lr": args.lr,
            "prompts_per_set": args.prompts_per_set, "max_new_tokens": args.max_new_tokens, "seed": args.seed, "metrics": metrics}
    path = save_head(args.out, head, drafter.loaded, meta)
    out = {"path": str(path), "depth": args.depth, "w_rej": args.w_rej, "mix": args.mix, **metrics}
    if args.json:
        a.emit_json(out)
        return 0
    print(f"acceptance head for {drafter.name} saved to {path}: D = {args.depth} residual blocks, w_rej = {args.w_rej:g}, mix r = {args.mix:g}")
    print(f"trained on {len(data)} draft positions ({len(train)} target responses); test: {len(held)} positions")
    print(f"binary KL on the test prompts: {metrics['binary_kl']:.4f} (constant predictor {metrics['binary_kl_constant']:.4f}); "
          f"mean acceptance {metrics['mean_label_test']:.3f}, mean prediction {metrics['mean_prediction_test']:.3f}")
    return 0
