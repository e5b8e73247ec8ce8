"""The sweep kinds: what a point of ``draftsim sweep`` / ``draftsim capacity`` runs.

A point is "a command line as a table": its configuration (option → value, named as the
command's flags without ``--``) becomes the command's argv and is parsed by the command's
own argument parser — the same types, ranges and messages as on the command line — and the
command runs with ``--json``; metrics are paths into that JSON. Adding a kind is one entry
of :data:`KINDS`: the command, a deeper check of a parsed point (before any work), the
metric table and which option takes the seed / the request rate.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
from contextlib import redirect_stderr, redirect_stdout

from draftsim.analysis.sweep import Kind
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import parse_policy

#: Flag-less position of a kind's command in argv: (command, option naming the subcommand).
COMMANDS = {"simulate": ("simulate", None), "serve": ("serve-sim", None), "optimize": ("optimize", "what"), "replay": ("replay", None)}


class RefusingParser(argparse.ArgumentParser):
    """An ArgumentParser that raises :class:`DraftsimError` instead of exiting."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise DraftsimError(" ".join(message.split()))

    def exit(self, status: int = 0, message: str | None = None):
        raise DraftsimError(" ".join((message or f"exit status {status}").split()))


@functools.cache
def root_parser() -> argparse.ArgumentParser:
    """Every ``draftsim`` subcommand, registered by its own module, with refusing parsers."""
    from . import cli

    root = RefusingParser(prog="draftsim", add_help=False)
    sub = root.add_subparsers(dest="command", parser_class=RefusingParser)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true")
    for module in cli.COMMANDS:
        module.register(sub, common)
    return root


