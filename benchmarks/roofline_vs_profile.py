"""The roofline cost model (catalog smollm2-135m on h100-sxm) against the measured H100 profile.

    python benchmarks/roofline_vs_profile.py figures/gpu-h100/h100_smollm2.json [--json]

Relative error of every profile point (roofline / measured - 1) for the catalog's roofline as it
is, with the per-call overhead fitted (sim.cost.roofline.fit_overhead, as draftsim profile --probe
does for the CPU), and with overhead and MFU fitted.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from draftsim.sim.cost import load_profile
from draftsim.sim.cost.catalog import default_catalog
from draftsim.sim.cost.roofline import RooflineModel, fit_overhead


def errors(model, B, N, C, seconds) -> dict:
    err = np.asarray(model.shape_time(B, N, C)) / seconds - 1
    return {"median_abs": float(np.median(np.abs(err))), "worst_abs": float(np.max(np.abs(err))),
            "overhead_s": float(model.overhead + model.overhead_per_layer * model.model.layers), "mfu": float(model.mfu)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile")
    p.add_argument("--hardware", default="h100-sxm")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    prof = load_profile(a.profile)
    cat = default_catalog()
    roof = RooflineModel(cat.model(a.model), cat.hardware_spec(a.hardware), prof.dtype, check_memory=False)
    B, N, C = np.meshgrid(prof.batch, prof.new_tokens, prof.context, indexing="ij")
    out = {"profile": a.profile, "hardware": a.hardware, "model": a.model, "dtype": prof.dtype,
           "measured_s": {"median": float(np.median(prof.seconds)), "min": float(prof.seconds.min()), "max": float(prof.seconds.max())},
           "roofline_compute_memory_only_s": {"min": float(roof.with_overhead(0.0).shape_time(B, N, C).min()),
                                              "max": float(roof.with_overhead(0.0).shape_time(B, N, C).max())},
           "catalog": errors(roof, B, N, C, prof.seconds),
           "fit_overhead": errors(fit_overhead(roof, B, N, C, prof.seconds), B, N, C, prof.seconds),
           "fit_overhead_and_mfu": errors(fit_overhead(roof, B, N, C, prof.seconds, fit_mfu=True), B, N, C, prof.seconds)}
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{a.model} on {a.hardware} ({prof.dtype}) vs {a.profile}: measured {1e3 * out['measured_s']['min']:.1f}.."
          f"{1e3 * out['measured_s']['max']:.1f} ms (median {1e3 * out['measured_s']['median']:.1f}); roofline without overhead "
          f"{1e3 * out['roofline_compute_memory_only_s']['min']:.3f}..{1e3 * out['roofline_compute_memory_only_s']['max']:.3f} ms")
    for key in ("catalog", "fit_overhead", "fit_overhead_and_mfu"):
        e = out[key]
        print(f"  {key:22s} median |err| {100 * e['median_abs']:7.1f}%  worst {100 * e['worst_abs']:8.1f}%  "
              f"overhead {1e3 * e['overhead_s']:.2f} ms/call  MFU {e['mfu']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
