"""Output files written atomically: all of a file or none of it, never a half-written one.

Every file draftsim writes goes through :func:`atomic_write`: the content is written to a hidden
temporary file in the destination's folder (so the rename stays on one file system), made as
readable as any file the user writes (:func:`~.errors.file_mode`; ``mkstemp`` creates 0600),
optionally synced, and renamed over the destination. A failure at any point (a full disk, an
exception from the writer, Ctrl-C) removes the temporary and leaves an older destination as it
was.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from .errors import file_mode

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_text", "atomic_write_json"]


def atomic_write(path, write: Callable[[str], None], *, mkdir: bool = False, fsync: bool = False) -> Path:
    """Call ``write(tmp)`` to fill a temporary file, then rename it to ``path``.

    ``mkdir`` creates the destination's folder first; ``fsync`` flushes the temporary to disk
    before the rename (for files whose loss after a crash would break a folder's invariants).
    """
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        if fsync:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path, data: bytes, *, mkdir: bool = False, fsync: bool = False) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data), mkdir=mkdir, fsync=fsync)


def atomic_write_text(path, text: str, *, mkdir: bool = False) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text), mkdir=mkdir)


def atomic_write_json(path, doc, *, indent: int | None = 1, mkdir: bool = True, default=None) -> Path:
    """``doc`` as JSON (and a final newline when indented)."""
    text = json.dumps(doc, indent=indent, default=default) + ("\n" if indent is not None else "")
    return atomic_write_text(path, text, mkdir=mkdir)
