"""``draftsim run`` and ``draftsim check-sim``: decode real prompts with real models, and hold
the simulator against what the run did."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftsim.analysis.table import format_table
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import POLICY_HELP
from draftsim.sim.registry import lookup_drafters
from draftsim.sim.rules import RULE_HELP

from .. import args as a
from ..config import add_options, check, from_namespace, option
from ..progress import count_bar
from .table import summary

if TYPE_CHECKING:
    from draftsim.realrun.compare import Measurement

#: Methods of ``draftsim run`` (:data:`draftsim.realrun.methods.METHODS`; listed here so that the
#: parser is built without importing torch).
METHODS = ("ar", "sd", "csd", "cascade", "ssd", "tsd", "gsd")


@dataclass(kw_only=True)
class RunConfig:
    """``draftsim run``: a method on real models, measured against autoregressive decoding of the
    same prompts and replayed in the simulator."""

    target: str = option("smollm2", "target: smollm2 (embedded), tiny[:SEED], random:NAME[:SEED] (random weights, a catalog model's shape), a checkpoint folder or a .gguf file (--model: the old "
                         "spelling)", aliases=("--model",))
    method: str = option("sd", choices=METHODS)
    drafter: str | None = option(help=f"drafter(s), comma-separated: {lookup_drafters()}, distilled, controlled:R[@MODEL] "
                                 "(the target's own output kept at rate R per position, each draft token a forward of MODEL) or a model (default "
                                 "per method: sd maxgram, csd distilled,maxgram, cascade distilled)")
    policy: str | None = option(help="sim policy (default per method: sd fixed:k=4, csd vertical:n=2,k=4, cascade fixed:k=4)")
    rule: str | None = option(help="verification rule at the target (default sd; cascade: opt:alpha=0.5)")
    head: str | None = option(help="SpecDec++ acceptance head (draftsim train-head) for drafter 1; with --policy threshold:h=...")
    sequential: bool = option(False, "cascade: the sequential token-level cascade ([SC] Algorithm 2; rule chow)", flag=True)
    prompts: str = option("code", "prompt set(s), comma-separated: code, arithmetic, instructions, docstrings, edit, extract")
    split: str = option("test", choices=("train", "test"))
    n: int = option(5, "prompts per set", type=a.count("n", 1, 10_000))
    max_new_tokens: int = option(64, type=a.count("max_new_tokens", 1, 4096))
    temperature: float = option(0.0, "0 = greedy", type=a.cost("temperature"))
    top_k: int | None = option(type=a.count("top_k", 1, 1_000_000))
    seed: int = option(0, type=a.count("seed"))
    trace: str | None = option(help="write the run trace to this folder (default: a temporary one)")
    resume: bool = option(False, "continue an existing --trace", flag=True)
    no_check: bool = option(False, "skip the simulator replay", flag=True)
    device: str = option("auto", "auto (CUDA when present), cpu or cuda[:N]")
    dtype: str = option("float32", "weights and activations of the target and its neural drafters (default float32)",
                        choices=("float32", "bfloat16"))
    static_cache: bool = option(False, "execute through a static KV cache with fixed shapes (CUDA graphs on a CUDA device; "
                                "draftsim.realrun.statickv)", flag=True)
    profile: list[str] = option([], "price the simulator's replay with this draftsim profile (of the target or a drafter; repeatable); "
                                "default: the run's own calls", append=True, metavar="FILE")


def register(sub, common) -> None:
    p = sub.add_parser("run", parents=[common], help=summary("run"),
                       description="Run a method on real models and measure it against autoregressive decoding of the same "
                       "prompts (alternately, prompt by prompt). Methods: ar (baseline), sd (speculative decoding with one "
                       "drafter), csd (Cascade Speculative Drafting: a K matrix over several drafters, lenient inner levels), "
                       "cascade (speculative cascades with a deferral rule; --sequential for the token-level cascade), "
                       "ssd / tsd / gsd (chain, token tree, token graph with merged m-grams; GSD). "
                       "Every run writes a run trace and is replayed in the simulator (counts and tokens/s compared).",
                       epilog=POLICY_HELP + "\n\n" + RULE_HELP + "\n\nDrafters: maxgram, bigram, ngram (vLLM's prompt lookup, "
                       "n-grams of 2 to 4 tokens), suffix (suffix decoding, vLLM's defaults), distilled (draftsim distill), "
                       "a checkpoint folder or tiny[:SEED]; several for csd, comma-separated, largest first. ngram and suffix propose "
                       "nothing where the context has no match (that round is a plain decoding step); prompt sets edit and "
                       "extract have answers that copy their prompt.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p, RunConfig)
    p.set_defaults(run=run)

    c = sub.add_parser("check-sim", parents=[common], help=summary("check-sim"),
                       description="Replay the acceptance a real run recorded with the same policy in the Monte Carlo engine; "
                       "compare counts (exact for greedy single-drafter runs) and predicted against measured tokens/s.")
    add_options(c, CheckSimConfig)
    c.set_defaults(run=run_check)


@dataclass(kw_only=True)
class CheckSimConfig:
    """``draftsim check-sim``: run traces replayed in the simulator and compared with the runs."""

    trace: list[str] = option(help="run trace folder(s) (draftsim run --trace)", positional=True, nargs="+")
    profile: list[str] = option([], "price the replay with this draftsim profile (repeatable; default: the run's own calls)",
                                append=True, metavar="FILE")


def check_sim(config: CheckSimConfig) -> list[dict]:
    """Each run trace replayed with its policy and compared: counts, predicted against measured
    tokens/s (:func:`draftsim.analysis.reality.check_run`)."""
    from draftsim.analysis.reality import check_run

    check(config)
    twice = sorted({p for p in config.trace if config.trace.count(p) > 1})
    if twice:
        raise DraftsimError(f"check-sim: {', '.join(twice)} is given twice; name each run trace once")
    profiles = _profiles(config.profile)
    return [check_run(path, profiles=profiles) for path in config.trace]


@dataclass
class RunResult:
    """What ``draftsim run`` measured: ``measurement`` (:class:`draftsim.realrun.compare.Measurement`:
    the method's and autoregression's tokens/s on the same prompts, the speedup, tokens per
    target call, the output's quality against the target's, the trace) and ``data``, the JSON
    document ``--json`` prints, which adds the simulator's replay of the run (``sim_check``,
    unless ``--no-check``; :func:`draftsim.analysis.reality.held_to_sim`)."""

    measurement: Measurement
    data: dict

    def to_dict(self) -> dict:
        return self.data


def run_method(config: RunConfig, progress=None) -> RunResult:
    """Run ``config``'s method and autoregression on real models over the prompts and hold the
    run to the simulator; ``progress(n)`` is told as prompts finish. Everything is checked
    before the model loads."""
    from draftsim.analysis.reality import held_to_sim
    from draftsim.realrun.compare import measure
    from draftsim.realrun.executor import Sampling
    from draftsim.realrun.methods import MethodSpec, build_method
    from draftsim.realrun.models import check_all_fit, load_model, pick_device
    from draftsim.realrun.prompts import prompt_set

    check(config)
    if config.resume and not config.trace:
        raise DraftsimError("--resume needs --trace")
    if config.top_k is not None and config.temperature == 0:
        raise DraftsimError("--top-k applies to sampling; give --temperature > 0")
    a.model_name("--target", config.target)
    if config.drafter is not None:  # each named once, none empty ('tiny:1,' ran one drafter), checkpoints checked before loading
        a.drafter_names("--drafter", [name.strip() for name in config.drafter.split(",")])
    a.device(config.device)
    spec = MethodSpec(config.method, config.drafter, config.policy, config.rule, config.sequential, config.head)
    sets = a.prompt_sets("--prompts", config.prompts)
    if config.trace is not None:
        a.trace_folder("--trace", config.trace, config.resume)
    prompts = [p for s in sets for p in prompt_set(s, config.split, config.n)]
    sampling = Sampling(config.temperature, config.top_k)
    profiles = _profiles(config.profile)
    check_all_fit([config.target, *spec.drafter_names], pick_device(config.device), config.dtype)  # before any loads
    target = load_model(config.target, device=config.device, dtype=config.dtype)
    method = build_method(spec, target)
    if config.static_cache:
        from draftsim.realrun.prompts import format_prompt

        longest = max(len(format_prompt(p, target.tokenizer)) for p in prompts)
        static = [target, *(d.loaded for d in method.drafters if getattr(d, "neural", False)),
                  *(d.cost for d in method.drafters if getattr(d, "cost", None) is not None)]
        static_cache(static, longest + config.max_new_tokens + 512)
        if str(target.device).startswith("cuda"):  # capture the graph shapes before anything is timed
            import numpy as np

            from draftsim.realrun.executor import generate
            from draftsim.realrun.kvcache import make_kv, release_kv

            # every decoding shape of one row, 1 ... 16 new tokens (the H200 run of 2026-11-26 captured a shape first met
            # late in a prompt inside the timed calls: 0.2 s of its 2.1 s of verification), then the first prompt
            for m in {id(m): m for m in static}.values():
                kv = make_kv(m, 1)
                kv.precapture(16)
                release_kv(kv)

            ids = format_prompt(prompts[0], target.tokenizer)
            ar = generate(target, ids, config.max_new_tokens, sampling=sampling, rng=np.random.default_rng(config.seed))
            for d in method.drafters:
                d.prepare(ids, ar.output)
            if method.kind != "ar":
                method.run(target, ids, config.max_new_tokens, sampling, np.random.default_rng(config.seed))
    m = measure(target, method, prompts, config.max_new_tokens, sampling, config.seed, config.trace, config.resume, progress=progress)
    out = held_to_sim(m, seed=config.seed, check=not config.no_check, profiles=profiles)
    return RunResult(m, out)


def static_cache(models, tokens: int) -> None:
    """Set ``models`` to execute through static KV caches of ``tokens`` tokens per sequence."""
    for m in models:
        m.static_tokens = int(tokens)


def run(args: argparse.Namespace) -> int:
    from draftsim.realrun.prompts import prompt_set

    config = from_namespace(RunConfig, args)
    check(config)
    sets = a.prompt_sets("--prompts", config.prompts)
    with count_bar(sum(len(prompt_set(s, config.split, config.n)) for s in sets), "decoding") as bar:
        result = run_method(config, bar.update)
    out = result.to_dict()
    if args.json:
        a.emit_json(out)
        return 0
    sampling_greedy = config.temperature == 0
    print(f"{result.measurement.target} on {result.measurement.prompts} {config.split} prompts ({', '.join(sets)}), {config.max_new_tokens} new tokens, "
          f"{'greedy' if sampling_greedy else out['sampling']}")
    q = out["quality"]
    rows = [["autoregressive", out["autoregressive_tokens_per_second"], 1.0, 1.0, "-", "-"]]
    if config.method != "ar":
        rows.append([out["label"], out["tokens_per_second"], out["speedup"], out["mean_accepted_length"], f"{out['swi']:.2f}",
                     f"{q['identical_to_target']:.0%}"])
    print(format_table(["method", "tokens/s", "speedup", "tokens/target call", "SWI", "= target output"], rows))
    if config.method != "ar":
        print("calls per model: " + ", ".join(f"{n} {c}" for n, c in zip(["target"] + out["drafters"], out["calls_per_model"]))
              + "; cost coefficients (measured): " + ", ".join(f"{c:.3f}" for c in out["cost_coefficients"]))
        for lv in out["levels"]:
            print(f"  {lv['proposer']} -> {lv['verifier']}: drafted {lv['drafted']}, accepted {lv['accepted']} "
                  f"({lv['accepted'] / max(lv['drafted'], 1):.1%})")
    if "tree" in out:
        t = out["tree"]
        print(f"graph: {t['drafted_nodes']} nodes drafted ({t['expanded_nodes']} expanded by the drafter, {t['merged_nodes']} merged), "
              f"{t['verified_nodes']} verified, {t['accepted_per_round']:.2f} accepted per round, "
              f"{t['merged_path_share']:.1%} of rounds accepted a path through merged nodes")
        tc, o = out["tree_check"], out["tree_check"]["optimiser"]
        print(f"tree optimiser on this run's per-rank acceptance ({', '.join(f'{a:.2f}' for a in tc['rank_alphas'][:4])}): "
              f"{o['nodes']} nodes, depth {o['depth']}, {o['expected_accepted_per_round']:.2f} accepted per round expected, "
              f"{o['tokens_per_second']:.1f} tokens/s modelled (run: {tc['run']['accepted_per_round']:.2f}, {tc['run']['tokens_per_second']:.1f})")
    if q["answer_accuracy"] is not None:
        print(f"arithmetic answers correct: {q['answer_accuracy']:.0%} (target alone: {q['answer_accuracy_target']:.0%})")
    if not sampling_greedy or out["rule"] != "sd":
        print(f"agreement with the target's output: {q['mean_prefix_agreement']:.0%} of tokens before the first difference")
    if "sim_check" in out:
        _print_check(out["sim_check"])
    if out["trace"]:
        print(f"run trace: {out['trace']}")
    return 0


def _profiles(paths: list[str]) -> list:
    """The --profile files, loaded and validated (before any model is loaded). A replay prices
    the shapes the run made, so with the medians as measured (``monotone=False``: on this CPU
    a 16-token call costs less than a 12-token one, which a monotone table would not say)."""
    from draftsim.sim.cost import load_profile

    profiles = [load_profile(p, monotone=False) for p in paths]
    names = [p.model for p in profiles]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DraftsimError(f"--profile: two profiles of {twice[0]}; give one per model")
    return profiles


def _print_check(c: dict) -> None:
    if not c.get("replayable"):
        print(f"simulator check: not replayable ({c['reason']})")
        return
    if c.get("tree"):
        counts = (f"tokens per round {c['sim']['tokens_per_round']:.2f} vs {c['real_tokens_per_round']:.2f} "
                  f"({c['tokens_per_round_error']:+.1%}; per-level acceptance {c['level_acceptance']:.2f})")
    else:
        r, s = c["real"], c["sim"]
        counts = "counts " + ("identical" if c["counts_equal"] else "differ: " + ", ".join(f"{k} {s[k]} vs {r[k]}" for k in r if s[k] != r[k]))
    p = c["pricing"]
    print(f"simulator check: {counts}; predicted {c['predicted_tokens_per_second']:.1f} tokens/s vs measured "
          f"{c['measured_tokens_per_second']:.1f} ({c['tokens_per_second_error']:+.1%}; model time {c['model_time_error']:+.1%}, "
          f"{c['overhead_share']:.0%} of the run outside model calls)")
    print(f"  priced with: {', '.join(f'model {m} {s}' for m, s in enumerate(p['sources']))} at context {p['context']}; "
          f"executor overhead {1e3 * p['overhead']['per_round']:.2f} ms/round + {1e3 * p['overhead']['per_token']:.2f} ms/token")
    if "run_speed_factor" in c:
        print(f"  at the machine's speed during the run (the interleaved autoregressive calls took {c['run_speed_factor']:.3f}x "
              f"their profiled time): predicted {c['predicted_tokens_per_second_at_run_speed']:.1f} tokens/s "
              f"({c['tokens_per_second_error_at_run_speed']:+.1%})")


def run_check(args: argparse.Namespace) -> int:
    results = check_sim(from_namespace(CheckSimConfig, args))
    if args.json:
        a.emit_json(results if len(results) > 1 else results[0])
        return 0
    for c in results:
        print(f"{c['path']}: {c['method']} {c['policy']} ({c['mode']}, {c['sequences']} sequences)")
        _print_check(c)
    return 0
