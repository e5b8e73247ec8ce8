"""Regressions from the second bad-input trial of the whole CLI (issue 38): each failure class the
trial found, held to the CLI's contract — a bad input is one line on stderr naming the value and
what is valid, exit status 2, no traceback, nothing written; valid input works.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import OPTIONS, SPEC, TABLE, VALID, ends_cleanly
from vllmfiles import write_vllm

from draftsim.analysis.table import format_table
from draftsim.args import ray_address
from draftsim.sim.errors import DraftsimError, as_float_array
from draftsim.sim.traces import EMBEDDED_TRACE
from tests.clirun import run


def _filled(argv, work):
    """A valid invocation of tests/test_fuzz.py's VALID with its files made in ``work``."""
    (work / "spec.toml").write_text(SPEC)
    (work / "table.csv").write_text(TABLE)
    names = {"spec": "spec.toml", "out": "out", "table": "table.csv", "cat": "cat.json"}
    for key, file in names.items():
        argv = [a.replace("{" + key + "}", str(work / file)) for a in argv]
    return argv


def test_capacity_without_a_method_answers_plain_decoding(tmp_path, capsys):
    """The README's first command names no --method: every run is plain decoding (the spec's
    base policy, no policy column in the results), and the answer says so (was a KeyError)."""
    status, out, err = run(capsys, "capacity", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--load", "1", "--slo",
                           "ttft:p99=2s", "--duration", "20", "--replications", "2", "--workers", "1", "--out", str(tmp_path / "out"))
    assert status == 0, err
    assert out.startswith("answer: do not enable speculation: plain decoding needs 1 replica")
    assert "vllm serve meta-llama/Llama-3.1-8B" in out


# -- numbers past Python's int-string limit (4,300 digits): on the command line and in files --------

LONG = st.integers(101, 6000)


