"""The newest readers held to the CLI's contract (issue: the bad-input hunt of the readers a user
brings files to): a bad file or option is one line on stderr naming the file, the field or option
and what is valid, exit status 2, no traceback, nothing written; the valid file still reads.

Measured profiles (``--profile``, sim/cost/profile.py), request traces (``--request-trace``,
sim/serving/workload.py), JSON files with a key given twice (sim/files.py) and pricing options
that would change nothing.
"""

from __future__ import annotations

import json

import pytest
from clirun import run

BIG = int("1" + "0" * 400)  # an integer past float range (JSON holds it; float() overflows)


def refused(status, out, err, *fragments):
    assert status == 2 and out == "" and "Traceback" not in err, (status, out, err)
    assert err.startswith("draftsim") and err.endswith("\n") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


# -- profiles (--profile) ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def profile_doc():
    """A valid profile of llama-3.2-1b measured on this machine (the toy grid of tests/sim/cost/test_profile.py)."""
    import numpy as np

    from draftsim.realrun.profiling import machine_fingerprint
    from draftsim.sim.cost.profile import ProfileCost

    B, N, C = (1, 2, 4), (1, 2, 4, 8), (0, 128, 512)
    b, n, c = np.meshgrid(B, N, C, indexing="ij")
    seconds = 0.01 + 0.001 * b * n + 1e-6 * b * c
    fp = {"model": {"name": "llama-3.2-1b", "dtype": "float32"}, "machine": machine_fingerprint("cpu")}
    prof = ProfileCost("llama-3.2-1b", B, N, C, seconds, spread=seconds * 0.01, repeats=3, fingerprint=fp,
                       drafters={"maxgram": {"seconds_per_token": 1e-5}})
    return prof.to_dict()


def cost_with_profile(capsys, path):
    return run(capsys, "cost", "--target", "llama-3.2-1b", "--hardware", "local-cpu", "--dtype", "float32", "--profile", str(path),
               "--batch", "2", "--drafter-model", "maxgram")


def test_a_valid_profile_prices_the_target_and_the_lookup_drafter(tmp_path, capsys, profile_doc):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_doc))
    status, out, err = cost_with_profile(capsys, path)
    assert status == 0, err
    assert "profile of llama-3.2-1b" in out and "measured proposal time per token" in out


NAN, INF = float("nan"), float("inf")
GRID = (3, 4, 3)


def _filled(value):
    return [[[value] * GRID[2] for _ in range(GRID[1])] for _ in range(GRID[0])]


@pytest.mark.parametrize("change, fragments", [
    # each once a traceback (AttributeError, TypeError, OverflowError) or silently taken
    ({"repeats": INF}, ["'repeats' is inf", "whole number in [1, 1,000,000]"]),
    ({"repeats": -3}, ["'repeats' is -3"]),
    ({"repeats": "x"}, ["'repeats' is 'x'"]),
    ({"fingerprint": "abc"}, ["'fingerprint' is 'abc'", "an object"]),
    ({"fingerprint": {"machine": "x"}}, ["'fingerprint.machine' is 'x'", "an object"]),
    ({"fingerprint": {"model": "x"}}, ["'fingerprint.model' is 'x'"]),
    ({"fingerprint": {"path": ["x"]}}, ["'fingerprint.path' is ['x']", "model, server"]),
    ({"drafters": [1]}, ["'drafters' is [1]", "an object"]),
    ({"drafters": {"maxgram": 5}}, ["'drafters.maxgram' is 5", "seconds_per_token"]),
    ({"drafters": {"maxgram": {}}}, ["'drafters.maxgram' is {}"]),
    ({"drafters": {"maxgram": {"seconds_per_token": "x"}}}, ["'drafters.maxgram'", "'x'"]),
    ({"drafters": {"maxgram": {"seconds_per_token": NAN}}}, ["'drafters.maxgram'", "nan"]),
    ({"model": None}, ["'model' is None", "a non-empty string"]),
    ({"model": {"a": 1}}, ["'model' is {'a': 1}"]),
    ({"dtype": None}, ["'dtype' is None", "a string"]),
    ({"device": 5}, ["'device' is 5", "a string"]),
    ({"version": True}, ["'version' is True", "valid: 1"]),
    ({"batch": [True, 2, 4]}, ["'batch' holds True"]),
    ({"batch": [1, 2, BIG]}, ["'batch' holds an integer of about 401 digits"]),
    ({"context": [0, 128, 2**62]}, ["'context' is [0, 128, 4611686018427387904]", "[0, 16,777,216]"]),
    ({"seconds": _filled(5e-324)}, ["'seconds' holds 4.94066e-324", "seconds in [1e-09, 1e+06]"]),
    ({"seconds": _filled(1e308)}, ["'seconds' holds 1e+308"]),
    ({"spread": _filled(NAN)}, ["'spread' holds nan", "[0, 1e+06]"]),
    ({"last_row_seconds": "x"}, ["'last_row_seconds' holds 'x'"]),
])
def test_a_bad_profile_field_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, profile_doc, change, fragments):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_doc | change))
    refused(*cost_with_profile(capsys, path), f"{path}: profile field ", *fragments)


