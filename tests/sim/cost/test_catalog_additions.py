"""Issue 37, items 4 and 5: the catalogs a team needs and acceptance a team can use.

New models are checked against their published parameter counts (and, where the operators extra
is installed, against the config.json files aiconfigurator-core vendors); new hardware against
the datasheet convention (dense = half the with-sparsity figure) and the roofline; ``--kv-dtype``
halves the KV bytes in fp8; int4 weights read half a byte and multiply at the bfloat16 rate;
EAGLE-3's draft vocabulary comes from the target's published head; ``--acceptance NAME --borrow``
uses another target's (or method's) entry with a warning in every output, a range is a bracket
(``NAME@low`` / ``NAME@high``), and an n-gram entry that counted its unmatched steps sets the
match share.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from clirun import run

from draftsim.commands.simulation import SimulateConfig, acceptance_warnings, build_process
from draftsim.sim.acceptance_catalog import acceptance_entry, check_use
from draftsim.sim.cost import RooflineModel, default_catalog
from draftsim.sim.cost.assembly import Deployment, assemble
from draftsim.sim.cost.catalog import model_from_hf_config
from draftsim.sim.cost.kernel_tables import SYSTEMS
from draftsim.sim.cost.methods import EAGLE3_DRAFT_VOCAB_BY_TARGET, FACTS, eagle3_draft_vocab, head_cost, parse_drafter
from draftsim.sim.errors import DraftsimError

CAT = default_catalog()


# -- models -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, total, non_embedding", [
    # Qwen model cards (huggingface.co/Qwen/<name>, "Number of Parameters" and "(Non-Embedding)")
    ("qwen3-0.6b", 0.6e9, 0.44e9),
    ("qwen3-1.7b", 1.7e9, 1.4e9),
    ("qwen3-8b", 8.2e9, 6.95e9),
    ("qwen3-32b", 32.8e9, 31.2e9),
    # Meta's model cards: Llama 3.2 1B (1.23B) and 3B (3.21B), Llama 3.3 70B (70.6B, as Llama 3.1 70B)
    ("llama-3.2-1b", 1.23e9, None),
    ("llama-3.2-3b", 3.21e9, None),
    ("llama-3.3-70b", 70.6e9, None),
    # OpenAI gpt-oss model card: gpt-oss-20b 20.91B total
    ("gpt-oss-20b", 20.91e9, None),
    # zai-org/GLM-4.5 README: 355B total
    ("glm-4.5", 355e9, None),
])
def test_new_models_match_their_published_parameter_counts(name, total, non_embedding):
    m = CAT.model(name)
    assert m.params == pytest.approx(total, rel=0.03)
    if non_embedding is not None:
        embed = m.vocab * m.hidden * (1 if m.tied_embeddings else 2)
        assert m.params - embed == pytest.approx(non_embedding, rel=0.03)


def test_moe_models_activate_a_small_share_and_glm_4_5_declares_its_mtp_layer():
    glm = CAT.model("glm-4.5")
    assert glm.moe_layers == 89 and glm.mtp_layers == 1
    assert glm.active_params == pytest.approx(32e9, rel=0.06)  # "32 billion active" (README); norms, biases neglected
    assert CAT.model("gpt-oss-20b").active_params < 0.25 * CAT.model("gpt-oss-20b").params


def test_aliases_reach_the_new_entries():
    assert CAT.model("Qwen/Qwen3-8B") == CAT.model("qwen3-8b")
    assert CAT.model("meta-llama/Llama-3.3-70B-Instruct") == CAT.model("llama-3.3-70b")
    assert CAT.model("meta-llama/Llama-3.3-70B-Instruct").architecture == CAT.model("llama-3.1-70b").architecture
    assert CAT.model("deepseek-ai/DeepSeek-R1").name == "deepseek-v3"
    assert CAT.hardware_spec("amd-mi300x").name == "mi300x"


_AIC = importlib.util.find_spec("aiconfigurator_core")


@pytest.mark.skipif(_AIC is None, reason="the operators extra (aiconfigurator-core) is not installed")
@pytest.mark.parametrize("name, file", [
    ("qwen3-0.6b", "Qwen--Qwen3-0.6B_config.json"),
    ("qwen3-1.7b", "Qwen--Qwen3-1.7B_config.json"),
    ("qwen3-8b", "Qwen--Qwen3-8B_config.json"),
    ("qwen3-32b", "Qwen--Qwen3-32B_config.json"),
    ("gpt-oss-20b", "openai--gpt-oss-20b_config.json"),
    ("deepseek-v3", "deepseek-ai--DeepSeek-R1_config.json"),
])
def test_entries_agree_with_the_config_files_they_cite(name, file):
    path = Path(_AIC.submodule_search_locations[0]) / "model_configs" / file
    assert model_from_hf_config(path).architecture == CAT.model(name).architecture


# -- hardware -----------------------------------------------------------------------------------

NEW_HW = ("b200", "gb200", "h100-pcie", "h100-nvl", "h20", "mi300x", "l40s")


@pytest.mark.parametrize("name", NEW_HW)
def test_new_hardware_is_cited_and_follows_the_conventions(name):
    hw = CAT.hardware_spec(name)
    assert any(w in hw.source.lower() for w in ("datasheet", "data sheet", "aiconfigurator"))
    assert "assumption" in hw.source  # the efficiency defaults are the convention, not a measurement
    if name in SYSTEMS:  # measured operator tables: the MBU derived from them (tests/benchmarks/test_derive_mbu.py), said so
        assert hw.mfu == 0.6 and 0.5 < hw.mbu < 1 and "derive_mbu.py" in hw.source and "aiconfigurator-core 0.12.0" in hw.source
    else:
        assert (hw.mfu, hw.mbu) == (0.6, 0.7)
    assert hw.peak("float8") == pytest.approx(2 * hw.peak("bfloat16"), rel=0.02)  # FP8 tensor cores: twice BF16's rate


@pytest.mark.parametrize("name, bf16_sparse", [("h100-pcie", 1513), ("h100-nvl", 1671), ("b200", 4500), ("mi300x", 2614.9)])
def test_dense_peaks_are_half_the_with_sparsity_figures(name, bf16_sparse):
    assert CAT.hardware_spec(name).peak("bfloat16") == pytest.approx(bf16_sparse / 2 * 1e12, rel=2e-3)


def test_batch_one_decoding_scales_with_memory_bandwidth():
    """A memory-bound step: on B200 (7.7 TB/s) against H100 SXM (3.35 TB/s), its bytes by the ratio
    of the bandwidths each reaches (datasheet × the catalog's MBU, each derived from the GPU's measured
    kernels); each GPU's kernels' fixed times, derived from the same tables, come on top (the B200's
    smaller: 2.13 µs a GEMM against 2.68)."""
    m = CAT.model("llama-3.1-8b")
    hw = {h: CAT.hardware_spec(h) for h in ("h100-sxm", "b200")}
    h100, b200 = (RooflineModel(m, hw[h]) for h in ("h100-sxm", "b200"))
    assert h100.kernel_seconds > b200.kernel_seconds > 0
    ratio = (float(h100.shape_time(1, 1, 512)) - h100.kernel_seconds) / (float(b200.shape_time(1, 1, 512)) - b200.kernel_seconds)
    assert ratio == pytest.approx(7700 * hw["b200"].mbu / (3350 * hw["h100-sxm"].mbu), rel=0.02)


# -- --kv-dtype and int4 weights ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-8b", "deepseek-v3"])
def test_fp8_kv_cache_halves_the_kv_bytes(name):
    m, hw = CAT.model(name), CAT.hardware_spec("h200")
    dtype, tp = ("float8", 8) if m.experts else ("bfloat16", 1)
    auto = RooflineModel(m, hw, dtype, tp, check_memory=False, kv_dtype="bfloat16")
    fp8 = RooflineModel(m, hw, dtype, tp, check_memory=False, kv_dtype="float8")
    assert fp8.memory().kv_per_token == pytest.approx(auto.memory().kv_per_token / 2)
    assert np.allclose(fp8.kv_bytes_per_device(16, 4096), auto.kv_bytes_per_device(16, 4096) / 2)
    assert fp8.memory().weights == auto.memory().weights
    # attention's reads of the cache: the step's growth with context halves
    grow = lambda r: float(r.shape_time(32, 1, 32768)) - float(r.shape_time(32, 1, 0))  # noqa: E731
    assert grow(fp8) == pytest.approx(grow(auto) / 2, rel=1e-6)


def test_kv_dtype_auto_is_the_models_data_type_and_a_weight_format_is_refused():
    """vLLM's and SGLang's --kv-cache-dtype auto: "will use model data type" (sim/cost/catalog.py KV_AUTO),
    which quantised weights leave at bfloat16: an FP8 or INT8 checkpoint's cache holds as many bytes a
    token as the bfloat16 model's; FP8 KV is asked for."""
    m, hw = CAT.model("llama-3.1-8b"), CAT.hardware_spec("h100-sxm")
    plain = RooflineModel(m, hw, "bfloat16")
    for dtype in ("float8", "int8", "int4"):
        quantised = RooflineModel(m, hw, dtype)
        assert quantised.kv_dtype == "bfloat16" and quantised.kv_bytes == 2, dtype
        assert quantised.memory().kv_per_token == plain.memory().kv_per_token
        assert RooflineModel(m, hw, dtype, kv_dtype="auto").kv_dtype == "bfloat16"
    assert RooflineModel(m, hw, "float16").kv_dtype == "float16"
    assert RooflineModel(m, hw, "float8", kv_dtype="float8").kv_bytes == 1
    with pytest.raises(DraftsimError, match="weight format"):
        RooflineModel(m, hw, kv_dtype="int4")


