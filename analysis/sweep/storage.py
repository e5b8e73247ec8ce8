"""The output folder of a sweep: Parquet shards of :class:`SweepRow` rows plus a manifest,
written atomically and read back (:func:`load`, :func:`aggregate`)."""

from __future__ import annotations

import fcntl
import json
import math
import os
import socket
import time
import typing
import uuid
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...sim.errors import DraftsimError, folder_mode
from ...sim.files import MAX_INPUT_BYTES, atomic_write, parse_json, read_bytes, read_text
from .rows import LEAD_COLUMNS, STATUS_COLUMNS, SweepRow

if TYPE_CHECKING:
    from .spec import Point, Spec

#: Version of the output folder's manifest.
MANIFEST_VERSION = 1


_ARROW = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def record_fields() -> dict[str, pa.DataType]:
    """Column name → Arrow type of every :class:`SweepRow` field (``X | None`` as X, nullable)."""
    hints = typing.get_type_hints(SweepRow)
    return {f.name: _ARROW[next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))]
            for f in fields(SweepRow)}


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
            stored_tasks(p / "results", info.get("columns"), info["tasks"])  # every shard readable before anything is written
        elif p.is_dir() and any(not _leftover(x) for x in p.iterdir()):
            raise DraftsimError(f"--out {str(folder)!r} is a folder with other files in it and no sweep; give a new or empty folder")
        return p

    def open(self) -> Store:
        """Take the folder (:func:`lock`), remove temporaries of a killed run and read what its
        shards hold. :meth:`close` gives the folder back."""
        self._lock = lock(self.folder)
        try:
            return self._open()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Give the folder back (the lock is also released when the process ends, however it ends)."""
        if getattr(self, "_lock", None) is not None:
            self._lock.close()
            self._lock = None

    def _open(self) -> Store:
        stored = stored_tasks(self.results, {f.name: str(f.type) for f in self.schema}, self.tasks)
        self.results.mkdir(parents=True, exist_ok=True, mode=folder_mode())
        for tmp in self.results.glob(".*.tmp"):
            tmp.unlink()
        for name, ids, failed in stored:
            self.done.update(ids)
            self.failed += failed
            self.shards.append({"file": name, "rows": len(ids), "failed": failed})
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
        # each page with its CRC (Parquet's page checksum): a damaged page that still decodes is refused on resume, not read
        atomic_write(self.results / name, lambda tmp: pq.write_table(table, tmp, write_page_checksum=True))
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
        atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(info, indent=1, default=str)))


#: The lock file a writer holds in a sweep folder (an advisory ``flock``, released by the kernel
#: when the writer's process ends, however it ends; the file stays and says who held it last).
LOCK_NAME = ".draftsim-lock"


def lock(folder) -> typing.TextIO:
    """Take ``folder`` for writing: an exclusive ``flock`` on its lock file, held until the
    returned file is closed. A second writer gets one line naming the holder, so two sweeps
    never interleave their shards in one folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=folder_mode())
    handle = open(folder / LOCK_NAME, "a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise DraftsimError(f"--out {str(folder)!r} is being written by {holder}; wait for it to finish, or choose another "
                            "folder") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"draftsim pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    return handle


def _leftover(entry: Path) -> bool:
    """What a sweep killed before its first manifest leaves: an empty ``results`` folder (or one
    with temporaries only), a temporary manifest, an output-path probe, the lock file."""
    if entry.name == LOCK_NAME or entry.name.startswith((".draftsim-probe-", ".manifest.json.")):
        return True
    return entry.name == "results" and entry.is_dir() and not any(entry.glob("part-*.parquet"))


#: The largest manifest read (it lists ~80 bytes per shard: 64 MiB is ~800,000 shards).
MANIFEST_MAX_BYTES = 64 * 2**20
#: The largest shard read, on disk and as its footer declares it uncompressed (a shard holds the
#: rows a sweep finished in a few seconds: ~100 bytes a row without error texts).
MAX_SHARD_BYTES = MAX_INPUT_BYTES
#: What to do about a damaged shard, said after what is wrong with it.
SHARD_REMEDY = ("delete that shard (draftsim sweep SPEC --out DIR --resume then runs its tasks again) or start a new --out "
                "folder")


