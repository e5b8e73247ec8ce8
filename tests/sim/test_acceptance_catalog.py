"""The per-position convention (cumulative, conditional, mean acceptance length, vLLM's draft
acceptance rate), its conversions, and the cited acceptance catalog built on it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim import simulate
from draftsim.sim.acceptance import Positional
from draftsim.sim.acceptance_catalog import (
    CATALOG_PATH,
    METHODS,
    acceptance_entry,
    check_target,
    list_entries,
    load_catalog,
    same_model,
)
from draftsim.sim.acceptance_rates import (
    conditional_from_cumulative,
    conditional_from_mean_length,
    cumulative_from_conditional,
    draft_acceptance_rate,
    mean_length,
    mean_length_from_draft_rate,
)
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import FixedK

ROOT = Path(__file__).resolve().parents[2]
RESEARCH = ROOT / "docs" / "research" / "acceptance.json"

rates = st.floats(0.0, 1.0, allow_nan=False)
conditionals = st.lists(rates, min_size=1, max_size=12)
positive = st.lists(st.floats(0.01, 1.0), min_size=1, max_size=12)


# ------------------------------------------------------------------ the convention


@given(conditionals)
def test_cumulative_rates_never_increase_and_stay_probabilities(c):
    a = cumulative_from_conditional(c)
    assert a.shape == (len(c),)
    assert np.all((a >= 0) & (a <= 1))
    assert np.all(np.diff(a) <= 0)
    assert a[0] == c[0]


@given(conditionals)
def test_cumulative_to_conditional_and_back_is_exact(c):
    a = cumulative_from_conditional(c)
    np.testing.assert_allclose(cumulative_from_conditional(conditional_from_cumulative(a)), a, rtol=1e-12, atol=1e-15)


@given(positive)
def test_conditional_to_cumulative_and_back_recovers_the_rates(c):
    np.testing.assert_allclose(conditional_from_cumulative(cumulative_from_conditional(c)), c, rtol=1e-9)


def test_conditional_after_a_zero_cumulative_rate_is_zero():
    np.testing.assert_array_equal(conditional_from_cumulative([0.5, 0.0, 0.0]), [0.5, 0.0, 0.0])


@given(conditionals)
def test_mean_length_lies_in_one_to_k_plus_one_and_matches_the_draft_rate(c):
    a = cumulative_from_conditional(c)
    k = len(c)
    L = mean_length(a)
    assert 1.0 <= L <= k + 1 + 1e-12
    r = draft_acceptance_rate(a)
    assert 0.0 <= r <= 1.0
    assert mean_length_from_draft_rate(r, k) == pytest.approx(L, abs=1e-12)


def test_identities_on_a_hand_example():
    # vLLM issue 19254's log line: per-position 0.615, 0.464, 0.383 -> mean acceptance length 2.46
    a = [0.615, 0.464, 0.383]
    assert mean_length(a) == pytest.approx(2.462)
    assert draft_acceptance_rate(a) == pytest.approx(1.462 / 3)
    np.testing.assert_allclose(conditional_from_cumulative(a), [0.615, 0.464 / 0.615, 0.383 / 0.464])
    # i.i.d. alpha: L = (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, §3.1)
    assert mean_length(cumulative_from_conditional([0.8] * 5)) == pytest.approx((1 - 0.8**6) / 0.2)


def test_vectorised_over_leading_axes():
    c = np.array([[0.9, 0.8], [0.5, 0.5]])
    np.testing.assert_allclose(cumulative_from_conditional(c), [[0.9, 0.72], [0.5, 0.25]])
    np.testing.assert_allclose(mean_length(cumulative_from_conditional(c)), [2.62, 1.75])
    out = conditional_from_mean_length(np.array([1.5, 2.0, 3.0]), 2)
    assert out.shape == (3, 2)
    np.testing.assert_allclose(mean_length(cumulative_from_conditional(out)), [1.5, 2.0, 3.0], atol=1e-12)


@given(st.integers(1, 16), st.floats(0.0, 1.0))
def test_constant_rate_from_mean_length_reproduces_it(k, u):
    L = 1.0 + u * k
    c = conditional_from_mean_length(L, k)
    assert c.shape == (k,)
    assert np.all(c == c[0])
    assert mean_length(cumulative_from_conditional(c)) == pytest.approx(L, abs=1e-12)


@given(st.integers(1, 12), st.floats(0.0, 1.0))
def test_constant_rate_from_mean_length_recovers_the_rate(k, alpha):
    L = mean_length(cumulative_from_conditional([alpha] * k))
    assert conditional_from_mean_length(L, k)[0] == pytest.approx(alpha, abs=1e-6)


@given(st.integers(2, 12), st.floats(0.01, 1.0), st.floats(0.0, 1.0))
def test_first_rate_and_mean_length_recover_the_rest(k, first, rest):
    L = mean_length(cumulative_from_conditional([first] + [rest] * (k - 1)))
    c = conditional_from_mean_length(L, k, first=first)
    assert c[0] == first
    assert mean_length(cumulative_from_conditional(c)) == pytest.approx(L, abs=1e-12)
    assert c[1] == pytest.approx(rest, abs=1e-5 / first)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: mean_length([0.9, 0.8], k=3), r"2 per-position values but k=3 needs 3"),
        (lambda: cumulative_from_conditional([0.9], k=2), r"1 per-position values but k=2"),
        (lambda: draft_acceptance_rate([0.5, 0.6]), r"must not increase.*0\.5 at position 1 then 0\.6 at position 2"),
        (lambda: conditional_from_cumulative([0.5, 0.6]), r"must not increase"),
        (lambda: mean_length([1.2]), r"must lie in \[0, 1\]; got 1\.2"),
        (lambda: mean_length([]), r"one rate per draft position"),
        (lambda: conditional_from_mean_length(4.5, 3), r"\[1, k\+1\] = \[1, 4\] for k=3; got 4\.5"),
        (lambda: conditional_from_mean_length(0.9, 3), r"got 0\.9"),
        (lambda: conditional_from_mean_length(1.9, 3, first=0.2), r"\[1 \+ c1, 1 \+ k\*c1\] for k=3 and c1=0\.2"),
        (lambda: conditional_from_mean_length(2.0, 0), r"k must be an integer in \[1, 1024\]; got 0"),
        (lambda: mean_length_from_draft_rate(1.5, 3), r"draft acceptance rate must lie in \[0, 1\]; got 1\.5"),
    ],
)
def test_bad_input_names_the_value_and_the_valid_range(call, match):
    with pytest.raises(DraftsimError, match=match):
        call()


@settings(max_examples=12)
@given(st.lists(st.floats(0.05, 0.98), min_size=1, max_size=5), st.integers(0, 2**31))
def test_positional_takes_conditional_rates_and_the_simulator_reports_cumulative_ones(c, seed):
    """A Monte Carlo of Positional(c) run through simulate: its per-position acceptance is
    the cumulative rate a_i, its tokens per target call the mean acceptance length and its
    acceptance rate vLLM's draft acceptance rate."""
    k = len(c)
    a = cumulative_from_conditional(c)
    r = simulate(FixedK(k), Positional(c), 0.05, 64_000, seed=seed, n_sequences=16)
    se = np.maximum(r.acceptance_by_position_se[:k], 1e-3)
    assert np.all(np.abs(r.acceptance_by_position[:k] - a) < 5 * se)
    tpc = r.metrics["tokens_per_call"]
    assert abs(tpc.value - mean_length(a)) < 5 * max(tpc.se, 2e-3)
    rate = r.metrics["acceptance_rate"]
    assert abs(rate.value - draft_acceptance_rate(a)) < 5 * max(rate.se, 2e-3)


