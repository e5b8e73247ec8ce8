"""The roofline's fixed time per fused-MoE call (``fused_moe_us`` of sim/data/hardware.json) for the GPUs
with measured fused-MoE tables, derived from those tables at one anchor, and its held-out check.

The catalog roofline (sim/cost/roofline.py) priced the routed experts a call wakes as their weight bytes
at the catalog MBU, which AIConfigurator's fused-MoE tables (aiconfigurator-core 0.12.0) measure about
twice too fast at small batch. What the tables show is a fixed time per call, not an efficiency: at one
token every fused-MoE call of H100/H200 takes some 20-25 µs more than its bytes at the MBU whatever its
size (Qwen3-30B-A3B at tp 8 reads 4 µs of weights per layer and measures 21-25 µs), while the calls that
read the most (Qwen3-235B-A22B at tp 1: 122 µs of bytes) run at about the MBU. One factor on the bytes
fitted at one token (an "expert MBU": H100 0.46, H200 0.39) would price calls of 16 to 64 tokens 70-95% too slow;
a fixed time per call plus the bytes at the MBU prices both (the held-out table below).

**Anchor**: Qwen3-30B-A3B's own expert shape (hidden 2048, expert width 768, top-8 of 128), bfloat16 (its
released dtype), one GPU (moe_tp 1, moe_ep 1), one token: a batch-1 decode step. At one token every router
wakes exactly top-k experts, so the anchor does not depend on the routing the table measured (uniform,
``balanced``; the A100's table holds skewed routers only, the same at one token). The table is vLLM's (the
fused-MoE Triton kernel), as benchmarks/derive_mbu.py's anchor reads the operator model at no engine, which
reads vLLM's tables; SGLang's tables give 4.5 µs (H100) and 3.7 µs (H200) less at the anchor (printed). The fixed
time is the measured seconds of one layer less the roofline's (its bytes at the catalog MBU, its FLOPs at the
MFU), per MoE layer. One anchor, one number per GPU, nothing fitted to a published end-to-end result.

**Held out**: the other MoE shapes the tables hold that the catalog prices — Qwen3-235B-A22B and
Mixtral-8x7B (bfloat16), DeepSeek-V3 (block FP8), Qwen3-30B-A3B at tp > 1 — at tp 1, 2, 4, 8 and
1 … 64 tokens, in vLLM's and SGLang's tables (balanced routing, the roofline's uniform assumption; at more
than one token balanced routing wakes N·k experts where uniform routing wakes fewer, which the roofline
assumes). GPT-OSS's tables are MXFP4 (no catalog dtype prices it) and are left out.

    python benchmarks/derive_fused_moe.py [--json]

Exit status 1 when the catalog holds another value than this derivation (rounded to 0.1 µs).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

ANCHOR = {"model": "qwen3-30b-a3b", "dtype": "bfloat16", "tp": 1, "tokens": 1, "engine": "vllm"}
#: every GPU with measured fused-MoE tables (sim/cost/kernel_tables.py SYSTEMS)
GPUS = ("h100-sxm", "h200", "a100-80g", "b200", "gb200")
#: the held-out shapes: catalog model, dtype
HELD_OUT = (("qwen3-30b-a3b", "bfloat16"), ("qwen3-235b-a22b", "bfloat16"), ("mixtral-8x7b", "bfloat16"), ("deepseek-v3", "float8"))
TPS = (1, 2, 4, 8)
SMALL, LARGE = (1, 2, 4, 8), (16, 32, 64)


def _table(model, hardware: str, engine: str, dtype: str, tp: int):
    """The fused-MoE table's rows for the shape, balanced routing where measured, else AIConfigurator's skewed default."""
    from draftsim.sim.cost.moe_tables import DISTRIBUTION, measured_experts

    for dist in ("balanced", DISTRIBUTION):
        rows = measured_experts(model, hardware, engine, dtype, tp, False, dist)
        if rows is not None:
            return rows
    return None


def _roofline_layer(model, hardware: str, dtype: str, tp: int, tokens, fused_moe: float | None = 0.0) -> np.ndarray:
    """The catalog roofline's routed experts of one MoE layer for calls of ``tokens`` (seconds)."""
    from draftsim.sim.cost import default_catalog
    from draftsim.sim.cost.roofline import RooflineModel

    roof = RooflineModel(model, default_catalog().hardware_spec(hardware), dtype, tp, check_memory=False, fused_moe=fused_moe)
    return np.asarray(roof.expert_seconds(np.asarray(tokens, np.float64)), np.float64) / model.moe_layers


