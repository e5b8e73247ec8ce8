"""sim.cost.catalog: model and hardware records, their file entries and the catalogs.

The records' derived sizes against published numbers, every shipped entry's round trip
through its file form, and the records' checks; at the end, the shipped catalog's
completeness and citations, unknown names, Hugging Face configs and a user catalog's round trip.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from draftsim.sim.cost import (
    HardwareSpec,
    ModelSpec,
    default_catalog,
    load_catalog,
    model_from_hf_config,
)
from draftsim.sim.cost.catalog import (
    dtype_bytes,
    hardware_from_entry,
    hardware_to_entry,
    model_from_entry,
    model_to_entry,
    write_catalog,
)
from draftsim.sim.errors import DraftsimError

CAT = default_catalog()
MODELS = sorted(k for k, v in CAT.models.items() if not v.get("unsupported"))


@pytest.mark.parametrize("name, params", [
    ("llama-2-7b", 6.74e9),  # Touvron et al. 2023, Table 1 (norms neglected here: within 0.1%)
    ("llama-2-70b", 68.98e9),
    ("llama-3-8b", 8.03e9),
    ("smollm2-135m", 134.5e6),  # tied embeddings
])
def test_parameter_counts_match_the_published_sizes(name, params):
    assert CAT.model(name).params == pytest.approx(params, rel=2e-3)


def test_kv_elements_per_token():
    assert CAT.model("llama-2-7b").kv_per_token == 2 * 32 * 32 * 128
    assert CAT.model("llama-3-8b").kv_per_token == 2 * 32 * 8 * 128  # GQA: 8 KV heads
    assert CAT.model("llama-2-7b").architecture == "32x4096/11008 h32/32x128 v32000"


@pytest.mark.parametrize("name", MODELS)
def test_model_entries_round_trip(name):
    m = CAT.model(name)
    assert model_from_entry(name, model_to_entry(m)) == m


@pytest.mark.parametrize("name", sorted(CAT.hardware))
def test_hardware_entries_round_trip(name):
    hw = CAT.hardware_spec(name)
    back = hardware_from_entry(name, hardware_to_entry(hw))
    for f in dataclasses.fields(HardwareSpec):
        a, b = getattr(hw, f.name), getattr(back, f.name)
        if isinstance(a, float):
            assert b == pytest.approx(a, rel=1e-12)
        elif isinstance(a, dict) and f.name == "peak_flops":
            assert b == pytest.approx(a, rel=1e-12)
        else:
            assert a == b, f.name


def test_aliases_and_case_resolve_to_the_same_record():
    first_alias = next(iter(CAT.aliases.items()), None)
    assert CAT.model("LLAMA-2-7B") == CAT.model("llama-2-7b")
    if first_alias:
        alias, name = first_alias
        getter = CAT.model if name in CAT.models else CAT.hardware_spec
        assert getter(alias) == getter(name)


def model(**kw) -> ModelSpec:
    base = dict(name="m", layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=100)
    return ModelSpec(**{**base, **kw})


@pytest.mark.parametrize("kw, match", [
    (dict(layers=0), "layers must be an integer >= 1; got 0"),
    (dict(heads=True), "heads must be an integer"),
    (dict(kv_heads=3), "heads \\(4\\) must be a multiple of kv_heads \\(3\\)"),
    (dict(mlp="moe"), "mlp must be 'gated' or 'plain'"),
])
def test_model_record_checks(kw, match):
    with pytest.raises(DraftsimError, match=match):
        model(**kw)


def test_plain_mlp_and_tied_embeddings_change_the_count():
    gated, plain, tied = model(), model(mlp="plain"), model(tied_embeddings=True)
    assert gated.params - plain.params == 2 * 64 * 128 and gated.params - tied.params == 100 * 64


def hardware(**kw) -> HardwareSpec:
    return HardwareSpec(**{**dict(name="hw", peak_flops={"bfloat16": 1e12}, memory_bandwidth=1e11, memory=1e10), **kw})


@pytest.mark.parametrize("kw, match", [
    (dict(peak_flops={}), "needs at least one dtype"),
    (dict(peak_flops={"bfloat16": 0}), "must be > 0"),
    (dict(peak_flops={"int4": 1e12}), "unknown dtype 'int4'"),
    (dict(memory=0), "memory must be > 0"),
    (dict(mfu=1.2), "mfu must lie in \\[1e-06, 1\\]"),
    (dict(mfu=1e-9), "mfu must lie in \\[1e-06, 1\\]; got 1e-09"),
    (dict(overhead=-1e-6), "overhead must be >= 0"),
])
def test_hardware_record_checks(kw, match):
    with pytest.raises(DraftsimError, match=match):
        hardware(**kw)


def test_peak_and_dtypes():
    assert hardware().peak("bfloat16") == 1e12
    with pytest.raises(DraftsimError, match="lists no peak FLOP/s for float32; it lists bfloat16"):
        hardware().peak("float32")
    assert [dtype_bytes(d) for d in ("float32", "bfloat16", "float16", "float8", "int8")] == [4, 2, 2, 1, 1]


def test_unsupported_and_malformed_entries_are_refused():
    with pytest.raises(DraftsimError, match="not supported by the roofline"):
        CAT.model("flan-t5-small")
    entry = model_to_entry(CAT.model("llama-2-7b"))
    with pytest.raises(DraftsimError, match="unknown field\\(s\\) expertz"):
        model_from_entry("x", {**entry, "expertz": 8})
    with pytest.raises(DraftsimError, match="a mixture of experts needs 1 <= experts_per_token <= experts"):
        model_from_entry("x", {**entry, "experts": 8})  # experts without how many run per token
    with pytest.raises(DraftsimError, match="missing field\\(s\\) source"):
        model_from_entry("x", {k: v for k, v in entry.items() if k != "source"})
    hw = hardware_to_entry(CAT.hardware_spec("h100-sxm"))
    with pytest.raises(DraftsimError, match="memory_gb must be a number; got 'lots'"):
        hardware_from_entry("x", {**hw, "memory_gb": "lots"})


@pytest.mark.parametrize("field, value, message", [
    ("aliases", 5, "aliases must be a list of names; got 5"),
    ("max_context", "lots", "max_context must be an integer >= 0; got 'lots'"),
    ("heads", "32", "heads must be an integer >= 1; got '32'"),
])
def test_hand_edited_model_entries_are_refused_with_one_line(tmp_path, field, value, message):
    from draftsim.sim.cost.catalog import load_catalog

    entry = {"layers": 4, "hidden": 64, "intermediate": 128, "heads": 4, "vocab": 100, "source": "hand", field: value}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"schema": "draftsim.models", "version": 1, "models": {"m": entry}}))
    with pytest.raises(DraftsimError, match=re.escape(message)):
        load_catalog(path).model("m")


def test_a_hardware_entry_with_infinite_bandwidth_is_refused(tmp_path):
    from draftsim.sim.cost.catalog import load_catalog

    entry = json.loads((Path(__file__).resolve().parents[3] / "sim" / "data" / "hardware.json").read_text())["hardware"]["h100-sxm"]
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"schema": "draftsim.hardware", "version": 1, "hardware": {"hx": {**entry, "memory_bandwidth_gbs": 1e400}}}))
    with pytest.raises(DraftsimError, match=re.escape("memory_bandwidth must be > 0 (and finite); got inf")):
        load_catalog(path).hardware_spec("hx")


# -- the shipped catalog, Hugging Face configs, user catalogs ---------------------------------------

def test_shipped_catalog_is_complete_and_cited():
    CAT.validate()
    for name in ["h100-sxm", "h200", "a100-80g", "a100-40g", "l4", "a10g", "rtx-4090", "local-cpu"]:
        assert CAT.hardware[name]["source"]
    for name in ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-0.5b",
                 "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b", "gemma-2-2b", "gemma-2-9b",
                 "gemma-2-27b", "smollm2-135m", "smollm2-360m", "smollm2-1.7b", "mistral-7b"]:
        assert "huggingface.co" in CAT.model(name).source
    # parameter counts as the model cards state them
    assert CAT.model("llama-2-7b").params == pytest.approx(6.74e9, rel=0.01)
    assert CAT.model("llama-3-70b").params == pytest.approx(70.6e9, rel=0.01)
    assert CAT.model("qwen2.5-7b").params == pytest.approx(7.6e9, rel=0.02)
    assert CAT.model("smollm2").params == pytest.approx(134.5e6, rel=0.01)  # the embedded model: 134,515,008 weights
    with pytest.raises(DraftsimError, match="encoder-decoder"):
        CAT.model("flan-t5-xxl")


def test_unknown_names_list_the_known_ones():
    with pytest.raises(DraftsimError, match=r"unknown model 'llama-9'; did you mean llama-3-8b or .* known: .*llama-2-7b"):
        CAT.model("llama-9")
    with pytest.raises(DraftsimError, match=r"unknown hardware 'tpu'; known: .*h100-sxm"):
        CAT.hardware_spec("tpu")


def test_hf_config_read_directly(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
           "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 8192}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    spec = model_from_hf_config(tmp_path / "m")
    assert spec.params == CAT.model("smollm2-135m").params and spec.head_dim == 64
    del cfg["intermediate_size"], cfg["vocab_size"]
    (tmp_path / "bad.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftsimError, match="missing field.*intermediate_size, vocab_size"):
        CAT.model(str(tmp_path / "bad.json"))
    (tmp_path / "t5.json").write_text(json.dumps({"is_encoder_decoder": True, "model_type": "t5"}))
    with pytest.raises(DraftsimError, match="encoder-decoder"):
        model_from_hf_config(tmp_path / "t5.json")


def test_user_catalog_round_trip_and_validation(tmp_path):
    hw = CAT.hardware_spec("l4")
    write_catalog(tmp_path / "hw.json", hardware={"my-l4": hw})
    back = load_catalog(tmp_path / "hw.json").hardware_spec("my-l4")
    assert back.memory_bandwidth == pytest.approx(hw.memory_bandwidth) and back.peak("bfloat16") == pytest.approx(hw.peak("bfloat16"))
    doc = json.loads((tmp_path / "hw.json").read_text())
    del doc["hardware"]["my-l4"]["memory_gb"]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(DraftsimError, match="missing field.*memory_gb"):
        load_catalog(tmp_path / "bad.json")
    doc = {"schema": "draftsim.models", "version": 1, "models": {"m": {"layers": 2, "hidden": 64, "intermediate": 128, "heads": 4,
                                                                          "vocab": 100, "source": "test", "kv_heads": 3}}}
    (tmp_path / "m.json").write_text(json.dumps(doc))
    with pytest.raises(DraftsimError, match="multiple of kv_heads"):
        load_catalog(tmp_path / "m.json")
