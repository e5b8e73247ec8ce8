"""The operator cost model (sim/cost/operators.py): AIConfigurator's measured tables, read as they are.

Exactness is checked against rows read straight from the parquet files (not through the model);
the tests that need the tables skip, with the reason, where aiconfigurator-core 0.12.0 is not
installed (``make test`` installs it: the ``operators`` extra).
"""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st
from operatortables import tables

from draftsim.sim.cost import default_catalog
from draftsim.sim.cost.assembly import Deployment, assemble
from draftsim.sim.cost.catalog import ModelSpec
from draftsim.sim.cost.efficiency import monotone_table
from draftsim.sim.cost.operators import PINNED_VERSION, OperatorModel, equal_work_prompt, systems_root
from draftsim.sim.cost.overheads import engine_overheads
from draftsim.sim.errors import DraftsimError

CATALOG = default_catalog()
H100 = CATALOG.hardware_spec("h100-sxm")
#: A model every GEMM of which lies on the table's measured widths: qkv (6144, 4096), o (4096, 4096),
#: gate+up (16384, 4096), down (4096, 8192), LM head (16384, 4096); attention 32 / 8 heads x 128.
GRID = ModelSpec(name="grid-model", layers=2, hidden=4096, intermediate=8192, heads=32, kv_heads=8, head_dim=128, vocab=16384)
DATA = "h100_sxm/{op}/vllm/0.24.0/{file}"


def _frame(op: str, file: str):
    import pyarrow.parquet as pq

    return pq.read_table(systems_root() / "data" / DATA.format(op=op, file=file)).to_pandas()


@pytest.fixture(scope="module")
def grid_model():
    return OperatorModel(GRID, H100, engine="none")


@pytest.fixture(scope="module")
def gemm_rows():
    df = _frame("gemm", "gemm_perf.parquet")
    return df[(df.gemm_dtype == "bfloat16") & (df.kernel_source == "torch.nn.functional.linear")]


def _gemm_ms(rows, m, shapes, cleaned: bool = True) -> float:
    """Σ table latency (ms) of the (n, k) shapes at m tokens, read from the rows: as the model reads them, each width's
    latencies made non-decreasing in m (efficiency.monotone_table), or (``cleaned=False``) as measured."""
    out = 0.0
    for n, k in shapes:
        hit = rows[(rows.m == m) & (rows.n == n) & (rows.k == k)]
        assert len(hit) == 1, (m, n, k)
        if not cleaned:
            out += float(hit.latency.iloc[0])
            continue
        series = rows[(rows.n == n) & (rows.k == k)].groupby("m").latency.median()
        ms = series.index.to_numpy(np.float64)
        out += float(monotone_table(series.to_numpy(np.float64), (ms,)).values[list(ms).index(m)])
    return out


LAYER_SHAPES = [(6144, 4096), (4096, 4096), (16384, 4096), (4096, 8192)]


@tables
@pytest.mark.parametrize("m", [1, 7, 17, 33, 256, 4097, 32768])
def test_gemms_are_the_tables_rows_at_measured_shapes(grid_model, gemm_rows, m):
    """The table's rows made non-decreasing in m; as measured where the cleaning left a width's row alone."""
    parts = {p.part: p for p in grid_model.breakdown(m, 1, 0)}
    assert parts["gemm layers"].seconds == pytest.approx(GRID.layers * _gemm_ms(gemm_rows, m, LAYER_SHAPES) * 1e-3, rel=1e-12)
    assert parts["gemm lm_head"].seconds == pytest.approx(_gemm_ms(gemm_rows, m, [(16384, 4096)]) * 1e-3, rel=1e-12)
    g = grid_model._gemm
    for n, k in LAYER_SHAPES + [(16384, 4096)]:
        i, j, col = list(g.n).index(n), list(g.k).index(k), list(g.m).index(m)
        if not g.cleaning.changed[i, j, col]:
            assert g.t[i, j, col] * 1e3 == pytest.approx(_gemm_ms(gemm_rows, m, [(n, k)], cleaned=False), rel=1e-12)
    assert parts["gemm layers"].measured and parts["gemm lm_head"].measured
    assert "gemm_perf.parquet" in parts["gemm layers"].source


@tables
@pytest.mark.parametrize("gpu", ["h100_sxm", "h200_sxm", "a100_sxm"])
def test_cleaning_a_gemm_table_changes_only_the_widths_whose_latency_falls_with_m(gpu):
    """efficiency.monotone_table along m leaves a width whose measured latencies never fall with m exactly as measured,
    and changes some cells of every width whose latency falls somewhere; the result never falls."""
    model = OperatorModel(GRID, CATALOG.hardware_spec({"h100_sxm": "h100-sxm", "h200_sxm": "h200", "a100_sxm": "a100-80g"}[gpu]),
                          engine="vllm")
    g = model._gemm
    for i in range(len(g.n)):
        for j in range(len(g.k)):
            raw, clean, ok = g.raw[i, j], g.t[i, j], ~np.isnan(g.raw[i, j])
            if not ok.any():
                continue
            assert np.all(np.diff(clean[ok]) >= 0)
            falls = np.any(np.diff(raw[ok]) < 0)
            assert g.cleaning.changed[i, j].any() == falls, (g.n[i], g.k[j])


