"""The capacity front door (draftsim/commands/frontdoor.py): flags instead of a spec, the answer
first, and the engine configuration that deploys it."""

from __future__ import annotations

import json
import math
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.analysis import sweep as sw
from draftsim.cli import GROUPS, build_parser, main
from draftsim.commands.frontdoor import SLO_NAMES, SLO_STATS, build_spec, hf_id, parse_method, parse_slo, toml_text
from draftsim.commands.sweeping import CapacityConfig
from draftsim.sim.errors import DraftsimError
from draftsim.sweepkinds import KINDS


@given(st.sampled_from(SLO_NAMES), st.sampled_from(SLO_STATS), st.floats(1e-3, 1e3), st.sampled_from(["", "s", "ms", "us"]))
def test_an_slo_reads_as_the_metric_and_its_bound_in_seconds(name, stat, value, unit):
    metric, bound = parse_slo(f"{name}:{stat}={value!r}{unit}")
    assert metric == f"{name}_{stat}" and metric in KINDS["serve"].metrics
    assert bound == pytest.approx(value * {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}[unit], rel=1e-12)


@pytest.mark.parametrize("text, words", [
    ("ttft=2s", ["NAME:STAT=VALUE"]), ("ttft:p100=2s", ["unknown statistic 'p100'", "p99"]), ("tbt:p99=2s", ["unknown latency 'tbt'"]),
    ("ttft:p99=2xs", ["unknown unit 'xs'", "ms"]), ("ttft:p99=0", ["finite number > 0"]), ("ttft:p99=inf", ["finite number > 0"]),
    ("ttft:p99=", ["NAME:STAT=VALUE"]), ("ttft:p99=2 5ms", ["must be a time"]),
])
def test_a_bad_slo_is_one_line_naming_it(text, words):
    with pytest.raises(DraftsimError) as err:
        parse_slo(text)
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words)


@pytest.mark.parametrize("text, seconds", [("ttft:p99=2m", 120.0), ("tpot:p90=60ms", 0.06), ("itl:p50=250us", 250e-6),
                                           ("e2e:p99=0.5h", 1800.0), ("tpot:p50=50 ms", 0.05)])
def test_an_slo_reads_its_bound_as_every_time_is(text, seconds):
    """--slo's VALUE[UNIT] is read by the one reader of times (--duration 2m, think=500ms): 2m is 120 s."""
    assert parse_slo(text)[1] == pytest.approx(seconds)


def test_methods_and_their_draft_lengths():
    assert parse_method("eagle3:k=1..4").ks == (1, 2, 3, 4) and parse_method("eagle3").drafter == "eagle3"
    assert parse_method("ngram:k=2,4,4").ks == (2, 4)
    assert parse_method("qwen2.5-0.5b:k=3").drafter == "qwen2.5-0.5b"
    for text, words in (("eagle4", ["did you mean eagle", "eagle3"]), ("eagle3:k=0", ["1..64"]), ("eagle3:k=a", ["not a list"]),
                        ("eagle3:k=1..40", ["at most 16"]), ("maxgram", ["not a serving engine's"])):
        with pytest.raises(DraftsimError) as err:
            parse_method(text)
        assert all(w in str(err.value) for w in words), str(err.value)


def _config(**kw) -> CapacityConfig:
    base = dict(spec=None, out=None, target="llama-3.1-70b", hardware="h100-sxm", tp=4, load=12.0,
                slo=["ttft:p99=2s", "tpot:p90=60ms"], method=["eagle3:k=1..2"], alpha=0.7, workload="sharegpt")
    return CapacityConfig(**{**base, **kw})


def test_the_flags_build_a_spec_that_its_toml_reads_back():
    raw = build_spec(_config())
    spec = sw.parse_spec(raw, KINDS)
    assert spec.kind == "serve" and spec.n_points == 3  # plain decoding, k = 1, k = 2
    assert raw["capacity"]["slo"] == {"ttft_p99": 2.0, "tpot_p90": pytest.approx(0.06)} and raw["capacity"]["load"] == 12.0
    assert raw["zip"][0]["policy"] == ["ar", "fixed:k=1", "fixed:k=2"] and raw["zip"][0]["drafter-model"] == [[], ["eagle3"], ["eagle3"]]
    assert tomllib.loads(toml_text(raw)) == raw
    with pytest.raises(DraftsimError, match="--alpha A"):
        build_spec(_config(alpha=None))
    with pytest.raises(DraftsimError, match="at least one --slo"):
        build_spec(_config(slo=[]))


def test_hugging_face_ids_name_the_model_as_published():
    assert hf_id("llama-3.1-8b").startswith("meta-llama/Llama-3.1-8B") and hf_id("no-such-model") is None


def test_help_groups_every_command():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    grouped = {n for _, names in GROUPS for n in names}
    assert set(sub.choices) == grouped
    text = parser.format_help()
    assert text.index("capacity") < text.index("ewif") and "serve: capacity planning" in text


