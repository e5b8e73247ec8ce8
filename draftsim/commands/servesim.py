"""``draftsim serve-sim``: a serving simulation — continuous batching with speculative decoding
under a workload, on models priced from hardware (roofline) or measured profiles
(:class:`ServeSimConfig` → :func:`serve_sim` → :class:`ServeSimResult`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from draftsim.analysis.stepbreakdown import StepBreakdown, step_breakdown
from draftsim.analysis.table import format_table
from draftsim.sim import acceptance as A
from draftsim.sim.controllers import CONTROLLER_HELP, parse_controller
from draftsim.sim.cost.assembly import Assembly
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import POLICY_HELP, parse_policy
from draftsim.sim.registry import drafter_help
from draftsim.sim.serving import (
    SLO,
    SchedulerConfig,
    ServingConfig,
    run_replications,
    write_chrome_trace,
)
from draftsim.sim.serving.router import ROUTERS
from draftsim.sim.serving.scheduler import SCHEDULING_POLICIES
from draftsim.sim.serving.workload import (
    ARRIVAL_HELP,
    LENGTH_HELP,
    WORKLOAD_HELP,
    workload_lengths,
    workload_presets,
)
from draftsim.sim.serving.workload_spec import WorkloadSpec

from .. import args as a
from ..config import add_options, check, from_namespace, option, typed
from ..progress import count_bar, null_bar
from .costing import HARDWARE, SHAPES_TITLES, HardwareOptions
from .simulation import ACCEPTANCE, AcceptanceOptions, acceptance_warnings, build_process, float_list, report_warnings
from .table import summary

#: CPU seconds per simulated request (measured by benchmarks/bench_serving.py, upper value).
SECONDS_PER_REQUEST = 1e-3
#: Bytes kept per request, plus per output token (its rounds, inter-token gaps and steps).
BYTES_PER_REQUEST, BYTES_PER_TOKEN = 200.0, 12.0


#: Requests simulated when nothing else bounds the workload (no --requests, --duration or --request-trace).
DEFAULT_REQUESTS = 1000


@dataclass(kw_only=True)
class ServeSimConfig(HardwareOptions, AcceptanceOptions):
    """``draftsim serve-sim``: a workload served with continuous batching, a paged KV cache and
    speculative decoding, on models priced from hardware or measured profiles."""

    drafter_model: list[str] | None = option(help=drafter_help(), append=True, metavar="MODEL", group=HARDWARE, aliases=("--drafter",))
    policy: str = option("fixed:k=4", "drafting policy of every request (default fixed:k=4)")
    controller: str = option("none", "speculation controller per step (default none)")
    acceptance_trace: str | None = option(help="trace-driven: request i replays recorded sequence i mod n", metavar="TRACE",
                                          group=ACCEPTANCE)
    trace_drafter: list[str] | None = option(help="the trace's drafter(s) playing models 1, 2, ...", append=True, metavar="NAME",
                                             group=ACCEPTANCE)
    qps: float | None = option(help="mean arrival rate, requests/s (open-loop arrivals)", type=a.positive("qps"), group="workload")
    duration: float | None = option(help="how long arrivals come: seconds, or with a unit (90, 500ms, 2m, 1h)", type=a.duration("duration"),
                                    group="workload")
    requests: int | None = option(help=f"number of requests (default {DEFAULT_REQUESTS} when neither --duration nor a --request-trace "
                                       "bounds the workload)", type=a.count("requests", 1, 1 << 24), group="workload")
    arrivals: str = option("poisson", "arrival process (default poisson; see below)", group="workload")
    workload: str | None = option(help=f"a cited workload preset setting both length distributions: {', '.join(workload_presets())} "
                                       "(see below)", metavar="NAME", group="workload")
    prompt_len: str | None = option(help="prompt length distribution (default fixed:512, or the --workload preset's)", group="workload")
    output_len: str | None = option(help="output length distribution (default fixed:256, or the --workload preset's)", group="workload")
    request_trace: str | None = option(help="CSV/JSONL request trace (Azure or Vidur columns)", metavar="FILE", group="workload")
    priorities: int = option(1, "priority classes drawn uniformly (default 1)", type=a.count("priorities", 1, 1 << 16), group="workload")
    max_num_seqs: int | None = option(help="most running requests (default: the engine's on the device, e.g. vllm 1024 on an "
                                      "H100, 256 on an A100; 256 for profiles)", type=a.count("max_num_seqs", 1, 1 << 16), group="scheduler")
    max_num_batched_tokens: int | None = option(help="token budget per step (default: the engine's on the device, e.g. vllm 8192 on an "
                                                "H100, 2048 on an A100; 2048 for profiles)",
                                                type=a.count("max_num_batched_tokens", 1, 1 << 24), group="scheduler")
    no_chunked_prefill: bool = option(False, "prefill prompts whole", flag=True, group="scheduler")
    scheduling: str = option("fcfs", "waiting-queue order (default fcfs)", choices=SCHEDULING_POLICIES, group="scheduler")
    block_size: int | None = option(help="KV block size in tokens (default: the engine's, 16 for vllm)", type=a.count("block_size", 1, 4096),
                                    group="scheduler")
    kv_tokens: int | None = option(help="KV capacity in tokens per replica (default: from the hardware's memory for roofline models; "
                                   "unlimited for measured profiles)", type=a.count("kv_tokens", 1), group="scheduler")
    separate_drafter: bool = option(False, "drafters on a device of their own (not in the target's memory)", flag=True, group="scheduler")
    replicas: int = option(1, "replicas behind the router (default 1)", type=a.count("replicas", 1, 1024), group="scheduler")
    router: str = option("round-robin", "routing policy (default round-robin)", choices=tuple(ROUTERS), group="scheduler")
    slo_ttft: float | None = option(help="TTFT objective for goodput: seconds, or with a unit (0.5, 500ms)", type=a.duration("slo_ttft"),
                                    group="output")
    slo_tpot: float | None = option(help="TPOT objective for goodput: seconds, or with a unit (0.05, 50ms)", type=a.duration("slo_tpot"),
                                    group="output")
    seed: int = option(0, type=a.count("seed"), group="output")
    replications: int = option(3, "independent replications (default 3)", type=a.count("replications", 1, 1000), group="output")
    sweep_qps: str | None = option(help="serve at each rate with and without speculation; mark the crossover", metavar="Q1,Q2,...",
                                   group="output")

    def __post_init__(self):
        if self.request_trace is not None:  # the trace's columns give every request's lengths: these would change nothing
            given = next((flag for flag, value in (("--workload", self.workload), ("--prompt-len", self.prompt_len),
                                                    ("--output-len", self.output_len)) if value is not None), None)
            if given is not None:
                raise DraftsimError(f"{given} sets request lengths, but --request-trace {self.request_trace!r} gives every request's "
                                    f"own (its prompt and output token columns); drop {given} or --request-trace")
        # the lengths run: as given, else the --workload preset's, else fixed:512 / fixed:256
        self.prompt_len, self.output_len = workload_lengths(self.workload, self.prompt_len, self.output_len)


@dataclass(kw_only=True)
class ServeSimOutputs:
    """What ``draftsim serve-sim`` writes beside its result (files, figures, a report folder):
    none of it changes what is computed, so a :class:`ServeSimConfig` — a sweep's point — holds
    none of it."""

    timeline: str | None = option(help="Chrome trace-event timeline of the first replication (Perfetto)", metavar="OUT.json",
                                  group="output")
    figure: str | None = option(help="latency CDFs (or, with --sweep-qps, speedup against load)", metavar="OUT.png", group="output")
    load_figure: str | None = option(help="batch size, waiting requests and KV use over time (first replication)", metavar="OUT.png",
                                     group="output")
    report: str | None = option(help="write a report into DIR: report.html (one self-contained page) and report.md with the setup, "
                                "the assumptions and their sources, the headline table beside no speculation and the figures "
                                "(serves the workload without speculation too)", metavar="DIR", group="output")


@dataclass(kw_only=True)
class _ServeSimOptions(ServeSimOutputs, ServeSimConfig):
    """Every serve-sim option, for its parser: the configuration's, then the outputs'."""


#: ``--help`` titles of serve-sim's option groups.
SERVE_TITLES = {**SHAPES_TITLES, ACCEPTANCE: "acceptance (as draftsim simulate; or --acceptance-trace)", "workload": "workload",
                "scheduler": "scheduler and memory (per replica)", "output": "measurement and output"}


@dataclass(frozen=True)
class LatencyStats:
    """Mean and percentiles of one latency over the requests, seconds."""

    mean: float
    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class ServeMetrics:
    """The serving metrics of :func:`draftsim.sim.serving.metrics.summarize_run` at the steady
    state (TTFT, TPOT, ITL, E2E and queueing latency; throughput in output tokens/s, request
    throughput and goodput in requests/s; KV use only where the KV cache is bounded; whether
    the run settled, why not, the warm-up cut and the window measured)."""

    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    queue: LatencyStats
    throughput: float
    request_throughput: float
    goodput: float
    slo_attainment: float
    requests: float
    output_tokens: float
    steps: float
    busy: float
    mean_batch: float
    max_batch: float
    preemptions: float
    kv_utilisation: float | None = None
    kv_utilisation_max: float | None = None
    #: the steady state (draftsim.sim.serving.steady): rates are over the window after the warm-up, drain cut
    steady: bool | None = None
    overloaded: bool | None = None
    steady_reason: str | None = None
    warmup_s: float | None = None
    window_s: float | None = None
    measured_requests: float | None = None


@dataclass(frozen=True)
class SpecDecodeStats:
    """vLLM's spec-decode counters: drafts, draft tokens, accepted tokens, mean acceptance
    length (1 + accepted / drafts: tokens per verification) and draft acceptance rate."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    mean_acceptance_length: float
    draft_acceptance_rate: float


