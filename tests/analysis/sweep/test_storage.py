"""A sweep folder's shards read back typed and bounded (analysis/sweep/storage.py: read_shard).

A sweep resumed over a damaged shard — cut short, overwritten, not Parquet, another shape of
table, ids out of range or stored twice — is refused in one line naming the shard, what is wrong
with it and what to do (delete it and resume, or start a new folder), exit 2, with nothing in the
folder written, removed or touched. The same shards read by ``sweep-plot`` (analysis.sweep.load)
give the same line. Deleting the shard, as the line says, resumes the sweep: its tasks run again.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.analysis import sweep as sw
from draftsim.analysis.sweep.storage import shard_files
from draftsim.cli import main
from draftsim.sim.errors import DraftsimError

SPEC = ('version = 1\nkind = "simulate"\nmetrics = ["ewif", "acceptance_rate"]\n[base]\npolicy = "fixed:k=3"\ncost = [0.1]\n'
        'tokens = 1000\n[grid]\nalpha = [0.6, 0.7, 0.8, 0.9]\n')


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A finished sweep of 4 tasks, committed as two shards (tasks 0-1 and 2-3)."""
    base = tmp_path_factory.mktemp("swept")
    (base / "spec.toml").write_text(SPEC)
    out = base / "out"
    assert main(["sweep", str(base / "spec.toml"), "--out", str(out), "--workers", "1", "--json"]) == 0
    table = sw.load(out)
    for shard in shard_files(out / "results"):
        shard.unlink()
    for i, half in enumerate((table.slice(0, 2), table.slice(2, 2))):
        pq.write_table(half, out / "results" / f"part-{i:06d}-test.parquet")
    return base


@pytest.fixture
def folder(swept, tmp_path):
    shutil.copytree(swept, tmp_path / "w", symlinks=True)
    return tmp_path / "w"


