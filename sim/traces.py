"""Traces: how real drafters and a real target agreed, token by token, on real text.

Two members of one family share the folder layout, the manifest and the atomic, checksummed
per-prompt commits (:class:`TraceSchema`): *recordings* (``draftsim.trace``, below; written by
``draftsim record``) and *run traces* (``draftsim.run``, :data:`RUN_TABLES`; written by every
``draftsim run``: per round, per forward call and per proposed token at every cascade level,
what a policy did on real models, one :mod:`draftsim.sim.records` record per row — :mod:`draftsim.sim.replay`
replays them). :class:`TraceFolder` reads any member; :class:`Trace` and :class:`RunTrace` add
what each member's tables answer.

A recording is a folder::

    NAME/manifest.json                 schema, version, run metadata, committed prompts
    NAME/sequences/KEY.parquet         per prompt: prompt ids, the target's output ids
    NAME/positions/KEY.parquet         per output position and (proposer, verifier) pair
    NAME/calls/KEY.parquet             per forward call: model, tokens, seconds

Schema version 1 (Parquet through pyarrow):

``sequences``: prompt_set (string), prompt_id (int32), split (string), mode (string:
"greedy" or "sampled"), seed (int64, −1 for greedy), prompt_ids (list<int32>),
output_ids (list<int32>).

``positions``: prompt_id (int32), mode (string), position (int32, index in the output),
target_token (int32), proposer (string), verifier (string, "target" or a drafter),
draft_token (int32, the proposer's most probable token), p_draft (float64, verifier's
probability of it), q_draft (float64, proposer's), accept_prob (float64, 1 − TV(p, q) over
the full vocabulary: the exact speculative-sampling acceptance), greedy_match (bool: the
draft token equals the verifier's argmax — for the target, its output token),
draft_top_ids / verifier_top_ids (list<int32>) and draft_top_probs / verifier_top_probs
(list<float32>), the top-k of each distribution.

``calls``: prompt_id (int32), mode (string), model (string), kind (string: "generate" or
"forward"), n_tokens (int32), seconds (float64).

Each prompt is committed atomically: its three files are written under temporary names and
renamed, then the manifest (which lists every file with its row count and SHA-256) is
rewritten the same way. A run killed at any point leaves a valid trace of the prompts it
finished; ``resume`` continues with nothing lost or duplicated. Loading checks the
manifest, every file's checksum and every table's schema.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import DraftsimError
from .files import atomic_write_bytes, file_kind, parse_json, read_bytes
from .records import RUN_RECORDS, arrow_schema, from_table

__all__ = ["SCHEMA_NAME", "SCHEMA_VERSION", "TABLES", "RUN_TABLES", "TraceSchema", "RECORDING", "RUN", "TraceWriter", "TraceFolder", "Trace", "RunTrace", "TraceError", "EMBEDDED_TRACE"]

#: A small trace of the embedded model (SmolLM2-135M-Instruct) shipped with draftsim, so that
#: replay and the demo work without torch.
EMBEDDED_TRACE = Path(__file__).parent / "data" / "smollm2-trace"

SCHEMA_NAME = "draftsim.trace"
SCHEMA_VERSION = 1

TABLES = {
    "sequences": pa.schema(
        [
            ("prompt_set", pa.string()),
            ("prompt_id", pa.int32()),
            ("split", pa.string()),
            ("mode", pa.string()),
            ("seed", pa.int64()),
            ("prompt_ids", pa.list_(pa.int32())),
            ("output_ids", pa.list_(pa.int32())),
        ]
    ),
    "positions": pa.schema(
        [
            ("prompt_id", pa.int32()),
            ("mode", pa.string()),
            ("position", pa.int32()),
            ("target_token", pa.int32()),
            ("proposer", pa.string()),
            ("verifier", pa.string()),
            ("draft_token", pa.int32()),
            ("p_draft", pa.float64()),
            ("q_draft", pa.float64()),
            ("accept_prob", pa.float64()),
            ("greedy_match", pa.bool_()),
            ("draft_top_ids", pa.list_(pa.int32())),
            ("draft_top_probs", pa.list_(pa.float32())),
            ("verifier_top_ids", pa.list_(pa.int32())),
            ("verifier_top_probs", pa.list_(pa.float32())),
        ]
    ),
    "calls": pa.schema(
        [
            ("prompt_id", pa.int32()),
            ("mode", pa.string()),
            ("model", pa.string()),
            ("kind", pa.string()),
            ("n_tokens", pa.int32()),
            ("seconds", pa.float64()),
        ]
    ),
}


#: Metadata fields that must agree for a recording to resume into an existing trace.
RESUME_KEYS = ("target", "drafters", "prompt_set", "max_new_tokens", "top_k", "modes", "seed")

_SEQUENCES = TABLES["sequences"]

#: Tables of a run trace (``draftsim.run``, version 2): what a real run of a policy did. Each
#: table but ``sequences`` holds one :mod:`draftsim.sim.records` record per row, after the prompt id;
#: its schema derives from the record's fields. Version 2 added ``rounds.overhead_seconds``.
RUN_TABLES = {"sequences": _SEQUENCES, **{name: arrow_schema(record, (("prompt_id", int),)) for name, record in RUN_RECORDS.items()}}


def _kind(what: str, test):
    """A metadata field's type: (what it must be, in words; its test)."""
    return what, test


