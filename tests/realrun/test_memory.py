"""A real model too large for this machine is refused from its known size, before torch allocates
anything (realrun/models.py: check_fits): ``random:NAME`` from the catalog's shape, a checkpoint
folder from its config.json; the weights at the asked dtype plus one sequence's KV cache, against
the memory the device has available. One line naming the model, its bytes and the bytes available;
exit 2."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.realrun import models
from draftsim.realrun.models import KV_TOKENS, check_fits
from draftsim.sim.cost import default_catalog
from draftsim.sim.errors import DraftsimError

CATALOG = default_catalog()
DENSE = sorted(n for n, e in CATALOG.models.items()
               if not e.get("unsupported") and (lambda m: not (m.experts or m.kv_lora_rank) and m.mlp == "gated")(CATALOG.model(n)))
WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2}


def need_of(name: str, dtype: str, kv_tokens: int = KV_TOKENS) -> int:
    spec = CATALOG.model(name)
    return (spec.params + spec.kv_per_token * kv_tokens) * WIDTH[dtype]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(DENSE), st.sampled_from(sorted(WIDTH)), st.integers(0, 2**42), st.integers(1, 2**17))
def test_refused_exactly_when_weights_and_kv_exceed_what_is_available(name, dtype, available, kv_tokens):
    need = need_of(name, dtype, kv_tokens)
    if need > available:
        with pytest.raises(DraftsimError) as err:
            check_fits(f"random:{name}", CATALOG.model(name), "cpu", dtype, available, kv_tokens)
        text = str(err.value)
        assert "\n" not in text and text.startswith(f"random:{name} needs {need:,} bytes") and f"{available:,} bytes available" in text
    else:
        assert check_fits(f"random:{name}", CATALOG.model(name), "cpu", dtype, available, kv_tokens) == need


def test_the_issue_example_is_refused_before_anything_is_allocated(capsys, monkeypatch):
    """``draftsim run --target random:llama-3.1-70b``: 70.6 B parameters, 263 GiB in float32."""
    from draftsim.cli import main

    def no_allocation(*args, **kwargs):
        raise AssertionError("a model was built")

    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(transformers.LlamaForCausalLM, "_from_config", no_allocation)
    monkeypatch.setattr("draftsim.realrun.memory.available_memory", lambda device: 64 * 2**30)
    need = need_of("llama-3.1-70b", "float32")
    for argv in (["run", "--target", "random:llama-3.1-70b", "--device", "cpu"],
                 ["serve", "--target", "random:llama-3.1-70b", "--device", "cpu", "--qps", "1", "--requests", "2"],
                 ["run", "--target", "random:llama-3.1-70b", "--device", "cpu", "--dtype", "bfloat16"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        want = need if "bfloat16" not in argv else need // 2
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"random:llama-3.1-70b needs {want:,} bytes" in err and f"{64 * 2**30:,} bytes available" in err, err


def test_on_this_machine(capsys):
    """The same example against this machine's own memory (skipped on a machine that holds 265 GiB free)."""
    from draftsim.cli import main
    from draftsim.realrun.memory import available_memory

    free = available_memory("cpu")
    if free >= need_of("llama-3.1-70b", "float32"):
        pytest.skip(f"this machine has {free:,} bytes available: the 70B model would be built")
    assert main(["run", "--target", "random:llama-3.1-70b", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "random:llama-3.1-70b needs" in err and "bytes available" in err, err


def test_a_checkpoint_folder_is_sized_from_its_config(tmp_path, monkeypatch):
    """A checkpoint folder (config.json of Llama-3.1-8B's shape, no weights needed to refuse it)."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
           "max_position_embeddings": 131072, "tie_word_embeddings": False}
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr("draftsim.realrun.memory.available_memory", lambda device: 2**30)
    monkeypatch.setattr(models, "pick_device", lambda device: "cpu")
    with pytest.raises(DraftsimError, match=r"ckpt needs [0-9,]+ bytes \(.*8\.\d+ B parameters in float32.*1,073,741,824 bytes available"):
        models.load_model(str(tmp_path / "ckpt"), device="cpu")


def test_the_estimate_is_the_built_model(monkeypatch):
    """The weights check_fits counts are the ones random_model builds (norms left out: < 0.1%)."""
    pytest.importorskip("torch")
    loaded = models.random_model("smollm2-135m", device="cpu", dtype="float32")
    built = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    counted = CATALOG.model("smollm2-135m").params * 4
    assert counted <= built <= counted * 1.001, (counted, built)


def test_a_target_and_its_drafters_are_sized_together_before_any_loads(capsys, monkeypatch):
    """``run --target random:llama-3.1-8b --drafter random:llama-3.1-70b`` built the 8B target (minutes)
    before the drafter was refused; two models that fit one at a time but not together ran into the
    allocator. Both are refused from their known sizes before the first model is built."""
    from draftsim.cli import main

    def no_allocation(*args, **kwargs):
        raise AssertionError("a model was built")

    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(transformers.LlamaForCausalLM, "_from_config", no_allocation)
    one = need_of("llama-3.1-8b", "bfloat16")
    monkeypatch.setattr("draftsim.realrun.memory.available_memory", lambda device: one + one // 2)
    argv = ["run", "--target", "random:llama-3.1-8b", "--dtype", "bfloat16", "--device", "cpu", "--method", "sd"]
    assert main([*argv, "--drafter", "random:llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the models need {2 * one:,} bytes together" in err, err
    assert main([*argv, "--drafter", "controlled:0.8@random:llama-3.1-70b"]) == 2  # the drafter alone does not fit
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "random:llama-3.1-70b needs" in err, err
    assert models.check_all_fit(["random:llama-3.1-8b", "ngram", "smollm2"], "cpu", "bfloat16", available=one) == one
