"""The README's (and the research tour's, docs/tour.md) command lines are the CLI's: every ``draftsim`` command in its shell blocks parses
with the parser the CLI builds (placeholders written as ``...`` aside), and an example shown with
its error output fails with that error."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from draftsim.cli import _join_dash_values, build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", ROOT / "docs" / "tour.md")
ERROR_LINE = re.compile(r"^draftsim [\w-]+(?: [\w-]+)?: error: ")


def commands() -> list[tuple[str, str | None]]:
    """(command, the error line the README shows after it, or None) of every shell block."""
    out, block, lang = [], None, None
    for line in "\n".join(p.read_text() for p in PAGES).splitlines():
        if line.startswith("```"):
            if block is None:
                block, lang = [], line[3:].strip()
            else:
                if lang in ("sh", "console", "bash", ""):
                    lines = [x.strip().removeprefix("$ ") for x in "\n".join(block).replace("\\\n", " ").splitlines()]
                    for i, x in enumerate(lines):
                        if x.startswith("draftsim ") and not ERROR_LINE.match(x) and "..." not in x:
                            shown = lines[i + 1] if i + 1 < len(lines) and ERROR_LINE.match(lines[i + 1]) else None
                            out.append((re.split(r"\s+#\s", x)[0], shown))
                block = None
        elif block is not None:
            block.append(line)
    return out


CASES = commands()


def test_the_readme_has_commands_to_check():
    assert len(CASES) >= 30


@pytest.mark.parametrize("command, error", CASES, ids=[c[0][:60] for c in CASES])
def test_readme_commands_parse(command, error):
    parser = build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(_join_dash_values(parser, shlex.split(command)[1:]))
            status = 0
        except SystemExit as exc:
            status = exc.code
    if error is None:
        assert status == 0, (command, err.getvalue())
    else:
        assert status == 2 and error.split(": error: ")[1].split(" (see")[0] in err.getvalue()


def test_the_tours_layout_names_every_module():
    """docs/tour.md's Layout block names every module of the four layers (it once missed twenty:
    the operator model's, the steady state's, the static cache's, ...)."""
    text = (ROOT / "docs" / "tour.md").read_text()
    start = text.index("## Layout")
    block = text[text.index("```", start):text.index("```", text.index("```", start) + 3)]
    modules = {p.name for layer in ("sim", "realrun", "analysis", "draftsim") for p in (ROOT / layer).rglob("*.py")
               if p.name != "__init__.py" and "commands" not in p.parts and ".venv" not in p.parts}
    missing = sorted(m for m in modules if m not in block)
    assert not missing, f"docs/tour.md's Layout does not name: {', '.join(missing)}"
