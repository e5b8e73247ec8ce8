"""Run records: what a real run did, defined once.

The real executors (:mod:`draftsim.realrun.executor`, :mod:`draftsim.realrun.trees`) append these records to a
:class:`draftsim.realrun.executor.RunLog` as they decode; run traces store them as Parquet tables
whose schemas derive from the fields below (:func:`arrow_schema`, :data:`draftsim.sim.traces.RUN_TABLES`),
written column by column (:func:`columns`) and read back (:func:`from_table`). A field's
Python type fixes its column type: ``int`` → int32, ``float`` → float64, ``bool`` → bool,
``str`` → string.

Glossary (numbering as in the policy: model 0 is the target, model i drafter i):

* a **round** is one verification by the target: a draft proposed to it, the accepted
  tokens and the target's own token (correction or bonus) emitted;
* a **call** is one forward call of a model — the target's prefill, a drafter's draft step,
  a verification — or one proposal of a statistical drafter (Max-Gram, bigram: no forward);
* a **draft event** is one proposed token at any level of a cascade and its fate with the
  model that verified it.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields

import pyarrow as pa

__all__ = ["Call", "Round", "DraftEvent", "RUN_RECORDS", "arrow_type", "arrow_schema", "columns", "from_table"]


@dataclass(slots=True)
class Call:
    """One forward call of a model, or one proposal of a statistical drafter."""

    round: int  #: the round it belongs to (−1: the target's prefill, before the first round)
    model: int  #: 0 = target, i = drafter i
    kind: str  #: "prefill", "draft" or "verify"
    n_tokens: int  #: tokens fed to the model (0 for a statistical drafter's proposal)
    seconds: float  #: wall-clock time of the call
    #: Of ``n_tokens``, prompt tokens prefilled in this call: a first verification the prefill
    #: rode on (``generate(prefill_apart=False)``); 0 otherwise.
    prompt_tokens: int = 0


@dataclass(slots=True)
class Round:
    """One target verification.

    ``drafted`` / ``accepted`` count proposed tokens (chain executors: those that lie within
    the final text — a draft running past the end of the text is cut there; tree executors:
    the verified tree's nodes and the accepted path's). ``draft_seconds`` is the wall time of
    building the draft, ``target_seconds`` that of the verification (the target's call and
    the verification rule); ``overhead_seconds`` is the round's wall time outside its calls
    (:class:`Call`): the executor's own work — planning, bookkeeping, verification
    arithmetic, logging.
    """

    round: int  #: index of the round in the run
    start: int  #: output index of the round's first emitted token
    drafted: int
    accepted: int
    emitted: int  #: tokens added to the output (accepted + the target's token, cut at EOS and the budget)
    draft_seconds: float
    target_seconds: float
    overhead_seconds: float


@dataclass(slots=True)
class DraftEvent:
    """One proposed token, at any level of a cascade, and its fate.

    ``block`` is the model of the plan block the token came out of: for tokens a drafter's
    speculative round passed up (vertical cascades), that drafter. ``position − index`` is
    the output index where the verified draft started.
    """

    round: int
    verifier: int  #: the model that verified the token
    proposer: int  #: the model that drafted it
    block: int
    position: int  #: output index the token would take
    index: int  #: its place in the verified draft (tree runs: its depth − 1)
    token: int
    conf: float  #: the proposer's confidence in it (its probability; Max-Gram: a function of the match length)
    pred: float  #: the acceptance prediction the policy saw (an acceptance head's p̂, else ``conf``)
    accepted: bool  #: by that verifier


#: The run-trace tables holding each record (besides ``sequences``).
RUN_RECORDS = {"rounds": Round, "calls": Call, "drafts": DraftEvent}

_ARROW = {int: pa.int32(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}


def arrow_type(python_type) -> pa.DataType:
    """The Parquet column type of a record field of ``python_type`` (int, float, bool, str)."""
    try:
        return _ARROW[python_type]
    except KeyError:
        raise TypeError(f"no column type for {python_type!r}; records hold int, float, bool or str") from None


def arrow_schema(record: type, leading: tuple = ()) -> pa.Schema:
    """The table schema of ``record``'s fields in order, after the ``leading`` (name, python
    type) columns (run traces lead with ``prompt_id``)."""
    hints = typing.get_type_hints(record)
    return pa.schema([(name, arrow_type(t)) for name, t in leading] + [(f.name, arrow_type(hints[f.name])) for f in fields(record)])


def columns(records: list, record: type, **constant) -> dict[str, list]:
    """Column lists of ``records`` (instances of ``record``), after ``constant`` columns
    (name=value, repeated on every row) — ready for ``pa.Table.from_pydict``."""
    n = len(records)
    out = {name: [value] * n for name, value in constant.items()}
    for f in fields(record):
        out[f.name] = [getattr(r, f.name) for r in records]
    return out


def from_table(table: pa.Table, record: type) -> list:
    """The records in ``table`` (columns beyond ``record``'s fields are ignored)."""
    names = [f.name for f in fields(record)]
    cols = [table.column(name).to_pylist() for name in names]
    return [record(*row) for row in zip(*cols)]