@dataclass(frozen=True)
class ServeSummary(ServeMetrics):
    """Means over replications (:func:`draftsim.sim.serving.metrics.combine`), each metric's
    95% confidence half-width in ``ci95`` (nan for one replication) and the spec-decode counters."""

    spec_decode: SpecDecodeStats | None = None
    ci95: ServeMetrics | None = None
    replications: int = 1


@dataclass
class ServeSimResult:
    """What ``draftsim serve-sim`` reports: the summary typed (None for a --sweep-qps run), the
    serving configuration it ran, and ``data``, the JSON document (the summary as
    :mod:`draftsim.sim.serving` reports it, or the load sweep, with the configuration and paths)."""

    serving: ServingConfig
    summary: ServeSummary | None
    data: dict
    load_sweep: list[dict] | None = None  #: per rate: speculation's and autoregressive summaries, speedups
    crossover_qps: float | None = None
    #: the mean step of the first replication's steady-state window, part by part (None for a sweep)
    step_breakdown: StepBreakdown | None = None

    def to_dict(self) -> dict:
        return self.data


def register(sub, common) -> None:
    p = sub.add_parser(
        "serve-sim",
        parents=[common],
        help=summary("serve-sim"),
        description="Serve a workload with continuous batching, a paged KV cache and speculative decoding; report TTFT, "
                    "TPOT, ITL, E2E latency, throughput, goodput and vLLM's spec-decode metrics, or sweep the load.",
        epilog="\n\n".join([POLICY_HELP, CONTROLLER_HELP, LENGTH_HELP, WORKLOAD_HELP, ARRIVAL_HELP]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, _ServeSimOptions, SERVE_TITLES)
    p.set_defaults(run=run)


def _process(config: ServeSimConfig, n_models: int, max_draft: int | None = None) -> A.AcceptanceProcess:
    if config.acceptance_trace is not None:
        others = [n for n, v in (("--alpha", config.alpha is not None), ("--pair", bool(config.pair)), ("--positional", config.positional),
                                 ("--markov", config.markov), ("--acceptance", config.acceptance),
                                 ("--acceptance-file", config.acceptance_file)) if v]
        if config.match != 1.0:
            others.append("--match")
        if others:
            raise DraftsimError(f"--acceptance-trace replaces the acceptance process; drop {others[0]}")
        return A.TraceDriven.from_trace(config.acceptance_trace, drafters=config.trace_drafter)
    if config.trace_drafter:
        raise DraftsimError("--trace-drafter applies to --acceptance-trace")
    if (config.alpha is None and not config.pair and config.positional is None and config.markov is None and config.acceptance is None
            and config.acceptance_file is None):
        if n_models <= 1:  # nothing is drafted: the acceptance process is never asked
            return A.Bernoulli(0.0)
        raise DraftsimError("give an acceptance process: --alpha A (Bernoulli), --positional, --markov, --acceptance NAME, "
                            "--acceptance-file FILE or --acceptance-trace")
    return build_process(config, n_models, max_draft, config.target, per_request=True)


def serving_config(config: ServeSimConfig) -> ServingConfig:
    """The serving simulator's configuration (:class:`draftsim.sim.serving.ServingConfig`) of
    ``config``: policy, controller, acceptance process, the models assembled on the hardware,
    scheduler, memory, replicas and SLOs — every option checked."""
    return serving_setup(config)[0]


def serving_setup(config: ServeSimConfig) -> tuple[ServingConfig, Assembly]:
    """:func:`serving_config` and the assembly it priced the models with (whose typed provenance
    the report reads: :func:`draftsim.sim.cost.provenance.pricing`)."""
    check(config)
    policy = parse_policy(config.policy)
    controller = parse_controller(config.controller)
    process = _process(config, policy.n_models, policy.max_draft)
    built = config.assembly()
    if len(built.drafters) < policy.n_models - 1:
        raise DraftsimError(f"policy {config.policy} uses {policy.n_models - 1} drafter(s): give --drafter-model MODEL for each "
                            f"(got {len(built.drafters)})")
    if config.priorities > 1 and config.scheduling != "priority":
        raise DraftsimError(f"--priorities {config.priorities} needs --scheduling priority")
    sched = scheduler_config(config, built)
    slo = SLO(ttft=config.slo_ttft or float("inf"), tpot=config.slo_tpot or float("inf"))
    speculates = policy.n_models > 1
    target = built.target if speculates or built.plain_target is None else built.plain_target
    return ServingConfig(policy, process, target, built.drafters, controller=controller, scheduler=sched, kv_tokens=config.kv_tokens,
                         separate_drafter=config.separate_drafter, replicas=config.replicas, router=config.router, slo=slo,
                         plain_target=built.plain_target if speculates else None, engine=built.engine), built


def scheduler_config(config: ServeSimConfig, built) -> SchedulerConfig:
    """The scheduler: each option the user set, else the engine's default on the device
    (:meth:`draftsim.sim.cost.assembly.Assembly.scheduler_defaults`, cited in
    sim/data/engines.json); a profile-priced deployment runs the ``none`` entry's on its CPU."""
    d = built.scheduler_defaults()
    return SchedulerConfig(max_num_seqs=config.max_num_seqs if config.max_num_seqs is not None else d.max_num_seqs,
                           max_num_batched_tokens=(config.max_num_batched_tokens if config.max_num_batched_tokens is not None
                                                   else d.max_num_batched_tokens),
                           chunked_prefill=d.chunked_prefill and not config.no_chunked_prefill, policy=config.scheduling,
                           block_size=config.block_size if config.block_size is not None else d.block_size)


def check_workload(config: ServeSimConfig) -> WorkloadSpec:
    """Check the workload options (arrival process, length distributions, a request count or
    duration) without drawing any request; the workload they name."""
    return workload_spec(config)


def workload_spec(config: ServeSimConfig) -> WorkloadSpec:
    """The workload ``config`` names, parsed once (:class:`draftsim.sim.serving.workload_spec.WorkloadSpec`):
    everything after uses its objects."""
    return WorkloadSpec.parse(arrivals=config.arrivals, prompt_len=config.prompt_len, output_len=config.output_len,
                              requests=config.requests, duration=config.duration, request_trace=config.request_trace,
                              priorities=config.priorities, default_requests=DEFAULT_REQUESTS)


def _workload_maker(config: ServeSimConfig, qps=None):
    """The arrival process and a draw ``make(rng, q=qps)`` of ``config``'s workload."""
    spec = workload_spec(config)
    return spec.arrivals, lambda rng, q=qps: spec.make(rng, q)


def _expected_requests(config: ServeSimConfig, qps) -> int:
    if config.requests is not None:
        return int(config.requests)
    if config.duration is not None and qps is not None:
        return int(config.duration * qps * 1.05) + 10
    return DEFAULT_REQUESTS


def model_error(config: ServeSimConfig, serving: ServingConfig, built: Assembly, batch: float | None = None) -> dict | None:
    """How far draftsim's speedups of published runs like this one were off
    (:func:`draftsim.sim.evidence.evidence_for`: its drafting method, a dense or MoE target, its
    engine and hardware, and ``batch``, the run's mean batch, where one load was served), beside the
    whole suite's; None where the suite says nothing: plain decoding, or a run not on a catalog GPU
    (the published runs are GPUs' speculation)."""
    from draftsim.sim.cost import default_catalog
    from draftsim.sim.evidence import record

    if serving.policy.n_models < 2 or not config.drafter_model or built.hardware is None or built.hardware.kind != "gpu":
        return None
    moe = default_catalog().model(config.target).experts > 0
    return record(config.drafter_model[0], moe, built.engine.name if built.engine is not None else None, built.hardware.name, batch)


def model_error_line(error: dict | None) -> str | None:
    """The model error as serve-sim prints it (None: none to print)."""
    from draftsim.sim.evidence import overall_text

    return None if error is None else f"model error: {error['text']}; {overall_text(error)}"


def serve_sim(config: ServeSimConfig, bar=null_bar, *, outputs: ServeSimOutputs | None = None) -> ServeSimResult:
    """Serve ``config``'s workload (every replication), or with --sweep-qps each load with and
    without speculation; write the timeline, figures and report ``outputs`` names (None: nothing). ``bar(total, desc)`` is a
    progress-bar context (:func:`draftsim.progress.count_bar`). Everything is checked first."""
    out = outputs or ServeSimOutputs()
    # missing folders above them are made once everything is checked, as --report's and other commands' --out are
    if out.timeline is not None:
        a.output_file("--timeline", out.timeline, suffix=".json", new_folders=True)
    if out.figure is not None:
        a.output_file("--figure", out.figure, suffix=".png", new_folders=True)
    if out.load_figure is not None:
        a.output_file("--load-figure", out.load_figure, suffix=".png", new_folders=True)
    a.distinct_outputs(("--timeline", out.timeline), ("--figure", out.figure), ("--load-figure", out.load_figure))
    serving, built = serving_setup(config)
    if config.sweep_qps is not None:
        return _sweep(config, out, serving, built, bar)
    spec = workload_spec(config)
    arrivals, make = spec.arrivals, lambda rng: spec.make(rng, config.qps)
    total = _expected_requests(config, config.qps)
    mean_output = spec.output.mean
    a.check_budget(f"{total:,} requests x {config.replications} replications", total * config.replications * SECONDS_PER_REQUEST,
                   total * (BYTES_PER_REQUEST + BYTES_PER_TOKEN * mean_output),
                   "give fewer --requests, a shorter --duration or fewer --replications")
    # validate the workload (lengths vs memory, trace columns) before the long part
    serving.check(make(np.random.default_rng(config.seed)))
    folder = _report_folder(out)  # everything checked: made before the long work
    a.make_parents(out.timeline, out.figure, out.load_figure)
    baseline = None
    speculates = serving.policy.n_models > 1
    with bar(total * config.replications * (2 if folder is not None and speculates else 1), "serving") as b:
        result = run_replications(serving, make, seed=config.seed, replications=config.replications,
                                  arrivals=arrivals if arrivals.closed else None, progress=b.update, keep_runs=False)
        if folder is not None and speculates:  # the same workloads without speculation (no drafter in memory)
            from draftsim.analysis.loadstudy import autoregressive

            baseline = run_replications(autoregressive(serving), make, seed=config.seed, replications=config.replications,
                                        arrivals=arrivals if arrivals.closed else None, progress=b.update, keep_runs=False)
    summary = result.summary
    written = {}
    if out.timeline:
        written["timeline"] = write_chrome_trace(out.timeline, result.runs)
    if out.figure:
        from draftsim.analysis.loadstudy import latency_cdfs

        latency_cdfs(out.figure, {config.policy: result.runs[0]})
        written["figure"] = out.figure
    if out.load_figure:
        from draftsim.analysis.loadstudy import load_over_time

        load_over_time(out.load_figure, result.runs[0])
        written["load_figure"] = out.load_figure
    data = dict(summary)
    # the largest batch any replication reached (the summary's max_batch: the mean of their maxima)
    data["max_batch_seen"] = max(int(s["max_batch"]) for s in result.summaries)
    breakdown = step_breakdown(result.runs[0], serving, "the first replication")
    if breakdown is not None:
        data["step_breakdown"] = breakdown.to_dict()
    data["config"] = _describe(serving, config)
    data["model_error"] = model_error(config, serving, built, summary.get("mean_batch"))
    data.update({f"{k}_path": v if isinstance(v, str) else v["path"] for k, v in written.items()})
    if folder is not None:
        from draftsim.commands.reporting import serving_report

        data["report"] = serving_report(config, built, serving, result, baseline, folder)
        if baseline is not None:
            data["baseline"] = dict(baseline.summary)
    return ServeSimResult(serving, typed(ServeSummary, summary), data, step_breakdown=breakdown)


def run(args: argparse.Namespace) -> int:
    config, outputs = from_namespace(ServeSimConfig, args), from_namespace(ServeSimOutputs, args)
    result = serve_sim(config, count_bar, outputs=outputs)
    report_warnings(acceptance_warnings(config, config.target), result.data)  # --acceptance NAME --borrow: stderr and --json
    if args.json:
        a.emit_json(result.to_dict())
        return 0
    if result.load_sweep is not None:
        _print_sweep(config, outputs, result)
        return 0
    _print_summary(result.serving, result.data, config)
    if result.step_breakdown is not None:
        print(f"step time ({result.step_breakdown.window}): {result.step_breakdown.line()}")
    line = model_error_line(result.data.get("model_error"))
    if line:
        print(line)
    for k in ("timeline", "figure", "load_figure"):
        if f"{k}_path" in result.data:
            print(f"{k} written to {result.data[f'{k}_path']}")
    _print_report(result.data)
    return 0


def _print_report(data: dict) -> None:
    if "report" in data:
        print(f"report written to {data['report']['html']} (and {data['report']['markdown']})")


def _written(value) -> str:
    """A policy or controller as the user wrote it (fixed:k=4); one given as an object in Python, its repr."""
    return value.strip() if isinstance(value, str) else repr(value)


def _describe(config: ServingConfig, options: ServeSimConfig) -> dict:
    """--json's ``config``: the policy and controller as the user writes them (fixed:k=4, not a Python repr), the rest as run."""
    kv, plan = config.kv_cache()
    return {"policy": _written(options.policy), "process": repr(config.process), "controller": _written(options.controller),
            "target": getattr(config.target, "name", repr(config.target)),
            "drafters": [getattr(d, "name", repr(d)) for d in config.drafters],
            "kv_tokens": kv.tokens if kv else None, "kv_blocks": kv.blocks if kv else None, "memory": plan.to_dict() if plan else None,
            "scheduler": vars(config.scheduler) if hasattr(config.scheduler, "__dict__") else str(config.scheduler),
            "replicas": config.replicas, "router": config.router,
            "engine": config.engine.label if config.engine is not None else "none (the roofline alone)"}


def _ms(x: float) -> str:
    return "nan" if not np.isfinite(x) else f"{x * 1e3:.2f}"


def steady_line(s: dict) -> str:
    """One line on the steady state of a summary (:func:`draftsim.sim.serving.steady.describe`):
    what was cut and measured, or the warning of a run that did not settle."""
    from draftsim.sim.serving.steady import describe

    return describe(s)


def _print_summary(config: ServingConfig, s: dict, options: ServeSimConfig) -> None:
    kv, plan = config.kv_cache()
    print(f"{_written(options.policy)} under {config.process!r}; controller {_written(options.controller)}")
    print(f"target {getattr(config.target, 'name', config.target)}; drafters " +
          ", ".join(getattr(d, "name", repr(d)) for d in config.drafters[: config.policy.n_models - 1]) or "none")
    sched = config.scheduler
    engine = config.engine.label if config.engine is not None else "none (the roofline alone)"
    print(f"engine {engine}; scheduler {sched.policy}, max_num_seqs {sched.max_num_seqs}, max_num_batched_tokens "
          f"{sched.max_num_batched_tokens:,}, chunked prefill {'on' if sched.chunked_prefill else 'off'}, block {sched.block_size}")
    if plan is not None:
        print(f"memory per device: {plan.describe()}")
    if kv is not None:  # what the cache holds: whole blocks (the plan's tokens rounded down), as --json config.kv_tokens
        rounded = f", the plan's {plan.tokens:,} rounded down to whole blocks" if plan is not None and plan.tokens != kv.tokens else ""
        print(f"KV cache: {kv.tokens:,} tokens ({kv.blocks:,} blocks of {kv.block_size}{rounded})")
    ci = s["ci95"]
    reps = s["replications"]
    rows = []
    for name in ("ttft", "tpot", "itl", "e2e", "queue"):
        rows.append([name.upper() if name != "queue" else "queueing"] +
                    [_ms(s[name][k]) + (f" ±{_ms(ci[name][k])}" if reps > 1 else "") for k in ("mean", "p50", "p90", "p99")])
    print(format_table(["latency (ms)", "mean", "p50", "p90", "p99"], rows))
    pm = (lambda k: f" ±{ci[k]:.3g}" if reps > 1 else "")  # noqa: E731
    slo = np.isfinite(config.slo.ttft) or np.isfinite(config.slo.tpot)
    print(f"throughput {s['throughput']:.1f} output tokens/s{pm('throughput')}; {s['request_throughput']:.3g} requests/s"
          + (f"; goodput {s['goodput']:.3g} requests/s{pm('goodput')} ({s['slo_attainment']:.1%} within the SLOs)" if slo else ""))
    print(steady_line(s))
    extra = f"; KV use {s['kv_utilisation']:.1%} (max {s['kv_utilisation_max']:.1%})" if "kv_utilisation" in s else ""
    largest = s.get("max_batch_seen", s["max_batch"])
    print(f"mean batch {s['mean_batch']:.1f}, largest batch seen {largest:.0f} of max_num_seqs {sched.max_num_seqs}{extra}; "
          f"preemptions {s['preemptions']:.0f}; "
          f"busy {s['busy']:.1%}; {reps} replication(s), {s['requests']:.0f} requests each")
    sd = s["spec_decode"]
    if sd["num_drafts"]:
        per_pos = np.array(sd["num_accepted_tokens_per_pos"]) / sd["num_drafts"]
        print(f"spec decode: num_drafts {sd['num_drafts']:.0f}, num_draft_tokens {sd['num_draft_tokens']:.0f}, num_accepted_tokens "
              f"{sd['num_accepted_tokens']:.0f}, mean_acceptance_length {sd['mean_acceptance_length']:.3f}, acceptance by position "
              + " ".join(f"{x:.3f}" for x in per_pos[:8]))


def _report_folder(out: ServeSimOutputs):
    if out.report is None:
        return None
    from draftsim.analysis.report import prepare_folder

    return prepare_folder(out.report)


def _sweep(config: ServeSimConfig, out: ServeSimOutputs, serving: ServingConfig, built: Assembly, bar) -> ServeSimResult:
    from draftsim.analysis.loadstudy import crossover, speedup_vs_load, sweep_qps

    if config.qps is not None:
        raise DraftsimError("--sweep-qps replaces --qps; drop --qps")
    for name in ("timeline", "load_figure"):
        if getattr(out, name) is not None:
            raise DraftsimError(f"--{name.replace('_', '-')} applies to a single load, not to --sweep-qps")
    qps = float_list("--sweep-qps", config.sweep_qps)
    spec = workload_spec(config)
    arrivals, make = spec.arrivals, spec.make
    if arrivals.closed:
        raise DraftsimError("--sweep-qps needs open-loop arrivals (poisson, gamma or fixed)")
    if config.request_trace is not None:
        raise DraftsimError("--sweep-qps draws arrivals at each rate; a --request-trace gives only lengths then: drop it or --sweep-qps")
    for q in qps:
        if not (np.isfinite(q) and q > 0):
            raise DraftsimError(f"--sweep-qps rates must be finite and > 0; got {q:g}")
    total = sum(_expected_requests(config, q) for q in qps) * 2 * config.replications
    biggest = _expected_requests(config, max(qps))
    mean_output = spec.output.mean
    a.check_budget(f"a sweep of {len(qps)} rates ({total:,} requests)", total * SECONDS_PER_REQUEST,
                   biggest * (BYTES_PER_REQUEST + BYTES_PER_TOKEN * mean_output), "give fewer rates, --requests or --replications")
    serving.check(make(np.random.default_rng(config.seed), max(qps)))
    folder = _report_folder(out)
    a.make_parents(out.figure)
    with bar(total, "sweeping") as b:
        rows = sweep_qps(serving, lambda rng, q: make(rng, q), qps, seed=config.seed, replications=config.replications, progress=b.update)
    cross = crossover(rows)
    if out.figure:
        speedup_vs_load(out.figure, rows, f"{_written(config.policy)} on {getattr(serving.target, 'name', '')}", cross)
    data = {"sweep": [{"qps": r["qps"], "speedup": r["speedup"], "tpot_speedup": r["tpot_speedup"], "throughput_ratio": r["throughput_ratio"],
                       "steady": r["steady"], "steady_reason": r["steady_reason"],
                       "spec": {k: r["spec"][k] for k in ("ttft", "tpot", "itl", "e2e", "throughput", "goodput", "spec_decode", "mean_batch")},
                       "ar": {k: r["ar"][k] for k in ("ttft", "tpot", "itl", "e2e", "throughput", "goodput")},
                       # the published runs like this load's: matched at its mean batch too (sim/evidence.py)
                       "model_error": model_error(config, serving, built, r["spec"]["mean_batch"])} for r in rows],
            "crossover_qps": cross, "figure_path": out.figure, "config": _describe(serving, config),
            "model_error": model_error(config, serving, built)}
    if folder is not None:
        from draftsim.commands.reporting import sweep_report

        data["report"] = sweep_report(config, built, serving, rows, cross, folder)
    return ServeSimResult(serving, None, data, load_sweep=rows, crossover_qps=cross)


def _print_sweep(config: ServeSimConfig, out: ServeSimOutputs, result: ServeSimResult) -> None:
    rows, cross, serving = result.load_sweep, result.crossover_qps, result.serving
    qps = [r["qps"] for r in rows]
    errors = [row.get("model_error") for row in result.data["sweep"]]
    at_batch = any(_error_cell(e) for e in errors)
    from draftsim.analysis.loadstudy import crossover_row

    below = crossover_row(rows) if cross is not None and np.isfinite(cross) else None
    table = []
    for i, (r, error) in enumerate(zip(rows, errors)):
        notes = (["<- crossover"] if i == below else []) + ([] if r["steady"] else [_steady_mark(r)])
        table.append([f"{r['qps']:g}", _ms(r["ar"]["e2e"]["mean"]), _ms(r["spec"]["e2e"]["mean"]), f"{r['speedup']:.3f}",
                      f"{r['tpot_speedup']:.3f}", f"{r['throughput_ratio']:.3f}", f"{r['spec']['mean_batch']:.1f}"]
                     + ([_error_cell(error) or "-"] if at_batch else []) + ["; ".join(notes)])
    print(f"{_written(config.policy)} under {serving.process!r} vs autoregressive; controller {_written(config.controller)}")
    print(format_table(["qps", "E2E AR (ms)", "E2E spec (ms)", "speedup", "TPOT speedup", "throughput ratio", "mean batch"]
                       + (["model error at its batch (median / worst, runs)"] if at_batch else []) + ["note"], table))
    unsteady = [r for r in rows if not r["steady"]]
    if unsteady:
        rates = ", ".join(f"{r['qps']:g}" for r in unsteady)
        print(f"WARNING: not at steady state at {rates} req/s (marked): those rows' rates "
              "and latencies are not a steady server's")
        for r in unsteady:
            print(f"  {r['qps']:g} req/s: " + "; ".join(_steady_detail(name, r[side]) for side, name in
                                                        (("spec", "speculation"), ("ar", "no speculation")) if not r[side]["steady"]))
    if cross is None:
        print(f"speculation pays at every load tested (up to {max(qps):g} requests/s)")
    elif not np.isfinite(cross):
        print(f"speculation does not pay even at the lowest load tested ({min(qps):g} requests/s)")
    else:
        bracket = [rows[below - 1], rows[below]]
        shaky = [f"{r['qps']:g} req/s {_steady_mark(r)}" for r in bracket if not r["steady"]]
        caveat = ""
        if shaky:
            caveat = (f"; but from rows not at steady state ({', '.join(shaky)}): rerun longer (more --requests or a longer "
                      "--duration), or with rates between them, before relying on it")
        print(f"crossover: speculation stops paying at about {cross:.3g} requests/s (between {bracket[0]['qps']:g} and "
              f"{bracket[1]['qps']:g}){caveat}")
    line = model_error_line(result.data.get("model_error"))
    if line:
        print(line)
        from draftsim.sim.evidence import BATCH_FACTOR, MIN_POINTS

        if at_batch:
            print(f"  the column: the published runs within {BATCH_FACTOR:g}x of each load's mean batch, where {MIN_POINTS} are; "
                  "'-': fewer are, the line above is all there is (--json sweep[].model_error says what each matched on)")
        else:
            print(f"  no load's mean batch has {MIN_POINTS} published runs within {BATCH_FACTOR:g}x of it: the line above, matched "
                  "without a batch, is all there is for every row")
    if out.figure:
        print(f"figure written to {out.figure}")
    _print_report(result.data)


def _steady_mark(r: dict) -> str:
    """A sweep row's mark when a run did not reach its steady state: overloaded (its queue grows) or not steady."""
    return "overloaded" if r["spec"].get("overloaded") or r["ar"].get("overloaded") else "not steady"


def _steady_detail(name: str, s: dict) -> str:
    """Which server of a row did not settle, in how many replications, and the test that said so."""
    reps = s.get("replications", 1)
    which = f" ({reps - s.get('steady_replications', 0)} of {reps} replications)" if reps > 1 else ""
    return f"{name}{which}: {s['steady_reason']}"


def _error_cell(error: dict | None) -> str:
    """A sweep row's model error as its table cell: median / worst over N published runs near its
    mean batch ('' where fewer are: the sweep's own line, matched without a batch, is all there is)."""
    if not error or "batch" not in error["matched_on"]:
        return ""
    return f"{error['median_abs_error']:.1%} / {error['worst_abs_error']:.1%}, {error['points']}"