@tables
@pytest.mark.parametrize("batch,step", [(1, 511), (16, 1023), (64, 127), (128, 4095)])
def test_decode_attention_is_the_tables_row_at_measured_points(grid_model, batch, step):
    df = _frame("attention", "generation_attention_perf.parquet")
    hit = df[(df.num_heads == 32) & (df.num_key_value_heads == 8) & (df.head_dim == 128) & (df.kv_cache_dtype == "bfloat16")
             & (df.window_size == 0) & (df.kernel_source == "vllm_flash_attn_fa3") & (df.batch_size == batch) & (df.step == step)]
    assert len(hit) == 1
    parts = {p.part: p for p in grid_model.breakdown(batch, 1, step)}
    assert parts["attention"].seconds == pytest.approx(GRID.layers * float(hit.latency.iloc[0]) * 1e-3, rel=1e-12)
    assert parts["attention"].measured and "generation_attention_perf.parquet" in parts["attention"].source


@tables
def test_a_head_layout_between_two_measured_ones_is_their_linear_mix():
    """28 query heads over 4 KV heads x 128 (Qwen2.5-7B) lies halfway between the measured 24 and 32."""
    model = OperatorModel(ModelSpec(name="between", layers=2, hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128,
                                    vocab=16384), H100, engine="none")
    df = _frame("attention", "generation_attention_perf.parquet")
    rows = df[(df.num_key_value_heads == 4) & (df.head_dim == 128) & (df.kv_cache_dtype == "bfloat16") & (df.window_size == 0)
              & (df.kernel_source == "vllm_flash_attn_fa3") & (df.batch_size == 16) & (df.step == 511)]
    t24, t32 = (float(rows[rows.num_heads == h].latency.iloc[0]) * 1e-3 for h in (24, 32))
    part = {p.part: p for p in model.breakdown(16, 1, 511)}["attention"]
    assert part.seconds == pytest.approx(2 * (t24 + t32) / 2, rel=1e-12) and part.measured
    assert "query heads interpolated between 24 and 32" in model.describe()


@tables
@pytest.mark.parametrize("batch,isl", [(1, 512), (4, 2048), (16, 128)])
def test_a_whole_prompts_attention_is_the_context_tables_row(grid_model, batch, isl):
    df = _frame("attention", "context_attention_perf.parquet")
    hit = df[(df.num_heads == 32) & (df.num_key_value_heads == 8) & (df.head_dim == 128) & (df.kv_cache_dtype == "bfloat16")
             & (df.window_size == 0) & (df.kernel_source == "vllm_flash_attn_fa3") & (df.batch_size == batch) & (df.isl == isl)]
    assert len(hit) == 1
    parts = {p.part: p for p in grid_model.breakdown(batch, isl, 0)}
    assert parts["attention"].seconds == pytest.approx(GRID.layers * float(hit.latency.iloc[0]) * 1e-3, rel=1e-12)
    assert parts["attention"].measured


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 256), st.integers(1, 1 << 17))
def test_the_equal_work_prompt_of_whole_prompts_is_their_length(batch, n):
    """B whole prompts of n tokens have B·n(n + 1)/2 query-key pairs; the prompt of that work per
    sequence is n itself, exactly (no rounding moves a whole prompt off its table row)."""
    assert equal_work_prompt(batch, batch * n * (n + 1) / 2) == n


@tables
@pytest.mark.parametrize("batch,chunk,cached", [(1, 64, 3072), (1, 512, 2048), (4, 256, 1024), (1, 2048, 8192)])
def test_a_chunk_after_cached_tokens_costs_the_prompt_of_its_work_its_fixed_cost_once(grid_model, batch, chunk, cached):
    """A prefill chunk after cached tokens is priced as the whole prompt with its query-key pairs
    per sequence: dearer than a whole prompt of the chunk alone, cheaper than one of chunk + cached
    tokens. Scaling the chunk's own whole-prompt time by the pairs (as before) multiplied its fixed
    cost too: 64 tokens after 3,072 cached came out 96 times a 64-token prompt, where Vidur's A100
    profile (benchmarks/data/vidur) measures 3.4 times."""
    parts = lambda n, c: {p.part: p for p in grid_model.breakdown(batch, n, c)}["attention"]  # noqa: E731
    after, alone, whole = parts(chunk, cached), parts(chunk, 0), parts(chunk + cached, 0)
    assert alone.seconds < after.seconds < whole.seconds
    n_eq = equal_work_prompt(batch, batch * chunk * (cached + (chunk + 1) / 2))
    assert chunk < n_eq < chunk + cached
    assert after.seconds / alone.seconds < 2 * (n_eq / chunk) ** 2  # at most the work's ratio: no fixed cost multiplied
    assert "query-key pairs" in after.note


