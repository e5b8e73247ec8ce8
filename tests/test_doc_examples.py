"""Every ``>>>`` example in the project's docstrings runs and prints what it shows (the
simulate module's example once printed 2.95 in its docstring and 2.94 when run)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"sim": "draftsim.sim", "realrun": "draftsim.realrun", "analysis": "draftsim.analysis", "draftsim": "draftsim"}


def _modules_with_examples() -> list[str]:
    names = []
    for folder, package in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ">>>" in path.read_text(encoding="utf-8"):
                parts = path.relative_to(ROOT / folder).with_suffix("").parts
                names.append(".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return names


MODULES = _modules_with_examples()


def test_the_examples_are_found():
    assert "draftsim.sim.simulate" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0 and result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples fail"
