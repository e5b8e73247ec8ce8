"""The roofline's fixed GPU time per kernel (``kernel_fixed_us`` of sim/data/hardware.json) on the Hopper and Blackwell
GPUs with measured operator tables, and their MBU re-derived with those fixed times in place.

Issue 37 item 1 (docs/research/affine-roofline.md, "option 1", reduced to the existing roofline; adopted after a trial).
Each kernel kind of AIConfigurator's vLLM tables (aiconfigurator-core 0.12.0) is fitted as

    t = f + max(bytes / (eta · BW), FLOPs / (mfu · peak))

by least squares of log(predicted / measured), on the rows of the shapes Llama and Qwen models use at
tp 1/2/4/8 that no other family uses (``efficiency.family_holdout``'s selection), as the research note's
prototype did; only f is kept:

* GEMM: ``gemm_perf.parquet`` rows, draftsim's ``gemm_terms``;
* decode attention: ``generation_attention_perf.parquet`` rows, ``decode_attention_terms`` (plain bytes);
* all-reduce: ``custom_allreduce_perf.parquet``'s CUDA-graph rows, all GPU counts, ``allreduce_terms``;
* elementwise: AIConfigurator's memory-op formula's constant (``mem_op_constants``: 3 µs a kernel), the one
  the operator model already prices these kernels with.

The roofline adds f per kernel a call runs (sim/cost/roofline.py ``kernel_counts``: a dense layer's 4
GEMMs, 1 attention and 3 elementwise kernels), and at tp > 1 prices each of the 2 all-reduces per layer
with the all-reduce's f in place of the catalog's assumed interconnect latency. The MBU is then re-derived
as benchmarks/derive_mbu.py does (Llama-3.1-8B, bfloat16, batch 1, one token, context 512, the tables'
time, no host time), with the fixed times K in place:

    MBU = (roofline at MBU 1 − K) / (operators − K)

so that the anchor call's roofline time equals the tables' time by construction. Nothing is fitted to a
published end-to-end number. The A100 and GPUs without tables are left as they are.

The Blackwell GPUs with tables (b200, gb200: vLLM 0.24.0's tables, FlashInfer's TRT-LLM attention kernels) are
derived the same way and were adopted on the research note's held-out check (``--check``): a decode step's GPU
time (no host) of every catalog model the tables price, tp 1/2/4/8, batch 1 and 32, context 512, against the
tables' own step (``--cost-model operators``), split into the families the fit used (Llama, Qwen) and the others
(SmolLM2, Gemma-2, Mistral/Mixtral, DeepSeek-V3 in float8), the roofline with the derived terms (fixed times, MBU and
benchmarks/derive_fused_moe.py's fused-MoE time at that MBU, as the catalog holds them) beside the one efficiency it
had before (:data:`CONSTANT_MBU`: MBU and fused-MoE time, no fixed times). B200 held out at batch 1: 37.7% -> 10.0%
median |error| (worst 94.3% -> 45.6%); GB200: 36.7% -> 11.5% (94.7% -> 60.6%).

FP8 GEMMs (issue 37 item 1; derived and adopted as ``kernel_fixed_us.gemm_float8``): the same form on the same vLLM tables' ``fp8`` rows
(:func:`fp8_gemm`: vLLM's per-tensor CUTLASS kernel, the Llama/Qwen shapes), f 4.94 / 4.66 / 5.58 / 5.58 µs on
h100-sxm / h200 / b200 / gb200 against the bfloat16 GEMM's 2.68 / 2.70 / 2.13 / 2.13 µs (and eta 0.43-0.53 against
0.63-0.76). ``--check --fp8`` scores it as ``kernel_fixed_us.gemm_float8`` (sim/cost/roofline.py picks a GEMM's fixed time by
the call's dtype): only DeepSeek-V3's float8 rows move, the held-out and fit-family medians stay where they were on every
GPU (DeepSeek-V3 is the only float8 family, and its rows lie above the medians), while every row it moves, all of them
held out, comes closer to the tables: the worst held-out row at batch 1 h200 50.6% -> 43.3%, b200 45.6% -> 27.8%, gb200
60.6% -> 46.2%; DeepSeek-V3 at batch 32 h200 -24.2% -> -20.8%, b200 -16.9% -> -7.6%, gb200 TP 8 -26.2% -> -17.7%. It is
adopted on that: a held-out family improves and nothing else moves. Its in-sample fit is looser than the bfloat16 GEMM's
(median 24.6-28.4% against the form's own); only f is kept, the bytes stay at the catalog's MBU. ``--check --fp8`` scores
the catalog's terms without it (before) against them with it (after).

    python benchmarks/derive_affine.py [--write] [--json] [--check] [--fp8]

``--write`` puts the derived ``kernel_fixed_us`` and ``mbu`` into sim/data/hardware.json (then rerun
benchmarks/derive_fused_moe.py, whose fused-MoE fixed time is derived at the MBU). Exit status 1 when the
catalog holds other values than this derivation (f rounded to 0.01 µs, MBU to 3 decimals).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

GPUS = ("h100-sxm", "h200", "b200", "gb200")
FIT = ("llama", "qwen")
#: Each GPU's roofline before its derivation was adopted: one efficiency (MBU) and the fused-MoE time at it, no fixed times
#: (sim/data/hardware.json after commits cc6b7ba (MBU) and 0b17c42 (fused-MoE time) for the Hopper GPUs; b200 and gb200 held gpt-fast's A100 figure, 0.7,
#: and no fused-MoE time). ``--check`` scores it beside the derived terms.
CONSTANT_MBU = {"h100-sxm": (0.737, 18.5), "h200": (0.650, 16.0), "b200": (0.7, 0.0), "gb200": (0.7, 0.0)}
#: ``--check``'s models: the fit's families and the held-out ones (docs/research/affine-roofline.md, part (a)); DeepSeek-V3 in float8
CHECK_MODELS = ("llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b", "qwen3-0.6b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "smollm2-135m",
                "smollm2-1.7b", "gemma-2-2b", "gemma-2-9b", "gemma-2-27b", "mistral-7b", "mixtral-8x7b", "deepseek-v3")
CHECK_DTYPE = {"deepseek-v3": "float8"}
ANCHOR = {"model": "llama-3.1-8b", "dtype": "bfloat16", "batch": 1, "new_tokens": 1, "context": 512}
HARDWARE_JSON = Path(__file__).resolve().parents[1] / "sim" / "data" / "hardware.json"


def fit_affine(t_mem, t_cmp, seconds, compute: bool = True) -> dict:
    """f (seconds), eta, mfu minimising Σ log(predicted / measured)², f >= 0, 0.02 <= eta, mfu <= 2 (deterministic start)."""
    from scipy.optimize import least_squares

    t_mem, t_cmp, y = (np.asarray(a, np.float64) for a in (t_mem, t_cmp, seconds))
    floor = float(y.min())

    def pred(p):
        return p[0] * floor + np.maximum(t_mem / p[1], t_cmp / p[2] if compute else 0.0)

    p = least_squares(lambda p: np.log(pred(p) / y), x0=[0.5, 0.7, 0.6], bounds=([0, 0.02, 0.02], [1.0, 2.0, 2.0])).x
    e = np.abs(pred(p) / y - 1)
    return {"f": float(p[0] * floor), "eta": float(p[1]), "mfu": float(p[2]) if compute else None, "rows": int(len(y)),
            "fit_median_error": float(np.median(e))}


def _family_keys(models, kind, ngrid=None, kgrid=None) -> dict:
    from draftsim.sim.cost.efficiency import TP_SIZES, attention_layouts, family_of, gemm_shapes, grid_bracket

    fams = {}
    for name, m in models.items():
        fams.setdefault(family_of(name), []).append(m)
    if kind == "gemm":
        return {f: {(a, b) for m in ms for tp in TP_SIZES for _, n, k in gemm_shapes(m, tp)
                    for a in grid_bracket(n, ngrid) for b in grid_bracket(k, kgrid)} for f, ms in fams.items()}
    return {f: {lay for m in ms for tp in TP_SIZES for lay in attention_layouts(m, tp)} for f, ms in fams.items()}


def _fit_rows(rowkeys, keys) -> np.ndarray:
    """efficiency._holdout's selection: the Llama/Qwen shapes that no other family uses."""
    fit_keys = set().union(*(keys.get(f, set()) for f in FIT))
    held_keys = set().union(*(v for f, v in keys.items() if f not in FIT))
    return np.array([k in fit_keys and k not in held_keys for k in rowkeys])