@tables
@pytest.mark.parametrize("tokens", [2, 16, 64, 256])
def test_all_reduces_are_the_tables_graph_rows_at_measured_sizes(tokens):
    model = OperatorModel(GRID, H100, tp=2, engine="none")
    df = _frame("comm", "custom_allreduce_perf.parquet")
    hit = df[(df.num_gpus == 2) & (df.message_size == tokens * GRID.hidden) & (df.kernel_source == "vLLM_custom_graph")]
    assert len(hit) == 1
    parts = {p.part: p for p in model.breakdown(tokens, 1, 0)}
    # the graph rows made non-decreasing in the message size (efficiency.monotone_table); as measured where it left them
    rows = df[(df.num_gpus == 2) & (df.kernel_source == "vLLM_custom_graph")].groupby("message_size").latency.median()
    sizes = rows.index.to_numpy(np.float64)
    clean = monotone_table(rows.to_numpy(np.float64), (sizes,))
    i = list(sizes).index(tokens * GRID.hidden)
    assert parts["allreduce"].seconds == pytest.approx((2 * GRID.layers + 1) * float(clean.values[i]) * 1e-3, rel=1e-12)
    if not clean.changed[i]:
        assert parts["allreduce"].seconds == pytest.approx((2 * GRID.layers + 1) * float(hit.latency.iloc[0]) * 1e-3, rel=1e-12)
    assert parts["allreduce"].measured


@tables
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 32767), st.integers(0, 32767))
def test_gemm_time_lies_between_its_measured_neighbours_so_is_monotone_where_the_table_is(grid_model, gemm_rows, m, dm):
    """Linear in m between measured token counts: inside each bracket the time goes the table's way."""
    measured = np.sort(gemm_rows.m.unique())
    m2 = min(m + dm, 32768)
    lo = measured[np.searchsorted(measured, m, side="right") - 1]
    hi = measured[np.searchsorted(measured, m, side="left")]
    t = {x: _gemm_ms(gemm_rows, x, LAYER_SHAPES) for x in {lo, hi}}
    got = float(grid_model.breakdown(m, 1, 0)[0].seconds) / GRID.layers * 1e3
    assert min(t.values()) * (1 - 1e-12) <= got <= max(t.values()) * (1 + 1e-12)
    inside = measured[(measured >= lo) & (measured <= max(m2, hi))]
    curve = np.array([_gemm_ms(gemm_rows, x, LAYER_SHAPES) for x in inside])
    if np.all(np.diff(curve) >= 0):  # the table is monotone over the span: so is the model's GEMM time (the
        # call's other parts, attention by batch above all, follow their own tables)
        assert float(grid_model.breakdown(m2, 1, 0)[0].seconds) >= float(grid_model.breakdown(m, 1, 0)[0].seconds) - 1e-15


@tables
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 128), st.integers(1, 4095))
def test_decode_attention_lies_within_its_four_measured_corners(grid_model, batch, context):
    df = _frame("attention", "generation_attention_perf.parquet")
    df = df[(df.num_heads == 32) & (df.num_key_value_heads == 8) & (df.head_dim == 128) & (df.kv_cache_dtype == "bfloat16")
            & (df.window_size == 0)]
    bs, steps = np.sort(df.batch_size.unique()), np.sort(df.step.unique())
    b0, b1 = bs[np.searchsorted(bs, batch, side="right") - 1], bs[np.searchsorted(bs, batch, side="left")]
    s0, s1 = steps[np.searchsorted(steps, context, side="right") - 1], steps[np.searchsorted(steps, context, side="left")]
    corners = df[df.batch_size.isin([b0, b1]) & df.step.isin([s0, s1])].latency.to_numpy() * 1e-3 * GRID.layers
    got = {p.part: p.seconds for p in grid_model.breakdown(batch, 1, context)}["attention"]
    # between the four corners of the table made non-decreasing (efficiency.monotone_table), and where cleaning left them
    # as measured, between the measured corners
    g = grid_model._attn
    ij = np.ix_(np.searchsorted(g.x, [b0, b1]), np.searchsorted(g.y, [s0, s1]))
    clean = g.v[ij] * GRID.layers
    assert clean.min() * (1 - 1e-12) <= got <= clean.max() * (1 + 1e-12)
    if not g.cleaning.changed[ij].any():
        assert corners.min() * (1 - 1e-12) <= got <= corners.max() * (1 + 1e-12)


@tables
def test_outside_the_tables_each_operator_falls_back_to_the_roofline_and_says_so():
    llama = CATALOG.model("llama-3.1-8b")
    model = OperatorModel(llama, H100, engine="none")
    parts = {p.part: p for p in model.breakdown(1, 1, 512)}
    assert not parts["gemm lm_head"].measured and "beyond the measured widths" in parts["gemm lm_head"].note  # 128K vocabulary
    assert parts["gemm layers"].measured
    big = {p.part: p for p in model.breakdown(40_000, 1, 0)}  # more tokens than the table's 32768
    assert not big["gemm layers"].measured and "more than 32768 tokens" in big["gemm layers"].note
    assert "more than 32768 tokens" in " ".join(model.fallbacks["gemm layers"])
    hole = {p.part: p for p in model.breakdown(2048, 1, 8191)}  # a batch x context the table did not measure
    assert not hole["attention"].measured and "outside the measured table" in hole["attention"].note
    for p in (*big.values(), *hole.values()):
        assert np.isfinite(p.seconds) and p.seconds >= 0
    assert "roofline" in model.describe()


