"""Workload presets (sim/data/workloads.json, ``--workload NAME``): each preset's sampled lengths
have the median and the 90th percentile its source states, within sampling error; the lengths
stay in [1, max]; the explicit ``--prompt-len`` / ``--output-len`` win over the preset; a bad
name is refused in one line with the closest names."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.api import ServeSimConfig
from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving.workload import (
    WORKLOADS_FILE,
    Z90,
    parse_lengths,
    workload_lengths,
    workload_preset,
    workload_presets,
)

PRESETS = list(workload_presets())
N = 200_000


def test_the_issue_s_four_kinds_are_there():
    """ShareGPT, a chat, a code and a summarisation workload (issue 36 item 6)."""
    for name in ("sharegpt", "chat", "code", "summarization"):
        assert workload_preset(name).name in PRESETS


def test_every_preset_is_cited_and_states_its_fit():
    doc = json.loads(WORKLOADS_FILE.read_text())
    assert "median" in doc["fit"] and "P90" in doc["fit"] and "clipped" in doc["fit"]
    for name, e in doc["workloads"].items():
        assert e["source"] and e["description"], name
        for which in ("prompt", "output"):
            facts = e[which]
            assert 0 < facts["median"] < facts["p90"] <= facts["max"], (name, which)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("which", ["prompt", "output"])
def test_sampled_median_and_p90_are_the_source_s(name, which):
    """The share of N draws at or below the stated median (P90) is 0.5 (0.9) within five
    binomial standard errors; draws are whole tokens, so the stated value v is bracketed by
    the shares at or below v − 0.5 and v + 0.5."""
    preset = workload_preset(name)
    facts = getattr(preset, which)
    spec = getattr(preset, f"{which}_len")
    lengths = parse_lengths(spec).sample(N, np.random.default_rng(7))
    for q, value in ((0.5, facts.median), (0.9, facts.p90)):
        tol = 5 * math.sqrt(q * (1 - q) / N)
        below, upto = np.mean(lengths <= value - 0.5), np.mean(lengths <= value + 0.5)
        assert below - tol <= q <= upto + tol, (name, which, q, value, below, upto)
    # and the fit is what the file says: a log-normal through the two, clipped to [1, max]
    assert lengths.min() >= 1 and lengths.max() <= facts.max
    assert math.isclose(facts.sigma, math.log(facts.p90 / facts.median) / Z90)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(PRESETS), seed=st.integers(0, 2**32 - 1), n=st.integers(1, 500))
def test_preset_lengths_stay_within_one_and_max(name, seed, n):
    preset = workload_preset(name)
    rng = np.random.default_rng(seed)
    for facts, spec in ((preset.prompt, preset.prompt_len), (preset.output, preset.output_len)):
        x = parse_lengths(spec).sample(n, rng)
        assert x.dtype == np.int64 and x.min() >= 1 and x.max() <= facts.max


def test_explicit_lengths_win_over_the_preset():
    code = workload_preset("azure-code")
    assert workload_lengths("code", None, None) == (code.prompt_len, code.output_len)
    assert workload_lengths("code", "fixed:100", None) == ("fixed:100", code.output_len)
    assert workload_lengths("code", None, "fixed:7") == (code.prompt_len, "fixed:7")
    assert workload_lengths(None, None, None) == ("fixed:512", "fixed:256")
    config = ServeSimConfig(target="llama-3.1-8b", hardware="h100-sxm", alpha=0.7, workload="sharegpt", output_len="fixed:64")
    assert config.prompt_len == workload_preset("sharegpt").prompt_len and config.output_len == "fixed:64"
    plain = ServeSimConfig(target="llama-3.1-8b", hardware="h100-sxm", alpha=0.7)
    assert (plain.prompt_len, plain.output_len) == ("fixed:512", "fixed:256")


def test_names_and_aliases_are_case_insensitive_and_unique():
    seen = {}
    for name, preset in workload_presets().items():
        for spelling in (name, *preset.aliases):
            assert spelling.lower() not in seen, (spelling, seen.get(spelling.lower()))
            seen[spelling.lower()] = name
            assert workload_preset(spelling.upper()).name == name


def test_a_bad_name_is_one_line_with_the_closest():
    with pytest.raises(DraftsimError, match=r"unknown workload preset 'sharegtp'; did you mean sharegpt\? known: sharegpt, "):
        workload_preset("sharegtp")
    with pytest.raises(DraftsimError, match=r"did you mean arxiv-summarization"):
        workload_preset("summarize")


def test_cli_refuses_a_bad_preset_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, err = run(capsys, "serve-sim", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--drafter", "eagle3",
                           "--alpha", "0.7", "--workload", "lmsys", "--qps", "1", "--requests", "10")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "unknown workload preset 'lmsys'; did you mean lmsys-chat" in err
    assert list(tmp_path.iterdir()) == []


def test_cli_serves_a_preset_and_lists_them_in_help(capsys):
    status, out, _ = run(capsys, "serve-sim", "--help")
    assert status == 0 and "Workload presets" in out and all(name in out for name in PRESETS)
    status, out, err = run(capsys, "serve-sim", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--drafter", "eagle3",
                           "--alpha", "0.7", "--workload", "code", "--qps", "2", "--requests", "40", "--replications", "1",
                           "--json")
    assert status == 0, err
    summary = json.loads(out)
    # the code preset's outputs (median 13 tokens), not the default fixed:256
    assert 0 < summary["output_tokens"] / summary["requests"] < 128
