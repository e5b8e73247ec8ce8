"""Token trees and graphs on real (tiny) models: tree attention, merging, greedy equality,
the exact distribution under sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from toy import chi_square_pvalue

from draftsim.realrun.drafters import NeuralDraft
from draftsim.realrun.executor import Sampling
from draftsim.realrun.kvcache import CachedLM
from draftsim.realrun.models import load_model
from draftsim.realrun.trees import Graph, TreeForward, TreeStats, generate_tree
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import Tree, parse_policy

PROMPT_TEXT = "def add(a, b):\n    return a + b\n\ndef add(a, b):"


@pytest.fixture(scope="module")
def target():
    return load_model("tiny:1")


@pytest.fixture(scope="module")
def drafters():
    return {"tiny2": NeuralDraft(load_model("tiny:2"), "tiny2"), "self": NeuralDraft(load_model("tiny:1"), "self")}


def own_greedy(model, prompt, n):
    with torch.inference_mode():
        out = model.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=model.tokenizer.pad_token_id)
    return out[0, len(prompt):].tolist()


def test_tree_attention_matches_separate_forwards(target):
    """Every node's logits under the tree mask equal a plain forward over context + its path."""
    prompt = target.tokenizer("hello wor")["input_ids"]
    tokens, parents = [5, 9, 7, 11, 5], [-1, -1, 0, 0, 1]
    depth = [1, 1, 2, 2, 2]
    lm = CachedLM(target)
    lm.logits(prompt[:4], 1)  # a partly filled cache, as mid-generation
    tf = TreeForward(lm)
    rows = tf.start(prompt, [(i, t, p, d) for i, (t, p, d) in enumerate(zip(tokens, parents, depth))])
    with torch.inference_mode():
        for i in range(-1, len(tokens)):
            path, a = [], i
            while a >= 0:
                path.insert(0, tokens[a])
                a = parents[a]
            plain = target.model(torch.tensor([prompt + path])).logits[0, -1]
            assert torch.allclose(rows[i + 1], plain, atol=1e-4), i
    # The cache stays usable: an ordinary call after the tree rolls the node slots back.
    after = lm.logits(prompt + [3], 1)[0]
    with torch.inference_mode():
        assert torch.allclose(after, target.model(torch.tensor([prompt + [3]])).logits[0, -1], atol=1e-4)


def test_unmerge_copies_subtrees():
    g = Graph()
    a = g.add(1, -1, 0.5)
    b = g.add(2, -1, 0.4)
    g.add(3, a, 0.9)
    g.add(4, a, 0.1)
    g.merged[b] = a  # b reuses a's successors
    tree, origin, copied = g.unmerge(depth=3)
    assert tree.tokens.tolist() == [1, 3, 4, 2, 3, 4]
    assert tree.parents.tolist() == [-1, 0, 0, -1, 3, 3]
    assert origin == [0, 2, 3, 1, 2, 3] and copied == [False, False, False, False, True, True]
    assert g.unmerge(depth=1)[0].size == 2  # cut at depth


POLICIES = [Tree(1, 4), Tree(2, 3), Tree(3, 3, merge=2), Tree(2, 4, theta_prob=0.05, theta_sib=0.3, merge=1),
            Tree(3, 4, theta_exit=0.5), Tree(4, 3, max_nodes=10)]


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
@pytest.mark.parametrize("name", ["tiny2", "self"])
def test_greedy_output_is_the_targets_own(target, drafters, policy, name):
    prompt = target.tokenizer(PROMPT_TEXT)["input_ids"]
    st = TreeStats()
    log = generate_tree(target, prompt, 30, policy, drafters[name], stop_at_eos=False, stats=st)
    assert log.output == own_greedy(target, prompt, 30)
    assert st.verified_nodes >= st.drafted_nodes - st.merged_nodes and st.accepted <= st.verified_nodes
    assert all(r.drafted <= policy.max_nodes or policy.merge for r in log.rounds)
    if name == "self" and policy.theta_exit == 0 and policy.max_nodes >= policy.nodes:
        # The drafter is the target: its best candidate is always right, down to full depth.
        assert all(r.accepted == policy.depth for r in log.rounds[:-1])


def _row(model, ids):
    from draftsim.sim.distributions import warp

    with torch.inference_mode():
        return warp(torch.softmax(model.model(torch.tensor([ids])).logits[0, -1].double(), -1).numpy(), 1.0, 4)


def _exact(target, prompt, n):
    """Exact distribution of n tokens sampled from the target (temperature 1, top-k 4)."""
    if n == 0:
        return {(): 1.0}
    out = {}
    for head, ph in _exact(target, prompt, n - 1).items():
        row = _row(target, prompt + list(head))
        for y in np.flatnonzero(row > 0):
            out[head + (int(y),)] = ph * row[y]
    return out


@pytest.mark.parametrize("policy,n_tokens,text", [(Tree(2, 2), 2, "ab"), (Tree(4, 3, merge=1), 3, "aaaa")], ids=["tree", "graph"])
def test_sampling_keeps_the_target_distribution(target, drafters, policy, n_tokens, text):
    """Tokens at temperature 1, top-k 4, through tree / graph rounds (candidates without
    replacement; in the graph, merged nodes reuse other nodes' candidates, which the third
    token's verification meets): chi-square against the exact target distribution,
    significance 1e-3, fixed seed."""
    prompt = target.tokenizer(text)["input_ids"]
    exact = _exact(target, prompt, n_tokens)
    rng = np.random.default_rng(0)
    counts: dict = {}
    n = 1500
    st = TreeStats()
    for i in range(n):
        d = drafters["tiny2"] if i % 3 == 2 else drafters["self"]  # self: deep paths, through the copies
        out = tuple(generate_tree(target, prompt, n_tokens, policy, d, Sampling(1.0, 4), rng, stop_at_eos=False, stats=st).output)
        counts[out] = counts.get(out, 0) + 1
    assert set(counts) <= set(exact)
    if policy.merge:
        assert st.rounds_using_merged > 100, st  # the copies were walked through
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_bad_input(target, drafters):
    prompt = target.tokenizer("x")["input_ids"]
    from draftsim.realrun.drafters import MaxGram
    from draftsim.sim.policies import FixedK

    with pytest.raises(DraftsimError, match="neural drafter"):
        generate_tree(target, prompt, 4, Tree(2, 2), MaxGram(target.vocab_size))
    with pytest.raises(DraftsimError, match="not a tree policy"):
        generate_tree(target, prompt, 4, FixedK(2), drafters["tiny2"])
    for spec, message in (("tree:width=0,depth=2", "width"), ("tree:width=2,depth=2,prob=-0.1", "theta_prob"),
                          ("tree:width=2,depth=2,sib=1.5", "theta_sib"), ("tree:width=2,depth=2,merge=-1", "merge"),
                          ("tree:width=2,depth=2,nodes=0", "max_nodes")):
        with pytest.raises(DraftsimError, match=message):
            parse_policy(spec)