@tables
def test_a_call_is_the_sum_of_its_parts_and_the_engines_forward_overlap_is_not_applied():
    llama = CATALOG.model("llama-3.1-8b")
    vllm = engine_overheads("vllm")
    kw = dict(engine="vllm", graph_tokens=vllm.graph_tokens, overhead=vllm.per_step)
    added, maxed = OperatorModel(llama, H100, overlap=0.0, **kw), OperatorModel(llama, H100, overlap=1.0, **kw)
    for b, n, c in [(1, 1, 512), (16, 4, 512), (64, 1, 2048), (3, 300, 0)]:
        total = float(added.shape_time(b, n, c))
        assert total == float(maxed.shape_time(b, n, c))
        assert total == pytest.approx(sum(p.seconds for p in added.breakdown(b, n, c)), rel=1e-12)
    host = {p.part: p for p in added.breakdown(1, 1, 512)}["host"]
    assert host.seconds == pytest.approx(vllm.per_step) and host.basis == "engine"


def _moe_rows(system, engine, model, dtype, tp, ep, tokens):
    """The fused-MoE table's median latency (seconds) of ``model``'s experts at ``tokens``, read from the parquet file."""
    from draftsim.sim.cost.moe_tables import measured_experts

    kernel = measured_experts(model, {"h100_sxm": "h100-sxm", "h200_sxm": "h200"}[system], engine, dtype, tp, ep).kernel
    version = {"vllm": "0.24.0", "sglang": "0.5.14"}[engine]
    df = _frame_at(f"{system}/moe/{engine}/{version}/moe_perf.parquet")
    mtp, mep = (1, tp) if ep else (tp, 1)
    hit = df[(df.kernel_source == kernel) & (df.num_tokens == tokens) & (df.hidden_size == model.hidden) & (df.num_experts == model.experts)
             & (df.inter_size == model.expert_intermediate) & (df.topk == model.experts_per_token) & (df.moe_tp_size == mtp)
             & (df.moe_ep_size == mep) & (df.distribution == "power_law_1.01")]
    assert len(hit) >= 1
    # the table made non-decreasing in tokens (efficiency.monotone_table) before it is read: the cleaned value at ``tokens``
    rows = df[(df.kernel_source == kernel) & (df.hidden_size == model.hidden) & (df.num_experts == model.experts)
              & (df.inter_size == model.expert_intermediate) & (df.topk == model.experts_per_token) & (df.moe_tp_size == mtp)
              & (df.moe_ep_size == mep) & (df.distribution == "power_law_1.01")].groupby("num_tokens").latency.median()
    x = rows.index.to_numpy(np.float64)
    clean = monotone_table(rows.to_numpy(np.float64), (x,))
    i = list(x).index(tokens)
    assert rows.iloc[i] == float(hit.latency.median())
    return float(clean.values[i]) * 1e-3


def _frame_at(rel: str):
    import pyarrow.parquet as pq

    return pq.read_table(systems_root() / "data" / rel).to_pandas()


@tables
def test_a_gqa_mixture_of_experts_is_priced_part_by_part_from_the_moe_attention_and_allreduce_tables():
    mixtral = CATALOG.model("mixtral-8x7b")
    ops = OperatorModel(mixtral, H100, tp=2, engine="none")
    parts = {p.part: p for p in ops.breakdown(16, 1, 512)}
    assert {"gemm layers", "gemm lm_head", "attention", "routed experts", "allreduce", "elementwise", "host"} <= set(parts)
    routed = parts["routed experts"]
    assert routed.measured and "moe_perf.parquet" in routed.source
    assert routed.seconds == pytest.approx(mixtral.moe_layers * _moe_rows("h100_sxm", "vllm", mixtral, "bfloat16", 2, False, 16), rel=1e-12)
    assert parts["attention"].measured and "generation_attention_perf.parquet" in parts["attention"].source
    assert parts["allreduce"].measured
    assert sum(p.seconds for p in parts.values()) == pytest.approx(float(ops.shape_time(16, 1, 512)), rel=1e-12)
    # the router's 8 columns lie below the table's narrowest width: estimated, and said
    assert not parts["gemm layers"].measured and "router" in parts["gemm layers"].note


