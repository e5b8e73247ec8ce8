"""``draftsim simulate``: run a policy under an acceptance process in either engine."""

from __future__ import annotations

import argparse
import re

import numpy as np

from analysis.table import format_table
from sim import acceptance as A
from sim.costs import Costs
from sim.errors import DraftsimError
from sim.policies import POLICY_HELP, parse_policy
from sim.predict import predicted_ewif
from sim.simulate import ENGINES, simulate

from .. import args as a
from ..progress import token_bar

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
    g = p.add_argument_group("acceptance (pick one process)")
    g.add_argument("--alpha", type=a.probability("alpha"), help="Bernoulli: acceptance of drafter 1 by the target (default for every pair)")
    g.add_argument("--pair", action="append", default=[], metavar="M:V=A", help="Bernoulli: model M's tokens accepted by V with A (e.g. 2:1=0.6)")
    g.add_argument("--positional", metavar="A1,A2,...", help="acceptance by draft position")
    g.add_argument("--markov", metavar="A1,A2,...", help="Markov-modulated: acceptance per hidden regime")
    g.add_argument("--stay", metavar="P1,P2,...", help="Markov-modulated: probability of staying in each regime (default 0.95)")
    g.add_argument("--pred-noise", type=a.cost("pred_noise"), default=0.0, help="logit noise of the acceptance predictor")
    g.add_argument("--conf-noise", type=a.cost("conf_noise"), default=0.0, help="logit noise of the draft confidence")
    g.add_argument("--rank-alphas", metavar="A1,A2,...", help="tree: acceptance by candidate rank")
    c = p.add_argument_group("costs")
    c.add_argument("--cost", type=a.cost("cost"), action="append", help="cost coefficient of drafter 1, 2, ... (repeat)")
    c.add_argument("--verify-per-token", type=a.cost("verify_per_token"), default=0.0,
                   help="target time per verified token b in t(n) = 1 + b*n (default 0: constant)")
    d = p.add_argument_group("discrete-event engine")
    d.add_argument("--requests", type=a.count("requests", 1, 100_000), default=1, help="concurrent requests sharing the target")
    d.add_argument("--rate", type=a.positive("rate"), help="Poisson arrival rate of requests (default: all at time 0)")
    d.add_argument("--separate-drafter", action="store_true", help="drafters run on their own device")
    d.add_argument("--timeline", metavar="OUT.json", help="write the timeline (JSON)")
    d.add_argument("--timeline-png", metavar="OUT.png", help="plot the start of the timeline")
    p.add_argument("--sequences", type=a.count("sequences", 1, 1 << 20), help="Monte Carlo sequences (default: tokens/256)")
    p.set_defaults(run=run)


def _floats(name: str, text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise DraftsimError(f"{name} must be comma-separated numbers; got {text!r}") from None


def build_process(args, n_models: int) -> A.AcceptanceProcess:
    noise = {"pred_noise": args.pred_noise, "conf_noise": args.conf_noise}
    if args.rank_alphas:
        noise["rank_alphas"] = _floats("--rank-alphas", args.rank_alphas)
    chosen = [n for n, v in (("--alpha/--pair", args.alpha is not None or args.pair), ("--positional", args.positional), ("--markov", args.markov)) if v]
    if len(chosen) != 1:
        raise DraftsimError("give exactly one acceptance process: --alpha (with optional --pair), --positional or --markov")
    if args.positional:
        return A.Positional(_floats("--positional", args.positional), **noise)
    if args.markov:
        alphas = _floats("--markov", args.markov)
        stay = _floats("--stay", args.stay) if args.stay else [0.95] * len(alphas)
        if len(stay) != len(alphas) or len(alphas) < 2:
            raise DraftsimError("--markov needs at least two regimes and --stay one value per regime")
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
    out = []
    for spec in specs:
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*=\s*([0-9.eE+-]+)\s*", spec)
        if not m:
            raise DraftsimError(f"--pair must be M:V=A (e.g. 2:1=0.6); got {spec!r}")
        src, dst, val = int(m[1]), int(m[2]), float(m[3])
        if not (0 <= dst < src < size):
            raise DraftsimError(f"--pair {spec}: need 0 <= V < M < {size} (0 is the target, drafters 1..{size - 1})")
        if not 0.0 <= val <= 1.0:
            raise DraftsimError(f"--pair {spec}: acceptance must lie in [0, 1]")
        out.append((src, dst, val))
    return out


def run(args: argparse.Namespace) -> int:
    policy = parse_policy(args.policy)
    process = build_process(args, policy.n_models)
    drafter_costs = args.cost if args.cost else [0.0]
    costs = Costs.coefficients(drafter_costs)
    if args.verify_per_token:
        from sim.costs import CallCost

        costs = Costs((CallCost(1.0, args.verify_per_token),) + costs.models[1:])
    costs.require(policy.n_models)
    if args.engine == "mc" and (args.timeline or args.timeline_png):
        raise DraftsimError("--timeline needs --engine des")
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
        from analysis.figures import timeline

        timeline(args.timeline_png, result.timeline)
    predicted = predicted_ewif(policy, process, costs)
    if args.json:
        out = result.to_dict()
        out["analytic_ewif"] = predicted
        if args.timeline:
            out["timeline_path"] = args.timeline
        a.emit_json(out)
        return 0
    print(f"{result.policy!r} under {result.process!r}")
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
