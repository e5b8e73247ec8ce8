"""Run traces: every real run's rounds, forward calls and proposed tokens, on disk.

A run trace is the ``draftsim.run`` member of the trace family (:mod:`draftsim.sim.traces`): the same
folder layout, manifest, checksums and atomic per-prompt commits as a recording, with the
tables ``sequences`` and one per run record — ``rounds``, ``calls``, ``drafts`` — whose
columns are the fields of :mod:`draftsim.sim.records` (:data:`draftsim.sim.traces.RUN_TABLES`).
:mod:`draftsim.sim.replay` replays them in ``sim``.
"""

from __future__ import annotations

from pathlib import Path

from ..sim.records import RUN_RECORDS, columns
from ..sim.traces import RUN, RunTrace, TraceWriter
from .executor import RunLog
from .prompts import Prompt

__all__ = ["RunWriter", "log_tables"]


def log_tables(log: RunLog, prompt: Prompt, prompt_ids: list[int], mode: str, seed: int) -> dict[str, dict]:
    """Column dicts of one generation, ready for :meth:`draftsim.sim.traces.TraceWriter.commit`."""
    pid = int(prompt.id)
    tables = {
        "sequences": {"prompt_set": [prompt.set], "prompt_id": [pid], "split": [prompt.split], "mode": [mode],
                      "seed": [seed], "prompt_ids": [list(prompt_ids)], "output_ids": [list(log.output)]},
    }
    for name, record in RUN_RECORDS.items():
        tables[name] = columns(getattr(log, name), record, prompt_id=pid)
    return tables


class RunWriter:
    """Append generations to a run trace (resumable: prompts already there are skipped)."""

    def __init__(self, path, metadata: dict, resume: bool = False):
        self.writer = TraceWriter(Path(path), metadata, resume=resume, schema=RUN)

    @property
    def done(self) -> set[str]:
        return self.writer.done

    def commit(self, key: str, log: RunLog, prompt: Prompt, prompt_ids: list[int], mode: str, seed: int, **info) -> None:
        self.writer.commit(key, {"mode": mode, "tokens": log.tokens, "seconds": log.seconds, **info},
                           log_tables(log, prompt, prompt_ids, mode, seed))

    def load(self) -> RunTrace:
        return RunTrace(self.writer.path)
