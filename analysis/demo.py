"""The demo: an analytic plan for reference settings, and the planner's figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..sim import mdp, optimize
from ..sim.plan import PlannedDrafter, Strategy, plan, simulation_setting
from ..sim.predict import predicted_ewif
from ..sim.simulate import simulate
from . import figures


@dataclass(frozen=True)
class Setting:
    """A named what-if question: drafters (α by the target, cost c) and Max-Gram's α."""

    name: str
    drafters: tuple[PlannedDrafter, ...]
    mag_alpha: float | None = None


#: Reference settings: orders of magnitude seen in the papers (a 1/10- to 1/100-size draft
#: with α ≈ 0.6–0.85; Max-Gram at zero cost accepted ≈ 0.4–0.7 of the time by a drafter).
REFERENCE_SETTINGS = (
    Setting("cheap draft", (PlannedDrafter("small", 0.75, 0.05),)),
    Setting("expensive draft", (PlannedDrafter("medium", 0.85, 0.4),)),
    Setting(
        "two drafters + Max-Gram",
        (PlannedDrafter("medium", 0.85, 0.15), PlannedDrafter("small", 0.65, 0.02)),
        mag_alpha=0.55,
    ),
    Setting("code, Max-Gram friendly", (PlannedDrafter("small", 0.8, 0.08),), mag_alpha=0.75),
)


def confirm(setting: Setting, strategy: Strategy, tokens: int, seed: int = 0) -> dict:
    """Simulate a planned strategy (Monte Carlo) and hold it against its analytic EWIF."""
    policy, process, costs = simulation_setting(strategy, list(setting.drafters))
    result = simulate(policy, process, costs, tokens, seed=seed)
    est = result.metrics["ewif"]
    return {
        "setting": setting.name,
        "strategy": strategy.description,
        "analytic_ewif": predicted_ewif(policy, process, costs),
        "simulated_ewif": est.value,
        "se": est.se,
        "tokens": result.tokens,
    }


#: The demo's context-dependent workload: easy and hard stretches of text (SpecDec++'s case).
MARKOV_WORKLOAD = {"transition": [[0.95, 0.05], [0.2, 0.8]], "alphas": [0.95, 0.3]}
#: The demo's cascade: two neural drafters and Max-Gram (acceptance A[proposer, verifier]).
CASCADE = {
    "A": [[0, 0, 0, 0], [0.85, 0, 0, 0], [0.7, 0.75, 0, 0], [0.5, 0.55, 0.6, 0]],
    "costs": [0.15, 0.04, 0.0],
}


def optimisation_step(out_dir: Path, ratios=(0.01, 0.02, 0.05, 0.1, 0.2, 0.4), k_max: int = 32) -> dict:
    """The optimisers on the demo workloads: K matrix (exact vs grid), the MDP against the
    best threshold, best fixed k and oracle across cost ratios, and its figure."""
    A = np.array(CASCADE["A"])
    exact = optimize.kmatrix_exact(A, CASCADE["costs"], 12)
    grid = optimize.kmatrix_grid(A, CASCADE["costs"], 12)
    T, a = MARKOV_WORKLOAD["transition"], MARKOV_WORKLOAD["alphas"]
    thresholds = np.linspace(0.0, 1.0, 51)
    comparisons = [mdp.compare_policies(T, a, r, 1.0, k_max, thresholds) for r in ratios]
    sweep = [{"ratio": r, "structure": c["optimal_threshold_structure"]} for r, c in zip(ratios, comparisons)]
    fig = figures.threshold_vs_cost(Path(out_dir) / "threshold_vs_cost.png", sweep, comparisons)
    return {
        "kmatrix": {"exact": exact.to_dict(), "grid": grid.to_dict()},
        "mdp": [{"t_draft/t_target": r, **c} for r, c in zip(ratios, comparisons)],
        "figure": fig,
    }


