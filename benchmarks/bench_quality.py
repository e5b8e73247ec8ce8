"""Quality against latency for the lossy methods (speculative cascades, top-level leniency).

Run: ``.venv/bin/python benchmarks/bench_quality.py [--n 8] [--max-new-tokens 48]``.
On the arithmetic test prompts (answers known) with the distilled draft, sweeps the
deferral rules' alpha and the top-level leniency; per point: relative latency (AR time over
the method's, measured alternately in one run, as speedup), share of outputs identical to
the target's greedy output, agreement before the first difference, the target's mean
negative log-likelihood of the text (its own greedy text scores lowest), and answer accuracy —
the shape of the quality-versus-latency trade-off of Speculative Cascades (Figure 2).
"""

from __future__ import annotations

import argparse
import json

from draftsim.realrun.compare import measure
from draftsim.realrun.methods import method_from
from draftsim.realrun.models import load_model
from draftsim.realrun.prompts import prompt_set

POINTS = [("cascade", "sd")] + [("cascade", f"opt:alpha={a}") for a in (0.05, 0.2, 0.5)] + [
    ("cascade", f"chow:alpha={a}") for a in (0.1, 0.3, 0.6)] + [("cascade", f"token3:alpha={a}") for a in (0.3, 0.7)] + [
    ("cascade", f"leniency:l={l}") for l in (3, 30)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--prompts", default="arithmetic")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--json")
    args = parser.parse_args()
    target = load_model("smollm2", device="cpu")
    prompts = [p for s in args.prompts.split(",") for p in prompt_set(s, "test", args.n)]
    print(f"{target.name}: {len(prompts)} test prompts ({args.prompts}), {args.max_new_tokens} new tokens, greedy, "
          f"distilled draft, fixed:k={args.k}")
    print(f"{'rule':18s} {'speedup':>7s} {'tok/call':>8s} {'=target':>7s} {'agreement':>9s} {'target NLL':>10s} {'answers':>7s} {'(target)':>8s}")
    results = []
    for kind, rule in POINTS:
        r = measure(target, method_from(kind, target, "distilled", f"fixed:k={args.k}", rule), prompts, args.max_new_tokens).to_dict()
        q = r["quality"]
        results.append(r)
        acc = "-" if q["answer_accuracy"] is None else f"{q['answer_accuracy']:.0%}"
        acc_t = "-" if q["answer_accuracy_target"] is None else f"{q['answer_accuracy_target']:.0%}"
        nll = q["target_nll"] if q["target_nll"] is not None else q["target_nll_target"]
        nll = "-" if nll is None else f"{nll:.3f}"
        print(f"{rule:18s} {r['speedup']:6.2f}x {r['mean_accepted_length']:8.2f} {q['identical_to_target']:6.0%} "
              f"{q['mean_prefix_agreement']:8.0%} {nll:>10s} {acc:>7s} {acc_t:>8s}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
