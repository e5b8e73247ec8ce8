"""The ``draftsim`` command: one entry point, one subcommand per task.

Every subcommand accepts ``--json``. Invalid input prints one line on stderr and exits with
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from draftsim.sim.errors import DraftsimError

from . import __version__
from .commands import (
    acceptance,
    calibration,
    costing,
    demo,
    distillation,
    heads,
    optimization,
    planning,
    running,
    serve,
    servesim,
    simulation,
    sweeping,
    traces,
)

COMMANDS = (planning, simulation, acceptance, optimization, costing, calibration, traces, distillation, heads, running, serve, servesim, sweeping, demo)


#: ``draftsim --help`` lists the commands in these groups, in this order (a test checks that every
#: command is in one).
GROUPS = (
    ("serve: capacity planning of speculative serving", ("capacity", "serve-sim", "check-serve")),
    ("plan: closed forms, no simulation", ("ewif", "plan", "optimize", "cost", "acceptance")),
    ("simulate: policies under acceptance processes", ("simulate", "sweep", "sweep-plot", "trace", "replay")),
    ("measure: this machine, real runs, calibration", ("profile", "calibrate", "check-sim")),
    ("real models: decode, serve and train on this CPU", ("run", "serve", "record", "distill", "train-head", "demo")),
)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="draftsim",
        description="Plan, simulate and verify speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"draftsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="write machine-readable JSON to stdout")
    for module in COMMANDS:
        module.register(sub, common)
    parser.format_help = lambda: _grouped_help(parser, sub)  # noqa: E731 - argparse has no hook for grouped subcommands
    return parser


def _grouped_help(parser: argparse.ArgumentParser, sub) -> str:
    """``draftsim --help``: the usage, then every command under its group (:data:`GROUPS`)."""
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    width = max(len(name) for name in helps) + 2
    lines = [parser.format_usage().rstrip(), "", parser.description, ""]
    for title, names in GROUPS:
        lines.append(f"{title}:")
        lines += [f"  {name:<{width}}{helps[name]}" for name in names if name in helps]
        lines.append("")
    rest = [name for name in helps if not any(name in names for _, names in GROUPS)]
    if rest:
        lines.append("other:")
        lines += [f"  {name:<{width}}{helps[name]}" for name in rest]
        lines.append("")
    lines += ["options:", "  -h, --help  show this help message and exit", "  --version   show the version and exit", "",
              "Start with: draftsim capacity --target MODEL --hardware HW --tp N --load QPS --slo ttft:p99=2s "
              "(draftsim COMMAND --help for each command)"]
    return "\n".join(lines) + "\n"


def _join_dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--alpha -inf`` as ``--alpha=-inf``: for options that take one value, a following
    token that starts with a single dash and is not an option of the command is the value.

    argparse reads only plain negative numbers (``-1``, ``-0.5``) as values; ``-inf`` or
    ``-1,0.002`` would otherwise be reported as a missing argument ("expected one
    argument") instead of being checked — and named — as the bad value it is.
    """
    current, chain = parser, [parser]
    for token in argv:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and not token.startswith("-") and token in subs[0].choices:
            current = subs[0].choices[token]
            chain.append(current)
    takes_value, options = set(), set()
    for p in chain:
        for action in p._actions:
            options.update(action.option_strings)
            if action.option_strings and action.nargs is None:
                takes_value.update(action.option_strings)
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if token in takes_value and nxt is not None and nxt.startswith("-") and not nxt.startswith("--") and nxt not in options:
            out.append(f"{token}={nxt}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    nul = next((a for a in argv if "\x00" in a), None)
    if nul is not None:  # no path, name or number holds one (os calls raise ValueError on it)
        shown = nul.replace(chr(0), "\\0")
        parser.error(f"argument {shown!r} contains a NUL byte; no option takes one")
    args = parser.parse_args(_join_dash_values(parser, argv))
    try:
        return int(args.run(args) or 0)
    except DraftsimError as exc:
        print(f"draftsim {_command(args)}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `draftsim ... | head`: stop quietly (before OSError, its base class)
        sys.stdout = open(os.devnull, "w")
        return 0
    except OSError as exc:  # a write that passed the checks but failed anyway (disk full, ...)
        name = f" {exc.filename!r}" if exc.filename else ""
        print(f"draftsim {_command(args)}: error: cannot read or write{name}: {_one_line(exc.strerror or exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftsim: interrupted", file=sys.stderr)
        return 130


def _command(args: argparse.Namespace) -> str:
    sub = {"optimize": "what", "trace": "trace_command"}.get(args.command)
    return f"{args.command} {getattr(args, sub)}" if sub else args.command


def _one_line(exc) -> str:
    return " ".join(str(exc).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
