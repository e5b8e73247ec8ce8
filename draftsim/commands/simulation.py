"""``draftsim simulate``: run a policy under an acceptance process in either engine."""

from __future__ import annotations

import argparse
import re

import numpy as np

from draftsim.analysis.table import format_table
from draftsim.sim import acceptance as A
from draftsim.sim.costs import Costs
from draftsim.sim.errors import DraftsimError, as_probability, parse_number, parse_numbers
from draftsim.sim.policies import POLICY_HELP, parse_policy
from draftsim.sim.predict import predicted_ewif
from draftsim.sim.simulate import ENGINES, simulate

from .. import args as a
from ..progress import token_bar
from . import costing

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


def add_acceptance_options(g) -> None:
    """The acceptance-process options (read by :func:`build_process`), shared by every
    command that simulates: ``simulate``, ``serve-sim``."""
    g.add_argument("--alpha", type=a.probability("alpha"), help="Bernoulli: acceptance of drafter 1 by the target (default for every pair)")
    g.add_argument("--pair", action="append", default=[], metavar="M:V=A", help="Bernoulli: model M's tokens accepted by V with A (e.g. 2:1=0.6)")
    g.add_argument("--positional", metavar="A1,A2,...", help="acceptance by draft position")
    g.add_argument("--markov", metavar="A1,A2,...", help="Markov-modulated: acceptance per hidden regime (each sequence its own path)")
    g.add_argument("--stay", metavar="P1,P2,...", help="Markov-modulated: probability of staying in each regime (default 0.95)")
    g.add_argument("--pred-noise", type=a.cost("pred_noise"), default=0.0, help="logit noise of the acceptance predictor")
    g.add_argument("--conf-noise", type=a.cost("conf_noise"), default=0.0, help="logit noise of the draft confidence")
    g.add_argument("--rank-alphas", metavar="A1,A2,...", help="tree: acceptance by candidate rank")


