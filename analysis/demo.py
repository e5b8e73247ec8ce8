"""The demo: an analytic plan for reference settings, and the planner's figures."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..sim import mdp, optimize
from ..sim.cost.assembly import Deployment, assemble
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


def _interleaved_prediction(trace, prompts, ar_calls, slices: list[list[float]], overhead: float) -> dict:
    """The run's speedup predicted from the profiles taken between its prompts: prompt i's rounds
    (what greedy lookup drafting did, as the trace recorded them) and its autoregressive twin's
    decoding steps priced with the mean of the profiles taken just before and just after that
    prompt's pair of runs (``slices[i]``, ``slices[i + 1]``: seconds of a call verifying 1, 2, …
    tokens), plus the executor's own seconds per round (``overhead``, the pilot's); each run's
    prefill and lookups as measured."""
    ar_pred = spec_pred = 0.0
    for i, prompt in enumerate(prompts):
        t = (np.asarray(slices[i]) + np.asarray(slices[i + 1])) / 2
        key = f"{prompt.set}-{prompt.id}"
        calls = trace.records("calls", key)
        prefill = sum(c.seconds for c in calls if c.kind == "prefill")
        lookup = sum(c.seconds for c in calls if c.model != 0)
        spec_pred += prefill + lookup + sum(t[r.drafted] + overhead for r in trace.records("rounds", key))
        ar_prefill = sum(c.seconds for c in ar_calls[i] if c.kind == "prefill")
        ar_pred += ar_prefill + sum(t[0] + overhead for c in ar_calls[i] if c.kind != "prefill")
    return {"autoregressive_seconds": ar_pred, "speculative_seconds": spec_pred, "speedup": ar_pred / spec_pred}


#: Torch threads of the real run. With two threads on two cores, every operator waits for both,
#: and a machine shared with other work descheduled one of them often enough to make a one-token
#: call of SmolLM2 take 2 s instead of 0.04 s (measured under a load average of 7: median 2.0 s
#: with two threads, 0.13-0.17 s with one); with one thread a busy machine slows the run by its
#: share of the cores, and alike for both methods.
THREADS = 1

#: Above this relative error the demo says what its prediction leaves out.
EXPLAIN_ABOVE = 0.25


def real_step(n: int = 3, max_new_tokens: int = 48, prompts: str = "edit", k_max: int = 6, pilot_prompts: int = 2,
              repeats: int = 3, log=None) -> dict:
    """A short real run on the embedded model, of a case the planner predicts to pay, when
    torch, transformers and the SmolLM2 wheel are installed (``make test`` installs them);
    otherwise why not.

    Lookup drafting (vLLM's ``ngram``, suffix decoding) costs next to nothing, so it is what can
    pay on a CPU, where verifying k + 1 tokens costs more than a one-token step. The planner
    (:func:`draftsim.analysis.lookup.plan_lookup`) walks each lookup drafter along the target's
    greedy texts on ``pilot_prompts`` *train* prompts of ``prompts`` (code editing: answers that
    copy their prompt), prices the rounds with a profile of the target's calls on this machine,
    and picks the (drafter, k) with the best predicted speedup. That method is then measured
    against autoregressive decoding on ``n`` *test* prompts, the two alternating prompt by prompt
    (:func:`draftsim.realrun.compare.measure`), and the target's calls verifying 1 … k + 1 tokens
    are profiled before the first prompt and after each (``repeats`` rounds over the sizes): each
    prompt's runs are priced by the profiles on either side of them
    (:func:`_interleaved_prediction`), so a machine that slows down or speeds up during the run
    moves prediction and measurement together. The result holds the measurement
    (:func:`draftsim.analysis.reality.held_to_sim`), the plan, the planner's forecast, the
    interleaved prediction (``interleaved``) and the reasons (``why``). Torch runs on
    :data:`THREADS` thread(s) meanwhile (``threads``). ``log(message)`` is told as each stage
    starts."""
    say = log or (lambda message: None)
    try:
        import torch
        import transformers  # noqa: F401

        from ..realrun.models import locate_smollm2_gguf

        locate_smollm2_gguf()
    except Exception as exc:  # any missing piece: the demo still runs without real models
        return {"skipped": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    from ..realrun.compare import measure
    from ..realrun.executor import generate
    from ..realrun.methods import method_from
    from ..realrun.models import load_model
    from ..realrun.profiling import profile_model
    from ..realrun.prompts import format_prompt, prompt_set
    from .lookup import plan_lookup, run_pilot, why
    from .reality import held_to_sim

    threads = torch.get_num_threads()
    used = min(threads, THREADS)
    torch.set_num_threads(used)  # for this run only: restored below
    try:
        say("real run: loading SmolLM2-135M")
        target = load_model("smollm2", device="cpu")
        say(f"real run: pilot, the target's greedy text on {pilot_prompts} train prompts and a profile of its calls verifying 1-{k_max + 1} tokens")
        train = prompt_set(prompts, "train", pilot_prompts)
        generate(target, format_prompt(train[0], target.tokenizer), 2)  # a process's first calls are slow: kept out of the pilot's times
        pilot = run_pilot(target, train, max_new_tokens, k_max, repeats=repeats, progress=lambda what: say(f"real run: pilot: {what}"))
        plan = plan_lookup(target, pilot, ks=range(1, k_max + 1))
        best = plan.best
        test = prompt_set(prompts, "test", n)
        context = int(np.mean([len(format_prompt(p, target.tokenizer)) + max_new_tokens / 2 for p in test]))
        sizes = list(range(1, best.k + 2))

        slices: list[list[float]] = []

        def profile_now(_=None) -> None:
            prof = profile_model(target, [1], sizes, [context], repeats=repeats, last_row=False)  # verify calls keep every row
            slices.append([float(prof.shape_time(1, s, context)) for s in sizes])
            if len(slices) <= n:
                say(f"real run: prompt {len(slices)}/{n}: autoregressive, then {best.drafter} k={best.k}, then a profile")

        say(f"real run: the planner picked {best.drafter} k={best.k} (forecast {best.speedup:.2f}x); measuring it on {n} test prompts, "
            "alternating with autoregressive decoding and profiling the target between prompts")
        profile_now()
        m = measure(target, method_from("sd", target, best.drafter, f"fixed:k={best.k}", None), test, max_new_tokens, progress=profile_now)
        out = held_to_sim(m)
        pred = _interleaved_prediction(m.trace, test, m.autoregressive_calls, slices, pilot.overhead)
        ar_measured = m.tokens / m.autoregressive_tokens_per_second
        spec_measured = m.tokens / m.tokens_per_second
        one = [s[0] for s in slices]
        interleaved = {
            "profiles": len(slices), "context": context, "repeats": repeats, "verify_seconds": slices,
            "predicted_speedup": pred["speedup"], "measured_speedup": m.speedup, "error": m.speedup / pred["speedup"] - 1,
            "autoregressive_error": ar_measured / pred["autoregressive_seconds"] - 1,
            "speculative_error": spec_measured / pred["speculative_seconds"] - 1,
            "one_token_seconds_range": [min(one), max(one)],
            # a call verifying k + 1 tokens against a one-token step, in these profiles and in the pilot's
            "verify_ratio": float(np.mean([s[best.k] / s[0] for s in slices])), "pilot_verify_ratio": pilot.verify[best.k] / pilot.verify[0],
            "forecast": best.speedup, "forecast_error": m.speedup / best.speedup - 1,
        }
        rounds = m.trace.rounds.to_pydict()
        out.update({"prompt_set": prompts, "plan": plan.to_dict(), "predicted_speedup": best.speedup,
                    "predicted_speedup_on_run": pred["speedup"], "interleaved": interleaved,
                    "proposing_rounds": sum(1 for d in rounds["drafted"] if d)})
        out["why"] = why(out, 0.0, best, pilot) + explain(interleaved)  # 0.0: the interleaved prediction is explained below
    finally:
        torch.set_num_threads(threads)
    out["threads"] = used
    return out


def explain(interleaved: dict, above: float = EXPLAIN_ABOVE) -> list[str]:
    """Sentences on what separates prediction from measurement when they differ by more than
    ``above``: for the planner's forecast (``forecast_error``, when given), the cost of a verifying
    call in its profile against the profiles beside the run; for the interleaved prediction, which
    of the two runs the profiles mispriced, whether the machine's speed moved during the run, and
    what the prediction leaves out."""
    lines = []
    f = interleaved.get("forecast_error")
    if f is not None and abs(f) > above:
        lines.append(f"the planner's forecast ({interleaved['forecast']:.2f}x) is {f:+.0%} off: its profile, taken before the run, "
                     f"priced a verifying call at {interleaved['pilot_verify_ratio']:.2f}x a one-token step, the profiles beside "
                     f"the run at {interleaved['verify_ratio']:.2f}x")
    e = interleaved["error"]
    if abs(e) <= above:
        return lines
    lo, hi = interleaved["one_token_seconds_range"]
    lines.append(f"prediction and measurement differ by {e:+.0%}: the autoregressive runs took {interleaved['autoregressive_error']:+.0%} "
                 f"and the speculative ones {interleaved['speculative_error']:+.0%} against their calls as profiled beside them")
    if hi > (1 + above) * lo:
        lines.append(f"the machine's speed moved during the run (a one-token call took {lo * 1e3:.0f}-{hi * 1e3:.0f} ms across "
                     f"the {interleaved['profiles']} profiles): load that fell on one run and not on the profiles around it "
                     "is not in the prediction (a quieter machine narrows it)")
    else:
        lines.append(f"the prediction prices every call at one context ({interleaved['context']} tokens) and the executor's "
                     "own time per round as the pilot measured it; the runs' own contexts and Python time are not in it")
    return lines


class _Clock:
    """Progress lines for ``log``: each stage's start and end, with the time since the demo began."""

    def __init__(self, log):
        self.log, self.t0 = log, time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.log is not None:
            self.log(f"[{time.perf_counter() - self.t0:5.0f} s] {message}")

    @contextmanager
    def stage(self, name: str):
        t = time.perf_counter()
        self(f"{name} ...")
        yield
        self(f"{name}: done in {time.perf_counter() - t:.1f} s")


@contextmanager
def _no_bar(total: int, desc: str):
    class Silent:
        def update(self, n: int = 1) -> None:
            pass

    yield Silent()


#: The demo's sizes, each the least that shows its point (see :func:`run_demo`).
SIM_TOKENS = 100_000
SERVING_REQUESTS = 600


def serving_rows(serving: dict) -> list[dict]:
    """The serving study's rows, each with ``status``: "" where both servers reached their steady
    state (:mod:`draftsim.sim.serving.steady`), else per server "overloaded" (its queue grows: the
    row's latency is the run's and grows with its length) or "not settled" (the run was too short
    to tell)."""
    rows = []
    for r in serving["rows"]:
        said = [f"{name} {'overloaded' if r[f'{side}_overloaded'] else 'not settled'}"
                for name, side in (("speculative", "spec"), ("plain", "ar")) if not r[f"{side}_steady"]]
        rows.append({**r, "status": ", ".join(said)})
    return rows


#: The serving study's deployment: Llama-2-70B on four H100 SXM (tensor parallel) drafted by
#: Llama-2-7B on one device, priced by the bare roofline (engine none: no engine overheads), the
#: scheduler's limits those of :class:`draftsim.sim.serving.SchedulerConfig` (vLLM's names) and the
#: KV cache the devices' memory holds. Its outputs name each of these.
SERVING_DEPLOYMENT = Deployment("llama-2-70b", "h100-sxm", ("llama-2-7b",), tp=4, drafter_tp=1, overheads="none")
SERVING_QPS = (0.5, 1, 2, 4, 8, 16, 32)


def serving_study(out_dir=None, *, requests: int = 200, deployment: Deployment = SERVING_DEPLOYMENT, qps=SERVING_QPS,
                  seed: int = 0) -> dict:
    """The demo's serving study on ``deployment``: fixed k = 4 at Bernoulli α = 0.8, 512-token
    prompts and 256-token outputs, Poisson arrivals; a QPS sweep against no speculation, its
    crossover and one figure (``out_dir/serving_speedup.png`` when ``out_dir`` is given), each
    naming the engine, both models' tp and the scheduler's limits."""
    from ..sim import acceptance, policies
    from ..sim.serving import SchedulerConfig, ServingConfig, make_workload
    from ..sim.serving.workload import Fixed, Poisson
    from .loadstudy import crossover, speedup_vs_load, sweep_qps

    built = assemble(deployment)
    d0 = built.scheduler_defaults()  # the engine's own limits on this device, as serve-sim runs it
    scheduler = SchedulerConfig(max_num_seqs=d0.max_num_seqs, max_num_batched_tokens=d0.max_num_batched_tokens,
                                chunked_prefill=d0.chunked_prefill, block_size=d0.block_size)
    config = ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), built.target, list(built.drafters), scheduler=scheduler)

    def make(rng, q):
        return make_workload(arrivals=Poisson(), qps=q, requests=requests, duration=None, prompt=Fixed(512), output=Fixed(256), rng=rng)

    rows = sweep_qps(config, make, qps, seed=seed)
    cross = crossover(rows)
    d, engine = deployment, built.info["engine_label"]
    drafter_tp = d.drafter_tp or d.tp
    sched = config.scheduler
    out = {"pair": f"{d.target} (tp {d.tp}) / {d.drafters[0]} (tp {drafter_tp}) on {d.hardware}, engine {engine}",
           "target": d.target, "drafter": d.drafters[0], "hardware": d.hardware, "tp": d.tp, "drafter_tp": drafter_tp,
           "engine": built.engine.name, "engine_label": engine, "scheduler": f"max_num_seqs {sched.max_num_seqs}, max_num_batched_tokens {sched.max_num_batched_tokens:,}, "
                                          f"chunked prefill {'on' if sched.chunked_prefill else 'off'}, block {sched.block_size}",
           "policy": "fixed:k=4", "alpha": 0.8,
           "rows": [{**{k: r[k] for k in ("qps", "speedup", "tpot_speedup", "throughput_ratio", "steady", "steady_reason")},
                     # each server's own steady-state verdict (draftsim.sim.serving.steady)
                     **{f"{side}_{flag}": bool(r[side][flag]) for side in ("spec", "ar") for flag in ("steady", "overloaded")}}
                    for r in rows], "crossover_qps": cross}
    if out_dir is not None:
        path = Path(out_dir) / "serving_speedup.png"
        speedup_vs_load(path, rows, f"{d.target} (tp {d.tp}) / {d.drafters[0]} (tp {drafter_tp}) on {d.hardware}\n"
                                    f"engine {engine}: speculation against load", cross)
        out["figure"] = str(path)
    return out


