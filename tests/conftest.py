"""Shared test configuration: hypothesis profiles and the test tiers.

Hypothesis profiles
-------------------
* ``default`` (CI): 200 examples per property, no deadline (CI machines are noisy).
* ``long``: 5 000 examples per property — ``HYPOTHESIS_PROFILE=long make test``.

Tiers
-----
Two markers (registered in pyproject.toml) sort the suite; ``pytest`` with no ``-m`` — what
``make test`` and CI run — is always the full suite:

* ``real`` — the test loads a real or tiny Hugging Face model or runs torch;
* ``slow`` — the test takes long without one (measured: see :data:`SLOW`).

The inner loop leaves both out: ``make test-fast``, i.e. ``pytest -m "not real and not slow"``
(``-m real`` runs only the model tests).

The markers are applied here, at collection, not in the test files. The rule:

1. every test of a module that imports torch at its top level is ``real``;
2. a test is ``real`` when its own code, or the code of a fixture it uses, loads a model:
   calls ``load_model(``, skips without torch or transformers (``importorskip("torch")``),
   or names a tiny model (``"tiny:N"``, as the CLI takes it);
3. tests that load models in ways the source does not show are listed in :data:`REAL`;
4. tests measured slow are listed in :data:`SLOW`, with the seconds they took.

The lists name tests as ``module::function`` (every parametrization). A listed test that is
no longer collected from its module is reported at the end of the run (rename it here).
To re-measure: ``pytest --durations=0 -q`` and list here any test that takes over
:data:`SLOW_SECONDS` without a model.
"""

from __future__ import annotations

import inspect
import os
import re

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: Code that loads a model (rule 2).
LOADS_A_MODEL = re.compile(r"""load_model\(|importorskip\(\s*["'](?:torch|transformers)["']|["']tiny:\d+["']""")

#: Tests that load models where their source does not show it (rule 3): module::function.
REAL: frozenset[str] = frozenset()

#: A test without a model is ``slow`` when it takes longer than this (seconds, alone on the
#: 2-core development machine).
SLOW_SECONDS = 5.0

#: Tests measured slow without a model (rule 4): module::function -> seconds measured.
SLOW: dict[str, float] = {}


def _loads_a_model(func, seen: dict) -> bool:
    """Whether ``func``'s source matches :data:`LOADS_A_MODEL` (cached per function)."""
    if func not in seen:
        try:
            seen[func] = bool(LOADS_A_MODEL.search(inspect.getsource(func)))
        except (OSError, TypeError):
            seen[func] = False
    return seen[func]


def _fixture_functions(item) -> list:
    """The functions of the fixtures ``item`` uses (its whole closure)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [d.func for defs in info.name2fixturedefs.values() for d in defs]


def _name(item) -> str:
    return f"{item.path.stem}::{item.originalname if hasattr(item, 'originalname') else item.name}"


def is_real(item, seen: dict) -> bool:
    """Rules 1–3 of the module docstring."""
    torch = getattr(getattr(item, "module", None), "torch", None)
    if getattr(torch, "__name__", None) == "torch":
        return True
    if _name(item) in REAL:
        return True
    func = getattr(item, "function", None)
    return any(_loads_a_model(f, seen) for f in ([func] if func else []) + _fixture_functions(item))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by these markers
def pytest_collection_modifyitems(config, items):
    seen: dict = {}
    names = set()
    for item in items:
        name = _name(item)
        names.add(name)
        if is_real(item, seen):
            item.add_marker(pytest.mark.real)
        if name in SLOW:
            item.add_marker(pytest.mark.slow)
    modules = {item.path.stem for item in items}
    config._draftsim_stale = sorted(n for n in REAL | set(SLOW) if n.split("::")[0] in modules and n not in names)


def pytest_terminal_summary(terminalreporter, config):
    stale = getattr(config, "_draftsim_stale", [])
    if stale:
        terminalreporter.write_line(f"tests/conftest.py lists tests its modules no longer hold: {', '.join(stale)}", yellow=True)
