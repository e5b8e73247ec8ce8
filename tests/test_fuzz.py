"""A fuzz suite of our own: random argument vectors and damaged files for every subcommand that
runs without a model, held to the contract of every command.

Each example starts from a valid invocation of a subcommand (``VALID``) and replaces or adds
options drawn from that subcommand's own parser, with values from a pool of hostile ones
(empty, negative, NaN, infinities, huge, non-ASCII digits, malformed specs, folders, devices,
damaged files). The contract, checked in-process in a fresh working folder:

* exit status 0 with something on stdout, or 2 with exactly one line on stderr naming what is
  wrong — never a traceback, never another status (1 is reserved for a sweep whose every run
  failed, which these invocations never start);
* bounded: every invocation ends within ``LIMIT_S`` seconds (an alarm turns a hang into a failure);
* nothing half-written: no hidden temporary files left in the working folder, and a refused
  invocation writes nothing at all.

Real-model subcommands (run, serve, profile, record, train-head, distill, demo) are left to
tests/test_badinput.py, whose cases are rejected before any model loads.

``FUZZ_EXAMPLES=3000`` runs a longer campaign; ``FUZZ_LOG=FILE`` appends every invocation, its
status and its error line to FILE (to see what the campaign covered).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftsim.cli import build_parser, main
from draftsim.sim.traces import EMBEDDED_TRACE

LIMIT_S = 20

#: A valid, cheap invocation of each fuzzed subcommand.
VALID = {
    "ewif": ["ewif", "--alpha", "0.8", "--cost", "0.1"],
    "plan": ["plan", "--drafter", "d:0.8:0.05", "--k-max", "8"],
    "simulate": ["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--tokens", "2000"],
    "cost": ["cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm"],
    "acceptance": ["acceptance"],
    "optimize kmatrix": ["optimize", "kmatrix", "--cost", "0.05", "--alpha", "0.7", "--k-max", "6"],
    "optimize threshold": ["optimize", "threshold", "--alpha", "0.8", "--t-draft", "0.05", "--k-max", "8"],
    "serve-sim": ["serve-sim", "--policy", "fixed:k=3", "--alpha", "0.8", "--target", "llama-3.1-8b", "--drafter-model", "eagle3",
                  "--hardware", "h100-sxm", "--qps", "2", "--requests", "8", "--replications", "1"],
    "replay": ["replay", "--trace", str(EMBEDDED_TRACE), "--policy", "fixed:k=2"],
    "trace info": ["trace", "info", str(EMBEDDED_TRACE)],
    "sweep": ["sweep", "{spec}", "--out", "{out}", "--check"],
    "calibrate": ["calibrate", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--step-table", "{table}", "--out", "{cat}"],
}
SPEC = 'version = 1\nkind = "simulate"\n[base]\npolicy = "fixed:k=3"\ncost = [0.1]\ntokens = 1000\n[grid]\nalpha = [0.6, 0.8]\n'
TABLE = "batch,new_tokens,context,seconds\n" + "".join(f"{b},{n},512,{0.006 + 0.0001 * b * n}\n" for b in (1, 4, 16) for n in (1, 4))

#: Hostile values, and files made per example (``{garbage}``, ``{folder}``, ``{empty}``).
VALUES = ["", "0", "-1", "-0", "nan", "-inf", "inf", "1e309", "1e-320", "2.5", "99999999999999999999", "abc", "１２", "1_000",
          "0x10", "fixed:k=999999", "tree:width=9,depth=9", "fixed", "a:b:c", "1,2,3", ";", "{garbage}", "{folder}", "{empty}",
          "/dev/zero", "/nonexistent/x", "ar", "none", "vllm", "h100-sxm", "llama-3.1-8b", "closed:clients=0", "gamma:cv=-1",
          "lognormal:median=-2,sigma=1", "fixed:0", "uniform:5,1", "table:k=1-4:3,3-:0", "linear:k=-1", "\x00", "%s%n", "../../etc"]


def options_of(words: list[str]) -> dict[str, bool]:
    """The option strings of the subcommand ``words`` names (without --help and --json), each
    with whether it takes a value."""
    parser = build_parser()
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return {s: a.nargs != 0 for a in parser._actions for s in a.option_strings if s.startswith("--") and s not in ("--help", "--json")}


OPTIONS = {name: options_of(name.split()) for name in VALID}


@st.composite
def invocations(draw):
    name = draw(st.sampled_from(sorted(VALID)))
    argv = list(VALID[name])
    for _ in range(draw(st.integers(1, 2)) if OPTIONS[name] else 0):
        flag = draw(st.sampled_from(sorted(OPTIONS[name])))
        if not OPTIONS[name][flag]:
            argv.append(flag)
            continue
        value = draw(st.sampled_from(VALUES))
        if flag in argv:  # the valid invocation's own option: only its value is hostile
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    if draw(st.booleans()):
        argv.append("--json")
    return name, argv


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"over {LIMIT_S} s")


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(invocations())
def test_every_invocation_ends_cleanly(tmp_path_factory, capsys, case):
    name, argv = case
    work = tmp_path_factory.mktemp("fuzz")
    (work / "garbage.json").write_bytes(b"\x89PNG\r\n\x1a\n{not: json" + bytes(range(256)))
    (work / "folder").mkdir()
    (work / "empty.csv").write_text("")
    (work / "spec.toml").write_text(SPEC)
    (work / "table.csv").write_text(TABLE)
    names = {"garbage": "garbage.json", "folder": "folder", "empty": "empty.csv", "spec": "spec.toml", "out": "out", "table": "table.csv",
             "cat": "cat.json"}
    for key, file in names.items():
        argv = [a.replace("{" + key + "}", str(work / file)) for a in argv]
    before = set(os.listdir(work))
    cwd = os.getcwd()
    os.chdir(work)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                status = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                status = exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(cwd)
    out = capsys.readouterr()
    if os.environ.get("FUZZ_LOG"):
        with open(os.environ["FUZZ_LOG"], "a") as fh:
            fh.write(json.dumps([status, argv, out.err.strip()[:200]]) + "\n")
    assert "Traceback" not in out.err, (argv, out.err)
    assert status in (0, 2), (argv, status, out.err)
    if status == 2:
        assert out.err.count("\n") == 1 and out.err.startswith("draftsim"), (argv, out.err)
        assert set(os.listdir(work)) == before, (argv, "a refused invocation wrote", set(os.listdir(work)) - before)
    else:
        assert out.out.strip(), argv
        if "--json" in argv:
            json.loads(out.out)
    left = [f for _, _, files in os.walk(work) for f in files if f.startswith(".") and f.endswith(".tmp")]
    assert not left, (argv, left)