@settings(max_examples=int(os.environ.get("FUZZ_CLI_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(VALID)), data=st.data(), digits=LONG,
       prefix=st.sampled_from(["", "-", "0.", "tiny:", "fixed:k=", "eagle3:draft_vocab=", "fixed:", "1e"]))
def test_a_number_of_any_length_in_any_option_ends_cleanly(tmp_path_factory, capsys, name, data, digits, prefix):
    """A run of 101 to 6,000 digits in any option of any model-free subcommand: exit 0, or one line
    and exit 2 naming it — never Python's 'Exceeds the limit (4300 digits)' traceback (serve-sim
    --prompt-len, tiny:SEED in profile/distill/train-head were)."""
    flags = sorted(f for f, takes in OPTIONS[name].items() if takes)
    if not flags:
        return
    flag = data.draw(st.sampled_from(flags))
    work = tmp_path_factory.mktemp("digits")
    argv = _filled(VALID[name], work)
    value = prefix + "9" * digits
    argv = argv[:argv.index(flag) + 1] + [value] + argv[argv.index(flag) + 2:] if flag in argv else argv + [flag, value]
    ends_cleanly(capsys, argv, work)


def test_a_long_number_in_an_option_is_named_with_the_option(capsys):
    status, out, err = run(capsys, "profile", "--model", "tiny:" + "9" * 5000, "--out", "never.json")
    assert status == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert "argument --model" in err and "5,000 digits" in err and "over 100 digits" in err


def _spec_with(tmp_path, line):
    path = tmp_path / "spec.toml"
    path.write_text(line + "\n" + SPEC)
    return str(path)


@pytest.mark.parametrize("kind", ["catalog", "request trace", "trace manifest", "spec", "spec field"])
def test_an_integer_past_the_limit_in_a_file_is_one_line_naming_the_file(tmp_path, capsys, kind):
    """Python's json and tomllib refuse integers of over 4,300 digits with a plain ValueError: every
    reader turns it into one line naming its file (sim.files.parse_json for JSON)."""
    huge = "9" * 5000
    if kind == "catalog":
        path = tmp_path / "cat.json"
        path.write_text('{"models": {"m": {"hidden": %s}}}' % huge)
        argv = ["cost", "--list", "--catalog", str(path)]
    elif kind == "request trace":
        path = tmp_path / "requests.jsonl"
        path.write_text('{"arrival_time": 0, "prompt_len": %s, "output_len": 8}\n' % huge)
        argv = ["serve-sim", "--policy", "ar", "--alpha", "0.8", "--target", "llama-3.1-8b", "--hardware", "h100-sxm",
                "--request-trace", str(path)]
    elif kind == "trace manifest":
        path = tmp_path / "trace"
        shutil.copytree(EMBEDDED_TRACE, path)
        manifest = path / "manifest.json"
        manifest.write_text(manifest.read_text().replace('"version": ', f'"version": {huge}, "old": ', 1))
        argv = ["trace", "info", str(path)]
    elif kind == "spec":
        path = _spec_with(tmp_path, f"seed = {huge}")
        argv = ["sweep", path, "--out", str(tmp_path / "out"), "--check"]
    else:  # within the parser's limit, past float's range
        path = str(tmp_path / "spec.toml")
        Path(path).write_text(SPEC.replace("tokens = 1000", "tokens = " + "9" * 4000))
        argv = ["sweep", path, "--out", str(tmp_path / "out"), "--check"]
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(path) in err or kind == "spec field", err
    assert ("digits" in err) and len(err) < 400, err
    assert not (tmp_path / "out").exists()


@given(st.integers(min_value=2**1024).map(lambda n: n * (-1) ** (n % 2)))
def test_as_float_array_refuses_an_integer_past_float_range(n):
    with pytest.raises(DraftsimError, match="within float range") as info:
        as_float_array("x", n)
    assert len(str(info.value)) < 200


# -- options that a mode ignores are refused, not dropped -------------------------------------------

@pytest.mark.parametrize("flag", ["--profile", "--prefill-profile", "--costs-from"])
def test_check_serve_of_a_vllm_result_refuses_the_trace_cost_options(tmp_path, capsys, flag):
    """--profile, --prefill-profile and --costs-from price a serving trace's replay; with
    --vllm-result they changed nothing (exit 0, the option silently dropped)."""
    result = write_vllm(tmp_path / "result.json")
    status, out, err = run(capsys, "check-serve", "--vllm-result", str(result), "--target", "llama-3.1-8b", "--hardware",
                           "h100-sxm", flag, str(tmp_path / "anything"))
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert flag in err and "--vllm-result" in err


# -- a Ray address checked before anything is written ---------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(min_size=1, max_size=24), st.sampled_from(["-1", "0", "nan", "1e300", "abc", "127.0.0.1", "host:0",
                                                                         "host:99999", "ray://", "http://x:1"])))
def test_a_malformed_ray_address_is_refused_before_the_sweep_starts(tmp_path_factory, capsys, text):
    """Ray's own refusal of a malformed address (ValueError: Invalid address format) came as a
    traceback after the results folder was written."""
    try:
        ray_address("--ray", text)
        return  # a well-formed address: connecting to it is Ray's business
    except DraftsimError:
        pass
    work = tmp_path_factory.mktemp("ray")
    (work / "spec.toml").write_text(SPEC)
    status, out, err = run(capsys, "sweep", str(work / "spec.toml"), "--out", str(work / "out"), "--workers", "1", f"--ray={text}")
    assert status == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert ("NUL byte" if "\x00" in text else "not a Ray cluster address") in err and not (work / "out").exists()


@pytest.mark.parametrize("text", ["", "auto", "local", "127.0.0.1:6379", "ray://head:10001", "head-node.example.com:6379", "[::1]:6379"])
def test_every_ray_address_form_is_accepted(text):
    assert ray_address("--ray", text) == text


