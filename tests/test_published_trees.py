"""The published suite's tree points: a tree's published mean acceptance length pins one per-rank
acceptance (benchmarks/published/reproduce.py, ``tree_acceptance``)."""

from __future__ import annotations

import pytest
from benchscript import load_script

from draftsim.sim.budget_tree import budget_tree


@pytest.fixture(scope="module")
def mod():
    return load_script("benchmarks/published/reproduce.py")


@pytest.mark.parametrize("policy, width, depth, nodes, length", [
    ("tree:width=8,depth=8,nodes=63", 8, 8, 63, 5.88),  # SGLang PR 4716's EAGLE-3 tree (64 draft tokens: the root and 63 nodes)
    ("tree:width=4,depth=5,nodes=7", 4, 5, 7, 3.1),  # SGLang's defaults (num_draft_tokens 8: the root and 7 nodes)
    ("tree:width=2,depth=3", 2, 3, 14, 2.5),  # a full tree (no node budget)
])
def test_the_solved_rank_rate_gives_the_published_length(mod, policy, width, depth, nodes, length):
    alpha = mod.tree_rank_alpha(policy, length)
    assert 0 < alpha < 1
    kept = budget_tree([alpha] * width, width, depth, nodes)
    assert kept.nodes == nodes
    assert 1.0 + kept.expected_accepted() == pytest.approx(length, abs=1e-6)


def test_a_length_the_tree_cannot_reach_is_refused(mod):
    with pytest.raises(SystemExit, match="cannot accept"):
        mod.tree_rank_alpha("tree:width=2,depth=2", 5.0)  # at most 2 draft tokens + the bonus
    with pytest.raises(SystemExit, match="tree policy"):
        mod.tree_rank_alpha("fixed:k=3", 2.0)


def test_a_point_names_its_tree_entry_and_gets_per_rank_rates(mod):
    shared = {"target": "llama-3.3-70b"}
    spec = {"policy": "tree:width=8,depth=8,nodes=64", "tree_acceptance": "eagle3-llama-3.3-70b-mt-bench-sglang-pr4716",
            "drafter_model": ["eagle3"]}
    resolved, extra = mod.point_spec(spec, shared)
    assert "tree_acceptance" not in resolved and "tree_acceptance" in spec  # the point's own options are left alone
    rates = [float(x) for x in resolved["rank_alphas"].split(",")]
    assert len(rates) == 8 and len(set(rates)) == 1 and rates[0] == pytest.approx(resolved["alpha"], abs=1e-9)
    assert extra["tree_mean_length"] == 5.88 and extra["rank_alpha"] == resolved["alpha"]
    plain = {"policy": "fixed:k=2", "acceptance": "eagle3-llama-3.1-8b-vllm-issue20780"}
    assert mod.point_spec(plain, shared) == (plain, {})


def test_a_tree_entry_is_checked_against_the_run(mod):
    spec = {"policy": "tree:width=8,depth=8,nodes=64", "tree_acceptance": "eagle3-llama-3.3-70b-mt-bench-sglang-pr4716",
            "drafter_model": ["eagle3"]}
    with pytest.raises(Exception, match="llama-3.1-8b"):
        mod.point_spec(spec, {"target": "llama-3.1-8b"})  # measured on another target
    chain = dict(spec, tree_acceptance="eagle3-llama-3.1-8b-vllm-issue20780")
    with pytest.raises(SystemExit, match="not one tree"):
        mod.point_spec(chain, {"target": "llama-3.1-8b"})  # a chain's lengths, not a tree's


def test_operators_price_only_the_tables_dtype(mod):
    assert mod.priced_by({"hardware": "h100-sxm"}, "operators") == "operators"
    assert mod.priced_by({"hardware": "h100-sxm", "dtype": "bfloat16"}, "operators") == "operators"
    assert mod.priced_by({"hardware": "h100-sxm", "dtype": "float16"}, "operators") == "roofline"
    # the operator model's own rule: float8 for a mixture of experts (block-FP8 expert tables), not for a dense model
    assert mod.priced_by({"hardware": "h200", "dtype": "float8", "target": "deepseek-v3"}, "operators") == "operators"
    assert mod.priced_by({"hardware": "h200", "dtype": "float8", "target": "llama-3.1-8b"}, "operators") == "roofline"
