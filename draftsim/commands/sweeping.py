"""``draftsim sweep``, ``draftsim sweep-plot`` and ``draftsim capacity``: many simulations from
one TOML spec, in a local process pool or on Ray, stored as Parquet."""

from __future__ import annotations

import argparse
import math
import os
import textwrap
from contextlib import contextmanager

from draftsim.analysis import capacity as cap
from draftsim.analysis import sweep as sw
from draftsim.analysis.table import format_table
from draftsim.sim.errors import DraftsimError

from .. import args as a
from ..sweepkinds import KINDS

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

Results: OUT/results/*.parquet (pandas.read_parquet(OUT + "/results")) and OUT/manifest.json.
Metrics per kind:
{metrics}
"""


def _spec_help() -> str:
    metrics = "\n".join(textwrap.fill(", ".join(k.metrics), 100, initial_indent=f"  {name}: ", subsequent_indent="    ")
                        for name, k in KINDS.items())
    return SPEC_HELP.format(kinds=", ".join(KINDS), metrics=metrics)


def _runner_options(p) -> None:
    p.add_argument("spec", metavar="SPEC", help="sweep spec (TOML)")
    p.add_argument("--out", required=True, help="output folder (results/ Parquet shards + manifest.json)")
    p.add_argument("--workers", type=a.count("workers", 1, 1024), default=None,
                   help="worker processes (default: the number of CPUs; 1 runs in this process)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray: a running cluster's ADDRESS (auto, HOST:PORT, ray://HOST:PORT), or alone to start a "
                   "local one for the run (give it after SPEC, or as --ray=ADDRESS)")
    p.add_argument("--resume", action="store_true", help="continue a killed sweep in --out (runs only what is missing)")
    p.add_argument("--force", action="store_true", help=f"run more than {sw.MAX_TASKS:,} tasks")
    p.add_argument("--check", action="store_true", help="validate the spec and every point, print the size, run nothing")


def register(sub, common) -> None:
    s = sub.add_parser("sweep", parents=[common], help="run a sweep spec (many simulations) into Parquet",
                       description="Run every point of a TOML sweep spec, in a process pool or on Ray.",
                       epilog=_spec_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _runner_options(s)
    s.set_defaults(run=run_sweep)

    c = sub.add_parser("capacity", parents=[common], help="largest request rate meeting SLOs, per configuration",
                       description="For each configuration of a spec, bracket and bisect the largest request rate whose "
                       "simulation meets the [capacity] SLOs (mean over replications); a table and a figure.",
                       epilog=cap.__doc__.split("::", 1)[1].split("Each configuration")[0] if cap.__doc__ else None,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _runner_options(c)
    c.add_argument("--price", type=a.positive("price"), help="price of one device-hour (overrides price_per_hour of the spec)")
    c.add_argument("--figure", metavar="OUT.png", help="figure path (default: OUT/capacity.png)")
    c.set_defaults(run=run_capacity)

    q = sub.add_parser("sweep-plot", parents=[common], help="heat map or lines of a sweep metric over one or two axes",
                       description="Mean of a metric (over replications and any other axes) against --x, and --y as "
                       "rows of a heat map (or one line per --y value with --lines).")
    q.add_argument("folder", metavar="DIR", help="sweep output folder")
    q.add_argument("--x", required=True, help="axis on the horizontal")
    q.add_argument("--y", help="second axis: heat-map rows (or lines with --lines)")
    q.add_argument("--metric", required=True, help="metric column")
    q.add_argument("--where", action="append", default=[], metavar="AXIS=VALUE",
                   help="keep only the points with this value of another axis (repeat); the rest are averaged")
    q.add_argument("--lines", action="store_true", help="one line per --y value instead of a heat map")
    q.add_argument("--out", required=True, metavar="OUT.png", help="figure path")
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


def _prepare(args, capacity: bool):
    spec = sw.load_spec(args.spec, KINDS)
    kind = KINDS[spec.kind]
    a.output_folder("--out", args.out)
    sw.Store.check(args.out, spec, args.resume)
    workers = args.workers or os.cpu_count() or 1
    if args.ray is not None and not sw.ray_available():
        raise DraftsimError("--ray needs Ray: pip install 'draftsim[ray]' (or pip install 'ray>=2.9')")
    return spec, kind, workers


def _summary_dict(summary: sw.Summary, spec: sw.Spec) -> dict:
    return {"out": str(summary.folder), "results": str(summary.folder / "results"), "points": spec.n_points,
            "replications": spec.replications, "tasks": summary.tasks, "already_done": summary.already_done, "ran": summary.ran,
            "failed": summary.failed, "seconds": summary.seconds, "backend": summary.backend, "workers": summary.workers}


def _errors(folder) -> list[str]:
    table = sw.load(folder)
    errors = [e for e, s in zip(table.column("error").to_pylist(), table.column("status").to_pylist()) if s != "ok"]
    return list(dict.fromkeys(errors))


def run_sweep(args: argparse.Namespace) -> int:
    spec, kind, workers = _prepare(args, capacity=False)
    if spec.capacity:
        raise DraftsimError("this spec has a [capacity] table: run it with draftsim capacity")
    sw.check_size(spec, args.force)
    if args.check:
        sw.validate_points(spec, kind)
        out = {"kind": spec.kind, "points": spec.n_points, "replications": spec.replications, "tasks": spec.n_tasks,
               "axes": spec.axes, "metrics": list(spec.metrics), "valid": True}
        if args.json:
            a.emit_json(out)
        else:
            print(f"{spec.kind} sweep: {spec.n_points:,} points x {spec.replications} replication(s) = {spec.n_tasks:,} runs over "
                  f"{', '.join(spec.axes) or 'no axis'}; every point is valid")
        return 0
    with _bar("sweep") as bar:
        summary = sw.run_sweep(spec, kind, args.out, workers=workers, ray=args.ray is not None, ray_address=args.ray or None,
                               resume=args.resume, force=args.force, progress=bar)
    out = _summary_dict(summary, spec)
    out["errors"] = _errors(args.out)[:5] if summary.failed or summary.already_done else []
    if args.json:
        a.emit_json(out)
        return 0
    print(f"{spec.kind} sweep: {spec.n_points:,} points x {spec.replications} replication(s) = {summary.tasks:,} runs; "
          f"ran {summary.ran:,} ({summary.already_done:,} already done), {summary.failed:,} failed, in {summary.seconds:.1f} s "
          f"on {summary.backend} with {workers} worker(s)")
    for e in out["errors"]:
        print(f"  failed: {e}")
    print(f"results: {summary.folder / 'results'}  (pandas.read_parquet({str(summary.folder / 'results')!r}))")
    return 0


def run_capacity(args: argparse.Namespace) -> int:
    spec, kind, workers = _prepare(args, capacity=True)
    if args.price is not None:
        spec.capacity = {**spec.capacity, "price_per_hour": args.price}
        spec.raw = {**spec.raw, "capacity": spec.capacity}
    settings = cap.settings(spec, kind)
    if args.check:
        sw.check_size(spec, args.force)
        sw.validate_points(spec, kind, {kind.rate_option: settings.start})
        out = {"kind": spec.kind, "configurations": spec.n_points, "replications": spec.replications, "axes": spec.axes,
               "slo": settings.slo, "valid": True}
        if args.json:
            a.emit_json(out)
        else:
            print(f"{spec.kind} capacity search: {spec.n_points:,} configuration(s) over {', '.join(spec.axes) or 'no axis'}, "
                  f"{spec.replications} replication(s) per rate; every configuration is valid")
        return 0
    figure = args.figure if args.figure is not None else os.path.join(args.out, "capacity.png")
    if args.figure is not None:
        a.output_file("--figure", args.figure, suffix=".png")
    with _bar("capacity") as bar:
        summary, settings = cap.run_capacity(spec, kind, args.out, workers=workers, ray=args.ray is not None,
                                             ray_address=args.ray or None, resume=args.resume, force=args.force, progress=bar)
    table = sw.load(args.out)
    headers, rows = cap.table_rows(table, spec.axes, settings)
    cap.figure(figure, table, spec.axes, settings)
    if args.json:
        out = _summary_dict(summary, spec)
        out["figure"] = figure
        out["slo"] = settings.slo
        data = {c: table.column(c).to_pylist() for c in table.column_names}
        out["configurations"] = [{c: data[c][i] for c in table.column_names if c not in ("task", "replication", "seed")}
                                 for i in range(table.num_rows)]
        a.emit_json(out)
        return 0
    slo = ", ".join(f"{m} <= {b:g}" for m, b in settings.slo.items())
    print(f"capacity ({slo}; mean over {spec.replications} replication(s), tolerance {settings.tolerance:.0%}):")
    print(format_table(headers, rows))
    print(f"{summary.ran} configuration(s) searched ({summary.already_done} already done, {summary.failed} failed) in "
          f"{summary.seconds:.1f} s; results in {summary.folder / 'results'}; figure {figure}")
    return 0


def run_plot(args: argparse.Namespace) -> int:
    a.output_file("--out", args.out, suffix=".png")
    info = sw.read_manifest(args.folder)
    table = sw.load(args.folder)
    columns = table.column_names
    for option, name in (("--x", args.x), ("--y", args.y)):
        if name is not None and name not in info["axes"]:
            raise DraftsimError(f"{option} {name!r} is not an axis of the sweep; axes: {', '.join(info['axes']) or 'none'}")
    if args.metric not in columns or args.metric in sw.LEAD_COLUMNS + sw.STATUS_COLUMNS or args.metric in info["axes"]:
        valid = [c for c in columns if c not in sw.LEAD_COLUMNS + sw.STATUS_COLUMNS and c not in info["axes"]]
        raise DraftsimError(f"--metric {args.metric!r} is not a metric of the sweep; metrics: {', '.join(valid)}")
    if args.y is not None and args.y == args.x:
        raise DraftsimError(f"--x and --y name the same axis {args.x!r}; give two different axes")
    if args.lines and args.y is None:
        raise DraftsimError("--lines draws one line per --y value: give --y")
    by = [args.x] + ([args.y] if args.y else [])
    fixed = {}
    for text in args.where:
        name, sep, value = text.partition("=")
        if not sep or name not in info["axes"] or name in by:
            raise DraftsimError(f"--where {text!r}: give AXIS=VALUE for an axis other than --x/--y; axes: {', '.join(info['axes'])}")
        fixed[name] = value
        keep = [_same(v, value) for v in table.column(name).to_pylist()]
        if not any(keep):
            values = ", ".join(sorted({str(v) for v in table.column(name).to_pylist()}))
            raise DraftsimError(f"--where {text!r}: no point has {name} = {value}; its values: {values}")
        table = table.filter(keep)
    groups = sw.aggregate(table, by, args.metric)
    from draftsim.analysis.sweepplot import heatmap, lines

    zips = info.get("spec", {}).get("zip", [])
    zips = [zips] if isinstance(zips, dict) else zips
    chosen = set(by) | set(fixed)
    tied = {sw.option_name(k) for g in zips if any(sw.option_name(k) in chosen for k in g) for k in g}  # zipped with those
    averaged = [x for x in info["axes"] if x not in by and x not in fixed and x not in tied]
    if args.y is not None and not args.lines:
        heatmap(args.out, groups, args.x, args.y, args.metric, averaged, fixed)
    else:
        lines(args.out, groups, args.x, args.y, args.metric, averaged, fixed)
    if args.json:
        a.emit_json({"figure": args.out, "x": args.x, "y": args.y, "metric": args.metric, "where": fixed, "averaged_over": averaged,
                     "values": [{"key": list(k), "mean": m, "se": se, "n": n} for k, (m, se, n) in groups.items()]})
        return 0
    where = "".join(f", {k} = {v}" for k, v in fixed.items())
    print(f"{args.metric} against {args.x}{' and ' + args.y if args.y else ''}{where} "
          f"(mean over replications{', ' + ', '.join(averaged) if averaged else ''}): {args.out}")
    shown = sorted(groups.items(), key=lambda kv: tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in kv[0]))[:40]
    print(format_table([*by, args.metric, "SE", "runs"], [[*k, m, se if math.isfinite(se) else "-", n] for k, (m, se, n) in shown]))
    return 0


def _same(value, text: str) -> bool:
    """Whether a stored axis value equals the text of ``--where`` (numbers compared as numbers)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return str(value).lower() == text.lower() if isinstance(value, bool) else str(value) == text
