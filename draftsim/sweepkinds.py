"""The sweep kinds: what a point of ``draftsim sweep`` / ``draftsim capacity`` runs.

A point is a command's configuration as a table: its keys are the command's options (named
as the flags without ``--``), read into the command's configuration dataclass by
:func:`draftsim.config.from_mapping` — the same types, ranges and messages as on the command
line. The point runs as a call of the command's function; its metrics are attribute paths
into the typed result, checked against the result types when the kind is made
(:class:`draftsim.analysis.sweep.Kind`). Adding a kind is one :class:`Command` and one entry
of :data:`KINDS`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping

from draftsim.analysis.sweep import Kind
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import parse_policy

from .commands import optimization, servesim, simulation, traces
from .config import from_mapping


@dataclass(frozen=True)
class Command:
    """A command as sweeps run it: its configuration class (or one per subcommand, chosen by
    the ``what`` key of a point: ``optimize``), the function from configuration to result, a
    deeper check of a configuration before any work, and the result types the function returns."""

    name: str
    configs: Mapping[str | None, type]
    function: Callable
    check: Callable
    results: tuple[type, ...]

    def config(self, table: dict, seed: int | None = None, seed_option: str | None = None):
        """The configuration of a point's table (and the derived seed in ``seed_option``)."""
        table = dict(table)
        what = None
        if None not in self.configs:
            if "what" not in table:
                raise DraftsimError(f"kind {self.name} needs what = ... in [base] (the subcommand: draftsim {self.name} WHAT)")
            what = table.pop("what")
            if not isinstance(what, str):
                raise DraftsimError(f"what must be a subcommand name; got {what!r}")
            if what not in self.configs:
                raise DraftsimError(f"what = {what!r}: draftsim {self.name} runs one of {', '.join(self.configs)}")
        if seed is not None and seed_option:
            table[seed_option] = seed
        return from_mapping(self.configs[what], table, f"{self.name} {what}" if what else self.name)


def _check_simulate(config) -> None:
    _, process, _, _ = simulation.prepare(config)
    simulation.check_work(config.executor, process, config.tokens)


def _check_optimize(config) -> None:
    if isinstance(config, optimization.ThresholdConfig):
        optimization.threshold_problem(config)


def _check_replay(config) -> None:
    from draftsim.sim.traces import Trace

    parse_policy(config.policy)
    Trace(config.trace)


def _check_serve(config) -> None:
    servesim.serving_config(config)
    servesim.check_workload(config)


def _optimize(config):
    functions = {optimization.KMatrixConfig: optimization.optimize_kmatrix, optimization.ThresholdConfig: optimization.optimize_threshold,
                 optimization.TreeConfig: optimization.optimize_tree}
    return functions[type(config)](config)


COMMANDS: dict[str, Command] = {
    "simulate": Command("simulate", {None: simulation.SimulateConfig}, simulation.simulate, _check_simulate,
                        (simulation.SimulateResult,)),
    "serve": Command("serve-sim", {None: servesim.ServeSimConfig}, servesim.serve_sim, _check_serve, (servesim.ServeSimResult,)),
    "optimize": Command("optimize", optimization.OPTIMIZE_CONFIGS, _optimize, _check_optimize,
                        (optimization.KMatrixReport, optimization.ThresholdReport, optimization.TreeReport)),
    "replay": Command("replay", {None: traces.ReplayConfig}, traces.replay, _check_replay, (traces.ReplayResult,)),
}


def validate_point(kind: str, table: dict) -> None:
    """Check a point's configuration as the command would, before any work."""
    command = COMMANDS[kind]
    command.check(command.config(table))


def run_point(kind: str, table: dict, seed: int | None):
    """Run one point: build its configuration (with the derived seed), call the command's
    function, return its typed result."""
    command = COMMANDS[kind]
    return command.function(command.config(table, seed, KINDS[kind].seed_option))


# --- metric tables: name → attribute path in the result -------------------------------------

