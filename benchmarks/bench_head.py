"""SpecDec++ on the embedded model: acceptance heads against fixed K, the MDP optimum and the oracle.

Run: ``.venv/bin/python benchmarks/bench_head.py [--n 4] [--max-new-tokens 48]``. Needs the
distilled draft (``draftsim distill``). Steps, all in this one run:

1. heads for (w_rej, D) in {1, 4} x {1, 3} on the target's responses to the train prompts
   (token mixing r = 0.5), binary KL on the test prompts' responses;
2. greedy decoding of the test prompts with fixed K and with each head at several
   thresholds h: discard rate (drafted - accepted) / tokens and verification rate
   target calls / tokens (SpecDec++ Figure 3), tokens/s;
3. per-token latency under one cost model (t_draft, t_target fitted to the fixed-K run's
   calls) for every run, the MDP-optimal policy on the same text (sim.mdp.solve_trace with
   the draft's greedy match flags along the target's output) and the oracle (Theorem 4.1).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from draftsim.realrun.distill import load_distilled, target_corpus
from draftsim.realrun.drafters import NeuralDraft
from draftsim.realrun.executor import generate
from draftsim.realrun.head import binary_kl, head_data, train_head
from draftsim.realrun.models import load_model
from draftsim.realrun.prompts import format_prompt, prompt_set
from draftsim.sim import policies as P
from draftsim.sim.mdp import oracle_latency, solve_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--prompts", default="code,arithmetic")
    parser.add_argument("--json")
    args = parser.parse_args()
    target = load_model("smollm2", device="cpu")
    draft = load_distilled(target)
    rng = np.random.default_rng(0)
    train = target_corpus(target, "train", 16, 96)
    test = target_corpus(target, "test", 4, 96)
    data = head_data(target, draft, train, 0.5, rng)
    held = head_data(target, draft, test, 0.0, rng)
    heads = {}
    print(f"head training: {len(data)} draft positions, test {len(held)}; mean acceptance {held.labels.mean():.3f}")
    print(f"{'w_rej':>5s} {'D':>2s} {'binary KL':>9s} (constant predictor {binary_kl(held.labels, np.full(len(held), data.labels.mean())):.4f})")
    for w_rej in (1.0, 4.0):
        for depth in (1, 3):
            head, _ = train_head(data, depth, w_rej, epochs=30, seed=0)
            kl = binary_kl(held.labels, head.predict(torch.from_numpy(held.features)))
            heads[(w_rej, depth)] = head
            print(f"{w_rej:5g} {depth:2d} {kl:9.4f}", flush=True)

    prompts = [p for s in args.prompts.split(",") for p in prompt_set(s, "test", args.n)]
    ids = [format_prompt(p, target.tokenizer) for p in prompts]
    ar = [generate(target, x, args.max_new_tokens) for x in ids]
    ar_rate = sum(l.tokens for l in ar) / sum(l.seconds for l in ar)

    def run(policy, head=None):
        logs = [generate(target, x, args.max_new_tokens, policy, NeuralDraft(draft, "distilled", head=head)) for x in ids]
        tokens = sum(l.tokens for l in logs)
        drafted = sum(l.drafted for l in logs)
        accepted = sum(l.accepted for l in logs)
        return {"tokens": tokens, "target_calls": sum(l.target_calls for l in logs), "draft_calls": sum(l.draft_calls for l in logs),
                "discard_rate": (drafted - accepted) / tokens, "verification_rate": sum(l.target_calls for l in logs) / tokens,
                "tokens_per_second": tokens / sum(l.seconds for l in logs), "logs": logs}

    results = []
    base = run(P.FixedK(4))
    calls = [c for l in base["logs"] for c in l.calls if c.kind != "prefill"]
    t_target = float(np.mean([c.seconds for c in calls if c.model == 0]))
    t_draft = float(np.mean([c.seconds for c in calls if c.model == 1]))
    print(f"\ncost model from the fixed-K run: t_draft {t_draft * 1e3:.1f} ms, t_target {t_target * 1e3:.1f} ms per call; "
          f"autoregressive {ar_rate:.2f} tokens/s")
    print(f"{'policy':34s} {'discard':>7s} {'verify':>7s} {'tok/s':>6s} {'speedup':>7s} {'latency/token (model)':>22s}")

    def report(name, r):
        model = (r["draft_calls"] * t_draft + r["target_calls"] * t_target) / r["tokens"]
        r.pop("logs", None)
        results.append({"policy": name, **r, "model_latency": model})
        print(f"{name:34s} {r['discard_rate']:7.3f} {r['verification_rate']:7.3f} {r['tokens_per_second']:6.2f} "
              f"{r['tokens_per_second'] / ar_rate:6.2f}x {model * 1e3:19.1f} ms", flush=True)

    for k in (1, 2, 4, 6):
        report(f"fixed k={k}", base if k == 4 else run(P.FixedK(k)))
    for (w_rej, depth), head in heads.items():
        for h in (0.3, 0.5, 0.7, 0.9):
            report(f"head w_rej={w_rej:g} D={depth} h={h}", run(P.Threshold(h, k_max=8), head))
    # The same text, optimally: greedy match flags of the draft along the target's own output.
    flags = []
    with torch.inference_mode():
        for x, log in zip(ids, ar):
            full = torch.tensor([x + log.output])
            guess = draft.model(full).logits[0, len(x) - 1 : -1].argmax(-1)
            flags.append((guess == full[0, len(x):]).double().numpy())
    mdp = solve_trace(flags, t_draft, t_target, k_max=16)
    orc = oracle_latency(flags, t_draft, t_target)
    # Without foresight: the MDP optimum for i.i.d. acceptance at the text's mean rate, run on the text.
    alpha = float(np.concatenate(flags).mean())
    # (i.i.d. acceptance: 1 − Π p is the same after k tokens every round, so the optimal threshold
    # policy drafts a fixed k* = argmin (k t_d + t_t) / (1 + α + … + α^k).)
    k_star = min(range(17), key=lambda k: (k * t_draft + t_target) / sum(alpha**j for j in range(k + 1)))
    blind = solve_trace(flags, t_draft, t_target, k_max=16, policy=("fixed", k_star))
    print(f"{'MDP optimum, iid alpha=' + f'{alpha:.2f}, k*={k_star}':34s} {'':7s} {'':7s} {'':6s} {'':7s} {blind.latency_per_token * 1e3:19.1f} ms")
    print(f"{'MDP optimum knowing the text':34s} {'':7s} {'':7s} {'':6s} {'':7s} {mdp.latency_per_token * 1e3:19.1f} ms")
    print(f"{'oracle (Theorem 4.1)':34s} {'':7s} {'':7s} {'':6s} {'':7s} {orc['latency_per_token'] * 1e3:19.1f} ms")
    print(f"{'autoregressive':34s} {'':7s} {1.0:7.3f} {ar_rate:6.2f} {1.0:6.2f}x {t_target * 1e3:19.1f} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": results, "mdp_knowing_text": mdp.latency_per_token, "mdp_iid": blind.latency_per_token, "k_star": k_star, "oracle": orc, "t_draft": t_draft, "t_target": t_target}, fh, indent=1)


if __name__ == "__main__":
    main()