def kinds(hardware: str) -> dict:
    """The fitted kinds of one GPU's vLLM tables, f in µs."""
    from draftsim.sim.cost import default_catalog
    from draftsim.sim.cost.efficiency import Roofs, allreduce_terms, decode_attention_terms, family_of, gemm_terms, read_tables
    from draftsim.sim.cost.kernel_tables import SYSTEMS, systems_root
    from draftsim.sim.cost.operators import mem_op_constants

    cat = default_catalog()
    roofs = Roofs.of(cat.hardware_spec(hardware))
    t = read_tables(systems_root(), SYSTEMS[hardware], "vllm")
    models = {n: cat.model(n) for n in cat.models if family_of(n)}
    out = {}
    df = t.frames["gemm"]
    ngrid, kgrid = np.sort(df.n.unique()).astype(float), np.sort(df.k.unique()).astype(float)
    sel = _fit_rows(list(zip(df.n.astype(float), df.k.astype(float))), _family_keys(models, "gemm", ngrid, kgrid))
    tm, tc, _ = gemm_terms(roofs, df.m.to_numpy(), df.n.to_numpy(), df.k.to_numpy())
    out["gemm"] = fit_affine(tm[sel], tc[sel], df.latency.to_numpy(np.float64)[sel] * 1e-3)
    df = t.frames["decode attention"]
    sel = _fit_rows(list(zip(df.num_heads, df.num_key_value_heads, df.head_dim)), _family_keys(models, "attention"))
    tm, tc, _ = decode_attention_terms(roofs, df.batch_size.to_numpy(), df.step.to_numpy() + 1, df.num_heads.to_numpy(),
                                       df.num_key_value_heads.to_numpy(), df.head_dim.to_numpy())
    out["attention"] = fit_affine(tm[sel], tc[sel], df.latency.to_numpy(np.float64)[sel] * 1e-3)
    ar = t.frames["allreduce"]
    tm, _, _ = allreduce_terms(roofs, ar.message_size.to_numpy(), ar.num_gpus.to_numpy())
    out["allreduce"] = fit_affine(tm, 0 * tm, ar.latency.to_numpy(np.float64) * 1e-3, compute=False)
    _, _, const = mem_op_constants(systems_root(), SYSTEMS[hardware])
    out["elementwise"] = {"f": float(const), "eta": None, "mfu": None, "rows": 0, "fit_median_error": None}
    for v in out.values():
        v["f_us"] = round(v.pop("f") * 1e6, 2)
    return out


