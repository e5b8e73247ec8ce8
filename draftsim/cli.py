"""The ``draftsim`` command: one entry point, one subcommand per task.

Every subcommand accepts ``--json``. Invalid input prints one line on stderr and exits with
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from .commands.table import BY_NAME, GROUPS, TABLE

__all__ = ["GROUPS", "MAX_DIGITS", "build_parser", "main"]

#: The most digits in a row any argument holds: counts and seeds are 64-bit (19 digits) and other
#: values floats (an integer of 309 digits is past float's range); a longer run is a typo or junk.
MAX_DIGITS = 100


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def _check_value(self, action, value):  # argparse API: an unknown (sub)command or choice names the closest ones
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            if action.choices is None:
                raise
            from draftsim.sim.errors import did_you_mean

            hint = did_you_mean(value, list(action.choices))
            if not hint:
                raise
            head, paren, tail = exc.message.partition(" (choose from")
            raise argparse.ArgumentError(action, f"{head}{hint}{paren}{tail}") from None


class _Version(argparse.Action):
    """``--version``: the installed version, read only when asked (importlib.metadata is slow to import)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help="show the version and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from . import __version__

        print(f"draftsim {__version__}")
        parser.exit()


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The ``draftsim`` parser. The modules of ``commands`` (names; None: every command) are
    imported and register their full parsers; every other command of the table
    (:mod:`draftsim.commands.table`) stands in as a bare parser with its summary, enough for
    ``draftsim --help`` and for an unknown command's error, without importing its module."""
    parser = _Parser(
        prog="draftsim",
        description="Plan, simulate and verify speculative decoding.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="write machine-readable JSON to stdout")
    wanted = TABLE if commands is None else [BY_NAME[name] for name in commands]
    for module in dict.fromkeys(entry.qualified_module for entry in wanted):
        importlib.import_module(module).register(sub, common)
    for entry in TABLE:
        if entry.name not in sub.choices:
            sub.add_parser(entry.name, help=entry.summary, add_help=False)
    in_order = {entry.name: sub.choices.pop(entry.name) for entry in TABLE}  # an unknown command's error lists them as --help does
    sub.choices.update(in_order)
    parser.format_help = lambda: _grouped_help(parser)  # noqa: E731 - argparse has no hook for grouped subcommands
    return parser


def _grouped_help(parser: argparse.ArgumentParser) -> str:
    """``draftsim --help``: the usage, then every command under its group (:data:`GROUPS`),
    from the table: no command module is imported."""
    width = max(len(entry.name) for entry in TABLE) + 2
    lines = [parser.format_usage().rstrip(), "", parser.description, ""]
    for title, names in GROUPS:
        lines.append(f"{title}:")
        lines += [f"  {name:<{width}}{BY_NAME[name].summary}" for name in names]
        lines.append("")
    lines += ["options:", "  -h, --help  show this help message and exit", "  --version   show the version and exit", "",
              "Start with: draftsim capacity --target MODEL --hardware HW --tp N --load QPS --slo ttft:p99=2s "
              "(draftsim COMMAND --help for each command)"]
    return "\n".join(lines) + "\n"


def _parsers(parser: argparse.ArgumentParser, argv: list[str]) -> list[argparse.ArgumentParser]:
    """The parser and the (sub)command parsers the words of ``argv`` name, outermost first."""
    current, chain = parser, [parser]
    for token in argv:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and not token.startswith("-") and token in subs[0].choices:
            current = subs[0].choices[token]
            chain.append(current)
    return chain


def _join_dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--alpha -inf`` as ``--alpha=-inf``: for options that take one value, a following
    token that starts with a single dash and is not an option of the command is the value.

    argparse reads only plain negative numbers (``-1``, ``-0.5``) as values; ``-inf`` or
    ``-1,0.002`` would otherwise be reported as a missing argument ("expected one
    argument") instead of being checked — and named — as the bad value it is.
    """
    chain = _parsers(parser, argv)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    # the command is the first word (draftsim's own options take no value); only its module is imported
    word = next((token for token in argv if not token.startswith("-")), None)
    parser = build_parser([word] if word in BY_NAME else [])
    nul = next((a for a in argv if "\x00" in a), None)
    if nul is not None:  # no path, name or number holds one (os calls raise ValueError on it)
        shown = nul.replace(chr(0), "\\0")
        parser.error(f"argument {shown!r} contains a NUL byte; no option takes one")
    joined = _join_dash_values(parser, argv)
    args, extra = parser.parse_known_args(joined)
    if extra:  # refused by the command that was given them, not by draftsim itself, with the nearest option
        _refuse_unrecognized(parser, joined, extra)
    from draftsim.sim.errors import DraftsimError

    try:
        return int(args.run(args) or 0)
    except DraftsimError as exc:
        print(f"draftsim {_command(args)}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:  # int() of over 4,300 digits, from an argument or a file no check before it read as a number
        if "integer string conversion" not in str(exc):
            raise
        print(f"draftsim {_command(args)}: error: {_long_number(argv) or _long_in_file(argv)}", file=sys.stderr)
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


def _refuse_unrecognized(parser: argparse.ArgumentParser, argv: list[str], extra: list[str]) -> None:
    """``draftsim capacity: error: unrecognized arguments: --overhead; did you mean --overheads or
    --overhead-...?``: the deepest (sub)command the words name refuses what it does not know (argparse
    leaves that to the top parser, which names no command), suggesting the nearest of its options."""
    from draftsim.sim.errors import did_you_mean

    current = _parsers(parser, argv)[-1]
    options = [s for a in current._actions for s in a.option_strings if s.startswith("--")]
    first = next((x.partition("=")[0] for x in extra if x.startswith("--")), None)
    hint = did_you_mean(first, options) if first else ""
    current.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def _long_number(argv: list[str]) -> str | None:
    """The argument holding the longest run of digits, named with its option, as a refusal: Python
    converts integers of at most 4,300 digits (``sys.get_int_max_str_digits``), and no value
    draftsim reads needs more than :data:`MAX_DIGITS` (counts and seeds are 64-bit, other values
    floats); None when no argument holds more."""
    runs = [(max((len(m) for m in re.findall(r"[0-9]+", a)), default=0), i) for i, a in enumerate(argv)]
    digits, at = max(runs, default=(0, 0))
    if digits <= MAX_DIGITS:
        return None
    token = argv[at]
    flag = token.partition("=")[0] if token.startswith("--") else (argv[at - 1] if at and argv[at - 1].startswith("--") else None)
    return (f"{'argument ' + flag + ': ' if flag else ''}{token[:24]!r}... holds a number of {digits:,} digits; no option takes "
            f"one over {MAX_DIGITS} digits (write a large or small value with an exponent, e.g. 1e300)")


def _long_in_file(argv: list[str]) -> str:
    """The refusal of an integer past Python's int-string limit that a file reader met (the readers
    of sim.files.parse_json name their file themselves): the files the command line names."""
    files = [a.partition("=")[2] if a.startswith("--") else a for a in argv]
    files = [f for f in dict.fromkeys(files) if f and os.path.isfile(f)]
    where = " or ".join(repr(f) for f in files[:3]) if files else "an input file"
    return f"{where} holds an integer of more digits than draftsim reads ({sys.get_int_max_str_digits():,})"


def _command(args: argparse.Namespace) -> str:
    sub = {"optimize": "what", "trace": "trace_command"}.get(args.command)
    return f"{args.command} {getattr(args, sub)}" if sub else args.command


def _one_line(exc) -> str:
    return " ".join(str(exc).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
