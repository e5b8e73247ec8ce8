"""``draftsim record``, ``draftsim trace info`` and ``draftsim replay``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from draftsim.analysis.table import format_table
from draftsim.sim.acceptance import TraceDriven
from draftsim.sim.cost import Costs
from draftsim.sim.errors import DraftsimError
from draftsim.sim.mdp import oracle_latency
from draftsim.sim.policies import POLICY_HELP, parse_policy
from draftsim.sim.registry import lookup_drafters
from draftsim.sim.simulate import SimResult
from draftsim.sim.simulate import simulate as run_engine
from draftsim.sim.traces import Trace

from .. import args as a
from ..config import add_options, as_dict, check, from_namespace, option, typed
from ..progress import count_bar, null_bar
from .simulation import McMetrics
from .table import summary


@dataclass(kw_only=True)
class RecordConfig:
    """``draftsim record``: a trace of real drafters against a real target on prompt sets."""

    target: str = option("smollm2", "target: smollm2 (embedded), tiny[:SEED], random:NAME[:SEED] (random weights, a catalog model's shape), a checkpoint folder or a .gguf file (--model: the old "
                         "spelling)", aliases=("--model",))
    drafter: list[str] = option(help=f"{lookup_drafters()}, distilled, or a neural model (tiny:SEED, folder, .gguf); repeat, larger drafters "
                                "first", append=True, required=True)
    prompts: str = option("code", "prompt set(s), comma-separated: code, arithmetic, instructions, docstrings, edit, extract")
    split: str = option("test", choices=("train", "test", "all"))
    n: int = option(20, "number of prompts (per set)", type=a.count("n", 1, 100_000))
    max_new_tokens: int = option(128, type=a.count("max_new_tokens", 1, 4096))
    sample_seed: int | None = option(help="also record a sampled output (temperature 1) with this seed", type=a.count("sample_seed"))
    top_k: int = option(8, type=a.count("top_k", 1, 64))
    out: str = option(help="trace folder", required=True)
    resume: bool = option(False, "continue an interrupted recording", flag=True)
    device: str = option("auto", "auto (CUDA when present), cpu or cuda[:N]")
    dtype: str = option("float32", choices=("float32", "bfloat16", "float16"))


@dataclass(kw_only=True)
class TraceInfoConfig:
    """``draftsim trace info``: a trace's summary."""

    path: str = option(help="trace folder", positional=True)


@dataclass(kw_only=True)
class ReplayConfig:
    """``draftsim replay``: a simulator policy over a recorded trace's acceptance."""

    trace: str = option(help="trace folder (draftsim record)", required=True)
    policy: str = option(help="policy in the mini-language below (e.g. fixed:k=4)", required=True)
    trace_drafter: list[str] | None = option(help="the trace's drafter(s) playing models 1, 2, ... (default: the first recorded)",
                                             append=True, metavar="NAME", aliases=("--drafter",))
    kind: str = option("flag", "flag: greedy match (greedy decoding); prob: 1 - TV (sampling)", choices=("prob", "flag"))
    cost: list[float] | None = option(help="cost coefficient per drafter (default: measured in the trace)", type=a.cost("cost"),
                                      append=True)
    seed: int = option(0, type=a.count("seed"))


@dataclass(frozen=True)
class OracleStats:
    """The oracle of SpecDec++ Theorem 4.1 on the trace (every drafted token known to match or
    not before verification): latency per token in target calls and speedup over autoregressive."""

    latency_per_token: float
    n_tokens: int
    n_target: int
    n_discarded: int
    speedup: float


