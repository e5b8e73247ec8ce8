"""Progress bars for long work (tqdm on stderr; silent when stderr is not a terminal), and
progress lines (:func:`line`: on stderr always, so ``--json``'s stdout stays JSON)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from tqdm import tqdm


@contextmanager
def token_bar(total: int, desc: str):
    """A progress bar counting tokens; ``bar.update(n)`` advances it."""
    with tqdm(total=total, desc=desc, unit="tok", unit_scale=True, disable=None, leave=False) as bar:
        yield bar


@contextmanager
def count_bar(total: int, desc: str):
    """A progress bar counting work items."""
    with tqdm(total=total, desc=desc, disable=None, leave=False) as bar:
        yield bar


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


@contextmanager
def null_bar(total: int, desc: str):
    """No progress bar: the default of library calls (a sweep worker shows none)."""
    yield _Silent()


def line(message: str) -> None:
    """One progress line on stderr, flushed (above any bar of this process). Module-level, so a
    worker process can be handed it: its lines reach the same stderr."""
    tqdm.write(message, file=sys.stderr)
    sys.stderr.flush()
