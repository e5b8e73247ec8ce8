"""Our speculative decoding against transformers' on the same models and prompts (greedy).

Run: ``.venv/bin/python benchmarks/bench_realrun.py [--n 4] [--max-new-tokens 64]``.
Needs the distilled draft in the cache (``draftsim distill``).

For each prompt, in one run and alternating (the two sides of a pair back to back, which goes
first alternating, and the order rotating from prompt to prompt; one warm-up prompt first, not
counted): plain greedy decoding (transformers), and two pairs of
equivalent methods —

* **assisted generation**: transformers' ``generate(assistant_model=distilled)``, which stops
  drafting after a token of confidence < 0.4 (its default ``assistant_confidence_threshold``)
  within ``num_assistant_tokens`` = k, against ours with the same policy,
  ``ConfidenceStop(0.4, k)``;
* **prompt lookup**: transformers' ``generate(prompt_lookup_num_tokens=k)``, which copies up
  to k tokens after a match of the context's last tokens and proposes nothing without one,
  against our Max-Gram (with [CSD]'s bigram fallback, as ``draftsim run --drafter maxgram``)
  under ``ConfidenceStop(--tau, k)``: Max-Gram's confidence is m/(m+1) after a match of m
  tokens and 0 without one (:class:`draftsim.realrun.drafters.MaxGram`), so it drafts the matched
  continuation and a single (bigram) token where nothing matches;

Like transformers, ours reads the prompt in the first verification's forward call
(``generate(prefill_apart=False)``; ``--prefill-apart``: in a call of its own before it, as
``draftsim run`` does so that the simulator's replay can price the prefill apart).

Plus, for reference, Max-Gram with a fixed k and CS Drafting (``--csd``: the distilled draft
over Max-Gram). Outputs must equal plain greedy. Printed: tokens/s, the ratio of ours to
transformers for each pair (goal ≥ 1.0), and the share of each of our runs spent outside model
forward calls — the executor's own time (:attr:`draftsim.realrun.executor.RunLog.overhead_seconds`) and
Max-Gram's proposals (goal ≤ 3%). The machine's load average is printed before and after:
other processes on the CPU make every wall-clock figure noisy; tokens per CPU-second of this
process (``--threads 1``) are printed too, as a steadier view of the same comparison.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from draftsim.realrun.distill import load_distilled
from draftsim.realrun.drafters import MaxGram, NeuralDraft
from draftsim.realrun.executor import generate
from draftsim.realrun.methods import fit_bigram
from draftsim.realrun.models import load_model
from draftsim.realrun.prompts import format_prompt, prompt_set
from draftsim.sim import policies as P
from draftsim.sim.policies import parse_policy

#: (ours, transformers') equivalent pairs.
PAIRS = (("ours assisted", "hf assisted"), ("ours maxgram conf", "hf prompt lookup"))
NAMES = ("hf greedy", "hf assisted", "ours assisted", "hf prompt lookup", "ours maxgram conf", "ours maxgram fixed", "ours csd")


def _order(p: int) -> list[str]:
    """The methods' order for prompt ``p``: the two sides of a pair run back to back (which
    goes first alternates), and the units rotate from prompt to prompt."""
    units = [["hf greedy"], *([b, a] if p % 2 else [a, b] for a, b in PAIRS), ["ours maxgram fixed"], ["ours csd"]]
    units = units[p % len(units):] + units[: p % len(units)]
    return [name for unit in units for name in unit]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tau", type=float, default=0.4, help="Max-Gram's confidence stop (0.4 < 1/2: any match goes on)")
    parser.add_argument("--prompts", default="code")
    parser.add_argument("--csd", default="vertical:n=1,k=3,leniency=2", help="CS Drafting policy (distilled over Max-Gram)")
    parser.add_argument("--prefill-apart", action="store_true",
                        help="ours prefills the prompt in a call of its own (draftsim run's default) instead of with the first verification")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's; 1 on a CPU shared with other work, where threads spin against each other)")
    return parser.parse_args()


def _methods(args, target, draft, bigram, ids):
    """Each method on one prompt: a function returning its output ids (transformers) or RunLog (ours)."""
    tok = target.tokenizer
    x = torch.tensor([ids])
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id, attention_mask=torch.ones_like(x))
    csd = parse_policy(args.csd)

    def hf(**kw):
        with torch.inference_mode():
            return target.model.generate(x, **common, **kw)[0, x.shape[1]:].tolist()

    def ours(policy, drafters):
        return generate(target, ids, args.max_new_tokens, policy, drafters=drafters, prefill_apart=args.prefill_apart)

    def maxgram():
        return MaxGram(target.vocab_size, fallback=bigram)

    return {
        "hf greedy": lambda: hf(),
        "hf assisted": lambda: hf(assistant_model=draft.model, num_assistant_tokens=args.k, num_assistant_tokens_schedule="constant"),
        "ours assisted": lambda: ours(P.ConfidenceStop(0.4, args.k), [NeuralDraft(draft, "distilled")]),
        "hf prompt lookup": lambda: hf(prompt_lookup_num_tokens=args.k),
        "ours maxgram conf": lambda: ours(P.ConfidenceStop(args.tau, args.k), [maxgram()]),
        "ours maxgram fixed": lambda: ours(P.FixedK(args.k), [maxgram()]),
        "ours csd": lambda: ours(csd, [NeuralDraft(draft, "distilled"), maxgram()]),
    }


def _report(args, totals, outside, mismatches) -> None:
    rate = {name: n / s for name, (n, s, _) in totals.items()}
    cpu_rate = {name: n / c for name, (n, _, c) in totals.items()}
    print(f"SmolLM2-135M-Instruct on CPU ({torch.get_num_threads()} threads), {args.n} {args.prompts} prompts (+1 warm-up), "
          f"{args.max_new_tokens} new tokens, greedy, k = {args.k}, Max-Gram confidence stop tau = {args.tau}, "
          f"ours prefills {'apart' if args.prefill_apart else 'with the first verification'}")
    print(f"{'method':20s} {'tokens/s':>9s} {'vs greedy':>10s} {'tok/CPU-s':>10s} {'overhead':>9s} {'proposals':>10s} {'per round':>10s}")
    for name in NAMES:
        extra = ""
        if name in outside:
            over, props, secs, rounds = outside[name]
            extra = f" {over / secs:8.2%} {props / secs:9.2%} {over / max(rounds, 1) * 1e6:7.0f} µs"
        print(f"{name:20s} {rate[name]:9.2f} {rate[name] / rate['hf greedy']:9.2f}x {cpu_rate[name]:10.2f}{extra}")
    ratios = {f"{a} / {b}": rate[a] / rate[b] for a, b in PAIRS}
    ratios["ours csd / hf assisted"] = rate["ours csd"] / rate["hf assisted"]
    print("ours / transformers (wall clock): " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    # CPU time of this process: less sensitive to other processes on a shared machine.
    print("ours / transformers (CPU time):   " + ", ".join(f"{a} / {b} {cpu_rate[a] / cpu_rate[b]:.2f}x" for a, b in PAIRS))
    worst = max((o[0] + o[1]) / o[2] for o in outside.values())
    print(f"goals: every pair >= 1.00x: {'met' if all(ratios[f'{a} / {b}'] >= 1.0 for a, b in PAIRS) else 'NOT met'}; "
          f"time outside model calls <= 3% of a run (worst {worst:.2%}): {'met' if worst <= 0.03 else 'NOT met'}")
    print("outputs identical to plain greedy" if not mismatches else f"MISMATCHES: {mismatches}")


def main() -> None:
    args = _parse()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"load average before: {_load()} ({os.cpu_count()} CPUs)")
    target = load_model("smollm2", device="cpu")
    draft = load_distilled(target)
    bigram = fit_bigram(target)
    totals = {name: [0, 0.0, 0.0] for name in NAMES}  # tokens, seconds, CPU seconds
    outside = {name: [0.0, 0.0, 0.0, 0] for name in NAMES if name.startswith("ours")}  # overhead, proposals, seconds, rounds
    mismatches = []
    for p, prompt in enumerate(prompt_set(args.prompts, "test", args.n + 1)):
        runs = _methods(args, target, draft, bigram, format_prompt(prompt, target.tokenizer))
        outputs = {}
        for name in _order(p):
            t0, c0 = time.perf_counter(), time.process_time()
            out = runs[name]()
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            if not isinstance(out, list):  # one of ours: a RunLog
                if p:
                    o = outside[name]
                    o[0] += out.overhead_seconds
                    o[1] += sum(c.seconds for c in out.calls if c.model and c.n_tokens == 0)  # statistical proposals
                    o[2] += out.seconds
                    o[3] += len(out.rounds)
                out = out.output
            if p:  # prompt 0 warms every method up
                totals[name][0] += len(out)
                totals[name][1] += seconds
                totals[name][2] += cpu
            outputs[name] = out
        ref = outputs["hf greedy"]
        # transformers stops after EOS; ours keeps the EOS token: compare up to the reference's length.
        mismatches += [(prompt.id, name) for name, out in outputs.items() if out[: len(ref)] != ref]
    _report(args, totals, outside, mismatches)
    print(f"load average after: {_load()}")


if __name__ == "__main__":
    main()
