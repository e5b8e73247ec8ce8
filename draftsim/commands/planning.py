"""``draftsim ewif`` and ``draftsim plan``: closed-form what-if planning (configs → functions → results)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from draftsim.analysis.table import format_table
from draftsim.sim import analytic
from draftsim.sim.errors import K_MAX_LIMIT, DraftsimError
from draftsim.sim.plan import PlannedDrafter, Strategy
from draftsim.sim.plan import plan as rank_strategies

from .. import args as a
from ..config import add_options, as_dict, check, from_namespace, option
from .costing import HARDWARE_TITLES, PricedOptions, describe_coefficients
from .table import summary

DEFAULT_K_MAX = 16


@dataclass(kw_only=True)
class EwifConfig(PricedOptions):
    """``draftsim ewif``: EWIF and expected tokens of speculative decoding against k."""

    alpha: float = option(help="acceptance rate in [0, 1]", type=a.probability("alpha"), required=True)
    cost: float | None = option(help="draft cost / target cost, >= 0 (or the model/hardware options below)", type=a.cost("cost"))
    k: int | None = option(help="show this draft length only", type=a.count("k", 0, K_MAX_LIMIT), exclusive="k")
    k_max: int = option(DEFAULT_K_MAX, f"show k = 0..K_MAX (default {DEFAULT_K_MAX})", type=a.count("k_max", 0, K_MAX_LIMIT),
                        exclusive="k")


@dataclass(frozen=True)
class EwifRow:
    """Speculative decoding with draft length k: E[tokens per target call], EWIF, discard and
    verification rates (SpecDec++), and whether k is the best."""

    k: int
    expected_tokens: float
    ewif: float
    discard_rate: float
    verification_rate: float
    best: bool


@dataclass(frozen=True)
class BestK:
    """The EWIF-optimal draft length in 0..k_max and its EWIF."""

    k: int
    ewif: float
    k_max: int


@dataclass
class EwifResult:
    """What ``draftsim ewif`` reports; ``cost_from`` describes hardware-priced costs (else None)."""

    alpha: float
    cost: float
    cost_from: dict | None
    rows: list[EwifRow]
    best: BestK

    def to_dict(self) -> dict:
        out = as_dict(self)
        if self.cost_from is None:
            del out["cost_from"]
        return out


@dataclass(kw_only=True)
class PlanConfig(PricedOptions):
    """``draftsim plan``: strategies (single drafter, horizontal and vertical cascades) ranked by EWIF."""

    drafter: list[str] = option(help="a draft model: acceptance by the target and cost coefficient (repeatable); with "
                                "--target/--hardware, NAME:ALPHA:MODEL prices it from hardware", append=True, required=True,
                                metavar="NAME:ALPHA:COST")
    mag_alpha: float | None = option(help="acceptance of Max-Gram's tokens by the drafters (adds vertical cascades)",
                                     type=a.probability("mag_alpha"))
    mag_cost: float = option(0.0, "Max-Gram's cost coefficient (default 0)", type=a.cost("mag_cost"))
    k_max: int = option(32, "largest draft length searched (default 32)", type=a.count("k_max", 1, K_MAX_LIMIT))


@dataclass
class PlanResult:
    """What ``draftsim plan`` reports: the drafters, the search's settings and the strategies, best first."""

    drafters: list[PlannedDrafter]
    mag_alpha: float | None
    mag_cost: float
    k_max: int
    cost_from: dict | None
    strategies: list[Strategy]

    def to_dict(self) -> dict:
        return {"drafters": [vars(d) for d in self.drafters], "mag_alpha": self.mag_alpha, "mag_cost": self.mag_cost,
                "k_max": self.k_max, **({"cost_from": self.cost_from} if self.cost_from else {}),
                "strategies": [{"rank": i + 1, "kind": s.kind, "description": s.description, "ewif": s.ewif, **s.params}
                               for i, s in enumerate(self.strategies)]}


def register(sub, common) -> None:
    p = sub.add_parser(
        "ewif",
        parents=[common],
        help=summary("ewif"),
        description="Expected tokens per target call, EWIF (speedup), discard and verification "
        "rates of speculative decoding with i.i.d. acceptance alpha and draft cost c.",
    )
    add_options(p, EwifConfig, HARDWARE_TITLES)
    p.set_defaults(run=run_ewif)

    p = sub.add_parser(
        "plan",
        parents=[common],
        help=summary("plan"),
        description="For each drafter its best k; the best horizontal cascade over all drafters; "
        "with --mag-alpha, the best vertical cascade with Max-Gram drafting for each drafter. "
        "Ranked by EWIF (expected speedup over autoregressive decoding).",
    )
    add_options(p, PlanConfig, HARDWARE_TITLES)
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


