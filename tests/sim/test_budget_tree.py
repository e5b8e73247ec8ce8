"""Token trees under a draft-token budget (EAGLE-2's reranking, SGLang's num_draft_tokens)."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim import montecarlo
from draftsim.sim.acceptance import Bernoulli
from draftsim.sim.budget_tree import budget_tree, static_tree, tree_choices
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
    # 5 standard errors, plus three samples' worth: where a miss is rare (P ~ 1e-6, 0.025 expected in
    # n draws) one occurrence moves the mean by depth / n, far beyond 5 normal standard errors
    assert abs(got.mean() - mean) <= 5 * se + 3 * depth / n + 1e-12


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


# --- static trees (Medusa's medusa_choices, EAGLE-1's tree_choices) -------------------------------

paths = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=25)


def closed(raw):
    """The paths with every prefix added (a valid tree), each once."""
    out = {tuple(p[:i]) for p in raw for i in range(1, len(p) + 1)}
    return sorted(out, key=lambda q: (len(q), q))


@settings(max_examples=100, deadline=None)
@given(paths, st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4))
def test_a_static_tree_accepts_what_enumerating_the_targets_ranks_gives(raw, alphas):
    """Exact: enumerate the target's token rank at every level (rank r with π_r, none with the
    rest): the accepted draft tokens are the depth of the deepest tree node along those ranks."""
    choices = closed(raw)
    tree = static_tree(alphas, choices)
    depth = max(len(c) for c in choices)
    width = max(max(c) for c in choices) + 1
    pi = np.asarray(alphas[:width]) * np.concatenate([[1.0], np.cumprod(1 - np.asarray(alphas[:width]))[:-1]])
    outcomes = list(range(width)) + [None]
    prob = list(pi) + [1 - pi.sum()]
    expected = 0.0
    have = set(choices)
    for ranks in itertools.product(range(len(outcomes)), repeat=depth):
        p = float(np.prod([prob[r] for r in ranks]))
        accepted = 0
        while accepted < depth and outcomes[ranks[accepted]] is not None and tuple(outcomes[r] for r in ranks[: accepted + 1]) in have:
            accepted += 1
        expected += p * accepted
    assert tree.nodes == len(choices)
    assert tree.expected_accepted() == pytest.approx(expected, abs=1e-12)
    assert list(tree.per_level[1:]) == [sum(len(c) == d for c in choices) for d in range(1, depth + 1)]


def test_named_static_trees_run_in_monte_carlo_and_serving(capsys):
    medusa, eagle = Tree(choices=tree_choices("medusa-63")), Tree(choices=tree_choices("eagle-25"))
    assert (medusa.nodes, medusa.depth, medusa.width) == (63, 4, 10) and (eagle.nodes, eagle.depth) == (25, 5)
    process = Bernoulli(0.7, rank_alphas=[0.6, 0.2, 0.1, 0.05])
    r = montecarlo.rounds(eagle, process, 64, 2000, np.random.default_rng(1))
    assert (r.call_tokens[:, 0] == 26).all()  # 25 draft tokens + the root, verified every round
    exact = static_tree(process.rank_prob, eagle.choices).expected_accepted()
    mean = (r.emitted - 1).mean()
    assert abs(mean - exact) <= 5 * (r.emitted - 1).std() / np.sqrt(len(r.emitted))
    common = ["--alpha", "0.7", "--rank-alphas", "0.6,0.2,0.1", "--target", "llama-3.1-8b", "--drafter-model", "medusa",
              "--hardware", "h100-sxm", "--requests", "20", "--qps", "2", "--json"]
    status, out, err = run(capsys, "serve-sim", "--policy", "tree:choices=medusa-63", *common)
    assert status == 0, err
    sd = json.loads(out)["spec_decode"]
    assert sd["num_draft_tokens"] == 63 * sd["num_drafts"]


@pytest.mark.parametrize("spec, message", [
    ("tree:choices=medusa-99", "neither a named tree (medusa-63, eagle-25)"),
    ("tree:choices=medusa-63,width=3", "takes its width, depth and nodes from its paths"),
    ("tree:depth=3", "needs width and depth"),
])
def test_bad_static_trees(spec, message):
    from draftsim.sim.errors import DraftsimError
    from draftsim.sim.policies import parse_policy

    with pytest.raises(DraftsimError, match=re.escape(message)):
        parse_policy(spec)


@pytest.mark.parametrize("raw, message", [
    ([[0], [1, 0]], r"path \[1, 0\] has no parent \[1\]"),
    ([[0], [0]], "listed twice"),
    ([[0], []], "non-empty list of ranks"),
    ({"a": 1}, "a list of 1 to 4096 rank paths"),
])
def test_bad_choice_files(tmp_path, raw, message):
    from draftsim.sim.errors import DraftsimError

    f = tmp_path / "c.json"
    f.write_text(json.dumps(raw))
    with pytest.raises(DraftsimError, match=message):
        tree_choices(str(f))
