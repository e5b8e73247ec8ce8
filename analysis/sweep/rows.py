"""The bookkeeping columns of a sweep's results: one record, defined once, that the spec (for the
names it reserves) and the storage (for the Parquet schema) both read."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["SweepRow", "LEAD_COLUMNS", "STATUS_COLUMNS"]


@dataclass(frozen=True)
class SweepRow:
    """The bookkeeping columns of a sweep's results row (one per task), defined once: the results schema derives
    from these fields (:func:`schema_for`). The varied options' columns go between ``seed``
    and ``status``, the metrics' (float64) after ``cpu_seconds``."""

    task: int  #: point * replications + replication
    point: int  #: index of the configuration (grid × zip groups × random samples)
    replication: int
    seed: int | None  #: the run's derived seed (None for a deterministic kind)
    status: str  #: "ok" or "failed"
    error: str | None  #: why the run failed, one line
    seconds: float  #: wall time of the run
    cpu_seconds: float  #: CPU time of the run, in its worker


#: Columns every results table starts with (before the axes) and the bookkeeping after them.
LEAD_COLUMNS = tuple(f.name for f in fields(SweepRow))[:4]
STATUS_COLUMNS = tuple(f.name for f in fields(SweepRow))[4:]
