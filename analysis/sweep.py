"""Sweeps: many simulations from one spec, run in a process pool or on Ray, stored as Parquet.

A **sweep spec** is a TOML file: "a command line as a table" plus the axes to vary.

.. code-block:: toml

    version = 1                 # schema version (required)
    kind = "simulate"           # what each point runs: a key of the kind registry
    seed = 7                    # spec seed; every (point, replication) derives its own
    replications = 3            # independent runs per point (default 1)
    metrics = ["ewif", "ewif_se"]   # what to keep (default: the kind's default metrics)
    description = "free text"   # optional

    [base]                      # options of the command, named as its flags without "--"
    policy = "fixed:k=4"        # (dashes or underscores: verify-per-token = verify_per_token)
    tokens = 200000
    cost = [0.05]               # a list repeats the flag: --cost 0.05
    separate-drafter = true     # true gives a flag, false leaves it out

    [grid]                      # every combination (the last key varies fastest)
    alpha = [0.6, 0.7, 0.8]
    k = { start = 1, stop = 8, step = 1 }                  # inclusive integer range
    c = { start = 0.01, stop = 0.3, num = 6, scale = "log" }  # num values, linear or log

    [[zip]]                     # varied together: lists of one length (one axis)
    policy = ["fixed:k=2", "fixed:k=6"]
    tokens = [100000, 400000]

    [random]                    # n samples from distributions, seeded (default: spec seed)
    n = 20
    seed = 3
    alpha = { uniform = [0.5, 0.95] }
    cost = { loguniform = [0.01, 0.3] }
    k = { integers = [1, 8] }   # inclusive
    policy = { choice = ["fixed:k=3", "threshold:h=0.7"] }

Points are the product grid × zip groups × random samples, numbered in that order with the
last varying fastest; each point runs ``replications`` times. A sweep *task* is one
(point, replication); task ``point * replications + replication``. Its seed is derived from
the spec seed with :class:`numpy.random.SeedSequence` (``spawn_key = (point, replication)``),
so results do not depend on the number of workers or the order in which tasks run.

A **kind** (:class:`Kind`) says how a point's configuration is validated (before any work
starts: every point is checked) and run, and which metrics it reports. The registry lives
with the command line (``draftsim.sweepkinds``); this module is the machinery.

**Output folder**::

    OUT/manifest.json           schema version, the spec, its hash, columns, shards, counts
    OUT/results/part-*.parquet  one row per task; pandas.read_parquet(OUT + "/results")

Each shard is written to a hidden temporary file and renamed into place (atomic), then the
manifest is rewritten (temp + rename). The shards are the truth: a resumed sweep reads the
task ids they hold and runs only the others, so a killed sweep loses and repeats nothing.
Columns: ``task``, ``point``, ``replication``, ``seed``, one per varied option, ``status``
(``ok`` / ``failed``), ``error``, ``seconds`` (wall) and ``cpu_seconds`` of the run, then one
float64 column per metric.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import hashlib
import itertools
import json
import logging
import math
import multiprocessing
import os
import tempfile
import time
import tomllib
import types
import typing
import uuid
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..sim.errors import DraftsimError, file_mode, folder_mode

#: Version of the spec schema and of the output folder's manifest.
SPEC_VERSION = 1
MANIFEST_VERSION = 1
#: Keys a spec may have at the top level.
SPEC_KEYS = ("version", "kind", "seed", "replications", "metrics", "description", "base", "grid", "zip", "random", "capacity")
#: Most tasks (points x replications) a sweep runs without ``force``.
MAX_TASKS = 100_000
#: Most values one range or one random table may produce, even with ``force``.
MAX_AXIS_VALUES = 10_000_000


# --- kinds ----------------------------------------------------------------------------------


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
class RunRecord:
    """The bookkeeping columns of a results row, defined once: the results schema derives
    from these fields (:func:`schema_for`). The varied options' columns go between ``seed``
    and ``status``, the metrics' (float64) after ``cpu_seconds``."""

    task: int  #: point * replications + replication
    point: int  #: index of the configuration (grid × zip groups × random samples)
    replication: int
    seed: int | None  #: the run's derived seed (None for a deterministic kind)
    status: str  #: "ok" or "failed"
    error: str | None  #: why the run failed, one line
    seconds: float  #: wall time of the run
    cpu_seconds: float  #: CPU time of the run, in its worker