# ------------------------------------------------------------------ the catalog


def test_every_entry_loads_names_a_source_and_a_known_method():
    raw = json.loads(CATALOG_PATH.read_text())["entries"]
    catalog = load_catalog()
    assert set(catalog) == set(raw) and len(catalog) >= 50
    for name, e in raw.items():
        assert e["source"].strip(), name
        assert e["method"] in METHODS
    methods = {e.method for e in catalog.values()}
    assert {"eagle", "eagle3", "medusa", "mtp", "ngram", "draft_model"} <= methods


def test_chain_entries_reproduce_what_their_source_reported():
    checked = 0
    for entry in load_catalog().values():
        for k, value in entry.values.items():
            if k is None or not isinstance(value, (float, tuple)):
                continue
            process = entry.process(k)
            assert isinstance(process, Positional)
            np.testing.assert_array_equal(process.alphas, entry.conditional(k))
            if entry.reported == "mean_length":
                assert entry.mean_length(k) == pytest.approx(value, abs=1e-9), entry.name
            elif entry.reported == "cumulative":
                np.testing.assert_allclose(entry.cumulative(k), value, atol=1e-12, err_msg=entry.name)
            checked += 1
    assert checked >= 30


def test_values_match_the_research_notes():
    research = {e["id"]: e for e in json.loads(RESEARCH.read_text())["entries"]}
    issue = research["vllm-issue-20780"]
    for name, label in (("eagle-llama-3.1-8b-vllm-issue20780", "EAGLE 1"), ("eagle3-llama-3.1-8b-vllm-issue20780", "EAGLE 3")):
        entry = acceptance_entry(name)
        assert entry.chain_lengths == tuple(issue["k"])
        assert [entry.values[k] for k in issue["k"]] == issue["acceptance_length"][label]
    pct = research["vllm-pr32628-eagle3-gptoss120b-humaneval"]["per_position_cumulative_percent"]
    entry = acceptance_entry("eagle3-gpt-oss-120b-humaneval-vllm-pr32628")
    for k, values in pct.items():
        np.testing.assert_allclose(entry.values[int(k)], np.array(values) / 100)
    traces = research["specdecode-bench-llama31-8b-traces"]["derived_stats"]["ngram"]["gsm8k"]
    entry = acceptance_entry("ngram-llama-3.1-8b-gsm8k-specdecode-bench-traces")
    assert entry.values[3] == traces["mean_emitted_per_step"]["k3"]
    assert entry.shape[0].values[3] == traces["frac_steps_nothing_accepted"]["k3"]


