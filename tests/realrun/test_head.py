"""SpecDec++'s acceptance head: data, training, saving, and driving the threshold policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftsim.realrun.distill import target_corpus
from draftsim.realrun.drafters import NeuralDraft
from draftsim.realrun.executor import generate
from draftsim.realrun.head import AcceptanceHead, HeadData, binary_kl, fingerprint, head_data, load_head, save_head, train_head
from draftsim.realrun.models import load_model
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import Threshold


@pytest.fixture(scope="module")
def models():
    return load_model("tiny:1"), load_model("tiny:2")


def test_head_architecture_has_independent_blocks():
    head = AcceptanceHead(16, 3)
    assert len(head.blocks) == 3
    assert head.blocks[0].up.weight.data_ptr() != head.blocks[1].up.weight.data_ptr()
    n = sum(p.numel() for p in head.parameters())
    assert n == 3 * 2 * (16 * 16 + 16) + 16 + 1  # D blocks of two linears, and the output layer: D + 1 layers
    assert AcceptanceHead(16, 0)(torch.zeros(4, 16)).shape == (4,)


def test_training_learns_a_predictable_acceptance():
    """Soft labels that depend on the features: the trained head beats the best constant."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 8)).astype(np.float32)
    y = 1 / (1 + np.exp(-(2 * X[:, 0] - X[:, 1])))
    head, history = train_head(HeadData(X[:3000], y[:3000]), depth=2, epochs=15, seed=0)
    assert history[-1] < history[0]
    pred = head.predict(torch.from_numpy(X[3000:]))
    assert binary_kl(y[3000:], pred) < 0.5 * binary_kl(y[3000:], np.full(1000, y[:3000].mean()))
    # w_rej > 1 weighs rejections more: predictions go down
    heavy, _ = train_head(HeadData(X[:3000], y[:3000]), depth=2, w_rej=6.0, epochs=15, seed=0)
    assert heavy.predict(torch.from_numpy(X[3000:])).mean() < pred.mean()


def test_head_data_labels_and_mixing(models):
    target, draft = models
    corpus = target_corpus(target, "train", 2, 24)
    rng = np.random.default_rng(0)
    all_draft = head_data(target, draft, corpus, 0.0, rng)
    mixed = head_data(target, draft, corpus, 0.7, np.random.default_rng(0))
    total = sum(len(ids) - start for ids, start in corpus)
    assert len(all_draft) == total and 0.1 * total < len(mixed) < 0.5 * total  # loss only on draft positions
    assert all_draft.features.shape[1] == draft.model.config.hidden_size
    assert ((all_draft.labels >= 0) & (all_draft.labels <= 1)).all()
    with pytest.raises(DraftsimError, match="no draft positions"):
        head_data(target, draft, corpus, 1.0, rng)
    with pytest.raises(DraftsimError, match="corpus of target responses is empty"):
        head_data(target, draft, [], 0.5, rng)


def test_save_load_and_drive_the_threshold_policy(models, tmp_path):
    target, draft = models
    data = head_data(target, draft, target_corpus(target, "train", 2, 24), 0.5, np.random.default_rng(0))
    head, _ = train_head(data, depth=1, epochs=3)
    save_head(tmp_path / "h", head, draft, {"w_rej": 1.0})
    loaded = load_head(tmp_path / "h", draft)
    x = torch.from_numpy(data.features[:5])
    assert np.allclose(loaded.predict(x), head.predict(x))
    with pytest.raises(DraftsimError, match="trained for draft model"):
        load_head(tmp_path / "h", load_model("tiny:3"))
    with pytest.raises(DraftsimError, match="no acceptance head"):
        load_head(tmp_path / "missing", draft)
    assert fingerprint(draft) != fingerprint(target)
    prompt = target.tokenizer("def add(a, b):\n    return a + b\n\ndef add(a, b):")["input_ids"]
    with torch.inference_mode():
        own = target.model.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False,
                                    pad_token_id=target.tokenizer.pad_token_id)[0, len(prompt):].tolist()
    for h in (0.0, 0.5, 1.0):
        log = generate(target, prompt, 30, Threshold(h, k_max=6), NeuralDraft(draft, "d", head=loaded), stop_at_eos=False)
        assert log.output == own  # the head changes when drafting stops, never the text
        drafted = [r.drafted for r in log.rounds if r.start + 7 <= 30]  # away from the end of the text
        if h == 0.0:
            assert max(drafted) == 1  # 1 − p̂ > 0 after the first token
        if h == 1.0:
            assert min(drafted) == 6  # never above 1: k_max


def test_train_head_cli_and_run_with_head(tmp_path, capsys):
    import json

    from draftsim.cli import main

    assert main(["train-head", "--model", "tiny:1", "--drafter", "tiny:2", "--out", str(tmp_path / "h"), "--prompts-per-set", "2",
                 "--max-new-tokens", "16", "--epochs", "3", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["train_examples"] > 0 and info["binary_kl"] >= 0
    assert main(["run", "--model", "tiny:1", "--drafter", "tiny:2", "--policy", "threshold:h=0.6,kmax=5", "--head", str(tmp_path / "h"),
                 "--n", "2", "--max-new-tokens", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["quality"]["identical_to_target"] == 1.0 and out["sim_check"]["counts_equal"]
    assert main(["run", "--model", "tiny:1", "--drafter", "tiny:2", "--policy", "fixed:k=3", "--head", str(tmp_path / "h")]) == 2
    assert "threshold policy" in capsys.readouterr().err
    assert main(["train-head", "--model", "tiny:1", "--drafter", "maxgram", "--out", str(tmp_path / "x")]) == 2
    assert "not a neural model" in capsys.readouterr().err