#: Columns every results table starts with (before the axes) and the bookkeeping after them.
LEAD_COLUMNS = tuple(f.name for f in fields(RunRecord))[:4]
STATUS_COLUMNS = tuple(f.name for f in fields(RunRecord))[4:]
_ARROW = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def record_fields() -> dict[str, pa.DataType]:
    """Column name → Arrow type of every :class:`RunRecord` field (``X | None`` as X, nullable)."""
    hints = typing.get_type_hints(RunRecord)
    return {f.name: _ARROW[next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))]
            for f in fields(RunRecord)}


# --- specs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One configuration of a sweep: ``values`` are the varied options, ``config`` = base + values."""

    index: int
    values: dict
    config: dict


@dataclass(frozen=True)
class Task:
    """One run: a point and a replication, with its derived seed (None for unseeded kinds)."""

    id: int
    point: int
    replication: int
    seed: int | None
    config: dict


@dataclass
class Spec:
    """A parsed, structurally valid sweep spec (see the module docstring for the schema)."""

    kind: str
    seed: int
    replications: int
    metrics: tuple[str, ...]
    base: dict
    grid: dict
    zips: list
    random: dict
    description: str = ""
    capacity: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)

    @property
    def axes(self) -> list[str]:
        """Names of the varied options, in column order."""
        names = list(self.grid)
        for group in self.zips:
            names.extend(group)
        names.extend(k for k in self.random if k not in ("n", "seed"))
        return names

    @property
    def n_points(self) -> int:
        n = 1
        for values in self.grid.values():
            n *= len(values)
        for group in self.zips:
            n *= len(next(iter(group.values())))
        if self.random:
            n *= self.random["n"]
        return n

    @property
    def n_tasks(self) -> int:
        return self.n_points * self.replications

    @property
    def hash(self) -> str:
        """SHA-256 of the spec's canonical JSON (comments and layout of the file do not count)."""
        return hashlib.sha256(json.dumps(self.raw, sort_keys=True, default=str).encode()).hexdigest()

    def points(self) -> Iterator[Point]:
        """Every point, in index order (grid × zip groups × random samples, last fastest)."""
        axes: list[list[dict]] = [[{name: v} for v in values] for name, values in self.grid.items()]
        for group in self.zips:
            names = list(group)
            axes.append([dict(zip(names, row)) for row in zip(*group.values())])
        if self.random:
            axes.append(random_samples(self.random, self.seed))
        for index, combo in enumerate(itertools.product(*axes)):
            values: dict = {}
            for part in combo:
                values.update(part)
            yield Point(index, values, {**self.base, **values})

    def tasks(self, points: Sequence[Point] | None = None, seeded: bool = True) -> Iterator[Task]:
        """Every task: each point ``replications`` times with its derived seed (None unless ``seeded``)."""
        for p in points if points is not None else self.points():
            for r in range(self.replications):
                seed = derive_seed(self.seed, p.index, r) if seeded else None
                yield Task(p.index * self.replications + r, p.index, r, seed, p.config)


def derive_seed(seed: int, point: int, replication: int = 0) -> int:
    """The seed of task (point, replication): 63 bits of ``SeedSequence(seed, spawn_key=(point,
    replication))`` — independent streams whatever order or worker runs them."""
    state = np.random.SeedSequence(seed, spawn_key=(point, replication)).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))


def option_name(key: str) -> str:
    """A spec key as its canonical option name: ``verify-per-token`` → ``verify_per_token``."""
    return key.replace("-", "_")


def _where(section: str, key: str | None = None) -> str:
    return f"[{section}] {key}" if key is not None else f"[{section}]"


def _check_value(where: str, value, allow_list: bool = True):
    """A configuration value: a string, number, bool, or (once) a list of those."""
    if isinstance(value, bool) or isinstance(value, (int, float, str)):
        if isinstance(value, float) and not math.isfinite(value):
            raise DraftsimError(f"{where}: value {value!r} is not a finite number")
        return value
    if isinstance(value, list) and allow_list:
        if not value:
            raise DraftsimError(f"{where}: an empty list gives no value; give at least one")
        return [_check_value(where, v, allow_list=False) for v in value]
    raise DraftsimError(f"{where}: values must be strings, numbers, booleans or lists of those; got {type(value).__name__} {value!r}")


def _table(where: str, value) -> dict:
    if not isinstance(value, dict):
        raise DraftsimError(f"{where} must be a table; got {type(value).__name__} {value!r}")
    return value


def _number(where: str, value, integer: bool = False) -> int | float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise DraftsimError(f"{where} must be {'an integer' if integer else 'a finite number'}; got {value!r}")
    return value