def test_ngram_entry_keeps_its_bimodal_shape():
    """The n-gram traces accept nothing in 91.5% of GSM8K steps; the process keeps that share
    as 1 - c_1 and puts the rest of the mean into high rates after a first acceptance."""
    entry = acceptance_entry("ngram-llama-3.1-8b-gsm8k-specdecode-bench-traces")
    c = entry.conditional(3)
    assert c[0] == pytest.approx(1 - 0.915)
    assert c[1] > 0.5 > c[0]
    assert entry.mean_length(3) == pytest.approx(1.164)


def test_per_position_entries_cut_to_shorter_chains_but_never_pad():
    entry = acceptance_entry("eagle3-gpt-oss-120b-humaneval-vllm-pr32628")
    np.testing.assert_allclose(entry.cumulative(2), [0.73, 0.52])  # the k=3 row's first two positions
    with pytest.raises(DraftsimError, match=r"at most 8 positions; k=9 needs 9 \(valid: k = 1..8\)"):
        entry.process(9)
    short = acceptance_entry("mtp-glm-4.5-air-gpqa-specdecode-bench")
    with pytest.raises(DraftsimError, match=r"k=4 needs 4"):
        short.process(4)


@pytest.mark.parametrize(
    "name, k, match",
    [
        ("eagle3-llama-3.1-8b-vllm-issue20780", 1, r"only at k = 2, 3, 4, 5, 6, 7; got k=1"),
        ("eagle3-llama-3.1-8b-vllm-issue20780", 8, r"got k=8"),
        ("mtp-deepseek-v3-report", 1, r"range 0\.85\.\.0\.9 at k=1"),
        ("eagle3-llama-3.1-8b-mt-bench-t0-eagle3-paper-table1", 3, r"tree draft \(EAGLE-3 dynamic tree: depth 8"),
        ("ngram-pld-vicuna-7b-spec-bench-a100", 3, r"does not state"),
        ("eagle3-llama-3.1-8b-vllm-issue20780", 0, r"k must be an integer in \[1, 1024\]; got 0"),
    ],
)
def test_process_refuses_what_the_source_does_not_give(name, k, match):
    with pytest.raises(DraftsimError, match=match):
        acceptance_entry(name).process(k)