# -- request traces (--request-trace) ---------------------------------------------------------------

SERVE = ("serve-sim", "--alpha", "0.8", "--target", "llama-3.1-8b", "--drafter-model", "eagle3", "--hardware", "h100-sxm")


@pytest.mark.parametrize("row, fragments", [
    # a JSON integer past float range was an OverflowError traceback; in the time column numpy read its digits as a year
    ({"arrival_time": 0, "prompt_tokens": BIG, "output_tokens": 5}, ["column prompt_tokens must hold integers", "about 401 digits"]),
    ({"arrival_time": BIG, "prompt_tokens": 3, "output_tokens": 5}, ["column arrival_time must hold seconds or dates", "about 401 digits"]),
    # JSON's true was taken as 1 token, or 1 second
    ({"arrival_time": 0, "prompt_tokens": True, "output_tokens": 5}, ["column prompt_tokens must hold integers; got True"]),
    ({"arrival_time": True, "prompt_tokens": 3, "output_tokens": 5}, ["column arrival_time must hold seconds or dates; got True"]),
])
def test_a_bad_request_trace_value_is_one_line_naming_the_column(tmp_path, capsys, row, fragments):
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(row) + "\n")
    refused(*run(capsys, *SERVE, "--request-trace", str(path)), "trace.jsonl", *fragments)


# -- a key given twice (every JSON reader: sim/files.py parse_json; the accepted-lengths JSONL) -------

def test_a_key_given_twice_is_refused_not_taken_last(tmp_path, capsys, profile_doc):
    """JSON parsers keep the last of two values silently (a file edited twice, or two pasted together)."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_doc)[:-1] + ', "repeats": 7}')
    refused(*cost_with_profile(capsys, path), "p.json gives the key 'repeats' twice in one object")
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"arrival_time": 0, "prompt_tokens": 3, "prompt_tokens": 7, "output_tokens": 5}\n')
    refused(*run(capsys, *SERVE, "--request-trace", str(trace)), "trace.jsonl' line 1 gives the key 'prompt_tokens' twice")
    lengths = tmp_path / "acc.jsonl"
    lengths.write_text('{"id": 1, "accepted": [1, 2], "accepted": [3, 3], "k": 3}\n')
    refused(*run(capsys, "simulate", "--policy", "fixed:k=3", "--acceptance-file", str(lengths), "--cost", "0.1"),
            "acc.jsonl:1: gives the key 'accepted' twice")
    nested = tmp_path / "nested.json"  # inside a nested object too
    nested.write_text(json.dumps(profile_doc).replace('"fingerprint": {', '"fingerprint": {"path": "model", "path": "server", ', 1))
    refused(*cost_with_profile(capsys, nested), "gives the key 'path' twice")


def test_parse_json_names_the_repeated_key():
    from draftsim.sim.errors import DraftsimError
    from draftsim.sim.files import parse_json

    assert parse_json('{"a": {"b": 1}, "c": [{"b": 2}, {"b": 3}]}', "x") == {"a": {"b": 1}, "c": [{"b": 2}, {"b": 3}]}
    with pytest.raises(DraftsimError, match="x gives the key 'b' twice in one object"):
        parse_json('{"a": {"b": 1, "b": 2}}', "x")


# -- sweep specs: {start, stop, step} ranges (analysis/sweep/spec.py) --------------------------------

SPEC_HEAD = 'version = 1\nkind = "simulate"\n[base]\ncost = 0.1\npolicy = "fixed:k=2"\n[grid]\n'


@pytest.mark.parametrize("axis, fragments", [
    # a denormal step: the count was inf, an OverflowError traceback
    ("alpha = { start = 0.1, stop = 0.9, step = 5e-324 }", ["[grid] alpha: the range has inf values", "step 5e-324", "give a larger step"]),
    # a tiny step: the count was printed with its 300 digits
    ("alpha = { start = 0.1, stop = 0.9, step = 1e-300 }", ["the range has 8e+299 values", "more than 10,000,000"]),
    # an integer past float range: the range arithmetic overflowed (a traceback)
    ("tokens = { start = 1, stop = 1" + "0" * 400 + ", step = 1 }", ["[grid] tokens.stop must be a number within float range",
                                                                   "about 401 digits"]),
])
def test_a_range_too_long_to_count_is_one_line(tmp_path, capsys, axis, fragments):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC_HEAD + axis + "\n")
    out = tmp_path / "out"
    refused(*run(capsys, "sweep", str(spec), "--out", str(out), "--check"), *fragments)
    assert not out.exists()
