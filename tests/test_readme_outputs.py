"""The outputs the README and the tour show are what the commands print now.

Every ``$ draftsim ...`` line of a shell block in README.md or docs/tour.md, with the lines shown
under it, is run in-process when its subcommand answers in seconds (``FAST``), and each shown line
must appear, whitespace aside, among the lines it prints (stdout and stderr). Lines with an
elision (``...`` or ``…``) and ``--json`` examples (shown compacted) are left out. A number the
README quotes after a model change used to stay stale (11.76 ms where ``cost`` printed 10.71):
this holds every shown output to the code, wall times aside (``WALL_TIME``). The capacity examples take minutes and are left to
their own tests."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.clirun import run

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", ROOT / "docs" / "tour.md")
#: subcommands whose shown examples run in seconds
FAST = {"cost", "ewif", "plan", "optimize", "acceptance", "simulate"}


#: wall times, which no two runs share: "(DP took 0.005 s)" and the seconds column before a K matrix
WALL_TIME = re.compile(r"(?<=took )\d+(?:\.\d+)?(?= s)|(?<=\s)\d+\.\d{3}(?=\s+\[\[)")


def _norm(line: str) -> str:
    return " ".join(WALL_TIME.sub("<t>", line).split())


def examples() -> list[tuple[str, str, list[str]]]:
    """(page, command, shown lines) of every ``$ draftsim`` line with output under it."""
    out = []
    for page in PAGES:
        block = None
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.startswith("```"):
                if block is not None:
                    out.extend((page.name, c, shown) for c, shown in _commands(block))
                block = [] if block is None else None
            elif block is not None:
                block.append(line)
    return out


def _commands(block: list[str]) -> list[tuple[str, list[str]]]:
    found, i = [], 0
    while i < len(block):
        line = block[i]
        if line.startswith("$ draftsim "):
            command = line[2:]
            while command.endswith("\\") and i + 1 < len(block):
                i += 1
                command = command[:-1] + " " + block[i].strip()
            shown = []
            while i + 1 < len(block) and not block[i + 1].startswith("$ "):
                i += 1
                shown.append(block[i])
            found.append((command, [s for s in shown if s.strip()]))
        i += 1
    return found


CASES = [(page, command, shown) for page, command, shown in examples()
         if shown and shlex.split(command)[1] in FAST and "--json" not in command]


def test_the_pages_show_outputs_to_check():
    assert len(CASES) >= 8
    assert any("--kv-dtype fp8" in command for _, command, _ in CASES)


@pytest.mark.parametrize("page, command, shown", CASES, ids=[f"{p}:{c[9:70]}" for p, c, _ in CASES])
def test_a_shown_output_is_what_the_command_prints(page, command, shown, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)[1:]
    status, out, err = run(capsys, *argv)
    printed = {_norm(x) for x in (out + err).splitlines()}
    expected_error = any(re.match(r"draftsim [\w -]+: error: ", s) for s in shown)
    assert status == (2 if expected_error else 0), (command, err)
    stale = [s for s in shown if "..." not in s and "…" not in s and _norm(s) not in printed]
    assert not stale, f"{page}: {command}\nshown but not printed:\n" + "\n".join(stale) + "\n--- printed:\n" + out + err