_MC_METRICS = ("tokens_per_call", "ewif", "swi", "acceptance_rate", "discard_rate", "verification_rate", "latency_per_token")
_SIM_METRICS = _MC_METRICS + ("time_per_token",)
SIMULATE_METRICS = {
    **{m: f"metrics.{m}.value" for m in _SIM_METRICS},
    **{f"{m}_se": f"metrics.{m}.se" for m in _SIM_METRICS},
    "analytic_ewif": "analytic_ewif",
    "tokens": "tokens",
    "n_sequences": "n_sequences",
    **{f"latency_{q}": f"requests.latency_{q}" for q in ("mean", "p50", "p90", "p99")},
    "throughput": "requests.throughput",
}
# a replay runs the Monte Carlo engine: no timeline, so no time_per_token (ReplayResult has none)
REPLAY_METRICS = {
    **{m: f"metrics.{m}.value" for m in _MC_METRICS},
    **{f"{m}_se": f"metrics.{m}.se" for m in _MC_METRICS},
    "tokens": "tokens",
    "n_sequences": "n_sequences",
    "oracle_speedup": "oracle.speedup",
    "oracle_latency": "oracle.latency_per_token",
}
OPTIMIZE_METRICS = {
    "optimal": "comparison.optimal",
    "best_fixed_k": "comparison.best_fixed_k.k",
    "best_fixed_k_latency": "comparison.best_fixed_k.latency_per_token",
    "best_threshold_h": "comparison.best_threshold.h",
    "best_threshold_latency": "comparison.best_threshold.latency_per_token",
    "oracle": "comparison.oracle",
    "autoregressive": "comparison.autoregressive",
    "exact_ewif": "exact.ewif",
    "grid_ewif": "grid.ewif",
    "best_single_ewif": "best_single_drafter.ewif",
    "tree_tokens_per_time": "tree.tokens_per_time",
    "tree_size": "tree.size",
    "tree_depth": "tree.depth",
    "chain_tokens_per_time": "best_chain.tokens_per_time",
    "chain_length": "best_chain.length",
}
_SERVE_STATS = ("ttft", "tpot", "itl", "e2e", "queue")
_SERVE_SCALARS = ("throughput", "request_throughput", "goodput", "slo_attainment", "requests", "output_tokens", "steps", "busy",
                  "mean_batch", "max_batch", "kv_utilisation", "kv_utilisation_max", "preemptions")
SERVE_METRICS = {
    **{f"{m}_{s}": f"summary.{m}.{s}" for m in _SERVE_STATS for s in ("mean", "p50", "p90", "p99")},
    **{f"{m}_{s}_ci95": f"summary.ci95.{m}.{s}" for m in _SERVE_STATS for s in ("mean", "p50", "p90", "p99")},
    **{m: f"summary.{m}" for m in _SERVE_SCALARS},
    **{f"{m}_ci95": f"summary.ci95.{m}" for m in _SERVE_SCALARS},
    **{m: f"summary.spec_decode.{m}" for m in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "mean_acceptance_length",
                                               "draft_acceptance_rate")},
    # the steady state (draftsim.sim.serving.steady): flags as 0/1 (means over replications: the share), the window's seconds
    **{m: f"summary.{m}" for m in ("steady", "overloaded", "warmup_s", "window_s")},
}


def _kind(name: str, metrics: dict, default_metrics: tuple[str, ...], **kwargs) -> Kind:
    return Kind(name, functools.partial(validate_point, name), functools.partial(run_point, name), metrics, default_metrics,
                results=COMMANDS[name].results, **kwargs)


KINDS: dict[str, Kind] = {
    "simulate": _kind("simulate", SIMULATE_METRICS,
                      ("ewif", "ewif_se", "tokens_per_call", "acceptance_rate", "latency_per_token", "analytic_ewif"),
                      seed_option="seed", rate_option="rate",
                      help="draftsim simulate: Monte Carlo or discrete-event simulation of a policy"),
    "serve": _kind("serve", SERVE_METRICS, ("ttft_p99", "tpot_p50", "e2e_p99", "throughput", "goodput", "mean_acceptance_length"),
                   seed_option="seed", rate_option="qps", forbidden=("sweep_qps",),
                   help="draftsim serve-sim: continuous-batching serving simulation"),
    "optimize": _kind("optimize", OPTIMIZE_METRICS, tuple(OPTIMIZE_METRICS), seed_option=None,
                      help="draftsim optimize WHAT (what = kmatrix | threshold | tree in [base])"),
    "replay": _kind("replay", REPLAY_METRICS, ("ewif", "tokens_per_call", "acceptance_rate", "oracle_speedup"), seed_option="seed",
                    help="draftsim replay: a policy over a recorded trace"),
}