def fp8_gemm(hardware: str, models=None) -> dict:
    """The FP8 GEMM's fit (f in seconds) on the same vLLM table's ``fp8`` rows: vLLM's per-tensor CUTLASS kernel
    (``CutlassFP8ScaledMMLinearKernel``), the one FP8 kernel the table measures on the whole grid the bfloat16 rows
    use (m from 1) and the one the operator model prices a block-FP8 GEMM with below DeepGEMM's and CUTLASS's
    block-scaled rows (none under 16 tokens: sim/cost/moe_tables.py ``_gemm_grid``); the same Llama/Qwen shapes
    and the same form, its weights and input activations at 1 byte, its output in bfloat16, FLOPs at the float8 peak."""
    from draftsim.sim.cost import default_catalog
    from draftsim.sim.cost.efficiency import family_of, newest_table
    from draftsim.sim.cost.kernel_tables import SYSTEMS, read_columns, systems_root

    cat = default_catalog()
    hw = cat.hardware_spec(hardware)
    models = models or {n: cat.model(n) for n in cat.models if family_of(n)}
    path = newest_table(systems_root(), SYSTEMS[hardware], "gemm", "vllm", "gemm_perf.parquet")
    df = read_columns(str(path), ("kernel_source", "gemm_dtype", "m", "n", "k", "latency"))
    df = df[df.gemm_dtype == "fp8"]
    ngrid, kgrid = np.sort(df.n.unique()).astype(float), np.sort(df.k.unique()).astype(float)
    sel = _fit_rows(list(zip(df.n.astype(float), df.k.astype(float))), _family_keys(models, "gemm", ngrid, kgrid))
    m, n, k = (df[c].to_numpy(np.float64) for c in ("m", "n", "k"))
    t_mem = (n * k + m * k + 2 * m * n) / hw.memory_bandwidth
    t_cmp = 2 * m * n * k / hw.peak("float8")
    out = fit_affine(t_mem[sel], t_cmp[sel], df.latency.to_numpy(np.float64)[sel] * 1e-3)
    out["kernel"] = ", ".join(sorted(df.kernel_source.unique()))
    return out


