"""``draftsim simulate``: run a policy under an acceptance process in either engine
(:class:`SimulateConfig` → :func:`simulate` → :class:`SimulateResult`)."""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field

import numpy as np

from draftsim.analysis.table import format_table
from draftsim.sim import acceptance as A
from draftsim.sim.acceptance_catalog import acceptance_entry, check_use
from draftsim.sim.acceptance_import import StepLengths, load_acceptance_file
from draftsim.sim.cost import CallCost, Costs
from draftsim.sim.errors import K_MAX_LIMIT, DraftsimError, as_probability, parse_number, parse_numbers
from draftsim.sim.metrics import Estimate
from draftsim.sim.policies import POLICY_HELP, parse_policy
from draftsim.sim.predict import predicted_ewif
from draftsim.sim.registry import METHODS, drafter_help
from draftsim.sim.simulate import ENGINES, SimResult
from draftsim.sim.simulate import simulate as run_engine

from .. import args as a
from ..config import add_options, check, from_namespace, option, typed
from ..progress import token_bar
from .costing import HARDWARE, HARDWARE_TITLES, PricedOptions, describe_coefficients
from .table import summary

METRIC_LABELS = {
    "tokens_per_call": "tokens per target call",
    "ewif": "EWIF (speedup over AR)",
    "swi": "SWI",
    "acceptance_rate": "acceptance rate",
    "discard_rate": "discard rate",
    "verification_rate": "verification rate",
    "latency_per_token": "latency per token",
    "time_per_token": "time per token (timeline)",
}

ACCEPTANCE = "acceptance"


@dataclass(kw_only=True)
class AcceptanceOptions:
    """The acceptance-process options (read by :func:`build_process`), shared by every command
    that simulates: ``simulate``, ``serve-sim``."""

    alpha: float | None = option(help="Bernoulli: acceptance of drafter 1 by the target (default for every pair)",
                                 type=a.probability("alpha"), group=ACCEPTANCE)
    pair: list[str] = option([], "Bernoulli: model M's tokens accepted by V with A (e.g. 2:1=0.6)", append=True, metavar="M:V=A",
                             group=ACCEPTANCE)
    positional: str | None = option(help="per-position acceptance a_i = P(draft tokens 1..i all accepted), one value per position "
                                    "up to the policy's longest draft, non-increasing: vLLM's per-position rate (accepted at i / "
                                    "drafts) and what the output line 'acceptance by position' prints", metavar="A1,A2,...",
                                    group=ACCEPTANCE)
    conditional: bool = option(False, "read --positional as conditional rates c_i = P(token i accepted | 1..i-1 accepted) "
                               "(the EAGLE papers' n-alpha; a_i = c_1...c_i)", flag=True, group=ACCEPTANCE)
    acceptance: str | None = option(help="a published acceptance entry, cited (draftsim acceptance lists them; its rates for the "
                                    "policy's k; NAME@low / NAME@high: the ends of a published range, a bracket to run both of; "
                                    "an n-gram entry whose source counts the steps that found no match sets --match unless it is "
                                    "given); it must have been measured on --target with --drafter-model's method", metavar="NAME",
                                    group=ACCEPTANCE)
    borrow: bool = option(False, "use the --acceptance entry although it was measured on another target or with another drafting "
                          "method: a warning line on stderr and a 'warnings' field in --json say what was borrowed", flag=True,
                          group=ACCEPTANCE)
    markov: str | None = option(help="Markov-modulated: acceptance per hidden regime (each sequence its own path)", metavar="A1,A2,...",
                                group=ACCEPTANCE)
    stay: str | None = option(help="Markov-modulated: probability of staying in each regime (default 0.95)", metavar="P1,P2,...",
                              group=ACCEPTANCE)
    pred_noise: float = option(0.0, "logit noise of the acceptance predictor", type=a.cost("pred_noise"), group=ACCEPTANCE)
    conf_noise: float = option(0.0, "logit noise of the draft confidence", type=a.cost("conf_noise"), group=ACCEPTANCE)
    acceptance_file: str | None = option(help="acceptance measured elsewhere: a vLLM Prometheus scrape (spec-decode counters: "
                                         "per-position rates) or per-request accepted lengths per step (JSONL; serve-sim replays "
                                         "each request's steps, simulate pools them)", metavar="FILE", group=ACCEPTANCE)
    match: float = option(1.0, "share of rounds in which the drafter proposes anything (a lookup drafter - ngram, suffix - "
                          "finds no match in the others: a plain decode step, nothing verified); acceptance applies given a "
                          "proposal (default 1)", type=a.probability("match"), group=ACCEPTANCE)
    rank_alphas: str | None = option(help="tree: acceptance by candidate rank", metavar="A1,A2,...", group=ACCEPTANCE)


