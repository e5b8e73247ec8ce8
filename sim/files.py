"""Files in and out: inputs read once and bounded, outputs written atomically.

**Inputs** (:func:`read_bytes`, :func:`read_text`): every file a user hands draftsim (request
traces, length files, profiles, catalogs, specs, trace manifests) is opened once, checked to be
a regular file (or, where a stream makes sense, a pipe: ``--request-trace <(zcat t.csv.gz)``),
and read up to a size limit; a device such as ``/dev/zero`` or a file over the limit is refused
with one line before any work. Text is UTF-8, with or without the byte-order mark a spreadsheet
writes; NUL bytes mark a binary file.

**Outputs**: all of a file or none of it, never a half-written one.

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
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable

from .errors import DraftsimError, file_mode, shown

__all__ = ["MAX_INPUT_BYTES", "MAX_JSON_DEPTH", "read_bytes", "read_text", "file_kind", "json_depth", "parse_json", "unique_keys", "DuplicateKeyError",
           "atomic_write", "atomic_write_bytes", "atomic_write_text", "atomic_write_json"]

#: The largest input file read whole (a 256 MiB request trace is ~10 million requests).
MAX_INPUT_BYTES = 256 * 2**20


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words ("a folder", "a FIFO", ...)."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path, what: str, limit: int = MAX_INPUT_BYTES, *, fifo: bool = False, error=DraftsimError) -> bytes:
    """The bytes of ``path``, read once: a regular file (or with ``fifo`` a pipe) of at most
    ``limit`` bytes; anything else raises ``error`` with one line naming ``what`` and the path.
    Opened non-blocking, so a FIFO without a writer is refused rather than waited on when
    ``fifo`` is false."""
    try:
        fd = os.open(path, os.O_RDONLY | (0 if fifo else getattr(os, "O_NONBLOCK", 0)))
    except FileNotFoundError:
        raise error(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise error(f"cannot open {what} {path} ({exc.strerror})") from None
    info = os.fstat(fd)
    regular = stat.S_ISREG(info.st_mode)
    if not (regular or (fifo and stat.S_ISFIFO(info.st_mode))) or (regular and info.st_size > limit):
        os.close(fd)
        if not regular:
            raise error(f"{what} {path} is not a regular file ({file_kind(info.st_mode)})" + ("; give a file or a pipe" if fifo else ""))
        raise error(f"{what} {path} is {info.st_size:,} bytes; draftsim reads at most {limit:,}")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise error(f"{what} {path} is over {limit:,} bytes; draftsim reads at most {limit:,}")
    return data


def read_text(path, what: str, limit: int = MAX_INPUT_BYTES, *, fifo: bool = True, error=DraftsimError) -> str:
    """:func:`read_bytes` decoded as UTF-8 (a leading byte-order mark dropped); NUL bytes or
    invalid UTF-8 are refused as not text."""
    data = read_bytes(path, what, limit, fifo=fifo, error=error)
    if b"\0" in data:
        raise error(f"{what} {path} is not a text file (it holds NUL bytes)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text (byte {exc.start:,})") from None


#: The deepest nesting of arrays and objects a JSON input may have: every format draftsim reads
#: nests a few levels (a vLLM result's ``itls``: 2); deeper input is refused before the parser
#: recurses into it.
MAX_JSON_DEPTH = 32

#: A JSON string literal (the unrolled form: no backtracking over long strings).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def _bracket_depth(data: bytes, chunk: int) -> int:
    """The deepest running count of ``[``/``{`` less ``]``/``}`` in ``data`` (chunked: bounded memory)."""
    import numpy as np

    depth = deepest = 0
    for start in range(0, len(data), chunk):
        arr = np.frombuffer(data, dtype=np.uint8, count=min(chunk, len(data) - start), offset=start)
        step = ((arr == 0x5B) | (arr == 0x7B)).astype(np.int8) - ((arr == 0x5D) | (arr == 0x7D)).astype(np.int8)
        step = step[step != 0]
        if step.size:
            run = np.cumsum(step, dtype=np.int64) + depth
            deepest, depth = max(deepest, int(run.max())), int(run[-1])
    return deepest


def json_depth(text: str | bytes, chunk: int = 1 << 24, bound: int | None = None) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text, brackets inside strings left out, without
    parsing. With ``bound``, a text whose every bracket (strings included) nests no deeper than
    ``bound`` is answered from that count alone (an upper bound; the string-stripping pass, the
    slow one, runs only when it exceeds ``bound``)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if bound is not None:
        upper = _bracket_depth(data, chunk)
        if upper <= bound:
            return upper
    return _bracket_depth(_JSON_STRING.sub(b'""', data), chunk)


class DuplicateKeyError(Exception):
    """A JSON object naming a key twice (:func:`parse_json`)."""


def unique_keys(pairs: list) -> dict:
    """A JSON object's pairs as a dict, each key given once (``json.loads``' ``object_pairs_hook``)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        raise DuplicateKeyError(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return out


def parse_json(text: str, source: str, *, max_depth: int = MAX_JSON_DEPTH, error=DraftsimError):
    """``text`` parsed as one JSON document, its nesting bounded by ``max_depth`` before parsing;
    anything else (invalid JSON, an integer of more digits than Python converts, several
    documents, an object giving a key twice) raises ``error`` with one line naming ``source``."""
    depth = json_depth(text, bound=max_depth)
    if depth > max_depth:
        raise error(f"{source} nests arrays or objects {depth:,} levels deep; draftsim reads at most {max_depth}")
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKeyError as exc:  # JSON parsers keep the last value silently: a file edited twice, or two pasted together
        raise error(f"{source} gives the key {shown(exc.args[0])} twice in one object; give each key once") from None
    except json.JSONDecodeError as exc:
        raise error(f"{source} is not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # an integer over Python's int-string limit
        if "integer string conversion" in str(exc):
            raise error(f"{source} holds an integer of more digits than draftsim reads ({sys.get_int_max_str_digits():,})") from None
        raise error(f"{source} is not valid JSON ({' '.join(str(exc).split())[:120]})") from None


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
