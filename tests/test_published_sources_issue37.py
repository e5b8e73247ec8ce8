"""The published sources added for issue 37 item 6 (SpecForge issue 339, vLLM PR 16035): every
acceptance entry a point names loads, cites its source, and holds the acceptance the source printed
for that run; every published ratio is the source's own throughputs divided."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchscript import load_script

from draftsim.sim.acceptance_catalog import acceptance_entry
from draftsim.sim.budget_tree import budget_tree
from draftsim.sim.policies import parse_policy

FOLDER = Path(__file__).resolve().parent.parent / "benchmarks" / "published"
SOURCES = {"specforge_issue339.json": "https://github.com/sgl-project/SpecForge/issues/339",
           "vllm_pr16035.json": "https://github.com/vllm-project/vllm/pull/16035"}


def doc(name: str) -> dict:
    return json.loads((FOLDER / name).read_text())


@pytest.fixture(scope="module")
def reproduce():
    return load_script("benchmarks/published/reproduce.py")


@pytest.mark.parametrize("name, url", SOURCES.items())
def test_each_point_names_an_entry_that_loads_and_cites_the_same_source(name, url):
    d = doc(name)
    assert d["source"]["url"] == url and d["source"]["locator"] and d["unstated"]
    for point in d["points"]:
        entry = acceptance_entry(point["spec"].get("acceptance") or point["spec"]["tree_acceptance"])
        assert url in entry.source and entry.quote.startswith("as printed")
        assert entry.target == d["common"]["target"] and entry.method == point["spec"]["drafter_model"][0]


@pytest.mark.parametrize("name", SOURCES)
def test_published_ratios_are_the_sources_throughputs_divided(name):
    d = doc(name)
    base = d["baseline_published_tok_s"]
    for point in d["points"]:
        b = base if not isinstance(base, dict) else base[str(point["run"]["max_num_seqs"])]
        assert point["published"] == pytest.approx(point["published_tok_s"] / b, abs=1e-4), point["label"]


def test_specforge_entries_hold_each_runs_printed_length(reproduce):
    for point in doc("specforge_issue339.json")["points"]:
        spec = point["spec"]
        if "acceptance" in spec:  # the chain: steps 3, topk 1, 4 draft tokens = k 3
            k = parse_policy(spec["policy"]).k
            assert acceptance_entry(spec["acceptance"]).mean_length(k) == pytest.approx(point["published_acceptance_length"])
            continue
        entry = acceptance_entry(spec["tree_acceptance"])
        assert entry.draft == "tree" and entry.values == {None: point["published_acceptance_length"]}
        tree = parse_policy(spec["policy"])
        steps, topk, drafts = (int(x) for x in point["label"].split()[1].rstrip(",").split("/"))
        assert (tree.depth, tree.width, tree.max_nodes) == (steps, topk, drafts - 1)  # SGLang verifies num_draft_tokens - 1 drafts
        alpha = reproduce.tree_rank_alpha(spec["policy"], point["published_acceptance_length"])
        kept = budget_tree([alpha] * tree.width, tree.width, tree.depth, tree.max_nodes)
        assert 1.0 + kept.expected_accepted() == pytest.approx(point["published_acceptance_length"], abs=1e-6)


def test_vllm_pr16035_entry_holds_the_printed_lengths():
    entry = acceptance_entry("eagle-llama-3-8b-mt-bench-vllm-pr16035")
    assert entry.values == {2: 1.89, 4: 2.08}
    assert entry.mean_length(2) == pytest.approx(1.89) and entry.mean_length(4) == pytest.approx(2.08)


def test_angelslim_points_hold_the_printed_table():
    """AngelSlim's vLLM EAGLE-3 table (one H20, batch 1, k = 2): every point names an entry that loads,
    cites the commit, is of the point's own target and holds the accept length printed beside its
    throughput; every ratio is that throughput over the same column's vanilla one, both in the quoted
    table."""
    d = doc("angelslim_qwen3_h20.json")
    quote = d["source"]["quote"]
    assert "dfaf45e87d691a067af421daf247c02ec025ddf3" in d["source"]["locator"] and len(d["points"]) == 16
    for point in d["points"]:
        entry = acceptance_entry(point["spec"]["acceptance"])
        assert "Tencent/AngelSlim" in entry.source and entry.quote.startswith("as printed")
        assert entry.target == point["run"]["target"] and entry.method == point["spec"]["drafter_model"][0] == "eagle3"
        assert entry.values == {2: point["published_acceptance_length"]} and point["spec"]["policy"] == "fixed:k=2"
        base = d["baseline_published_tok_s"][point["label"]]
        assert f"{point['published_tok_s']:g} {point['published_acceptance_length']:g}" in quote
        assert f"{base:g}" in quote
        assert point["published"] == pytest.approx(point["published_tok_s"] / base, abs=1e-4), point["label"]


def test_sglang_deepseek_mtp_points_hold_the_quoted_sentence():
    """SGLang's DeepSeek-V3 MTP sentence (H200 TP 8, 1.8x at batch 1, 1.5x at batch 32): every point's
    published value is the quoted speedup at its batch size, its batch is held by that many clients,
    and it runs the section's k = 1 chain as a bracket over the DeepSeek-V3 report's 85-90% range, on
    the entry's own target and method."""
    d = doc("sglang_docs_deepseek_v3_mtp.json")
    quote = d["source"]["quote"]
    assert "sgl-project/sglang" in d["source"]["locator"] and d["unstated"] and len(d["points"]) == 2
    assert "on H200 TP8 setting" in quote
    assert "--speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2" in quote
    assert (d["common"]["target"], d["common"]["hardware"], d["common"]["tp"]) == ("deepseek-v3", "h200", 8)
    for point in d["points"]:
        bs = point["batch_size"]
        assert f"**{point['published']:g}x** for batch size {bs}" in quote, point["label"]
        assert point["run"]["arrivals"] == f"closed:clients={bs},think=0"
        assert point["spec"]["acceptance"] == "mtp-deepseek-v3-report@range" and point["spec"]["policy"] == "fixed:k=1"
        for end in ("low", "high"):
            entry = acceptance_entry(f"mtp-deepseek-v3-report@{end}")
            assert entry.target == d["common"]["target"] and entry.method == point["spec"]["drafter_model"][0] == "mtp"
    assert sorted(p["batch_size"] for p in d["points"]) == [1, 32]
    assert acceptance_entry("mtp-deepseek-v3-report@low").values == {1: 0.85}
    assert acceptance_entry("mtp-deepseek-v3-report@high").values == {1: 0.9}