_STR = _kind("a string", lambda v: isinstance(v, str))
_COUNT = _kind("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
_SEED = _kind("an integer >= 0 or null", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0))
_NAMES = _kind("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
_STRS = _kind("a string or a list of strings", lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)))
_MODEL = _kind("an object with a string name", lambda v: isinstance(v, dict) and isinstance(v.get("name"), str))
_TOP_K = _kind("an integer >= 1 or null", lambda v: v is None or _COUNT[1](v))


@dataclass(frozen=True)
class TraceSchema:
    """One member of the trace family: its name, version, tables, resume keys and the types
    of its metadata fields (checked when a trace is opened, so a hand-edited manifest is
    refused with one line naming the field). Every member shares the folder layout, the
    manifest and the atomic, checksummed commits."""

    name: str
    version: int
    tables: dict
    resume_keys: tuple
    metadata_types: dict = field(default_factory=dict)


#: Recordings (``draftsim record``): teacher-forced agreement of drafters with the target.
RECORDING = TraceSchema(SCHEMA_NAME, SCHEMA_VERSION, TABLES, RESUME_KEYS,
                        {"target": _MODEL, "drafters": _NAMES, "prompt_set": _STRS, "max_new_tokens": _COUNT, "top_k": _TOP_K,
                         "modes": _NAMES, "seed": _SEED})
#: Runs (``draftsim run --trace``): per round and per call, what a policy did on real models.
RUN = TraceSchema("draftsim.run", 2, RUN_TABLES, ("target", "drafters", "method", "policy", "rule", "prompt_set", "max_new_tokens", "sampling", "seed"),
                  {"target": _STR, "drafters": _NAMES, "models": _NAMES, "method": _STR, "policy": _STR, "rule": _STR,
                   "prompt_set": _STRS, "max_new_tokens": _COUNT, "sampling": _STR, "seed": _SEED})


class TraceError(DraftsimError):
    """A trace that cannot be read: missing, truncated, corrupt or of another schema."""


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write_bytes(path, data, mkdir=True, fsync=True)  # synced: the manifest must never name a lost file


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: Largest manifest read (a manifest lists ~300 bytes per prompt: 64 MB is ~200,000 prompts).
MANIFEST_MAX_BYTES = 64 * 2**20


def _read_regular(path: Path, what: str, limit: int) -> bytes:
    """The bytes of ``path``, refusing anything but a regular file (a FIFO would block, a link
    to /dev/zero would never end) and files over ``limit`` bytes."""
    return read_bytes(path, what, limit, error=TraceError)