@dataclass(kw_only=True)
class SimulateConfig(PricedOptions, AcceptanceOptions):
    """``draftsim simulate``: a drafting policy under an acceptance process and a cost model,
    in the Monte Carlo engine (``mc``) or on a discrete-event timeline (``des``)."""

    drafter_model: list[str] | None = option(help=drafter_help(), append=True, metavar="MODEL", group=HARDWARE, aliases=("--drafter",))
    policy: str = option(help="policy in the mini-language below (e.g. fixed:k=5)", required=True)
    executor: str = option("mc", "how the policy is run: mc (vectorised Monte Carlo, default) or des (a simpy timeline)", choices=ENGINES)
    tokens: int = option(1_000_000, "tokens to simulate (default 1e6)", type=a.count("tokens", 1, 10**10))
    seed: int = option(0, type=a.count("seed"))
    sequences: int | None = option(help="Monte Carlo sequences (default: tokens/256)", type=a.count("sequences", 1, 1 << 20))
    cost: list[float] | None = option(help="cost coefficient (draft time / target time) of drafter 1, 2, ...: once per drafter of "
                                      "the policy, required", type=a.cost("cost"), append=True, group="costs")
    verify_per_token: float = option(0.0, "target time per verified token b in t(n) = 1 + b*n (default 0: constant)",
                                     type=a.cost("verify_per_token"), group="costs")
    requests: int = option(1, "concurrent requests sharing the target", type=a.count("requests", 1, 100_000), group="des")
    rate: float | None = option(help="Poisson arrival rate of requests (default: all at time 0)", type=a.positive("rate"), group="des")
    separate_drafter: bool = option(False, "drafters run on their own device", flag=True, group="des")


@dataclass(kw_only=True)
class SimulateOutputs:
    """What ``draftsim simulate`` writes beside its result (the des executor's timeline): none
    of it changes what is computed, so a :class:`SimulateConfig` — a sweep's point — holds none of it."""

    timeline: str | None = option(help="write the timeline (JSON)", metavar="OUT.json", group="des")
    timeline_png: str | None = option(help="plot the start of the timeline", metavar="OUT.png", group="des")


@dataclass(kw_only=True)
class _SimulateOptions(SimulateOutputs, SimulateConfig):
    """Every simulate option, for its parser: the configuration's, then the outputs'."""


#: ``--help`` titles of simulate's option groups.
SIMULATE_TITLES = {**HARDWARE_TITLES, ACCEPTANCE: "acceptance (pick one process)", "des": "discrete-event executor (--executor des)"}


@dataclass(frozen=True)
class McMetrics:
    """A simulation's metrics (:func:`draftsim.sim.metrics.summarize`), each a value and its
    standard error: tokens per target call, EWIF, SWI, acceptance, discard and verification
    rates (SpecDec++), latency per token in the cost model's unit."""

    tokens_per_call: Estimate
    ewif: Estimate
    swi: Estimate
    acceptance_rate: Estimate
    discard_rate: Estimate
    verification_rate: Estimate
    latency_per_token: Estimate


@dataclass(frozen=True)
class SimMetrics(McMetrics):
    """:class:`McMetrics` and, on the des engine's timeline only, the time per token with
    queueing included (None in Monte Carlo)."""

    time_per_token: Estimate | None = None


@dataclass(frozen=True)
class RequestStats:
    """Per-request latency and throughput of a des run (in the cost model's time unit)."""

    n_requests: int
    latency_mean: float
    latency_p50: float
    latency_p90: float
    latency_p99: float
    makespan: float
    throughput: float
    utilisation: dict  #: device name → busy share of the makespan