@pytest.mark.parametrize("text", ["127.0.0.1:1", "ray://127.0.0.1:1", "[::1]:1"])
def test_a_ray_address_where_nothing_answers_is_refused_before_anything_is_written(tmp_path, capsys, text):
    """A well-formed address with no cluster behind it: ray.init retried for over 2 minutes after
    the results folder was written; now one line, exit 2, nothing written, before the sweep starts."""
    import time

    pytest.importorskip("ray")
    (tmp_path / "spec.toml").write_text(SPEC)
    t0 = time.monotonic()
    status, out, err = run(capsys, "sweep", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "out"), "--workers", "1", f"--ray={text}")
    assert status == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--ray {text}: nothing answers there" in err and not (tmp_path / "out").exists()
    assert time.monotonic() - t0 < 30


# -- checkpoint folders and GGUF files checked before transformers loads them ----------------------

@pytest.fixture(scope="module")
def checkpoint_folder(tmp_path_factory):
    """A real checkpoint: the tiny model and its tokenizer, saved as save_pretrained saves them."""
    from draftsim.realrun.models import tiny_model

    folder = tmp_path_factory.mktemp("ckpt") / "tiny"
    loaded = tiny_model(0)
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder


def test_a_saved_checkpoint_folder_runs(checkpoint_folder, capsys):
    status, out, err = run(capsys, "run", "--target", str(checkpoint_folder), "--n", "1", "--max-new-tokens", "4", "--prompts", "code",
                           "--no-check")
    assert status == 0, err


@pytest.mark.parametrize("change, fragment", [
    ({"num_attention_heads": 0}, "field 'num_attention_heads' is 0"),
    ({"hidden_size": "big"}, "field 'hidden_size' is \"big\""),
    ({"hidden_size": 64.5}, "field 'hidden_size' is 64.5"),
    ({"intermediate_size": float("nan")}, "field 'intermediate_size' is NaN"),
    ({"num_hidden_layers": -2}, "field 'num_hidden_layers' is -2"),
    ({"vocab_size": 10**40}, "field 'vocab_size'"),
    ({"num_key_value_heads": 3}, "a divisor of num_attention_heads (4)"),
    ({"hidden_size": 66, "head_dim": None}, "a multiple of num_attention_heads (4)"),
    ({"num_experts_per_tok": "two", "num_local_experts": 8}, "field 'num_experts_per_tok' is \"two\""),
    ("[1, 2]", "must be a JSON object"),
    ('{"hidden_size": 6', "config.json is not valid JSON"),
    ("tokenizer", "no tokenizer in the checkpoint"),
    ("weights", "no weights in the checkpoint"),
])
@pytest.mark.parametrize("command", ["run", "serve", "record", "profile", "distill", "train-head"])
def test_a_damaged_checkpoint_is_one_line_before_loading(tmp_path, capsys, checkpoint_folder, change, fragment, command):
    """config.json fields as strings, fractions, NaN or 0 heads, a missing tokenizer or weights:
    transformers' TypeError, ZeroDivisionError or tokenizer error came as a traceback after the
    imports; now one line naming the file and field before any model loads."""
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint_folder, folder)
    if change == "tokenizer":
        for name in ("tokenizer.json", "tokenizer.model", "vocab.json"):
            (folder / name).unlink(missing_ok=True)
    elif change == "weights":
        for file in list(folder.glob("*.safetensors")) + list(folder.glob("*.bin")):
            file.unlink()
    elif isinstance(change, str):
        (folder / "config.json").write_text(change)
    else:
        config = json.loads((folder / "config.json").read_text()) | change
        (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    flag = "--model" if command == "profile" else "--target"
    argv = [command, flag, str(folder)] + {"record": ["--drafter", "ngram", "--out", str(tmp_path / "out")],
                                           "profile": ["--out", str(tmp_path / "out.json")], "serve": ["--requests", "2", "--qps", "5"],
                                           "train-head": ["--drafter", "tiny", "--out", str(tmp_path / "out")]}.get(command, [])
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert fragment in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize("data, fragment", [(b"GGUF\x03\x00garbage", "a damaged GGUF file"), (b"PK\x03\x04", "not a GGUF file"),
                                            (b"", "not a GGUF file")])
def test_a_damaged_gguf_file_is_one_line_before_loading(tmp_path, capsys, data, fragment):
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    status, out, err = run(capsys, "run", "--target", str(path), "--no-check")
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err and fragment in err, err


# -- training settings bounded before torch sees them ----------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from([("train-head", "--lr", 10.0), ("train-head", "--w-rej", 1e6), ("distill", "--lr", 10.0),
                             ("distill", "--minutes", 10080.0)]),
       value=st.floats(min_value=1.0, max_value=1.7e308).filter(lambda v: v > 10.0))
