"""sim/files.py: every output all or nothing — a failed or interrupted write leaves no temporary
and an older file as it was; figures go through the same path."""

from __future__ import annotations

import errno
import json
import os

import matplotlib.pyplot as plt
import pytest

from draftsim.analysis.figures import ewif_vs_k, save_figure
from draftsim.sim.errors import file_mode
from draftsim.sim.files import atomic_write, atomic_write_bytes, atomic_write_json


def disk_full_after(n):
    """A writer that writes ``n`` bytes, then fails as a full disk does."""
    def write(tmp):
        with open(tmp, "wb") as fh:
            fh.write(b"x" * n)
        raise OSError(errno.ENOSPC, "No space left on device")
    return write


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, error):
    path = atomic_write_bytes(tmp_path / "out.json", b"old and good")

    def write(tmp):
        with open(tmp, "wb") as fh:
            fh.write(b"half")
        raise error

    with pytest.raises(type(error)):
        atomic_write(path, write)
    assert path.read_bytes() == b"old and good"
    assert sorted(os.listdir(tmp_path)) == ["out.json"]


def test_written_files_get_the_umask_mode_and_json_round_trips(tmp_path):
    path = atomic_write_json(tmp_path / "sub" / "doc.json", {"a": [1, 2.5]})
    assert json.loads(path.read_text()) == {"a": [1, 2.5]} and path.read_text().endswith("\n")
    assert (path.stat().st_mode & 0o777) == file_mode()
    with pytest.raises(FileNotFoundError):  # without mkdir the folder must exist
        atomic_write_bytes(tmp_path / "missing" / "x.bin", b"")


def test_a_figure_on_a_full_disk_keeps_the_older_figure(tmp_path, monkeypatch):
    path = ewif_vs_k(tmp_path / "ewif.png")
    good = path.read_bytes()
    assert good.startswith(b"\x89PNG")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    monkeypatch.setattr(fig, "savefig", lambda tmp, **kw: disk_full_after(100)(tmp))
    with pytest.raises(OSError, match="No space left"):
        save_figure(fig, path)
    assert path.read_bytes() == good
    assert sorted(os.listdir(tmp_path)) == ["ewif.png"]
    assert not plt.fignum_exists(fig.number)  # closed either way
