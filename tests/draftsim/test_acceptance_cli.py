"""The acceptance options of the commands: one per-position convention in input and output,
``--acceptance NAME`` from the cited catalog, and ``draftsim acceptance``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.commands.simulation import SimulateConfig, build_process
from draftsim.sim.acceptance import Positional
from draftsim.sim.acceptance_catalog import acceptance_entry
from draftsim.sim.errors import DraftsimError

rates = st.lists(st.floats(0.05, 1.0), min_size=1, max_size=8)


def _config(**kw) -> SimulateConfig:
    return SimulateConfig(policy="fixed:k=1", cost=[0.1], **kw)


@settings(max_examples=60, deadline=None)
@given(rates)
def test_positional_cumulative_and_conditional_give_the_same_process(c):
    """--positional a_1..a_k (cumulative) and --positional c_1..c_k --conditional name one process."""
    c = np.array(c)
    a = np.cumprod(c)
    text = lambda x: ",".join(repr(float(v)) for v in x)  # noqa: E731
    from_cumulative = build_process(_config(positional=text(a)), 2, c.size)
    from_conditional = build_process(_config(positional=text(c), conditional=True), 2, c.size)
    assert isinstance(from_cumulative, Positional) and isinstance(from_conditional, Positional)
    # where a_{i-1} = 0 position i is never reached: its conditional rate is not identified
    reached = np.concatenate([[True], a[:-1] > 0])
    np.testing.assert_allclose(from_cumulative.alphas[reached], c[reached], rtol=1e-9, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(rates, st.integers(1, 4))
def test_too_few_positions_is_an_error_never_padded(c, extra):
    text = ",".join(repr(float(v)) for v in np.cumprod(c))
    with pytest.raises(DraftsimError, match="never padded"):
        build_process(_config(positional=text), 2, len(c) + extra)


def test_the_printed_rates_read_back_give_the_same_rates(capsys):
    """What ``simulate`` prints as acceptance by position, given back to --positional, reproduces itself."""
    status, out, _ = run(capsys, "simulate", "--json", "--policy", "fixed:k=3", "--positional", "0.8,0.6,0.4", "--cost", "0.1",
                         "--tokens", "300000", "--seed", "3")
    assert status == 0
    res = json.loads(out)
    got, se = np.array(res["acceptance_by_position"]), np.array(res["acceptance_by_position_se"])
    assert np.all(np.abs(got - [0.8, 0.6, 0.4]) < 5 * se + 1e-9)
    status, out, _ = run(capsys, "simulate", "--json", "--policy", "fixed:k=3", "--positional", ",".join(f"{x:.6f}" for x in got),
                         "--cost", "0.1", "--tokens", "300000", "--seed", "4")
    again = np.array(json.loads(out)["acceptance_by_position"])
    assert np.all(np.abs(again - got) < 5 * np.hypot(se, json.loads(out)["acceptance_by_position_se"]) + 1e-9)


@pytest.mark.parametrize("argv, words", [
    (["--positional", "0.5,0.6,0.7"], ["cumulative", "--conditional"]),
    (["--positional", "0.9,0.8"], ["gives 2 position(s)", "drafts up to 3", "never padded"]),
    (["--conditional", "--alpha", "0.7"], ["--conditional", "--positional"]),
    (["--acceptance", "no-such-entry"], ["unknown acceptance entry 'no-such-entry'", "draftsim acceptance"]),
    (["--acceptance", "eagle3-llama-3.1-8b-vllm-issue20780", "--alpha", "0.5"], ["exactly one acceptance process", "--acceptance"]),
    (["--acceptance", "eagle3-llama-3.1-8b-mt-bench-t0-eagle3-paper-table1"], ["tree draft", "chain"]),
])
def test_bad_acceptance_input_is_one_line_and_exit_2(capsys, argv, words):
    status, out, err = run(capsys, "simulate", "--policy", "fixed:k=3", "--cost", "0.1", *argv)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_an_entry_for_another_target_is_refused(capsys):
    status, _, err = run(capsys, "serve-sim", "--policy", "fixed:k=3", "--acceptance", "mtp-glm-4.5-air-gpqa-specdecode-bench",
                         "--target", "llama-3.1-8b", "--drafter-model", "qwen2.5-0.5b", "--hardware", "h100-sxm", "--requests", "5")
    assert status == 2
    assert "measured on 'glm-4.5-air', not on the target 'llama-3.1-8b'" in err and "eagle3-llama-3.1-8b" in err


@pytest.mark.parametrize("argv,words", [
    (("simulate", "--cost", "0.05", "--tokens", "200"), "this run names no target and no drafter to compare with"),
    (("serve-sim", "--target", "llama-3.1-8b", "--drafter-model", "eagle3", "--hardware", "h100-sxm", "--requests", "10", "--qps", "2",
      "--output-len", "fixed:16"), "this run's target and drafter are the same"),
])
def test_borrow_with_nothing_to_borrow_says_so_and_what_the_entry_was_measured_on(capsys, argv, words):
    """--borrow where the run names no target or drafter to differ from the entry, or the entry's own: the run goes on,
    and stderr and --json say what the entry was measured on (it once said nothing)."""
    status, out, err = run(capsys, argv[0], "--json", "--policy", "fixed:k=2", "--acceptance", "eagle3-llama-3.1-8b-vllm-issue20780",
                           "--borrow", *argv[1:])
    assert status == 0, err
    line = "--borrow borrowed nothing: entry 'eagle3-llama-3.1-8b-vllm-issue20780' was measured on llama-3.1-8b with eagle3; "
    assert f"warning: {line}{words}" in err and json.loads(out)["warnings"] == [line + words]


def test_serving_with_a_catalog_entry_reproduces_its_published_mean_length(capsys):
    """vLLM issue 20780: EAGLE-3 on Llama-3.1-8B, k=3, mean acceptance length 2.79."""
    # the entry is EAGLE-3's, the drafter priced here a draft model: borrowed knowingly (--borrow), and said so
    status, out, err = run(capsys, "serve-sim", "--json", "--policy", "fixed:k=3", "--acceptance", "eagle3-llama-3.1-8b-vllm-issue20780",
                           "--borrow", "--target", "llama-3.1-8b", "--drafter-model", "qwen2.5-0.5b", "--hardware", "h100-sxm",
                           "--requests", "60", "--qps", "2", "--output-len", "256")
    assert status == 0, err
    assert "measured with eagle3, the drafter here is draft_model" in err
    assert any("measured with eagle3, the drafter here is draft_model" in w for w in json.loads(out)["warnings"])
    sd = json.loads(out)["spec_decode"]
    assert acceptance_entry("eagle3-llama-3.1-8b-vllm-issue20780").mean_length(3) == pytest.approx(2.79)
    assert sd["mean_acceptance_length"] == pytest.approx(2.79, abs=0.05)


def test_listing_and_showing_entries(capsys):
    status, out, _ = run(capsys, "acceptance", "--json", "--method", "eagle3", "--target", "meta-llama/Llama-3.1-8B-Instruct")
    assert status == 0
    entries = json.loads(out)["entries"]
    assert entries and all(e["method"] == "eagle3" and e["target"] == "llama-3.1-8b" and e["source"] for e in entries)
    status, out, _ = run(capsys, "acceptance", "--json", "eagle-llama-3.1-8b-vllm-issue20780")
    shown = json.loads(out)
    by_k = {r["k"]: r for r in shown["rates"]}
    published = {2: 2.10, 3: 2.29, 4: 2.39, 5: 2.43, 6: 2.45, 7: 2.47}  # the table of AL per K
    assert sorted(by_k) == sorted(published)
    for k, length in published.items():
        r = by_k[k]
        assert r["mean_length"] == pytest.approx(length, abs=1e-9)
        assert 1 + sum(r["cumulative"]) == pytest.approx(length, abs=1e-9)
        assert np.allclose(np.cumprod(r["conditional"]), r["cumulative"])
    status, out, _ = run(capsys, "acceptance", "eagle-llama-3.1-8b-vllm-issue20780")
    assert status == 0 and "source: vLLM issue 20780" in out and "cumulative a_i (vLLM)" in out
    status, _, err = run(capsys, "acceptance", "eagle-llama-3.1-8b-vllm-issue20780", "--method", "eagle")
    assert status == 2 and "not both" in err
