"""Published speculative-serving results predicted from their stated setup with draftsim's defaults.

1. The EAGLE-3 paper's Table 3 (arXiv 2503.01840: SGLang, 1x H100, Llama-3.1-8B-Instruct,
MT-bench, chain of 3 draft tokens, batch 2..64) with draftsim's defaults, and print predicted
beside published speedups (throughput with speculation / without, at the same concurrency).

Assumptions the source leaves open (written down, not fitted): acceptance from vLLM issue 20780
(same target and heads, MT-bench, batch 1: mean acceptance length 2.29 EAGLE / 2.79 EAGLE-3 at
k=3), assumed not to change with batch; prompts 128 tokens, outputs 256 tokens; a closed loop of
B clients with no think time holds the batch at B; the H100 roofline of the catalog without
engine overheads (issue 25).

2. SpecDecode-Bench (arXiv 2601.11580) Figure 1: n-gram (k=3) on Llama-3.1-8B, 1x H100, batch 128:
1.11x ShareGPT, 1.12x CNN/DailyMail, 1.05x GSM8K. Acceptance from the study's own per-token traces
(catalog entries ngram-llama-3.1-8b-*-specdecode-bench-traces: cumulative rates at k=3). The
traces cannot tell a step without a match from a rejected proposal, so the prediction is a
bracket: every zero-accept step a rejected proposal of 3 (match 1), or every one a step without a
match (match = a_1, rates given a match a_i / a_1). Prompts and outputs 256 tokens (the study
replicates one prompt B times, max_tokens 8192: lengths not stated per point).

Run: python benchmarks/published_speculation.py [--json]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PUBLISHED = {  # EAGLE-3 paper Table 3, speedup by batch size (docs/research/README.md)
    "eagle": [1.40, 1.38, 1.23, 1.02, 0.93, 0.94, 0.88, 0.99, 0.99],
    "eagle3": [1.81, 1.82, 1.62, 1.48, 1.39, 1.32, 1.38, 1.34, 1.38],
}
BATCHES = [2, 4, 8, 16, 24, 32, 48, 56, 64]


NGRAM_PUBLISHED = {"sharegpt": 1.11, "cnn-dailymail": 1.12, "gsm8k": 1.05}


def throughput(policy: list[str], batch: int, prompt: int = 128) -> float:
    cmd = [str(Path(sys.executable).with_name("draftsim")), "serve-sim", "--json", *policy, "--target", "llama-3.1-8b", "--hardware", "h100-sxm",
           "--arrivals", f"closed:clients={batch},think=0", "--requests", str(max(8 * batch, 64)), "--prompt-len", f"fixed:{prompt}",
           "--output-len", "fixed:256", "--replications", "1", "--seed", "0"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)["throughput"])


def main() -> int:
    rows = []
    for b_i, batch in enumerate(BATCHES):
        base = throughput(["--policy", "ar", "--alpha", "0.5", "--drafter-model", "eagle3"], batch)
        row = {"batch": batch}
        for m in ("eagle", "eagle3"):
            spec = throughput(["--policy", "fixed:k=3", "--acceptance", f"{m}-llama-3.1-8b-vllm-issue20780", "--drafter-model", m], batch)
            row[m] = {"predicted": spec / base, "published": PUBLISHED[m][b_i]}
        rows.append(row)
        print(f"batch {batch:>3}: " + "  ".join(f"{m} predicted {row[m]['predicted']:.2f} published {row[m]['published']:.2f}"
                                                 for m in ("eagle", "eagle3")), flush=True)
    from draftsim.sim.acceptance_catalog import acceptance_entry

    base = throughput(["--policy", "ar", "--alpha", "0.5", "--drafter-model", "ngram"], 128, 256)
    ngram = []
    for data, published in NGRAM_PUBLISHED.items():
        a = acceptance_entry(f"ngram-llama-3.1-8b-{data}-specdecode-bench-traces").cumulative(3)
        text = lambda x: ",".join(f"{v:.6f}" for v in x)  # noqa: E731
        rejected = throughput(["--policy", "fixed:k=3", "--positional", text(a), "--drafter-model", "ngram"], 128, 256) / base
        no_match = throughput(["--policy", "fixed:k=3", "--positional", text(a / a[0]), "--match", f"{a[0]:.6f}", "--drafter-model", "ngram"],
                              128, 256) / base
        ngram.append({"dataset": data, "published": published, "all_rejected": rejected, "all_no_match": no_match})
        print(f"ngram k=3 batch 128 {data}: predicted {rejected:.2f} (all rejected) .. {no_match:.2f} (all without a match), "
              f"published {published:.2f}", flush=True)
    if "--json" in sys.argv:
        print(json.dumps({"eagle3_table3": rows, "ngram_batch128": ngram}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