@tables
def test_latent_attention_is_the_mla_block_tables_row_and_fp8_experts_the_moe_tables():
    ds = CATALOG.model("deepseek-v3")
    df = _frame_at("h200_sxm/mla/vllm/0.24.0/mla_generation_module_perf.parquet")
    # each KV dtype its own rows: vLLM's auto, the model's bfloat16 (FLASH_ATTN_MLA), and an FP8 cache (FlashMLA)
    for kv, (kernel, rows_kv) in {None: ("FLASH_ATTN_MLA", "bfloat16"), "float8": ("FLASHMLA", "fp8")}.items():
        at = OperatorModel(ds, CATALOG.hardware_spec("h200"), "float8", tp=8, engine="vllm", check_memory=False, kv_dtype=kv)
        attention = {p.part: p for p in at.breakdown(4, 1, 4096)}["attention"]
        row = df[(df.kernel_source == kernel) & (df.kv_cache_dtype == rows_kv) & (df.gemm_type == "fp8_block") & (df.num_heads == 16)
                 & (df.batch_size == 4) & (df.step == 4096)]
        assert attention.measured and "MLA block" in attention.source and f"{rows_kv} KV" in attention.source
        assert attention.seconds == pytest.approx(ds.layers * float(row.latency.median()) * 1e-3, rel=1e-12), kv
    ops = OperatorModel(ds, CATALOG.hardware_spec("h200"), "float8", tp=8, engine="vllm", check_memory=False)
    parts = {p.part: p for p in ops.breakdown(4, 1, 4096)}
    assert parts["routed experts"].measured and "fp8_block" in parts["routed experts"].source
    assert parts["routed experts"].seconds == pytest.approx(ds.moe_layers * _moe_rows("h200_sxm", "vllm", ds, "float8", 8, False, 4), rel=1e-12)
    # a 4-token verification: each token a row of the decode table (estimated, said)
    verify = {p.part: p for p in ops.breakdown(4, 4, 4096)}["attention"]
    assert not verify.measured and "one row each" in verify.note


@tables
def test_data_parallel_attention_with_expert_parallelism_trades_the_allreduce_for_a_measured_all_to_all():
    """--expert-parallel under the operator model: attention on every device over its own sequences, experts
    split whole (moe_ep 8), DeepEP dispatch + combine per MoE layer from vLLM's all-to-all table."""
    ds, h200 = CATALOG.model("deepseek-v3"), CATALOG.hardware_spec("h200")
    tp = OperatorModel(ds, h200, "float8", tp=8, engine="vllm", check_memory=False, kv_dtype="float8")
    dp = OperatorModel(ds, h200, "float8", tp=8, engine="vllm", expert_parallel=True, check_memory=False, kv_dtype="float8")
    parts = {p.part: p for p in dp.breakdown(8, 1, 1024)}  # one sequence per device (an FP8 cache: FlashMLA's rows)
    assert "allreduce" not in parts and parts["all-to-all"].measured and "moe_a2a_perf.parquet" in parts["all-to-all"].source
    df = _frame_at("h200_sxm/comm/vllm/0.24.0/moe_a2a_perf.parquet")
    ll = df[(df.comm_backend == "deepep_ll") & (df.hidden_size == 7168) & (df.num_experts == 256) & (df.topk == 8) & (df.num_tokens == 1)]
    assert parts["all-to-all"].seconds == pytest.approx(ds.moe_layers * float(ll.latency.sum()) * 1e-6, rel=1e-9)
    assert parts["routed experts"].seconds == pytest.approx(ds.moe_layers * _moe_rows("h200_sxm", "vllm", ds, "float8", 8, True, 8), rel=1e-12)
    # attention: one sequence per device with all 128 heads, as batch 1 of the 128-head rows
    mla = _frame_at("h200_sxm/mla/vllm/0.24.0/mla_generation_module_perf.parquet")
    row = mla[(mla.kernel_source == "FLASHMLA") & (mla.kv_cache_dtype == "fp8") & (mla.gemm_type == "fp8_block") & (mla.num_heads == 128)
              & (mla.batch_size == 1) & (mla.step == 1024)]
    # the table made non-decreasing (efficiency.monotone_table): batch 1 reads 146.4-149.2 us per layer from step 2 to 1024 (flat,
    # noisy), so step 1024's 147.7 us is pooled with its neighbours (isotonic regression), within the row's measured range
    grid = dp._mla
    i, j = list(grid.x).index(1), list(grid.y).index(1024)
    assert grid.raw[i, j] == pytest.approx(float(row.latency.median()) * 1e-3, rel=1e-12) and grid.cleaning.changed[i, j]
    assert np.nanmin(grid.raw[i, : j + 1]) <= grid.v[i, j] <= np.nanmax(grid.raw[: i + 1, : j + 1])
    assert parts["attention"].seconds == pytest.approx(ds.layers * grid.v[i, j], rel=1e-12)
    # each device caches its own sequences only (the latent is replicated under tensor parallelism), and holds all attention weights
    assert float(dp.kv_bytes_per_device(64, 4096)) == pytest.approx(float(tp.kv_bytes_per_device(64, 4096)) / 8)
    assert dp.weight_bytes_per_device() > tp.weight_bytes_per_device()


@tables
@pytest.mark.parametrize("target,hardware,dtype,measured_experts", [("glm-4.5-air", "h200", "bfloat16", False),
                                                                    ("deepseek-v3", "h200", "float8", True)])
def test_an_mtp_module_is_priced_as_one_moe_block_of_the_target(target, hardware, dtype, measured_experts):
    kw = dict(tp=8 if target == "deepseek-v3" else 2, drafters=("mtp",), overheads="vllm", dtype=dtype)
    head = assemble(Deployment(target, hardware, cost_model="operators", **kw)).drafters[0]
    parts = {p.part: p for p in head.breakdown(16, 1, 512)}
    assert {"routed experts", "attention", "gemm layers", "host"} <= set(parts)
    assert parts["routed experts"].measured is measured_experts  # GLM-4.5's experts are not in the tables: the roofline, said
    assert parts["attention"].measured
    assert "gemm projection" in head.describe()
    target_model = assemble(Deployment(target, hardware, cost_model="operators", **kw)).target
    one_layer = parts["routed experts"].seconds
    whole = {p.part: p for p in target_model.breakdown(16, 1, 512)}["routed experts"].seconds
    assert one_layer == pytest.approx(whole / CATALOG.model(target).moe_layers, rel=1e-9)


