"""Sweep specs: the TOML schema (see :mod:`draftsim.analysis.sweep`), parsed and checked
(:func:`parse_spec`), expanded into points and seeded tasks, checked point by point before
any work (:func:`validate_points`)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

from ...sim.errors import DraftsimError, shown
from ...sim.files import read_text
from .rows import LEAD_COLUMNS, STATUS_COLUMNS
from .tasks import Kind, Task

#: Version of the spec schema.
SPEC_VERSION = 1
#: Keys a spec may have at the top level.
SPEC_KEYS = ("version", "kind", "seed", "replications", "metrics", "description", "base", "grid", "zip", "random", "capacity")
#: Most tasks (points x replications) a sweep runs without ``force``.
MAX_TASKS = 100_000
#: Most values one range or one random table may produce, even with ``force``.
MAX_AXIS_VALUES = 10_000_000


@dataclass(frozen=True)
class Point:
    """One configuration of a sweep: ``values`` are the varied options, ``config`` = base + values."""

    index: int
    values: dict
    config: dict


@dataclass
class Spec:
    """A parsed, structurally valid sweep spec (the schema: :mod:`draftsim.analysis.sweep`)."""

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
    """A configuration value: a string, number, bool, or (once) a list of those; an empty list is a
    repeatable option given no value (``drafter-model = []``: no drafter)."""
    if isinstance(value, bool) or isinstance(value, (int, float, str)):
        if isinstance(value, float) and not math.isfinite(value):
            raise DraftsimError(f"{where}: value {value!r} is not a finite number")
        return value
    if isinstance(value, list) and allow_list:
        return [_check_value(where, v, allow_list=False) for v in value]
    raise DraftsimError(f"{where}: values must be strings, numbers, booleans or lists of those; got {type(value).__name__} {value!r}")


def _table(where: str, value) -> dict:
    if not isinstance(value, dict):
        raise DraftsimError(f"{where} must be a table; got {type(value).__name__} {value!r}")
    return value


def _number(where: str, value, integer: bool = False) -> int | float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise DraftsimError(f"{where} must be {'an integer' if integer else 'a finite number'}; got {shown(value)}")
    if isinstance(value, int) and abs(value).bit_length() > 1023:  # past float range: the range arithmetic overflows
        raise DraftsimError(f"{where} must be a number within float range (about 1.8e308); got {shown(value)}")
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
    span = (stop - start) / step + 1e-9  # a float: a denormal step makes it inf, a tiny one hundreds of digits
    if not span < MAX_AXIS_VALUES:
        raise DraftsimError(f"{where}: the range has {float(span) + 1:.3g} values (start {start!r}, stop {stop!r}, step {step!r}), "
                            f"more than {MAX_AXIS_VALUES:,}: give a larger step")
    count = int(math.floor(span)) + 1
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
def _header(data: dict, kinds: Mapping[str, Kind]) -> tuple[str, Kind, int, int, list[str], str]:
    """The spec's top-level keys: version, kind, seed, replications, metrics (checked against
    the kind) and description."""
    unknown = [k for k in data if k not in SPEC_KEYS]
    if unknown:
        raise DraftsimError(f"unknown spec key {unknown[0]!r}; valid keys: {', '.join(SPEC_KEYS)}")
    if "version" not in data:
        raise DraftsimError(f"the spec needs version = {SPEC_VERSION}")
    if data["version"] != SPEC_VERSION or isinstance(data["version"], bool):
        raise DraftsimError(f"spec version {data['version']!r} is not supported; this draftsim reads version {SPEC_VERSION}")
    name = data.get("kind")
    if name not in kinds:
        raise DraftsimError(f"kind {name!r} is not a sweep kind; choose from {', '.join(kinds)}")
    kind = kinds[name]
    seed = _number("seed", data.get("seed", 0), integer=True)
    if seed < 0:
        raise DraftsimError(f"seed must be >= 0; got {seed}")
    reps = _number("replications", data.get("replications", 1), integer=True)
    if not 1 <= reps <= 100_000:
        raise DraftsimError(f"replications must lie in [1, 100000]; got {reps}")
    metrics = data.get("metrics", list(kind.default_metrics))
    if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) for m in metrics):
        raise DraftsimError(f"metrics must be a non-empty list of metric names; got {metrics!r}")
    for m in metrics:
        if m not in kind.metrics:
            raise DraftsimError(f"unknown metric {m!r} for kind {name}; valid metrics: {', '.join(kind.metrics)}")
    if len(set(metrics)) != len(metrics):
        raise DraftsimError(f"metrics names a metric twice: {metrics!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise DraftsimError(f"description must be a string; got {description!r}")
    return name, kind, seed, reps, metrics, description


class _Options:
    """The option names a spec sets, each once across [base], [grid], [[zip]] and [random];
    never the kind's seed option or an option it forbids."""

    def __init__(self, kind: Kind):
        self.kind = kind
        self.seen: dict[str, str] = {}

    def claim(self, section: str, key: str) -> str:
        """``key`` of ``section`` as its canonical option name, refused if set before."""
        if not isinstance(key, str) or not key.strip():
            raise DraftsimError(f"{_where(section)}: option names must be non-empty strings; got {key!r}")
        name = option_name(key)
        if name in self.seen:
            raise DraftsimError(f"option {key!r} is set in {self.seen[name]} and again in {_where(section)}; set each option once")
        if self.kind.seed_option and name == self.kind.seed_option:
            raise DraftsimError(f"{_where(section, key)}: seeds are derived per point from the spec's top-level seed; remove {key!r}")
        if name in self.kind.forbidden:
            raise DraftsimError(f"{_where(section, key)}: option {key!r} writes per-run output and cannot be swept")
        self.seen[name] = _where(section)
        return name