def test_usable_lengths_are_exactly_the_k_process_accepts():
    for entry in load_catalog().values():
        for k in range(1, 10):
            if k in entry.usable_lengths:
                entry.process(k)
            else:
                with pytest.raises(DraftsimError):
                    entry.process(k)
    assert acceptance_entry("eagle3-gpt-oss-120b-humaneval-vllm-pr32628").usable_lengths == tuple(range(1, 9))
    assert acceptance_entry("eagle-llama-3.1-8b-vllm-issue20780").usable_lengths == (2, 3, 4, 5, 6, 7)
    assert acceptance_entry("mtp-deepseek-v3-report").usable_lengths == ()


def test_summary_is_one_line():
    assert acceptance_entry("eagle3-llama-3.1-8b-vllm-issue20780").summary() == (
        "eagle3-llama-3.1-8b-vllm-issue20780: eagle3 on llama-3.1-8b, unstated dataset; mean length at k=2,3,4,5,6,7")
    assert acceptance_entry("medusa-vicuna-7b-spec-bench-a100").summary().endswith("mean length at k=tree")


def test_unknown_entry_lists_close_names():
    with pytest.raises(DraftsimError, match=r"unknown acceptance entry 'eagle3-llama'; did you mean eagle3-llama-3\.1-8b"):
        acceptance_entry("eagle3-llama")


def test_lookup_filters_by_method_target_and_dataset():
    mtp = list_entries(method="mtp", target="deepseek-ai/DeepSeek-V3")
    assert mtp and all(e.method == "mtp" and e.target == "deepseek-v3" for e in mtp)
    assert {e.name for e in list_entries(target="Llama-3.1-8B-Instruct", dataset="GSM8K")} == {
        "ngram-llama-3.1-8b-gsm8k-specdecode-bench-traces",
        "eagle3-llama-3.1-8b-gsm8k-specdecode-bench-traces",
        "eagle3-llama-3.1-8b-gsm8k-t0-eagle3-paper-table1",
    }
    assert list_entries(target="llama-2-7b") == []
    with pytest.raises(DraftsimError, match=r"unknown drafting method 'eagle2'; did you mean eagle or eagle3\? known: draft_model, eagle, "):
        list_entries(method="eagle2")


@pytest.mark.parametrize("a, b, same", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", True),
    ("llama3.1-8b", "llama-3.1-8b", True),
    ("Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b", True),
    ("Qwen3-32B-FP8", "qwen3-32b", True),
    ("llama-3.1-70b", "llama-3.1-8b", False),
    ("llama-3-8b", "llama-3.1-8b", False),
    ("deepseek-r1", "deepseek-v3", False),
])
def test_same_model(a, b, same):
    assert same_model(a, b) is same


def test_check_target_refuses_an_entry_for_another_model():
    name = "eagle3-llama-3.1-8b-vllm-issue20780"
    assert check_target(name, "meta-llama/Llama-3.1-8B-Instruct").name == name
    with pytest.raises(DraftsimError, match=r"measured on 'llama-3\.1-8b', not on the target 'gpt-oss-120b'; entries for 'gpt-oss-120b': eagle3-gpt-oss"):
        check_target(name, "gpt-oss-120b")
    with pytest.raises(DraftsimError, match=r"the catalog has no entry for 'llama-2-7b'"):
        check_target(acceptance_entry(name), "llama-2-7b")
    with pytest.raises(DraftsimError, match=r"does not name its target model"):
        check_target("ngram-blazedit-vllm-pr24344", "llama-3.1-8b")


# ------------------------------------------------------------------ the loader refuses bad files


def _good_entry() -> dict:
    return json.loads(CATALOG_PATH.read_text())["entries"]["eagle3-llama-3.1-8b-vllm-issue20780"]


def _write(tmp_path, entry=None, **top) -> Path:
    doc = {"schema": "draftsim.acceptance", "version": 1, "entries": {"x-entry": entry if entry is not None else _good_entry()}}
    doc.update(top)
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(doc))
    return path


def _broken(**changes) -> dict:
    e = _good_entry()
    e.update(changes)
    return e


