"""The command table: every ``draftsim`` command's name, group, module and one-line summary.

``draftsim --help`` is printed from this table, and ``draftsim.cli`` imports the module of the
command that runs and no other (a command module imports what its command needs: the
serving simulator, matplotlib, torch …). The module's ``register`` builds the command's full
parser; ``tests/draftsim/test_startup.py`` checks that the table and the registered parsers name the
same commands with the same summaries; each module's ``register`` reads its summary from here
(:func:`summary`), so it is written once.

It imports nothing heavy: it is read on every start of the command line.
"""

from __future__ import annotations

from collections import namedtuple

#: The groups of ``draftsim --help``, in the order it lists them: key and title.
GROUP_TITLES = (
    ("serve", "capacity planning of speculative serving"),
    ("plan", "closed forms, no simulation"),
    ("simulate", "policies under acceptance processes"),
    ("measure", "this machine, real runs, calibration"),
    ("real models", "decode, serve and train on this CPU"),
)


class Entry(namedtuple("Entry", "name group module summary")):
    """One command: ``name``, ``group`` (a key of :data:`GROUP_TITLES`), ``module`` (under
    ``draftsim.commands``, whose ``register`` adds the command) and ``summary`` (its line in
    ``--help``)."""

    __slots__ = ()

    @property
    def qualified_module(self) -> str:
        return f"draftsim.commands.{self.module}"


#: Every command, in ``--help`` order (by group, then as listed).
TABLE = (
    Entry("capacity", "serve", "sweeping", "largest request rate meeting SLOs, per configuration"),
    Entry("serve-sim", "serve", "servesim", "simulate a serving engine: continuous batching with speculative decoding under load"),
    Entry("check-serve", "serve", "serve", "replay a serving trace in the serving simulator and compare"),
    Entry("ewif", "plan", "planning", "EWIF and expected tokens against the draft length k"),
    Entry("plan", "plan", "planning", "rank strategies (single drafter, horizontal and vertical cascades) by EWIF"),
    Entry("optimize", "plan", "optimization", "find optimal K matrices, stopping thresholds and tree shapes"),
    Entry("cost", "plan", "costing", "forward times, cost coefficients and bounds from hardware or a profile"),
    Entry("acceptance", "plan", "acceptance", "published acceptance rates, cited (use one with --acceptance NAME)"),
    Entry("simulate", "simulate", "simulation", "simulate a policy (Monte Carlo or discrete-event)"),
    Entry("sweep", "simulate", "sweeping", "run a sweep spec (many simulations) into Parquet"),
    Entry("sweep-plot", "simulate", "sweeping", "heat map or lines of a sweep metric over one or two axes"),
    Entry("trace", "simulate", "traces", "inspect traces"),
    Entry("replay", "simulate", "traces", "run a sim policy over a recorded trace"),
    Entry("profile", "measure", "costing", "measure a real model's forward times on this machine"),
    Entry("calibrate", "measure", "calibration", "fit a hardware entry's efficiency and overhead to your own measured step times"),
    Entry("check-sim", "measure", "running", "replay a run trace in the simulator and compare"),
    Entry("run", "real models", "running", "decode prompts with real models: ar, sd, csd, cascade, ssd, tsd, gsd"),
    Entry("serve", "real models", "serve", "serve requests with real models: continuous batching + speculative decoding"),
    Entry("record", "real models", "traces", "record a trace of real drafters against a real target"),
    Entry("distill", "real models", "distillation", "train a small draft model for the target (knowledge distillation)"),
    Entry("train-head", "real models", "heads", "train SpecDec++'s acceptance-prediction head for a draft model"),
    Entry("demo", "real models", "demo", "plan reference settings and write the planner's figures"),
)

#: The entries by command name.
BY_NAME = {entry.name: entry for entry in TABLE}

#: ``draftsim --help``'s groups: the title (``key: title``) and the command names, in order.
GROUPS = tuple((f"{key}: {title}", tuple(e.name for e in TABLE if e.group == key)) for key, title in GROUP_TITLES)


def summary(name: str) -> str:
    """The one-line summary of command ``name``: its line in ``draftsim --help`` and the help its
    module's ``register`` gives it (one text, written once, here)."""
    return BY_NAME[name].summary
