"""The third bad-input hunt (capacity's front door, serve-sim, cost and the request-trace reader):
each failure class it found, held to the CLI's contract — one line on stderr naming the value and
what is valid, exit status 2, no traceback, nothing written — and the valid input beside it still
accepted.

Classes: an unknown choice (engine, KV dtype, cost model, router) named without the close ones;
draft lengths in other scripts' digits (``--method eagle3:k=１`` searched k = 1); a drafter's
option given twice or left empty (the last value won; ``ngram:`` was priced as a model named
None); a request trace naming a column twice or holding a line with more or fewer fields than its
header (one column was kept silently, extra fields dropped); and options that change nothing beside
the one that replaces them (``--borrow`` without ``--acceptance``, a preset or length
distribution beside ``--request-trace``), taken silently.
"""

from __future__ import annotations

import json

import pytest
from clirun import run

from draftsim.sim.errors import DraftsimError

SERVE = ("serve-sim", "--alpha", "0.8", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--replications", "1")
COST = ("cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm")
FRONT = ("capacity", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--slo", "tpot:p90=60ms", "--load", "4")


def refused(status, out, err, *fragments):
    assert status == 2 and out == "" and "Traceback" not in err, (status, out, err)
    assert err.startswith("draftsim") and err.endswith("\n") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def run_in(tmp_path, monkeypatch, capsys, *argv):
    """Run ``draftsim argv`` in an empty working folder; refused runs must leave it empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    result = run(capsys, *argv)
    if result[0] == 2:
        assert list(cwd.iterdir()) == [], "something was written"
    return result


# -- an unknown choice names the close ones -----------------------------------------------------------

@pytest.mark.parametrize("argv, fragments", [
    ((*SERVE, "--drafter-model", "eagle3", "--qps", "2", "--engine", "vlm"), ["invalid choice: 'vlm'; did you mean vllm?", "'sglang'"]),
    ((*COST, "--kv-dtype", "fp9"), ["invalid choice: 'fp9'; did you mean fp8?", "'int8'"]),
    ((*COST, "--cost-model", "Operators"), ["invalid choice: 'Operators'; did you mean operators?", "'roofline'"]),
    ((*COST, "--dtype", "bf16"), ["invalid choice: 'bf16'; did you mean bfloat16?"]),
    ((*SERVE, "--drafter-model", "eagle3", "--qps", "2", "--router", "round_robin"), ["did you mean round-robin?"]),
    # a spec's (the front door's) values are read by draftsim.config, not argparse: the same hint
    ((*FRONT, "--engine", "sglng", "--check"), ["argument --engine/--overheads: invalid choice: 'sglng'; did you mean sglang?", "'vllm-v0.6'"]),
])
def test_an_unknown_choice_names_the_close_ones(tmp_path, monkeypatch, capsys, argv, fragments):
    argv = (*argv, "--out", str(tmp_path / "cap")) if argv[0] == "capacity" else argv
    refused(*run_in(tmp_path, monkeypatch, capsys, *argv), *fragments)
    assert not (tmp_path / "cap").exists()


def test_a_far_choice_and_a_configuration_built_in_python():
    from draftsim.config import check, did_you_mean

    assert did_you_mean("gpu", ["mc", "des"]) == "" and did_you_mean("", ["mc"]) == ""
    from draftsim.commands.costing import CostConfig

    with pytest.raises(DraftsimError, match="got 'sglng'; did you mean sglang"):
        check(CostConfig(target="llama-3.1-8b", hardware="h100-sxm", engine="sglng"))


# -- the front door's draft lengths in ASCII digits ---------------------------------------------------

@pytest.mark.parametrize("method", ["eagle3:k=１", "eagle3:k=1..٤", "eagle3:k=+2", "eagle3:k=2_0"])
def test_draft_lengths_in_other_digits_are_refused(tmp_path, monkeypatch, capsys, method):
    """int() reads '１' and '٣': the search ran k = 1 and 3 for text no other option takes."""
    out = tmp_path / "cap"
    refused(*run_in(tmp_path, monkeypatch, capsys, *FRONT, "--alpha", "0.7", "--method", method, "--out", str(out)),
            f"--method {method!r}", "integers in ASCII digits", "k=1..4")
    assert not out.exists()


def test_draft_lengths_in_ascii_still_read(tmp_path, capsys):
    status, out, err = run(capsys, *FRONT, "--alpha", "0.7", "--method", "eagle3:k=1..3,5", "--out", str(tmp_path / "cap"), "--check")
    assert status == 0 and "5 configuration(s)" in out, err
    refused(*run(capsys, *FRONT, "--alpha", "0.7", "--method", "eagle3:k=" + "9" * 30, "--out", str(tmp_path / "cap")),
            "draft lengths must lie in 1..64")


# -- a drafter's options: each once, none empty ----------------------------------------------------------

@pytest.mark.parametrize("drafter, fragments", [
    ("eagle3:draft_vocab=32000,draft_vocab=16000", ["draft_vocab is given twice; give it once"]),  # 16000 ran
    ("eagle3:", ["'eagle3:': an empty option after eagle3", "draft_vocab=N"]),  # ran as eagle3
    ("eagle3:draft_vocab=32000,", ["an empty option after eagle3"]),
    ("selfspec:", ["an empty option after selfspec", "window=B"]),  # said "needs window=B" only by luck
    ("ngram:", ["'ngram:': ngram takes no options; write ngram"]),  # "unknown model None"
])
@pytest.mark.parametrize("command", ["serve-sim", "cost"])
def test_a_drafter_option_given_twice_or_empty_is_refused(tmp_path, monkeypatch, capsys, command, drafter, fragments):
    argv = (*SERVE, "--qps", "2", "--requests", "5") if command == "serve-sim" else COST
    refused(*run_in(tmp_path, monkeypatch, capsys, *argv, "--drafter-model", drafter), f"drafter {drafter!r}", *fragments)


def test_a_drafter_option_given_once_still_reads(capsys):
    status, out, err = run(capsys, *COST, "--drafter-model", "eagle3:draft_vocab=16000", "--drafter-model", "ngram")
    assert status == 0 and "eagle3:draft_vocab=16000" in out, err


# -- a request trace's columns and fields -----------------------------------------------------------------

@pytest.mark.parametrize("name, text, fragments", [
    # the CSV reader kept the last 'prompt_tokens' (3), silently
    ("dup.csv", "arrival_time,prompt_tokens,output_tokens,prompt_tokens\n0,10,5,3\n", ["names the column 'prompt_tokens' twice"]),
    ("case.csv", "arrival_time,Prompt_Tokens,output_tokens,prompt_tokens\n0,10,5,3\n",
     ["names the column twice ('Prompt_Tokens' and 'prompt_tokens')"]),
    ("case.jsonl", json.dumps({"arrival_time": 0, "prompt_tokens": 10, "output_tokens": 5, "PROMPT_TOKENS": 3}) + "\n",
     ["names the column twice ('prompt_tokens' and 'PROMPT_TOKENS')"]),
    # a fourth field was dropped; a short line said "column output_tokens must hold integers; got None"
    ("extra.csv", "arrival_time,prompt_tokens,output_tokens\n0,10,5\n1,10,5,99\n", ["line 3 has 4 field(s); the header has 3"]),
    ("short.csv", "arrival_time,prompt_tokens,output_tokens\n0,10,5\n1,10\n", ["line 3 has 2 field(s); the header has 3",
                                                                                "(arrival_time, prompt_tokens, output_tokens)"]),
])
def test_a_request_trace_naming_a_column_twice_or_with_a_ragged_line_is_refused(tmp_path, monkeypatch, capsys, name, text, fragments):
    trace = tmp_path / name
    trace.write_text(text)
    refused(*run_in(tmp_path, monkeypatch, capsys, *SERVE, "--drafter-model", "eagle3", "--request-trace", str(trace)),
            f"request trace {str(trace)!r}", *fragments)


def test_a_well_formed_trace_still_reads(tmp_path, capsys):
    trace = tmp_path / "ok.csv"
    trace.write_text("Date,Time,PromptTokenCount,CompletionTokenCount\nd,0.5,100,10\n\nd,1.5,200,20\n")  # a blank line is no row
    status, out, err = run(capsys, *SERVE, "--drafter-model", "eagle3", "--request-trace", str(trace), "--json")
    assert status == 0, err
    assert json.loads(out)["requests"] == 2


# -- options that would change nothing beside the one that replaces them --------------------------------

@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text("arrival_time,prompt_tokens,output_tokens\n0,10,5\n0.5,20,5\n")
    return path


@pytest.mark.parametrize("extra, fragments", [
    (("--workload", "sharegpt"), ["--workload sets request lengths", "gives every request's own", "drop --workload or --request-trace"]),
    (("--prompt-len", "fixed:5"), ["--prompt-len sets request lengths"]),
    (("--output-len", "fixed:5"), ["--output-len sets request lengths"]),
])
def test_serve_sim_lengths_beside_a_request_trace_are_refused(tmp_path, monkeypatch, capsys, trace, extra, fragments):
    refused(*run_in(tmp_path, monkeypatch, capsys, *SERVE, "--drafter-model", "eagle3", "--request-trace", str(trace), *extra),
            f"--request-trace {str(trace)!r}", *fragments)


@pytest.mark.parametrize("extra, fragments", [
    # --borrow was dropped where no --acceptance was named (simulate and serve-sim refuse it)
    (("--borrow",), ["--borrow applies to --acceptance NAME"]),
    (("--method", "eagle3", "--alpha", "0.7", "--borrow"), ["--borrow applies to --acceptance NAME"]),
    # the front door kept the trace and dropped the preset, and the duration
    (("--request-trace", "{trace}", "--workload", "sharegpt"), ["--workload sharegpt and --request-trace", "give one"]),
    (("--request-trace", "{trace}", "--duration", "30"), ["--duration 30 applies to a --workload preset's arrivals", "drop --duration"]),
    # an acceptance with no --method to draft: the search is plain decoding only, and the rate was taken silently
    (("--alpha", "0.7"), ["--alpha 0.7 says how often drafts are accepted, but no --method drafts", "add --method NAME:k=K"]),
    (("--acceptance", "eagle3-llama-3.1-8b-vllm-issue20780"), ["--acceptance eagle3-llama-3.1-8b-vllm-issue20780 says how often"]),
])
def test_front_door_options_that_would_change_nothing_are_refused(tmp_path, monkeypatch, capsys, trace, extra, fragments):
    out = tmp_path / "cap"
    extra = [str(trace) if x == "{trace}" else x for x in extra]
    refused(*run_in(tmp_path, monkeypatch, capsys, *FRONT, *extra, "--out", str(out)), *fragments)
    assert not out.exists()


def test_the_front_door_still_takes_a_trace_or_a_preset_with_a_duration(tmp_path, capsys, trace):
    for extra in (("--request-trace", str(trace)), ("--workload", "sharegpt", "--duration", "30")):
        status, out, err = run(capsys, *FRONT, "--method", "eagle3", "--alpha", "0.7", *extra, "--out", str(tmp_path / "cap"), "--check")
        assert status == 0 and "every configuration is valid" in out, err
