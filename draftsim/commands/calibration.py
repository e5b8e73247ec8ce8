"""``draftsim calibrate``: fit a hardware entry to the user's own measured step times.

The efficiency factors (mfu, mbu) and the per-call overhead of a catalog hardware entry are fitted
to measured forward calls of one model (:mod:`draftsim.sim.cost.calibrate`): a ``draftsim profile``
file, a table of step times (CSV or JSON rows of batch, new_tokens, context, seconds) or plain
``vllm bench serve --save-result --save-detailed`` runs. The fitted entry is written as a catalog
file that every command reads with ``--catalog FILE --hardware NAME``.
"""

from __future__ import annotations

import argparse
import csv
import io
from dataclasses import dataclass, field

from draftsim.analysis.table import format_table
from draftsim.sim.cost import default_catalog
from draftsim.sim.cost.calibrate import Calibration, calibrate, points_from_profile, points_from_table, points_from_vllm
from draftsim.sim.cost.catalog import DTYPE_BYTES, model_from_hf_config, write_catalog
from draftsim.sim.cost.profile import load_profile
from draftsim.sim.errors import DraftsimError
from draftsim.sim.files import parse_json, read_text
from draftsim.sim.vllm_bench import read_vllm_bench

from .. import args as a
from ..config import add_options, check, from_namespace, option
from .table import summary


@dataclass(kw_only=True)
class CalibrateConfig:
    """``draftsim calibrate``: a hardware entry's mfu, mbu and per-call overhead fitted to measured calls."""

    target: str = option(help="the model the measurements ran: a catalog name or a config.json path", required=True, metavar="MODEL")
    hardware: str = option(help="the catalog hardware entry to start from (its peaks, memory and interconnect are kept)",
                           required=True, metavar="HW")
    tp: int = option(1, "tensor-parallel devices of the measured runs (default 1)", type=a.count("tp", 1, 1024))
    dtype: str = option("bfloat16", "dtype of the measured runs (default bfloat16)", choices=tuple(DTYPE_BYTES))
    profile: str | None = option(help="a draftsim profile file of the target", metavar="FILE")
    step_table: str | None = option(help="measured calls: CSV or JSON rows of batch, new_tokens, context, seconds", metavar="FILE")
    vllm_result: list[str] = option([], "a plain vllm bench serve --save-result --save-detailed file (repeat: runs at several rates)",
                                    append=True, metavar="FILE")
    catalog: list[str] = option([], "extra model or hardware catalog file (repeat)", append=True, metavar="FILE")
    holdout: float = option(0.25, "share of the points kept out of the fit and scored (default 0.25: every 4th)",
                            type=a.probability("holdout"))
    name: str | None = option(help="name of the fitted entry (default: HW-calibrated)", metavar="NAME")
    out: str = option(help="catalog file to write the fitted entry to", required=True, metavar="CATALOG.json")


@dataclass
class CalibrateResult:
    """The fit (:class:`draftsim.sim.cost.calibrate.Calibration`) and the catalog file written."""

    calibration: Calibration
    out: str
    sources: list[str] = field(default_factory=list)
    #: what the fit priced: the target, its dtype and tp, and the engine (none: the roofline alone,
    #: its fitted overhead holding the measured engine's costs)
    target: str = ""
    dtype: str = ""
    tp: int = 1

    def to_dict(self) -> dict:
        return {**self.calibration.to_dict(), "target": self.target, "dtype": self.dtype, "tp": self.tp, "engine": "none",
                "catalog": self.out, "sources": self.sources}


def _table(path: str):
    text = read_text(path, "step table", fifo=False)
    if path.lower().endswith(".json"):
        rows = parse_json(text, f"step table {path}", max_depth=4)  # bounded nesting, one line for any invalid JSON
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise DraftsimError(f"step table {path}: a JSON step table is a list of objects")
    else:
        rows = list(csv.DictReader(io.StringIO(text)))
    return points_from_table(rows, f"step table {path}")


def calibrate_hardware(config: CalibrateConfig) -> CalibrateResult:
    """Fit ``config.hardware`` to the measurements ``config`` names and write the catalog file."""
    check(config)
    given = [n for n, v in (("--profile", config.profile), ("--step-table", config.step_table), ("--vllm-result", config.vllm_result)) if v]
    if len(given) != 1:
        raise DraftsimError("give the measurements as exactly one of --profile, --step-table or --vllm-result"
                            + (f"; got {', '.join(given)}" if given else ""))
    a.output_file("--out", config.out, ".json")
    cat = default_catalog(list(config.catalog))
    hw = cat.hardware_spec(config.hardware)
    model = model_from_hf_config(config.target) if config.target.endswith(".json") else cat.model(config.target)
    if config.profile:
        points = points_from_profile(load_profile(config.profile))
    elif config.step_table:
        points = _table(config.step_table)
    else:
        points = points_from_vllm([read_vllm_bench(p) for p in config.vllm_result])
    fit = calibrate(model, hw, points, dtype=config.dtype, tp=config.tp, holdout=config.holdout, name=config.name)
    write_catalog(config.out, hardware={fit.hardware.name: fit.hardware})
    return CalibrateResult(fit, config.out, [config.profile or config.step_table or ", ".join(config.vllm_result)], config.target,
                           config.dtype, config.tp)


def register(sub, common) -> None:
    p = sub.add_parser("calibrate", parents=[common], help=summary("calibrate"),
                       description="Fit a catalog hardware entry's MFU, MBU and per-call overhead to measured forward calls of one "
                       "model (a draftsim profile, a step-time table, or plain vllm bench serve runs saved with --save-detailed), "
                       "report the fit's error on the points used and on held-out points beside the catalog defaults', and "
                       "write the fitted entry to a catalog file (use it with --catalog FILE --hardware NAME).")
    add_options(p, CalibrateConfig)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    result = calibrate_hardware(from_namespace(CalibrateConfig, args))
    if args.json:
        a.emit_json(result.to_dict())
        return 0
    c = result.calibration
    print(f"{c.hardware.name}: mfu {c.mfu:.3g}, mbu {c.mbu:.3g}, overhead {c.overhead * 1e6:.1f} us per call "
          f"(fitted to {c.fitted} calls, {c.held_out} held out; the roofline of {result.target} ({result.dtype}"
          + (f", tp {result.tp}" if result.tp > 1 else "") + "), engine none: the fitted overhead holds the measured engine's costs)")
    pct = lambda e: "-" if e["median_abs"] is None else f"{e['median_abs']:.1%} / {e['worst_abs']:.1%}"  # noqa: E731
    e = c.errors
    print(format_table(["relative error (median / worst)", "fitted points", "held-out points"],
                       [["catalog defaults", pct(e["default_fit"]), pct(e["default_held_out"])],
                        ["calibrated", pct(e["fit"]), pct(e["held_out"])]]))
    print(f"catalog written to {result.out}: use --catalog {result.out} --hardware {c.hardware.name}")
    return 0
