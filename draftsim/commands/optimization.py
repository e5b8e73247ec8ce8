"""``draftsim optimize kmatrix|threshold|tree``: optima, baselines and bounds (a configuration,
a function and a report per subcommand: :data:`OPTIMIZE_CONFIGS`)."""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np

from draftsim.analysis.table import format_table
from draftsim.sim import analytic, mdp, optimize
from draftsim.sim.errors import DraftsimError, as_probability

from .. import args as a
from ..config import add_options, as_dict, check, from_namespace, option, typed
from ..progress import count_bar, null_bar
from .costing import HARDWARE_TITLES, PricedOptions, describe_coefficients
from .simulation import float_list, parse_pairs
from .table import summary


@dataclass(kw_only=True)
class KMatrixConfig(PricedOptions):
    """``draftsim optimize kmatrix``: the EWIF-optimal K matrix of Cascade Speculative Drafting."""

    cost: list[float] | None = option(help="cost coefficient of drafter 1, 2, ... (repeat; the last may be Max-Gram, 0; or the "
                                      "model/hardware options)", type=a.cost("cost"), append=True)
    alpha: float = option(help="acceptance for every pair not given by --pair", type=a.probability("alpha"), required=True)
    pair: list[str] = option([], "model M's tokens accepted by V with A (e.g. 3:1=0.55)", append=True, metavar="M:V=A")
    k_max: int = option(optimize.EXACT_ENTRY_MAX, type=a.count("k_max", 0, optimize.EXACT_ENTRY_MAX))


@dataclass(kw_only=True)
class ThresholdConfig(PricedOptions):
    """``draftsim optimize threshold``: SpecDec++'s optimal stopping policy, best threshold, best k, oracle."""

    alpha: float | None = option(help="i.i.d. acceptance", type=a.probability("alpha"))
    markov: str | None = option(help="acceptance per hidden regime (observed by the drafter)", metavar="A1,A2,...")
    stay: str | None = option(help="probability of staying in each regime (default 0.95)", metavar="P1,P2,...")
    t_draft: float = option(0.05, "draft time per token (target call = --t-target)", type=a.positive("t_draft"))
    t_target: float = option(1.0, type=a.positive("t_target"))
    k_max: int = option(32, type=a.count("k_max", 1, 128))
    sweep: str = option("0.01,0.5,8", "t_draft/t_target values for the h* table", metavar="LO,HI,N")
    pred_noise: float | None = option(help="also solve with a noisy predictor (logit noise, 4 bins, k_max <= 10)",
                                      type=a.positive("pred_noise"))


@dataclass(kw_only=True)
class TreeConfig(PricedOptions):
    """``draftsim optimize tree``: the token tree maximising accepted tokens per unit time."""

    rank_alphas: str = option(help="P(candidate of rank r accepted | earlier ranks rejected)", required=True, metavar="A1,A2,...")
    budget: int = option(64, "most drafted tokens in the tree", type=a.count("budget", 1, 4096))
    verify_cost: str = option("1,0.002", "target time to verify n tokens: t(n) = A + B*n", metavar="A,B")
    draft_cost: float = option(0.0, "drafter time per tree level", type=a.cost("draft_cost"))


@dataclass(frozen=True)
class KMatrixSearch:
    """One search's K matrix, its EWIF, how many K matrices it scored, and its seconds."""

    K: list
    ewif: float
    evaluations: int
    method: str
    seconds: float


@dataclass(frozen=True)
class SingleDrafter:
    """The best single drafter (1-based), its best k and EWIF."""

    drafter: int
    k: int
    ewif: float


@dataclass
class KMatrixReport:
    """What ``optimize kmatrix`` reports: the acceptance matrix A, the costs (target first),
    the exact optimum, the halving grid search and the best single drafter."""

    A: list
    costs: list[float]
    exact: KMatrixSearch
    grid: KMatrixSearch
    best_single_drafter: SingleDrafter
    cost_from: dict | None = None  #: hardware-priced costs: what priced them (the engine, the hardware), in the JSON too

    def to_dict(self) -> dict:
        return {k: v for k, v in as_dict(self).items() if k != "cost_from" or v is not None}


