"""The operator cost model's latent-attention and MoE parts (sim/cost/operators.py with sim/cost/moe_operators.py
and sim/cost/moe_tables.py): an SGLang DeepSeek target priced as :func:`~draftsim.sim.cost.moe_tables.decode_step`
composes SGLang's layer (its MLA parts from SGLang's own tables, the shared expert fused into the routed call, the
bfloat16 KV cache SGLang keeps by default), vLLM's path as it was.

Skips where aiconfigurator-core's tables (the ``operators`` extra) are not installed.
"""

from __future__ import annotations

import numpy as np
import pytest
from operatortables import tables

from draftsim.sim.cost import default_catalog
from draftsim.sim.cost.operators import OperatorModel, systems_root
from draftsim.sim.errors import DraftsimError

pytestmark = tables

CATALOG = default_catalog()
#: the three scored InferenceX points (benchmarks/published/moe/decode.json) and shapes around them
DECODE_SHAPES = [(4, 5120), (4, 8704), (8, 1536), (1, 256), (13, 3000), (64, 8191), (256, 1024)]


def _ops(engine: str, hardware: str = "h200", **kw) -> OperatorModel:
    """DeepSeek-V3 at TP 8, FP8 weights, no host time (decode_step is compared without it)."""
    return OperatorModel(CATALOG.model("deepseek-v3"), CATALOG.hardware_spec(hardware), "float8", tp=8, engine=engine, overhead=0.0,
                         overhead_per_layer=0.0, check_memory=False, **kw)


def _step(hardware: str = "h200", **kw):
    from draftsim.sim.cost.moe_tables import decode_step

    return decode_step(CATALOG.model("deepseek-v3"), hardware, "sglang", "float8", tp=8, **kw)


def _parts(model: OperatorModel, b: int, n: int, c: int) -> dict:
    return {p.part: p for p in model.breakdown(b, n, c)}


@pytest.fixture(scope="module")
def sglang() -> OperatorModel:
    return _ops("sglang")


@pytest.mark.parametrize("batch,context", DECODE_SHAPES)
def test_sglang_decode_attention_is_decode_steps_mla_parts(sglang, batch, context):
    """The attention part of an SGLang decode step is the sum of decode_step's six MLA parts (the same
    function prices both: sim/cost/moe_tables.py GranularMLA), each from the table decode_step names."""
    step = _step(batch=batch, context=context)
    mla = {k: v for k, v in step.parts.items() if k.startswith("MLA ")}
    assert len(mla) == 6 and not step.missing
    att = _parts(sglang, batch, 1, context)["attention"]
    assert att.seconds == pytest.approx(sum(mla.values()), rel=1e-12)
    assert att.measured and "generation_mla_perf.parquet" in att.source and "mla_bmm_perf.parquet" in att.source
    assert "/sglang/" in att.source and "kv bfloat16" in att.source and "MLA block" not in att.source
    split = sglang.mla_parts(batch, 1, context)
    assert [p.part for p in split] == list(mla)
    for p in split:  # every part names the table decode_step names
        assert p.seconds == pytest.approx(mla[p.part], rel=1e-12) and p.measured
        assert step.sources[p.part].endswith(p.source), (p.part, p.source)


@pytest.mark.parametrize("hardware", ["h200", "h100-sxm"])
def test_the_sglang_decode_step_is_decode_steps_within_3_percent(hardware):
    """The whole step (no host time) against decode_step's. The attention, the routed experts, the fused shared
    expert and the LM head are the same numbers; what remains is the operator model's own accounting, each
    a little more than decode_step's: the elementwise kernels (one more per layer, the MLP activation of the
    three dense layers: about 0.18 ms at 3 us a launch), the embedding's all-reduce (2L + 1, decode_step 2L),
    the logits' all-gather (roofline), and the router's and dense MLP's FP8 GEMMs from the per-tensor FP8
    kernel (decode_step: DeepGEMM's block-FP8 rows first). Within 0.5 .. 2.4% at these shapes; neither pads
    to CUDA-graph sizes here (SGLang's capture sizes are not modelled, sim/data/engines.json)."""
    ops = _ops("sglang", hardware)
    for batch, context in DECODE_SHAPES:
        step = _step(hardware, batch=batch, context=context)
        parts = _parts(ops, batch, 1, context)
        assert parts["routed experts"].seconds == pytest.approx(step.parts["routed experts"], rel=1e-12)
        assert parts["shared expert (fused)"].seconds == pytest.approx(step.parts["shared expert (fused, estimated)"], rel=1e-12)
        assert parts["gemm lm_head"].seconds == pytest.approx(step.parts["GEMM LM head"], rel=1e-9)
        total = float(ops.shape_time(batch, 1, context))
        assert total == pytest.approx(step.seconds, rel=0.03), (batch, context)
        assert total >= step.seconds  # the operator model's extra kernels, never fewer


