"""MoE decode priced from AIConfigurator's measured tables (sim/cost/moe_tables.py) against published decode times."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from draftsim.sim.cost import RooflineModel, default_catalog
from draftsim.sim.cost.overheads import engine_overheads
from draftsim.sim.errors import DraftsimError

pytest.importorskip("pyarrow")
try:
    from draftsim.sim.cost.kernel_tables import systems_root

    systems_root()
except Exception:  # the operators extra is not installed: the plain roofline stays, these tests skip
    pytest.skip("aiconfigurator-core tables not installed", allow_module_level=True)

from draftsim.sim.cost.moe_tables import _sglang_fuses_shared_expert as SGLANG_FUSES  # noqa: E402
from draftsim.sim.cost.moe_tables import decode_step, measured_experts, tokens_per_awake_expert  # noqa: E402

CAT = default_catalog()
DATA = json.loads((Path(__file__).resolve().parents[3] / "benchmarks" / "published" / "moe" / "decode.json").read_text())


def _deepseek_points():
    return [p for p in DATA["points"] if p["model"] == "deepseek-v3" and p["hardware"] == "h200" and p.get("scored")]


def _tables_ms(p):
    eng = engine_overheads(p["engine"])
    return decode_step(CAT.model(p["model"]), p["hardware"], p["engine"], p["dtype"], p["tp"], p["batch"], p["context"],
                       host=eng.per_step, overlap=bool(eng.plain_overlap)).seconds * 1e3


def test_grouped_gemm_efficiency_is_low_at_one_row_per_expert_and_rises_with_rows():
    """DeepSeek-V3's routed experts at TP 8 on H200 (vLLM's fused-MoE Triton kernel): at one decoding token each
    of 8 experts gets one row and the measured kernel runs far below the roofline; the efficiency rises as
    each awake expert receives more rows while the layer stays memory-bound (1 to 64 tokens: 1 to ~2.3 rows per
    expert; beyond, the kernel meets the FP8 compute roof at a lower fraction, 27% at 4,096 tokens)."""
    m = CAT.model("deepseek-v3")
    table = measured_experts(m, "h200", "vllm", "float8", tp=8)
    assert table is not None and "triton" in table.kernel and table.moe_dtype == "fp8_block"
    # the plain roofline of the experts' bytes and FLOPs (without the catalog's fixed time per fused-MoE call)
    roof = RooflineModel(m, CAT.hardware_spec("h200"), "float8", tp=8, moe_efficiency=False, fused_moe=0.0)
    B, P = roof.hardware.memory_bandwidth, roof.peak  # the hardware's own peaks: efficiency against the datasheet
    n = np.array([1.0, 8.0, 64.0])
    per_layer = roof._experts.seconds(n, B, P) / m.moe_layers
    eff = table.efficiency(n, per_layer)
    assert np.all(eff > 0) and np.all(eff < 1)
    assert eff[0] < 0.35 and np.all(np.diff(eff) > 0)
    rows = tokens_per_awake_expert(n, m.experts, m.experts_per_token)
    assert rows[0] == pytest.approx(1.0) and np.all(np.diff(rows) > 0)


def test_a_batch1_decode_step_has_every_part_measured_and_costs_more_than_the_roofline():
    m = CAT.model("deepseek-v3")
    step = decode_step(m, "h200", "vllm", "float8", tp=8, batch=1, context=512)
    assert not step.missing
    assert {"routed experts", "attention (MLA block)", "all-reduce (2 per layer)"} <= set(step.parts)
    assert all("aiconfigurator_core" in step.sources[k] for k in ("routed experts", "attention (MLA block)"))
    roof = RooflineModel(m, CAT.hardware_spec("h200"), "float8", tp=8)
    # the roofline's forward (6.5 ms with its kernels' fixed times, the FP8 GEMMs' their own; 5.6 ms with one GEMM fixed
    # time; 2.8 ms before them) still prices under 60% of the small-M inefficiency the tables measure (11.2 ms): MLA's
    # parts and the experts at one row each
    assert float(roof.shape_time(1, 1, 512)) < 0.6 * step.seconds and roof.kernel_seconds > 0


def test_tables_are_closer_than_the_roofline_to_the_scored_deepseek_measurements():
    """At the median over the scored points (benchmarks/bench_moe.py: tables 8.7%, the roofline 37.3% with its experts at
    the catalog's MBU; the tables' SGLang step is SGLang's own MLA parts and fused shared expert)."""
    from draftsim.sim.cost.assembly import Deployment, assemble

    pts = _deepseek_points()
    assert len(pts) >= 3
    tables, roofs = [], []
    for p in pts:
        a = assemble(Deployment(p["model"], p["hardware"], (), tp=p["tp"], dtype=p["dtype"], overheads=p["engine"]))
        roofs.append(abs(float(a.target.shape_time(p["batch"], 1, p["context"])) * 1e3 / p["published_tpot_ms"] - 1))
        tables.append(abs(_tables_ms(p) / p["published_tpot_ms"] - 1))
    assert np.median(tables) < np.median(roofs)


def test_deepseek_v3_8x_h200_decode_within_25_percent_of_the_cited_measurements():
    """Issue 37's check on InferenceX issue 870's SGLang v0.5.7 runs (batch 4-8; no batch-1 8x H200 measurement of a
    current engine was found): -5.5%, -12.3%, -8.7% (benchmarks/bench_moe.py). Not tuned: what moved the step from
    24.5-35% high was pricing SGLang from its own tables as SGLang and AIConfigurator compose it (the MLA parts in place
    of vLLM's block, the shared expert fused) and SGLang's default bfloat16 KV cache (at FP8 KV: +15.5%, +21.5%, +2.3%).
    The remaining shortfall is what the step leaves out: the other requests' prefills inside each request's TPOT."""
    for p in _deepseek_points():
        assert _tables_ms(p) == pytest.approx(p["published_tpot_ms"], rel=0.25), p["label"]


def test_sglang_prices_its_mla_part_by_part_from_its_own_tables_and_fuses_the_shared_expert():
    m = CAT.model("deepseek-v3")
    step = decode_step(m, "h200", "sglang", "float8", tp=8, batch=4, context=5120)
    assert not step.missing
    mla = [k for k in step.parts if k.startswith("MLA ")]
    assert len(mla) == 6 and "attention (MLA block)" not in step.parts
    for k in mla:  # every part from SGLang's own tables, the one that priced it named
        assert "/sglang/" in step.sources[k] and "aiconfigurator_core" in step.sources[k]
    assert "mla_bmm_perf" in step.sources["MLA absorbed BMM (q·W_UK)"] and "generation_mla_perf" in step.sources["MLA attention kernel"]
    assert "kv bfloat16" in step.sources["MLA attention kernel"]  # SGLang's --kv-cache-dtype auto
    assert "/moe/sglang/" in step.sources["routed experts"]
    # the shared expert rides in the fused-MoE call: one more awake expert, no GEMMs of its own
    assert not any("shared expert gate" in k for k in step.parts)
    assert 0 < step.parts["shared expert (fused, estimated)"] < 0.1 * step.parts["routed experts"]
    # FP8 KV reads the kernel's FP8 rows, slower at 5,120 cached tokens; the GEMMs stay
    fp8 = decode_step(m, "h200", "sglang", "float8", tp=8, batch=4, context=5120, kv_dtype="float8")
    assert fp8.parts["MLA attention kernel"] > 2 * step.parts["MLA attention kernel"]
    assert fp8.parts["MLA o_proj"] == step.parts["MLA o_proj"]
    with pytest.raises(DraftsimError, match="KV-cache dtype"):
        decode_step(m, "h200", "sglang", "float8", tp=8, batch=4, context=5120, kv_dtype="int4")
    # expert parallelism: SGLang does not fuse, the shared expert is two GEMMs again
    assert not SGLANG_FUSES(m, True) and SGLANG_FUSES(m, False)


def test_the_sglang_step_is_composed_as_aiconfigurator_composes_it():
    """AIConfigurator 0.12.0's own decode estimate for DeepSeek-V3 on 8x H200, SGLang 0.5.14 tables, TP 8 (its
    EngineHandle.evaluate_ops_json over DeepSeekModel's generation ops, power_law_1.01, run outside the repository; the
    package is never imported here): within 2% of draftsim's parts at both KV dtypes. What differs is small: draftsim
    counts 3 dense layers and 58 MoE layers (AIConfigurator 61 MoE layers), and fuses the shared expert where
    AIConfigurator overlaps it with the routed experts on a second stream.

    AIConfigurator interpolates its tables as measured, so the composition is compared like for like, the tables read
    as measured (efficiency.monotone_table an identity); made non-decreasing, as draftsim reads them (isotonic
    regression: noisy rows pooled), the step moves by -1.7% .. +0.5% at these shapes (measured; the block-FP8 GEMMs'
    DeepGEMM rows read 16.4 us at m = 1, 12.2-12.4 us at m = 5-8), within 2% of the raw composition."""
    from draftsim.sim.cost import efficiency, moe_tables

    def as_measured(values, coords=None, axes=None):
        v = np.array(values, dtype=np.float64)
        return efficiency.Cleaned(v, 0, 0, np.zeros(v.shape, dtype=bool))

    m = CAT.model("deepseek-v3")
    aic = {("float8", 4, 5120): 12.66, ("float8", 4, 8704): 14.69, ("float8", 8, 1536): 13.26,
           ("bfloat16", 4, 5120): 10.37, ("bfloat16", 4, 8704): 10.60, ("bfloat16", 8, 1536): 11.86}
    step = lambda kv, b, c: decode_step(m, "h200", "sglang", "float8", tp=8, batch=b, context=c, kv_dtype=kv).seconds  # noqa: E731
    moe_tables._gemm_grid.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(moe_tables, "monotone_table", as_measured)
            raw = {key: step(*key) for key in aic}  # no host time: AIC has none
    finally:
        moe_tables._gemm_grid.cache_clear()
    for key, ms in aic.items():
        assert raw[key] * 1e3 == pytest.approx(ms, rel=0.02), key
        cleaned = step(*key)
        assert cleaned == pytest.approx(raw[key], rel=0.02), key


def test_vllm_keeps_its_measured_mla_block_and_unfused_shared_expert():
    step = decode_step(CAT.model("deepseek-v3"), "h200", "vllm", "float8", tp=8, batch=4, context=5120)
    # vLLM's --kv-cache-dtype auto is the model's bfloat16: the block's bfloat16-KV rows (FLASH_ATTN_MLA)
    assert not step.missing and "attention (MLA block)" in step.parts and "kv bfloat16" in step.sources["attention (MLA block)"]
    fp8 = decode_step(CAT.model("deepseek-v3"), "h200", "vllm", "float8", tp=8, batch=4, context=5120, kv_dtype="float8")
    assert "kv fp8" in fp8.sources["attention (MLA block)"]
    assert fp8.parts["attention (MLA block)"] != step.parts["attention (MLA block)"]
    assert {"GEMM shared expert gate+up", "GEMM shared expert down"} <= set(step.parts)
    assert not any(k.startswith("MLA ") or "fused" in k for k in step.parts)


def test_a_shape_the_tables_do_not_hold_is_reported_not_extrapolated():
    step = decode_step(CAT.model("deepseek-v3"), "h100-sxm", "sglang", "float8", tp=16, batch=1, context=192)
    assert any("16 GPUs" in x for x in step.missing)
    with pytest.raises(DraftsimError, match="not measured"):
        _ = step.seconds
    assert measured_experts(CAT.model("llama-3.1-8b"), "h200") is None


def test_expert_cost_prices_measured_layers_in_place_of_the_roofline():
    import dataclasses

    m = CAT.model("deepseek-v3")
    roof = RooflineModel(m, CAT.hardware_spec("h200"), "float8", tp=8)
    table = measured_experts(m, "h200", "vllm", "float8", tp=8)
    e = dataclasses.replace(roof._experts, measured=table)
    n = np.array([1.0, 4.0, 64.0])
    assert np.allclose(e.seconds(n, 1.0, 1.0), m.moe_layers * table(n))  # bandwidth and peak no longer matter
    assert np.all(e.seconds(n, 4.8e12, 1.98e15) > roof._experts.seconds(n, 4.8e12, 1.98e15))


def test_the_roofline_prices_routed_experts_at_the_grouped_gemm_efficiency_the_gpus_table_measures():
    """Issue 37: grouped-GEMM efficiency at the rows each awake expert receives. DeepSeek-V3 at TP 8 on H200: its own
    expert shape's curve (vLLM's fused-MoE table, balanced routing, moe_tp 8) against the datasheet roofline."""
    from draftsim.sim.cost.moe_tables import grouped_gemm_efficiency

    m, hw = CAT.model("deepseek-v3"), CAT.hardware_spec("h200")
    roof = RooflineModel(m, hw, "float8", tp=8, moe_efficiency=True)
    plain = RooflineModel(m, hw, "float8", tp=8)  # the default: the catalog's MBU/MFU whether or not the extra is installed
    curve = roof.expert_efficiency
    assert curve is not None and "moe_perf.parquet" in curve.source and "own expert shape" in curve.source and "moe_tp 8" in curve.source
    assert curve is grouped_gemm_efficiency(hw, "float8", 8, model=m)
    n = np.array([1.0, 8.0, 64.0, 512.0])
    rows = tokens_per_awake_expert(n, m.experts, m.experts_per_token)
    bytes_only = RooflineModel(m, hw, "float8", tp=8, fused_moe=0.0)  # the curve scales the experts' bytes and FLOPs alone
    datasheet = bytes_only._experts.seconds(n, hw.memory_bandwidth, roof.peak)
    assert np.allclose(roof._expert_seconds(n), datasheet / curve(rows), rtol=1e-12)
    assert np.all(curve.efficiency > 0) and np.all(curve.efficiency <= 1.0)  # never above the datasheet
    assert curve.rows[0] == 1.0 and curve(1.0) < 0.3  # one row per expert, the one-token call's measured point kept
    assert float(roof._expert_seconds(np.array([1.0]))[0]) > float(np.asarray(plain._expert_seconds(np.array([1.0]))).reshape(-1)[0])
    # without a table for the GPU (or without the operators extra) the catalog's MBU/MFU stay (the H20; the B200 has tables now)
    assert RooflineModel(m, CAT.hardware_spec("h20"), "float8", tp=8, check_memory=False, moe_efficiency=True).expert_efficiency is None
