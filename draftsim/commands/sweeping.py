"""``draftsim sweep``, ``draftsim sweep-plot`` and ``draftsim capacity``: many simulations from
one TOML spec, in a local process pool or on Ray, stored as Parquet (a configuration, a
function and a result each)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass, field

from draftsim.analysis import capacity as cap
from draftsim.analysis import sweep as sw
from draftsim.analysis.table import format_table
from draftsim.sim.cost.overheads import ENGINES
from draftsim.sim.errors import DraftsimError
from draftsim.sim.registry import engine_help, served_method_help

from .. import args as a
from ..config import add_options, check, from_namespace, option
from ..sweepkinds import KINDS
from .frontdoor import HELP as CAPACITY_HELP
from .table import summary

SPEC_HELP = """\
A spec is a TOML file (schema version 1): "a command line as a table" plus axes.

  version = 1
  kind = "simulate"            # one of: {kinds}
  seed = 0                     # each run derives its own seed from it
  replications = 2
  metrics = ["ewif", "ewif_se"]
  [base]                       # the command's options, without "--"
  policy = "fixed:k=4"
  cost = [0.05]                # a list repeats a flag (--cost 0.05)
  [grid]                       # every combination
  alpha = [0.6, 0.7, 0.8]
  tokens = {{ start = 100000, stop = 300000, step = 100000 }}
  [[zip]]                      # lists varied together
  [random]                     # n = 20, seed = 1, alpha = {{ uniform = [0.5, 0.9] }}