def register(sub, common) -> None:
    p = sub.add_parser(
        "simulate",
        parents=[common],
        help="simulate a policy (Monte Carlo or discrete-event)",
        description="Simulate a drafting policy under an acceptance process and cost model.",
        epilog=POLICY_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--policy", required=True, help="policy in the mini-language below (e.g. fixed:k=5)")
    p.add_argument("--engine", choices=ENGINES, default="mc", help="mc: vectorised Monte Carlo; des: simpy timeline")
    p.add_argument("--tokens", type=a.count("tokens", 1, 10**10), default=1_000_000, help="tokens to simulate (default 1e6)")
    p.add_argument("--seed", type=a.count("seed"), default=0)
    add_acceptance_options(p.add_argument_group("acceptance (pick one process)"))
    c = p.add_argument_group("costs")
    c.add_argument("--cost", type=a.cost("cost"), action="append", help="cost coefficient (draft time / target time) of drafter 1, 2, ...: once per drafter of the policy, required")
    c.add_argument("--verify-per-token", type=a.cost("verify_per_token"), default=0.0,
                   help="target time per verified token b in t(n) = 1 + b*n (default 0: constant)")
    costing.add_hardware_options(p)
    d = p.add_argument_group("discrete-event engine")
    d.add_argument("--requests", type=a.count("requests", 1, 100_000), default=1, help="concurrent requests sharing the target")
    d.add_argument("--rate", type=a.positive("rate"), help="Poisson arrival rate of requests (default: all at time 0)")
    d.add_argument("--separate-drafter", action="store_true", help="drafters run on their own device")
    d.add_argument("--timeline", metavar="OUT.json", help="write the timeline (JSON)")
    d.add_argument("--timeline-png", metavar="OUT.png", help="plot the start of the timeline")
    p.add_argument("--sequences", type=a.count("sequences", 1, 1 << 20), help="Monte Carlo sequences (default: tokens/256)")
    p.set_defaults(run=run)


def float_list(name: str, text: str, count: int | None = None, minimum: int = 1) -> list[float]:
    """Comma-separated ASCII numbers, none empty (:func:`draftsim.sim.errors.parse_numbers`)."""
    return parse_numbers(name, text, count, minimum)


def build_process(args, n_models: int) -> A.AcceptanceProcess:
    noise = {"pred_noise": args.pred_noise, "conf_noise": args.conf_noise}
    if args.rank_alphas is not None:
        noise["rank_alphas"] = as_probability("--rank-alphas", float_list("--rank-alphas", args.rank_alphas)).tolist()
    given = {"--alpha/--pair": args.alpha is not None or bool(args.pair), "--positional": args.positional is not None,
             "--markov": args.markov is not None}
    if sum(given.values()) != 1:
        named = ", ".join(n for n, v in given.items() if v) or "none"
        raise DraftsimError(f"give exactly one acceptance process: --alpha (with optional --pair), --positional or --markov; got {named}")
    if args.stay is not None and args.markov is None:
        raise DraftsimError(f"--stay {args.stay!r} applies to --markov only")
    if args.positional is not None:
        return A.Positional(as_probability("--positional", float_list("--positional", args.positional)), **noise)
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
#: for N from 1e6 to 3e8 on a 2-core x86 machine: the discrete-event engine keeps every round
#: (0.26 kB and 1.7 µs per token with one request, 84 B and 2.8 µs with 64); Monte Carlo keeps
#: a regime per position under acceptance with memory (``--markov``: 8.8 B and 0.41 µs per
#: token) and bounded memory otherwise (0.21 µs per token for a threshold policy, 0.014 µs for
#: fixed k).
PER_TOKEN = {"des": (300.0, 3e-6), "mc-memory": (10.0, 0.5e-6), "mc": (0.0, 0.25e-6)}


def check_work(engine: str, process, tokens: int) -> None:
    """Refuse a simulation whose estimated memory or time exceeds the budget
    (:func:`draftsim.args.check_budget`), before any of it runs."""
    kind = engine if engine == "des" else ("mc" if process.stationary_rounds else "mc-memory")
    nbytes, seconds = PER_TOKEN[kind]
    most = int(min(a.MEMORY_BUDGET / nbytes if nbytes else float("inf"), a.TIME_BUDGET / seconds))
    a.check_budget(f"--tokens {tokens:,} with --engine {engine}", tokens * seconds, tokens * nbytes,
                   f"give --tokens {most:,} or fewer" + (" (or --engine mc)" if engine == "des" else ""))


def prepare(args: argparse.Namespace):
    """The policy, acceptance process, costs (and hardware cost details or None) of a parsed
    ``simulate`` command line, every option checked, before any work — the checks
    ``draftsim sweep`` runs on every point up front."""
    policy = parse_policy(args.policy)
    process = build_process(args, policy.n_models)
    drafter_costs = args.cost or []
    cost_info = None
    if costing.uses_hardware(args):  # t(n) = a + b·n per model fitted to its hardware cost model
        if args.cost or args.verify_per_token:
            raise DraftsimError("give either --cost/--verify-per-token or the model/hardware options (--target, --drafter-model, --hardware), not both")
        costs, cost_info = costing.hardware_costs(args, policy.n_models - 1)
    elif len(drafter_costs) != policy.n_models - 1:
        raise DraftsimError(f"policy {args.policy} uses {policy.n_models - 1} drafter(s): give --cost (draft time / target time, "
                            f"e.g. --cost 0.05) once per drafter; got {len(drafter_costs)} value(s)")
    else:
        costs = Costs.coefficients(drafter_costs)
    if args.verify_per_token:
        from draftsim.sim.costs import CallCost

        costs = Costs((CallCost(1.0, args.verify_per_token),) + costs.models[1:])
    costs.require(policy.n_models)
    if args.engine == "mc":
        des_only = [("--timeline", args.timeline is not None), ("--timeline-png", args.timeline_png is not None),
                    ("--rate", args.rate is not None), ("--separate-drafter", args.separate_drafter), ("--requests", args.requests != 1)]
        for option, given in des_only:
            if given:
                raise DraftsimError(f"{option} applies to the discrete-event engine: add --engine des (the engine is mc)")
    elif args.sequences is not None:
        raise DraftsimError(f"--sequences {args.sequences} applies to --engine mc; the des engine simulates --requests")
    return policy, process, costs, cost_info


def run(args: argparse.Namespace) -> int:
    policy, process, costs, cost_info = prepare(args)
    if args.timeline is not None:
        a.output_file("--timeline", args.timeline)
    if args.timeline_png is not None:
        a.output_file("--timeline-png", args.timeline_png, suffix=".png")
    a.distinct_outputs(("--timeline", args.timeline), ("--timeline-png", args.timeline_png))
    check_work(args.engine, process, args.tokens)
    with token_bar(args.tokens, "simulating") as bar:
        result = simulate(
            policy,
            process,
            costs,
            args.tokens,
            engine=args.engine,
            seed=args.seed,
            n_sequences=args.sequences,
            requests=args.requests,
            rate=args.rate,
            separate_drafter=args.separate_drafter,
            timeline=bool(args.timeline or args.timeline_png),
            progress=bar.update,
        )
    if args.timeline:
        result.save_timeline(args.timeline)
    if args.timeline_png:
        from draftsim.analysis.figures import timeline

        timeline(args.timeline_png, result.timeline)
    predicted = predicted_ewif(policy, process, costs)
    if args.json:
        out = result.to_dict()
        out["analytic_ewif"] = predicted
        if cost_info:
            out["cost_from"] = cost_info
        if args.timeline:
            out["timeline_path"] = args.timeline
        a.emit_json(out)
        return 0
    print(f"{result.policy!r} under {result.process!r}")
    if cost_info:
        print(costing.describe_coefficients(cost_info) + "; t(n) = a + b*n per model: "
              + ", ".join(f"{m.a:.4g} + {m.b:.4g}n" for m in costs.models))
    print(f"engine {result.engine}: {result.tokens:,} tokens in {result.n_sequences:,} "
          f"{'requests' if result.engine == 'des' else 'sequences'}; cost coefficients {costs.coefficient.round(6).tolist()}")
    rows = [[METRIC_LABELS.get(k, k), v.value, v.se] for k, v in result.metrics.items()]
    print(format_table(["metric", "value", "SE"], rows))
    shown = result.acceptance_by_position[:12]
    if len(shown) and np.isfinite(shown).any():
        print("acceptance by draft position:", " ".join(f"{x:.3f}" for x in shown if np.isfinite(x)))
    if predicted is not None:
        est = result.metrics["ewif"]
        z = (est.value - predicted) / est.se if est.se > 0 else float("nan")
        print(f"analytic EWIF {predicted:.4f}; simulated {est.value:.4f} ({z:+.2f} SE)")
    if result.engine == "des":
        r = result.requests
        print(f"latency per request p50 {r['latency_p50']:.4g}  p90 {r['latency_p90']:.4g}  p99 {r['latency_p99']:.4g}; "
              f"throughput {r['throughput']:.4g} tokens/unit; utilisation "
              + ", ".join(f"{k} {v:.1%}" for k, v in r["utilisation"].items()))
    if args.timeline:
        print(f"timeline written to {args.timeline}")
    if args.timeline_png:
        print(f"timeline plot written to {args.timeline_png}")
    return 0