def test_a_training_setting_past_its_bound_is_one_line(tmp_path_factory, capsys, case, value):
    """train-head --lr 1e300 was torch's 'value cannot be converted to type float without overflow'
    traceback, --w-rej 1e300 a head of NaNs reported with exit 0, distill --minutes 1e300 a run
    without end; past each bound: one line naming it, before any model loads."""
    command, flag, bound = case
    if value <= bound:
        return
    work = tmp_path_factory.mktemp("train")
    argv = [command, "--target", "tiny", flag, repr(value)] + (["--out", str(work / "head")] if command == "train-head" else [])
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert f"<= {bound:,g}" in err and len(err) < 200, err
    assert not (work / "head").exists()


def test_a_huge_value_is_shown_with_an_exponent(capsys):
    status, _, err = run(capsys, "ewif", "--alpha", "0.5", "--cost", "0.1", "--k", "1e300")
    assert status == 2 and "got 1e+300" in err and len(err) < 200, err


# -- undefined figures are not printed as results --------------------------------------------------

@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=6))
def test_a_table_never_prints_nan_or_hundreds_of_digits(values):
    """A NaN cell (an acceptance rate with no drafts, the SE of one sequence) shows as '-', a huge
    float in exponent form; the tables of every command go through format_table."""
    text = format_table(["metric", "value"], [[f"m{i}", v] for i, v in enumerate(values)])
    assert "nan" not in text.lower()
    assert all(len(cell) <= 24 for line in text.splitlines()[2:] for cell in line.split()), text


@pytest.mark.parametrize("what", ["no drafts", "one sequence"])
def test_undefined_figures_print_as_a_dash(tmp_path, capsys, what):
    """simulate --match 0 (no drafts: no acceptance rate) and the replay of a one-prompt recording
    (no standard error) printed 'nan' as results."""
    if what == "no drafts":
        argv = ["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--tokens", "2000", "--match", "0"]
    else:
        status, _, err = run(capsys, "record", "--target", "tiny", "--drafter", "ngram", "--n", "1", "--max-new-tokens", "8",
                             "--prompts", "code", "--out", str(tmp_path / "rec"))
        assert status == 0, err
        argv = ["replay", "--trace", str(tmp_path / "rec"), "--policy", "fixed:k=2"]
    status, out, err = run(capsys, *argv)
    assert status == 0, err
    assert "nan" not in out.lower(), out
    assert any(line.endswith(" -") for line in out.splitlines()), out


# -- an empty value is not the option left out ------------------------------------------------------

def _plain_options():
    """(command words, flag) of every option whose absence has a meaning (default None, read as text)."""
    import argparse

    from draftsim.cli import build_parser

    out = []

    def walk(parser, words):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for word, sub in action.choices.items():
                    walk(sub, words + [word])
            elif action.option_strings and getattr(action.type, "__name__", None) == "text":
                out.append((tuple(words), action.option_strings[0]))

    walk(build_parser(), [])
    return out


PLAIN = _plain_options()


def test_the_plain_options_are_found():
    flags = {flag for _, flag in PLAIN}
    assert {"--target", "--hardware", "--policy", "--report", "--name", "--dataset", "--probe"} <= flags, flags