def derive(hardware: str, engine: str = ANCHOR["engine"]) -> dict | None:
    """The anchor's measured and roofline seconds per layer, and the fixed time (µs) their difference gives."""
    from draftsim.sim.cost import default_catalog

    model = default_catalog().model(ANCHOR["model"])
    rows = _table(model, hardware, engine, ANCHOR["dtype"], ANCHOR["tp"])
    if rows is None:
        return None
    measured = float(rows(np.array([ANCHOR["tokens"]]))[0])
    roof = float(_roofline_layer(model, hardware, ANCHOR["dtype"], ANCHOR["tp"], [ANCHOR["tokens"]])[0])
    return {"hardware": hardware, "engine": engine, "table": rows.source.split("/systems/")[-1], "kernel": rows.kernel,
            "distribution": rows.distribution, "measured_us": measured * 1e6, "roofline_us": roof * 1e6,
            "fused_moe_us": (measured - roof) * 1e6}


def held_out(hardware: str, fused_moe_us: float) -> list[dict]:
    """Each held-out (shape, engine table, tp, tokens): the table's seconds per layer and the roofline's
    without and with the fixed time."""
    from draftsim.sim.cost import default_catalog

    cat, out = default_catalog(), []
    for name, dtype in HELD_OUT:
        model = cat.model(name)
        for engine in ("vllm", "sglang"):
            for tp in TPS:
                if (name, tp) == (ANCHOR["model"], ANCHOR["tp"]) or model.heads % tp:
                    continue
                rows = _table(model, hardware, engine, dtype, tp)
                if rows is None:
                    continue
                n = np.array([x for x in SMALL + LARGE if rows.tokens[0] <= x <= rows.tokens[-1]], np.float64)
                meas = rows(n)
                plain = _roofline_layer(model, hardware, dtype, tp, n)
                fixed = _roofline_layer(model, hardware, dtype, tp, n, fused_moe_us * 1e-6)
                out += [{"model": name, "dtype": dtype, "engine": engine, "tp": tp, "tokens": int(k), "measured_us": m * 1e6,
                         "plain_error": p / m - 1, "fixed_error": f / m - 1} for k, m, p, f in zip(n, meas, plain, fixed)]
    return out


def summary(rows: list[dict], tokens) -> dict:
    """Median and worst |error| of the plain and the fixed-time roofline over the rows at ``tokens``."""
    sel = [r for r in rows if r["tokens"] in tokens]
    if not sel:
        return {}
    p, f = (np.array([r[k] for r in sel]) for k in ("plain_error", "fixed_error"))
    return {"points": len(sel), "plain_median": float(np.median(np.abs(p))), "plain_worst": float(np.abs(p).max()),
            "plain_bias": float(np.median(p)), "fixed_median": float(np.median(np.abs(f))), "fixed_worst": float(np.abs(f).max()),
            "fixed_bias": float(np.median(f))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from draftsim.sim.cost import default_catalog

    cat = default_catalog()
    rows = []
    for hw in GPUS:
        r = derive(hw)
        if r is None:
            continue
        r["catalog_us"] = cat.hardware_spec(hw).fused_moe * 1e6
        alt = derive(hw, "sglang")
        r["sglang_fused_moe_us"] = None if alt is None else alt["fused_moe_us"]
        checks = held_out(hw, r["fused_moe_us"])
        r["held_out"] = {"1-8 tokens": summary(checks, SMALL), "one token": summary(checks, (1,)), "16-64 tokens": summary(checks, LARGE)}
        r["held_out_points"] = checks
        rows.append(r)
    same = all(round(r["fused_moe_us"], 1) == round(r["catalog_us"], 1) for r in rows)
    if a.json:
        print(json.dumps({"anchor": ANCHOR, "rows": rows, "catalog_matches": same}, indent=1))
        return 0 if same else 1
    print(f"anchor: {ANCHOR['model']}'s routed experts, {ANCHOR['dtype']}, tp {ANCHOR['tp']}, {ANCHOR['tokens']} token, "
          f"{ANCHOR['engine']}'s fused-MoE table; per MoE layer")
    print(f"{'GPU':10} {'measured':>9} {'roofline':>9} {'fixed':>8} {'catalog':>8} {'(sglang table)':>15}  table")
    for r in rows:
        alt = "—" if r["sglang_fused_moe_us"] is None else f"{r['sglang_fused_moe_us']:.1f} us"
        print(f"{r['hardware']:10} {r['measured_us']:6.1f} us {r['roofline_us']:6.1f} us {r['fused_moe_us']:5.1f} us "
              f"{r['catalog_us']:5.1f} us {alt:>15}  {r['table']} ({r['kernel']}, {r['distribution']})")
    print("held out (other shapes and tp, both engines' tables): the roofline's routed experts per layer against the table, "
          "median / worst |error| (median signed error)")
    for r in rows:
        for what, s in r["held_out"].items():
            if s:
                print(f"  {r['hardware']:9} {what:12} {s['points']:3d} points: MBU only {s['plain_median']:6.1%} / {s['plain_worst']:6.1%} "
                      f"({s['plain_bias']:+.1%}); + fixed time {s['fixed_median']:6.1%} / {s['fixed_worst']:6.1%} ({s['fixed_bias']:+.1%})")
    print("catalog matches the derivation" if same else "catalog DIFFERS from the derivation (sim/data/hardware.json fused_moe_us)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