def replay_step(trace_path=None, k_max: int = 8) -> dict:
    """Replay the embedded SmolLM2 trace (no torch needed) under several policies, with the
    cost coefficients measured when it was recorded, and the oracle beside them."""
    from ..sim.acceptance import TraceDriven
    from ..sim.cost.linear import Costs
    from ..sim.mdp import oracle_latency
    from ..sim.policies import ConfidenceStop, FixedK, Heuristic, VerticalCascade
    from ..sim.simulate import simulate
    from ..sim.traces import EMBEDDED_TRACE, Trace

    trace = Trace(trace_path or EMBEDDED_TRACE)
    s = trace.summary()
    rows = []
    for name in trace.drafters():
        (cost,) = trace.cost_coefficients([name])
        process = TraceDriven.from_trace(trace, [name], kind="flag")
        costs = Costs.coefficients([cost])
        results = {f"fixed:k={k}": simulate(FixedK(k), process, costs, 1) for k in range(1, k_max + 1)}
        best = max(results, key=lambda key: results[key].metrics["ewif"].value)
        chosen = {best: results[best], "heuristic": simulate(Heuristic(), process, costs, 1),
                  "confidence:tau=0.5": simulate(ConfidenceStop(0.5, k_max), process, costs, 1)}
        oracle = oracle_latency([f.astype(int) for f in trace.acceptance(name, "target", kind="flag")], max(cost, 1e-9), 1.0)
        for policy, r in chosen.items():
            rows.append({"drafter": name, "cost": cost, "policy": policy, "tokens_per_call": r.metrics["tokens_per_call"].value,
                         "ewif": r.metrics["ewif"].value, "oracle_speedup": oracle["speedup"]})
    names = trace.drafters()
    neural = [n for n in names if n not in ("maxgram", "bigram")]
    if neural and "maxgram" in names and (("maxgram", neural[0]) in trace.pairs()):
        costs = Costs.coefficients(trace.cost_coefficients([neural[0], "maxgram"]))
        process = TraceDriven.from_trace(trace, [neural[0], "maxgram"], kind="flag")
        r = simulate(VerticalCascade([[0, 3, 0], [0, 0, 4], [0, 0, 0]]), process, costs, 1)
        rows.append({"drafter": f"{neural[0]} < maxgram", "cost": float(costs.coefficient[1]), "policy": "vertical:n=3,k=4",
                     "tokens_per_call": r.metrics["tokens_per_call"].value, "ewif": r.metrics["ewif"].value,
                     # Theorem 4.1's oracle knows one drafter's acceptance; a cascade has none.
                     "oracle_speedup": None})
    return {"trace": str(trace.path), "sequences": s["sequences"], "tokens": s["output_tokens"], "rows": rows}


def real_step(n: int = 2, max_new_tokens: int = 48, prompts: str = "edit", k_max: int = 6) -> dict:
    """A short real run on the embedded model, of a case the planner predicts to pay, when
    torch, transformers and the SmolLM2 wheel are installed (``make test`` installs them);
    otherwise why not.

    Lookup drafting (vLLM's ``ngram``, suffix decoding) costs next to nothing, so it is what can
    pay on a CPU, where verifying k + 1 tokens costs more than a one-token step. The planner
    (:func:`draftsim.analysis.lookup.plan_lookup`) walks each lookup drafter along the target's
    greedy texts on ``n`` *train* prompts of ``prompts`` (code editing: answers that copy their
    prompt), prices the rounds with a profile of the target's calls on this machine, and picks
    the (drafter, k) with the best predicted speedup; that method is then measured against
    autoregressive decoding on ``n`` *test* prompts and replayed in the simulator. The result
    holds the measurement (:func:`draftsim.analysis.reality.held_to_sim`), the plan, the
    prediction for the run's own rounds and the reasons (:func:`draftsim.analysis.lookup.why`)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        from ..realrun.models import locate_smollm2_gguf

        locate_smollm2_gguf()
    except Exception as exc:  # any missing piece: the demo still runs without real models
        return {"skipped": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    from ..realrun.compare import measure
    from ..realrun.methods import method_from
    from ..realrun.models import load_model
    from ..realrun.prompts import prompt_set
    from .lookup import plan_lookup, predict_run, run_pilot, why
    from .reality import held_to_sim

    target = load_model("smollm2", device="cpu")
    pilot = run_pilot(target, prompt_set(prompts, "train", n), max_new_tokens, k_max)
    plan = plan_lookup(target, pilot, ks=range(1, k_max + 1))
    best = plan.best
    m = measure(target, method_from("sd", target, best.drafter, f"fixed:k={best.k}", None), prompt_set(prompts, "test", n), max_new_tokens)
    out = held_to_sim(m)
    predicted_on_run = predict_run(pilot, m.trace)
    rounds = m.trace.rounds.to_pydict()
    out.update({"prompt_set": prompts, "plan": plan.to_dict(), "predicted_speedup": best.speedup,
                "predicted_speedup_on_run": predicted_on_run, "proposing_rounds": sum(1 for d in rounds["drafted"] if d)})
    out["why"] = why(out, predicted_on_run, best, pilot)
    return out


def run_demo(out_dir: Path, k_max: int = 32, sim_tokens: int = 200_000, real: bool = True) -> dict:
    """Plan every reference setting, confirm the two best strategies of each by simulation,
    and write the figures to ``out_dir``.

    Returns ``{"settings": [(Setting, [Strategy, ...]), ...], "simulations": [...],
    "figures": [Path, ...]}``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    planned: list[tuple[Setting, list[Strategy]]] = [
        (s, plan(list(s.drafters), mag_alpha=s.mag_alpha, k_max=k_max)) for s in REFERENCE_SETTINGS
    ]
    simulations = [confirm(s, st, sim_tokens) for s, strategies in planned for st in strategies[:2] if st.kind != "autoregressive"]
    written = [
        figures.ewif_vs_k(out_dir / "ewif_vs_k.png"),
        figures.optimal_k_map(out_dir / "optimal_k_map.png"),
    ]
    optimisation = optimisation_step(out_dir)
    replay = replay_step()
    written.append(optimisation["figure"])
    from .loadstudy import serving_study

    serving = serving_study(out_dir)
    written.append(Path(serving["figure"]))
    real_run = real_step() if real else {"skipped": "by request (--no-real)", "by_request": True}
    return {"settings": planned, "simulations": simulations, "optimisation": optimisation, "replay": replay,
            "serving": serving, "real": real_run, "figures": written}