@tables
def test_a_4_token_verification_on_70b_tp4_at_batch_16_costs_1_to_1_2_decode_steps():
    """Issue 37's check (the vllm entry prices it at 1.30 decode steps, the bare roofline at 1.05;
    the published speedups of 70B-class EAGLE at batch 16 lie between)."""
    built = assemble(Deployment("llama-3.1-70b", "h100-sxm", tp=4, overheads="vllm", cost_model="operators"))
    ratio = float(built.target.shape_time(16, 4, 512) / built.target.shape_time(16, 1, 512))
    assert 1.0 <= ratio <= 1.2
    assert "operators" in built.info["backends"]["llama-3.1-70b"]
    assert "custom_allreduce_perf.parquet" in built.info["operators"]["llama-3.1-70b"]


@tables
def test_cost_prints_each_call_by_operator(capsys):
    status, out, err = run(capsys, "cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "operators",
                           "--batch", "1,64", "--new-tokens", "1,4")
    assert status == 0, err
    assert "gemm_perf.parquet" in out and "generation_attention_perf.parquet" in out
    for word in ("gemm layers", "gemm lm_head", "attention", "elementwise", "host", "measured", "estimated", "engine"):
        assert word in out


def test_a_missing_package_is_one_line(monkeypatch, capsys):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(DraftsimError) as exc:
        assemble(Deployment("llama-3.1-8b", "h100-sxm", cost_model="operators"))
    assert "\n" not in str(exc.value) and "pip install 'draftsim[operators]'" in str(exc.value)
    status, out, err = run(capsys, "cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "operators")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and "aiconfigurator-core" in err
    # the roofline stays the default and needs nothing
    assert assemble(Deployment("llama-3.1-8b", "h100-sxm")).target.shape_time(1, 1, 512) > 0


def test_another_installed_version_is_one_line(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.11.0")
    with pytest.raises(DraftsimError, match=f"{PINNED_VERSION}.*0.11.0 is installed") as exc:
        systems_root()
    assert "\n" not in str(exc.value)


@tables
@pytest.mark.parametrize("kwargs,words", [
    (dict(hardware="a10g"), "not for a10g"),
    (dict(dtype="float8"), "--dtype float8"),
    (dict(cost_model="measured"), "cost model"),
])
def test_what_the_tables_do_not_hold_is_refused_in_one_line(kwargs, words):
    d = dict(target="llama-3.1-8b", hardware="h100-sxm", cost_model="operators") | kwargs
    with pytest.raises(DraftsimError, match=words) as exc:
        assemble(Deployment(**d))
    assert "\n" not in str(exc.value)


# -- drafting heads priced from the same tables (sim/cost/methods.py OperatorHead) -----------------

def _head(drafter: str, target=GRID, engine: str = "none", tp: int = 1):
    from draftsim.sim.cost.methods import head_cost, parse_drafter

    vllm = engine_overheads(engine)
    return head_cost(parse_drafter(drafter), target, H100, "bfloat16", tp, cost_model="operators", engine=engine,
                     graph_tokens=vllm.graph_tokens, overlap=vllm.overlap)


#: each head's GEMMs on GRID (all on measured widths): (gemm layers shapes, LM head shape)
HEAD_SHAPES = {
    "eagle3:draft_vocab=16384": ([(6144, 8192), (4096, 4096), (16384, 4096), (4096, 8192)], (16384, 4096)),  # QKV over 2h inputs
    "eagle": (LAYER_SHAPES + [(4096, 8192)], (16384, 4096)),  # + fc 2h -> h
    "medusa": ([(4096, 4096)], (16384, 4096)),  # residual block + its LM head
}


@tables
@pytest.mark.parametrize("drafter", sorted(HEAD_SHAPES))
@pytest.mark.parametrize("m", [1, 7, 17, 33, 256, 4097])
def test_a_heads_gemms_are_the_tables_rows_at_measured_shapes(gemm_rows, drafter, m):
    head = _head(drafter)
    layers, lm_head = HEAD_SHAPES[drafter]
    parts = {p.part: p for p in head.breakdown(m, 1, 0)}  # the rows made non-decreasing in m, as the target's (_gemm_ms)
    assert parts["gemm layers"].seconds == pytest.approx(_gemm_ms(gemm_rows, m, layers) * 1e-3, rel=1e-12)
    assert parts["gemm lm_head"].seconds == pytest.approx(_gemm_ms(gemm_rows, m, [lm_head]) * 1e-3, rel=1e-12)
    assert parts["gemm layers"].measured and parts["gemm lm_head"].measured and not any(k.startswith("gemm") for k in head.fallbacks)
    assert "gemm_perf.parquet" in parts["gemm layers"].source
    assert float(head.shape_time(m, 1, 0)) == pytest.approx(sum(p.seconds for p in parts.values()), rel=1e-12)


@tables
def test_a_heads_attention_is_the_targets_one_layer_row():
    head = _head("eagle3:draft_vocab=16384")
    df = _frame("attention", "generation_attention_perf.parquet")
    hit = df[(df.num_heads == 32) & (df.num_key_value_heads == 8) & (df.head_dim == 128) & (df.kv_cache_dtype == "bfloat16")
             & (df.window_size == 0) & (df.kernel_source == "vllm_flash_attn_fa3") & (df.batch_size == 16) & (df.step == 1023)]
    part = {p.part: p for p in head.breakdown(16, 1, 1023)}["attention"]
    assert part.seconds == pytest.approx(float(hit.latency.iloc[0]) * 1e-3, rel=1e-12) and part.measured


@tables
@pytest.mark.parametrize("drafter", ["eagle", "medusa"])
def test_a_heads_gemm_outside_the_table_falls_back_to_the_roofline_and_says_so(drafter):
    head = _head(drafter, CATALOG.model("llama-3.1-8b"), engine="vllm")
    parts = {p.part: p for p in head.breakdown(1, 1, 512)}
    assert not parts["gemm lm_head"].measured and "beyond the measured widths" in parts["gemm lm_head"].note  # 128K vocabulary
    assert parts["gemm layers"].measured
    assert "beyond the measured widths" in " ".join(head.fallbacks["gemm lm_head"])
    big = {p.part: p for p in head.breakdown(40_000, 1, 0)}  # more tokens than the table's 32768
    assert not big["gemm layers"].measured and "more than 32768 tokens" in big["gemm layers"].note
    assert all(np.isfinite(p.seconds) and p.seconds >= 0 for p in big.values())
    assert "estimated" in head.describe()


@tables
@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["eagle", "eagle3", "medusa"]), st.integers(1, 256), st.integers(1, 8), st.integers(0, 4000))
def test_the_engines_per_draft_forward_time_is_added_once_to_a_measured_head(drafter, batch, new_tokens, context):
    built = assemble(Deployment("llama-3.1-8b", "h100-sxm", drafters=(drafter,), overheads="vllm", cost_model="operators"))
    vllm = engine_overheads("vllm")
    [head], bare = built.drafters, _head(drafter, CATALOG.model("llama-3.1-8b"), engine="vllm")
    assert type(head).__name__ == "OperatorHead" and "operators measured" in built.info["backends"][drafter]
    t = float(head.shape_time(batch, new_tokens, context))
    assert t == pytest.approx(float(bare.shape_time(batch, new_tokens, context)) + vllm.per_draft_forward, rel=1e-12)
    parts = head.breakdown(batch, new_tokens, context)
    assert t == pytest.approx(sum(p.seconds for p in parts), rel=1e-12)
    [host] = [p for p in parts if p.part == "host"]
    assert host.seconds == pytest.approx(H100.overhead + vllm.per_draft_forward, rel=1e-12) and host.basis == "engine"


