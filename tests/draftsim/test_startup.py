"""The command line imports only what the invoked command needs.

``draftsim --help`` is printed from the command table (:mod:`draftsim.commands.table`) and
imports no command module; a command imports its own module and not the serving simulator,
matplotlib, simpy, torch, pyarrow or ray unless it uses them. Structural checks of
``sys.modules`` in a fresh interpreter, not timings (those are ``benchmarks/bench_startup.py``'s).
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pytest
from clirun import run

from draftsim.cli import GROUPS, build_parser
from draftsim.commands.table import BY_NAME, GROUP_TITLES, TABLE

#: What ``draftsim ewif`` must not import: plotting, the engines and the serving simulator,
#: real models, Parquet, Ray, the sweep machinery and every other command's module.
EWIF_NEVER = ("matplotlib", "simpy", "scipy", "torch", "transformers", "pyarrow", "ray", "pandas",
              "draftsim.sim.des", "draftsim.sim.montecarlo", "draftsim.sim.serving", "draftsim.analysis.figures",
              "draftsim.analysis.demo", "draftsim.analysis.sweep", "draftsim.sweepkinds", "draftsim.realrun")


def modules_after(argv: list[str], tmp_path) -> tuple[int, list[str]]:
    """Run ``draftsim argv`` in a fresh interpreter; its exit status and the modules it loaded."""
    code = ("import io, contextlib, json, sys\n"
            "from draftsim.cli import main\n"
            "out = io.StringIO()\n"
            "try:\n"
            "    with contextlib.redirect_stdout(out):\n"
            f"        status = main({argv!r})\n"
            "except SystemExit as exc:\n"
            "    status = exc.code\n"
            "assert out.getvalue(), 'printed nothing'\n"
            "print(json.dumps([status, sorted(sys.modules)]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    status, modules = json.loads(done.stdout.splitlines()[-1])
    return status, modules


def loaded(modules: list[str], names) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in names)]


def test_ewif_imports_only_what_it_needs(tmp_path):
    status, modules = modules_after(["ewif", "--alpha", "0.8", "--cost", "0.05"], tmp_path)
    assert status == 0
    assert loaded(modules, EWIF_NEVER) == []
    commands = {m for m in modules if m.startswith("draftsim.commands.")}
    assert commands == {"draftsim.commands.table", "draftsim.commands.planning", "draftsim.commands.costing"}, commands


def test_help_imports_no_command_module(tmp_path):
    status, modules = modules_after(["--help"], tmp_path)
    assert status == 0
    assert [m for m in modules if m.startswith("draftsim.") and m not in ("draftsim.cli", "draftsim.commands", "draftsim.commands.table")] == []
    assert loaded(modules, ("numpy", "importlib.metadata", *EWIF_NEVER)) == []


def test_the_table_lists_exactly_the_commands_the_parser_knows():
    """No drift: the full parser's commands are the table's, in its order, and each module
    registers exactly the commands the table gives it, with the table's summary."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == [e.name for e in TABLE]
    for module in dict.fromkeys(e.module for e in TABLE):
        own = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"draftsim.commands.{module}").register(own, argparse.ArgumentParser(add_help=False))
        registered = {a.dest: a.help for a in own._choices_actions}
        assert registered == {e.name: e.summary for e in TABLE if e.module == module}, module


def test_every_command_is_in_one_group():
    keys = [key for key, _ in GROUP_TITLES]
    assert all(e.group in keys for e in TABLE) and len(BY_NAME) == len(TABLE)
    assert sorted(n for _, names in GROUPS for n in names) == sorted(BY_NAME)


@pytest.mark.parametrize("name", [e.name for e in TABLE])
def test_the_lazy_parser_of_a_command_is_its_full_parser(name):
    """``draftsim NAME …`` parses with the parser its module registers, not a stand-in."""
    def options(parser):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return sorted(s for a in sub.choices[name]._actions for s in a.option_strings)

    lazy = options(build_parser([name]))
    assert lazy == options(build_parser()) and "--help" in lazy


def test_help_of_a_command_is_its_generated_parser(capsys):
    status, out, err = run(capsys, "ewif", "--help")
    assert status == 0 and "--alpha" in out and "--k-max" in out and err == ""


def test_an_unknown_command_names_the_closest(capsys):
    status, out, err = run(capsys, "ewf", "--alpha", "0.8")
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and "invalid choice: 'ewf'; did you mean ewif? (choose from 'capacity'," in err
    status, _, err = run(capsys, "zzzz")
    assert status == 2 and "did you mean" not in err and "invalid choice: 'zzzz' (choose from" in err


def test_version_is_read_when_asked(capsys):
    status, out, _ = run(capsys, "--version")
    assert status == 0 and out.startswith("draftsim ") and len(out.split()) == 2
