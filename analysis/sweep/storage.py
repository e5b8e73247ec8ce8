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
from ...sim.files import atomic_write
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
        atomic_write(self.results / name, lambda tmp: pq.write_table(table, tmp))
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
    for key, what, ok in (("kind", "a string", isinstance(info["kind"], str)),
                          ("spec_sha256", "a 64-digit hex string", isinstance(info["spec_sha256"], str) and len(info["spec_sha256"]) == 64),
                          ("tasks", "an integer >= 0", isinstance(info["tasks"], int) and not isinstance(info["tasks"], bool) and info["tasks"] >= 0),
                          ("axes", "a list of names", isinstance(info["axes"], list) and all(isinstance(a, str) for a in info["axes"])),
                          ("metrics", "a list of names", isinstance(info["metrics"], list) and all(isinstance(m, str) for m in info["metrics"])),
                          ("shards", "a list", isinstance(info["shards"], list))):
        if not ok:
            raise DraftsimError(f"{path}: manifest field {key} must be {what}; got {json.dumps(info[key])[:60]} (the folder was altered by hand)")
    return info


def load(folder) -> pa.Table:
    """Every stored task of a sweep folder as one Arrow table, sorted by task (``.to_pandas()``
    for a DataFrame). The shards are checked against the manifest's columns."""
    info = read_manifest(folder)
    results = Path(folder) / "results"
    shards = sorted(results.glob("part-*.parquet"))
    if not shards:
        raise DraftsimError(f"{str(folder)!r} holds a sweep with no results yet")
    try:
        table = pq.ParquetDataset(results).read()
    except (pa.ArrowException, OSError) as exc:
        raise DraftsimError(f"{results}: a shard is not readable Parquet ({' '.join(str(exc).split())[:200]})") from None
    missing = [c for c in info.get("columns", {}) if c not in table.column_names]
    if missing:
        raise DraftsimError(f"{results}: shards lack column(s) {', '.join(missing)} of the manifest")
    tasks = table.column("task").to_numpy()
    if len(np.unique(tasks)) != len(tasks):
        twice = int(np.sort(tasks)[:-1][np.diff(np.sort(tasks)) == 0][0])
        raise DraftsimError(f"{results}: task {twice} is stored twice; the folder was altered by hand (or written by two sweeps)")
    return table.sort_by("task")


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