@tables
@pytest.mark.parametrize("drafter", ["eagle", "eagle3"])
def test_a_heads_share_of_a_batch_1_step_is_about_its_share_of_the_weights_read(drafter):
    """At batch 1 every kernel is memory-bound, so a head's measured kernels over the target's lie
    near the bytes of weights each reads (one decoder layer and an LM head against 32 layers and
    the LM head); the engine's host times go on top of both."""
    built = assemble(Deployment("llama-3.1-8b", "h100-sxm", drafters=(drafter,), overheads="vllm", cost_model="operators"))
    vllm, llama = engine_overheads("vllm"), CATALOG.model("llama-3.1-8b")
    head_kernels = float(built.drafters[0].shape_time(1, 1, 512)) - vllm.per_draft_forward
    target_kernels = float(built.target.shape_time(1, 1, 512)) - vllm.per_step
    h, qkv = llama.hidden, (llama.heads + 2 * llama.kv_heads) * llama.head_dim
    layer = (2 if drafter == "eagle3" else 1) * h * qkv + h * h + 3 * h * llama.intermediate + (2 * h * h if drafter == "eagle" else 0)
    vocab = 32000 if drafter == "eagle3" else llama.vocab
    target = llama.layers * (h * qkv + h * h + 3 * h * llama.intermediate) + llama.vocab * h
    share = head_kernels / target_kernels
    assert 0.5 <= share / ((layer + vocab * h) / target) <= 2.0, share
    c = float(built.drafters[0].shape_time(1, 1, 512) / built.target.shape_time(1, 1, 512))
    assert share < c < 0.2  # with the engine's host times: vLLM's 0.39 ms per draft forward against its 1.21 ms step


def test_the_published_reproduction_prices_by_operators_only_where_tables_exist():
    from benchscript import load_script

    mod = load_script("benchmarks/published/reproduce.py")
    assert mod.priced_by({"hardware": "h100-sxm"}, "operators") == "operators"
    assert mod.priced_by({"hardware": "rtx-3090"}, "operators") == "roofline"
    assert mod.priced_by({"hardware": "h100-sxm"}) == "roofline"


