"""Our speculative decoding against transformers' on the same models and prompts (greedy).

Run: ``.venv/bin/python benchmarks/bench_realrun.py [--n 4] [--max-new-tokens 64]``.
For each prompt, measured alternately in this one run: plain greedy (transformers),
``generate(assistant_model=distilled)``, ``generate(prompt_lookup_num_tokens=k)``, and ours
with the distilled draft and with Max-Gram, and CS Drafting (``--csd``: a vertical cascade of
the distilled draft over Max-Gram). transformers' assisted generation stops drafting after a
token of confidence < 0.4 (its default ``assistant_confidence_threshold``) within
``num_assistant_tokens`` = k; ours with the distilled draft runs the same policy,
``ConfidenceStop(0.4, k)``, so that both sides draft alike; Max-Gram and prompt lookup use k. Outputs must be identical to plain
greedy; the script prints tokens/s and the ratios. Needs the distilled draft in the cache
(``draftsim distill``).
"""

from __future__ import annotations

import argparse
import time

import torch

from realrun.distill import load_distilled
from realrun.drafters import MaxGram, NeuralDraft
from realrun.executor import generate
from realrun.models import load_model
from realrun.prompts import format_prompt, prompt_set
from sim import policies as P
from sim.policies import parse_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", default="code")
    parser.add_argument("--csd", default="vertical:n=1,k=3,leniency=2", help="CS Drafting policy (distilled over Max-Gram)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    target = load_model("smollm2", device="cpu")
    draft = load_distilled(target)
    tok = target.tokenizer
    totals = {name: [0, 0.0] for name in ("hf greedy", "hf assisted", "hf prompt lookup", "ours sd distilled", "ours sd maxgram", "ours csd")}
    csd = parse_policy(args.csd)
    mismatches = []
    for prompt in prompt_set(args.prompts, "test", args.n):
        ids = format_prompt(prompt, tok)
        x = torch.tensor([ids])
        common = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id, attention_mask=torch.ones_like(x))

        def hf(**kw):
            with torch.inference_mode():
                return target.model.generate(x, **common, **kw)[0, len(ids):].tolist()

        runs = {
            "hf greedy": lambda: hf(),
            "hf assisted": lambda: hf(assistant_model=draft.model, num_assistant_tokens=args.k, num_assistant_tokens_schedule="constant"),
            "hf prompt lookup": lambda: hf(prompt_lookup_num_tokens=args.k),
            "ours sd distilled": lambda: generate(target, ids, args.max_new_tokens, P.ConfidenceStop(0.4, args.k), NeuralDraft(draft, "distilled")).output,
            "ours sd maxgram": lambda: generate(target, ids, args.max_new_tokens, P.FixedK(args.k), MaxGram(target.vocab_size)).output,
            "ours csd": lambda: generate(target, ids, args.max_new_tokens, csd, drafters=[NeuralDraft(draft, "distilled"), MaxGram(target.vocab_size)]).output,
        }
        outputs = {}
        for name, fn in runs.items():
            t0 = time.perf_counter()
            out = fn()
            totals[name][1] += time.perf_counter() - t0
            totals[name][0] += len(out)
            outputs[name] = out
        ref = outputs["hf greedy"]
        for name, out in outputs.items():
            # transformers stops after EOS; ours keeps the EOS token: compare up to the reference's length.
            if out[: len(ref)] != ref:
                mismatches.append((prompt.id, name))
    base = totals["hf greedy"][0] / totals["hf greedy"][1]
    print(f"SmolLM2-135M-Instruct, {args.n} {args.prompts} prompts, {args.max_new_tokens} new tokens, greedy, k = {args.k}")
    print(f"{'method':22s} {'tokens/s':>9s} {'vs greedy':>10s}")
    for name, (n, s) in totals.items():
        print(f"{name:22s} {n / s:9.2f} {n / s / base:9.2f}x")
    r1 = (totals["ours sd distilled"][0] / totals["ours sd distilled"][1]) / (totals["hf assisted"][0] / totals["hf assisted"][1])
    r2 = (totals["ours sd maxgram"][0] / totals["ours sd maxgram"][1]) / (totals["hf prompt lookup"][0] / totals["hf prompt lookup"][1])
    r3 = (totals["ours csd"][0] / totals["ours csd"][1]) / (totals["hf assisted"][0] / totals["hf assisted"][1])
    print(f"ours / transformers: distilled draft {r1:.2f}x, Max-Gram vs prompt lookup {r2:.2f}x, "
          f"CS Drafting ({args.csd}) vs assisted {r3:.2f}x")
    print("outputs identical to plain greedy" if not mismatches else f"MISMATCHES: {mismatches}")


if __name__ == "__main__":
    main()