def _check_entries(path: Path, manifest: dict, schema: TraceSchema) -> None:
    """Type-check every prompt entry of a manifest: a unique string key, one file per table
    with a path that stays inside the trace folder (no absolute paths, no ``..``, no links
    leading out), listed once, with integer rows and a SHA-256."""
    root = Path(path).resolve()
    keys: dict = {}
    files: dict = {}
    for i, entry in enumerate(manifest["prompts"]):
        if not isinstance(entry, dict):
            raise TraceError(f"trace {path}: manifest prompt {i} is a {type(entry).__name__}, not an object")
        key = entry.get("key")
        if not isinstance(key, str) or not key:
            raise TraceError(f"trace {path}: manifest prompt {i} has no key (got {key!r})")
        if key in keys:
            raise TraceError(f"trace {path}: prompt {key!r} is listed twice in the manifest (entries {keys[key]} and {i})")
        keys[key] = i
        listed = entry.get("files")
        if not isinstance(listed, dict):
            raise TraceError(f"trace {path}: prompt {key!r} lists no files (got {type(listed).__name__})")
        for name in schema.tables:
            info = listed.get(name)
            if info is None:
                raise TraceError(f"trace {path}: prompt {key!r} lists no {name} file")
            if not (isinstance(info, dict) and isinstance(info.get("path"), str) and isinstance(info.get("sha256"), str)
                    and isinstance(info.get("rows"), int) and not isinstance(info.get("rows"), bool) and info["rows"] >= 0):
                raise TraceError(f"trace {path}: prompt {key!r}: the {name} entry must have a path, a row count >= 0 and a sha256; got {info!r}")
            rel = info["path"]
            if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise TraceError(f"trace {path}: prompt {key!r} lists {rel!r}, a path outside the trace folder; "
                                 "manifest paths are relative and stay inside it")
            target = (Path(path) / rel).resolve()
            if target != root and root not in target.parents:
                raise TraceError(f"trace {path}: {rel!r} leads outside the trace folder (to {target}); manifest paths stay inside it")
            if target in files:
                raise TraceError(f"trace {path}: {rel!r} is listed twice in the manifest ({files[target]} and prompt {key!r})")
            files[target] = f"prompt {key!r}"


class TraceWriter:
    """Append prompts to a trace folder, one atomic commit per prompt."""

    def __init__(self, path, metadata: dict, resume: bool = False, schema: TraceSchema = RECORDING):
        self.path = Path(path)
        self.schema = schema
        manifest = self.path / "manifest.json"
        if manifest.exists():
            existing = TraceFolder._read_manifest(self.path, schema)
            if not resume:
                raise DraftsimError(f"{self.path} already holds a trace; pass --resume to continue it, or choose another --out")
            for key in schema.resume_keys:
                if existing["metadata"].get(key) != metadata.get(key):
                    raise DraftsimError(
                        f"cannot resume {self.path}: {key} was {existing['metadata'].get(key)!r}, now {metadata.get(key)!r}"
                    )
            self.manifest = existing
        else:
            self.manifest = {"schema": schema.name, "version": schema.version, "metadata": metadata, "prompts": []}
            self._write_manifest()

    @property
    def done(self) -> set[str]:
        return {p["key"] for p in self.manifest["prompts"]}

    def commit(self, key: str, info: dict, tables: dict[str, dict]) -> None:
        """Write one prompt's tables (column dicts) and record them in the manifest."""
        if key in self.done:
            raise DraftsimError(f"prompt {key} is already in the trace")
        files = {}
        safe = key.replace("/", "-")
        for name, schema in self.schema.tables.items():
            table = pa.Table.from_pydict(tables[name], schema=schema)
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink, compression="zstd")
            rel = Path(name) / f"{safe}.parquet"
            _atomic_write_bytes(self.path / rel, sink.getvalue().to_pybytes())
            files[name] = {"path": str(rel), "rows": table.num_rows, "sha256": _sha256(self.path / rel)}
        self.manifest["prompts"].append({"key": key, **info, "files": files})
        self._write_manifest()

    def update_metadata(self, **fields) -> None:
        self.manifest["metadata"].update(fields)
        self._write_manifest()

    def _write_manifest(self) -> None:
        _atomic_write_bytes(self.path / "manifest.json", json.dumps(self.manifest, indent=1).encode())


