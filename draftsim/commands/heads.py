"""``draftsim train-head``: SpecDec++'s acceptance-prediction head for a draft model."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsim.sim.errors import DraftsimError

from .. import args as a
from ..config import add_options, from_namespace, option
from ..config import check as check_options
from ..progress import count_bar
from .table import summary


@dataclass(kw_only=True)
class TrainHeadConfig:
    """``draftsim train-head``: SpecDec++'s acceptance-prediction head for a neural draft."""

    target: str = option("smollm2", "target model (--model: the old spelling)", aliases=("--model",))
    drafter: str = option("distilled", "the draft model (neural: distilled, a checkpoint folder, tiny[:SEED])")
    out: str = option(help="folder to write the head to", required=True)
    depth: int = option(2, "residual blocks D (the head has D + 1 layers)", type=a.count("depth", 0, 16))
    w_rej: float = option(1.0, "weight of the rejection term of the BCE (w_acc = 1)", type=a.positive("w_rej", a.MAX_LOSS_WEIGHT))
    mix: float = option(0.5, "token mixing: share of positions keeping the target's token", type=a.probability("mix"))
    epochs: int = option(30, type=a.count("epochs", 1, 10_000))
    lr: float = option(1e-3, type=a.positive("lr", a.MAX_LR))
    prompts_per_set: int = option(16, type=a.count("prompts_per_set", 1, 1000))
    max_new_tokens: int = option(96, type=a.count("max_new_tokens", 1, 2048))
    seed: int = option(0, type=a.count("seed"))
    device: str = option("auto", "auto (CUDA when present), cpu or cuda[:N]")


def register(sub, common) -> None:
    p = sub.add_parser("train-head", parents=[common], help=summary("train-head"),
                       description="Build training data from the target's responses to the train prompts (draft candidates "
                       "Y ~ q labelled min(1, p(Y)/q(Y)), token mixing), train a residual SiLU MLP on the frozen draft's last "
                       "hidden state by weighted BCE, report the binary KL on the test prompts, and save the head. Use it with "
                       "draftsim run --policy threshold:h=0.7 --head PATH.")
    add_options(p, TrainHeadConfig)
    p.set_defaults(run=run)


def check(config: TrainHeadConfig) -> None:
    """Check every argument before a model loads. ``--out`` is replaced as a whole when the
    head is saved, so it must be new, empty or an earlier head (never a folder of other files)."""
    check_options(config)
    a.model_name("--target", config.target)
    a.drafter_names("--drafter", [config.drafter], neural_only=True)
    a.device(config.device)
    out = a.output_folder("--out", config.out)
    here = Path.cwd().resolve()
    if out.resolve() == here or out.resolve() in here.parents:
        raise DraftsimError(f"--out {config.out!r} is the current folder or one above it; the head is written as a folder of its own: give a new folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "head.json").is_file():
        raise DraftsimError(f"--out {config.out!r} is a folder with other files and no head in it; saving replaces the whole folder: "
                            "give a new folder, an empty one or an earlier head")


@dataclass
class TrainHeadResult:
    """What ``draftsim train-head`` trained and where it saved it: the head's settings, its
    training and held-out examples, the final training loss, and the binary KL on the test
    prompts beside a constant predictor's (lower is better)."""

    path: str
    drafter: str
    depth: int
    w_rej: float
    mix: float
    train_examples: int
    test_examples: int
    final_loss: float
    binary_kl: float
    binary_kl_constant: float
    mean_label_test: float
    mean_prediction_test: float

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("drafter")
        return out


def run(args: argparse.Namespace) -> int:
    config = from_namespace(TrainHeadConfig, args)
    check(config)
    with count_bar(None, "labelling and training") as bar:
        result = train(config, bar.update)
    if args.json:
        a.emit_json(result.to_dict())
        return 0
    print(f"acceptance head for {result.drafter} saved to {result.path}: D = {result.depth} residual blocks, w_rej = {result.w_rej:g}, "
          f"mix r = {result.mix:g}")
    print(f"trained on {result.train_examples} draft positions; test: {result.test_examples} positions")
    print(f"binary KL on the test prompts: {result.binary_kl:.4f} (constant predictor {result.binary_kl_constant:.4f}); "
          f"mean acceptance {result.mean_label_test:.3f}, mean prediction {result.mean_prediction_test:.3f}")
    return 0


def train(config: TrainHeadConfig, progress=None) -> TrainHeadResult:
    """Label draft candidates on the target's responses to the train prompts, train the head,
    evaluate it on the test prompts and save it to ``config.out``; ``progress(n)`` is told as
    responses are labelled and epochs end. Everything is checked before a model loads."""
    import numpy as np
    import torch

    from draftsim.realrun.distill import target_corpus
    from draftsim.realrun.drafters import Bigram, NeuralDraft
    from draftsim.realrun.head import binary_kl, head_data, save_head, train_head
    from draftsim.realrun.methods import make_drafter
    from draftsim.realrun.models import load_model

    check(config)
    target = load_model(config.target, device=config.device)
    drafter = make_drafter(config.drafter, target, Bigram(target.vocab_size))
    if not isinstance(drafter, NeuralDraft):
        raise DraftsimError(f"an acceptance head reads a neural draft's hidden states; {config.drafter} is not a neural model")
    rng = np.random.default_rng(config.seed)
    train = target_corpus(target, "train", config.prompts_per_set, config.max_new_tokens)
    test = target_corpus(target, "test", max(2, config.prompts_per_set // 4), config.max_new_tokens)
    data = head_data(target, drafter.loaded, train, config.mix, rng, progress=progress)
    held = head_data(target, drafter.loaded, test, 0.0, rng, progress=progress)  # evaluate on draft tokens only
    head, history = train_head(data, config.depth, config.w_rej, config.epochs, config.lr, seed=config.seed, progress=progress)
    pred = head.predict(torch.from_numpy(held.features))
    constant = np.full(len(held), data.labels.mean())
    metrics = {"train_examples": len(data), "test_examples": len(held), "final_loss": history[-1],
               "binary_kl": binary_kl(held.labels, pred), "binary_kl_constant": binary_kl(held.labels, constant),
               "mean_label_test": float(held.labels.mean()), "mean_prediction_test": float(pred.mean())}
    meta = {"target": target.name, "w_rej": config.w_rej, "mix": config.mix, "epochs": config.epochs, "lr": config.lr,
            "prompts_per_set": config.prompts_per_set, "max_new_tokens": config.max_new_tokens, "seed": config.seed, "metrics": metrics}
    path = save_head(config.out, head, drafter.loaded, meta)
    return TrainHeadResult(str(path), drafter.name, config.depth, config.w_rej, config.mix, **metrics)