def ewif(config: EwifConfig) -> EwifResult:
    """EWIF, expected tokens, discard and verification rates for k in 0..k_max (or k alone),
    with the drafter's cost typed or priced from hardware (then the target's t(n) too)."""
    check(config)
    if config.k is None:
        search_max, ks = config.k_max, np.arange(config.k_max + 1)
    else:
        search_max, ks = max(config.k, DEFAULT_K_MAX), np.array([config.k])
    (c,), cost_info, built = config.coefficients_or_hardware(None if config.cost is None else [config.cost], 1)
    verify = None
    if built is not None:  # the target's t(n) too: verifying k + 1 tokens is dearer than one on most hardware
        verify = cost_info["verify"] = built.verify_table(search_max + 1, config.cost_batch, config.cost_context)
        if config.k is not None and config.k + 1 > len(verify):
            raise DraftsimError(f"--k {config.k}: the profile prices drafts up to {len(verify) - 1} tokens")
        search_max = len(verify) - 1
        ks = ks[ks <= search_max]
    best_k, best = analytic.optimal_k(config.alpha, c, search_max, verify)
    rows = [EwifRow(**r) for r in ewif_table(config.alpha, c, ks, int(best_k), verify)]
    return EwifResult(config.alpha, c, cost_info, rows, BestK(int(best_k), float(best), search_max))


def run_ewif(args: argparse.Namespace) -> int:
    result = ewif(from_namespace(EwifConfig, args))
    if args.json:
        a.emit_json(result.to_dict())
        return 0
    if result.cost_from:
        print(describe_coefficients(result.cost_from))
    print(f"alpha = {result.alpha:g}, c = {result.cost:g}")
    table = [[r.k, r.expected_tokens, r.ewif, r.discard_rate, r.verification_rate, "*" if r.best else ""] for r in result.rows]
    print(format_table(["k", "E[tokens]", "EWIF", "discard", "verify", "best"], table))
    print(f"best k in 0..{result.best.k_max}: k = {result.best.k}, EWIF {result.best.ewif:.4f}")
    return 0


def _priced_specs(config: PlanConfig) -> tuple[list[str], dict, list[float]]:
    """``NAME:ALPHA:MODEL`` drafter specs with the model's cost coefficient in place of MODEL
    (specs whose third field is already a number are kept), their description and the
    target's verification table v(n), n = 1..k_max + 1."""
    out, models, where = list(config.drafter), [], []
    for i, spec in enumerate(config.drafter):
        parts = spec.split(":")
        if len(parts) == 3:
            try:
                float(parts[2])
            except ValueError:
                models.append(parts[2])
                where.append(i)
    if config.drafter_model:
        raise DraftsimError("with plan, name each drafter's model in its spec: --drafter NAME:ALPHA:MODEL")
    if not models:
        raise DraftsimError("with --target/--hardware, give drafters as NAME:ALPHA:MODEL (e.g. small:0.8:llama-2-7b)")
    built, info = config.priced(len(models), drafters=models)
    for i, c in zip(where, info["coefficients"]):
        name, alpha, _ = out[i].split(":")
        out[i] = f"{name}:{alpha}:{c!r}"
    verify = info["verify"] = built.verify_table(config.k_max + 1, config.cost_batch, config.cost_context)
    return out, info, verify


def plan(config: PlanConfig) -> PlanResult:
    """The strategies over ``config``'s drafters, ranked by EWIF (every target call priced at
    the tokens it verifies when the drafters are priced from hardware)."""
    check(config)
    if not config.uses_hardware():
        config.refuse_unused_pricing("costs in the --drafter specs")
    specs, cost_info, verify = _priced_specs(config) if config.uses_hardware() else (config.drafter, None, None)
    drafters = [PlannedDrafter.parse(spec) for spec in specs]
    strategies = rank_strategies(drafters, mag_alpha=config.mag_alpha, k_max=config.k_max, mag_cost=config.mag_cost, verify=verify)
    return PlanResult(drafters, config.mag_alpha, config.mag_cost, config.k_max, cost_info, strategies)


def run_plan(args: argparse.Namespace) -> int:
    result = plan(from_namespace(PlanConfig, args))
    if args.json:
        a.emit_json(result.to_dict())
        return 0
    if result.cost_from:
        print(describe_coefficients(result.cost_from))
    print(format_plan(result.strategies))
    return 0


def format_plan(strategies) -> str:
    """A ranked plan as a text table."""
    rows = [[i + 1, s.kind, s.description, s.ewif] for i, s in enumerate(strategies)]
    return format_table(["rank", "kind", "strategy", "EWIF"], rows)