def snapshot(out: Path) -> dict:
    """Every entry under ``out``: its kind and, for a file, its bytes and modification time."""
    seen = {}
    for root, dirs, files in os.walk(out):
        for name in dirs + files:
            p = Path(root) / name
            seen[str(p.relative_to(out))] = ("link", os.readlink(p)) if p.is_symlink() else (
                ("dir",) if p.is_dir() else ("file", p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else ("other",))
    return seen


def resume(capsys, folder: Path):
    return run(capsys, "sweep", str(folder / "spec.toml"), "--out", str(folder / "out"), "--resume", "--workers", "1")


def refused_naming(status, out, err, shard: str, *fragments):
    assert status == 2 and out == "" and "Traceback" not in err, (status, out, err)
    assert err.count("\n") == 1 and err.startswith("draftsim"), err
    assert shard in err and ("delete that shard" in err or "start a new" in err), err
    for f in fragments:
        assert f in err, (f, err)


def _table(folder) -> pa.Table:
    return pq.read_table(folder / "out" / "results" / "part-000001-test.parquet")


def _write(folder, table: pa.Table) -> None:
    pq.write_table(table, folder / "out" / "results" / "part-000001-test.parquet")


# damaged bytes: (how, what the line says)
BYTES = {
    "cut in half": (lambda b: b[: len(b) // 2], "not readable Parquet"),
    "emptied": (lambda b: b"", "not readable Parquet"),
    "overwritten": (lambda b: b"PAR1" + bytes(range(256)) * 4 + b"PAR1", "not readable Parquet"),
    "footer cut": (lambda b: b[:-9], "not readable Parquet"),
}


@pytest.mark.parametrize("how", sorted(BYTES))
def test_a_resume_over_damaged_bytes_is_one_line_and_writes_nothing(folder, capsys, how):
    damage, fragment = BYTES[how]
    shard = folder / "out" / "results" / "part-000001-test.parquet"
    shard.write_bytes(damage(shard.read_bytes()))
    before = snapshot(folder)
    refused_naming(*resume(capsys, folder), "part-000001-test.parquet", fragment)
    assert snapshot(folder) == before
    with pytest.raises(DraftsimError, match="part-000001-test.parquet.*delete that shard"):
        sw.load(folder / "out")
    status, out, err = run(capsys, "sweep-plot", str(folder / "out"), "--x", "alpha", "--metric", "ewif", "--out", str(folder / "p.png"))
    refused_naming(status, out, err, "part-000001-test.parquet", fragment)
    assert not (folder / "p.png").exists()


def test_a_shard_that_is_not_a_file_is_refused(folder, capsys):
    shard = folder / "out" / "results" / "part-000001-test.parquet"
    shard.unlink()
    shard.symlink_to("/dev/zero")
    before = snapshot(folder)
    refused_naming(*resume(capsys, folder), "part-000001-test.parquet", "not a regular file")
    assert snapshot(folder) == before
    shard.unlink()
    shard.mkdir()
    refused_naming(*resume(capsys, folder), "part-000001-test.parquet", "not a regular file")


def _set(table: pa.Table, name: str, values, type_=None) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, pa.field(name, type_ or table.schema.field(name).type), pa.array(values, type_ or table.schema.field(name).type))


# a valid Parquet shard of another shape or with impossible ids: (edit, what the line says)
TABLES = {
    "a column dropped": (lambda t: t.drop_columns(["ewif"]), "lacks column(s) ewif"),
    "a column added": (lambda t: t.append_column("extra", pa.array([1.0, 2.0])), "column(s) extra the sweep has not"),
    "task as text": (lambda t: _set(t, "task", ["2", "3"], pa.string()), "column task is string, not int64"),
    "alpha as text": (lambda t: _set(t, "alpha", ["0.8", "0.9"], pa.string()), "column alpha is string, not double"),
    "a null task": (lambda t: _set(t, "task", [2, None]), "column task holds 1 empty (null) value"),
    "a null status": (lambda t: _set(t, "status", ["ok", None]), "column status holds 1 empty (null) value"),
    "a task out of range": (lambda t: _set(t, "task", [2, 4]), "it holds task 4, not a task of this sweep (tasks 0 to 3)"),
    "a negative task": (lambda t: _set(t, "task", [-1, 3]), "it holds task -1"),
    "a task twice in it": (lambda t: _set(t, "task", [3, 3]), "task 3 is stored twice in it"),
    "a task of the other shard": (lambda t: _set(t, "task", [1, 3]), "task 1 is stored twice (an earlier shard holds it too)"),
    "more rows than tasks": (lambda t: pa.concat_tables([t, t, t]), "declares 6 rows, more than the sweep's 4 tasks"),
}


@pytest.mark.parametrize("how", sorted(TABLES))
def test_a_resume_over_a_shard_of_another_shape_is_one_line_and_writes_nothing(folder, capsys, how):
    edit, fragment = TABLES[how]
    _write(folder, edit(_table(folder)))
    before = snapshot(folder)
    refused_naming(*resume(capsys, folder), "part-000001-test.parquet", fragment)
    assert snapshot(folder) == before
    with pytest.raises(DraftsimError, match="part-000001-test.parquet"):
        sw.load(folder / "out")


def test_deleting_the_damaged_shard_as_told_resumes_the_sweep(folder, capsys):
    shard = folder / "out" / "results" / "part-000001-test.parquet"
    shard.write_bytes(shard.read_bytes()[:100])
    status, out, err = resume(capsys, folder)
    assert status == 2 and "delete that shard" in err
    shard.unlink()
    status, out, err = resume(capsys, folder)
    assert status == 0 and "ran 2 (2 already done)" in out, (out, err)
    assert sorted(sw.load(folder / "out").column("task").to_pylist()) == [0, 1, 2, 3]


def test_an_intact_folder_loads_and_resumes_to_nothing(folder, capsys):
    status, out, err = resume(capsys, folder)
    assert status == 0 and "ran 0 (4 already done)" in out, (out, err)
    assert sw.load(folder / "out").column("task").to_pylist() == [0, 1, 2, 3]


def test_a_hand_edited_manifest_too_deep_or_not_text_is_one_line(folder, capsys):
    manifest = folder / "out" / "manifest.json"
    manifest.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(DraftsimError, match="manifest nests arrays or objects 100,000 levels deep"):
        sw.read_manifest(folder / "out")
    manifest.write_bytes(b'{"schema": 1, "kind": "simul\xe9"}')
    with pytest.raises(DraftsimError, match="not UTF-8 text"):
        sw.read_manifest(folder / "out")
    manifest.write_text('{"schema": 1, "kind": "simulate", "spec_sha256": "' + "0" * 64 + '", "tasks": 4, "axes": [], "metrics": [], '
                        '"shards": [], "columns": ["task"]}')
    with pytest.raises(DraftsimError, match="manifest field columns must be an object"):
        sw.read_manifest(folder / "out")


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_flipped_byte_in_a_shard_is_refused_or_changes_nothing(tmp_path_factory, data):
    """A shard written as the sweep writes it (each page with its CRC) and read as a resume reads it
    (the manifest's columns): any byte of it changed, read_shard refuses the shard in one line or
    returns exactly the rows written, never other values (a flipped bit inside a float page used to
    decode as a different number)."""
    from draftsim.analysis.sweep.storage import read_shard

    rows = [{"task": i, "status": "ok", "ewif": 1.0 + i / 7, "note": f"row {i}"} for i in range(6)]
    table = pa.Table.from_pylist(rows)
    path = tmp_path_factory.mktemp("flip") / "part-000000-x.parquet"
    pq.write_table(table, path, write_page_checksum=True)
    raw = bytearray(path.read_bytes())
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= data.draw(st.integers(1, 255))
    path.write_bytes(bytes(raw))
    try:
        got = read_shard(path, columns={f.name: str(f.type) for f in table.schema}, tasks=6)  # as the manifest lists them
    except DraftsimError as exc:
        assert len(str(exc).splitlines()) == 1 and str(path) in str(exc)
    else:
        assert got.to_pylist() == rows