def _range_values(where: str, table: dict) -> list:
    """``{start, stop, num[, scale]}`` (num values, linear or log) or ``{start, stop, step}``
    (inclusive when the step lands on stop; integers when all three are)."""
    keys = set(table)
    if keys - {"start", "stop", "num", "step", "scale"} or not {"start", "stop"} <= keys or ("num" in keys) == ("step" in keys):
        raise DraftsimError(f"{where}: a range is {{start, stop, num[, scale]}} or {{start, stop, step}}; got keys {sorted(keys)}")
    start, stop = _number(f"{where}.start", table["start"]), _number(f"{where}.stop", table["stop"])
    if stop < start:
        raise DraftsimError(f"{where}: stop {stop!r} is below start {start!r}")
    if "num" in keys:
        num = _number(f"{where}.num", table["num"], integer=True)
        if not 1 <= num <= MAX_AXIS_VALUES:
            raise DraftsimError(f"{where}.num must lie in [1, {MAX_AXIS_VALUES:,}]; got {num}")
        scale = table.get("scale", "linear")
        if scale not in ("linear", "log"):
            raise DraftsimError(f"{where}.scale must be 'linear' or 'log'; got {scale!r}")
        if scale == "log":
            if start <= 0:
                raise DraftsimError(f"{where}: a log range needs start > 0; got {start!r}")
            return [float(v) for v in np.geomspace(start, stop, num)]
        return [float(v) for v in np.linspace(start, stop, num)]
    if "scale" in keys:
        raise DraftsimError(f"{where}: scale applies to {{start, stop, num}} ranges only")
    step = _number(f"{where}.step", table["step"])
    if step <= 0:
        raise DraftsimError(f"{where}.step must be > 0; got {step!r}")
    count = int(math.floor((stop - start) / step + 1e-9)) + 1
    if count > MAX_AXIS_VALUES:
        raise DraftsimError(f"{where}: the range has {count:,} values, more than {MAX_AXIS_VALUES:,}")
    if all(isinstance(table[k], int) for k in ("start", "stop", "step")):
        return [start + i * step for i in range(count)]
    return [float(start + i * step) for i in range(count)]


def _axis_values(where: str, value) -> list:
    if isinstance(value, dict):
        return _range_values(where, value)
    if not isinstance(value, list):
        raise DraftsimError(f"{where}: an axis is a list of values or a range table {{start, stop, num|step}}; got {value!r}")
    if not value:
        raise DraftsimError(f"{where}: the axis is empty; give at least one value")
    return [_check_value(where, v) for v in value]


DISTRIBUTIONS = ("uniform", "loguniform", "integers", "choice")


def _distribution(where: str, value) -> tuple[str, list]:
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in DISTRIBUTIONS:
        raise DraftsimError(f"{where}: a random axis is one of {{uniform = [lo, hi]}}, {{loguniform = [lo, hi]}}, "
                            f"{{integers = [lo, hi]}} (inclusive) or {{choice = [v1, v2, ...]}}; got {value!r}")
    name, args = next(iter(value.items()))
    if not isinstance(args, list) or not args:
        raise DraftsimError(f"{where}.{name} needs a non-empty list; got {args!r}")
    if name == "choice":
        return name, [_check_value(where, v) for v in args]
    if len(args) != 2:
        raise DraftsimError(f"{where}.{name} needs [lo, hi]; got {args!r}")
    lo, hi = (_number(f"{where}.{name}", v, integer=name == "integers") for v in args)
    if hi < lo or (name == "loguniform" and lo <= 0):
        raise DraftsimError(f"{where}.{name} needs {'0 < ' if name == 'loguniform' else ''}lo <= hi; got {args!r}")
    return name, [lo, hi]


def random_samples(table: dict, spec_seed: int) -> list[dict]:
    """The ``n`` samples of a ``[random]`` table: one dict (option → value) per sample, drawn
    with ``default_rng(SeedSequence(seed))`` in the table's key order."""
    n = table["n"]
    rng = np.random.default_rng(np.random.SeedSequence(table.get("seed", spec_seed)))
    columns = {}
    for name, (dist, args) in ((k, v) for k, v in table.items() if k not in ("n", "seed")):
        if dist == "uniform":
            columns[name] = [float(x) for x in rng.uniform(args[0], args[1], n)]
        elif dist == "loguniform":
            columns[name] = [float(x) for x in np.exp(rng.uniform(math.log(args[0]), math.log(args[1]), n))]
        elif dist == "integers":
            columns[name] = [int(x) for x in rng.integers(args[0], args[1], n, endpoint=True)]
        else:
            columns[name] = [args[int(i)] for i in rng.integers(0, len(args), n)]
    return [{name: col[i] for name, col in columns.items()} for i in range(n)]


