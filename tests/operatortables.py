"""Whether the pinned operator tables (aiconfigurator-core, the ``operators`` extra) are installed, and
the marker that skips a test without them: one definition for every test of the operator model."""

import importlib.metadata

import pytest

from draftsim.sim.cost.kernel_tables import INSTALL, PACKAGE, PINNED_VERSION


def installed() -> bool:
    """aiconfigurator-core at the pinned version (``make test`` installs it)."""
    try:
        return importlib.metadata.version(PACKAGE) == PINNED_VERSION
    except importlib.metadata.PackageNotFoundError:
        return False


tables = pytest.mark.skipif(not installed(), reason=f"{PACKAGE} {PINNED_VERSION} is not installed ({INSTALL}; make test installs it)")
