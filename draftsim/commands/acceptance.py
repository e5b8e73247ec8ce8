"""``draftsim acceptance``: the catalog of published acceptance measurements, and one entry's rates.

The entries live in ``sim/data/acceptance.json`` (:mod:`draftsim.sim.acceptance_catalog`), each
with its source. ``--acceptance NAME`` on ``simulate``, ``serve-sim`` and sweeps uses one. The
rates shown follow :mod:`draftsim.sim.acceptance_rates`: cumulative per-position rates (vLLM's),
conditional rates and the mean acceptance length with the bonus token.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from draftsim.analysis.table import format_table
from draftsim.sim.acceptance_catalog import METHODS, AcceptanceEntry, acceptance_entry, list_entries
from draftsim.sim.errors import DraftsimError

from .. import args as a
from ..config import add_options, check, from_namespace, option
from .table import summary


@dataclass(kw_only=True)
class AcceptanceConfig:
    """``draftsim acceptance``: list the cited acceptance entries, or show one."""

    name: str | None = option(help="an entry to show with its rates for every usable k (default: list the entries)",
                              positional=True, nargs="?", metavar="NAME")
    method: str | None = option(help="only entries of this drafting method", choices=METHODS)
    target: str | None = option(help="only entries measured on this target model (e.g. llama-3.1-8b)", metavar="MODEL")
    dataset: str | None = option(help="only entries measured on this dataset (e.g. mt-bench)", metavar="NAME")


@dataclass
class ChainRates:
    """One entry's rates for a chain of ``k`` draft tokens."""

    k: int
    cumulative: list[float]  #: a_i = P(tokens 1..i accepted): vLLM's per-position rate
    conditional: list[float]  #: c_i = a_i / a_{i-1}: the EAGLE papers' n-alpha
    mean_length: float  #: 1 + sum a_i: tokens per verification step, bonus included


@dataclass
class AcceptanceResult:
    """The entries listed (``rates`` empty) or one entry with its rates per usable k."""

    entries: list[AcceptanceEntry]
    rates: list[ChainRates] = field(default_factory=list)
    shown: bool = False  #: one named entry (with its rates), not a listing

    def to_dict(self) -> dict:
        def one(e: AcceptanceEntry) -> dict:
            return {"name": e.name, "method": e.method, "target": e.target, "dataset": e.dataset, "engine": e.engine,
                    "hardware": e.hardware, "temperature": e.temperature, "draft": e.draft, "reported": e.reported,
                    "usable_k": list(e.usable_lengths), "source": e.source, "assumptions": list(e.assumptions)}
        out = {"entries": [one(e) for e in self.entries]}
        if self.shown:
            out["rates"] = [vars(r) for r in self.rates]
        return out


def acceptance(config: AcceptanceConfig) -> AcceptanceResult:
    """The catalog entries ``config`` selects, or the one it names with its rates."""
    check(config)
    if config.name is not None:
        if config.method or config.target or config.dataset:
            raise DraftsimError("give an entry NAME or the filters --method/--target/--dataset, not both")
        entry = acceptance_entry(config.name)
        rates = [ChainRates(k, entry.cumulative(k).tolist(), entry.conditional(k).tolist(), float(entry.mean_length(k)))
                 for k in entry.usable_lengths]
        return AcceptanceResult([entry], rates, shown=True)
    return AcceptanceResult(list_entries(config.method, config.target, config.dataset))


def register(sub, common) -> None:
    p = sub.add_parser("acceptance", parents=[common], help=summary("acceptance"),
                       description="List the catalog of published acceptance measurements (method, target, dataset, what the "
                       "source reported and for which k), or show one entry's per-position rates: cumulative a_i (vLLM's "
                       "per-position acceptance, the convention of --positional), conditional c_i (the EAGLE papers' n-alpha) "
                       "and the mean acceptance length 1 + sum a_i (bonus token included).")
    add_options(p, AcceptanceConfig)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    result = acceptance(from_namespace(AcceptanceConfig, args))
    if args.json:
        a.emit_json(result.to_dict())
        return 0
    if not result.shown:
        rows = [[e.name, e.method, e.target or "-", e.dataset or "-", e.reported.replace("_", " "),
                 ",".join(map(str, e.usable_lengths)) or f"- ({e.draft})"] for e in result.entries]
        print(format_table(["entry", "method", "target", "dataset", "reported", "usable k"], rows))
        print(f"{len(rows)} entries; show one with: draftsim acceptance NAME")
        return 0
    e = result.entries[0]
    print(e.summary())
    print(f"source: {e.source}")
    for note in e.assumptions:
        print(f"assumption: {note}")
    if not result.rates:
        print(f"no per-position rates: the source reports a {e.reported.replace('_', ' ')} of a {e.draft} draft")
        return 0
    print(format_table(["k", "mean length", "cumulative a_i (vLLM)", "conditional c_i"],
                       [[r.k, r.mean_length, " ".join(f"{x:.3f}" for x in r.cumulative), " ".join(f"{x:.3f}" for x in r.conditional)]
                        for r in result.rates], floatfmt=".3f"))
    return 0
