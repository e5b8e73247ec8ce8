"""``draftsim ewif`` and ``draftsim plan``: closed-form what-if planning."""

from __future__ import annotations

import argparse

import numpy as np

from draftsim.analysis.table import format_table
from draftsim.sim import analytic
from draftsim.sim.errors import K_MAX_LIMIT, DraftsimError
from draftsim.sim.plan import Drafter, plan

from .. import args as a
from . import costing

DEFAULT_K_MAX = 16


def register(sub, common) -> None:
    p = sub.add_parser(
        "ewif",
        parents=[common],
        help="EWIF and expected tokens against the draft length k",
        description="Expected tokens per target call, EWIF (speedup), discard and verification "
        "rates of speculative decoding with i.i.d. acceptance alpha and draft cost c.",
    )
    p.add_argument("--alpha", type=a.probability("alpha"), required=True, help="acceptance rate in [0, 1]")
    p.add_argument("--cost", type=a.cost("cost"), help="draft cost / target cost, >= 0 (or the model/hardware options below)")
    costing.add_hardware_options(p)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--k", type=a.count("k", 0, K_MAX_LIMIT), help="show this draft length only")
    group.add_argument(
        "--k-max",
        type=a.count("k_max", 0, K_MAX_LIMIT),
        default=DEFAULT_K_MAX,
        help=f"show k = 0..K_MAX (default {DEFAULT_K_MAX})",
    )
    p.set_defaults(run=run_ewif)

    p = sub.add_parser(
        "plan",
        parents=[common],
        help="rank strategies (single drafter, horizontal and vertical cascades) by EWIF",
        description="For each drafter its best k; the best horizontal cascade over all drafters; "
        "with --mag-alpha, the best vertical cascade with Max-Gram drafting for each drafter. "
        "Ranked by EWIF (expected speedup over autoregressive decoding).",
    )
    p.add_argument(
        "--drafter",
        action="append",
        required=True,
        metavar="NAME:ALPHA:COST",
        help="a draft model: acceptance by the target and cost coefficient (repeatable); with --target/--hardware, "
        "NAME:ALPHA:MODEL prices it from hardware",
    )
    costing.add_hardware_options(p)
    p.add_argument(
        "--mag-alpha",
        type=a.probability("mag_alpha"),
        help="acceptance of Max-Gram's tokens by the drafters (adds vertical cascades)",
    )
    p.add_argument(
        "--mag-cost", type=a.cost("mag_cost"), default=0.0, help="Max-Gram's cost coefficient (default 0)"
    )
    p.add_argument(
        "--k-max", type=a.count("k_max", 0, K_MAX_LIMIT), default=32, help="largest draft length searched (default 32)"
    )
    p.set_defaults(run=run_plan)


def ewif_table(alpha: float, cost: float, ks: np.ndarray, best_k: int, verify=None) -> list[dict]:
    tokens = analytic.expected_tokens(alpha, ks)
    values = analytic.ewif(alpha, cost, ks, verify)
    discard, verify = analytic.fixed_k_rates(alpha, ks)
    return [
        {
            "k": int(k),
            "expected_tokens": float(t),
            "ewif": float(v),
            "discard_rate": float(d),
            "verification_rate": float(r),
            "best": int(k) == best_k,
        }
        for k, t, v, d, r in zip(ks, np.atleast_1d(tokens), np.atleast_1d(values), np.atleast_1d(discard), np.atleast_1d(verify))
    ]


def run_ewif(args: argparse.Namespace) -> int:
    if args.k is None:
        search_max, ks = args.k_max, np.arange(args.k_max + 1)
    else:
        search_max, ks = max(args.k, DEFAULT_K_MAX), np.array([args.k])
    (args.cost,), cost_info = costing.coefficients_or_hardware(args, None if args.cost is None else [args.cost], 1)
    verify = None
    if cost_info:  # the target's t(n) too: verifying k + 1 tokens is dearer than one on most hardware
        verify = cost_info["verify"] = costing.verify_table(args, search_max + 1)
        if args.k is not None and args.k + 1 > len(verify):
            raise DraftsimError(f"--k {args.k}: the profile prices drafts up to {len(verify) - 1} tokens")
        search_max = len(verify) - 1
        ks = ks[ks <= search_max]
    best_k, best = analytic.optimal_k(args.alpha, args.cost, search_max, verify)
    rows = ewif_table(args.alpha, args.cost, ks, int(best_k), verify)
    result = {
        "alpha": args.alpha,
        "cost": args.cost,
        **({"cost_from": cost_info} if cost_info else {}),
        "rows": rows,
        "best": {"k": int(best_k), "ewif": float(best), "k_max": search_max},
    }
    if args.json:
        a.emit_json(result)
        return 0
    if cost_info:
        print(costing.describe_coefficients(cost_info))
    print(f"alpha = {args.alpha:g}, c = {args.cost:g}")
    table = [
        [r["k"], r["expected_tokens"], r["ewif"], r["discard_rate"], r["verification_rate"], "*" if r["best"] else ""]
        for r in rows
    ]
    print(format_table(["k", "E[tokens]", "EWIF", "discard", "verify", "best"], table))
    print(f"best k in 0..{search_max}: k = {int(best_k)}, EWIF {float(best):.4f}")
    return 0


def run_plan(args: argparse.Namespace) -> int:
    specs, cost_info = costing.drafter_specs(args, args.drafter) if costing.uses_hardware(args) else (args.drafter, None)
    drafters = [Drafter.parse(spec) for spec in specs]
    verify = None
    if cost_info:  # every strategy's target call priced at the tokens it verifies
        verify = cost_info["verify"] = costing.verify_table(args, args.k_max + 1)
    strategies = plan(drafters, mag_alpha=args.mag_alpha, k_max=args.k_max, mag_cost=args.mag_cost, verify=verify)
    if args.json:
        a.emit_json(
            {
                "drafters": [vars(d) for d in drafters],
                "mag_alpha": args.mag_alpha,
                "mag_cost": args.mag_cost,
                "k_max": args.k_max,
                **({"cost_from": cost_info} if cost_info else {}),
                "strategies": [
                    {"rank": i + 1, "kind": s.kind, "description": s.description, "ewif": s.ewif, **s.params}
                    for i, s in enumerate(strategies)
                ],
            }
        )
        return 0
    if cost_info:
        print(costing.describe_coefficients(cost_info))
    print(format_plan(strategies))
    return 0


def format_plan(strategies) -> str:
    """A ranked plan as a text table."""
    rows = [[i + 1, s.kind, s.description, s.ewif] for i, s in enumerate(strategies)]
    return format_table(["rank", "kind", "strategy", "EWIF"], rows)