@dataclass
class SimulateResult:
    """What ``draftsim simulate`` reports: the engine's :class:`~draftsim.sim.simulate.SimResult`
    (``run``), its metrics and request statistics typed, the closed-form EWIF where one exists,
    and how hardware costs were derived (``cost_from``, None for typed coefficients)."""

    run: SimResult
    metrics: SimMetrics
    requests: RequestStats | None
    analytic_ewif: float | None
    cost_from: dict | None = None
    timeline_path: str | None = None
    #: what the run's --acceptance entry borrowed or bracketed (acceptance_warnings): stderr and --json
    warnings: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Tokens simulated."""
        return self.run.tokens

    @property
    def n_sequences(self) -> int:
        """Monte Carlo sequences, or des requests."""
        return self.run.n_sequences

    def to_dict(self) -> dict:
        out = self.run.to_dict()
        out["analytic_ewif"] = self.analytic_ewif
        if self.cost_from:
            out["cost_from"] = self.cost_from
        if self.timeline_path:
            out["timeline_path"] = self.timeline_path
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out


def register(sub, common) -> None:
    p = sub.add_parser(
        "simulate",
        parents=[common],
        help=summary("simulate"),
        description="Simulate a drafting policy under an acceptance process and cost model.",
        epilog=POLICY_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, _SimulateOptions, SIMULATE_TITLES)
    p.set_defaults(run=run)


def float_list(name: str, text: str, count: int | None = None, minimum: int = 1) -> list[float]:
    """Comma-separated ASCII numbers, none empty (:func:`draftsim.sim.errors.parse_numbers`)."""
    return parse_numbers(name, text, count, minimum)


def build_process(args, n_models: int, max_draft: int | None = None, target: str | None = None,
                  per_request: bool = False) -> A.AcceptanceProcess:
    """The acceptance process the options name, checked. ``max_draft`` is the policy's longest
    draft: per-position rates (``--positional``, ``--acceptance``) must cover it; ``target`` the
    target model, when one is given: an ``--acceptance`` entry measured on another model is refused.

    An ``--acceptance`` entry must match the target and the first drafter's method
    (:func:`draftsim.sim.acceptance_catalog.check_use`; ``--borrow`` turns a refusal into the
    warnings :func:`acceptance_warnings` lists); where its source counted the steps that found no
    match (``share_of_steps_without_proposal`` at the policy's k) and ``--match`` is left at 1,
    the match share is the entry's.

    Per-position rates follow :mod:`draftsim.sim.acceptance_rates`: ``--positional`` reads
    cumulative rates (vLLM's), or conditional ones with ``--conditional``. ``--acceptance-file``
    (:mod:`draftsim.sim.acceptance_import`): counters give per-position rates; accepted lengths
    per request are replayed request by request when ``per_request``, else pooled."""
    noise = {"pred_noise": args.pred_noise, "conf_noise": args.conf_noise, "match": args.match}
    if args.rank_alphas is not None:
        noise["rank_alphas"] = as_probability("--rank-alphas", float_list("--rank-alphas", args.rank_alphas)).tolist()
    given = {"--alpha/--pair": args.alpha is not None or bool(args.pair), "--positional": args.positional is not None,
             "--markov": args.markov is not None, "--acceptance": args.acceptance is not None,
             "--acceptance-file": args.acceptance_file is not None}
    if sum(given.values()) != 1:
        named = ", ".join(n for n, v in given.items() if v) or "none"
        raise DraftsimError("give exactly one acceptance process: --alpha (with optional --pair), --positional, --markov, "
                            f"--acceptance NAME or --acceptance-file FILE; got {named}")
    if args.stay is not None and args.markov is None:
        raise DraftsimError(f"--stay {args.stay!r} applies to --markov only")
    if args.conditional and args.positional is None:
        raise DraftsimError("--conditional says how to read --positional; give --positional A1,A2,... with it")
    if args.acceptance_file is not None:
        measured = load_acceptance_file(args.acceptance_file)
        k = _draft_positions("--acceptance-file", max_draft)
        if k > measured.k:
            raise DraftsimError(f"--acceptance-file {args.acceptance_file}: measured at k={measured.k}; the policy drafts up to {k} "
                                "(positions never measured)")
        if isinstance(measured, StepLengths):
            return measured.process(**noise) if per_request else measured.pooled(k, **noise)
        return measured.process(k, **noise)
    if getattr(args, "borrow", False) and args.acceptance is None:
        raise DraftsimError("--borrow applies to --acceptance NAME (an entry measured on another target or method)")
    if args.acceptance is not None:
        entry = acceptance_entry(args.acceptance)
        check_use(entry, target, drafter_method(args), borrow=getattr(args, "borrow", False))
        if max_draft == 0:  # a policy that never drafts (plain decoding beside speculating ones): the entry is never asked
            return A.Bernoulli(0.0)
        k = _draft_positions("--acceptance", max_draft)
        share = entry.share_without_proposal(k)
        if share is not None and args.match == 1.0:  # the source counted the steps that found no match
            noise["match"] = 1.0 - share
        return entry.process(k, **noise)
    if args.positional is not None:
        values = as_probability("--positional", float_list("--positional", args.positional))
        if max_draft is not None and values.size < max_draft:
            raise DraftsimError(f"--positional {args.positional!r} gives {values.size} position(s); the policy drafts up to "
                                f"{max_draft}: give one rate per position (values are never padded)")
        if args.conditional:
            return A.Positional(values, drafts=max_draft, **noise)
        try:
            return A.Positional.from_cumulative(values, drafts=max_draft, **noise)
        except DraftsimError as e:
            raise DraftsimError(f"--positional {args.positional!r}: {e} (cumulative rates a_i never increase; "
                                "add --conditional for conditional rates)") from None
    if args.markov is not None:
        alphas = as_probability("--markov", float_list("--markov", args.markov, minimum=2)).tolist()
        stay = as_probability("--stay", float_list("--stay", args.stay)).tolist() if args.stay is not None else [0.95] * len(alphas)
        if len(stay) != len(alphas):
            raise DraftsimError(f"--stay needs one value per --markov regime ({len(alphas)}); got {len(stay)} in {args.stay!r}")
        T = np.array([[s if i == j else (1 - s) / (len(alphas) - 1) for j in range(len(alphas))] for i, s in enumerate(stay)])
        return A.MarkovModulated(T, alphas, **noise)
    if not args.pair:
        return A.Bernoulli(args.alpha, **noise)
    base = 0.0 if args.alpha is None else args.alpha
    size = max(n_models, 2)
    matrix = np.tril(np.full((size, size), base), k=-1)  # A[m, v] for proposer m > verifier v
    for src, dst, val in parse_pairs(args.pair, size):
        matrix[src, dst] = val
    return A.Bernoulli(matrix, **noise)


def drafter_method(args) -> str | None:
    """The first drafter's method as the acceptance catalog names methods (``--drafter-model``:
    eagle3, mtp, ngram, a model name = draft_model, ...); None where no drafter is named."""
    from draftsim.sim.cost.methods import parse_drafter

    drafters = getattr(args, "drafter_model", None) or []
    if not drafters:
        return None
    method = parse_drafter(drafters[0]).method
    return method if method in METHODS else None


def acceptance_warnings(args, target: str | None = None) -> list[str]:
    """The lines every output of a run carries about its ``--acceptance`` entry: what
    ``--borrow`` borrowed (another target, another method) and which end of a published range it
    uses (:func:`draftsim.sim.acceptance_catalog.check_use`); empty without an entry."""
    if getattr(args, "acceptance", None) is None:
        return []
    return check_use(acceptance_entry(args.acceptance), target, drafter_method(args), borrow=getattr(args, "borrow", False))


def report_warnings(lines: list[str], data: dict | None = None) -> None:
    """Each warning as one stderr line (``warning: ...``) and, given the JSON document ``data``,
    its ``warnings`` field."""
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)
    if data is not None and lines:
        data["warnings"] = list(lines)


def _draft_positions(flag: str, max_draft: int | None) -> int:
    """The chain length per-position rates must cover: the policy's longest draft."""
    if max_draft is None or not 1 <= max_draft <= K_MAX_LIMIT:
        raise DraftsimError(f"{flag} needs a policy with a bounded draft length (1..{K_MAX_LIMIT}); got {max_draft}")
    return int(max_draft)


def parse_pairs(specs, size: int) -> list[tuple[int, int, float]]:
    """``M:V=A`` strings as (proposer, verifier, acceptance), checked against ``size`` models."""
    out, seen = [], {}
    for spec in specs:
        m = re.fullmatch(r"\s*([0-9]+)\s*:\s*([0-9]+)\s*=\s*([0-9.eE+-]+|nan|inf)\s*", spec, re.IGNORECASE)
        if not m:
            raise DraftsimError(f"--pair must be M:V=A with ASCII digits (e.g. 2:1=0.6); got {spec!r}")
        src, dst, val = int(m[1]), int(m[2]), float(parse_number(f"--pair {spec}", m[3]))
        if (src, dst) in seen:
            raise DraftsimError(f"--pair {spec}: the pair {src}:{dst} was already given ({seen[(src, dst)]}); give each pair once")
        seen[(src, dst)] = spec
        if not (0 <= dst < src < size):
            raise DraftsimError(f"--pair {spec}: need 0 <= V < M < {size} (0 is the target, drafters 1..{size - 1})")
        if not 0.0 <= val <= 1.0:
            raise DraftsimError(f"--pair {spec}: acceptance must lie in [0, 1]; got {val:g}")
        out.append((src, dst, val))
    return out


#: Peak memory (bytes) and time (seconds) per simulated token, upper values measured with
#: ``/usr/bin/time -f "%e s %M kB" draftsim simulate --policy P --alpha 0.8 --cost 0.1 --tokens N``
#: for N from 1e6 to 3e8 on a 2-core x86 machine: the discrete-event executor keeps every round,
#: so its worst case is one token a round, at acceptance 0 (836 B and 3.4 µs CPU per token with one
#: request, ``--alpha 0 --tokens 2e6``; ~230 B and 5–8 µs with 64–10,000 requests; at 0.8: 0.26–0.3 kB
#: and 1.7–1.9 µs with one request, 84 B and 2.8 µs with 64) — the budget takes the worst; Monte Carlo keeps
#: a regime per position under acceptance with memory (``--markov``: 8.8 B and 0.41 µs per
#: token) and bounded memory otherwise (0.21 µs per token for a threshold policy, 0.014 µs for
#: fixed k).
PER_TOKEN = {"des": (850.0, 8e-6), "mc-memory": (10.0, 0.5e-6), "mc": (0.0, 0.25e-6)}


def check_work(engine: str, process, tokens: int) -> None:
    """Refuse a simulation whose estimated memory or time exceeds the budget
    (:func:`draftsim.args.check_budget`), before any of it runs."""
    kind = engine if engine == "des" else ("mc" if process.stationary_rounds else "mc-memory")
    nbytes, seconds = PER_TOKEN[kind]
    most = int(min(a.MEMORY_BUDGET / nbytes if nbytes else float("inf"), a.TIME_BUDGET / seconds))
    a.check_budget(f"--tokens {tokens:,} with --executor {engine}", tokens * seconds, tokens * nbytes,
                   f"give --tokens {most:,} or fewer" + (" (or --executor mc)" if engine == "des" else ""))


def prepare(config: SimulateConfig):
    """The policy, acceptance process, costs (and hardware cost details or None) of a
    ``simulate`` configuration, every option checked, before any work — the checks
    ``draftsim sweep`` runs on every point up front."""
    check(config)
    policy = parse_policy(config.policy)
    process = build_process(config, policy.n_models, policy.max_draft, config.target)
    drafter_costs = config.cost or []
    cost_info = None
    if config.uses_hardware():  # t(n) = a + b·n per model fitted to its hardware cost model
        if config.cost or config.verify_per_token:
            raise DraftsimError("give either --cost/--verify-per-token or the model/hardware options (--target, --drafter-model, --hardware), not both")
        built, cost_info = config.priced(policy.n_models - 1)
        costs = built.costs(config.cost_batch, config.cost_context)
    else:
        config.refuse_unused_pricing("--cost" if drafter_costs else "no hardware named")
        if len(drafter_costs) != policy.n_models - 1:
            raise DraftsimError(f"policy {config.policy} uses {policy.n_models - 1} drafter(s): give --cost (draft time / target time, "
                                f"e.g. --cost 0.05) once per drafter; got {len(drafter_costs)} value(s)")
        costs = Costs.coefficients(drafter_costs)
    if config.verify_per_token:
        costs = Costs((CallCost(1.0, config.verify_per_token),) + costs.models[1:])
    costs.require(policy.n_models)
    if config.executor == "mc":
        des_only = [("--rate", config.rate is not None), ("--separate-drafter", config.separate_drafter),
                    ("--requests", config.requests != 1)]
        for flag, given in des_only:
            if given:
                raise DraftsimError(f"{flag} applies to the discrete-event executor: add --executor des (the executor is mc)")
    elif config.sequences is not None:
        raise DraftsimError(f"--sequences {config.sequences} applies to --executor mc; the des executor simulates --requests")
    return policy, process, costs, cost_info


def simulate(config: SimulateConfig, progress=None, *, outputs: SimulateOutputs | None = None) -> SimulateResult:
    """Run the simulation ``config`` describes (``progress(tokens)`` is told as it goes);
    write the timeline files ``outputs`` names (None: nothing). Everything is checked before any work."""
    out = outputs or SimulateOutputs()
    policy, process, costs, cost_info = prepare(config)
    if config.executor == "mc":
        for flag, given in (("--timeline", out.timeline), ("--timeline-png", out.timeline_png)):
            if given is not None:
                raise DraftsimError(f"{flag} applies to the discrete-event executor: add --executor des (the executor is mc)")
    if out.timeline is not None:
        a.output_file("--timeline", out.timeline)
    if out.timeline_png is not None:
        a.output_file("--timeline-png", out.timeline_png, suffix=".png")
    a.distinct_outputs(("--timeline", out.timeline), ("--timeline-png", out.timeline_png))
    check_work(config.executor, process, config.tokens)
    result = run_engine(policy, process, costs, config.tokens, engine=config.executor, seed=config.seed, n_sequences=config.sequences,
                        requests=config.requests, rate=config.rate, separate_drafter=config.separate_drafter,
                        timeline=bool(out.timeline or out.timeline_png), progress=progress)
    if out.timeline:
        result.save_timeline(out.timeline)
    if out.timeline_png:
        from draftsim.analysis.figures import timeline

        timeline(out.timeline_png, result.timeline)
    return SimulateResult(result, typed(SimMetrics, result.metrics), typed(RequestStats, result.requests or None),
                          predicted_ewif(policy, process, costs), cost_info, out.timeline,
                          warnings=acceptance_warnings(config, config.target))


def run(args: argparse.Namespace) -> int:
    config, outputs = from_namespace(SimulateConfig, args), from_namespace(SimulateOutputs, args)
    with token_bar(config.tokens, "simulating") as bar:
        out = simulate(config, progress=bar.update, outputs=outputs)
    report_warnings(out.warnings)
    if args.json:
        a.emit_json(out.to_dict())
        return 0
    result, costs, predicted = out.run, out.run.costs, out.analytic_ewif
    print(f"{result.policy!r} under {result.process!r}")
    if out.cost_from:
        print(describe_coefficients(out.cost_from) + "; t(n) = a + b*n per model: "
              + ", ".join(f"{m.a:.4g} + {m.b:.4g}n" for m in costs.models))
    print(f"executor {result.engine}: {result.tokens:,} tokens in {result.n_sequences:,} "
          f"{'requests' if result.engine == 'des' else 'sequences'}; cost coefficients {costs.coefficient.round(6).tolist()}")
    rows = [[METRIC_LABELS.get(k, k), v.value, v.se] for k, v in result.metrics.items()]
    print(format_table(["metric", "value", "SE"], rows))
    if out.cost_from and "latency_per_token" in result.metrics:  # the cost unit is one target call of known seconds
        unit = out.cost_from["target_seconds"]
        lat = result.metrics["latency_per_token"]
        print(f"on {out.cost_from['hardware']}: {lat.value * unit * 1e3:.3f} ms per token (±{lat.se * unit * 1e3:.3f}), "
              f"{1.0 / (lat.value * unit):,.1f} tokens/s per sequence (the latency unit above is one target call, "
              f"{unit * 1e3:.3f} ms)")
    shown = result.acceptance_by_position[:12]
    if len(shown) and np.isfinite(shown).any():
        print("acceptance by draft position:", " ".join(f"{x:.3f}" for x in shown if np.isfinite(x)))
    if predicted is not None:
        est = result.metrics["ewif"]
        if est.se > 1e-12 * max(abs(est.value), 1.0):
            gap = f"{(est.value - predicted) / est.se:+.2f} SE"
        else:  # no variance (every round alike: no speculation, acceptance 0 or 1; an SE of 1e-18 is rounding)
            gap = "exactly" if math.isclose(est.value, predicted, rel_tol=1e-9) else "no variance"
        print(f"analytic EWIF {predicted:.4f}; simulated {est.value:.4f} ({gap})")
    if result.engine == "des":
        r = result.requests
        unit = out.cost_from["target_seconds"] if out.cost_from else None
        lat = (lambda x: f"{x * unit:.4g} s") if unit else (lambda x: f"{x:.4g}")  # noqa: E731
        print(f"latency per request p50 {lat(r['latency_p50'])}  p90 {lat(r['latency_p90'])}  p99 {lat(r['latency_p99'])}; "
              f"throughput {r['throughput'] / unit if unit else r['throughput']:.4g} tokens/{'s' if unit else 'unit'}; utilisation "
              + ", ".join(f"{k} {v:.1%}" for k, v in r["utilisation"].items()))
    if outputs.timeline:
        print(f"timeline written to {outputs.timeline}")
    if outputs.timeline_png:
        print(f"timeline plot written to {outputs.timeline_png}")
    return 0
