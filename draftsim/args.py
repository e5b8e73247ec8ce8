"""Argument types and output helpers shared by the subcommands.

Argument types validate with the same checks as the Python API (:mod:`sim.errors`), so a
bad value gives the same message — naming the value and the valid range — on both paths.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Callable

import numpy as np

from sim.errors import DraftsimError, as_cost, as_count, as_positive, as_probability


def _number(text: str) -> float | int:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None


def _checked(check: Callable, name: str, **kwargs) -> Callable[[str], object]:
    def parse(text: str):
        try:
            value = check(name, _number(text), **kwargs)
        except DraftsimError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value.item() if isinstance(value, np.ndarray) else value

    parse.__name__ = name
    return parse


def probability(name: str) -> Callable[[str], float]:
    """A float in [0, 1]."""
    return _checked(as_probability, name)


def cost(name: str) -> Callable[[str], float]:
    """A finite float >= 0."""
    return _checked(as_cost, name)


def positive(name: str) -> Callable[[str], float]:
    """A finite float > 0."""
    return _checked(as_positive, name)


def count(name: str, minimum: int = 0, maximum: int | None = None) -> Callable[[str], int]:
    """An integer in [minimum, maximum]."""
    return _checked(as_count, name, minimum=minimum, maximum=maximum)


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def emit_json(payload: dict) -> None:
    """Write ``payload`` to stdout as one JSON document (numpy values converted)."""
    json.dump(_jsonable(payload), sys.stdout, indent=2)
    sys.stdout.write("\n")