def test_sglang_fuses_the_shared_expert_into_the_routed_call_at_ep_1_only(sglang):
    parts = _parts(sglang, 4, 1, 5120)
    fused = parts["shared expert (fused)"]
    assert not fused.measured and "fused-MoE kernel" in fused.source and fused.source.startswith("estimated")
    assert 0 < fused.seconds < 0.1 * parts["routed experts"].seconds
    assert "shared expert" not in parts["gemm layers"].source  # no GEMMs of its own
    vllm = _parts(_ops("vllm"), 4, 1, 5120)
    assert "shared expert (fused)" not in vllm and "shared expert gate_up" in vllm["gemm layers"].source
    # data-parallel attention with the experts split whole (moe_ep 8): SGLang does not fuse, the GEMMs are back
    dp = _parts(_ops("sglang", expert_parallel=True), 8, 1, 1024)
    assert "shared expert (fused)" not in dp and "shared expert gate_up" in dp["gemm layers"].source
    assert dp["attention"].measured and "generation_mla_perf.parquet" in dp["attention"].source  # all 128 heads on a device


def test_both_engines_keep_the_kv_cache_in_bfloat16_and_the_memory_says_so(sglang):
    """SGLang's and vLLM's --kv-cache-dtype auto ("will use model data type": DeepSeek's bfloat16 under FP8
    weights): the MLA kernel's bfloat16 rows and two bytes a cached element, twice an FP8 latent cache; a KV
    dtype given explicitly reads that dtype's rows and bytes."""
    vllm, vllm_fp8 = _ops("vllm"), _ops("vllm", kv_dtype="float8")
    assert (sglang.kv_dtype, sglang.kv_bytes) == ("bfloat16", 2) == (vllm.kv_dtype, vllm.kv_bytes)
    assert (vllm_fp8.kv_dtype, vllm_fp8.kv_bytes) == ("float8", 1)
    assert float(sglang.kv_bytes_per_device(8, 4096)) == pytest.approx(2 * float(vllm_fp8.kv_bytes_per_device(8, 4096)))
    assert float(vllm.kv_bytes_per_device(8, 4096)) == pytest.approx(float(sglang.kv_bytes_per_device(8, 4096)))
    assert "kv bfloat16" in sglang.name
    fp8 = _ops("sglang", kv_dtype="float8")
    assert fp8.kv_bytes == 1 and "kv fp8" in fp8.sources["attention"]
    step = _step(batch=4, context=5120, kv_dtype="float8")
    assert _parts(fp8, 4, 1, 5120)["attention"].seconds == pytest.approx(sum(v for k, v in step.parts.items() if k.startswith("MLA ")),
                                                                        rel=1e-12)
    with pytest.raises(DraftsimError, match="KV-cache dtype"):
        _ops("sglang", kv_dtype="int8")


def test_a_verification_costs_more_than_one_token_and_less_than_as_many_steps(sglang):
    """n > 1 new tokens a sequence keep the MLA block's convention (the kernel at n rows over c + (n - 1)/2
    cached tokens, the projections and BMMs at the call's tokens), said in the note. The kernel grows with n;
    the projections need not: SGLang's tables measure its GEMMs flat within noise below 16 tokens (DeepGEMM's
    q_a+kv_a 16.1 us at one token, 12.5 us at eight), so the attention of a 2-token call at batch 1 is a little
    under the 1-token call's, the step (its routed experts) above it."""
    for batch, context in [(1, 512), (4, 4096), (16, 2048), (64, 1024)]:
        one = float(sglang.shape_time(batch, 1, context))
        one_att = _parts(sglang, batch, 1, context)["attention"].seconds
        one_kernel = {p.part: p.seconds for p in sglang.mla_parts(batch, 1, context)}["MLA attention kernel"]
        for n in (2, 4, 8):
            many = float(sglang.shape_time(batch, n, context))
            assert one < many < n * one, (batch, context, n)
            att = _parts(sglang, batch, n, context)["attention"]
            assert att.seconds < n * one_att
            assert not att.measured and "c + (n - 1)/2" in att.note
            kernel = {p.part: p.seconds for p in sglang.mla_parts(batch, n, context)}["MLA attention kernel"]
            assert one_kernel < kernel < n * one_kernel
    split = sglang.mla_parts(4, 4, 4096)
    assert {p.part for p in split} == {p.part for p in sglang.mla_parts(4, 1, 4096)} and not any(p.measured for p in split)