def run_demo(out_dir: Path, k_max: int = 32, sim_tokens: int = SIM_TOKENS, real: bool = True, *, log=None, bar=None,
             serving_requests: int = SERVING_REQUESTS) -> dict:
    """Plan every reference setting, confirm the two best strategies of each by simulation,
    run the optimisers, replay the embedded trace, a serving study and a short real run, and
    write the four figures to ``out_dir``.

    ``log(message)`` is told as each stage starts and ends (with the time since the start);
    ``bar(total, desc)`` is a context manager whose ``update(n)`` counts the Monte Carlo checks.
    Sizes: ``sim_tokens`` tokens per Monte Carlo check (100,000 puts its standard error near
    0.4% of the EWIF it checks); ``serving_requests`` requests per load of the serving study
    (the crossover reads 4.25 req/s with 200, 4.15 with 400, 4.08 with 600 and 4.09 with 2,000;
    with 600 every load up to 4 req/s reaches its steady state for both servers).

    Returns ``{"settings": [(Setting, [Strategy, ...]), ...], "simulations": [...],
    "optimisation": ..., "replay": ..., "serving": ..., "real": ..., "figures": [Path, ...]}``.
    """
    clock = _Clock(log)
    bar = bar or _no_bar
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with clock.stage("analytic plans for 4 reference settings"):
        planned: list[tuple[Setting, list[Strategy]]] = [
            (s, plan(list(s.drafters), mag_alpha=s.mag_alpha, k_max=k_max)) for s in REFERENCE_SETTINGS
        ]
    checks = [(s, st) for s, strategies in planned for st in strategies[:2] if st.kind != "autoregressive"]
    with clock.stage(f"Monte Carlo check of {len(checks)} strategies ({sim_tokens:,} tokens each)"), bar(len(checks), "Monte Carlo") as b:
        simulations = []
        for s, st in checks:
            simulations.append(confirm(s, st, sim_tokens))
            b.update(1)
    with clock.stage("figures: EWIF against k, optimal-k map"):
        written = [
            figures.ewif_vs_k(out_dir / "ewif_vs_k.png"),
            figures.optimal_k_map(out_dir / "optimal_k_map.png"),
        ]
    with clock.stage("optimisers: K matrix, SpecDec++ stopping policy across 6 cost ratios"):
        optimisation = optimisation_step(out_dir)
    with clock.stage("replay of the embedded SmolLM2 trace"):
        replay = replay_step()
    written.append(optimisation["figure"])
    with clock.stage(f"serving study: 7 loads x {serving_requests} requests, with and without speculation"):
        serving = serving_study(out_dir, requests=serving_requests)
    written.append(Path(serving["figure"]))
    if real:
        with clock.stage("real run on SmolLM2"):
            real_run = real_step(log=clock)
    else:
        real_run = {"skipped": "by request (--no-real)", "by_request": True}
    return {"settings": planned, "simulations": simulations, "optimisation": optimisation, "replay": replay,
            "serving": serving, "real": real_run, "figures": written}