@tables
def test_cost_prints_a_measured_heads_call_by_operator(capsys):
    status, out, err = run(capsys, "cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "operators",
                           "--drafter-model", "eagle3", "--batch", "1", "--json")
    assert status == 0, err
    import json

    doc = json.loads(out)
    [head] = [e for e in doc["breakdown"] if e["model"] == "eagle3"]
    parts = {p["part"]: p for p in head["parts"]}
    assert parts["gemm layers"]["measured"] and parts["gemm lm_head"]["measured"] and parts["host"]["basis"] == "engine"
    assert "operators measured" in doc["backends"]["eagle3"] and "eagle3" in doc["operators"]


@tables
def test_an_fp8_kv_cache_is_priced_from_the_tables_fp8_rows_and_holds_half_the_bytes(capsys):
    """--kv-dtype fp8 under the operator model: the decode and prefill attention tables' FP8-KV rows (AIConfigurator
    measures both caches on Hopper), half the cache's bytes; a head layout without FP8 rows falls back to the catalog
    roofline at one byte an element (the efficiency curve is fitted on bfloat16-KV rows), said; A100's tables hold no
    FP8 rows at all."""
    m, h100 = CATALOG.model("llama-3.1-8b"), CATALOG.hardware_spec("h100-sxm")
    bf16, fp8 = (OperatorModel(m, h100, tp=1, check_memory=False, kv_dtype=kv) for kv in (None, "float8"))
    assert (bf16.kv_dtype, fp8.kv_dtype) == ("bfloat16", "float8") and "kv float8" in fp8.name and "kv" not in bf16.name
    assert float(fp8.kv_bytes_per_device(16, 4096)) == pytest.approx(float(bf16.kv_bytes_per_device(16, 4096)) / 2)
    df = _frame_at("h100_sxm/attention/vllm/0.24.0/generation_attention_perf.parquet")
    for model in (bf16, fp8):
        kv = "fp8" if model is fp8 else "bfloat16"
        rows = df[(df.kv_cache_dtype == kv) & (df.kernel_source == model._attn_kernel) & (df.num_heads == 32) & (df.num_key_value_heads == 8)
                  & (df.head_dim == 128) & (df.window_size == 0) & (df.batch_size == 64) & (df.step == 4095)]
        assert not rows.empty
        attention = {p.part: p for p in model.breakdown(64, 1, 4096)}["attention"]
        assert attention.measured and f"{model.kv_dtype} KV cache" in attention.source
        i, j = list(model._attn.x).index(64), list(model._attn.y).index(4095)
        assert model._attn.raw[i, j] == pytest.approx(float(rows.latency.median()) * 1e-3, rel=1e-12)
    assert fp8._attn_ctx is not None and fp8._attn_ctx is not bf16._attn_ctx  # the prefill table's FP8 rows too
    # the FP8 cache reads half the bytes: long-context decoding costs less, and never more anywhere the tables measure
    assert {p.part: p for p in fp8.breakdown(64, 1, 4096)}["attention"].seconds < 0.8 * {p.part: p for p in bf16.breakdown(64, 1, 4096)}[
        "attention"].seconds
    # a layout the FP8 rows lack (head_dim 64): the catalog roofline at one byte, noted
    small = OperatorModel(CATALOG.model("smollm2-135m"), h100, tp=1, check_memory=False, kv_dtype="float8")
    assert small._attn is None
    note = {p.part: p for p in small.breakdown(8, 1, 2048)}["attention"]
    assert not note.measured and "float8-KV rows" in note.note
    # the deployment and the CLI take it; a KV dtype the tables do not measure is refused before any pricing
    a = assemble(Deployment(target="llama-3.1-8b", hardware="h100-sxm", cost_model="operators", kv_dtype="float8"))
    assert a.target.kv_dtype == "float8"
    status, out, err = run(capsys, "cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "operators", "--kv-dtype", "int8")
    assert status == 2 and "valid: auto, bfloat16, float16, float8" in err and "Traceback" not in err


@tables
def test_an_attention_table_without_fa3_is_read_at_its_engines_default_kernel():
    # Blackwell's tables hold no FA3: the kernel the table measures most, each engine's default lane there (vLLM 0.24.0's
    # FlashInfer TRT-LLM decode and prefill kernels; SGLang 0.5.14's trtllm_mha on SM100); Hopper keeps FA3
    from draftsim.sim.cost.kernel_tables import attention_rows, newest_table

    def kernel(system, framework, filename):
        return attention_rows(newest_table(systems_root(), system, "attention", framework, filename))[0]

    assert kernel("b200_sxm", "vllm", "generation_attention_perf.parquet") == "vllm_flashinfer_trtllmdecode"
    assert kernel("b200_sxm", "vllm", "context_attention_perf.parquet") == "vllm_flashinfer_trtllmprefill"
    assert kernel("gb200", "sglang", "generation_attention_perf.parquet") == "trtllm_mha"
    assert kernel("h200_sxm", "vllm", "generation_attention_perf.parquet") == "vllm_flash_attn_fa3"
    assert kernel("h100_sxm", "sglang", "context_attention_perf.parquet") == "fa3"