@pytest.mark.parametrize("words, flag", PLAIN, ids=[" ".join(w) + " " + f for w, f in PLAIN])
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_value_is_refused_not_taken_as_the_default(tmp_path, capsys, monkeypatch, words, flag, empty):
    """ewif --target '', run --policy=, calibrate --name=, acceptance --dataset=, sweep --report=,
    profile --probe= … each ran as if the option were left out (exit 0); now one line naming it,
    at parse time (before any model or file is touched)."""
    monkeypatch.chdir(tmp_path)
    status, out, err = run(capsys, *words, f"{flag}={empty}")
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert f"{flag} is empty" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_serve_refuses_an_empty_controller_as_serve_sim_does(capsys):
    """serve --controller= ran without a controller (exit 0) where serve-sim refuses it."""
    for command in (["serve", "--target", "tiny", "--requests", "2", "--qps", "5"], ["serve-sim", "--alpha", "0.8", "--policy", "ar"]):
        status, out, err = run(capsys, *command, "--controller=")
        assert status == 2 and out == "" and err.count("\n") == 1 and "empty controller spec" in err, err


def test_an_integer_past_the_limit_in_a_reader_without_its_own_check_names_the_file(tmp_path, capsys):
    """A profile whose version is 5,000 digits (sim/cost/profile.py parses with json.loads and
    catches only JSONDecodeError): the CLI's net turns Python's ValueError into one line naming
    the file the command line gave."""
    profile = tmp_path / "profile.json"
    profile.write_text('{"schema": "draftsim.profile", "version": %s}' % ("9" * 5000))
    status, out, err = run(capsys, "check-sim", str(EMBEDDED_TRACE), "--profile", str(profile))
    assert status == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(profile) in err and "more digits than draftsim reads" in err


@pytest.mark.parametrize("drafters, fragment", [("tiny:1,", "got ''"), (",", "got ''"), ("ngram,ngram", "ngram is given twice")])
def test_run_checks_its_drafter_list_as_serve_and_record_do(capsys, drafters, fragment):
    """run --drafter tiny:1, dropped the empty name and ran (exit 0); serve and record refuse it."""
    status, out, err = run(capsys, "run", "--target", "tiny", "--drafter", drafters, "--no-check")
    assert status == 2 and out == "" and err.count("\n") == 1 and fragment in err, err


def test_run_checks_a_drafter_checkpoint_before_loading(tmp_path, capsys, checkpoint_folder):
    folder = tmp_path / "draft"
    shutil.copytree(checkpoint_folder, folder)
    config = json.loads((folder / "config.json").read_text()) | {"num_attention_heads": 0}
    (folder / "config.json").write_text(json.dumps(config))
    status, out, err = run(capsys, "run", "--target", "tiny", "--drafter", str(folder), "--no-check")
    assert status == 2 and err.count("\n") == 1 and "field 'num_attention_heads' is 0" in err, err


# -- cost-typed options bounded (coefficients, noise, seconds, temperature) ------------------------

COST_OPTIONS = [(("ewif", "--alpha", "0.8"), "--cost"), (("plan", "--drafter", "d:0.8:0.05"), "--mag-cost"),
                (("simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1"), "--verify-per-token"),
                (("simulate", "--policy", "fixed:k=3", "--alpha", "0.8"), "--cost"),
                (("simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1"), "--pred-noise"),
                (("optimize", "tree", "--rank-alphas", "0.6,0.2"), "--draft-cost"),
                (("optimize", "kmatrix", "--alpha", "0.7"), "--cost"),
                (("cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm"), "--overhead"),
                (("run", "--target", "tiny"), "--temperature"), (("serve", "--target", "tiny"), "--temperature")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(COST_OPTIONS), value=st.floats(min_value=1e6, max_value=1.7e308, exclude_min=True))
def test_a_cost_past_a_million_is_one_line(capsys, case, value):
    """simulate --cost 1e300 printed a latency of 1e+300 with an infinite standard error and
    --verify-per-token 1e300 an EWIF of 0.72 ± inf, exit 0: past 1e6 every cost-typed option
    refuses, naming the bound, at parse time."""
    words, flag = case
    status, out, err = run(capsys, *words, flag, repr(value))
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert "<= 1e+06" in err and flag in err, err