@dataclass(frozen=True)
class FixedK:
    """The best fixed draft length and its latency per token."""

    k: int
    latency_per_token: float


@dataclass(frozen=True)
class BestThreshold:
    """The best threshold h on P(at least one rejection) and its latency per token."""

    h: float
    latency_per_token: float


@dataclass(frozen=True)
class ThresholdComparison:
    """Latency per token (in target calls) of the MDP optimum, the best fixed k, the best
    threshold, the oracle (SpecDec++ Theorem 4.1) and autoregressive decoding
    (:func:`draftsim.sim.mdp.compare_policies`)."""

    optimal: float
    best_fixed_k: FixedK
    best_threshold: BestThreshold
    oracle: float
    autoregressive: float
    optimal_threshold_structure: dict


@dataclass
class ThresholdReport:
    """What ``optimize threshold`` reports: the comparison, h* against t_draft/t_target, the
    noisy predictor's solve (or None) and the problem solved (regimes, times, hardware costs)."""

    comparison: ThresholdComparison
    h_star: list[dict]
    noisy_predictor: dict | None
    alphas: list[float]
    t_draft: float
    t_target: float
    cost_from: dict | None = None

    def to_dict(self) -> dict:
        out = {"comparison": as_dict(self.comparison), "h_star": self.h_star, "noisy_predictor": self.noisy_predictor}
        if self.cost_from is not None:  # what priced the times (the engine, the hardware), as the text's first line says
            out["cost_from"] = self.cost_from
        return out


@dataclass(frozen=True)
class TreeSummary:
    """The optimal token tree: parent of each node (−1 = root), size, depth, expected accepted
    tokens per round, verification cost, tokens per unit time, and the DP's seconds."""

    parents: list[int]
    size: int
    depth: int
    expected_accepted: float
    cost: float
    tokens_per_time: float
    seconds: float


@dataclass(frozen=True)
class ChainSummary:
    """The best chain of the same budget: length, expected accepted tokens, cost, tokens per time."""

    length: int
    expected_accepted: float
    cost: float
    tokens_per_time: float


@dataclass
class TreeReport:
    """What ``optimize tree`` reports, and the problem solved (rank acceptance, the verification
    cost's description, the draft cost per level, nodes per depth)."""

    tree: TreeSummary
    best_chain: ChainSummary
    ranks: list[float]
    verify: str
    draft_cost: float
    widths: list[int]

    def to_dict(self) -> dict:
        return {"tree": as_dict(self.tree), "best_chain": as_dict(self.best_chain)}


#: ``optimize``'s subcommands: configuration class of each.
OPTIMIZE_CONFIGS = {"kmatrix": KMatrixConfig, "threshold": ThresholdConfig, "tree": TreeConfig}


def register(sub, common) -> None:
    p = sub.add_parser("optimize", help=summary("optimize"),
                       description="Optimise a policy and compare it with baselines and bounds.")
    osub = p.add_subparsers(dest="what", metavar="WHAT", required=True)

    k = osub.add_parser("kmatrix", parents=[common], help="the EWIF-optimal K matrix of Cascade Speculative Drafting",
                        description="Exact search (n <= 3 drafters, entries <= 20) against the halving grid search.")
    add_options(k, KMatrixConfig, HARDWARE_TITLES)
    k.set_defaults(run=run_kmatrix)

    t = osub.add_parser("threshold", parents=[common], help="SpecDec++: the optimal stopping policy, best threshold, best k, oracle",
                        description="Solve the draft-length MDP exactly and compare with the best fixed k, the best "
                        "threshold on P(at least one rejection) and the oracle; sweep t_draft/t_target for h*.")
    add_options(t, ThresholdConfig, HARDWARE_TITLES)
    t.set_defaults(run=run_threshold)

    r = osub.add_parser("tree", parents=[common], help="the token tree maximising accepted tokens per unit time",
                        description="Sequoia-style DP over token trees against the best chain of the same budget.")
    add_options(r, TreeConfig, HARDWARE_TITLES)
    r.set_defaults(run=run_tree)


