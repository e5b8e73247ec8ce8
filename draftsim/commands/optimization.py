"""``draftsim optimize kmatrix|threshold|tree``: optima, baselines and bounds."""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from draftsim.analysis.table import format_table
from draftsim.sim import analytic, mdp, optimize
from draftsim.sim.errors import DraftsimError, as_probability

from .. import args as a
from ..progress import count_bar
from . import costing
from .simulation import float_list, parse_pairs


def register(sub, common) -> None:
    p = sub.add_parser("optimize", help="find optimal K matrices, stopping thresholds and tree shapes",
                       description="Optimise a policy and compare it with baselines and bounds.")
    osub = p.add_subparsers(dest="target", metavar="WHAT", required=True)

    k = osub.add_parser("kmatrix", parents=[common], help="the EWIF-optimal K matrix of Cascade Speculative Drafting",
                        description="Exact search (n <= 3 drafters, entries <= 20) against the halving grid search.")
    k.add_argument("--cost", type=a.cost("cost"), action="append", help="cost coefficient of drafter 1, 2, ... (repeat; the last may be Max-Gram, 0; "
                   "or the model/hardware options)")
    costing.add_hardware_options(k)
    k.add_argument("--alpha", type=a.probability("alpha"), required=True, help="acceptance for every pair not given by --pair")
    k.add_argument("--pair", action="append", default=[], metavar="M:V=A", help="model M's tokens accepted by V with A (e.g. 3:1=0.55)")
    k.add_argument("--k-max", type=a.count("k_max", 0, optimize.EXACT_ENTRY_MAX), default=optimize.EXACT_ENTRY_MAX)
    k.set_defaults(run=run_kmatrix)

    t = osub.add_parser("threshold", parents=[common], help="SpecDec++: the optimal stopping policy, best threshold, best k, oracle",
                        description="Solve the draft-length MDP exactly and compare with the best fixed k, the best "
                        "threshold on P(at least one rejection) and the oracle; sweep t_draft/t_target for h*.")
    t.add_argument("--alpha", type=a.probability("alpha"), help="i.i.d. acceptance")
    t.add_argument("--markov", metavar="A1,A2,...", help="acceptance per hidden regime (observed by the drafter)")
    t.add_argument("--stay", metavar="P1,P2,...", help="probability of staying in each regime (default 0.95)")
    t.add_argument("--t-draft", type=a.positive("t_draft"), default=0.05, help="draft time per token (target call = --t-target)")
    t.add_argument("--t-target", type=a.positive("t_target"), default=1.0)
    t.add_argument("--k-max", type=a.count("k_max", 1, 128), default=32)
    t.add_argument("--sweep", metavar="LO,HI,N", default="0.01,0.5,8", help="t_draft/t_target values for the h* table")
    t.add_argument("--pred-noise", type=a.positive("pred_noise"), help="also solve with a noisy predictor (logit noise, 4 bins, k_max <= 10)")
    costing.add_hardware_options(t)
    t.set_defaults(run=run_threshold)

    r = osub.add_parser("tree", parents=[common], help="the token tree maximising accepted tokens per unit time",
                        description="Sequoia-style DP over token trees against the best chain of the same budget.")
    r.add_argument("--rank-alphas", required=True, metavar="A1,A2,...", help="P(candidate of rank r accepted | earlier ranks rejected)")
    r.add_argument("--budget", type=a.count("budget", 1, 4096), default=64, help="most drafted tokens in the tree")
    r.add_argument("--verify-cost", default="1,0.002", metavar="A,B", help="target time to verify n tokens: t(n) = A + B*n")
    r.add_argument("--draft-cost", type=a.cost("draft_cost"), default=0.0, help="drafter time per tree level")
    costing.add_hardware_options(r)
    r.set_defaults(run=run_tree)


def _system(args) -> tuple[np.ndarray, list[float]]:
    costs, args.cost_info = costing.coefficients_or_hardware(args, args.cost)
    size = len(costs) + 1
    A = np.tril(np.full((size, size), args.alpha), k=-1)
    for src, dst, val in parse_pairs(args.pair, size):
        A[src, dst] = val
    return A, costs