class TraceFolder:
    """What every member of the trace family shares: a validated folder (manifest, checksums,
    table schemas of :attr:`schema`), the concatenated ``tables`` and the per-prompt
    ``entries``. Members are its subclasses: :class:`Trace` (recordings) and
    :class:`RunTrace` (runs); each reads only its own schema."""

    #: The member's schema (set by each subclass).
    schema: TraceSchema

    def __init__(self, path, verify: bool = True):
        self.path = Path(path)
        self.manifest = self._read_manifest(self.path, self.schema)
        self.metadata = self.manifest["metadata"]
        tables = self.schema.tables
        parts: dict[str, list] = {name: [] for name in tables}
        self.entries: list[dict] = []  # per committed sequence: {"key", "mode", table name -> Table}
        for entry in self.manifest["prompts"]:
            mine = {"key": entry.get("key"), "mode": entry.get("mode")}
            for name, schema in tables.items():
                info = entry.get("files", {}).get(name)
                if info is None:
                    raise TraceError(f"trace {self.path}: prompt {entry.get('key')} lists no {name} file")
                file = self.path / info["path"]
                if not file.exists():
                    raise TraceError(f"trace {self.path}: {info['path']} is missing (listed in the manifest)")
                if not file.is_file():
                    raise TraceError(f"trace {self.path}: {info['path']} is not a regular file ({file_kind(file.stat().st_mode)})")
                if verify and _sha256(file) != info["sha256"]:
                    raise TraceError(f"trace {self.path}: {info['path']} is truncated or corrupt (checksum mismatch)")
                try:
                    table = pq.read_table(file)
                except Exception as exc:  # pyarrow raises several types for damaged files
                    raise TraceError(f"trace {self.path}: {info['path']} is not readable Parquet ({exc})") from None
                if not table.schema.equals(schema, check_metadata=False):
                    raise TraceError(f"trace {self.path}: {info['path']} does not match the {name} schema of version {self.schema.version}")
                if table.num_rows != info["rows"]:
                    raise TraceError(f"trace {self.path}: {info['path']} has {table.num_rows} rows, the manifest says {info['rows']}")
                parts[name].append(table)
                mine[name] = table
            self.entries.append(mine)
        self.tables = {name: (pa.concat_tables(t) if t else schema.empty_table()) for (name, schema), t in zip(tables.items(), parts.values())}

    @staticmethod
    def _read_manifest(path: Path, schema: TraceSchema = RECORDING) -> dict:
        file = Path(path) / "manifest.json"
        if not Path(path).is_dir():
            raise TraceError(f"no trace at {path} (not a folder)")
        if not (file.exists() or file.is_symlink()):
            raise TraceError(f"no trace at {path}: manifest.json is missing")
        try:
            text = _read_regular(file, "manifest", MANIFEST_MAX_BYTES).decode()
        except UnicodeDecodeError as exc:
            raise TraceError(f"trace {path}: manifest.json is not valid JSON (not UTF-8: {' '.join(str(exc).split())})") from None
        # bounded nesting, an over-long integer and invalid JSON all one line naming the manifest
        manifest = parse_json(text, f"trace {path}: manifest.json", error=TraceError)
        if not isinstance(manifest, dict):
            raise TraceError(f"trace {path}: manifest.json holds a JSON {type(manifest).__name__}; a manifest is a JSON object")
        if manifest.get("schema") != schema.name:
            hint = {RUN.name: " (a run trace: use draftsim check-sim)", RECORDING.name: " (a recording: use draftsim replay)"}
            raise TraceError(f"{path} is not a {schema.name} trace (schema {manifest.get('schema')!r}){hint.get(manifest.get('schema'), '')}")
        if manifest.get("version") != schema.version:
            raise TraceError(f"trace {path} has schema version {manifest.get('version')!r}; this draftsim reads version {schema.version}")
        if not isinstance(manifest.get("prompts"), list) or not isinstance(manifest.get("metadata"), dict):
            raise TraceError(f"trace {path}: manifest.json lacks its prompts list or metadata")
        if schema.name in (RECORDING.name, RUN.name):  # what readers and resume rely on
            missing = [key for key in schema.resume_keys if key not in manifest["metadata"]]
            if missing:
                raise TraceError(f"trace {path}: the manifest's metadata lacks {', '.join(missing)}")
        for key, (what, test) in schema.metadata_types.items():
            if key in manifest["metadata"] and not test(manifest["metadata"][key]):
                value = json.dumps(manifest["metadata"][key])
                raise TraceError(f"trace {path}: the manifest's metadata {key} must be {what}; got {value[:80]}")
        _check_entries(path, manifest, schema)
        return manifest

    @property
    def sequences(self) -> pa.Table:
        return self.tables["sequences"]

    @property
    def calls(self) -> pa.Table:
        return self.tables["calls"]


