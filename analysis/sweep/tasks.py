"""Sweep kinds and tasks: what a point runs (:class:`Kind`, its metrics checked against its
result types), one run of a point (:class:`Task`) and running it in a worker (:func:`execute`)."""

from __future__ import annotations

import time
import types
import typing
from dataclasses import dataclass, fields, is_dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from ...sim.errors import DraftsimError


@dataclass(frozen=True)
class Kind:
    """What a sweep point runs: one entry of a kind registry.

    ``validate(config)`` raises :class:`~draftsim.sim.errors.DraftsimError` for a configuration (option
    name → value, names with underscores) the command would refuse, and is called for every
    point before any runs. ``run(config, seed)`` runs one point and returns its result (a
    typed result object, or a nested dict); it must be a module-level function (workers
    receive it by reference). ``metrics`` maps each metric name to its dotted attribute path
    in that result (keys in dicts); with ``results`` — the result types ``run`` returns —
    every path is checked when the kind is made (:func:`resolve_path`: it must reach a number
    in one of them), so an unknown metric is an error here, not a column of nulls.
    ``default_metrics`` are kept when a spec names none. ``seed_option`` is the option that
    receives the derived seed (None: the command is deterministic); ``rate_option`` the option
    holding the request rate (what ``capacity`` searches over).
    """

    name: str
    validate: Callable[[dict], object]
    run: Callable[[dict, int | None], object]
    metrics: Mapping[str, str]
    default_metrics: tuple[str, ...]
    seed_option: str | None = "seed"
    rate_option: str | None = None
    forbidden: tuple[str, ...] = ()
    help: str = ""
    results: tuple[type, ...] = ()

    def __post_init__(self):
        unknown = [m for m in self.default_metrics if m not in self.metrics]
        if unknown:
            raise DraftsimError(f"kind {self.name}: default metric {unknown[0]!r} is not one of its metrics")
        if self.results:
            for name, path in self.metrics.items():
                try:
                    resolve_path(self.results, path)
                except DraftsimError as exc:
                    raise DraftsimError(f"kind {self.name}: metric {name!r} does not resolve: {exc}") from None


def _members(hint) -> list:
    """The member types of ``X | Y | None`` (None dropped), or [hint]."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return [t for t in typing.get_args(hint) if t is not type(None)]
    return [hint]


def resolve_path(result_types: Sequence[type], path: str) -> type:
    """The number type at dotted attribute ``path`` of one of ``result_types`` (dataclasses),
    following dataclass fields and annotated properties through ``X | None``; a DraftsimError
    naming the part that exists in none of them, or the end that is not a number."""
    current = list(result_types)
    for part in path.split("."):
        nxt = []
        for t in current:
            if is_dataclass(t) and part in {f.name for f in fields(t)}:
                nxt.extend(_members(typing.get_type_hints(t)[part]))
                continue
            prop = getattr(t, part, None) if isinstance(t, type) else None
            if isinstance(prop, property) and "return" in typing.get_type_hints(prop.fget):
                nxt.extend(_members(typing.get_type_hints(prop.fget)["return"]))
        if not nxt:
            names = " | ".join(getattr(t, "__name__", str(t)) for t in current)
            raise DraftsimError(f"{path!r}: {names} has no attribute {part!r}")
        current = nxt
    numbers = [t for t in current if isinstance(t, type) and issubclass(t, (int, float))]
    if not numbers:
        raise DraftsimError(f"{path!r} is not a number (it is {' | '.join(getattr(t, '__name__', str(t)) for t in current)})")
    return numbers[0]


@dataclass(frozen=True)
class Outcome:
    """What one run gave, as a worker returns it: the task's id, its metric values (empty when
    it failed), the error that stopped it (one line, or None), its wall and CPU seconds."""

    task: int
    values: dict
    error: str | None
    seconds: float
    cpu_seconds: float


@dataclass(frozen=True)
class Task:
    """One run: a point and a replication, with its derived seed (None for unseeded kinds)."""

    id: int
    point: int
    replication: int
    seed: int | None
    config: dict


def lookup(output, path: str):
    """The value at dotted ``path`` in a result: attributes of objects, keys of dicts; None
    where a part is absent or None."""
    value = output
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        else:
            value = getattr(value, part, None)
        if value is None:
            return None
    return value


def as_metric(name: str, value) -> float | None:
    """A metric value as float (bools as 0/1; None stays None); anything else raises."""
    if value is None:
        return None
    if isinstance(value, (bool, int, float, np.integer, np.floating)):
        return float(value)
    raise DraftsimError(f"metric {name} is not a number: {value!r}")


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type (unless a DraftsimError) and message."""
    text = " ".join(str(exc).split())
    return text if isinstance(exc, DraftsimError) else f"{type(exc).__name__}: {text}"


def execute(run: Callable, metric_paths: dict, task: Task) -> Outcome:
    """Run one task in a worker and pick its metrics from the command's output."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        output = run(task.config, task.seed)
        values = {name: as_metric(name, lookup(output, path)) for name, path in metric_paths.items()}
        return Outcome(task.id, values, None, time.perf_counter() - t0, time.process_time() - c0)
    except Exception as exc:  # a failed point is recorded with its error; the sweep goes on
        return Outcome(task.id, {}, one_line(exc), time.perf_counter() - t0, time.process_time() - c0)
