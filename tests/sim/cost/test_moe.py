"""Mixture-of-experts targets and latent attention in the roofline (sim/cost/moe.py, catalog fields)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim.cost import RooflineModel, default_catalog
from draftsim.sim.cost.assembly import Deployment, assemble
from draftsim.sim.cost.catalog import model_from_hf_config
from draftsim.sim.cost.moe import ExpertCost, expected_experts
from draftsim.sim.errors import DraftsimError

CAT = default_catalog()


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 64), st.integers(1, 8), st.integers(0, 40), st.integers(0, 2**31 - 1))
def test_expected_distinct_experts_matches_simulated_routing(E, k, n, seed):
    """Each token draws k distinct experts of E uniformly, tokens independently: the mean number
    of distinct experts over many calls is E·(1 − (1 − k/E)^N)."""
    k = min(k, E)
    rng = np.random.default_rng(seed)
    trials = 2000
    keys = rng.random((trials, n, E)).argsort(axis=-1)[..., :k]  # k distinct experts per token
    hit = np.zeros((trials, E), dtype=bool)
    if n:
        np.put_along_axis(hit, keys.reshape(trials, n * k), True, axis=1)
    distinct = hit.sum(axis=1)
    exact = float(expected_experts(n, E, k))
    # the exact variance of the count: each expert missed w.p. p, two given ones both w.p. q
    p = (1 - k / E) ** n
    q = ((E - k) * (E - k - 1) / (E * (E - 1))) ** n
    var = E * p * (1 - p) + E * (E - 1) * (q - p * p)
    # 5 standard errors, plus a few counts' worth for rare misses (where the normal bound is too tight)
    assert abs(distinct.mean() - exact) <= 5 * np.sqrt(max(var, 0.0) / trials) + 3 / trials
    assert 0 <= exact <= E and (n == 0 or exact >= k - 1e-9)


@pytest.mark.parametrize("name, total, active", [
    ("mixtral-8x7b", 47e9, 13e9),        # arXiv 2401.04088: 47B, 13B active
    ("deepseek-v3", 671e9, 37e9),        # arXiv 2412.19437: 671B, 37B activated
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),    # the model's name and card: 30.5B, 3.3B activated
    ("qwen3-235b-a22b", 235e9, 22e9),
    ("gpt-oss-120b", 117e9, 5.1e9),      # 117B, 5.1B active (without embeddings)
    ("glm-4.5-air", 106e9, 12e9),        # GLM-4.5 report Table 1 (MTP counted, embeddings not)
])
def test_catalog_moe_models_hold_their_published_parameter_counts(name, total, active):
    m = CAT.model(name)
    assert m.params == pytest.approx(total, rel=0.02)
    emb = m.vocab * m.hidden  # publishers count active weights with, without or with half the embeddings
    assert min(abs(m.active_params - j * emb - active) for j in (0, 1, 2)) / active < 0.08


def test_one_layer_of_experts_by_hand():
    """Bytes and FLOPs of the routed experts of one call, counted by hand."""
    m = CAT.model("qwen3-30b-a3b")
    e = ExpertCost(m.moe_layers, m.experts, m.experts_per_token, m.expert_params * 2.0, (2 * m.hidden + 2 * m.expert_intermediate) * 2.0,
                   2 * m.expert_params)
    w_e = 3 * 2048 * 768  # gate, up, down of one expert
    assert m.expert_params == w_e
    n = 4
    woken = 128 * (1 - (1 - 8 / 128) ** 4)
    assert float(e.bytes(n)) == pytest.approx(48 * (woken * w_e * 2 + n * 8 * (2 * 2048 + 2 * 768) * 2), rel=1e-12)
    assert float(e.flops(n)) == pytest.approx(48 * n * 8 * 2 * w_e, rel=1e-12)


def test_a_one_expert_moe_is_its_dense_twin_plus_a_router_and_dense_models_are_unchanged():
    hw = CAT.hardware_spec("h100-sxm")
    dense = CAT.model("llama-3.1-8b")
    twin = dataclasses.replace(dense, experts=1, experts_per_token=1, expert_intermediate=dense.intermediate)
    B = hw.memory_bandwidth * hw.mbu
    for n in (1, 4, 64, 512):
        a = float(RooflineModel(dense, hw).shape_time(1, n, 512))
        # the identity of the roofline's formula, at the catalog's MBU/MFU for both (the fused-MoE call's fixed
        # time, hardware.json's fused_moe_us, set apart: 0 here, then on top once per MoE layer); the kernels'
        # fixed times (kernel_fixed_us): the MoE layer runs the router's GEMM where the dense MLP runs two
        b = float(RooflineModel(twin, hw, moe_efficiency=False, fused_moe=0.0).shape_time(1, n, 512))
        router = 32 * (4096 * 1 + (4096 + 1) * n) * 2 / B  # its weights and its activations in and out, memory-bound
        gemm = hw.kernel_fixed["gemm"]
        assert gemm > 0 and b - a == pytest.approx(router - 32 * gemm, rel=1e-6)
        c = float(RooflineModel(twin, hw, moe_efficiency=False).shape_time(1, n, 512))
        assert hw.fused_moe > 0 and c - a == pytest.approx(router - 32 * gemm + 32 * hw.fused_moe, rel=1e-6)
    assert RooflineModel(dense, hw).model.architecture == "32x4096/14336 h32/8x128 v128256"


def test_verification_wakes_experts_a_dense_model_of_the_same_size_does_not_pay_for():
    """The speculative penalty: verifying 4 tokens costs a MoE target more, relative to decoding
    one, than it costs a dense model (whose weights are read once whatever the tokens). The
    measured H200 tables (--cost-model operators, DeepSeek-V3 float8 on 8 GPUs, batch 1, context
    512) put it at 1.19x (vLLM's) and 1.33x (SGLang's); the roofline, whose kernels' fixed times
    are paid once whatever the tokens, at 1.33x."""
    hw = CAT.hardware_spec("h200")
    moe = RooflineModel(CAT.model("deepseek-v3"), hw, "float8", tp=8)
    dense = RooflineModel(CAT.model("llama-3.1-70b"), hw, "float8", tp=8)
    ratio = lambda r: float(r.shape_time(1, 4, 512) / r.shape_time(1, 1, 512))  # noqa: E731
    assert ratio(moe) > 1.25 > 1.05 > ratio(dense)
    # at batch 64 nearly every expert is already awake: verification costs little more
    assert float(moe.shape_time(64, 4, 512) / moe.shape_time(64, 1, 512)) < 1.3


def test_latent_attention_caches_the_latent_once_per_device():
    m = CAT.model("deepseek-v3")
    assert m.kv_per_token == 61 * (512 + 64)
    r = RooflineModel(m, CAT.hardware_spec("h200"), "float8", tp=8)
    # --kv-cache-dtype auto: the model's bfloat16, 2 bytes an element, not split by TP; an FP8 cache 1 byte
    assert float(r.kv_bytes_per_device(1, 1000)) == pytest.approx(1000 * 61 * 576 * 2.0)
    fp8 = RooflineModel(m, CAT.hardware_spec("h200"), "float8", tp=8, kv_dtype="float8")
    assert float(fp8.kv_bytes_per_device(1, 1000)) == pytest.approx(1000 * 61 * 576 * 1.0)


def test_hf_configs_of_moe_models_read_as_the_catalog_has_them(tmp_path):
    deepseek = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
                "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
                "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
                "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_nextn_predict_layers": 1,
                "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": False}
    mixtral = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
               "max_position_embeddings": 32768, "tie_word_embeddings": False}
    for name, cfg in (("deepseek-v3", deepseek), ("mixtral-8x7b", mixtral)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        assert model_from_hf_config(tmp_path / name).architecture == CAT.model(name).architecture
    for bad, message in (({"shared_expert_intermediate_size": 5632}, "shared expert of its own size"),
                         ({"decoder_sparse_step": 2}, "decoder_sparse_step = 2"),
                         ({"num_experts_per_tok": None}, "without num_experts_per_tok")):
        (tmp_path / "bad").mkdir(exist_ok=True)
        (tmp_path / "bad" / "config.json").write_text(json.dumps({**mixtral, **bad}))
        with pytest.raises(DraftsimError, match=message):
            model_from_hf_config(tmp_path / "bad")


def test_mtp_drafts_for_targets_with_mtp_modules():
    a = assemble(Deployment("deepseek-v3", "h200", ("mtp",), tp=8, dtype="float8", overheads="none"))
    t1 = float(a.drafters[0].shape_time(1, 1, 512))
    assert 0 < t1 < float(a.target.shape_time(1, 1, 512)) / 10  # one MoE block of 61 (+ the shared LM head)
    with pytest.raises(DraftsimError, match="declares none"):
        assemble(Deployment("llama-3.1-8b", "h100-sxm", ("mtp",)))


def _simulate_busiest(E: int, k: int, g: int, n: int, trials: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Awake experts and token-expert pairs on the busiest of g devices (E/g whole experts each),
    per simulated call of n tokens (k distinct experts of E per token, uniformly)."""
    keys = rng.random((trials, n, E)).argsort(axis=-1)[..., :k]
    counts = np.zeros((trials, E), dtype=np.int64)
    for t in range(trials):
        np.add.at(counts[t], keys[t].ravel(), 1)
    per_device = counts.reshape(trials, g, E // g)
    return (per_device > 0).sum(axis=2).max(axis=1), per_device.sum(axis=2).max(axis=1)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([(256, 8, 8), (128, 8, 4), (128, 8, 8), (8, 2, 2), (64, 6, 4), (32, 4, 8)]),
       st.sampled_from([1, 2, 3, 5, 16, 40]), st.integers(0, 2**31 - 1))
