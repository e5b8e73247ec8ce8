"""``draftsim demo``: the main job end to end on embedded defaults."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from draftsim.analysis.demo import run_demo, serving_rows
from draftsim.analysis.table import format_table

from .. import args as a
from ..config import add_options, check, from_namespace, option
from ..progress import count_bar
from .planning import format_plan
from .table import summary

#: Where the demo writes its figures unless told otherwise: ignored by git (.gitignore), so a demo
#: run leaves the working tree as it found it.
DEFAULT_OUT = "figures/demo"


@dataclass(kw_only=True)
class DemoConfig:
    """``draftsim demo``: analytic plans for reference settings, their Monte Carlo check, the
    optimisers, a replay, a serving study and a short real run, with the planner's figures."""

    out: str = option(DEFAULT_OUT, f"folder for the figures (default: {DEFAULT_OUT}, which git ignores: the README's copies in "
                      "figures/ are never rewritten)")
    no_real: bool = option(False, "skip the short real run on the embedded model", flag=True)


def register(sub, common) -> None:
    p = sub.add_parser(
        "demo",
        parents=[common],
        help=summary("demo"),
        description="Analytic plans for a few reference settings and their Monte Carlo check, the "
        "optimisers, a replay of the embedded trace, a serving study and a short real run on SmolLM2, "
        "printed as tables; four figures written as PNG files to --out (default figures/demo, ignored "
        "by git). Each stage's start and end go to stderr with the time since the start.",
    )
    add_options(p, DemoConfig)
    p.set_defaults(run=run)


@dataclass
class DemoResult:
    """What ``draftsim demo`` did (:func:`draftsim.analysis.demo.run_demo`): each reference
    setting with its planned strategies, their Monte Carlo check, the optimisers' results, the
    replay of the embedded trace, the serving study, the real run (or why it was skipped) and
    the figures written. ``to_dict`` is what ``--json`` prints."""

    settings: list  #: (Setting, [Strategy, ...]) per reference setting
    simulations: list[dict]
    optimisation: dict
    replay: dict
    serving: dict
    real: dict
    figures: list[Path]

    def to_dict(self) -> dict:
        return {
            "settings": [
                {
                    "name": s.name,
                    "drafters": [vars(d) for d in s.drafters],
                    "mag_alpha": s.mag_alpha,
                    "strategies": [{"kind": st.kind, "description": st.description, "ewif": st.ewif, **st.params} for st in strategies],
                }
                for s, strategies in self.settings
            ],
            "simulations": self.simulations,
            "optimisation": {k: v for k, v in self.optimisation.items() if k != "figure"},
            "replay": self.replay,
            "serving": self.serving,
            "real": self.real,
            "figures": [str(p) for p in self.figures],
        }


def demo(config: DemoConfig, log=None, bar=None) -> DemoResult:
    """The demo run end to end (:func:`draftsim.analysis.demo.run_demo`): its plans, simulations,
    optimisation, replay, serving study, real run and the figures written under ``config.out``;
    ``log(message)`` is told as each stage starts and ends, ``bar(total, desc)`` shows long loops."""
    check(config)
    out = a.output_folder("--out", config.out)  # before any work: a bad folder costs nothing and leaves nothing
    return DemoResult(**run_demo(out, real=not config.no_real, log=log, bar=bar))


def serving_lines(sv: dict) -> list[str]:
    """The serving study as the demo prints it: its deployment (the engine, both models' tp, the
    scheduler's limits), a row per load and the crossover."""
    rows = serving_rows(sv)
    lines = [f"Serving study ({sv['pair']}, {sv['policy']}, alpha {sv['alpha']:g}, 512-token prompts, 256-token outputs, Poisson; "
             f"scheduler {sv['scheduler']}, the KV cache the devices' memory holds):",
             format_table(["QPS", "E2E speedup", "TPOT speedup", "throughput ratio", "steady state"],
                          [[r["qps"], r["speedup"], r["tpot_speedup"], r["throughput_ratio"], r["status"] or "both"] for r in rows])]
    if any(r["status"] for r in rows):
        lines.append("steady state: warm-up and drain cut (MSER-5); an overloaded server's queue grows, so its row's latency is this "
                     "run's and grows with the run's length; not settled: the run was too short to tell")
    cross = sv["crossover_qps"]
    if cross is None:
        lines.append("speculation pays at every load swept")
    elif cross != cross:  # nan: below 1 already at the lightest load
        lines.append("speculation does not pay even at the lightest load swept")
    else:
        lines.append(f"speculation stops paying near {cross:.1f} requests/s")
    return lines