@pytest.mark.parametrize(
    "entry, match",
    [
        ({k: v for k, v in _good_entry().items() if k != "source"}, r"field 'source': is missing"),
        (_broken(source=""), r"field 'source': must be a non-empty string; got ''"),
        (_broken(method="eagle2"), r"field 'method': must be one of draft_model, eagle, eagle3"),
        (_broken(reported="tau"), r"field 'reported': must be one of cumulative"),
        (_broken(extra=1), r"field 'extra': is not a field"),
        (_broken(values=[{"k": 3, "value": 4.5}]), r"field 'values\[0\]': must be a number in \[1.0, 4.0\]; got 4.5"),
        (_broken(values=[{"k": 3, "value": 2.0}, {"k": 3, "value": 2.1}]), r"field 'values\[1\]': k=3 appears twice"),
        (_broken(values=[{"k": 0, "value": 1.0}]), r"k must be an integer in \[1, 1024\]; got 0"),
        (_broken(values=[{"k": None, "value": 2.0}]), r"field 'values\[0\]': k must be an integer"),
        (_broken(values=[]), r"field 'values': must be a non-empty list"),
        (_broken(reported="cumulative", values=[{"k": 3, "value": [0.8, 0.6]}]), r"at k=3 must be a list of 3 rates"),
        (_broken(reported="cumulative", values=[{"k": 2, "value": [0.6, 0.8]}]), r"must not increase; got \[0.6, 0.8\]"),
        (_broken(reported="conditional", values=[{"k": 2, "value": [0.6, 1.2]}]), r"must be a number in \[0.0, 1.0\]; got 1.2"),
        (_broken(reported="draft_acceptance_rate", values=[{"k": 1, "value": {"low": 0.9, "high": 0.8}}]), r"low <= high"),
        (_broken(draft="tree", tree=None, values=[{"k": None, "value": 2.0}]), r"field 'tree': must be a non-empty string; got None"),
        (_broken(draft="tree", tree="t"), r"a tree draft has one value with k null"),
        (_broken(temperature="hot"), r"field 'temperature': must be a number"),
        (_broken(assumptions="none"), r"field 'assumptions': must be a list of non-empty strings"),
        (_broken(shape=[{"what": "bimodal"}]), r"field 'shape\[0\]': must be an object with fields"),
        (_broken(shape=[{"what": "share_of_steps_accepting_nothing", "statement": "s", "values": [{"k": 3, "value": 0.9}],
                         "source": "s", "quote": None, "derived": None}]),
         r"field 'values': at k=3: .*mean acceptance length must lie in \[1 \+ c1, 1 \+ k\*c1\]"),
    ],
)
def test_loader_names_file_entry_and_field(tmp_path, entry, match):
    path = _write(tmp_path, entry)
    with pytest.raises(DraftsimError, match=match) as info:
        load_catalog(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: acceptance entry 'x-entry', field ")


@pytest.mark.parametrize(
    "top, match",
    [
        ({"schema": "draftsim.models"}, r"not an acceptance catalog \(schema must be 'draftsim.acceptance'"),
        ({"version": 2}, r"version must be 1; got 2"),
        ({"entries": {}}, r"'entries' must be a non-empty object"),
        ({"entries": {"Bad Name": {}}}, r"name must be lower-case .*; got 'Bad Name'"),
    ],
)
def test_loader_refuses_bad_documents(tmp_path, top, match):
    with pytest.raises(DraftsimError, match=match):
        load_catalog(_write(tmp_path, **top))


def test_loader_refuses_unreadable_files(tmp_path):
    with pytest.raises(DraftsimError, match=r"cannot read acceptance catalog .*missing.json"):
        load_catalog(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(DraftsimError, match=r"bad.json: not valid JSON \(line 1"):
        load_catalog(bad)


def test_a_good_file_loads(tmp_path):
    entry = load_catalog(_write(tmp_path))["x-entry"]
    assert entry.mean_length(4) == pytest.approx(3.08)


# ------------------------------------------------------------------ per-position ranges: brackets

MTP_V4 = "mtp-deepseek-v4-vllm-pr41044-k2"


def test_a_per_position_range_is_a_bracket_with_both_ends():
    """vLLM PR 41044's MTP per-position rates at concurrency 1/4/8 make a range per position; its
    ends run for k = 1..2 as the quoted values' lowest and highest, the entry itself refuses to
    pick one, and each end says which it is and names the other."""
    entry = acceptance_entry(MTP_V4)
    assert entry.usable_lengths == () and set(entry.ranges) == {2}
    with pytest.raises(DraftsimError, match=rf"at k=2 as a range \[0\.757, 0\.355\]\.\.\[0\.786, 0\.3807\].*{MTP_V4}@low and {MTP_V4}@high"):
        entry.process(1)
    low, high = acceptance_entry(f"{MTP_V4}@low"), acceptance_entry(f"{MTP_V4}@high")
    # the quote: position 0 76.94 / 75.70 / 78.60 %, position 1 38.07 / 35.50 / 35.76 %
    np.testing.assert_allclose(low.cumulative(2), [min(0.7694, 0.7570, 0.7860), min(0.3807, 0.3550, 0.3576)], atol=1e-12)
    np.testing.assert_allclose(high.cumulative(2), [max(0.7694, 0.7570, 0.7860), max(0.3807, 0.3550, 0.3576)], atol=1e-12)
    assert low.usable_lengths == high.usable_lengths == (1, 2)
    np.testing.assert_allclose(low.cumulative(1), [0.757])  # k=1: the chain's first position
    assert low.mean_length(2) < high.mean_length(2)
    assert "low end of the published range" in low.assumptions[-1] and f"{MTP_V4}@high is the other end" in low.assumptions[-1]
    for quoted in ("76.94%", "75.70%", "78.60%", "38.07%", "35.50%", "35.76%", "num_speculative_tokens=2"):
        assert quoted in entry.quote


@pytest.mark.parametrize(
    "value, match",
    [
        ({"low": [0.8], "high": [0.9, 0.5]}, r"at k=2 must be a list of 2 rates"),
        ({"low": [0.8, 0.6], "high": [0.7, 0.65]}, r"low <= high at every position; got \[0.8, 0.6\]\.\.\[0.7, 0.65\]"),
        ({"low": [0.5, 0.6], "high": [0.9, 0.7]}, r"must not increase; got \[0.5, 0.6\]"),
        ({"low": [0.5, 0.4]}, r"a range must be \{low, high\}; got keys \['low'\]"),
    ],
)
def test_the_loader_refuses_a_bad_per_position_range(tmp_path, value, match):
    path = _write(tmp_path, _broken(reported="cumulative", values=[{"k": 2, "value": value}]))
    with pytest.raises(DraftsimError, match=match):
        load_catalog(path)


@pytest.mark.parametrize("end", ["low", "high"])
def test_each_end_of_the_mtp_bracket_runs_through_serve_sim(capsys, end):
    """Both ends serve on DeepSeek-V3 with its MTP module (the nearest catalog model, borrowed
    knowingly): the run drafts k=2 at the end's per-position rates, and --json says what was
    borrowed and which end of the bracket ran."""
    from clirun import run

    status, out, err = run(capsys, "serve-sim", "--target", "deepseek-v3", "--hardware", "h200", "--tp", "8", "--dtype", "float8",
                           "--drafter", "mtp", "--policy", "fixed:k=2", "--acceptance", f"{MTP_V4}@{end}", "--borrow", "--qps", "2",
                           "--requests", "60", "--prompt-len", "fixed:128", "--output-len", "fixed:128", "--replications", "1", "--json")
    assert status == 0, err
    doc = json.loads(out)
    warnings = " ".join(doc["warnings"])
    assert "borrowed" in warnings and "deepseek-v4" in warnings and f"the {end} end of the published range" in warnings
    sd = doc["spec_decode"]
    per_pos = np.array(sd["num_accepted_tokens_per_pos"]) / sd["num_drafts"]
    expected = acceptance_entry(f"{MTP_V4}@{end}").cumulative(2)
    np.testing.assert_allclose(per_pos, expected, atol=0.03)  # 60 requests x 127 tokens: a few thousand rounds
    assert doc["step_breakdown"]["parts"]["drafting"]["ms_per_step"] > 0
