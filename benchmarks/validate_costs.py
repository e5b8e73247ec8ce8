"""The roofline against measurements: this machine's profiles and published GPU numbers.

Run: ``.venv/bin/python benchmarks/validate_costs.py [--profile P.json ...]``. Profiles come
from ``draftsim profile --model smollm2 --threads 1 --dtype float32|bfloat16 --out P.json``;
each is compared grid point by grid point with the roofline of the same model on the
``local-cpu`` catalog entry (relative error, median and worst). The GPU part compares the
catalog's A100-80G roofline (default efficiency factors, nothing fitted unless said) with:

* gpt-fast (github.com/pytorch-labs/gpt-fast README, "Benchmarks"): Llama-2 7B/70B bf16,
  batch 1, 5-token prompt, torch.compile, 8x A100-80GB power-limited to 330 W; tokens/s → s/token;
* SpecDec++ (Huang et al., Appendix D.2, stand-alone): llama-2-chat 7B t = 0.0207 s on one
  A100-80G, 70B t = 0.108 s sharded over two (Hugging Face transformers); the per-layer
  overhead is fitted to the 7B number only and the 70B number predicted.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from draftsim.sim.cost import RooflineModel, default_catalog, load_profile

GPT_FAST = [("llama-2-7b", 1, 1 / 104.9), ("llama-2-7b", 2, 1 / 168.84), ("llama-2-7b", 4, 1 / 254.02), ("llama-2-7b", 8, 1 / 328.43),
            ("llama-2-70b", 2, 1 / 21.32), ("llama-2-70b", 4, 1 / 38.01), ("llama-2-70b", 8, 1 / 62.50)]
SPECDEC_DRAFT, SPECDEC_TARGET = 0.0207, 0.108


def gpu_rows(context: int = 256) -> list[tuple[str, float, float]]:
    cat = default_catalog()
    hw = cat.hardware_spec("a100-80g")
    rows = []
    for name, tp, measured in GPT_FAST:
        r = RooflineModel(cat.model(name), hw, "bfloat16", tp=tp)
        rows.append((f"gpt-fast {name} tp{tp}, 1 token", measured, float(r.shape_time(1, 1, 5))))
    r7 = RooflineModel(cat.model("llama-2-7b"), hw, "bfloat16")
    per_layer = (SPECDEC_DRAFT - float(r7.shape_time(1, 1, context))) / r7.model.layers
    rows.append(("SpecDec++ 7B, 1 GPU, roofline alone", SPECDEC_DRAFT, float(r7.shape_time(1, 1, context))))
    for label, kw in (("2 GPUs as pipeline stages", {"pp": 2}), ("2 GPUs tensor-parallel", {"tp": 2})):
        r70 = RooflineModel(cat.model("llama-2-70b"), hw, "bfloat16", **kw)
        rows.append((f"SpecDec++ 70B, {label}, roofline alone", SPECDEC_TARGET, float(r70.shape_time(1, 1, context))))
        rows.append((f"SpecDec++ 70B, {label}, + 7B-fitted overhead {per_layer * 1e6:.0f} us/layer", SPECDEC_TARGET,
                     float(r70.with_overhead(0.0, per_layer).shape_time(1, 1, context))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="append", default=[], help="profile file(s) of smollm2 on this machine")
    args = parser.parse_args()
    cat = default_catalog()
    for path in args.profile:
        prof = load_profile(path)
        B, N, C = np.meshgrid(prof.batch, prof.new_tokens, prof.context, indexing="ij")
        r = RooflineModel(cat.model(prof.model), cat.hardware_spec("local-cpu"), prof.dtype)
        err = r.shape_time(B, N, C) / prof.seconds - 1
        print(f"{path}: {prof.model} {prof.dtype}, {err.size} grid points; roofline on local-cpu vs measured median: "
              f"median |error| {np.median(np.abs(err)):.1%}, worst {np.max(np.abs(err)):.1%}")
        print("  per point (batch, new tokens, context: error):",
              ", ".join(f"({b},{n},{c}: {e:+.0%})" for b, n, c, e in zip(B.ravel(), N.ravel(), C.ravel(), err.ravel())))
    print(f"published GPU measurements vs the A100-80G roofline (load average {os.getloadavg()[0]:.2f} here, irrelevant to these):")
    for label, measured, predicted in gpu_rows():
        print(f"  {label:<75} measured {measured * 1e3:7.2f} ms  roofline {predicted * 1e3:7.2f} ms  error {predicted / measured - 1:+.0%}")


if __name__ == "__main__":
    main()
