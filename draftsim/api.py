"""draftsim's library API: one configuration, one function and one result per command.

Every command of the ``draftsim`` CLI listed here is a typed configuration (a dataclass whose
fields carry help text and valid ranges, :mod:`draftsim.config`), a function taking it and a
typed result (``.to_dict()`` is what ``--json`` prints). The CLI's parsers are generated from
the configurations, and sweeps build them from a spec's points (:mod:`draftsim.sweepkinds`)::

    from draftsim.api import SimulateConfig, simulate

    result = simulate(SimulateConfig(policy="fixed:k=4", alpha=0.8, cost=[0.05], tokens=100_000))
    result.metrics.ewif.value, result.analytic_ewif

The real-model commands return typed results too: ``serve`` a :class:`ServeResult` (its metrics
the serving simulator's :class:`ServeSummary` of the run), ``check_serve`` a
:class:`CheckServeResult` (one :class:`CheckRow` per metric), ``run_method`` a :class:`RunResult`
(a :class:`draftsim.realrun.compare.Measurement`), ``profile`` a :class:`ProfileResult` (a
:class:`draftsim.sim.cost.ProfileCost`), ``train_head`` a :class:`TrainHeadResult` and ``demo`` a
:class:`DemoResult`; everything but the model is checked before a model loads.

Invalid values raise :class:`draftsim.sim.errors.DraftsimError` naming the option and its
valid range, as on the command line. A target and its drafters on catalog hardware come from
:func:`draftsim.sim.cost.assemble` (a :class:`~draftsim.sim.cost.Deployment`).
"""

from .commands.calibration import CalibrateConfig, CalibrateResult, calibrate_hardware
from .commands.costing import CostConfig, CostResult, HardwareOptions, PricedOptions, ProfileConfig, ProfileResult, cost, profile
from .commands.demo import DemoConfig, DemoResult, demo
from .commands.heads import TrainHeadConfig, TrainHeadResult
from .commands.heads import train as train_head
from .commands.optimization import (
    KMatrixConfig,
    KMatrixReport,
    ThresholdConfig,
    ThresholdReport,
    TreeConfig,
    TreeReport,
    optimize_kmatrix,
    optimize_threshold,
    optimize_tree,
)
from .commands.planning import EwifConfig, EwifResult, PlanConfig, PlanResult, ewif, plan
from .commands.running import RunConfig, RunResult, run_method
from .commands.serve import CheckRow, CheckServeConfig, CheckServeResult, ServeConfig, ServeResult, check_serve, serve
from .commands.servesim import ServeSimConfig, ServeSimOutputs, ServeSimResult, ServeSummary, serve_sim, serving_config
from .commands.simulation import AcceptanceOptions, SimulateConfig, SimulateResult, simulate
from .commands.sweeping import (
    CapacityConfig,
    CapacityResult,
    SweepConfig,
    SweepPlotConfig,
    SweepPlotResult,
    SweepResult,
    capacity,
    sweep,
    sweep_plot,
)
from .commands.traces import ReplayConfig, ReplayResult, replay
from .config import check

__all__ = [
    "HardwareOptions", "PricedOptions", "AcceptanceOptions", "check",
    "CostConfig", "CostResult", "cost", "CalibrateConfig", "CalibrateResult", "calibrate_hardware",
    "EwifConfig", "EwifResult", "ewif", "PlanConfig", "PlanResult", "plan",
    "SimulateConfig", "SimulateResult", "simulate",
    "ServeSimConfig", "ServeSimOutputs", "ServeSimResult", "serve_sim", "serving_config",
    "ServeSummary", "ServeConfig", "ServeResult", "serve", "CheckServeConfig", "CheckServeResult", "CheckRow", "check_serve",
    "DemoConfig", "DemoResult", "demo", "RunConfig", "RunResult", "run_method", "ProfileConfig", "ProfileResult", "profile",
    "TrainHeadConfig", "TrainHeadResult", "train_head",
    "KMatrixConfig", "KMatrixReport", "optimize_kmatrix", "ThresholdConfig", "ThresholdReport", "optimize_threshold",
    "TreeConfig", "TreeReport", "optimize_tree",
    "ReplayConfig", "ReplayResult", "replay",
    "SweepConfig", "SweepResult", "sweep", "CapacityConfig", "CapacityResult", "capacity",
    "SweepPlotConfig", "SweepPlotResult", "sweep_plot",
]