def _system(config: KMatrixConfig) -> tuple[np.ndarray, list[float], dict | None]:
    costs, info, _ = config.coefficients_or_hardware(config.cost)
    size = len(costs) + 1
    A = np.tril(np.full((size, size), config.alpha), k=-1)
    for src, dst, val in parse_pairs(config.pair, size):
        A[src, dst] = val
    return A, costs, info


def optimize_kmatrix(config: KMatrixConfig, bar=null_bar) -> KMatrixReport:
    """The exact EWIF-optimal K matrix against the halving grid search and the best single drafter."""
    check(config)
    A, costs, info = _system(config)
    n = len(costs)
    if n > 3:
        raise DraftsimError(f"the exact search handles up to 3 drafters; got {n}")
    lower = (config.k_max + 1) ** (n * (n - 1) // 2)
    t0 = time.perf_counter()
    with bar(lower, "lower configurations") as b:
        exact = optimize.kmatrix_exact(A, costs, config.k_max, progress=b.update)
    t_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    grid = optimize.kmatrix_grid(A, costs, config.k_max)
    t_grid = time.perf_counter() - t0
    singles = [(j, *analytic.optimal_k(A[j, 0], costs[j - 1], config.k_max)) for j in range(1, n + 1)]
    best_single = max(singles, key=lambda s: s[2])
    return KMatrixReport(A.tolist(), [1.0] + costs, KMatrixSearch(**exact.to_dict(), seconds=t_exact),
                         KMatrixSearch(**grid.to_dict(), seconds=t_grid),
                         SingleDrafter(best_single[0], int(best_single[1]), float(best_single[2])), info)


def run_kmatrix(args: argparse.Namespace) -> int:
    config = from_namespace(KMatrixConfig, args)
    out = optimize_kmatrix(config, count_bar)
    if args.json:
        a.emit_json(out.to_dict())
        return 0
    exact, grid, best = out.exact, out.grid, out.best_single_drafter
    costs = out.costs[1:]
    if out.cost_from:
        print(describe_coefficients(out.cost_from))
    print(f"K-matrix optimisation: {len(costs)} drafters, costs {costs}, entries 0..{config.k_max}")
    rows = [
        ["exact search (optimum)", exact.ewif, exact.evaluations, f"{exact.seconds:.3f}", str(exact.K)],
        ["halving grid search (baseline)", grid.ewif, grid.evaluations, f"{grid.seconds:.3f}", str(grid.K)],
        [f"best single drafter (d{best.drafter}, k={best.k})", best.ewif, config.k_max + 1, "-", "-"],
    ]
    print(format_table(["method", "EWIF", "evaluations", "seconds", "K"], rows))
    gap = exact.ewif / grid.ewif - 1
    print(f"the grid search is {gap:.2%} below the optimum" if gap > 1e-12 else "the grid search found the optimum")
    return 0


#: Time and memory of the draft-length MDP, measured on a 2-core x86 machine with
#: ``mdp.solve_markov`` over 1..5 regimes and k_max up to 256 (11-23 µs per (state, regime),
#: about 200 B each, plus ~5 ms a solve) and ``draftsim optimize threshold --pred-noise 1``
#: (0.3-0.7 µs and ~130 B per (symbol history, regime pair), 4 symbols, 22 solves).
SOLVE_OVERHEAD_S, STATE_S, STATE_BYTES = 5e-3, 25e-6, 300.0
HISTORY_S, HISTORY_BYTES, NOISY_SOLVES, NOISY_BINS, NOISY_K_MAX = 0.7e-6, 200.0, 22, 4, 10
#: :func:`draftsim.sim.mdp.solve_noisy_markov` refuses more (regimes x symbol histories) than this.
NOISY_HISTORIES_MAX = 4_000_000


def threshold_work(regimes: int, k_max: int, sweep_points: int, noisy: bool) -> tuple[float, float]:
    """Estimated (seconds, bytes) of ``optimize threshold``: the optimum, every fixed k, 101
    thresholds and the sweep, each an exact solve over C(k_max + R, R) * R states."""
    states = math.comb(k_max + regimes, regimes) * regimes
    solves = 1 + (k_max + 1) + 101 + sweep_points
    seconds, nbytes = solves * (SOLVE_OVERHEAD_S + states * STATE_S), states * STATE_BYTES
    if noisy:
        k = min(k_max, NOISY_K_MAX)
        histories = (NOISY_BINS ** (k + 1) - 1) // (NOISY_BINS - 1)
        seconds += NOISY_SOLVES * histories * regimes**2 * HISTORY_S
        nbytes = max(nbytes, histories * regimes * HISTORY_BYTES)
    return seconds, nbytes


def parse_sweep(text: str) -> tuple[float, float, int]:
    """``LO,HI,N``: N values of t_draft/t_target from LO to HI (geometric), 0 < LO <= HI."""
    lo, hi, n = float_list("--sweep", text, count=3)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise DraftsimError(f"--sweep {text!r}: need 0 < LO <= HI (finite ratios t_draft/t_target); got LO {lo:g}, HI {hi:g}")
    if not (n == int(n) and 1 <= n <= 1_000_000):
        raise DraftsimError(f"--sweep {text!r}: N must be an integer in [1, 1000000]; got {n:g}")
    if lo == hi and n > 1:
        raise DraftsimError(f"--sweep {text!r}: LO equals HI, so N must be 1; got {int(n)}")
    return lo, hi, int(n)


def threshold_problem(config: ThresholdConfig):
    """The regimes' acceptance, their transition matrix, the h* sweep (LO, HI, N), the draft
    and target times and the hardware costs' description (or None) of an ``optimize
    threshold`` configuration, every option checked (time and memory budget too) before any
    solve — the checks ``draftsim sweep`` runs on every point up front."""
    check(config)
    t_draft, t_target, info = config.t_draft, config.t_target, None
    if config.uses_hardware():  # replaces --t-draft/--t-target: one-token calls on the hardware, in seconds
        _, info = config.priced(1)
        t_target = info["target_seconds"]
        t_draft = info["coefficients"][0] * t_target
    else:
        config.refuse_unused_pricing("--t-draft/--t-target")
    if (config.alpha is None) == (config.markov is None):
        raise DraftsimError("give exactly one of --alpha or --markov")
    if config.stay is not None and config.markov is None:
        raise DraftsimError(f"--stay {config.stay!r} applies to --markov only")
    if config.markov:
        alphas = as_probability("--markov", float_list("--markov", config.markov, minimum=2)).tolist()
        stay = as_probability("--stay", float_list("--stay", config.stay)).tolist() if config.stay is not None else [0.95] * len(alphas)
        if len(stay) != len(alphas):
            raise DraftsimError(f"--stay needs one value per --markov regime ({len(alphas)}); got {len(stay)} in {config.stay!r}")
        T = [[s if i == j else (1 - s) / (len(alphas) - 1) for j in range(len(alphas))] for i, s in enumerate(stay)]
    else:
        alphas, T = [config.alpha], [[1.0]]
    lo, hi, n = parse_sweep(config.sweep)
    if config.pred_noise is not None:
        k_noisy = min(config.k_max, NOISY_K_MAX)
        if len(alphas) * NOISY_BINS**k_noisy > NOISY_HISTORIES_MAX:
            fits = max(k for k in range(1, NOISY_K_MAX + 1) if len(alphas) * NOISY_BINS**k <= NOISY_HISTORIES_MAX)
            raise DraftsimError(f"--pred-noise with {len(alphas)} regimes and --k-max {config.k_max} solves over {len(alphas)} x "
                                f"{NOISY_BINS}^{k_noisy} symbol histories, more than {NOISY_HISTORIES_MAX:,}: give --k-max {fits} or less")
    seconds, nbytes = threshold_work(len(alphas), config.k_max, n, config.pred_noise is not None)
    a.check_budget(f"optimize threshold with {len(alphas)} regime(s), --k-max {config.k_max} and {n:,} sweep points", seconds, nbytes,
                   "use fewer sweep points, a smaller --k-max or fewer regimes")
    return alphas, T, (lo, hi, n), (t_draft, t_target), info


def optimize_threshold(config: ThresholdConfig, bar=null_bar) -> ThresholdReport:
    """The draft-length MDP solved exactly against the best fixed k, the best threshold and the
    oracle; h* against t_draft/t_target; with --pred-noise the noisy predictor's solve too."""
    alphas, T, (lo, hi, n), (t_draft, t_target), info = threshold_problem(config)
    ratios = np.geomspace(lo, hi, n)
    thresholds = np.linspace(0.0, 1.0, 101)
    with bar(1 + len(ratios), "solving") as b:
        cmp = mdp.compare_policies(T, alphas, t_draft, t_target, config.k_max, thresholds)
        b.update(1)
        sweep = []
        for ratio in ratios:
            sol = mdp.solve_markov(T, alphas, ratio * t_target, t_target, config.k_max)
            sweep.append({"t_draft/t_target": float(ratio), "latency_per_token": sol.latency_per_token, **sol.threshold})
            b.update(1)
    noisy = None
    if config.pred_noise is not None:
        E, values = mdp.predictor_emission(T, alphas, config.pred_noise, 4)
        k_noisy = min(config.k_max, 10)
        opt = mdp.solve_noisy_markov(T, alphas, E, values, t_draft, t_target, k_noisy)
        best_h = min((mdp.solve_noisy_markov(T, alphas, E, values, t_draft, t_target, k_noisy, ("threshold", float(h)))
                      for h in np.linspace(0, 1, 21)), key=lambda s: s.latency_per_token)
        noisy = {"k_max": k_noisy, "optimal": opt.latency_per_token,
                 "best_threshold": {"h": float(best_h.policy.split()[1]), "latency_per_token": best_h.latency_per_token},
                 "threshold_structure": opt.threshold}
    return ThresholdReport(typed(ThresholdComparison, cmp), sweep, noisy, alphas, t_draft, t_target, info)


def run_threshold(args: argparse.Namespace) -> int:
    config = from_namespace(ThresholdConfig, args)
    out = optimize_threshold(config, count_bar)
    if args.json:
        a.emit_json(out.to_dict())
        return 0
    cmp, noisy, sweep = out.comparison, out.noisy_predictor, out.h_star
    if out.cost_from:
        print(describe_coefficients(out.cost_from))
    print(f"draft-length MDP: regimes alpha={out.alphas}, t_draft={out.t_draft:g}, t_target={out.t_target:g}, k_max={config.k_max}")
    ar = cmp.autoregressive
    rows = [
        ["MDP optimum", cmp.optimal, ar / cmp.optimal],
        [f"best threshold (h={cmp.best_threshold.h:.2f})", cmp.best_threshold.latency_per_token, ar / cmp.best_threshold.latency_per_token],
        [f"best fixed k (k={cmp.best_fixed_k.k})", cmp.best_fixed_k.latency_per_token, ar / cmp.best_fixed_k.latency_per_token],
        ["oracle (Theorem 4.1)", cmp.oracle, ar / cmp.oracle],
        ["autoregressive", ar, 1.0],
    ]
    if noisy is not None:
        rows[1:1] = [
            [f"MDP optimum, noisy predictor (k_max {noisy['k_max']})", noisy["optimal"], ar / noisy["optimal"]],
            [f"best threshold, noisy predictor (h={noisy['best_threshold']['h']:.2f})", noisy["best_threshold"]["latency_per_token"],
             ar / noisy["best_threshold"]["latency_per_token"]],
        ]
    print(format_table(["policy", "latency/token", "speedup"], rows))
    st = cmp.optimal_threshold_structure
    print(f"optimal policy is {'a single' if st['is_threshold'] else 'not a single'} threshold on P(at least one rejection)"
          + ("" if st["is_threshold"] else "; per regime: " + ", ".join(
              f"regime {r}: {'threshold' if v['is_threshold'] else 'not threshold'} h* in ({_h(v['h_low'])}, {_h(v['h_high'])}]"
              for r, v in st["per_regime"].items())))
    print("\nh* against t_draft/t_target:")
    rows = [[f"{s['t_draft/t_target']:.4g}", s["latency_per_token"], "single" if s["is_threshold"] else "per regime", _intervals(s)] for s in sweep]
    print(format_table(["t_draft/t_target", "latency/token", "threshold", "h* (keep drafting while 1 - P <= h*)"], rows))
    return 0


def _intervals(structure: dict) -> str:
    if structure["is_threshold"]:
        return f"({_h(structure['h_low'])}, {_h(structure['h_high'])}]"
    return "; ".join(f"r{r} ({_h(v['h_low'])}, {_h(v['h_high'])}]" for r, v in structure["per_regime"].items())


def _h(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def optimize_tree(config: TreeConfig) -> TreeReport:
    """The token tree maximising tokens per unit time (Sequoia-style DP) against the best chain
    of the same budget; t(n) typed as A + B·n or, with the model/hardware options, the target's
    on the hardware in one-token calls (and the drafter's one-token call as the draft cost)."""
    check(config)
    ranks = as_probability("--rank-alphas", float_list("--rank-alphas", config.rank_alphas)).tolist()
    va, vb = float_list("--verify-cost", config.verify_cost, count=2)
    if not (math.isfinite(va) and math.isfinite(vb) and va > 0 and vb >= 0):
        raise DraftsimError(f"--verify-cost {config.verify_cost!r}: t(n) = A + B*n needs finite A > 0 and B >= 0; got A {va:g}, B {vb:g}")
    cost = lambda n: va + vb * n  # noqa: E731
    draft_cost, verify = config.draft_cost, f"t(n) = {va:g} + {vb:g} n"
    if config.uses_hardware():  # replaces --verify-cost/--draft-cost: the target's t(n) on the hardware, in one-token calls
        built, _ = config.priced(1)
        b, ctx = config.cost_batch, config.cost_context
        unit = float(built.target.shape_time(b, 1, ctx))
        cost = lambda n: float(built.target.shape_time(b, n, ctx)) / unit  # noqa: E731
        draft_cost = float(built.drafters[0].shape_time(b, 1, ctx)) / unit
        verify = "t(n) from the hardware (one-token call = 1)"
    else:
        config.refuse_unused_pricing("--verify-cost/--draft-cost")
    t0 = time.perf_counter()
    tree = optimize.tree_shape(ranks, config.budget, cost, draft_cost)
    seconds = time.perf_counter() - t0
    chain = max((optimize.chain_value(ranks, k, cost, draft_cost) for k in range(config.budget + 1)), key=lambda s: s.tokens_per_time)
    widths = np.bincount(tree.depths(), minlength=tree.depth() + 1)[1:]
    return TreeReport(TreeSummary(list(tree.parents), tree.size, tree.depth(), tree.expected_accepted, tree.cost, tree.tokens_per_time,
                                  seconds),
                      ChainSummary(chain.size, chain.expected_accepted, chain.cost, chain.tokens_per_time), ranks, verify, draft_cost,
                      [int(w) for w in widths])


def run_tree(args: argparse.Namespace) -> int:
    config = from_namespace(TreeConfig, args)
    out = optimize_tree(config)
    if args.json:
        a.emit_json(out.to_dict())
        return 0
    tree, chain = out.tree, out.best_chain
    print(f"token-tree shape: rank acceptance {out.ranks}, budget {config.budget}, {out.verify}, draft cost per level {out.draft_cost:.4g}")
    rows = [
        ["optimal tree", tree.size, tree.depth, tree.expected_accepted, tree.tokens_per_time],
        ["best chain", chain.length, chain.length, chain.expected_accepted, chain.tokens_per_time],
    ]
    print(format_table(["shape", "nodes", "depth", "E[accepted]", "tokens/time"], rows))
    print(f"tree over chain: {tree.tokens_per_time / chain.tokens_per_time:.3f}x  (DP took {tree.seconds:.3f} s)")
    print("nodes per depth:", " ".join(str(w) for w in out.widths))
    return 0
