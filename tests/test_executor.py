"""The real-model executor: sim policies drive tiny HF models; lossless checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from realrun.drafters import MaxGram, NeuralDraft
from realrun.executor import Sampling, generate
from realrun.models import LoadedModel, load_model, tiny_model
from sim import policies as P
from sim.distributions import warp
from sim.errors import DraftsimError


@pytest.fixture(scope="module")
def target():
    return load_model("tiny:1")


@pytest.fixture(scope="module")
def drafters(target):
    return {"tiny2": NeuralDraft(load_model("tiny:2"), "tiny2"), "self": NeuralDraft(load_model("tiny:1"), "self"),
            "maxgram": MaxGram(target.vocab_size)}


PROMPT_TEXT = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
POLICIES = [P.FixedK(1), P.FixedK(4), P.Heuristic(), P.ConfidenceStop(0.5, 6), P.Threshold(0.6, 6)]


def own_greedy(target, prompt, n):
    with torch.inference_mode():
        out = target.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=target.tokenizer.pad_token_id)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
@pytest.mark.parametrize("name", ["tiny2", "self", "maxgram"])
def test_greedy_output_is_the_targets_own(target, drafters, policy, name):
    prompt = target.tokenizer(PROMPT_TEXT)["input_ids"]
    log = generate(target, prompt, 30, policy, drafters[name], stop_at_eos=False)
    assert log.output == own_greedy(target, prompt, 30)
    assert sum(r["accepted"] + 1 for r in log.rounds) >= log.tokens
    if name == "self":  # a drafter identical to the target: every drafted token is accepted
        assert all(r["accepted"] == r["drafted"] for r in log.rounds)
        assert log.target_calls < log.tokens


def test_autoregressive_baseline(target):
    prompt = target.tokenizer("hello")["input_ids"]
    log = generate(target, prompt, 12, stop_at_eos=False)
    assert log.output == own_greedy(target, prompt, 12) and log.target_calls == 12


def test_sampling_keeps_the_target_distribution(target, drafters):
    """Two tokens sampled with temperature 1 and top-k 4 through FixedK(2) speculative steps:
    chi-square against the exact target distribution (16 cells), significance 1e-3, fixed seed."""
    prompt = target.tokenizer("ab")["input_ids"]
    sampling = Sampling(1.0, 4)
    with torch.inference_mode():
        p1 = warp(torch.softmax(target.model(torch.tensor([prompt])).logits[0, -1].double(), -1).numpy(), 1.0, 4)
        exact = {}
        for x in np.flatnonzero(p1 > 0):
            p2 = warp(torch.softmax(target.model(torch.tensor([prompt + [int(x)]])).logits[0, -1].double(), -1).numpy(), 1.0, 4)
            for y in np.flatnonzero(p2 > 0):
                exact[(int(x), int(y))] = p1[x] * p2[y]
    rng = np.random.default_rng(0)
    counts: dict = {}
    n = 3000
    for _ in range(n):
        out = tuple(generate(target, prompt, 2, P.FixedK(2), drafters["tiny2"], sampling, rng=rng, stop_at_eos=False).output)
        counts[out] = counts.get(out, 0) + 1
    assert set(counts) <= set(exact)
    keys = sorted(exact)
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    exp = np.array([exact[k] for k in keys]) * n
    keep = exp >= 5
    obs = np.append(obs[keep], obs[~keep].sum())
    exp = np.append(exp[keep], exp[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3


def test_bad_input(target, drafters):
    prompt = target.tokenizer("x")["input_ids"]
    other = tiny_model(3)
    other.model.resize_token_embeddings(50)
    with pytest.raises(DraftsimError, match="different vocabularies"):
        generate(target, prompt, 4, P.FixedK(2), NeuralDraft(other, "other"))
    with pytest.raises(DraftsimError, match="exceeds the target's context"):
        generate(target, prompt * 1100, 4)
    with pytest.raises(DraftsimError, match="needs a drafter"):
        generate(target, prompt, 4, P.FixedK(2))
    with pytest.raises(DraftsimError, match="sampling needs rng"):
        generate(target, prompt, 4, P.FixedK(2), drafters["tiny2"], Sampling(1.0))
    with pytest.raises(DraftsimError, match="cascade executor"):
        generate(target, prompt, 4, P.VerticalCascade([[0, 1, 0], [0, 0, 2], [0, 0, 0]]), drafters["tiny2"])


def test_run_cli_on_tiny_models(capsys):
    import json

    from draftsim.cli import main

    assert main(["run", "--model", "tiny:1", "--method", "sd", "--drafter", "tiny:1", "--policy", "fixed:k=3",
                 "--prompts", "arithmetic", "--n", "2", "--max-new-tokens", "12", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"]["accepted"] == data["counts"]["drafted"]  # the drafter is the target itself
    assert data["mean_accepted_length"] > 1.5
    assert main(["run", "--model", "tiny:1", "--method", "sd", "--drafter", "maxgram", "--policy", "warp:k=2"]) == 2
    assert "unknown policy" in capsys.readouterr().err