def read_manifest(folder) -> dict:
    """The manifest of a sweep folder, checked (schema version and required keys), its size and
    nesting bounded before it is parsed."""
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        raise DraftsimError(f"{str(folder)!r} holds no sweep (no manifest.json); give a folder written by draftsim sweep")
    info = parse_json(read_text(path, "sweep manifest", MANIFEST_MAX_BYTES, fifo=False), f"{path}: the manifest")
    if not isinstance(info, dict) or info.get("schema") != MANIFEST_VERSION:
        shown = json.dumps(info.get("schema"))[:60] if isinstance(info, dict) else None
        raise DraftsimError(f"{path}: manifest schema {shown} is not supported (this draftsim reads {MANIFEST_VERSION})")
    missing = [k for k in ("kind", "spec_sha256", "tasks", "axes", "metrics", "shards") if k not in info]
    if missing:
        raise DraftsimError(f"{path}: manifest lacks {', '.join(missing)}")
    for key, what, ok in (("kind", "a string", isinstance(info["kind"], str)),
                          ("spec_sha256", "a 64-digit hex string", isinstance(info["spec_sha256"], str) and len(info["spec_sha256"]) == 64),
                          ("tasks", "an integer >= 0", isinstance(info["tasks"], int) and not isinstance(info["tasks"], bool) and info["tasks"] >= 0),
                          ("axes", "a list of names", isinstance(info["axes"], list) and all(isinstance(a, str) for a in info["axes"])),
                          ("metrics", "a list of names", isinstance(info["metrics"], list) and all(isinstance(m, str) for m in info["metrics"])),
                          ("shards", "a list", isinstance(info["shards"], list)),
                          ("columns", "an object of column names and type names",
                           isinstance(info.get("columns", {}), dict) and all(isinstance(t, str) for t in info.get("columns", {}).values()))):
        if not ok:
            raise DraftsimError(f"{path}: manifest field {key} must be {what}; got {json.dumps(info[key])[:60]} (the folder was altered by hand)")
    return info


def shard_files(results) -> list[Path]:
    """The shards of a results folder, in name (= commit) order."""
    return sorted(Path(results).glob("part-*.parquet"))


def read_shard(path, columns: dict[str, str] | None = None, tasks: int | None = None, read: Sequence[str] | None = None) -> pa.Table:
    """One shard, typed and bounded before its rows are decoded: a regular file of at most
    :data:`MAX_SHARD_BYTES` bytes, Parquet whose footer declares at most ``tasks`` rows and
    :data:`MAX_SHARD_BYTES` uncompressed bytes and (with ``columns``, name → Arrow type name as
    the manifest lists them) exactly those columns of those types; its ``task`` ids non-null,
    distinct and in [0, ``tasks``), its ``status`` non-null. Returns the ``read`` columns (all by
    default); anything else raises one line naming the shard, what is wrong, and the remedy."""
    path = Path(path)

    def bad(what: str) -> DraftsimError:
        return DraftsimError(f"sweep shard {path}: {what}; {SHARD_REMEDY}")

    try:
        data = read_bytes(path, "sweep shard", MAX_SHARD_BYTES)
    except DraftsimError as exc:  # not a regular file, over the limit, unreadable
        raise DraftsimError(f"{exc}; {SHARD_REMEDY}") from None
    try:
        shard = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)  # pages written with their CRC
        meta, schema = shard.metadata, shard.schema_arrow
        declared = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        have = {f.name: str(f.type) for f in schema}
    except Exception as exc:  # pyarrow raises several types for damaged bytes (ArrowInvalid, OSError, UnicodeDecodeError)
        raise bad(f"not readable Parquet ({' '.join(str(exc).split())[:160]})") from None
    if tasks is not None and meta.num_rows > tasks:
        raise bad(f"its footer declares {meta.num_rows:,} rows, more than the sweep's {tasks:,} tasks")
    if declared > MAX_SHARD_BYTES:
        raise bad(f"its footer declares {declared:,} bytes uncompressed; draftsim reads at most {MAX_SHARD_BYTES:,}")
    if columns is not None and have != dict(columns):
        missing = [c for c in columns if c not in have]
        extra = [c for c in have if c not in columns]
        typed = [f"{c} is {have[c]}, not {t}" for c, t in columns.items() if c in have and have[c] != t]
        what = (f"it lacks column(s) {', '.join(missing)}" if missing else f"it has column(s) {', '.join(extra)} the sweep has not"
                if extra else f"column {typed[0]}")
        raise bad(f"{what} (this sweep's columns: {', '.join(f'{c} {t}' for c, t in columns.items())[:200]})")
    for name, type_ in (("task", "int64"), ("status", "string")):
        if have.get(name) != type_:
            raise bad(f"column {name} is {'missing' if name not in have else have[name]}; a sweep shard's {name} is {type_}")
    try:
        table = shard.read(columns=list(read) if read is not None else None)
        check = table if {"task", "status"} <= set(table.column_names) else shard.read(columns=["task", "status"])
        table.validate(full=True)  # text columns valid UTF-8, offsets in range: what a damaged page breaks silently
    except Exception as exc:  # as above: damaged pages
        raise bad(f"not readable Parquet ({' '.join(str(exc).split())[:160]})") from None
    if check.num_rows != meta.num_rows:
        raise bad(f"it holds {check.num_rows:,} rows, its footer says {meta.num_rows:,}")
    for name in ("task", "status"):
        if check.column(name).null_count:
            raise bad(f"column {name} holds {check.column(name).null_count:,} empty (null) value(s)")
    ids = check.column("task").to_numpy()
    if ids.size and (ids.min() < 0 or (tasks is not None and ids.max() >= tasks)):
        wrong = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise bad(f"it holds task {wrong}, not a task of this sweep (tasks 0 to {(tasks or 0) - 1:,})")
    if len(np.unique(ids)) != len(ids):
        raise bad(f"task {_twice(ids)} is stored twice in it (the folder was altered by hand)")
    return table


