"""Serving-engine overheads on the rooflines (sim/cost/overheads.py, sim/data/engines.json)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim.cost import RooflineModel, default_catalog
from draftsim.sim.cost.assembly import Deployment, assemble
from draftsim.sim.cost.methods import head_cost, parse_drafter
from draftsim.sim.cost.overheads import ENGINES, ENGINES_FILE, engine_overheads, pad_tokens
from draftsim.sim.errors import DraftsimError

SIZES = ENGINES["vllm"].graph_tokens  # as data: engines.json graph_capture_tokens (listed sizes, then stepped ranges)


def test_vllms_capture_sizes_are_its_rule():
    rule = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 512 + 1, 16))  # vllm/config/compilation.py, max 512
    assert SIZES == tuple(rule)
    # V0 (vllm-v0.6) captured up to 256 tokens: vllm/worker/model_runner.py _BATCH_SIZES_TO_CAPTURE
    assert ENGINES["vllm-v0.6"].graph_tokens == (1, 2, 4, *range(8, 257, 8))
    assert SIZES[:5] == (1, 2, 4, 8, 16) and SIZES[-3:] == (480, 496, 512) and len(SIZES) == 51
    assert all(b > a for a, b in zip(SIZES, SIZES[1:]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2000), min_size=1, max_size=20))
def test_padding_reaches_the_next_captured_size_and_nothing_more(tokens):
    t = np.array(tokens, dtype=np.float64)
    p = pad_tokens(t, SIZES)
    assert np.all(p >= t)
    inside = (t > 0) & (t <= 512)
    assert set(p[inside].tolist()) <= set(SIZES)
    assert np.array_equal(p[~inside], t[~inside])  # empty calls and eager ones (> 512) as they are
    assert np.array_equal(pad_tokens(p, SIZES), p)  # idempotent
    below = np.array([max([s for s in SIZES if s < x], default=0) for x in p[inside]])
    assert np.all(below < t[inside])  # the smallest size that holds them


def test_the_engine_adds_its_step_and_draft_forward_times_and_pads():
    cat = default_catalog()
    hw = cat.hardware_spec("h100-sxm")
    vllm = engine_overheads("vllm")
    plain = assemble(Deployment("llama-3.1-8b", "h100-sxm", ("qwen2.5-0.5b", "eagle3"), overheads="none"))
    eng = assemble(Deployment("llama-3.1-8b", "h100-sxm", ("qwen2.5-0.5b", "eagle3"), overheads="vllm"))
    # a call of 8 tokens is a captured size: no padding, the step's time on top of the forward with memory and compute added
    added = RooflineModel(cat.model("llama-3.1-8b"), hw, overlap=0.0)
    assert float(eng.target.shape_time(8, 1, 512)) == pytest.approx(float(added.shape_time(8, 1, 512)) + vllm.per_step, rel=1e-12)
    assert vllm.overlap == 0.0 and engine_overheads("none").overlap == 1.0
    # the draft model's roofline likewise, and the EAGLE-3 head (its own matmuls), each with the per-draft-forward time
    qwen = RooflineModel(cat.model("qwen2.5-0.5b"), hw, overlap=0.0, check_memory=False)
    assert float(eng.drafters[0].shape_time(1, 1, 512)) == pytest.approx(float(qwen.shape_time(1, 1, 512)) + vllm.per_draft_forward,
                                                                        rel=1e-12)
    head = head_cost(parse_drafter("eagle3"), cat.model("llama-3.1-8b"), hw, "bfloat16", 1, overlap=0.0)
    assert float(eng.drafters[1].shape_time(1, 1, 512)) == pytest.approx(float(head.shape_time(1, 1, 512)) + vllm.per_draft_forward,
                                                                        rel=1e-12)
    assert float(head.shape_time(1, 1, 512)) > float(plain.drafters[1].shape_time(1, 1, 512))
    # the derivation in engines.json: three such draft forwards are SpecDecode-Bench's fitted EAGLE draft time per step
    assert 3 * float(eng.drafters[1].shape_time(1, 1, 512)) == pytest.approx(2.13526175e-03, rel=1e-3)
    # 3 tokens run as the captured 4 in the dense operators (attention over the 3 real ones)
    padded = RooflineModel(cat.model("llama-3.1-8b"), hw, graph_tokens=SIZES)
    bare = RooflineModel(cat.model("llama-3.1-8b"), hw)
    assert float(padded.shape_time(1, 3, 0)) > float(bare.shape_time(1, 3, 0))
    assert float(padded.shape_time(1, 4, 0)) == float(bare.shape_time(1, 4, 0))
    assert "vllm engine overheads" in eng.target.name and "1.21 ms per step" in eng.info["engine"]
    assert "memory and compute time added" in eng.info["engine"]


def test_the_engines_forward_adds_memory_and_compute_time_as_its_measured_fit_does():
    """SpecDecode-Bench's fit of vLLM's forward (Llama-3.1-8B, one H100: sim/data/engines.json) is
    a constant plus 21.0 us per batched token. The roofline's max(memory, compute) has almost no
    per-token term below the ridge; the sum of the two times (overlap 0, the vllm engine) has one
    of the fit's size. Nothing is fitted: the catalog's MFU and MBU price both."""
    cat = default_catalog()
    hw = cat.hardware_spec("h100-sxm")
    fit_slope = 2.10103129e-05  # target_c_compute, s per batched token
    slope = {}
    # below the ridge (peak·MFU / (bandwidth·MBU) FLOPs a byte: ~200 tokens here) for the max, over the fit's batches for the sum
    ridge = hw.peak("bfloat16") * hw.mfu / (hw.memory_bandwidth * hw.mbu)
    windows = {1.0: (32, 160), 0.0: (64, 256)}
    assert windows[1.0][1] < ridge
    for overlap, (a, b) in windows.items():
        m = RooflineModel(cat.model("llama-3.1-8b"), hw, overlap=overlap)
        t = m.shape_time(np.array([a, b]), 1, 0)
        slope[overlap] = float(t[1] - t[0]) / (b - a)
    assert slope[1.0] < 0.2 * fit_slope  # the max: 10x below the measured slope
    assert 0.9 * fit_slope < slope[0.0] < 1.4 * fit_slope  # the sum: within 30% (the catalog's MFU 0.6 is below this GEMM's)
    # overlap between: max + (1 - o) * min per operator, dense, attention and routed experts alike
    for name, device in (("llama-3.1-8b", hw), ("qwen3-30b-a3b", cat.hardware_spec("h200"))):
        half = RooflineModel(cat.model(name), device, overlap=0.5)
        lo, hi = (RooflineModel(cat.model(name), device, overlap=o).shape_time(np.array([1, 8, 128]), 2, 256) for o in (1.0, 0.0))
        assert np.allclose(half.shape_time(np.array([1, 8, 128]), 2, 256), (lo + hi) / 2, rtol=1e-12), name
        assert np.all(hi > lo)
    with pytest.raises(DraftsimError, match="overlap must lie in"):
        RooflineModel(cat.model("llama-3.1-8b"), hw, overlap=1.5)


def test_every_engine_value_cites_its_source():
    doc = json.loads(ENGINES_FILE.read_text())["engines"]
    assert set(doc) == set(ENGINES) >= {"none", "vllm"}
    v = doc["vllm"]
    assert v["per_step_source"]["commit"] and v["per_draft_forward_source"]["derived"] and v["graph_capture_tokens"]["source"]["commit"]


def test_an_unknown_engine_is_one_line(capsys):
    with pytest.raises(DraftsimError, match="unknown engine 'sglang-9'; did you mean sglang\\? known: none, vllm"):
        engine_overheads("sglang-9")
    status, out, err = run(capsys, "cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--overheads", "tgi")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and "tgi" in err and "vllm" in err


def test_the_engines_measured_all_reduce_prices_tensor_parallel_steps():
    """vLLM's custom all-reduce on H100 as SGLang PR #2904 measured it (sim/data/engines.json):
    two per layer, each at the measured time for its message (h bfloat16 values per token),
    interpolated between the measured sizes, the catalog's bandwidth beyond them; other
    hardware and other tensor-parallel sizes keep latency + bytes / bandwidth."""
    cat = default_catalog()
    hw = cat.hardware_spec("h100-sxm")
    spec = cat.model("llama-3-70b")
    vllm = engine_overheads("vllm")
    sizes, secs = vllm.allreduce_for("h100-sxm", 4)
    assert len(sizes) == len(secs) == 6 and secs[3] == pytest.approx(20.6e-6)
    measured = RooflineModel(spec, hw, tp=4, allreduce=(sizes, secs))
    free = RooflineModel(spec, hw, tp=4, allreduce=(sizes, [0.0] * len(sizes)))
    per_token = spec.hidden * 2  # bytes of a bfloat16 hidden state
    n = np.array([1, 16, 32, 64])  # 16 KiB .. 1 MiB messages: 16 tokens = 262144 bytes
    ar = measured.shape_time(n, 1, 256) - free.shape_time(n, 1, 256)
    want = 2 * spec.layers * np.interp(n * per_token, sizes, secs)
    assert np.allclose(ar, want, rtol=1e-9) and ar[1] == pytest.approx(2 * spec.layers * 20.6e-6, rel=1e-9)
    # beyond 1 MiB: the 1 MiB time, then the catalog's ring bandwidth (the same growth as the zero table's)
    big = measured.shape_time(np.array([64, 65, 128]), 1, 0) - free.shape_time(np.array([64, 65, 128]), 1, 0)
    assert np.allclose(big, 2 * spec.layers * secs[-1], rtol=1e-9)
    grow = free.shape_time(np.array([64, 128]), 1, 0)
    assert grow[1] > grow[0]
    # the engine applies it on the NVLink-4 parts (h100-sxm, h200: the same fabric) at tp 2, 4, 8 only
    on = assemble(Deployment("llama-3-70b", "h100-sxm", (), tp=4, overheads="vllm")).target
    also = assemble(Deployment("llama-3-70b", "h200", (), tp=4, overheads="vllm")).target
    off = assemble(Deployment("llama-3-70b", "a100-80g", (), tp=4, overheads="vllm")).target
    assert on.allreduce is not None and also.allreduce is not None and off.allreduce is None
    assert vllm.allreduce_for("h100-sxm", 3) is None and engine_overheads("none").allreduce_for("h100-sxm", 4) is None
    assert "all-reduces at their measured times on h100-sxm, h200" in vllm.describe()


def test_sglangs_scheduler_hides_the_host_work_of_plain_decoding_only():
    """SGLang's overlap scheduler (on by default, off under EAGLE; sim/data/engines.json): a server
    without speculation takes max(forward, per-step host work) a step, a speculating one their sum."""
    sglang = engine_overheads("sglang")
    assert sglang.host_overlap(speculative=False) and not sglang.host_overlap(speculative=True)
    assert not engine_overheads("vllm").host_overlap(speculative=False)
    assert "overlapped with the forward without speculation" in sglang.describe()
    built = assemble(Deployment("llama-3.1-8b", "h100-sxm", ("eagle3",), overheads="sglang"))
    b, c = np.array([1, 8, 64]), 512
    spec, plain = built.target.shape_time(b, 1, c), built.plain_target.shape_time(b, 1, c)
    assert np.allclose(spec - plain, sglang.per_step, rtol=1e-9)  # the forward (5.9 ms at batch 1) is longer than the host's 1.2 ms
    assert built.plain_target.floor == sglang.per_step and built.target.floor == 0.0
    assert "host work overlapped" in built.info["without speculation"]
    # engines that treat both kinds alike give no separate plain target
    assert assemble(Deployment("llama-3.1-8b", "h100-sxm", ("eagle3",), overheads="vllm")).plain_target is None


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 256), st.integers(1, 8), st.integers(0, 4096))
def test_a_hidden_host_step_is_the_larger_of_the_forward_and_the_host_work(batch, new, context):
    """max(forward, host): exact for a model whose forward is shorter than the host work (a 135M
    model on an H100) and for one whose forward is longer."""
    sglang = engine_overheads("sglang")
    for model in ("smollm2-135m", "llama-3.1-8b"):
        built = assemble(Deployment(model, "h100-sxm", ("eagle3",), overheads="sglang"))
        spec = float(built.target.shape_time(batch, new, context))
        plain = float(built.plain_target.shape_time(batch, new, context))
        assert plain == pytest.approx(max(spec - sglang.per_step, sglang.per_step), rel=1e-9, abs=1e-15)
        stats_plain = built.plain_target.forward_time(np.full(batch, new), np.full(batch, context))
        assert float(stats_plain) == pytest.approx(plain, rel=1e-9)


def test_the_serving_simulator_prices_each_server_as_the_engine_runs_it(capsys):
    from draftsim.analysis.loadstudy import autoregressive
    from draftsim.api import ServeSimConfig
    from draftsim.commands.servesim import serving_config

    common = dict(target="llama-3.1-8b", hardware="h100-sxm", drafter_model=["eagle3"], engine="sglang", alpha=0.7)
    spec = serving_config(ServeSimConfig(policy="fixed:k=3", **common))
    ar = serving_config(ServeSimConfig(policy="ar", **common))
    assert spec.target.floor == 0.0 and spec.plain_target.floor > 0 and ar.target.floor > 0 and ar.plain_target is None
    assert autoregressive(spec).target is spec.plain_target and autoregressive(spec).plain_target is None
    vllm = serving_config(ServeSimConfig(policy="fixed:k=3", **{**common, "engine": "vllm"}))
    assert autoregressive(vllm).target is vllm.target
    # the single-stream planners count plain decoding as one target call a token: refused, one line
    with pytest.raises(DraftsimError, match="--engine sglang prices plain decoding's step apart"):
        assemble(Deployment("llama-3.1-8b", "h100-sxm", ("eagle3",), overheads="sglang")).costs()
    status, out, err = run(capsys, "simulate", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--drafter-model", "eagle3",
                           "--overheads", "sglang", "--alpha", "0.7", "--policy", "fixed:k=3")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and "serve-sim" in err
    # draftsim cost shows both prices of the target
    status, out, err = run(capsys, "cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--drafter-model", "eagle3",
                           "--overheads", "sglang", "--json")
    rows = {r["role"]: r for r in json.loads(out)["records"]}
    assert status == 0 and rows["plain target"]["model"] == "llama-3.1-8b (without speculation)"
    assert rows["target"]["seconds"] - rows["plain target"]["seconds"] == pytest.approx(engine_overheads("sglang").per_step, rel=1e-9)


def test_sglangs_plain_decoding_step_against_the_eagle3_papers_baseline():
    """A check, not a fit: the EAGLE-3 paper's Table 4 measured SGLang without speculation at
    158.34 tokens/s for Llama-3.1-8B on one H100 at batch 1 (6.32 ms a token, prefill included;
    sim/data/engines.json). The sglang entry predicts its TPOT within 5%; vLLM's measured 7.07 ms
    (issue 20780) is the same forward with the host work added."""
    from draftsim.api import ServeSimConfig, serve_sim

    doc = json.loads(ENGINES_FILE.read_text())["engines"]["sglang"]["consistency"]
    measured = 1.0 / doc["tokens_per_second"]
    tpot = serve_sim(ServeSimConfig(target="llama-3.1-8b", hardware="h100-sxm", prompt_len="fixed:128", output_len="fixed:256",
                                    qps=0.05, requests=10, policy="ar", engine="sglang")).summary.tpot.mean
    assert tpot == pytest.approx(measured, rel=0.05)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.integers(0, 4096))
def test_batch_expansion_reads_each_positions_context(batch, new, context):
    """A verification scored by batch expansion (every draft position a sequence of its own) reads
    the KV cache once per query: its KV entries are the call's query-key pairs, b·n·(c + (n + 1)/2),
    where one sequence's queries share b·c + b·n. Exact with memory and compute time added; a
    decode step (n = 1) is unchanged; the batch-sum path agrees with the shape path."""
    cat = default_catalog()
    hw, spec = cat.hardware_spec("h100-sxm"), cat.model("llama-3-70b")
    shared = RooflineModel(spec, hw, tp=4, overlap=0.0)
    expanded = RooflineModel(spec, hw, tp=4, overlap=0.0, kv_per_query=True)
    N = batch * new
    kv_bytes = 2 * spec.kv_heads / 4 * spec.head_dim * 2 * spec.layers  # per entry, per device (8 KV heads over 4)
    extra = (N * (context + (new + 1) / 2) - batch * context - N) * kv_bytes / (hw.memory_bandwidth * hw.mbu)
    diff = float(expanded.shape_time(batch, new, context)) - float(shared.shape_time(batch, new, context))
    assert diff == pytest.approx(extra, rel=1e-9, abs=1e-12)
    if new == 1:
        assert diff == pytest.approx(0.0, abs=1e-12)
    stats = float(expanded.forward_time(np.full(batch, new), np.full(batch, context)))
    assert stats == pytest.approx(float(expanded.shape_time(batch, new, context)), rel=1e-9)


def test_vllm_of_october_2024_verifies_ngram_by_batch_expansion_only():
    v06 = engine_overheads("vllm-v0.6")
    assert v06.batch_expansion == ("ngram",) and "ngram proposals verified by batch expansion" in v06.describe()
    ngram = assemble(Deployment("llama-3-70b", "h100-sxm", ("ngram",), tp=4, overheads="vllm-v0.6"))
    assert ngram.target.kv_per_query and not ngram.plain_target.kv_per_query  # plain decoding has nothing to expand
    assert "verified by batch expansion" in ngram.info["backends"]["llama-3-70b"]
    model = assemble(Deployment("llama-3-70b", "h100-sxm", ("qwen2.5-0.5b",), tp=4, overheads="vllm-v0.6"))
    assert not model.target.kv_per_query and model.plain_target is None  # draft models: the MQA scorer
    assert not assemble(Deployment("llama-3-70b", "h100-sxm", ("ngram",), tp=4, overheads="vllm")).target.kv_per_query
    # a decode step is the same under both scorers, so the single-stream planners take it
    assert ngram.costs(batch=8, context=1000).models[0].single > 0
    doc = json.loads(ENGINES_FILE.read_text())["engines"]["vllm-v0.6"]["batch_expansion"]
    assert doc["methods"] == ["ngram"] and all(s["url"] and s["quote"] for s in doc["source"])