@pytest.mark.slow  # 40.0 s measured (pytest --durations, 2-core machine, measured with other work on the machine)
def test_the_front_door_answers_first_and_ends_in_a_vllm_command(tmp_path, capsys):
    """One command, no spec: the answer is the first line, then the table, then the vLLM command
    line that deploys the answer, and the spec written beside the results; the report, rendered
    in a real browser, leads with the same answer above its first table."""
    from tests.analysis.test_report import render

    args = ["capacity", "--target", "meta-llama/Llama-3.1-8B-Instruct", "--hardware", "h100-sxm", "--load", "4",
            "--slo", "ttft:p99=2s", "--slo", "tpot:p90=60ms", "--method", "eagle3:k=2", "--alpha", "0.7", "--workload", "sharegpt",
            "--duration", "20", "--replications", "2", "--workers", "1", "--out", str(tmp_path / "out")]
    assert main([*args, "--report", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("answer: ") and "replica" in out[0] and "margin" in out[0]
    assert "vllm v0.10.1" in out[1] and "max_num_seqs 1024" in out[1]
    command = next(line for line in out if line.strip().startswith("vllm serve"))
    assert "meta-llama/Llama-3.1-8B" in command and "--tensor-parallel-size 1" in command
    spec = sw.load_spec(tmp_path / "out" / "spec.toml", KINDS)
    assert spec.n_points == 2
    assert main([*args, "--resume", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["recommendation"] == out[0][len("answer: "):] and doc["deployment"]["command"] == command.strip()
    assert doc["engine"] == "vllm v0.10.1"
    # a speculative answer says how far speedups like it were off (plain decoding's carries no such record)
    speculative = out[0].startswith("answer: enable ")
    assert (doc["model_error"] is not None) == speculative and out[2].startswith("  model error: ")  # plain decoding: "none to carry"
    assert speculative or "none to carry" in out[2]
    dom, shot = render(tmp_path / "report" / "report.html")
    answer = out[0][len("answer: "):]
    assert "Answer: " + answer[:40] in dom and dom.index("Answer: ") < dom.index("<table") and shot.shape[0] > 0
    assert "vllm serve meta-llama/Llama-3.1-8B" in dom


@pytest.mark.parametrize("flag", [["--target", "llama-3.1-8b"], ["--engine", "none"], ["--overheads", "sglang"], ["--duration", "2m"],
                                  ["--workload", "sharegpt"], ["--alpha", "0.7"], ["--tp", "2"], ["--replications", "5"]])
def test_a_spec_and_the_flags_together_are_refused(tmp_path, capsys, flag):
    """Every front-door flag beside a SPEC is refused, naming it (--engine, --duration, --alpha, ... were ignored)."""
    spec = tmp_path / "s.toml"
    spec.write_text(toml_text(build_spec(_config())))
    assert main(["capacity", str(spec), "--out", str(tmp_path / "o"), *flag]) == 2
    err = capsys.readouterr().err
    name = "--engine" if flag[0] == "--overheads" else flag[0]
    assert len(err.strip().splitlines()) == 1 and "not both" in err and name in err and not (tmp_path / "o").exists()


@settings(max_examples=300, deadline=None)
@given(st.floats(-300, 300), st.floats(-300, 308))
def test_a_refused_load_or_duration_suggests_bounds_that_pass(log_load, log_duration):
    """--load and --duration anywhere in float range: search_range answers, or refuses in a line
    whose every suggested bound, applied as printed, is accepted (never 'give --load <= 0', as
    --duration 1e308 once printed when duration x 8 overflowed)."""
    import re

    from draftsim.commands.frontdoor import search_range
    from draftsim.sim.errors import DraftsimError

    load, duration = 10.0 ** log_load, 10.0 ** log_duration
    try:
        minimum, start, maximum = search_range(load, duration)
    except DraftsimError as exc:
        text = str(exc)
        found = re.findall(r"--(load|duration) (>=|<=) ([0-9.e+-]+)", text)
        assert len(found) == 2, text
        for name, _side, value in found:
            x = float(value)
            assert math.isfinite(x) and x > 0, text
            search_range(x if name == "load" else load, x if name == "duration" else duration)
    else:
        assert 0 < minimum <= start <= maximum < math.inf


def test_a_speculative_answer_says_its_model_error_and_its_margin_under_it(tmp_path, capsys):
    """A TPOT bound plain decoding cannot meet on the H100 makes EAGLE-3 the answer; the lines after
    it say how far speedups like it were from published ones, and --json carries the same record."""
    from draftsim.sim.evidence import adverse_margin, evidence_for

    args = ["capacity", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--load", "4", "--slo", "ttft:p99=2s",
            "--slo", "tpot:p90=7ms", "--method", "eagle3:k=2", "--alpha", "0.7", "--workload", "sharegpt", "--duration", "20",
            "--replications", "2", "--workers", "1", "--out", str(tmp_path / "out")]
    assert main([*args, "--report", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert main([*args, "--resume", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = next(r for r in doc["configurations"] if r["policy"] != "ar")
    assert 1.0 <= row["mean_batch_at_load"] <= row["replicas_for_load"] * 1024  # the mean batch a replica ran at the load
    like = evidence_for("eagle3", False, "vllm", "h100-sxm", row["mean_batch_at_load"])  # matched on it where 4 points are near it
    assert f"Model error: {like.text()}; over all " in (tmp_path / "report" / "report.md").read_text()
    assert "EAGLE-3" in out[0] and out[2] == f"  model error: {like.text()}"
    assert out[3].startswith("    over all ") and out[4].startswith("    were this gain over-predicted by ")
    error = doc["model_error"]
    assert error["matched_on"] == list(like.matched) and error["points"] == like.points
    assert error["margin_at_median_error"] == pytest.approx(adverse_margin(error["margin"], like.median_abs_error))