def parse_spec(data: dict, kinds: Mapping[str, Kind]) -> Spec:
    """Check the structure of a spec (a dict as read from TOML) and return it as a :class:`Spec`.

    Checks keys, types, empty axes, options set twice, metric names against the kind;
    :func:`validate_points` then checks every point's configuration with the kind.
    """
    data = _table("the spec", data)
    unknown = [k for k in data if k not in SPEC_KEYS]
    if unknown:
        raise DraftsimError(f"unknown spec key {unknown[0]!r}; valid keys: {', '.join(SPEC_KEYS)}")
    if "version" not in data:
        raise DraftsimError(f"the spec needs version = {SPEC_VERSION}")
    if data["version"] != SPEC_VERSION or isinstance(data["version"], bool):
        raise DraftsimError(f"spec version {data['version']!r} is not supported; this draftsim reads version {SPEC_VERSION}")
    kind = data.get("kind")
    if kind not in kinds:
        raise DraftsimError(f"kind {kind!r} is not a sweep kind; choose from {', '.join(kinds)}")
    k = kinds[kind]
    seed = _number("seed", data.get("seed", 0), integer=True)
    if seed < 0:
        raise DraftsimError(f"seed must be >= 0; got {seed}")
    reps = _number("replications", data.get("replications", 1), integer=True)
    if not 1 <= reps <= 100_000:
        raise DraftsimError(f"replications must lie in [1, 100000]; got {reps}")
    metrics = data.get("metrics", list(k.default_metrics))
    if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) for m in metrics):
        raise DraftsimError(f"metrics must be a non-empty list of metric names; got {metrics!r}")
    for m in metrics:
        if m not in k.metrics:
            raise DraftsimError(f"unknown metric {m!r} for kind {kind}; valid metrics: {', '.join(k.metrics)}")
    if len(set(metrics)) != len(metrics):
        raise DraftsimError(f"metrics names a metric twice: {metrics!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise DraftsimError(f"description must be a string; got {description!r}")

    seen: dict[str, str] = {}

    def claim(section: str, key: str) -> str:
        if not isinstance(key, str) or not key.strip():
            raise DraftsimError(f"{_where(section)}: option names must be non-empty strings; got {key!r}")
        name = option_name(key)
        if name in seen:
            raise DraftsimError(f"option {key!r} is set in {seen[name]} and again in {_where(section)}; set each option once")
        if k.seed_option and name == k.seed_option:
            raise DraftsimError(f"{_where(section, key)}: seeds are derived per point from the spec's top-level seed; remove {key!r}")
        if name in k.forbidden:
            raise DraftsimError(f"{_where(section, key)}: option {key!r} writes per-run output and cannot be swept")
        seen[name] = _where(section)
        return name

    base = {claim("base", key): _check_value(_where("base", key), v) for key, v in _table("[base]", data.get("base", {})).items()}
    grid = {}
    for key, v in _table("[grid]", data.get("grid", {})).items():
        grid[claim("grid", key)] = _axis_values(_where("grid", key), v)
    zips_raw = data.get("zip", [])
    zips_raw = [zips_raw] if isinstance(zips_raw, dict) else zips_raw
    if not isinstance(zips_raw, list):
        raise DraftsimError(f"[zip] must be a table or an array of tables ([[zip]]); got {zips_raw!r}")
    zips = []
    for i, group in enumerate(zips_raw):
        where = f"zip group {i + 1}"
        group = _table(f"[[zip]] {i + 1}", group)
        if not group:
            raise DraftsimError(f"{where} is empty; give lists of equal length")
        out = {claim("zip", key): _axis_values(f"{where} {key}", v) for key, v in group.items()}
        lengths = {n: len(v) for n, v in out.items()}
        if len(set(lengths.values())) != 1:
            raise DraftsimError(f"{where}: zipped lists must have one length; got {lengths}")
        zips.append(out)
    random = {}
    if "random" in data:
        table = _table("[random]", data["random"])
        if "n" not in table:
            raise DraftsimError("[random] needs n, the number of samples")
        n = _number("[random] n", table["n"], integer=True)
        if not 1 <= n <= MAX_AXIS_VALUES:
            raise DraftsimError(f"[random] n must lie in [1, {MAX_AXIS_VALUES:,}]; got {n}")
        random["n"] = n
        if "seed" in table:
            random["seed"] = _number("[random] seed", table["seed"], integer=True)
            if random["seed"] < 0:
                raise DraftsimError(f"[random] seed must be >= 0; got {random['seed']}")
        for key, v in table.items():
            if key not in ("n", "seed"):
                random[claim("random", key)] = _distribution(_where("random", key), v)
        if len(random) == len([k for k in ("n", "seed") if k in random]):
            raise DraftsimError("[random] has no axis; give at least one option = {distribution = [...]}")
    capacity = _table("[capacity]", data.get("capacity", {}))
    spec = Spec(kind, seed, reps, tuple(metrics), base, grid, zips, random, description, capacity, raw=data)
    for name in spec.axes:
        if name in LEAD_COLUMNS + STATUS_COLUMNS:
            raise DraftsimError(f"option {name!r} cannot be varied: its column name is taken by the results' {name!r} column")
        if name in metrics:
            raise DraftsimError(f"{name!r} is both a varied option and a kept metric; drop it from metrics (the option's "
                                "column holds the value)")
    return spec


def load_spec(path, kinds: Mapping[str, Kind]) -> Spec:
    """Read and parse a TOML spec file (:func:`parse_spec`)."""
    p = Path(path)
    if not p.is_file():
        raise DraftsimError(f"spec {str(path)!r} is not a file; give a TOML sweep spec")
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise DraftsimError(f"spec {str(path)!r} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise DraftsimError(f"spec {str(path)!r} is not UTF-8 text: {exc}") from None
    return parse_spec(data, kinds)


def check_size(spec: Spec, force: bool = False, limit: int = MAX_TASKS) -> None:
    """Refuse more than ``limit`` tasks unless ``force`` (computed without expanding the axes)."""
    if spec.n_tasks > limit and not force:
        raise DraftsimError(f"the sweep has {spec.n_points:,} points x {spec.replications} replication(s) = {spec.n_tasks:,} runs, "
                            f"more than {limit:,}: pass --force to run it anyway, or shrink the axes")


def validate_points(spec: Spec, kind: Kind, extra: dict | None = None) -> list[Point]:
    """Every point, each checked with ``kind.validate`` (first failure raised with the point)."""
    points = list(spec.points())
    checked: dict[str, BaseException | None] = {}
    for p in points:
        config = {**p.config, **(extra or {})}
        key = json.dumps(config, sort_keys=True)
        if key not in checked:
            try:
                kind.validate(config)
                checked[key] = None
            except DraftsimError as exc:
                checked[key] = exc
        if checked[key] is not None:
            shown = ", ".join(f"{k}={v!r}" for k, v in p.values.items()) or "the base configuration"
            raise DraftsimError(f"point {p.index} ({shown}): {' '.join(str(checked[key]).split())}")
    return points


# --- running one task -----------------------------------------------------------------------


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


# --- storage --------------------------------------------------------------------------------


def _arrow_type(values: list) -> pa.DataType:
    """Column type of an axis: bool, int64, float64 (ints and floats mixed) or string."""
    if all(isinstance(v, bool) for v in values):
        return pa.bool_()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return pa.int64()
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return pa.float64()
    return pa.string()


def cell(value, type_: pa.DataType):
    """An axis value as stored in its column (lists as comma-joined text)."""
    if type_ == pa.string():
        return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
    if type_ == pa.float64():
        return float(value)
    return value


def _atomic_write(path: Path, write: Callable[[str], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Store:
    """The output folder of a sweep: Parquet shards under ``results/`` plus ``manifest.json``.

    ``open`` checks the folder (new, empty, or — with ``resume`` — holding this same sweep),
    removes temporaries of a killed run and reads which tasks the shards already hold.
    ``add`` buffers rows; ``flush`` commits them as one shard (atomic rename) and rewrites the
    manifest.
    """

    def __init__(self, folder, spec: Spec, schema: pa.Schema, tasks: int, extra: dict | None = None):
        self.folder = Path(folder)
        self.results = self.folder / "results"
        self.spec = spec
        self.schema = schema
        self.tasks = tasks
        self.extra = dict(extra or {})
        self.buffer: list[dict] = []
        self.shards: list[dict] = []
        self.done: set[int] = set()
        self.failed = 0

    @staticmethod
    def check(folder, spec: Spec, resume: bool) -> Path:
        """Raise unless ``folder`` can take this sweep (writes nothing)."""
        p = Path(folder)
        manifest = p / "manifest.json"
        if manifest.exists():
            if not resume:
                raise DraftsimError(f"--out {str(folder)!r} already holds a sweep; pass --resume to continue it, or choose another folder")
            info = read_manifest(p)
            if info["spec_sha256"] != spec.hash:
                raise DraftsimError(f"--out {str(folder)!r} holds a different sweep (spec hash {info['spec_sha256'][:12]}, this spec "
                                    f"{spec.hash[:12]}); resume with the same spec, or choose another folder")
        elif p.is_dir() and any(not _leftover(x) for x in p.iterdir()):
            raise DraftsimError(f"--out {str(folder)!r} is a folder with other files in it and no sweep; give a new or empty folder")
        return p

    def open(self) -> Store:
        self.results.mkdir(parents=True, exist_ok=True, mode=folder_mode())
        for tmp in self.results.glob(".*.tmp"):
            tmp.unlink()
        for shard in sorted(self.results.glob("part-*.parquet")):
            table = pq.read_table(shard, columns=["task", "status"])
            ids = table.column("task").to_pylist()
            overlap = self.done.intersection(ids)
            if overlap or len(set(ids)) != len(ids):
                raise DraftsimError(f"{shard}: task {min(overlap or ids)} is stored twice; the folder was altered by hand")
            failed = sum(1 for s in table.column("status").to_pylist() if s != "ok")
            self.done.update(ids)
            self.failed += failed
            self.shards.append({"file": shard.name, "rows": len(ids), "failed": failed})
        self.write_manifest(complete=False)
        return self

    def add(self, row: dict) -> None:
        self.buffer.append(row)

    def flush(self) -> None:
        if not self.buffer:
            return
        rows, self.buffer = self.buffer, []
        table = pa.Table.from_pylist(rows, schema=self.schema)
        name = f"part-{len(self.shards):06d}-{uuid.uuid4().hex[:8]}.parquet"
        _atomic_write(self.results / name, lambda tmp: pq.write_table(table, tmp))
        failed = sum(1 for r in rows if r["status"] != "ok")
        self.done.update(r["task"] for r in rows)
        self.failed += failed
        self.shards.append({"file": name, "rows": len(rows), "failed": failed})
        self.write_manifest(complete=False)

    def write_manifest(self, complete: bool) -> None:
        info = {
            "schema": MANIFEST_VERSION,
            "kind": self.spec.kind,
            "spec_sha256": self.spec.hash,
            "spec": self.spec.raw,
            "points": self.spec.n_points,
            "replications": self.spec.replications,
            "tasks": self.tasks,
            "done": len(self.done),
            "failed": self.failed,
            "complete": complete,
            "axes": self.spec.axes,
            "metrics": list(self.spec.metrics),
            "columns": {f.name: str(f.type) for f in self.schema},
            "shards": self.shards,
            **self.extra,
        }
        path = self.folder / "manifest.json"
        _atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(info, indent=1, default=str)))


def _leftover(entry: Path) -> bool:
    """What a sweep killed before its first manifest leaves: an empty ``results`` folder (or one
    with temporaries only), a temporary manifest, an output-path probe."""
    if entry.name.startswith((".draftsim-probe-", ".manifest.json.")):
        return True
    return entry.name == "results" and entry.is_dir() and not any(entry.glob("part-*.parquet"))


def read_manifest(folder) -> dict:
    """The manifest of a sweep folder, checked (schema version and required keys)."""
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        raise DraftsimError(f"{str(folder)!r} holds no sweep (no manifest.json); give a folder written by draftsim sweep")
    try:
        info = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DraftsimError(f"{path}: not a valid manifest ({exc})") from None
    if not isinstance(info, dict) or info.get("schema") != MANIFEST_VERSION:
        raise DraftsimError(f"{path}: manifest schema {info.get('schema') if isinstance(info, dict) else None!r} is not supported "
                            f"(this draftsim reads {MANIFEST_VERSION})")
    missing = [k for k in ("kind", "spec_sha256", "tasks", "axes", "metrics", "shards") if k not in info]
    if missing:
        raise DraftsimError(f"{path}: manifest lacks {', '.join(missing)}")
    return info


def load(folder) -> pa.Table:
    """Every stored task of a sweep folder as one Arrow table, sorted by task (``.to_pandas()``
    for a DataFrame). The shards are checked against the manifest's columns."""
    info = read_manifest(folder)
    results = Path(folder) / "results"
    shards = sorted(results.glob("part-*.parquet"))
    if not shards:
        raise DraftsimError(f"{str(folder)!r} holds a sweep with no results yet")
    table = pq.ParquetDataset(results).read()
    missing = [c for c in info.get("columns", {}) if c not in table.column_names]
    if missing:
        raise DraftsimError(f"{results}: shards lack column(s) {', '.join(missing)} of the manifest")
    return table.sort_by("task")


# --- executors ------------------------------------------------------------------------------


def schema_for(spec: Spec, points: Sequence[Point], metric_columns: Sequence[str]) -> pa.Schema:
    """The results schema: :class:`RunRecord`'s columns with the axes between ``seed`` and
    ``status`` and one float64 column per metric at the end."""
    record = record_fields()
    columns = [pa.field(n, record[n]) for n in LEAD_COLUMNS]
    columns += [pa.field(name, _arrow_type([p.values[name] for p in points])) for name in spec.axes]
    columns += [pa.field(n, record[n]) for n in STATUS_COLUMNS]
    columns += [pa.field(m, pa.float64()) for m in metric_columns]
    return pa.schema(columns)


def worker_modules(worker) -> set[str]:
    """Modules defining ``worker`` and the functions bound in it (through ``functools.partial``)."""
    out, stack = set(), [worker]
    while stack:
        f = stack.pop()
        if isinstance(f, partial):
            stack.append(f.func)
            stack.extend(a for a in (*f.args, *f.keywords.values()) if callable(a))
        elif callable(f) and getattr(f, "__module__", None) not in (None, "__main__"):
            out.add(f.__module__)
    return out


def _pool_results(worker: Callable, tasks: list[Task], workers: int) -> Iterator[tuple]:
    """Results of ``worker`` over ``tasks`` in completion order: in this process for one worker,
    else in a process pool (forkserver, or spawn) with at most two tasks per worker in flight.
    A worker that dies (killed, out of memory) breaks the pool: its in-flight tasks run again on
    a fresh pool, and a task in flight at two such deaths is recorded as failed."""
    if workers == 1:
        for task in tasks:
            yield worker(task)
        return
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":  # the server imports the worker's modules once; workers fork from it ready
        context.set_forkserver_preload(sorted(worker_modules(worker)))
    queue = collections.deque(tasks)
    running: dict = {}
    crashes: dict[int, int] = {}
    pool = None
    try:
        while queue or running:
            if pool is None:
                pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=context)
            while queue and len(running) < 2 * workers:
                task = queue.popleft()
                running[pool.submit(worker, task)] = task
            finished, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
            broken = False
            for fut in finished:
                task = running.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    broken = True
                    running[fut] = task
                    continue
                yield result
            if broken:
                pool.shutdown(wait=True, cancel_futures=True)
                pool = None
                for task in reversed(list(running.values())):
                    crashes[task.id] = crashes.get(task.id, 0) + 1
                    if crashes[task.id] >= 2:
                        yield Outcome(task.id, {}, "the worker process died running this point (killed, or out of memory)", 0.0, 0.0)
                    else:
                        queue.appendleft(task)
                running.clear()
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def ray_available() -> bool:
    """Whether Ray can be imported (the optional ``ray`` extra)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def start_ray(address: str | None, workers: int):
    """Connect to a Ray cluster at ``address``, or start a local one with ``workers`` CPUs
    (no dashboard, loopback only); an initialised Ray is used as it is. Returns the ``ray``
    module and whether this call started it (the caller then shuts it down)."""
    try:
        import ray
    except ImportError:
        raise DraftsimError("--ray needs Ray: pip install 'draftsim[ray]' (or pip install 'ray>=2.9')") from None
    if ray.is_initialized():
        return ray, False
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    else:
        # address="local": a new cluster for this run, even where `ray start` left one to join
        ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 _node_ip_address="127.0.0.1")
    return ray, True


def call(worker: Callable, task: Task):
    """``worker(task)``: the function Ray runs remotely (Ray needs a plain function)."""
    return worker(task)


def _ray_results(worker: Callable, tasks: list[Task], workers: int, address: str | None) -> Iterator[tuple]:
    ray, started = start_ray(address, workers)
    remote = ray.remote(num_cpus=1)(call)
    slots = max(2, 2 * int(ray.cluster_resources().get("CPU", workers)))
    queue = iter(tasks)
    handle = ray.put(worker)
    running = [remote.remote(handle, t) for t in itertools.islice(queue, slots)]
    try:
        while running:
            finished, running = ray.wait(running, num_returns=1)
            for ref in finished:
                nxt = next(queue, None)
                if nxt is not None:
                    running.append(remote.remote(handle, nxt))
                yield ray.get(ref)
    finally:
        for ref in running:
            ray.cancel(ref)
        if started:
            ray.shutdown()


@dataclass
class Summary:
    """What a call to :func:`run_sweep` did."""

    folder: Path
    tasks: int
    already_done: int
    ran: int
    failed: int
    seconds: float
    backend: str
    workers: int


def run_tasks(spec: Spec, points: list[Point], tasks: list[Task], worker: Callable, metric_columns: Sequence[str], out,
              workers: int = 1, ray: bool = False, ray_address: str | None = None, resume: bool = False,
              progress: Callable[[int, int, int], None] | None = None, extra: dict | None = None,
              flush_seconds: float = 2.0) -> Summary:
    """Run ``worker`` over ``tasks`` (those the folder lacks), storing one row per task.

    ``worker(task) -> Outcome`` must be picklable (a
    module-level function or a :func:`functools.partial` of one). Shards are committed at
    most every ``max(flush_seconds, 2 % of the elapsed time)`` and at the end (and on Ctrl-C).
    """
    if workers < 1:
        raise DraftsimError(f"--workers must be >= 1; got {workers}")
    schema = schema_for(spec, points, metric_columns)
    store = Store(Store.check(out, spec, resume), spec, schema, len(tasks), extra).open()
    by_id = {t.id: t for t in tasks}
    stray = store.done.difference(by_id)
    if stray:
        raise DraftsimError(f"{store.results}: task {min(stray)} is not a task of this sweep; the folder was altered by hand")
    pending = [t for t in tasks if t.id not in store.done]
    already, failed0 = len(store.done), store.failed
    points_by_index = {p.index: p for p in points}
    t0 = last = time.perf_counter()
    ran = 0
    results = _ray_results(worker, pending, workers, ray_address) if ray else _pool_results(worker, pending, workers)
    try:
        for outcome in results:
            task = by_id[outcome.task]
            record = RunRecord(task.id, task.point, task.replication, task.seed, "ok" if outcome.error is None else "failed",
                               outcome.error, outcome.seconds, outcome.cpu_seconds)
            row = asdict(record)
            row.update({name: cell(points_by_index[task.point].values[name], schema.field(name).type) for name in spec.axes})
            row.update({m: outcome.values.get(m) for m in metric_columns})
            store.add(row)
            ran += 1
            if progress is not None:
                progress(already + ran, store.failed + sum(1 for r in store.buffer if r["status"] != "ok"), len(tasks))
            now = time.perf_counter()
            if now - last >= max(flush_seconds, 0.02 * (now - t0)):
                store.flush()
                last = now
    finally:
        store.flush()
        store.write_manifest(complete=len(store.done) == len(tasks))
    return Summary(store.folder, len(tasks), already, ran, store.failed - failed0, time.perf_counter() - t0,
                   "ray" if ray else "pool", workers)


def run_sweep(spec: Spec, kind: Kind, out, workers: int = 1, ray: bool = False, ray_address: str | None = None,
              resume: bool = False, force: bool = False, progress: Callable[[int, int, int], None] | None = None,
              flush_seconds: float = 2.0) -> Summary:
    """Validate every point, then run every task of ``spec`` with ``kind`` into folder ``out``
    (:func:`run_tasks` runs them)."""
    check_size(spec, force)
    points = validate_points(spec, kind)
    tasks = list(spec.tasks(points, seeded=kind.seed_option is not None))
    metric_paths = {m: kind.metrics[m] for m in spec.metrics}
    worker = partial(execute, kind.run, metric_paths)
    return run_tasks(spec, points, tasks, worker, list(spec.metrics), out, workers, ray, ray_address, resume, progress,
                     flush_seconds=flush_seconds)


def numeric(table: pa.Table, column: str) -> np.ndarray:
    """A column as a float array (nulls as NaN)."""
    return np.asarray(table.column(column).to_numpy(zero_copy_only=False), dtype=float)


def aggregate(table: pa.Table, by: Sequence[str], metric: str) -> dict:
    """Mean, standard error and count of ``metric`` over the ok rows of each group of ``by``
    columns: {group values: (mean, se, n)}."""
    ok = [s == "ok" for s in table.column("status").to_pylist()]
    keys = list(zip(*(table.column(b).to_pylist() for b in by))) if by else [()] * table.num_rows
    values = numeric(table, metric)
    groups: dict = {}
    for key, v, good in zip(keys, values, ok):
        if good and np.isfinite(v):
            groups.setdefault(key, []).append(v)
        else:
            groups.setdefault(key, [])
    out = {}
    for key, vs in groups.items():
        arr = np.asarray(vs)
        n = len(arr)
        out[key] = (float(arr.mean()) if n else float("nan"), float(arr.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"), n)
    return out