Results: OUT/results/*.parquet (draftsim.analysis.sweep.load(OUT), or pyarrow.parquet.read_table(OUT + "/results")) and OUT/manifest.json.
Metrics per kind:
{metrics}
"""


def _spec_help() -> str:
    metrics = "\n".join(textwrap.fill(", ".join(k.metrics), 100, initial_indent=f"  {name}: ", subsequent_indent="    ")
                        for name, k in KINDS.items())
    return SPEC_HELP.format(kinds=", ".join(KINDS), metrics=metrics)


@dataclass(kw_only=True)
class RunnerOptions:
    """How a spec runs: where its results go, on how many workers or on Ray, resumed or not."""

    spec: str = option(help="sweep spec (TOML)", positional=True, metavar="SPEC")
    out: str = option(help="output folder (results/ Parquet shards + manifest.json)", required=True)
    workers: int | None = option(help="worker processes (default: the number of CPUs; 1 runs in this process)",
                                 type=a.count("workers", 1, 1024))
    ray: str | None = option(help="run on Ray: a running cluster's ADDRESS (auto, HOST:PORT, ray://HOST:PORT), or alone to start a "
                             "local one for the run (give it after SPEC, or as --ray=ADDRESS)", nargs="?", const="", metavar="ADDRESS")
    resume: bool = option(False, "continue a killed sweep in --out (runs only what is missing)", flag=True)
    force: bool = option(False, f"run more than {sw.MAX_TASKS:,} tasks", flag=True)
    check: bool = option(False, "validate the spec and every point, print the size, run nothing", flag=True)
    report: str | None = option(help="also write a report into DIR: report.html (one self-contained page) and report.md",
                                metavar="DIR")


@dataclass(kw_only=True)
class SweepConfig(RunnerOptions):
    """``draftsim sweep``: every point of a TOML spec, in a process pool or on Ray, into Parquet."""


FRONT = "front door (flags instead of a SPEC)"


@dataclass(kw_only=True)
class CapacityConfig(RunnerOptions):
    """``draftsim capacity``: per configuration, the largest request rate meeting the spec's SLOs;
    without a SPEC, the front door's flags build the spec (:mod:`draftsim.commands.frontdoor`)."""

    spec: str | None = option(help="capacity spec (TOML); or leave it out and give the front door's flags", positional=True,
                              nargs="?", metavar="SPEC")
    out: str | None = option(help="output folder (results/ Parquet shards + manifest.json; default for the front door: "
                             "runs/capacity-TARGET)")
    price: float | None = option(help="price of one device-hour (overrides price_per_hour of the spec)", type=a.positive("price"))
    load: float | None = option(help="target load in requests/s: also the fewest replicas per configuration that meet the SLOs at it "
                                "(overrides load of the spec)", type=a.positive("load"))
    figure: str | None = option(help="figure path (default: OUT/capacity.png)", metavar="OUT.png")
    target: str | None = option(help="target model (catalog name or Hugging Face id)", metavar="MODEL", group=FRONT)
    hardware: str | None = option(help="catalog hardware", metavar="HW", group=FRONT)
    tp: int = option(1, "tensor-parallel devices per replica (default 1)", type=a.count("tp", 1, 1024), group=FRONT)
    engine: str | None = option(help=f"serving engine (default: vllm on catalog GPUs): its overheads and scheduler defaults; {engine_help()}",
                                choices=tuple(ENGINES), group=FRONT, aliases=("--overheads",))
    slo: list[str] = option([], "a percentile SLO, NAME:STAT=VALUE[UNIT] (repeat): ttft:p99=2s, tpot:p90=60ms", append=True,
                            metavar="SLO", group=FRONT)
    method: list[str] = option([], f"a drafting method and its draft lengths to try (repeat), NAME[:k=K]: NAME {served_method_help()}; "
                               "K a list or range (eagle3:k=1..4, ngram:k=2,4, qwen2.5-0.5b:k=3; plain decoding is always tried)", append=True, metavar="METHOD", group=FRONT)
    alpha: float | None = option(help="acceptance rate per drafted token of every method", type=a.probability("alpha"), group=FRONT)
    acceptance: str | None = option(help="a cited acceptance entry (draftsim acceptance lists them)", metavar="NAME", group=FRONT)
    borrow: bool = option(False, "use --acceptance for a target or a method it was not measured on: a warning per difference on "
                          "stderr and in --json", flag=True, group=FRONT)
    workload: str | None = option(help="a cited workload preset (serve-sim --help lists them)", metavar="PRESET", group=FRONT)
    request_trace: str | None = option(help="a request trace (CSV/JSONL) instead of a preset", metavar="FILE", group=FRONT)
    duration: float | None = option(help="seconds of arrivals per simulation to start from, or with a unit (90, 2m; default 120; "
                                    "runs that do not settle are lengthened)", type=a.duration("duration"), group=FRONT)
    replications: int = option(3, "replications per rate: the intervals (default 3)", type=a.count("replications", 2, 100), group=FRONT)
    seed: int = option(0, "seed of the search", type=a.count("seed"), group=FRONT)

    @property
    def front_door(self) -> bool:
        """Whether the flags, not a SPEC, name the search."""
        return self.spec is None


@dataclass(kw_only=True)
class SweepPlotConfig:
    """``draftsim sweep-plot``: the mean of a sweep metric over one axis (lines) or two (heat map)."""

    folder: str = option(help="sweep output folder", positional=True, metavar="DIR")
    x: str = option(help="axis on the horizontal", required=True)
    y: str | None = option(help="second axis: heat-map rows (or lines with --lines)")
    metric: str = option(help="metric column", required=True)
    where: list[str] = option([], "keep only the points with this value of another axis (repeat); the rest are averaged", append=True,
                              metavar="AXIS=VALUE")
    lines: bool = option(False, "one line per --y value instead of a heat map", flag=True)
    out: str = option(help="figure path", required=True, metavar="OUT.png")


@dataclass
class SweepResult:
    """What ``draftsim sweep`` did: the spec's size and, unless only checked, the run's summary
    (:class:`draftsim.analysis.sweep.Summary`) and the first distinct errors of failed runs."""

    spec: sw.Spec
    summary: sw.Summary | None = None
    errors: list[str] = field(default_factory=list)
    #: runs stored in the folder, and how many of them failed (this run's and earlier ones)
    stored: int = 0
    stored_failed: int = 0
    report: dict | None = None  #: the report's paths (--report)

    @property
    def all_failed(self) -> bool:
        """Every stored run failed: the sweep produced nothing (the CLI exits 1)."""
        return self.stored > 0 and self.stored_failed == self.stored

    def to_dict(self) -> dict:
        spec = self.spec
        if self.summary is None:
            return {"kind": spec.kind, "points": spec.n_points, "replications": spec.replications, "tasks": spec.n_tasks,
                    "axes": spec.axes, "metrics": list(spec.metrics), "valid": True}
        return {**_summary_dict(self.summary, spec), "errors": self.errors, **({"report": self.report} if self.report else {})}


@dataclass
class CapacityResult:
    """What ``draftsim capacity`` did: the spec and its SLO settings and, unless only checked,
    the run's summary, the results table (one row per configuration) and the figure's path."""

    spec: sw.Spec
    settings: cap.Settings
    summary: sw.Summary | None = None
    table: object = None  #: pyarrow.Table of the results
    figure: str | None = None
    report: dict | None = None  #: the report's paths (--report)
    #: the front door's answer (draftsim.commands.frontdoor.Recommendation) and the engine configuration deploying it
    recommendation: object = None
    deployment: dict | None = None
    #: how far speedups like the recommended one's were from published ones (frontdoor.model_error)
    model_error: dict | None = None
    #: the engine and its scheduler settings the search ran on (serve kind; None where the configurations
    #: differ: then ``engines`` lists each with its deployments)
    engine: str | None = None
    scheduler: str | None = None
    engines: list = field(default_factory=list)
    #: why there is no recommendation (a serve spec without a load, or of several deployments), one line
    no_answer: str | None = None
    named: str | None = None  #: the configuration whose model error the output carries (the answer's, else the cheapest)
    #: what the front door's --acceptance entry borrowed or bracketed (stderr and --json)
    warnings: list = field(default_factory=list)
    #: each configuration's name by its point (frontdoor.point_names: "EAGLE-3 with k = 3"), where the names tell them apart
    labels: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        spec, table = self.spec, self.table
        slo_text = cap.slo_text(self.settings.slo, spec.kind)
        if self.summary is None:
            return {"kind": spec.kind, "configurations": spec.n_points, "replications": spec.replications, "axes": spec.axes,
                    "slo": self.settings.slo, "slo_text": slo_text, "load": self.settings.load, "valid": True,
                    **({"warnings": list(self.warnings)} if self.warnings else {})}
        out = _summary_dict(self.summary, spec)
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if spec.kind == "serve":  # every serve output names its engine and carries its answer, or says why it has none
            out["recommendation"] = None if self.recommendation is None else self.recommendation.sentence
            out["no_answer"] = self.no_answer
            out["deployment"] = self.deployment
            out["model_error"] = self.model_error
            out["engine"], out["scheduler"] = self.engine, self.scheduler
            if self.engines:
                out["engines"] = self.engines
        out["figure"] = self.figure
        out["slo"] = self.settings.slo
        out["slo_text"] = slo_text
        if self.report:
            out["report"] = self.report
        data = {c: table.column(c).to_pylist() for c in table.column_names}
        cross = cap.crossovers(table, spec.axes, self.settings)
        out["configurations"] = []
        for i in range(table.num_rows):
            row = {c: data[c][i] for c in table.column_names if c not in ("task", "replication", "seed", "latency_curve", "notes")}
            curve = data.get("latency_curve", [None] * table.num_rows)[i]
            row["latency_curve"] = json.loads(curve) if curve else None
            row["notes"] = json.loads(data["notes"][i]) if data.get("notes", [None] * table.num_rows)[i] else []
            found = cross.get(i)
            row["crossover_qps"] = None if found is None or found[0] is None or not math.isfinite(found[0]) else found[0]
            row["crossover"] = None if found is None else cap.crossover_text(found)
            out["configurations"].append(row)
        return out


@dataclass
class SweepPlotResult:
    """What ``draftsim sweep-plot`` drew: the figure, its axes, the fixed and averaged axes, and
    per group of axis values the metric's mean, standard error and count."""

    figure: str
    x: str
    y: str | None
    metric: str
    where: dict
    averaged_over: list[str]
    groups: dict  #: (x[, y]) → (mean, se, n)

    def to_dict(self) -> dict:
        return {"figure": self.figure, "x": self.x, "y": self.y, "metric": self.metric, "where": self.where,
                "averaged_over": self.averaged_over,
                "values": [{"key": list(k), "mean": m, "se": se, "n": n} for k, (m, se, n) in self.groups.items()]}


def register(sub, common) -> None:
    s = sub.add_parser("sweep", parents=[common], help=summary("sweep"),
                       description="Run every point of a TOML sweep spec, in a process pool or on Ray.",
                       epilog=_spec_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(s, SweepConfig)
    s.set_defaults(run=run_sweep)

    c = sub.add_parser("capacity", parents=[common], help=summary("capacity"),
                       description="How many replicas, with which speculative decoding method and draft length (or none), "
                       "serve a load within latency SLOs: the largest request rate each configuration's serving simulation "
                       "sustains within the SLOs, the fewest replicas for the load, and the engine command that deploys the "
                       "answer. Give the front door's flags (--target, --hardware, --load, --slo, --method), or a capacity SPEC.",
                       epilog=CAPACITY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(c, CapacityConfig)
    c.set_defaults(run=run_capacity)

    q = sub.add_parser("sweep-plot", parents=[common], help=summary("sweep-plot"),
                       description="Mean of a metric (over replications and any other axes) against --x, and --y as "
                       "rows of a heat map (or one line per --y value with --lines).")
    add_options(q, SweepPlotConfig)
    q.set_defaults(run=run_plot)


@contextmanager
def _bar(desc: str):
    from tqdm import tqdm

    state = {"bar": None, "done": 0}

    def update(done: int, failed: int, total: int) -> None:
        if state["bar"] is None:
            state["bar"] = tqdm(total=total, initial=done - 1, desc=desc, disable=None, leave=False, unit="run")
            state["done"] = done - 1
        bar = state["bar"]
        bar.update(done - state["done"])
        state["done"] = done
        bar.set_postfix_str(f"failed {failed}", refresh=False)

    try:
        yield update
    finally:
        if state["bar"] is not None:
            state["bar"].close()


#: The front door's flags and their defaults: any other value beside a SPEC is refused (it would be ignored)
FRONT_DEFAULTS = {"target": None, "hardware": None, "tp": 1, "engine": None, "slo": [], "method": [], "alpha": None,
                  "acceptance": None, "borrow": False, "workload": None, "request_trace": None, "duration": None,
                  "replications": 3, "seed": 0}


def _prepare(config: RunnerOptions):
    if getattr(config, "front_door", False):
        from .frontdoor import build_spec

        raw = build_spec(config)
        spec = sw.parse_spec(raw, KINDS)
        spec.raw = raw
        if config.out is None:
            config.out = os.path.join("runs", f"capacity-{config.target.replace('/', '_')}")
    else:
        if isinstance(config, CapacityConfig):  # the front door's flags build a spec: beside one, they would be ignored
            given = [f"--{f.replace('_', '-')}" for f, default in FRONT_DEFAULTS.items() if getattr(config, f) != default]
            if given:
                raise DraftsimError(f"{', '.join(given)}: give either a SPEC or the front door's flags, not both (beside SPEC "
                                    f"{config.spec!r} they would be ignored: set them in its [base] and [capacity] tables)")
        spec = sw.load_spec(config.spec, KINDS)
        if config.out is None:
            raise DraftsimError("give --out DIR (the results folder)")
    kind = KINDS[spec.kind]
    a.output_folder("--out", config.out)
    sw.Store.check(config.out, spec, config.resume)
    workers = config.workers or os.cpu_count() or 1
    if config.ray is not None:
        a.ray_address("--ray", config.ray)
        if not sw.ray_available():
            raise DraftsimError("--ray needs Ray: pip install 'draftsim[ray]' (or pip install 'ray>=2.9')")
        a.ray_reachable("--ray", config.ray.strip())
    return spec, kind, workers


def _summary_dict(summary: sw.Summary, spec: sw.Spec) -> dict:
    return {"out": str(summary.folder), "results": str(summary.folder / "results"), "points": spec.n_points,
            "replications": spec.replications, "tasks": summary.tasks, "already_done": summary.already_done, "ran": summary.ran,
            "failed": summary.failed, "seconds": summary.seconds, "backend": summary.backend, "workers": summary.workers}


def _errors(folder) -> list[str]:
    table = sw.load(folder)
    errors = [e for e, s in zip(table.column("error").to_pylist(), table.column("status").to_pylist()) if s != "ok"]
    return list(dict.fromkeys(errors))


def sweep(config: SweepConfig, progress=None) -> SweepResult:
    """Run (or with ``check``, only validate) every point of the spec into ``config.out``;
    ``progress(done, failed, total)`` is told after each run."""
    check(config)
    spec, kind, workers = _prepare(config)
    if spec.capacity:
        raise DraftsimError("this spec has a [capacity] table: run it with draftsim capacity")
    sw.check_size(spec, config.force)
    if config.check:
        sw.validate_points(spec, kind)
        return SweepResult(spec)
    folder = _report_folder(config)
    summary = sw.run_sweep(spec, kind, config.out, workers=workers, ray=config.ray is not None, ray_address=config.ray or None,
                           resume=config.resume, force=config.force, progress=progress)
    info = sw.read_manifest(config.out)
    result = SweepResult(spec, summary, _errors(config.out)[:5] if summary.failed or summary.already_done else [],
                         int(info["done"]), int(info["failed"]))
    if folder is not None:
        from .reporting import sweep_table_report

        result.report = sweep_table_report(config, result, sw.load(config.out), folder, _serve_config)
    return result


def _report_folder(config: RunnerOptions):
    """The --report folder, made before the long work (None without --report)."""
    if config.report is None:
        return None
    from draftsim.analysis.report import prepare_folder

    return prepare_folder(config.report)


def _failures(result: SweepResult) -> int:
    """Exit status 1, with one line on stderr, when every stored run failed; else 0."""
    if not result.all_failed:
        return 0
    first = result.errors[0] if result.errors else "no error recorded"
    print(f"draftsim sweep: every run failed ({result.stored_failed:,} of {result.stored:,}); first error: {first}", file=sys.stderr)
    return 1


def run_sweep(args: argparse.Namespace) -> int:
    config = from_namespace(SweepConfig, args)
    with _bar("sweep") as bar:
        result = sweep(config, bar)
    spec, summary = result.spec, result.summary
    if args.json:
        out = result.to_dict()
        if summary is not None:  # the steady-state verdict the text prints under its table (marked points in the Parquet rows)
            out["steady_state"] = steady_notes(sw.load(config.out), spec)
        a.emit_json(out)
        return _failures(result)
    if summary is None:
        print(f"{spec.kind} sweep: {spec.n_points:,} points x {spec.replications} replication(s) = {spec.n_tasks:,} runs over "
              f"{', '.join(spec.axes) or 'no axis'}; every point is valid")
        return 0
    print(f"{spec.kind} sweep: {spec.n_points:,} points x {spec.replications} replication(s) = {summary.tasks:,} runs; "
          f"ran {summary.ran:,} ({summary.already_done:,} already done), {summary.failed:,} failed, in {summary.seconds:.1f} s "
          f"on {summary.backend} with {summary.workers} worker(s)")
    for e in result.errors:
        print(f"  failed: {e}")
    table = sw.load(config.out)
    headers, rows, more = result_table(table, spec)
    if rows:
        print(format_table(headers, rows, floatfmt="g"))
    if more:
        print(f"  ... {more:,} more point(s): draftsim sweep-plot {config.out} --x AXIS --metric METRIC, or the Parquet files")
    for line in steady_notes(table, spec):
        print(line)
    print(f"results: {summary.folder / 'results'}  (pyarrow.parquet.read_table({str(summary.folder / 'results')!r}))")
    if result.report:
        print(f"report written to {result.report['html']} (and {result.report['markdown']})")
    return _failures(result)


def capacity(config: CapacityConfig, progress=None, say=None) -> CapacityResult:
    """Search (or with ``check``, only validate) the capacity of every configuration of the
    spec into ``config.out`` and draw the figure; ``progress(done, failed, total)`` as sweeps,
    ``say(line)`` each step within a configuration (a module-level function: workers call it).
    Every input is checked before anything is written (:func:`draftsim.analysis.capacity.check_search`)."""
    check(config)
    spec, kind, workers = _prepare(config)
    warnings = _acceptance_warnings(config)
    for key, value in (("price_per_hour", config.price), ("load", config.load)):
        if value is not None:
            spec.capacity = {**spec.capacity, key: value}
            spec.raw = {**spec.raw, "capacity": spec.capacity}
    settings = cap.settings(spec, kind)
    if config.front_door:
        from .frontdoor import slo_warnings

        warnings = slo_warnings(config.slo) + warnings
    else:
        warnings = cap.slo_warnings(settings.slo, spec.kind) + warnings
    sw.check_size(spec, config.force)
    labels = None
    if spec.kind == "serve":  # named as the answer names them, from the front door and from a rerun of its spec alike
        from .frontdoor import point_names

        labels = point_names(spec.points()) or None
    if config.front_door:  # a refusal names what the user typed, not "point 0"
        from .frontdoor import check_points

        points = check_points(spec, kind, {kind.rate_option: settings.start}, labels or {})
    else:
        points = sw.validate_points(spec, kind, {kind.rate_option: settings.start})
    cap.check_search(spec, kind, settings, points, labels)  # every run the search may make: before anything is written
    figure = config.figure if config.figure is not None else os.path.join(config.out, "capacity.png")
    if config.figure is not None:
        a.output_file("--figure", config.figure, suffix=".png")
    if config.check:  # the outputs checked as a run checks them, nothing made
        if config.report is not None:
            a.output_folder("--report", config.report)
        return CapacityResult(spec, settings, warnings=warnings)
    folder = _report_folder(config)
    summary, settings = cap.run_capacity(spec, kind, config.out, workers=workers, ray=config.ray is not None,
                                         ray_address=config.ray or None, resume=config.resume, force=config.force, progress=progress,
                                         say=say, labels=labels)
    table = sw.load(config.out)
    cap.figure(figure, table, spec.axes, settings, spec.kind, labels)
    result = CapacityResult(spec, settings, summary, table, figure, warnings=warnings, labels=labels or {})
    if spec.kind == "serve":
        _answer(result, points)
    if config.front_door:
        from draftsim.sim.files import atomic_write_text

        from .frontdoor import toml_text

        atomic_write_text(os.path.join(config.out, "spec.toml"), toml_text(result.spec.raw))
    if folder is not None:
        from .reporting import capacity_report

        result.report = capacity_report(config, result, folder, _serve_config)
    return result


def _acceptance_warnings(config: CapacityConfig) -> list[str]:
    """The front door's --acceptance entry checked against the target and every --method before
    the search (a refusal names both sides; --borrow turns it into these lines)."""
    if not getattr(config, "front_door", False) or config.acceptance is None:
        return []
    from draftsim.sim.acceptance_catalog import acceptance_entry, check_use

    from .frontdoor import parse_method
    from .simulation import drafter_method

    entry = acceptance_entry(config.acceptance)
    lines: list[str] = []
    for m in config.method or [None]:
        method = None if m is None else drafter_method(argparse.Namespace(drafter_model=[parse_method(m).drafter]))
        lines += [w for w in check_use(entry, config.target, method, borrow=config.borrow) if w not in lines]
    if any(w.startswith("acceptance borrowed") for w in lines):  # one method borrowed: "borrowed nothing" was another's
        lines = [w for w in lines if not w.startswith("--borrow borrowed nothing")]
    return lines


def _serve_config(options: dict):
    """A serve-kind point's (ServeSimConfig, ServingConfig, Assembly), for the reports'
    assumptions: the assembly the serving configuration was built from, assembled once."""
    from draftsim.sweepkinds import COMMANDS

    from .servesim import serving_setup

    config = COMMANDS["serve"].config(options)
    return (config, *serving_setup(config))


def _answer(result: CapacityResult, points) -> None:
    """The answer of a serve spec, the same from the front door's flags and from its spec.toml
    (:func:`draftsim.commands.frontdoor.answer`): the engine and its scheduler, the recommendation
    at the load, the engine configuration deploying it and its model error; else why none."""
    from .frontdoor import answer

    found = answer(result.spec, points, result.table, result.settings.load)
    result.engine, result.scheduler, result.engines = found.engine, found.scheduler, found.engines
    result.recommendation, result.deployment, result.model_error = found.recommendation, found.deployment, found.model_error
    result.no_answer, result.named = found.missing, found.named


def run_capacity(args: argparse.Namespace) -> int:
    from ..progress import line

    config = from_namespace(CapacityConfig, args)

    def progress(done: int, failed: int, total: int) -> None:
        line(f"capacity: {done} of {total} configuration(s) searched" + (f" ({failed} failed)" if failed else ""))

    result = capacity(config, progress, say=line)
    from .simulation import report_warnings

    report_warnings(result.warnings)
    spec, settings, summary = result.spec, result.settings, result.summary
    if args.json:
        a.emit_json(result.to_dict())
        return _all_failed(result)
    slo = cap.slo_text(settings.slo, spec.kind)  # each latency bound with its unit
    at = f" at {settings.load:g} req/s" if settings.load is not None else ""
    if summary is None:
        print(f"{spec.kind} capacity search: {spec.n_points:,} configuration(s) over {', '.join(spec.axes) or 'no axis'}, "
              f"{spec.replications} replication(s) per rate; SLOs {slo}{at}; every configuration is valid")
        return 0
    if spec.kind == "serve":
        print("\n".join(_answer_lines(result)))
        print("")
    headers, rows = cap.table_rows(result.table, spec.axes, settings)
    print(f"capacity ({slo}; mean over {spec.replications} replication(s), tolerance {settings.tolerance:.0%}):")
    print(format_table(headers, rows))
    notes = cap.lengthening_notes(result.table, spec.axes, result.labels)
    if notes:
        print("steady state (runs that had not settled are rerun longer; overloaded rates fail):")
        print("\n".join(f"  {n}" for n in notes))
    if settings.load is not None and result.recommendation is None:  # the answer, where there is one, says it (and breaks ties
        best = cap.fewest_devices(result.table, spec.axes, result.labels)  # towards plain decoding, which this line does not)
        if best is not None:
            print(f"fewest devices for {settings.load:g} requests/s: {best}")
    cheapest = cap.cheapest(result.table, spec.axes, result.labels)
    if cheapest is not None:
        print(f"cheapest per output token at capacity: {cheapest}")
    if result.deployment is not None:
        print("")
        print(f"deploy ({result.deployment['engine']}, {result.deployment['replicas']} replica(s) behind a round-robin router):")
        print(f"  {result.deployment['command']}")
    print(f"{summary.ran} configuration(s) searched ({summary.already_done} already done, {summary.failed} failed) in "
          f"{summary.seconds:.1f} s; results in {summary.folder / 'results'}; figure {result.figure}")
    if config.front_door:
        print(f"the search's spec: {os.path.join(config.out, 'spec.toml')} (draftsim capacity SPEC --out DIR reruns it)")
    if result.report:
        print(f"report written to {result.report['html']} (and {result.report['markdown']})")
    return _all_failed(result)


def _answer_lines(result: CapacityResult) -> list[str]:
    """What a serve search prints before its table, the same from the front door and from its
    spec: the answer (or why there is none), the engine and its scheduler settings with the SLOs,
    and the model error of the configuration named."""
    from draftsim.sim.evidence import model_error_lines

    spec, settings, rec = result.spec, result.settings, result.recommendation
    slo = cap.slo_text(settings.slo, spec.kind)
    at = f" at {settings.load:g} req/s" if settings.load is not None else ""
    lines = [f"answer: {rec.sentence}" if rec is not None else f"no answer: {result.no_answer}"]
    tail = f"SLOs {slo}{at}, steady state, {spec.replications} replications per rate"
    if result.engine is not None:
        lines.append(f"  on {result.engine} ({result.scheduler}); {tail}")
    else:
        lines += [f"  on {e['engine']} ({e['scheduler']}) for {', '.join(e['deployments'])}" for e in result.engines]
        lines.append(f"  {tail}")
    error, named = result.model_error, result.named
    which = "" if rec is not None else f" of {named}, the cheapest per output token"  # the configuration named instead of an answer
    if error is not None:
        shown = model_error_lines(error)
        shown[0] = shown[0].replace("model error:", f"model error{which}:", 1)
        lines += [f"  {line}" for line in shown]
    elif named == "plain decoding":
        lines.append(f"  model error{which}: none to carry: the published runs measure speculation's speedups over plain "
                     "decoding")
    elif named is not None:
        lines.append(f"  model error{which}: none to carry: no published runs like it to compare with (they are GPUs' speculation)")
    return lines


def _all_failed(result: CapacityResult) -> int:
    """Exit status 1, with one line on stderr, when every configuration's search failed; else 0."""
    if result.table is None:
        return 0
    status = result.table.column("status").to_pylist()
    if not status or any(st == "ok" for st in status):
        return 0
    errors = [e for e in result.table.column("error").to_pylist() if e]
    print(f"draftsim capacity: every configuration's search failed ({len(status)}); first error: "
          f"{errors[0] if errors else 'no error recorded'}", file=sys.stderr)
    return 1


#: Points a sweep's result table prints (the Parquet files hold them all).
TABLE_ROWS = 40


def result_table(table, spec: sw.Spec, limit: int = TABLE_ROWS) -> tuple[list[str], list[list], int]:
    """A sweep's results as printed: one row per point (its axis values, sorted), each metric's
    mean over the replications that succeeded (± its standard error with two or more), the
    runs behind it; at most ``limit`` rows, and how many more points there are."""
    axes = [x for x in spec.axes if x in table.column_names]
    metrics = [m for m in spec.metrics if m in table.column_names]
    stats = {m: sw.aggregate(table, axes, m) for m in metrics}
    points = list(stats[metrics[0]]) if metrics else []
    points.sort(key=lambda key: tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in key))

    def cell(mean: float, se: float) -> str:
        if not math.isfinite(mean):
            return "-"
        return f"{mean:.4g}" + (f" ± {se:.2g}" if math.isfinite(se) and se > 0 else "")

    marks = steady_marks(table, spec)
    if marks is not None:  # the flags said in words in their own column, not as shares
        metrics = [m for m in metrics if m not in STEADY_FLAGS]
    rows = [[*key, *(cell(*stats[m][key][:2]) for m in metrics), stats[next(iter(stats))][key][2]] + ([marks.get(key, "")] if marks else [])
            for key in points[:limit]]
    runs = ["runs"] if stats else []
    return [*axes, *metrics, *runs] + (["steady state"] if marks else []), rows, max(len(points) - limit, 0)


#: A serve sweep's metrics that say whether its runs reached a steady state (draftsim.sim.serving.steady).
STEADY_FLAGS = ("steady", "overloaded")


def steady_marks(table, spec: sw.Spec) -> dict | None:
    """Each point's steady state in words, as serve-sim --sweep-qps marks its rows: '' when every
    run of the point settled, else 'overloaded' (its waiting queue grows: no SLO holds at that
    load) or 'not steady' (run longer), with 'k of n runs' when only some; None when the sweep
    did not record ``steady`` (a point whose runs all failed: '')."""
    if "steady" not in table.column_names:
        return None
    axes = [x for x in spec.axes if x in table.column_names]
    steady = sw.aggregate(table, axes, "steady")
    over = sw.aggregate(table, axes, "overloaded") if "overloaded" in table.column_names else {}
    marks = {}
    for key, (share, _, n) in steady.items():
        bad = round((1 - share) * n) if n else 0
        n_over = min(round(over.get(key, (0.0,))[0] * n), bad) if n else 0  # an overloaded run has not settled either
        parts = [(word, k) for word, k in (("overloaded", n_over), ("not steady", bad - n_over)) if k]
        marks[key] = ", ".join(word + (f" ({k} of {n} runs)" if k < n else "") for word, k in parts)
    return marks


def steady_notes(table, spec: sw.Spec) -> list[str]:
    """What the sweep's printout says under its table about the steady state: how many points did
    not reach it (marked in the table), or, for a serve sweep that did not record ``steady``, that
    nothing was checked."""
    marks = steady_marks(table, spec)
    if marks is None:
        if spec.kind != "serve":
            return []
        return ['note: steady state not checked: add "steady" and "overloaded" to the spec\'s metrics to mark the runs that did not '
                "reach it (an overloaded server's queue grows; a run too short has not settled)"]
    marked = [m for m in marks.values() if m]
    if not marked:
        return []
    over = sum(m.startswith("overloaded") for m in marked)
    why = ([f"{over} overloaded (the waiting queue grows: no SLO holds at that load)"] if over else []) + \
        ([f"{len(marked) - over} not settled (run longer: a longer duration or more requests)"] if len(marked) > over else [])
    return [f"WARNING: {len(marked)} of {len(marks)} points not at steady state (marked in the table; their rates and latencies are "
            f"not a steady server's): {', '.join(why)}"]


def sweep_plot(config: SweepPlotConfig) -> SweepPlotResult:
    """The mean of a metric of a stored sweep against ``x`` (and ``y``), the other axes fixed by
    ``where`` or averaged; drawn as lines or a heat map into ``config.out``."""
    check(config)
    a.output_file("--out", config.out, suffix=".png")
    info = sw.read_manifest(config.folder)
    table = sw.load(config.folder)
    columns = table.column_names
    for flag, name in (("--x", config.x), ("--y", config.y)):
        if name is not None and name not in info["axes"]:
            raise DraftsimError(f"{flag} {name!r} is not an axis of the sweep; axes: {', '.join(info['axes']) or 'none'}")
    if config.metric not in columns or config.metric in sw.LEAD_COLUMNS + sw.STATUS_COLUMNS or config.metric in info["axes"]:
        valid = [c for c in columns if c not in sw.LEAD_COLUMNS + sw.STATUS_COLUMNS and c not in info["axes"]]
        raise DraftsimError(f"--metric {config.metric!r} is not a metric of the sweep; metrics: {', '.join(valid)}")
    if config.y is not None and config.y == config.x:
        raise DraftsimError(f"--x and --y name the same axis {config.x!r}; give two different axes")
    if config.lines and config.y is None:
        raise DraftsimError("--lines draws one line per --y value: give --y")
    by = [config.x] + ([config.y] if config.y else [])
    fixed = {}
    for text in config.where:
        name, sep, value = text.partition("=")
        if not sep or name not in info["axes"] or name in by:
            raise DraftsimError(f"--where {text!r}: give AXIS=VALUE for an axis other than --x/--y; axes: {', '.join(info['axes'])}")
        fixed[name] = value
        keep = [_same(v, value) for v in table.column(name).to_pylist()]
        if not any(keep):
            values = ", ".join(sorted({str(v) for v in table.column(name).to_pylist()}))
            raise DraftsimError(f"--where {text!r}: no point has {name} = {value}; its values: {values}")
        table = table.filter(keep)
    groups = sw.aggregate(table, by, config.metric)
    if not any(math.isfinite(g[0]) for g in groups.values()):
        failed = sum(1 for v in table.column("status").to_pylist() if v != "ok")
        raise DraftsimError(f"--metric {config.metric!r} has no finite value in {str(config.folder)!r} ({failed} of {table.num_rows} "
                            "run(s) failed): nothing to plot; draftsim sweep prints their errors")
    from draftsim.analysis.sweepplot import heatmap, lines

    zips = info.get("spec", {}).get("zip", [])
    zips = [zips] if isinstance(zips, dict) else zips
    chosen = set(by) | set(fixed)
    tied = {sw.option_name(k) for g in zips if any(sw.option_name(k) in chosen for k in g) for k in g}  # zipped with those
    averaged = [x for x in info["axes"] if x not in by and x not in fixed and x not in tied]
    if config.y is not None and not config.lines:
        heatmap(config.out, groups, config.x, config.y, config.metric, averaged, fixed)
    else:
        lines(config.out, groups, config.x, config.y, config.metric, averaged, fixed)
    return SweepPlotResult(config.out, config.x, config.y, config.metric, fixed, averaged, groups)


def run_plot(args: argparse.Namespace) -> int:
    result = sweep_plot(from_namespace(SweepPlotConfig, args))
    if args.json:
        a.emit_json(result.to_dict())
        return 0
    by = [result.x] + ([result.y] if result.y else [])
    where = "".join(f", {k} = {v}" for k, v in result.where.items())
    averaged = result.averaged_over
    print(f"{result.metric} against {result.x}{' and ' + result.y if result.y else ''}{where} "
          f"(mean over replications{', ' + ', '.join(averaged) if averaged else ''}): {result.figure}")
    shown = sorted(result.groups.items(), key=lambda kv: tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))
                                                                for v in kv[0]))[:40]
    print(format_table([*by, result.metric, "SE", "runs"], [[*k, m, se if math.isfinite(se) else "-", n] for k, (m, se, n) in shown]))
    return 0


def _same(value, text: str) -> bool:
    """Whether a stored axis value equals the text of ``--where`` (numbers compared as numbers)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return str(value).lower() == text.lower() if isinstance(value, bool) else str(value) == text
