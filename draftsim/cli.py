"""The ``draftsim`` command: one entry point, one subcommand per task.

Every subcommand accepts ``--json``. Invalid input prints one line on stderr and exits with
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from sim.errors import DraftsimError

from . import __version__
from .commands import costing, demo, distillation, heads, optimization, planning, running, simulation, traces

COMMANDS = (planning, simulation, optimization, costing, traces, distillation, heads, running, demo)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except DraftsimError as exc:
        print(f"draftsim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `draftsim ... | head`: stop quietly
        sys.stdout = open(os.devnull, "w")
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