def test_the_busiest_expert_parallel_device_matches_simulated_routing(shape, n, seed):
    """Expert parallelism: the expected awake experts and token-expert pairs of the busiest device
    against simulated routing, within 2% plus 4 standard errors of the simulation."""
    from draftsim.sim.cost.moe import busiest_device_experts, busiest_device_pairs

    E, k, g = shape
    awake, pairs = _simulate_busiest(E, k, g, n, 1500, np.random.default_rng(seed))
    for sim, formula in ((awake, busiest_device_experts(n, E, k, g)), (pairs, busiest_device_pairs(n, E, k, g))):
        se = sim.std() / np.sqrt(len(sim))
        assert abs(float(formula) - sim.mean()) <= 0.02 * sim.mean() + 4 * se + 1e-9
    # bounds: at least the mean device, at most everything
    assert E / g * (1 - (1 - k / E) ** n) - 1e-9 <= float(busiest_device_experts(n, E, k, g)) <= min(E / g, n * k) + 1e-9
    assert n * k / g - 1e-9 <= float(busiest_device_pairs(n, E, k, g)) <= n * k + 1e-9


def test_expert_parallelism_places_whole_experts_and_waits_for_the_busiest_device(capsys):
    from clirun import run

    from draftsim.sim.cost.moe import busiest_device_experts, busiest_device_pairs

    hw = CAT.hardware_spec("h200")
    m = CAT.model("deepseek-v3")
    tp = RooflineModel(m, hw, "float8", tp=8)
    ep = RooflineModel(m, hw, "float8", tp=8, expert_parallel=True)
    assert ep.weight_bytes_per_device() == tp.weight_bytes_per_device()  # the same weights per device, placed otherwise
    n = np.array([1.0, 4.0, 64.0, 320.0])
    e = ep._experts
    assert e.groups == 8 and e.weight_bytes == m.expert_params * 1.0 and e.flops_per_token == 2 * m.expert_params
    want = m.moe_layers * (busiest_device_experts(n, m.experts, m.experts_per_token, 8) * m.expert_params * 1.0
                           + busiest_device_pairs(n, m.experts, m.experts_per_token, 8) * (2 * m.hidden + 2 * m.expert_intermediate))
    assert np.allclose(e.bytes(n), want, rtol=1e-12)
    # a decode step at batch 1 waits for the busiest device: 2.5 of its 32 experts, where the split reads 1 expert's worth
    assert float(e.bytes(1.0)) > 2 * float(tp._experts.bytes(1.0)) - m.moe_layers * 8 * (2 * m.hidden + 2 * m.expert_intermediate)
    assert float(ep.shape_time(1, 1, 512)) > float(tp.shape_time(1, 1, 512))
    # one device, or a dense model's absence of experts: nothing changes, or one line
    one = RooflineModel(CAT.model("qwen3-30b-a3b"), CAT.hardware_spec("h100-sxm"), expert_parallel=True)
    assert float(one.shape_time(4, 5, 512)) == float(RooflineModel(CAT.model("qwen3-30b-a3b"), CAT.hardware_spec("h100-sxm")).shape_time(4, 5, 512))
    with pytest.raises(DraftsimError, match="has none"):
        RooflineModel(CAT.model("llama-3.1-8b"), hw, expert_parallel=True)
    with pytest.raises(DraftsimError, match="128 routed experts do not split over --tp 3"):
        RooflineModel(CAT.model("qwen3-30b-a3b"), hw, tp=3, expert_parallel=True, check_memory=False)
    # the CLI: the assembled target says how its experts are placed; refusals are one line
    built = assemble(Deployment("deepseek-v3", "h200", (), tp=8, dtype="float8", expert_parallel=True, overheads="none"))
    assert built.target.expert_parallel and "experts whole over 8 devices" in built.info["backends"]["deepseek-v3"]
    status, out, err = run(capsys, "cost", "--target", "llama-3.1-8b", "--hardware", "h200", "--expert-parallel")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and "dense model" in err
    status, out, err = run(capsys, "cost", "--target", "deepseek-v3", "--hardware", "h200", "--tp", "8", "--dtype", "float8",
                           "--expert-parallel", "--engine", "none", "--json")
    assert status == 0 and json.loads(out)["records"][0]["seconds"] == pytest.approx(float(ep.shape_time(1, 1, 512)), rel=1e-12)