def command_parser(command: str, what: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``draftsim COMMAND [WHAT]``; a DraftsimError if this build lacks it."""
    subs = [a for a in root_parser()._actions if isinstance(a, argparse._SubParsersAction)][0]
    if command not in subs.choices:
        raise DraftsimError(f"draftsim {command} is not available in this build (commands: {', '.join(subs.choices)})")
    parser = subs.choices[command]
    if what is None:
        return parser
    inner = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0]
    if what not in inner.choices:
        raise DraftsimError(f"what = {what!r}: draftsim {command} runs one of {', '.join(inner.choices)}")
    return inner.choices[what]


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's options by canonical name (``--verify-per-token`` → ``verify_per_token``)."""
    out = {}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag not in ("--help", "--json"):
                out[flag[2:].replace("-", "_")] = action
    return out


def text(value) -> str:
    """A TOML value as command-line text (``0.1``, ``7``, ``fixed:k=4``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def argv(kind: str, config: dict) -> tuple[list[str], argparse.ArgumentParser]:
    """The command line of a configuration, and the parser that reads it."""
    command, sub_option = COMMANDS[kind]
    config = dict(config)
    what = None
    if sub_option is not None:
        if sub_option not in config:
            raise DraftsimError(f"kind {kind} needs {sub_option} = ... in [base] (the subcommand: draftsim {command} WHAT)")
        what = config.pop(sub_option)
        if not isinstance(what, str):
            raise DraftsimError(f"{sub_option} must be a subcommand name; got {what!r}")
    parser = command_parser(command, what)
    known = options(parser)
    out = [command] + ([what] if what else [])
    head = " ".join(out)
    for name, value in config.items():
        if name not in known:
            raise DraftsimError(f"draftsim {head} has no option --{name.replace('_', '-')}; "
                                f"its options: {', '.join(sorted(known))}")
        action, flag = known[name], "--" + name.replace("_", "-")
        if action.nargs == 0:
            if not isinstance(value, bool):
                raise DraftsimError(f"--{name.replace('_', '-')} is a flag: give true or false; got {value!r}")
            if value:
                out.append(flag)
            continue
        if isinstance(value, bool):
            raise DraftsimError(f"--{name.replace('_', '-')} takes a value, not {str(value).lower()}")
        if isinstance(value, list):
            if not isinstance(action, argparse._AppendAction):
                raise DraftsimError(f"--{name.replace('_', '-')} takes one value; got the list {value!r} "
                                    "(to vary it, put it in [grid], [[zip]] or [random])")
            out.extend(f"{flag}={text(v)}" for v in value)
        else:
            out.append(f"{flag}={text(value)}")
    return out, parser


def parse(kind: str, config: dict, seed: int | None = None) -> argparse.Namespace:
    """A configuration parsed by the command's own parser, as the command would see it."""
    words, _ = argv(kind, config)
    seed_option = KINDS[kind].seed_option if kind in KINDS else None
    if seed is not None and seed_option:
        words.append(f"--{seed_option.replace('_', '-')}={seed}")
    words.append("--json")
    return root_parser().parse_args(words)


def run_command(kind: str, config: dict, seed: int | None) -> dict:
    """Run a configuration as ``draftsim ... --json`` in this process and return its JSON."""
    args = parse(kind, config, seed)
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        status = args.run(args)
    if status:
        raise DraftsimError(f"draftsim {args.command} exited with status {status}")
    return json.loads(out.getvalue())


# --- per-kind checks, before any work --------------------------------------------------------


def check_simulate(config: dict) -> None:
    from .commands import simulation

    args = parse("simulate", config)
    _, process, _, _ = simulation.prepare(args)
    simulation.check_work(args.engine, process, args.tokens)


def check_optimize(config: dict) -> None:
    from .commands import optimization

    args = parse("optimize", config)
    if args.target == "threshold":
        optimization.threshold_problem(args)


def check_replay(config: dict) -> None:
    from draftsim.sim.traces import Trace

    args = parse("replay", config)
    parse_policy(args.policy)
    Trace(args.trace)


def check_serve(config: dict) -> None:
    from draftsim.sim.controllers import parse_controller
    from draftsim.sim.serving.workload import parse_arrivals, parse_lengths

    from .commands import costing

    args = parse("serve", config)
    parse_policy(args.policy)
    parse_controller(args.controller)
    parse_arrivals(args.arrivals)
    parse_lengths(args.prompt_len, "--prompt-len")
    parse_lengths(args.output_len, "--output-len")
    costing.build_models(args)


# --- metric tables ---------------------------------------------------------------------------

_SIM_METRICS = ("tokens_per_call", "ewif", "swi", "acceptance_rate", "discard_rate", "verification_rate", "latency_per_token",
                "time_per_token")
SIMULATE_METRICS = {
    **{m: f"metrics.{m}.value" for m in _SIM_METRICS},
    **{f"{m}_se": f"metrics.{m}.se" for m in _SIM_METRICS},
    "analytic_ewif": "analytic_ewif",
    "tokens": "tokens",
    "n_sequences": "n_sequences",
    **{f"latency_{q}": f"requests.latency_{q}" for q in ("mean", "p50", "p90", "p99")},
    "throughput": "requests.throughput",
}
OPTIMIZE_METRICS = {
    "optimal": "comparison.optimal",
    "best_fixed_k": "comparison.best_fixed_k.k",
    "best_fixed_k_latency": "comparison.best_fixed_k.latency_per_token",
    "best_threshold_h": "comparison.best_threshold.h",
    "best_threshold_latency": "comparison.best_threshold.latency_per_token",
    "oracle": "comparison.oracle",
    "autoregressive": "comparison.autoregressive",
    "exact_ewif": "exact.ewif",
    "grid_ewif": "grid.ewif",
    "best_single_ewif": "best_single_drafter.ewif",
    "tree_tokens_per_time": "tree.tokens_per_time",
    "tree_size": "tree.size",
    "tree_depth": "tree.depth",
    "chain_tokens_per_time": "best_chain.tokens_per_time",
    "chain_length": "best_chain.length",
}
REPLAY_METRICS = {k: v for k, v in SIMULATE_METRICS.items() if not v.startswith(("requests.", "analytic"))}
REPLAY_METRICS.update(oracle_speedup="oracle.speedup", oracle_latency="oracle.latency_per_token")
_SERVE_STATS = ("ttft", "tpot", "itl", "e2e", "queue")
_SERVE_SCALARS = ("throughput", "request_throughput", "goodput", "slo_attainment", "requests", "output_tokens", "steps", "busy",
                  "mean_batch", "max_batch", "kv_utilisation", "kv_utilisation_max", "preemptions")
SERVE_METRICS = {
    **{f"{m}_{s}": f"{m}.{s}" for m in _SERVE_STATS for s in ("mean", "p50", "p90", "p99")},
    **{f"{m}_{s}_ci95": f"ci95.{m}.{s}" for m in _SERVE_STATS for s in ("mean", "p50", "p90", "p99")},
    **{m: m for m in _SERVE_SCALARS},
    **{f"{m}_ci95": f"ci95.{m}" for m in _SERVE_SCALARS},
    **{m: f"spec_decode.{m}" for m in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "mean_acceptance_length",
                                       "draft_acceptance_rate")},
}

KINDS: dict[str, Kind] = {
    "simulate": Kind(
        "simulate", check_simulate, functools.partial(run_command, "simulate"), SIMULATE_METRICS,
        ("ewif", "ewif_se", "tokens_per_call", "acceptance_rate", "latency_per_token", "analytic_ewif"),
        seed_option="seed", rate_option="rate", forbidden=("timeline", "timeline_png"),
        help="draftsim simulate: Monte Carlo or discrete-event simulation of a policy"),
    "serve": Kind(
        "serve", check_serve, functools.partial(run_command, "serve"), SERVE_METRICS,
        ("ttft_p99", "tpot_p50", "e2e_p99", "throughput", "goodput", "mean_acceptance_length"), seed_option="seed", rate_option="qps",
        forbidden=("timeline", "figure", "sweep_qps"),
        help="draftsim serve-sim: continuous-batching serving simulation"),
    "optimize": Kind(
        "optimize", check_optimize, functools.partial(run_command, "optimize"), OPTIMIZE_METRICS, tuple(OPTIMIZE_METRICS),
        seed_option=None, help="draftsim optimize WHAT (what = kmatrix | threshold | tree in [base])"),
    "replay": Kind(
        "replay", check_replay, functools.partial(run_command, "replay"), REPLAY_METRICS,
        ("ewif", "tokens_per_call", "acceptance_rate", "oracle_speedup"), seed_option="seed",
        help="draftsim replay: a policy over a recorded trace"),
}