def _zip_groups(data: dict, options: _Options) -> list[dict]:
    """The ``[[zip]]`` groups (or one ``[zip]`` table): lists of one length per group."""
    raw = data.get("zip", [])
    raw = [raw] if isinstance(raw, dict) else raw
    if not isinstance(raw, list):
        raise DraftsimError(f"[zip] must be a table or an array of tables ([[zip]]); got {raw!r}")
    zips = []
    for i, group in enumerate(raw):
        where = f"zip group {i + 1}"
        group = _table(f"[[zip]] {i + 1}", group)
        if not group:
            raise DraftsimError(f"{where} is empty; give lists of equal length")
        out = {options.claim("zip", key): _axis_values(f"{where} {key}", v) for key, v in group.items()}
        lengths = {n: len(v) for n, v in out.items()}
        if len(set(lengths.values())) != 1:
            raise DraftsimError(f"{where}: zipped lists must have one length; got {lengths}")
        zips.append(out)
    return zips


def _random_table(data: dict, options: _Options) -> dict:
    """The ``[random]`` table: n, an optional seed and one distribution per option."""
    if "random" not in data:
        return {}
    table = _table("[random]", data["random"])
    if "n" not in table:
        raise DraftsimError("[random] needs n, the number of samples")
    n = _number("[random] n", table["n"], integer=True)
    if not 1 <= n <= MAX_AXIS_VALUES:
        raise DraftsimError(f"[random] n must lie in [1, {MAX_AXIS_VALUES:,}]; got {n}")
    random = {"n": n}
    if "seed" in table:
        random["seed"] = _number("[random] seed", table["seed"], integer=True)
        if random["seed"] < 0:
            raise DraftsimError(f"[random] seed must be >= 0; got {random['seed']}")
    for key, v in table.items():
        if key not in ("n", "seed"):
            random[options.claim("random", key)] = _distribution(_where("random", key), v)
    if len(random) == len([k for k in ("n", "seed") if k in random]):
        raise DraftsimError("[random] has no axis; give at least one option = {distribution = [...]}")
    return random


def _check_axes(spec: Spec) -> None:
    """No varied option may take a results column's name or be a kept metric too."""
    for name in spec.axes:
        if name in LEAD_COLUMNS + STATUS_COLUMNS:
            raise DraftsimError(f"option {name!r} cannot be varied: its column name is taken by the results' {name!r} column")
        if name in spec.metrics:
            raise DraftsimError(f"{name!r} is both a varied option and a kept metric; drop it from metrics (the option's "
                                "column holds the value)")


def parse_spec(data: dict, kinds: Mapping[str, Kind]) -> Spec:
    """Check the structure of a spec (a dict as read from TOML) and return it as a :class:`Spec`.

    Checks keys, types, empty axes, options set twice, metric names against the kind;
    :func:`validate_points` then checks every point's configuration with the kind.
    """
    data = _table("the spec", data)
    name, kind, seed, reps, metrics, description = _header(data, kinds)
    options = _Options(kind)
    base = {options.claim("base", key): _check_value(_where("base", key), v) for key, v in _table("[base]", data.get("base", {})).items()}
    grid = {options.claim("grid", key): _axis_values(_where("grid", key), v) for key, v in _table("[grid]", data.get("grid", {})).items()}
    zips = _zip_groups(data, options)
    random = _random_table(data, options)
    capacity = _table("[capacity]", data.get("capacity", {}))
    spec = Spec(name, seed, reps, tuple(metrics), base, grid, zips, random, description, capacity, raw=data)
    _check_axes(spec)
    return spec


#: The largest spec read (a spec is a page of TOML; its axes are bounded by MAX_AXIS_VALUES anyway).
MAX_SPEC_BYTES = 4 * 2**20


def load_spec(path, kinds: Mapping[str, Kind]) -> Spec:
    """Read and parse a TOML spec file (:func:`parse_spec`)."""
    p = Path(path)
    if not p.is_file():
        raise DraftsimError(f"spec {str(path)!r} is not a file; give a TOML sweep spec")
    text = read_text(p, "spec", MAX_SPEC_BYTES, fifo=False)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DraftsimError(f"spec {str(path)!r} is not valid TOML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise DraftsimError(f"spec {str(path)!r} nests tables or arrays too deeply to read") from None
    except ValueError as exc:  # an integer of more digits than Python converts (not a TOMLDecodeError)
        if "integer string conversion" in str(exc):
            raise DraftsimError(f"spec {str(path)!r} holds an integer of more digits than draftsim reads "
                                f"({sys.get_int_max_str_digits():,})") from None
        raise DraftsimError(f"spec {str(path)!r} is not valid TOML: {' '.join(str(exc).split())[:120]}") from None
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
