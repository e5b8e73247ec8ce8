"""The roofline's memory-bandwidth utilisation (MBU) of the GPUs with measured operator tables,
derived from those tables rather than carried over from another GPU.

The catalog roofline (sim/cost/roofline.py) prices a memory-bound forward as the bytes it reads
over bandwidth × MBU. Its MBU was 0.7 on every GPU: gpt-fast's end-to-end Llama-2-7B batch-1
measurement on an A100-80GB (1,397 of 2,039 GB/s), carried to the H100 and H200. For the GPUs
whose kernels AIConfigurator measured (aiconfigurator-core 0.12.0, vLLM tables: h100-sxm, h200,
a100-80g), the MBU is instead the roofline's bytes over the measured kernels' time for one anchor
call — Llama-3.1-8B, bfloat16, one decode token at batch 1 and context 512, no engine host time —
i.e. the roofline's forward at MBU 1 over the operator model's (``--cost-model operators``):
GEMMs, attention and the elementwise kernels as measured or estimated there, launch gaps
included. One anchor, one number per GPU, nothing fitted to a published end-to-end result.

Where an end-to-end batch-1 measurement on the GPU itself is cited, the catalog keeps it: the A100's
0.7 (gpt-fast's 0.685). There the derivation is the held-out check: the A100's derived MBU against
gpt-fast's measured one.

    python benchmarks/derive_mbu.py [--json]

Exit status 1 when the catalog (sim/data/hardware.json) holds another value than this derivation
(rounded to 3 decimals).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

ANCHOR = {"model": "llama-3.1-8b", "dtype": "bfloat16", "batch": 1, "new_tokens": 1, "context": 512}
GPUS = ("h100-sxm", "h200", "a100-80g", "b200", "gb200")
#: GPUs whose catalog MBU is an end-to-end measurement on the GPU itself, kept (the derivation checks it).
MEASURED = ("a100-80g",)
#: gpt-fast's Llama-2-7B batch-1 measurement on an A100-80GB: 1,397 of 2,039 GB/s (github.com/pytorch-labs/gpt-fast README).
GPT_FAST_A100 = 1397 / 2039


def derive(hardware: str) -> dict:
    """The anchor call's seconds under the roofline at MBU 1 and under the measured operators, and their ratio."""
    from draftsim.sim.cost.assembly import Deployment, assemble

    shape = (ANCHOR["batch"], ANCHOR["new_tokens"], ANCHOR["context"])
    roof = assemble(Deployment(ANCHOR["model"], hardware, dtype=ANCHOR["dtype"], overheads="none", mbu=1.0))
    ops = assemble(Deployment(ANCHOR["model"], hardware, dtype=ANCHOR["dtype"], overheads="none", cost_model="operators"))
    from draftsim.sim.cost.base import BatchStats

    bound = str(np.asarray(roof.target.stats_bound(BatchStats.of_shape(*shape))).reshape(-1)[0])  # the derivation needs "memory"
    if bound != "memory":
        raise SystemExit(f"the anchor call is {bound}-bound on {hardware}: the ratio is not a memory efficiency")
    t_roof, t_ops = float(roof.target.shape_time(*shape)), float(ops.target.shape_time(*shape))
    # the kernels' fixed times (hardware.json kernel_fixed_us, benchmarks/derive_affine.py) are no bytes: left out of the ratio
    K = float(roof.target.kernel_seconds)
    return {"hardware": hardware, "roofline_at_mbu_1_ms": t_roof * 1e3, "operators_ms": t_ops * 1e3, "kernel_fixed_ms": K * 1e3,
            "mbu": (t_roof - K) / (t_ops - K), "bound": bound}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from draftsim.sim.cost import default_catalog

    cat = default_catalog()
    rows = [derive(h) | {"catalog": cat.hardware_spec(h).mbu} for h in GPUS]
    a100 = next(r for r in rows if r["hardware"] == "a100-80g")
    held_out = {"derived": a100["mbu"], "gpt_fast_measured": GPT_FAST_A100, "error": a100["mbu"] / GPT_FAST_A100 - 1}
    same = all(round(r["mbu"], 3) == r["catalog"] for r in rows if r["hardware"] not in MEASURED)
    if a.json:
        print(json.dumps({"anchor": ANCHOR, "rows": rows, "held_out_a100": held_out, "catalog_matches": same}, indent=1))
    else:
        print(f"anchor: {ANCHOR['model']} {ANCHOR['dtype']}, batch {ANCHOR['batch']}, {ANCHOR['new_tokens']} new token, "
              f"context {ANCHOR['context']}, no engine host time")
        print(f"{'GPU':10} {'roofline at MBU 1':>18} {'operators':>10} {'MBU':>7} {'catalog':>8}")
        for r in rows:
            kept = "  (kept: measured end to end on this GPU)" if r["hardware"] in MEASURED else ""
            print(f"{r['hardware']:10} {r['roofline_at_mbu_1_ms']:15.3f} ms {r['operators_ms']:7.3f} ms {r['mbu']:7.4f} {r['catalog']:8.3f}{kept}")
        print(f"held out: A100 derived {held_out['derived']:.3f} against gpt-fast's measured {GPT_FAST_A100:.3f} "
              f"({held_out['error']:+.1%})")
        print("catalog matches the derivation" if same else "catalog DIFFERS from the derivation (sim/data/hardware.json)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