def run_kmatrix(args: argparse.Namespace) -> int:
    A, costs = _system(args)
    n = len(costs)
    if n > 3:
        raise DraftsimError(f"the exact search handles up to 3 drafters; got {n}")
    lower = (args.k_max + 1) ** (n * (n - 1) // 2)
    t0 = time.perf_counter()
    with count_bar(lower, "lower configurations") as bar:
        exact = optimize.kmatrix_exact(A, costs, args.k_max, progress=bar.update)
    t_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    grid = optimize.kmatrix_grid(A, costs, args.k_max)
    t_grid = time.perf_counter() - t0
    singles = [(j, *analytic.optimal_k(A[j, 0], costs[j - 1], args.k_max)) for j in range(1, n + 1)]
    best_single = max(singles, key=lambda s: s[2])
    out = {
        "A": A.tolist(),
        "costs": [1.0] + costs,
        "exact": {**exact.to_dict(), "seconds": t_exact},
        "grid": {**grid.to_dict(), "seconds": t_grid},
        "best_single_drafter": {"drafter": best_single[0], "k": int(best_single[1]), "ewif": float(best_single[2])},
    }
    if args.json:
        a.emit_json(out)
        return 0
    if args.cost_info:
        print(costing.describe_coefficients(args.cost_info))
    print(f"K-matrix optimisation: {n} drafters, costs {costs}, entries 0..{args.k_max}")
    rows = [
        ["exact search (optimum)", exact.ewif, exact.evaluations, f"{t_exact:.3f}", str(exact.K.tolist())],
        ["halving grid search (baseline)", grid.ewif, grid.evaluations, f"{t_grid:.3f}", str(grid.K.tolist())],
        [f"best single drafter (d{best_single[0]}, k={int(best_single[1])})", float(best_single[2]), args.k_max + 1, "-", "-"],
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


def threshold_problem(args: argparse.Namespace):
    """The regimes' acceptance, their transition matrix and the h* sweep (LO, HI, N) of a parsed
    ``optimize threshold`` command line, every option checked (time and memory budget too)
    before any solve — the checks ``draftsim sweep`` runs on every point up front."""
    if costing.uses_hardware(args):  # replaces --t-draft/--t-target: one-token calls on the hardware, in seconds
        (c,), info = costing.hardware_coefficients(args, 1)
        args.t_target, args.t_draft = info["target_seconds"], c * info["target_seconds"]
        args.cost_info = info
    if (args.alpha is None) == (args.markov is None):
        raise DraftsimError("give exactly one of --alpha or --markov")
    if args.stay is not None and args.markov is None:
        raise DraftsimError(f"--stay {args.stay!r} applies to --markov only")
    if args.markov:
        alphas = as_probability("--markov", float_list("--markov", args.markov, minimum=2)).tolist()
        stay = as_probability("--stay", float_list("--stay", args.stay)).tolist() if args.stay is not None else [0.95] * len(alphas)
        if len(stay) != len(alphas):
            raise DraftsimError(f"--stay needs one value per --markov regime ({len(alphas)}); got {len(stay)} in {args.stay!r}")
        T = [[s if i == j else (1 - s) / (len(alphas) - 1) for j in range(len(alphas))] for i, s in enumerate(stay)]
    else:
        alphas, T = [args.alpha], [[1.0]]
    lo, hi, n = parse_sweep(args.sweep)
    if args.pred_noise is not None:
        k_noisy = min(args.k_max, NOISY_K_MAX)
        if len(alphas) * NOISY_BINS**k_noisy > NOISY_HISTORIES_MAX:
            fits = max(k for k in range(1, NOISY_K_MAX + 1) if len(alphas) * NOISY_BINS**k <= NOISY_HISTORIES_MAX)
            raise DraftsimError(f"--pred-noise with {len(alphas)} regimes and --k-max {args.k_max} solves over {len(alphas)} x "
                                f"{NOISY_BINS}^{k_noisy} symbol histories, more than {NOISY_HISTORIES_MAX:,}: give --k-max {fits} or less")
    seconds, nbytes = threshold_work(len(alphas), args.k_max, n, args.pred_noise is not None)
    a.check_budget(f"optimize threshold with {len(alphas)} regime(s), --k-max {args.k_max} and {n:,} sweep points", seconds, nbytes,
                   "use fewer sweep points, a smaller --k-max or fewer regimes")
    return alphas, T, (lo, hi, n)


def run_threshold(args: argparse.Namespace) -> int:
    alphas, T, (lo, hi, n) = threshold_problem(args)
    ratios = np.geomspace(lo, hi, n)
    thresholds = np.linspace(0.0, 1.0, 101)
    with count_bar(1 + len(ratios), "solving") as bar:
        cmp = mdp.compare_policies(T, alphas, args.t_draft, args.t_target, args.k_max, thresholds)
        bar.update(1)
        sweep = []
        for ratio in ratios:
            sol = mdp.solve_markov(T, alphas, ratio * args.t_target, args.t_target, args.k_max)
            sweep.append({"t_draft/t_target": float(ratio), "latency_per_token": sol.latency_per_token, **sol.threshold})
            bar.update(1)
    noisy = None
    if args.pred_noise is not None:
        E, values = mdp.predictor_emission(T, alphas, args.pred_noise, 4)
        k_noisy = min(args.k_max, 10)
        opt = mdp.solve_noisy_markov(T, alphas, E, values, args.t_draft, args.t_target, k_noisy)
        best_h = min((mdp.solve_noisy_markov(T, alphas, E, values, args.t_draft, args.t_target, k_noisy, ("threshold", float(h))) for h in np.linspace(0, 1, 21)),
                     key=lambda s: s.latency_per_token)
        noisy = {"k_max": k_noisy, "optimal": opt.latency_per_token, "best_threshold": {"h": float(best_h.policy.split()[1]), "latency_per_token": best_h.latency_per_token},
                 "threshold_structure": opt.threshold}
    out = {"comparison": cmp, "h_star": sweep, "noisy_predictor": noisy}
    if args.json:
        a.emit_json(out)
        return 0
    if getattr(args, "cost_info", None):
        print(costing.describe_coefficients(args.cost_info))
    print(f"draft-length MDP: regimes alpha={alphas}, t_draft={args.t_draft:g}, t_target={args.t_target:g}, k_max={args.k_max}")
    ar = cmp["autoregressive"]
    rows = [
        ["MDP optimum", cmp["optimal"], ar / cmp["optimal"]],
        [f"best threshold (h={cmp['best_threshold']['h']:.2f})", cmp["best_threshold"]["latency_per_token"], ar / cmp["best_threshold"]["latency_per_token"]],
        [f"best fixed k (k={cmp['best_fixed_k']['k']})", cmp["best_fixed_k"]["latency_per_token"], ar / cmp["best_fixed_k"]["latency_per_token"]],
        ["oracle (Theorem 4.1)", cmp["oracle"], ar / cmp["oracle"]],
        ["autoregressive", ar, 1.0],
    ]
    if noisy is not None:
        rows[1:1] = [
            [f"MDP optimum, noisy predictor (k_max {noisy['k_max']})", noisy["optimal"], ar / noisy["optimal"]],
            [f"best threshold, noisy predictor (h={noisy['best_threshold']['h']:.2f})", noisy["best_threshold"]["latency_per_token"], ar / noisy["best_threshold"]["latency_per_token"]],
        ]
    print(format_table(["policy", "latency/token", "speedup"], rows))
    st = cmp["optimal_threshold_structure"]
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


def run_tree(args: argparse.Namespace) -> int:
    ranks = as_probability("--rank-alphas", float_list("--rank-alphas", args.rank_alphas)).tolist()
    va, vb = float_list("--verify-cost", args.verify_cost, count=2)
    if not (math.isfinite(va) and math.isfinite(vb) and va > 0 and vb >= 0):
        raise DraftsimError(f"--verify-cost {args.verify_cost!r}: t(n) = A + B*n needs finite A > 0 and B >= 0; got A {va:g}, B {vb:g}")
    cost = lambda n: va + vb * n  # noqa: E731
    if costing.uses_hardware(args):  # replaces --verify-cost/--draft-cost: the target's t(n) on the hardware, in one-token calls
        target, drafters, info = costing.hardware_times(args, 1)
        b, ctx = args.cost_batch, args.cost_context
        unit = float(target.shape_time(b, 1, ctx))
        cost = lambda n: float(target.shape_time(b, n, ctx)) / unit  # noqa: E731
        args.draft_cost = float(drafters[0].shape_time(b, 1, ctx)) / unit
    t0 = time.perf_counter()
    tree = optimize.tree_shape(ranks, args.budget, cost, args.draft_cost)
    seconds = time.perf_counter() - t0
    chain = max((optimize.chain_value(ranks, k, cost, args.draft_cost) for k in range(args.budget + 1)), key=lambda s: s.tokens_per_time)
    out = {
        "tree": {"parents": list(tree.parents), "size": tree.size, "depth": tree.depth(), "expected_accepted": tree.expected_accepted,
                 "cost": tree.cost, "tokens_per_time": tree.tokens_per_time, "seconds": seconds},
        "best_chain": {"length": chain.size, "expected_accepted": chain.expected_accepted, "cost": chain.cost, "tokens_per_time": chain.tokens_per_time},
    }
    if args.json:
        a.emit_json(out)
        return 0
    verify = "t(n) from the hardware (one-token call = 1)" if costing.uses_hardware(args) else f"t(n) = {va:g} + {vb:g} n"
    print(f"token-tree shape: rank acceptance {ranks}, budget {args.budget}, {verify}, draft cost per level {args.draft_cost:.4g}")
    rows = [
        ["optimal tree", tree.size, tree.depth(), tree.expected_accepted, tree.tokens_per_time],
        ["best chain", chain.size, chain.size, chain.expected_accepted, chain.tokens_per_time],
    ]
    print(format_table(["shape", "nodes", "depth", "E[accepted]", "tokens/time"], rows))
    print(f"tree over chain: {tree.tokens_per_time / chain.tokens_per_time:.3f}x  (DP took {seconds:.3f} s)")
    widths = np.bincount(tree.depths(), minlength=tree.depth() + 1)[1:]
    print("nodes per depth:", " ".join(str(int(w)) for w in widths))
    return 0