def test_kv_dtype_travels_through_the_deployment_and_the_cli(capsys):
    d = dict(target="llama-3.1-8b", hardware="h100-sxm", drafters=("eagle3",))
    plain, fp8 = assemble(Deployment(**d)), assemble(Deployment(**d, kv_dtype="float8"))
    for a, b in zip(plain.models, fp8.models):  # the target and the head's own layer
        assert b.memory().kv_per_token == pytest.approx(a.memory().kv_per_token / 2)
    with pytest.raises(DraftsimError, match="bfloat16 and FP8 KV caches; valid: auto, bfloat16, float16, float8"):
        assemble(Deployment(target="llama-3.1-8b", hardware="h100-sxm", cost_model="operators", kv_dtype="int8"))
    base = ["cost", "--json", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--context", "4096"]
    kv = [json.loads(run(capsys, *base, *extra)[1])["kv_cache"] for extra in ([], ["--kv-dtype", "fp8"])]
    assert kv[0] == {"dtype": "bfloat16", "bytes_per_token_per_device": 131072.0}
    assert kv[1] == {"dtype": "float8", "bytes_per_token_per_device": 65536.0}
    status, out, _ = run(capsys, "cost", *base[2:], "--kv-dtype", "fp8")
    assert status == 0 and "float8, 65,536 bytes per cached token" in out


def test_int4_weights_read_half_a_byte_and_multiply_at_the_bfloat16_rate():
    m, hw = CAT.model("llama-3.1-70b"), CAT.hardware_spec("h100-sxm")
    bf16 = RooflineModel(m, hw, "bfloat16", check_memory=False)
    int4 = RooflineModel(m, hw, "int4")  # fits one 80 GB device; bfloat16 does not
    with pytest.raises(DraftsimError, match="does not fit"):
        RooflineModel(m, hw, "bfloat16")
    embed = m.vocab * m.hidden * 2
    assert int4.weight_bytes_per_device() == pytest.approx((m.params - embed) * 0.5 + embed * 2)
    # batch-1 decoding reads the weights: about a quarter of bfloat16's time
    assert float(int4.shape_time(1, 1, 512)) < 0.3 * float(bf16.shape_time(1, 1, 512))
    # a long prefill is compute-bound: at the bfloat16 rate whatever the weights' format
    assert float(int4.shape_time(1, 8192, 0)) == pytest.approx(float(bf16.shape_time(1, 8192, 0)), rel=0.02)
    assert int4.peak == hw.peak("bfloat16")


# -- EAGLE-3's draft vocabulary -------------------------------------------------------------------

def test_every_per_target_draft_vocabulary_is_cited_and_names_a_catalog_target():
    table = FACTS["eagle3"]["draft_vocab_by_target"]
    assert EAGLE3_DRAFT_VOCAB_BY_TARGET
    for name, vocab in EAGLE3_DRAFT_VOCAB_BY_TARGET.items():
        src = table[name]["source"]
        assert src["repo"] and src["path"] and str(vocab) in src["what"]
        assert vocab <= CAT.model(name).vocab


def test_eagle3_takes_the_targets_published_head_else_says_it_has_none():
    hw = CAT.hardware_spec("h100-sxm")
    assert eagle3_draft_vocab(CAT.model("llama-3.3-70b"))[1] == "the published head's for llama-3.3-70b"
    assert eagle3_draft_vocab(CAT.model("qwen2.5-7b")) == (32000, "no head published for qwen2.5-7b: Llama-3.1-8B's")
    assert eagle3_draft_vocab(CAT.model("qwen3-8b"), (("draft_vocab", 151936),)) == (151936, "given")
    named = head_cost(parse_drafter("eagle3"), CAT.model("qwen3-32b"), hw, "bfloat16", 1)
    assert "draft vocabulary 32,000: the published head's for qwen3-32b" in named.name
    given = head_cost(parse_drafter("eagle3:draft_vocab=151936"), CAT.model("qwen3-32b"), hw, "bfloat16", 1)
    assert given.memory().weights > named.memory().weights  # a full-vocabulary LM head is larger


# -- acceptance ---------------------------------------------------------------------------------

def _sim(**kw) -> SimulateConfig:
    return SimulateConfig(policy=kw.pop("policy", "fixed:k=3"), cost=[0.1], **kw)


def test_another_targets_entry_is_refused_unless_borrowed_and_then_said():
    entry = "eagle3-llama-3.1-8b-sharegpt-specdecode-bench-traces"
    with pytest.raises(DraftsimError, match="not on the target 'llama-3.3-70b'.*add --borrow"):
        build_process(_sim(acceptance=entry), 2, 3, "llama-3.3-70b")
    config = _sim(acceptance=entry, borrow=True)
    process = build_process(config, 2, 3, "llama-3.3-70b")
    assert process.alphas.size == 3
    assert acceptance_warnings(config, "llama-3.3-70b") == [
        f"acceptance borrowed: entry {entry!r} was measured on llama-3.1-8b, not on llama-3.3-70b"]
    assert acceptance_warnings(_sim(acceptance=entry), "llama-3.1-8b") == []  # its own target: nothing to say


def test_an_entry_of_another_method_is_refused_naming_both_unless_borrowed():
    entry = "eagle3-llama-3.1-8b-vllm-issue20780"
    with pytest.raises(DraftsimError, match="measured with drafting method eagle3, the drafter here is eagle;"):
        check_use(entry, "llama-3.1-8b", "eagle")
    with pytest.raises(DraftsimError, match="eagle3, the drafter here is eagle"):
        build_process(_sim(acceptance=entry, drafter_model=["eagle"]), 2, 3, "llama-3.1-8b")
    assert check_use(entry, "llama-3.1-8b", "eagle", borrow=True) == [
        f"acceptance borrowed: entry {entry!r} was measured with eagle3, the drafter here is eagle"]
    assert check_use(entry, "llama-3.1-8b", "eagle3") == []
    with pytest.raises(DraftsimError, match="--borrow applies to --acceptance"):
        build_process(_sim(alpha=0.7, borrow=True), 2, 3)


def test_a_published_range_is_a_bracket_with_both_ends():
    """DeepSeek-V3 report: the second token's acceptance 'ranges between 85% and 90%'."""
    with pytest.raises(DraftsimError, match="mtp-deepseek-v3-report@low and mtp-deepseek-v3-report@high"):
        acceptance_entry("mtp-deepseek-v3-report").conditional(1)
    low, high = (acceptance_entry(f"mtp-deepseek-v3-report@{end}") for end in ("low", "high"))
    assert low.conditional(1) == pytest.approx([0.85]) and high.conditional(1) == pytest.approx([0.9])
    assert low.usable_lengths == (1,)
    config = _sim(policy="fixed:k=1", acceptance="mtp-deepseek-v3-report@high", drafter_model=["mtp"])
    assert build_process(config, 2, 1, "deepseek-v3").alphas == pytest.approx([0.9])
    assert acceptance_warnings(config, "deepseek-v3") == [
        "acceptance bracket: the high end of the published range (k=1: 0.85..0.9); mtp-deepseek-v3-report@low is the other end"]
    with pytest.raises(DraftsimError, match="reports no range"):
        acceptance_entry("eagle3-llama-3.1-8b-vllm-issue20780@low")
    with pytest.raises(DraftsimError, match="low or high"):
        acceptance_entry("mtp-deepseek-v3-report").end("middle")


def test_an_ngram_entry_that_counted_its_unmatched_steps_sets_the_match_share():
    """vLLM PR 24344: 821 of 1814 steps drafted nothing (no n-gram match)."""
    config = _sim(policy="fixed:k=5", acceptance="ngram-blazedit-vllm-pr24344", borrow=True)
    assert build_process(config, 2, 5, "llama-3.1-8b").match == pytest.approx(1 - 0.4526)
    given = _sim(policy="fixed:k=5", acceptance="ngram-blazedit-vllm-pr24344", borrow=True, match=0.5)
    assert build_process(given, 2, 5, "llama-3.1-8b").match == 0.5  # the user's --match wins
    # the source counted them at k=5 only: another k keeps the default
    other = _sim(policy="fixed:k=4", acceptance="ngram-blazedit-vllm-pr24344", borrow=True)
    assert build_process(other, 2, 4, "llama-3.1-8b").match == 1.0


def test_the_70b_class_eagle3_chain_entry():
    e = acceptance_entry("eagle3-llama-3.3-70b-trtllm-pr5146-k3")
    assert (e.method, e.target, e.draft, e.usable_lengths) == ("eagle3", "llama-3.3-70b", "chain", (3,))
    assert e.mean_length(3) == pytest.approx(1.83)
    assert "1.83 / 4" in e.quote and "TensorRT-LLM/pull/5146" in e.source
    assert check_use(e, "meta-llama/Llama-3.3-70B-Instruct", "eagle3") == []


def test_borrowing_on_the_command_line_warns_on_stderr_and_in_json(capsys):
    args = ["simulate", "--policy", "fixed:k=3", "--target", "llama-3.3-70b", "--hardware", "h100-sxm", "--tp", "4",
            "--drafter-model", "eagle3", "--tokens", "2000", "--acceptance", "eagle3-llama-3.1-8b-sharegpt-specdecode-bench-traces"]
    status, _, err = run(capsys, *args)
    assert status == 2 and "add --borrow" in err and err.count("\n") == 1
    status, out, err = run(capsys, *args, "--borrow", "--json")
    assert status == 0
    line = "measured on llama-3.1-8b, not on llama-3.3-70b"
    assert f"warning: acceptance borrowed: entry 'eagle3-llama-3.1-8b-sharegpt-specdecode-bench-traces' was {line}" in err
    assert any(line in w for w in json.loads(out)["warnings"])
    status, out, err = run(capsys, *args, "--borrow")
    assert status == 0 and line in err


def test_the_capacity_front_door_checks_the_entry_against_every_method_and_borrows_knowingly(capsys, tmp_path):
    args = ["capacity", "--target", "llama-3.3-70b", "--hardware", "h100-sxm", "--tp", "4", "--slo", "ttft:p99=2s",
            "--method", "eagle3:k=3", "--method", "ngram:k=3", "--acceptance", "eagle3-llama-3.3-70b-trtllm-pr5146-k3", "--check"]
    status, _, err = run(capsys, *args, "--out", str(tmp_path / "a"))
    assert status == 2 and "measured with drafting method eagle3, the drafter here is ngram" in err
    # every configuration is checked, plain decoding's (which never asks the entry) included
    status, out, err = run(capsys, *args, "--borrow", "--json", "--out", str(tmp_path / "b"))
    assert status == 0, err
    line = "acceptance borrowed: entry 'eagle3-llama-3.3-70b-trtllm-pr5146-k3' was measured with eagle3, the drafter here is ngram"
    assert json.loads(out)["warnings"] == [line] and f"warning: {line}" in err


def test_the_serve_sim_report_says_what_was_borrowed(capsys, tmp_path):
    folder = tmp_path / "report"
    status, _, err = run(capsys, "serve-sim", "--hardware", "h100-sxm", "--target", "llama-3.3-70b", "--tp", "4", "--drafter-model",
                         "eagle3", "--policy", "fixed:k=3", "--acceptance", "eagle3-llama-3.1-8b-sharegpt-specdecode-bench-traces",
                         "--borrow", "--qps", "1", "--requests", "12", "--output-len", "fixed:32", "--replications", "1",
                         "--report", str(folder))
    assert status == 0, err
    md = (folder / "report.md").read_text()
    assert "WARNING: acceptance borrowed" in md and "not on llama-3.3-70b" in md


def test_the_cost_command_says_the_rooflines_terms_on_its_hardware():
    """`draftsim cost` names what the roofline prices a call with: the MBU and MFU, and where the GPU's
    measured tables gave them, its fixed time per kernel and per fused-MoE call; a GPU without tables
    says only its efficiencies."""
    from draftsim.sim.cost.assembly import roofline_terms

    h100, h20 = CAT.hardware_spec("h100-sxm"), CAT.hardware_spec("h20")
    text = roofline_terms(h100)
    assert f"MBU {h100.mbu:.3g}" in text and "GEMM 2.68 us" in text and "derive_affine.py" in text
    assert f"{h100.fused_moe * 1e6:.1f} us per fused-MoE call" in text
    assert roofline_terms(h20) == "roofline terms on h20: MBU 0.7, MFU 0.6"