def derived_fixed(hardware: str) -> dict:
    """The fixed time per kernel kind of one GPU as the catalog holds it, µs: the fitted kinds (:func:`kinds`) and the
    FP8 GEMM's (:func:`fp8_gemm`, as ``gemm_float8``)."""
    fixed = {kind: v["f_us"] for kind, v in kinds(hardware).items()}
    fixed["gemm_float8"] = round(fp8_gemm(hardware)["f"] * 1e6, 2)
    return fixed


def mbu(hardware: str, kernel_fixed_us: dict) -> dict:
    """The anchor's MBU with the fixed times in place: (roofline at MBU 1 − K) / (operators − K)."""
    from draftsim.sim.cost import default_catalog
    from draftsim.sim.cost.assembly import Deployment, assemble
    from draftsim.sim.cost.roofline import RooflineModel

    cat = default_catalog()
    hw, m = cat.hardware_spec(hardware), cat.model(ANCHOR["model"])
    shape = (ANCHOR["batch"], ANCHOR["new_tokens"], ANCHOR["context"])
    fixed = {k: v * 1e-6 for k, v in kernel_fixed_us.items()}
    bare = RooflineModel(m, hw, ANCHOR["dtype"], mbu=1.0, kernel_fixed={}, check_memory=False)
    K = RooflineModel(m, hw, ANCHOR["dtype"], mbu=1.0, kernel_fixed=fixed, check_memory=False).kernel_seconds
    ops = assemble(Deployment(ANCHOR["model"], hardware, dtype=ANCHOR["dtype"], overheads="none", cost_model="operators"))
    t_bytes, t_ops = float(bare.shape_time(*shape)), float(ops.target.shape_time(*shape))
    value = t_bytes / (t_ops - K)
    check = float(RooflineModel(m, hw, ANCHOR["dtype"], mbu=round(value, 3), kernel_fixed=fixed, check_memory=False).shape_time(*shape))
    return {"roofline_at_mbu_1_ms": t_bytes * 1e3, "kernel_fixed_ms": K * 1e3, "operators_ms": t_ops * 1e3, "mbu": value,
            "old_mbu": hw.mbu, "anchor_with_rounded_mbu_ms": check * 1e3}