def _twice(ids: np.ndarray) -> int:
    """An id ``ids`` holds more than once."""
    ordered = np.sort(ids)
    return int(ordered[:-1][np.diff(ordered) == 0][0])


def stored_tasks(results, columns: dict[str, str] | None, tasks: int | None) -> list[tuple[str, list[int], int]]:
    """Per shard of ``results`` (:func:`read_shard`, in commit order): its file name, its task ids and
    how many of them failed. A task stored by two shards is refused, naming the second."""
    done: set[int] = set()
    out = []
    for shard in shard_files(results):
        table = read_shard(shard, columns, tasks, read=["task", "status"])
        ids = table.column("task").to_pylist()
        _once(shard, done, ids)
        out.append((shard.name, ids, sum(1 for s in table.column("status").to_pylist() if s != "ok")))
    return out


def _once(shard: Path, done: set, ids: list) -> None:
    """Add ``shard``'s task ids to ``done``, refusing one an earlier shard holds."""
    overlap = done.intersection(ids)
    if overlap:
        raise DraftsimError(f"sweep shard {shard}: task {min(overlap)} is stored twice (an earlier shard holds it too); the folder was "
                            f"altered by hand (or written by two sweeps): {SHARD_REMEDY}")
    done.update(ids)


def load(folder) -> pa.Table:
    """Every stored task of a sweep folder as one Arrow table, sorted by task (``.to_pandas()``
    for a DataFrame). Each shard is read by :func:`read_shard` against the manifest's columns
    and task count."""
    info = read_manifest(folder)
    results = Path(folder) / "results"
    shards = shard_files(results)
    if not shards:
        raise DraftsimError(f"{str(folder)!r} holds a sweep with no results yet")
    columns = info.get("columns") or None
    parts: list[pa.Table] = []
    done: set[int] = set()
    for shard in shards:
        part = read_shard(shard, columns, info["tasks"])
        if parts and not part.schema.equals(parts[0].schema, check_metadata=False):
            raise DraftsimError(f"sweep shard {shard}: its columns differ from those of {shards[0].name}; {SHARD_REMEDY}")
        _once(shard, done, part.column("task").to_pylist())
        parts.append(part.replace_schema_metadata(None))
    return pa.concat_tables(parts).sort_by("task")


def schema_for(spec: Spec, points: Sequence[Point], metric_columns: Sequence[str], text_columns: Sequence[str] = ()) -> pa.Schema:
    """The results schema: :class:`SweepRow`'s columns with the axes between ``seed`` and
    ``status``, one float64 column per metric, then one string column per ``text_columns``."""
    record = record_fields()
    columns = [pa.field(n, record[n]) for n in LEAD_COLUMNS]
    columns += [pa.field(name, _arrow_type([p.values[name] for p in points])) for name in spec.axes]
    columns += [pa.field(n, record[n]) for n in STATUS_COLUMNS]
    columns += [pa.field(m, pa.float64()) for m in metric_columns]
    columns += [pa.field(m, pa.string()) for m in text_columns]
    return pa.schema(columns)


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
