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
* ``slow`` — the test takes long without one (measured; marked in its file, rule 4).

The inner loop leaves both out: ``make test-fast``, i.e. ``pytest -m "not real and not slow"``
(``-m real`` runs only the model tests).

The markers are applied here, at collection, not in the test files. The rule:

1. every test of a module that imports torch at its top level is ``real``;
2. a test is ``real`` when its own code, or the code of a fixture it uses, loads a model:
   calls ``load_model(``, ``tiny_model(`` or ``random_model(``, skips without torch or
   transformers (``importorskip("torch")``), or names a tiny model (``"tiny:N"``) or a randomly initialised catalog model
   (``"random:NAME"``), as the CLI takes them;
3. tests that load models in ways the source does not show are listed in :data:`REAL`;
4. tests measured slow — one item over :data:`SLOW_SECONDS`, or all the items of a
   parametrized test together over :data:`SLOW_TOTAL_SECONDS` — carry ``@pytest.mark.slow``
   in their own files, with the seconds measured in a comment;
5. a test that uses a fixture of :data:`SLOW_FIXTURES` (starting Ray) is ``slow``.

The lists name tests as ``module::function`` (every parametrization). A listed test that is
no longer collected from its module is reported at the end of the run (rename it here).
In a run that leaves ``real`` out, a test that imports transformers (loads a model) without
the marker fails, naming this rule: the fast tier stays free of models.
To re-measure: ``pytest -m "not real" --durations=0 -q`` and list here what rule 4 names.
"""

from __future__ import annotations

import inspect
import os
import re
import sys

# Under pytest-xdist (make test: one worker per core) each worker computes on one thread: torch's
# and BLAS's thread pools of two workers on two cores wait on each other at every operator (a
# one-token call of a tiny model took seconds instead of milliseconds). Set before any import of
# torch or numpy's BLAS reads them; a test that asks for threads (--threads N) still gets them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: Code that loads a model (rule 2).
LOADS_A_MODEL = re.compile(r"""(?:load|tiny|random)_model\(|importorskip\(\s*["'](?:torch|transformers)["']|["']tiny:\d+["']|["']random:[\w.-]+""")

#: Tests that load models where their source does not show it (rule 3): module::function.
REAL: frozenset[str] = frozenset({
    "test_cli::test_demo_writes_figures",  # `draftsim demo` runs SmolLM2 (its real step); 52–64 s (221 s before the demo's budget)
    "test_badinput_trial::test_undefined_figures_print_as_a_dash",  # its 'one sequence' case records a tiny real model
})

#: A test without a model is ``slow`` when one of its items takes longer than this, in
#: seconds as ``--durations`` reports them on the 2-core development machine shared with
#: other work (load average ~7.5: about three times the time alone).
SLOW_SECONDS = 5.0
#: ... or when all the items of a parametrized test together take longer than this.
SLOW_TOTAL_SECONDS = 10.0

#: Fixtures that make every test using them slow (rule 5), and why.
SLOW_FIXTURES = {"ray_session": "starts a local Ray cluster: ~15 s"}

#: Tests measured slow without a model (rule 4) not yet marked in their files (none: each carries
#: ``@pytest.mark.slow`` with the seconds measured; a name added here is marked at collection).
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
        if name in SLOW or SLOW_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    modules = {item.path.stem for item in items}
    config._draftsim_stale = sorted(n for n in REAL | set(SLOW) if n.split("::")[0] in modules and n not in names)


def pytest_terminal_summary(terminalreporter, config):
    stale = getattr(config, "_draftsim_stale", [])
    if stale:
        terminalreporter.write_line(f"tests/conftest.py lists tests its modules no longer hold: {', '.join(stale)}", yellow=True)


def _guard_the_fast_tier(item):
    """Fail ``item`` when, in a run without ``real`` tests, it loaded a model unmarked."""
    before = "transformers" in sys.modules
    result = yield
    if (not before and "transformers" in sys.modules and item.get_closest_marker("real") is None
            and "not real" in (item.config.getoption("markexpr") or "")):
        pytest.fail(f"{_name(item)} loads a model (it imported transformers) but is not marked real: "
                    "add it to REAL in tests/conftest.py", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _guard_the_fast_tier(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guard_the_fast_tier(item))