def check(hardware: str, batches=(1, 32), context: int = 512, tps=(1, 2, 4, 8), kernel_fixed_us: dict | None = None) -> dict:
    """The held-out check: each decode step's error against the tables' step, under the catalog roofline as it stands
    (``derived``) and under the one efficiency it had before (``constant``: :data:`CONSTANT_MBU`, no fixed times);
    median / worst |error| by held-out or fit families and batch."""
    from draftsim.sim.cost import default_catalog
    from draftsim.sim.cost.assembly import Deployment, assemble
    from draftsim.sim.cost.efficiency import family_of
    from draftsim.sim.cost.roofline import RooflineModel
    from draftsim.sim.errors import DraftsimError

    cat = default_catalog()
    hw = cat.hardware_spec(hardware)
    mbu0, fused0 = CONSTANT_MBU[hardware]
    rows = []
    for name in CHECK_MODELS:
        dt, m = CHECK_DTYPE.get(name, "bfloat16"), cat.model(name)
        for tp in tps:
            try:
                ops = assemble(Deployment(name, hardware, dtype=dt, tp=tp, overheads="none", cost_model="operators")).target
                derived = RooflineModel(m, hw, dt, tp, kernel_fixed=None if kernel_fixed_us is None else
                                        {k: v * 1e-6 for k, v in kernel_fixed_us.items()})
            except DraftsimError:  # does not fit on tp devices, or heads that do not split over them
                continue
            constant = RooflineModel(m, hw, dt, tp, mbu=mbu0, kernel_fixed={}, fused_moe=fused0 * 1e-6)
            for b in batches:
                ref = float(ops.shape_time(b, 1, context))
                rows.append({"model": name, "tp": tp, "batch": b, "held_out": family_of(name) not in FIT, "tables_ms": ref * 1e3,
                             "constant": float(constant.shape_time(b, 1, context)) / ref - 1,
                             "derived": float(derived.shape_time(b, 1, context)) / ref - 1})
    summary = {}
    for label, held in (("held out", True), ("fit families", False)):
        for b in batches:
            sel = [r for r in rows if r["held_out"] == held and r["batch"] == b]
            c, d = (np.abs([r[k] for r in sel]) for k in ("constant", "derived"))
            summary[f"{label}, batch {b}"] = {"steps": len(sel), "constant_median": float(np.median(c)), "constant_worst": float(c.max()),
                                              "derived_median": float(np.median(d)), "derived_worst": float(d.max())}
    return {"hardware": hardware, "constant_mbu": mbu0, "constant_fused_moe_us": fused0, "rows": rows, "summary": summary}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write kernel_fixed_us and mbu into sim/data/hardware.json")
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true", help="the held-out check: whole decode steps against the tables' (slow: ~10 s a GPU)")
    p.add_argument("--fp8", action="store_true", help="the FP8 GEMM's fixed time (fp8_gemm, gemm_float8); with --check: "
                   "score the catalog's terms (derived) against them without it (before)")
    a = p.parse_args(argv)
    from draftsim.sim.cost import default_catalog

    cat = default_catalog()
    if a.fp8 and not a.check:
        fits = {hw: fp8_gemm(hw) for hw in GPUS}
        if a.json:
            print(json.dumps(fits, indent=1))
            return 0
        print("FP8 GEMM fitted on AIConfigurator's vLLM tables' fp8 rows (Llama/Qwen shapes; the catalog's gemm_float8): "
              "f (us), eta, mfu, rows, in-sample median |error|, beside the bfloat16 GEMM's f")
        for hw, v in fits.items():
            print(f"  {hw:9} {v['kernel']}: f {v['f'] * 1e6:6.2f} us  eta {v['eta']:.3f} mfu {v['mfu']:.3f} {v['rows']:5d} rows, "
                  f"median {v['fit_median_error']:.1%}; bfloat16 GEMM {cat.hardware_spec(hw).kernel_fixed['gemm'] * 1e6:.2f} us")
        return 0
    if a.check:
        checks = [check(hw) for hw in GPUS]
        if a.fp8:  # the catalog's terms without the FP8 GEMM's fixed time (before) against them with it (derived)
            for c, hw in zip(checks, GPUS):
                kf = {k: v * 1e6 for k, v in cat.hardware_spec(hw).kernel_fixed.items() if k != "gemm_float8"}
                base = check(hw, kernel_fixed_us=kf)
                for r, rb in zip(c["rows"], base["rows"]):
                    r["constant"] = rb["derived"]
                c["summary"] = {k: dict(v, constant_median=base["summary"][k]["derived_median"],
                                        constant_worst=base["summary"][k]["derived_worst"]) for k, v in c["summary"].items()}
                c["constant_mbu"], c["constant_fused_moe_us"] = "catalog", "catalog"
        if a.json:
            print(json.dumps(checks, indent=1))
            return 0
        print("held-out check: decode steps (context 512, GPU time, no host) against the tables' step; median / worst |error|")
        for c in checks:
            print(f"{c['hardware']}: the catalog's terms without the FP8 GEMM's fixed time before, with it after" if a.fp8 else
                  f"{c['hardware']}: one efficiency before (MBU {c['constant_mbu']}, fused-MoE {c['constant_fused_moe_us']} us, no fixed times) "
                  "against the catalog's derived terms")
            for label, s in c["summary"].items():
                print(f"  {label:22} {s['steps']:3d} steps: before {s['constant_median']:6.1%} / {s['constant_worst']:6.1%}; "
                      f"derived {s['derived_median']:6.1%} / {s['derived_worst']:6.1%}")
        return 0
    rows = {}
    for hw in GPUS:
        k = kinds(hw)
        fixed = derived_fixed(hw)
        rows[hw] = {"kinds": k, "kernel_fixed_us": fixed, **mbu(hw, fixed)}
    same = all(round(r["mbu"], 3) == cat.hardware_spec(hw).mbu
               and {k: round(v * 1e6, 2) for k, v in cat.hardware_spec(hw).kernel_fixed.items()} == r["kernel_fixed_us"]
               for hw, r in rows.items())
    if a.json:
        print(json.dumps({"anchor": ANCHOR, "rows": rows, "catalog_matches": same}, indent=1))
    else:
        print("kinds fitted on AIConfigurator's vLLM tables (Llama/Qwen shapes): f (us), eta, mfu, rows, in-sample median |error|")
        for hw, r in rows.items():
            for kind, v in r["kinds"].items():
                eta = "" if v["eta"] is None else f"eta {v['eta']:.3f}"
                mfu = "" if v["mfu"] is None else f"mfu {v['mfu']:.3f}"
                err = "(AIConfigurator's memory-op constant)" if v["rows"] == 0 else f"{v['rows']:5d} rows, median {v['fit_median_error']:.1%}"
                print(f"  {hw:9} {kind:12} f {v['f_us']:6.2f} us  {eta:10} {mfu:10} {err}")
        print(f"anchor: {ANCHOR['model']} {ANCHOR['dtype']}, batch {ANCHOR['batch']}, {ANCHOR['new_tokens']} new token, "
              f"context {ANCHOR['context']}, no host time; MBU = (roofline at MBU 1 - K) / (operators - K)")
        print(f"{'GPU':9} {'bytes at MBU 1':>15} {'K (fixed)':>10} {'operators':>10} {'MBU':>7} {'was':>6} {'anchor after':>13}")
        for hw, r in rows.items():
            print(f"{hw:9} {r['roofline_at_mbu_1_ms']:12.3f} ms {r['kernel_fixed_ms']:7.3f} ms {r['operators_ms']:7.3f} ms "
                  f"{r['mbu']:7.4f} {r['old_mbu']:6.3f} {r['anchor_with_rounded_mbu_ms']:10.3f} ms")
        print("catalog matches the derivation" if same else "catalog DIFFERS from the derivation (sim/data/hardware.json)")
    if a.write:
        data = json.loads(HARDWARE_JSON.read_text())
        for hw, r in rows.items():
            e = data["hardware"][hw]
            e["mbu"] = round(r["mbu"], 3)
            e["kernel_fixed_us"] = r["kernel_fixed_us"]
        HARDWARE_JSON.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote kernel_fixed_us and mbu of {', '.join(rows)} into {HARDWARE_JSON}")
        return 0
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
