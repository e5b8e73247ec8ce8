"""Token trees under a draft-token budget (EAGLE-2's reranking, SGLang's num_draft_tokens)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim import montecarlo
from draftsim.sim.acceptance import Bernoulli
from draftsim.sim.budget_tree import budget_tree
from draftsim.sim.policies import Tree

trees = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 60),
                  st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4))


@settings(max_examples=100, deadline=None)
@given(trees)
def test_the_budget_holds_and_the_kept_nodes_form_the_most_valuable_subtree(case):
    width, depth, budget, alphas = case
    bt = budget_tree(alphas[:width], width, depth, budget)
    full = sum(width**d for d in range(1, depth + 1))
    assert bt.nodes == min(budget, full)
    assert all(bt.per_level[d] <= width**d for d in range(len(bt.per_level)))
    parents = {int(c): n for n in range(len(bt.child)) for c in bt.child[n] if c >= 0}
    assert set(parents) == set(range(1, bt.nodes + 1))  # every kept node hangs under a kept node
    assert all(bt.value[c] <= bt.value[p] + 1e-15 for c, p in parents.items())
    # every path of the full tree: its probability of being accepted; the kept ones are the top values
    pi = bt.rank_probs
    values = sorted((float(np.prod(pi[list(path)])) for d in range(1, depth + 1) for path in itertools.product(range(width), repeat=d)),
                    reverse=True)
    assert sorted(bt.value[1:], reverse=True) == pytest.approx(values[: bt.nodes], abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(trees)
def test_a_budget_as_large_as_the_tree_is_the_full_tree(case):
    width, depth, _, alphas = case
    full = sum(width**d for d in range(1, depth + 1))
    bt = budget_tree(alphas[:width], width, depth, full)
    level = 1 - np.prod(1 - np.array(alphas[:width]))
    assert bt.expected_accepted() == pytest.approx(sum(level**d for d in range(1, depth + 1)), rel=1e-9, abs=1e-12)


@settings(max_examples=20, deadline=None)
@given(trees, st.integers(0, 2**31 - 1))
def test_sampled_rounds_accept_the_expected_tokens(case, seed):
    width, depth, budget, alphas = case
    bt = budget_tree(alphas[:width], width, depth, budget)
    n = 20_000
    got = bt.sample(n, np.random.default_rng(seed))
    assert got.max(initial=0) <= depth
    # exact moments: P(X >= d) is the kept value at depth d (a level's nodes are exclusive)
    at_least = np.bincount(bt.level, weights=bt.value, minlength=len(bt.per_level))[1:]
    d = np.arange(1, len(at_least) + 1)
    mean, second = at_least.sum(), ((2 * d - 1) * at_least).sum()
    assert mean == pytest.approx(bt.expected_accepted())
    se = np.sqrt(max(second - mean**2, 0.0) / n)
    assert abs(got.mean() - mean) <= 5 * se + 1e-12


def test_monte_carlo_rounds_verify_the_budget_and_call_the_drafter_once_per_level():
    policy = Tree(3, 5, max_nodes=20)
    process = Bernoulli(0.7, rank_alphas=[0.6, 0.2, 0.1])
    r = montecarlo.rounds(policy, process, 64, 400, np.random.default_rng(0))
    assert (r.call_tokens[:, 0] == 21).all()  # 20 draft tokens + the root
    bt = budget_tree(process.rank_prob, 3, 5, 20)
    assert (r.calls[:, 1] == np.count_nonzero(bt.per_level[1:])).all()


def test_serving_honours_the_node_cap(capsys):
    common = ["--alpha", "0.7", "--rank-alphas", "0.6,0.2,0.1", "--target", "llama-3.1-8b", "--drafter-model", "qwen2.5-0.5b",
              "--hardware", "h100-sxm", "--requests", "30", "--qps", "2", "--json"]
    status, out, err = run(capsys, "serve-sim", "--policy", "tree:width=3,depth=5,nodes=60", *common)
    assert status == 0, err
    sd = json.loads(out)["spec_decode"]
    assert sd["num_draft_tokens"] == 60 * sd["num_drafts"]