def test_an_sglang_prefill_is_its_context_kernel_and_projections():
    """Whole prompts: SGLang's MLA prefill kernel (context_mla_perf.parquet, the row at the batch and prompt
    length) and the four projections at the call's tokens, kv_b among them; a chunk after cached tokens at
    the whole prompt of its query-key pairs (estimated, said)."""
    import pyarrow.parquet as pq

    ops, L = _ops("sglang"), CATALOG.model("deepseek-v3").layers
    split = {p.part: p for p in ops.mla_parts(2, 512, 0)}
    assert set(split) == {"MLA q_a+kv_a projection", "MLA q projection", "MLA kv_b projection", "MLA attention kernel", "MLA o_proj"}
    df = pq.read_table(systems_root() / "data" / "h200_sxm" / "mla" / "sglang" / "0.5.14" / "context_mla_perf.parquet").to_pandas()
    row = df[(df.num_heads == 16) & (df.kv_cache_dtype == "bfloat16") & (df.batch_size == 2) & (df.isl == 512)]
    assert split["MLA attention kernel"].seconds == pytest.approx(L * float(row.latency.median()) * 1e-3, rel=1e-12)
    assert "context_mla_perf.parquet" in split["MLA attention kernel"].source
    att = _parts(ops, 2, 512, 0)["attention"]
    assert att.measured and att.seconds == pytest.approx(sum(p.seconds for p in split.values()), rel=1e-12)
    chunk = _parts(ops, 1, 512, 3072)["attention"]
    assert not chunk.measured and "query-key pairs" in chunk.note
    assert chunk.seconds > _parts(ops, 1, 512, 0)["attention"].seconds


def test_the_vllm_path_is_unchanged(monkeypatch):
    """vLLM's DeepSeek-V3 step on 8x H200 as it was priced before SGLang's parts: the MLA module table's block,
    FP8 KV (asked for: vLLM's auto is now the model's bfloat16), the shared expert's GEMMs (totals recorded from the model before the change, the tables pinned), with
    the tables read as measured (efficiency.monotone_table an identity); made non-decreasing, as the model reads
    them, the same steps move by the cleaning alone (recorded after it)."""
    from draftsim.sim.cost import efficiency, moe_tables, operators

    before = {(4, 1, 5120): 0.015266610858191967, (4, 4, 4096): 0.020920811033783824, (2, 512, 0): 0.0658101458989569,
              (256, 1, 2048): 0.046583544180776315, ("ep", 8, 1, 1536): 0.026941405405205284}
    cleaned = {(4, 1, 5120): 0.015275089286053206, (4, 4, 4096): 0.020920705759661904, (2, 512, 0): 0.06602662675609078,
               (256, 1, 2048): 0.04656497769916984, ("ep", 8, 1, 1536): 0.02679609579198976}

    def as_measured(values, coords=None, axes=None):
        v = np.array(values, dtype=np.float64)
        return efficiency.Cleaned(v, 0, 0, np.zeros(v.shape, dtype=bool))

    for recorded, patch in ((before, True), (cleaned, False)):
        with monkeypatch.context() as mp:
            if patch:
                mp.setattr(operators, "monotone_table", as_measured)
                mp.setattr(moe_tables, "monotone_table", as_measured)
            vllm, dp = _ops("vllm", kv_dtype="float8"), _ops("vllm", expert_parallel=True, kv_dtype="float8")
            for shape, seconds in recorded.items():
                got = float(dp.shape_time(*shape[1:])) if shape[0] == "ep" else float(vllm.shape_time(*shape))
                assert got == pytest.approx(seconds, rel=1e-12), (shape, patch)
            if patch:
                parts = _parts(vllm, 4, 1, 5120)
                assert parts["attention"].seconds == pytest.approx(0.00767685, rel=1e-12) and "MLA block" in parts["attention"].source
                assert vllm.mla_parts(4, 1, 5120) == [] and "shared expert (fused)" not in parts


def test_outside_sglangs_tables_the_call_falls_back_to_the_roofline_said(sglang):
    """An empty cache (the decode table starts at one cached token) and more sequences than the decode table
    measured: the MLA parts at the tables' edge scaled by the catalog roofline's latent attention (never above
    the measured call with one cached token, never below the edge beyond the table), recorded."""
    att = _parts(sglang, 1, 1, 0)["attention"]
    assert not att.measured and "roofline" in att.note and "edge" in att.note
    assert sglang.mla_parts(1, 1, 0)[0].source == "the MLA parts at their tables' edge scaled by the catalog roofline's latent attention"
    assert att.seconds <= _parts(sglang, 1, 1, 1)["attention"].seconds
    big = _parts(sglang, 2048, 1, 512)["attention"]
    assert not big.measured and np.isfinite(big.seconds) and big.seconds > 0


def test_the_busiest_rank_takes_whole_sequences_and_its_tokens_in_proportion():
    """Data-parallel attention: the busiest of 8 ranks holds ⌈B / 8⌉ sequences, and a decode call's tokens
    are as many — exactly (⌈51 / 8⌉ / 51 · 51 rounds to 7.000000000000001, whose ceiling was 8)."""
    from draftsim.sim.cost.operators import _busiest_rank

    B = np.arange(1, 2000, dtype=np.float64)
    Bd, Nd, cd, pd = _busiest_rank(B, B, 512 * B, B * 512.5, 8)
    assert np.array_equal(Bd, np.ceil(B / 8)) and np.array_equal(Nd, Bd)
    assert np.allclose(cd, 512 * Bd, rtol=1e-15) and np.allclose(pd, 512.5 * Bd, rtol=1e-15)