@dataclass
class ReplayResult:
    """What ``draftsim replay`` reports: the Monte Carlo run (``run``) and its metrics typed, the
    trace's drafters that played models 1, 2, ..., their cost coefficients, and the oracle
    (flag acceptance only)."""

    run: SimResult
    metrics: McMetrics
    drafters: list[str]
    costs: list[float]
    oracle: OracleStats | None
    trace: str

    @property
    def tokens(self) -> int:
        """Tokens replayed."""
        return self.run.tokens

    @property
    def n_sequences(self) -> int:
        """Sequences replayed."""
        return self.run.n_sequences

    def to_dict(self) -> dict:
        out = self.run.to_dict()
        out["drafters"] = self.drafters
        if self.oracle is not None:
            out["oracle"] = as_dict(self.oracle)
        return out


def register(sub, common) -> None:
    r = sub.add_parser("record", parents=[common], help=summary("record"),
                       description="Generate with the target on a prompt set and record, per position, how each drafter agrees with it.")
    add_options(r, RecordConfig)
    r.set_defaults(run=run_record)

    t = sub.add_parser("trace", help=summary("trace"))
    tsub = t.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    i = tsub.add_parser("info", parents=[common], help="summarise a trace: acceptance by drafter and position, timings")
    add_options(i, TraceInfoConfig)
    i.set_defaults(run=run_info)

    p = sub.add_parser("replay", parents=[common], help=summary("replay"),
                       description="Replay the recorded acceptance under any policy and report the simulator's metrics.",
                       epilog=POLICY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p, ReplayConfig)
    p.set_defaults(run=run_replay)


def record_trace(config: RecordConfig, bar=null_bar):
    """Record how ``config``'s drafters agree with its target on the prompts into the trace
    folder ``config.out``; returns :class:`draftsim.realrun.record.RecordStats`. Every option is
    checked before the model loads (seconds, and loader noise on stderr); ``bar(total, desc)``
    is a progress-bar context (:func:`draftsim.progress.count_bar`)."""
    from draftsim.realrun.methods import fit_bigram, make_drafter
    from draftsim.realrun.models import check_all_fit, load_model, pick_device
    from draftsim.realrun.prompts import prompt_set
    from draftsim.realrun.record import record

    check(config)
    a.model_name("--target", config.target)
    a.drafter_names("--drafter", config.drafter)
    sets = a.prompt_sets("--prompts", config.prompts)
    a.device(config.device)
    a.trace_folder("--out", config.out, config.resume)
    check_all_fit([config.target, *config.drafter], pick_device(config.device), config.dtype)  # before any loads
    target = load_model(config.target, device=config.device, dtype=config.dtype)
    bigram = fit_bigram(target)
    drafters = [make_drafter(spec, target, bigram) for spec in config.drafter]
    prompts = [p for s in sets for p in prompt_set(s, None if config.split == "all" else config.split, config.n)]
    n_modes = 2 if config.sample_seed is not None else 1
    with bar(len(prompts) * n_modes, "recording") as b:
        return record(target, drafters, prompts, config.out, prompt_set="+".join(sets), max_new_tokens=config.max_new_tokens,
                      top_k=config.top_k, sample_seed=config.sample_seed, resume=config.resume, progress=b.update)


def run_record(args: argparse.Namespace) -> int:
    config = from_namespace(RecordConfig, args)
    stats = record_trace(config, count_bar)
    out = {"trace": config.out, "recorded": stats.prompts, "skipped (already done)": stats.skipped, "output_tokens": stats.output_tokens,
           "seconds": stats.seconds, "tokens_per_second": stats.output_tokens / stats.seconds if stats.seconds else None}
    if args.json:
        a.emit_json(out)
    else:
        print(f"recorded {stats.prompts} sequences ({stats.skipped} already done) into {config.out}: {stats.output_tokens} tokens "
              f"in {stats.seconds:.1f} s ({out['tokens_per_second'] or 0:.1f} tokens/s)")
        _print_summary(Trace(config.out).summary())
    return 0