class Trace(TraceFolder):
    """A validated recording trace (see the module docstring). Tables are pyarrow Tables."""

    schema = RECORDING

    @property
    def positions(self) -> pa.Table:
        return self.tables["positions"]

    def pairs(self) -> list[tuple[str, str]]:
        """(proposer, verifier) pairs present."""
        cols = self.positions.select(["proposer", "verifier"]).to_pylist()
        return sorted({(c["proposer"], c["verifier"]) for c in cols})

    def drafters(self) -> list[str]:
        return list(self.metadata.get("drafters", []))

    def acceptance(self, proposer: str, verifier: str = "target", kind: str = "prob", mode: str = "greedy") -> list[np.ndarray]:
        """Per sequence (in manifest order), the acceptance along the output: ``accept_prob``
        (``kind="prob"``) or ``greedy_match`` as 0/1 (``kind="flag"``)."""
        if kind not in ("prob", "flag"):
            raise DraftsimError(f"kind must be prob or flag; got {kind!r}")
        return self.column(proposer, verifier, "accept_prob" if kind == "prob" else "greedy_match", mode)

    def column(self, proposer: str, verifier: str, column: str, mode: str = "greedy") -> list[np.ndarray]:
        """Per sequence (in manifest order), a numeric ``positions`` column along the output."""
        if (proposer, verifier) not in self.pairs():
            raise DraftsimError(f"trace {self.path} has no {proposer} -> {verifier} data; it has {self.pairs()}")
        out = []
        for entry in self.entries:
            seq = entry["sequences"]
            if seq["mode"][0].as_py() != mode:
                continue
            pos = entry["positions"]
            mask = pc.and_(pc.equal(pos["proposer"], proposer), pc.equal(pos["verifier"], verifier))
            rows = pos.filter(mask)
            arr = np.zeros(len(seq["output_ids"][0].as_py()))
            arr[rows["position"].to_numpy()] = rows[column].to_numpy(zero_copy_only=False).astype(np.float64)
            out.append(arr)
        return out

    def cost_coefficients(self, models: list[str]) -> list[float]:
        """Seconds per token of each model's teacher-forced forward calls, relative to the
        target's (what the trace measured; not decode-time per-call costs)."""
        per_token: dict = {}
        calls = self.calls.to_pydict()
        for model, kind, n, sec in zip(calls["model"], calls["kind"], calls["n_tokens"], calls["seconds"]):
            if kind == "forward":
                tokens, seconds = per_token.get(model, (0, 0.0))
                per_token[model] = (tokens + n, seconds + sec)
        if "target" not in per_token:
            raise DraftsimError(f"trace {self.path} has no target forward timings; give costs explicitly")
        rate = {m: s / max(t, 1) for m, (t, s) in per_token.items()}
        return [rate.get(m, 0.0) / rate["target"] for m in models]

    def summary(self) -> dict:
        """Acceptance per (proposer, verifier): mean accept_prob, greedy match rate, and the
        match rate by output-position bucket; plus forward-call timing per model."""
        pos = self.positions.to_pydict()
        by_pair: dict = {}
        for prop, ver, ap, gm, p in zip(pos["proposer"], pos["verifier"], pos["accept_prob"], pos["greedy_match"], pos["position"]):
            d = by_pair.setdefault((prop, ver), {"n": 0, "accept": 0.0, "match": 0, "buckets": {}})
            d["n"] += 1
            d["accept"] += ap
            d["match"] += int(gm)
            b = d["buckets"].setdefault(min(p // 16, 7), [0, 0])
            b[0] += 1
            b[1] += int(gm)
        pairs = [
            {
                "proposer": k[0], "verifier": k[1], "positions": v["n"], "mean_accept_prob": v["accept"] / v["n"],
                "greedy_match_rate": v["match"] / v["n"],
                "match_by_position": {f"{16 * b}-{16 * b + 15 if b < 7 else ''}": m / n for b, (n, m) in sorted(v["buckets"].items())},
            }
            for k, v in sorted(by_pair.items())
        ]
        by_set: dict = {}
        for entry in self.entries:
            prompt_set = entry["sequences"]["prompt_set"][0].as_py()
            pos = entry["positions"].select(["proposer", "verifier", "accept_prob", "greedy_match"]).to_pydict()
            for prop, ver, ap, gm in zip(pos["proposer"], pos["verifier"], pos["accept_prob"], pos["greedy_match"]):
                d = by_set.setdefault((prop, ver, prompt_set), [0, 0.0, 0])
                d[0] += 1
                d[1] += ap
                d[2] += int(gm)
        calls = self.calls.to_pydict()
        timing: dict = {}
        for model, kind, n, s in zip(calls["model"], calls["kind"], calls["n_tokens"], calls["seconds"]):
            t = timing.setdefault((model, kind), [0, 0, 0.0])
            t[0] += 1
            t[1] += n
            t[2] += s
        return {
            "path": str(self.path),
            "metadata": self.metadata,
            "sequences": self.sequences.num_rows,
            "output_tokens": int(sum(len(o) for o in self.sequences["output_ids"].to_pylist())),
            "pairs": pairs,
            "by_prompt_set": [
                {"proposer": k[0], "verifier": k[1], "prompt_set": k[2], "positions": n, "mean_accept_prob": a / n, "greedy_match_rate": m / n}
                for k, (n, a, m) in sorted(by_set.items())
            ],
            "calls": [{"model": m, "kind": k, "calls": c, "tokens": n, "seconds": s} for (m, k), (c, n, s) in sorted(timing.items())],
        }


class RunTrace(TraceFolder):
    """A validated run trace (schema ``draftsim.run``): per prompt its sequence, rounds,
    forward calls and every proposed token with its fate. Models are numbered as in the
    policy (0 = target); ``metadata["models"]`` names them."""

    schema = RUN

    @property
    def rounds(self) -> pa.Table:
        return self.tables["rounds"]

    @property
    def drafts(self) -> pa.Table:
        return self.tables["drafts"]

    def models(self) -> list[str]:
        return list(self.metadata.get("models", []))

    def records(self, table: str, key: str | None = None) -> list:
        """The rows of ``table`` (rounds, calls or drafts) as :mod:`draftsim.sim.records` records: of
        the prompt committed under ``key``, or of every prompt in manifest order."""
        if table not in RUN_RECORDS:
            raise DraftsimError(f"table must be one of {', '.join(RUN_RECORDS)}; got {table!r}")
        if key is None:
            return from_table(self.tables[table], RUN_RECORDS[table])
        for entry in self.entries:
            if entry["key"] == key:
                return from_table(entry[table], RUN_RECORDS[table])
        raise DraftsimError(f"run trace {self.path} has no prompt {key!r}; it has {', '.join(e['key'] for e in self.entries) or 'none'}")