def run(args: argparse.Namespace) -> int:
    result = demo(from_namespace(DemoConfig, args), log=lambda message: print(message, file=sys.stderr, flush=True), bar=count_bar)
    if args.json:
        a.emit_json(result.to_dict())
        return 0
    print("draftsim demo: analytic plans for reference settings (EWIF = expected speedup)\n")
    for setting, strategies in result.settings:
        drafters = ", ".join(f"{d.name} (alpha {d.alpha:g}, c {d.cost:g})" for d in setting.drafters)
        mag = f"; Max-Gram alpha {setting.mag_alpha:g}" if setting.mag_alpha is not None else ""
        print(f"== {setting.name}: {drafters}{mag}")
        print(format_plan(strategies))
        print()
    print("Monte Carlo check of the best strategies (EWIF, simulated +/- SE vs analytic):")
    rows = [
        [s["setting"], s["strategy"], s["analytic_ewif"], f"{s['simulated_ewif']:.4f} +/- {s['se']:.4f}"]
        for s in result.simulations
    ]
    print(format_table(["setting", "strategy", "analytic", "simulated"], rows))
    print()
    opt = result.optimisation
    ex, gr = opt["kmatrix"]["exact"], opt["kmatrix"]["grid"]
    print("Optimisation: K matrix for 2 drafters + Max-Gram (entries <= 12)")
    print(format_table(
        ["search", "EWIF", "evaluations", "K"],
        [["exact", ex["ewif"], ex["evaluations"], str(ex["K"])], ["halving grid", gr["ewif"], gr["evaluations"], str(gr["K"])]],
    ))
    print()
    print("Optimisation: SpecDec++ draft length on easy/hard text (speedup over autoregressive)")
    rows = []
    for m in opt["mdp"]:
        ar = m["autoregressive"]
        rows.append([f"{m['t_draft/t_target']:g}", ar / m["optimal"], ar / m["best_threshold"]["latency_per_token"],
                     ar / m["best_fixed_k"]["latency_per_token"], ar / m["oracle"]])
    print(format_table(["t_draft/t_target", "MDP optimum", "best threshold", "best fixed k", "oracle"], rows))
    print()
    rp = result.replay
    print(f"Replay of the embedded SmolLM2 trace ({rp['sequences']} sequences, {rp['tokens']} tokens; greedy; measured costs):")
    print(format_table(
        ["drafter", "cost", "policy", "tokens/call", "EWIF", "oracle"],
        [[r["drafter"], r["cost"], r["policy"], r["tokens_per_call"], r["ewif"],
          "n/a*" if r["oracle_speedup"] is None else r["oracle_speedup"]] for r in rp["rows"]],
    ))
    if any(r["oracle_speedup"] is None for r in rp["rows"]):
        print("* the oracle ([SD++] Theorem 4.1) knows one drafter's acceptance; a cascade has no such bound")
    print()
    print("\n".join(serving_lines(result.serving)))
    print()
    rr = result.real
    if "skipped" in rr:
        if rr.get("by_request"):
            print("Real run on SmolLM2: skipped by request (--no-real)")
        else:
            print(f"Real run on SmolLM2: skipped ({rr['skipped']}; `make demo` installs torch and the model)")
    else:
        c = rr["sim_check"]
        b = rr["plan"]["choices"][0]
        print(f"Real run on SmolLM2 ({rr['prompts']} {rr['prompt_set']} prompts, {rr['max_new_tokens']} new tokens, greedy, "
              f"{rr['threads']} CPU thread{'s' if rr['threads'] > 1 else ''}): the planner "
              f"picked {b['drafter']} k={b['k']} on {rr['plan']['pilot_prompts']} train prompts, predicting {b['speedup']:.2f}x")
        print(format_table(
            ["method", "tokens/s", "speedup", "tokens/target call", "= target output"],
            [["autoregressive", rr["autoregressive_tokens_per_second"], 1.0, 1.0, "-"],
             [rr["label"], rr["tokens_per_second"], rr["speedup"], rr["mean_accepted_length"], f"{rr['quality']['identical_to_target']:.0%}"]],
        ))
        print(f"simulator replay of the run: counts {'identical' if c['counts_equal'] else 'differ'}, "
              f"tokens/s predicted {c['predicted_tokens_per_second']:.1f} vs measured {c['measured_tokens_per_second']:.1f} "
              f"({c['tokens_per_second_error']:+.1%})")
        iv = rr["interleaved"]
        print(f"speedup: measured {iv['measured_speedup']:.2f}x, predicted {iv['predicted_speedup']:.2f}x ({iv['error']:+.0%}) from the "
              f"target's calls profiled before, between and after the prompts ({iv['profiles']} profiles, at context {iv['context']}); "
              f"the planner's forecast on its train prompts was {rr['predicted_speedup']:.2f}x")
        print("why: " + "; ".join(rr["why"]))
    print()
    print("figures:")
    for path in result.figures:
        print(f"  {path}")
    return 0