def _print_summary(s: dict) -> None:
    md = s["metadata"]
    target = md["target"] if isinstance(md["target"], dict) else {"name": md["target"]}
    params = target.get("parameters")
    print(f"trace {s['path']}: target {target.get('name')} ({f'{params:,}' if isinstance(params, int) else 'unknown'} parameters), "
          f"prompts {md['prompt_set']}, {s['sequences']} sequences, {s['output_tokens']} output tokens")
    rows = [[p["proposer"], p["verifier"], p["positions"], p["mean_accept_prob"], p["greedy_match_rate"],
             " ".join(f"{v:.2f}" for v in p["match_by_position"].values())] for p in s["pairs"]]
    print(format_table(["proposer", "verifier", "positions", "1-TV", "greedy match", "match by 16-token bucket"], rows))
    sets = {r["prompt_set"] for r in s["by_prompt_set"]}
    if len(sets) > 1:
        rows = [[r["proposer"], r["verifier"], r["prompt_set"], r["positions"], r["mean_accept_prob"], r["greedy_match_rate"]]
                for r in s["by_prompt_set"] if r["verifier"] == "target"]
        print(format_table(["proposer", "verifier", "prompt set", "positions", "1-TV", "greedy match"], rows))
    rows = [[c["model"], c["kind"], c["calls"], c["tokens"], c["seconds"]] for c in s["calls"]]
    print(format_table(["model", "call", "calls", "tokens", "seconds"], rows))


def run_info(args: argparse.Namespace) -> int:
    s = Trace(from_namespace(TraceInfoConfig, args).path).summary()
    if args.json:
        a.emit_json(s)
    else:
        _print_summary(s)
    return 0


def replay(config: ReplayConfig) -> ReplayResult:
    """Replay the trace's recorded acceptance under ``config``'s policy in the Monte Carlo engine
    (costs as given, else as measured in the trace); with flag acceptance, the oracle too."""
    check(config)
    trace = Trace(config.trace)
    policy = parse_policy(config.policy)
    names = config.trace_drafter or trace.drafters()[: max(policy.n_models - 1, 1)]
    if len(names) != max(policy.n_models - 1, 1):
        raise DraftsimError(f"policy {config.policy} uses {policy.n_models - 1} drafter(s); --trace-drafter names {len(names)} "
                            f"({', '.join(names)}); the trace has {', '.join(trace.drafters())}")
    if len(set(names)) != len(names):
        raise DraftsimError(f"--trace-drafter names a drafter twice ({', '.join(names)}); each model of the policy needs its own")
    if config.cost is not None and len(config.cost) != len(names):
        raise DraftsimError(f"give --cost once per drafter ({len(names)}: {', '.join(names)}); got {len(config.cost)} value(s)")
    process = TraceDriven.from_trace(trace, names, kind=config.kind)
    costs = config.cost or trace.cost_coefficients(names)
    result = run_engine(policy, process, Costs.coefficients(costs), 1, seed=config.seed)
    oracle = None
    if config.kind == "flag":
        flags = [f.astype(int) for f in trace.acceptance(names[0], "target", kind="flag")]
        oracle = typed(OracleStats, oracle_latency(flags, max(costs[0], 1e-12), 1.0))
    return ReplayResult(result, typed(McMetrics, result.metrics), list(names), [float(c) for c in costs], oracle, str(trace.path))


def run_replay(args: argparse.Namespace) -> int:
    config = from_namespace(ReplayConfig, args)
    out = replay(config)
    if args.json:
        a.emit_json(out.to_dict())
        return 0
    result = out.run
    print(f"{result.policy!r} replayed on {out.trace} ({', '.join(out.drafters)}; {config.kind}); cost coefficients "
          f"{np.round(out.costs, 5).tolist()}")
    rows = [[k, v.value, v.se] for k, v in result.metrics.items()]
    print(format_table(["metric", "value", "SE"], rows))
    if out.oracle is not None:
        print(f"oracle (SpecDec++ Theorem 4.1): latency/token {out.oracle.latency_per_token:.4f}, speedup {out.oracle.speedup:.3f} "
              f"vs replayed {1.0 / result.metrics['latency_per_token'].value:.3f}")
    return 0
