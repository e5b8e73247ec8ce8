"""Every bad input answered cleanly: a table of malformed invocations across every subcommand.

Each case runs ``draftsim.cli.main`` in-process, in a fresh empty working folder, and must give
exit status 2, nothing on stdout, exactly one line on stderr that names the bad value (and what
is valid: the case's fragments), no traceback, and write nothing: the working folder stays
empty, the shared fixture folder is unchanged and every output path the case names is absent
afterwards. Cases that would load a real model are rejected before any model loads (they run
in milliseconds, and no loader output reaches stderr). A few cases that could block or read
forever (a FIFO or a link to /dev/zero as a manifest) also run as subprocesses with a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftsim.cli import main
from draftsim.sim.traces import EMBEDDED_TRACE, RECORDING, RUN

E = str(EMBEDDED_TRACE)
RANGE_ALPHA = "must lie in [0, 1]"
ASCII = "ASCII digits"


#: Well-typed metadata of each trace schema (the cases damage something else, or one field).
VALID_METADATA = {
    RECORDING.name: {"target": {"name": "t"}, "drafters": [], "prompt_set": "code", "max_new_tokens": 8, "top_k": None,
                     "modes": ["greedy"], "seed": None},
    RUN.name: {"target": "t", "drafters": [], "method": "sd", "policy": "fixed:k=1", "rule": "sd", "prompt_set": "code",
               "max_new_tokens": 8, "sampling": "greedy", "seed": None},
}


def _manifest(prompts, schema=RECORDING, version=None, **metadata):
    metadata = VALID_METADATA[schema.name] | metadata
    return {"schema": schema.name, "version": schema.version if version is None else version, "metadata": metadata, "prompts": prompts}


def _entry(key, paths=None, schema=RECORDING):
    paths = paths or {}
    return {"key": key, "files": {name: {"path": paths.get(name, f"{name}/{key}.parquet"), "rows": 1, "sha256": "0" * 64}
                                  for name in schema.tables}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Shared read-only inputs: a file, a folder of other files, and malformed traces."""
    w = tmp_path_factory.mktemp("world")
    (w / "afile.txt").write_text("not a folder\n")
    (w / "nonempty").mkdir()
    (w / "nonempty" / "keep.txt").write_text("keep\n")
    (w / "emptydir").mkdir()

    def trace(name, manifest=None, raw=None):
        folder = w / name
        folder.mkdir()
        if raw is not None:
            (folder / "manifest.json").write_text(raw)
        elif manifest is not None:
            (folder / "manifest.json").write_text(json.dumps(manifest))
        return folder

    trace("list", raw="[]")
    trace("string", raw='"a trace"')
    trace("notjson", raw="{not json")
    trace("noprompts", manifest={"schema": "draftsim.trace", "version": 1, "metadata": {}, "prompts": {}})
    trace("version9", manifest=_manifest([], version=9))
    trace("runtrace", manifest=_manifest([], schema=RUN))
    trace("runescape", manifest=_manifest([_entry("a", {"rounds": "../../../etc/passwd"}, RUN)], schema=RUN))
    trace("runduplicate", manifest=_manifest([_entry("a", schema=RUN), _entry("a", schema=RUN)], schema=RUN))
    trace("escape", manifest=_manifest([_entry("a", {"sequences": "../../../etc/passwd"})]))
    trace("absolute", manifest=_manifest([_entry("a", {"positions": "/etc/passwd"})]))
    link = trace("linkout", manifest=_manifest([_entry("a", {"calls": "calls/a.parquet"})]))
    (link / "calls").mkdir()
    os.symlink("/etc/passwd", link / "calls" / "a.parquet")
    trace("duplicate", manifest=_manifest([_entry("a"), _entry("a")]))
    trace("samefile", manifest=_manifest([_entry("a"), _entry("b", {"calls": "calls/a.parquet"})]))
    bad_rows = _entry("a")
    bad_rows["files"]["sequences"]["rows"] = "1"
    trace("badrows", manifest=_manifest([bad_rows]))
    trace("notentry", manifest=_manifest([["a"]]))
    trace("drafters5", manifest=_manifest([], drafters=5))
    trace("runtokens", manifest=_manifest([], schema=RUN, max_new_tokens="lots"))
    trace("nometadata", manifest={"schema": RUN.name, "version": RUN.version, "metadata": {}, "prompts": []})
    trace("recnometadata", manifest={"schema": RECORDING.name, "version": RECORDING.version, "metadata": {}, "prompts": []})
    fifo = trace("fifo")
    os.mkfifo(fifo / "manifest.json")
    zero = trace("zero")
    os.symlink("/dev/zero", zero / "manifest.json")
    folder = trace("mdir")
    (folder / "manifest.json").mkdir()
    (w / "missingdir").mkdir()  # a trace folder with no manifest
    # a head argument that exists (the head itself is checked only after loading)
    (w / "head").mkdir()
    return w


# (argv with {W} for the fixture folder and {E} for the embedded trace, fragments that must appear in the one-line error)
CASES = [
    # --- command line shape
    ([], ["required: COMMAND"]),
    (["bogus"], ["invalid choice: 'bogus'", "ewif"]),
    (["optimize"], ["required: WHAT"]),
    (["trace"], ["required: ACTION"]),
    (["optimize", "nothing"], ["invalid choice: 'nothing'", "kmatrix"]),
    # --- ewif
    (["ewif", "--alpha", "1.5", "--cost", "0.1"], ["alpha must lie in [0, 1]; got 1.5"]),
    (["ewif", "--alpha", "nan", "--cost", "0.1"], ["alpha must lie in [0, 1]; got nan"]),
    (["ewif", "--alpha", "-inf", "--cost", "0.1"], ["alpha must lie in [0, 1]; got -inf"]),
    (["ewif", "--alpha", "-0.5", "--cost", "0.1"], ["alpha must lie in [0, 1]; got -0.5"]),
    (["ewif", "--alpha", "１", "--cost", "0.1"], ["'１'", ASCII]),
    (["ewif", "--alpha", "0.5", "--cost", "０.1"], ["'０.1'", ASCII]),
    (["ewif", "--alpha", "0.5", "--cost", "1_000"], ["'1_000'", ASCII]),
    (["ewif", "--alpha", "high", "--cost", "0.1"], ["'high'", ASCII]),
    (["ewif", "--alpha", "", "--cost", "0.1"], ["alpha must be a number", "got ''"]),
    (["ewif", "--alpha", "0.5", "--cost", "-1"], ["cost must be a finite cost >= 0; got -1"]),
    (["ewif", "--alpha", "0.5", "--cost", "inf"], ["cost must be a finite cost >= 0; got inf"]),
    (["ewif", "--alpha", "0.5", "--cost", "0.1", "--k", "-2"], ["k must be an integer in [0, 1024]; got -2"]),
    (["ewif", "--alpha", "0.5", "--cost", "0.1", "--k", "2.5"], ["k must be an integer in [0, 1024]; got 2.5"]),
    (["ewif", "--alpha", "0.5", "--cost", "0.1", "--k-max", "100000"], ["k_max must be an integer in [0, 1024]; got 100000"]),
    (["ewif", "--alpha", "0.5", "--cost", "0.1", "--k", "3", "--k-max", "4"], ["--k-max", "not allowed with argument --k"]),
    (["ewif", "--cost", "0.1"], ["required: --alpha"]),
    (["ewif", "--alpha", "0.5", "--cost", "0.1", "--bogus"], ["draftsim ewif: error: unrecognized arguments: --bogus"]),
    # a misspelt option is refused by its command, naming it, with the nearest options
    (["cost", "--target", "llama-3.1-8b", "--overhed", "vllm"], ["draftsim cost: error: unrecognized arguments: --overhed vllm",
                                                                "did you mean --overhead or --overheads"]),
    (["optimize", "tree", "--rank-alphas", "0.5", "--budgt", "8"], ["draftsim optimize tree: error:", "--budgt", "did you mean --budget"]),
    # --- plan
    (["plan", "--drafter", "small:0.7"], ["NAME:ALPHA:COST", "'small:0.7'"]),
    (["plan", "--drafter", "small:x:0.1"], ["'small:x:0.1'", "ALPHA and COST must be numbers"]),
    (["plan", "--drafter", "small:０.7:0.1"], ["'small:０.7:0.1'", ASCII]),
    (["plan", "--drafter", "small:1.7:0.1"], ["alpha of drafter small must lie in [0, 1]; got 1.7"]),
    (["plan", "--drafter", "small:0.7:-0.1"], ["cost of drafter small must be a finite cost >= 0; got -0.1"]),
    (["plan", "--drafter", "a:0.7:0.1", "--drafter", "a:0.6:0.1"], ["drafter names must be distinct"]),
    (["plan", "--drafter", ".x:0.7:0.1"], ["drafter name must hold only letters", "'.x'"]),
    (["plan", "--drafter", "a:0.7:0.1", "--mag-alpha", "2"], ["mag_alpha must lie in [0, 1]; got 2"]),
    (["plan", "--drafter", "a:0.7:0.1", "--mag-cost", "-inf"], ["mag_cost must be a finite cost >= 0; got -inf"]),
    (["plan", "--drafter", "a:0.7:0.1", "--k-max", "-1"], ["k_max must be an integer in [1, 1024]; got -1"]),
    (["plan"], ["required: --drafter"]),
    # a pricing option beside typed costs would change nothing: refused, not ignored (ewif --cost 0.05 --engine sglang once ran)
    (["ewif", "--alpha", "0.8", "--cost", "0.05", "--engine", "sglang"], ["--engine shapes a price taken from models on hardware", "with --cost"]),
    (["ewif", "--alpha", "0.8", "--cost", "0.05", "--tp", "4", "--dtype", "float8"], ["--tp, --dtype shape a price", "leave them out"]),
    (["plan", "--drafter", "a:0.7:0.1", "--kv-dtype", "fp8"], ["--kv-dtype shapes a price", "costs in the --drafter specs"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--cost-batch", "8"], ["--cost-batch shapes a price", "with --cost"]),
    (["simulate", "--policy", "ar", "--alpha", "0.8", "--engine", "vllm"], ["--engine shapes a price", "no hardware named"]),
    (["optimize", "threshold", "--alpha", "0.8", "--t-draft", "0.1", "--t-target", "1", "--mbu", "0.5"], ["--mbu shapes a price", "--t-draft/--t-target"]),
    # the single-stream planners count plain decoding as one target call: an engine pricing it apart is refused (README)
    (["ewif", "--alpha", "0.8", "--target", "llama-3.1-8b", "--drafter-model", "llama-3.2-1b", "--hardware", "h100-sxm", "--engine", "sglang"],
     ["--engine sglang", "use serve-sim or capacity"]),
    # --- simulate
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8"], ["uses 1 drafter(s): give --cost", "got 0"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--cost", "0.2"], ["uses 1 drafter(s): give --cost", "got 2"]),
    (["simulate", "--policy", "ar", "--alpha", "0.8", "--cost", "0.1"], ["policy ar uses 0 drafter(s)", "got 1"]),
    (["simulate", "--policy", "fixed:k=3", "--positional", "", "--cost", "0.1"], ["--positional is empty ('')", "leave --positional out"]),
    (["simulate", "--policy", "fixed:k=3", "--positional", "0.5,,0.3", "--cost", "0.1"], ["--positional", "'0.5,,0.3'"]),
    (["simulate", "--policy", "fixed:k=3", "--positional", "0.5,1.2", "--cost", "0.1"], ["--positional must lie in [0, 1]; got 1.2"]),
    (["simulate", "--policy", "fixed:k=3", "--positional", "0.5,１", "--cost", "0.1"], ["--positional", "'１'", ASCII]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--positional", "", "--cost", "0.1"], ["--positional is empty ('')"]),
    (["simulate", "--policy", "fixed:k=3", "--markov", "0.9", "--cost", "0.1"], ["--markov needs at least 2", "'0.9'"]),
    (["simulate", "--policy", "fixed:k=3", "--markov", "0.9,0.3", "--stay", "0.9", "--cost", "0.1"], ["--stay needs one value per --markov regime (2)", "'0.9'"]),
    (["simulate", "--policy", "fixed:k=3", "--markov", "0.9,0.3", "--stay", "0.9,1.5", "--cost", "0.1"], ["--stay must lie in [0, 1]; got 1.5"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--stay", "0.9", "--cost", "0.1"], ["--stay '0.9' applies to --markov only"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "-inf", "--cost", "0.1"], ["alpha must lie in [0, 1]; got -inf"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--tokens", "1e10", "--executor", "des"],
     ["--tokens 10,000,000,000 with --executor des", "memory", "the budget is", "or fewer"]),
    # one token a round (acceptance 0) keeps a round per token: 836 B each, measured; 13M tokens once passed a
    # 300 B/token estimate made at acceptance 0.8 and would have needed ~11 GB
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0", "--cost", "0.01", "--tokens", "13000000", "--executor", "des"],
     ["--tokens 13,000,000 with --executor des", "memory", "the budget is", "or fewer"]),
    (["simulate", "--policy", "fixed:k=3", "--markov", "0.9,0.3", "--cost", "0.1", "--tokens", "1e10"],
     ["--tokens 10,000,000,000 with --executor mc", "the budget is", "or fewer"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--tokens", "0"], ["tokens must be an integer in [1, 10000000000]; got 0"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--tokens", "１００"], ["'１００'", ASCII]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--pair", "1:0=0.5", "--pair", "1:0=0.6", "--cost", "0.1"],
     ["--pair 1:0=0.6", "already given"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--pair", "１:0=0.5", "--cost", "0.1"], ["'１:0=0.5'", "M:V=A"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--pair", "1:2=0.5", "--cost", "0.1"], ["--pair 1:2=0.5", "need 0 <= V < M"]),
    (["simulate", "--policy", "vertical:n=2,k=3", "--alpha", "0.8", "--pair", "2:1=1.5", "--cost", "0.1", "--cost", "0"],
     ["--pair 2:1=1.5", "must lie in [0, 1]; got 1.5"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--timeline", "/proc/tl.json"],
     ["--timeline '/proc/tl.json'", "cannot create files in '/proc'"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--timeline", "{W}/afile.txt/tl.json"],
     ["afile.txt' is a file, not a folder"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--timeline", "{W}/emptydir"],
     ["emptydir' is a folder; give a file path"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--timeline", "tl.json",
      "--timeline-png", "missing/tl.png"], ["--timeline-png 'missing/tl.png'", "folder 'missing' does not exist"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--timeline-png", "tl.txt"],
     ["--timeline-png 'tl.txt'", "must end with .png"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--timeline", "t.png",
      "--timeline-png", "t.png"], ["name the same file 't.png'"]),
    # a special file of the fixture, never /dev/null: a regression would replace it (atomic rename), as root the device itself
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--timeline", "{W}/fifo/manifest.json"],
     ["manifest.json' exists and is not a regular file"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--timeline", "tl.json"], ["--timeline applies to the discrete-event executor"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--rate", "2"], ["--rate applies to the discrete-event executor"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--sequences", "8"], ["--sequences 8 applies to --executor mc"]),
    (["simulate", "--policy", "warp:k=3", "--alpha", "0.8", "--cost", "0.1"], ["unknown policy 'warp'"]),
    (["simulate", "--policy", "fixed:k=x", "--alpha", "0.8", "--cost", "0.1"], ["k='x' is not a valid value"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "gpu"], ["invalid choice: 'gpu'", "'mc'"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--rank-alphas", "0.5,x"], ["--rank-alphas", "'0.5,x'"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--rank-alphas", "0.5,1.5"], ["--rank-alphas must lie in [0, 1]; got 1.5"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--verify-per-token", "-1"], ["verify_per_token must be a finite cost >= 0; got -1"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--requests", "0"], ["requests must be an integer in [1, 100000]; got 0"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--rate", "0"], ["rate must be finite and > 0; got 0"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--seed", "-1"], ["seed must be an integer >= 0; got -1"]),
    # --- optimize kmatrix / threshold / tree
    (["optimize", "kmatrix", "--cost", "0.1", "--alpha", "1.2"], ["alpha must lie in [0, 1]; got 1.2"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--seed", str(2**70)], ["seed must be an integer below 2**63", "got 1180591620717411303424"]),
    (["optimize", "threshold", "--markov", "0.9,0.3", "--stay", "1,1", "--t-draft", "0.05"], ["regimes {0} and {1}", "stay probability below 1"]),
    (["simulate", "--markov", "0.9,0.3,0.5", "--stay", "1,0.5,1", "--policy", "fixed:k=3"], ["regimes {0} and {2}", "stay probability below 1"]),
    (["optimize", "kmatrix", "--cost", "0.1", "--alpha", "0.8", "--k-max", "50"], ["k_max must be an integer in [0, 20]; got 50"]),
    (["optimize", "kmatrix", "--cost", "0.1", "--cost", "0.1", "--cost", "0.1", "--cost", "0", "--alpha", "0.8"], ["up to 3 drafters; got 4"]),
    (["optimize", "kmatrix", "--cost", "0.1", "--alpha", "0.8", "--pair", "1:0=0.5", "--pair", "1:0=0.4"], ["--pair 1:0=0.4", "already given"]),
    (["optimize", "kmatrix", "--cost", "-1", "--alpha", "0.8"], ["cost must be a finite cost >= 0; got -1"]),
    (["optimize", "kmatrix", "--cost", "0.1"], ["required: --alpha"]),
    (["optimize", "threshold"], ["give exactly one of --alpha or --markov"]),
    (["optimize", "threshold", "--alpha", "0.8", "--markov", "0.9,0.3"], ["give exactly one of --alpha or --markov"]),
    (["optimize", "threshold", "--alpha", "0.8", "--t-draft", "0"], ["t_draft must be finite and > 0; got 0"]),
    (["optimize", "threshold", "--alpha", "0.8", "--sweep", "0.5,0.01,3"], ["--sweep '0.5,0.01,3'", "0 < LO <= HI", "LO 0.5, HI 0.01"]),
    (["optimize", "threshold", "--alpha", "0.8", "--sweep", "0.01,0.4,1000000"], ["1,000,000 sweep points", "the budget is", "fewer sweep points"]),
    (["optimize", "threshold", "--alpha", "0.8", "--sweep", "0.01,0.4"], ["--sweep must be exactly 3", "'0.01,0.4'"]),
    (["optimize", "threshold", "--alpha", "0.8", "--sweep", "0.01,0.4,2.5"], ["N must be an integer in [1, 1000000]; got 2.5"]),
    (["optimize", "threshold", "--alpha", "0.8", "--sweep", "0,0.4,3"], ["0 < LO <= HI", "LO 0,"]),
    (["optimize", "threshold", "--alpha", "0.8", "--sweep", "0.1,0.1,3"], ["LO equals HI, so N must be 1; got 3"]),
    (["optimize", "threshold", "--alpha", "0.8", "--sweep", "0.1,０.2,3"], ["--sweep", "'０.2'", ASCII]),
    (["optimize", "threshold", "--markov", "0.9,0.8,0.7,0.6,0.5,0.4,0.3,0.2", "--k-max", "64"], ["8 regime(s), --k-max 64", "the budget is"]),
    (["optimize", "threshold", "--markov", "0.9,0.8,0.7,0.6", "--k-max", "10", "--pred-noise", "1"], ["--pred-noise with 4 regimes", "--k-max 9 or less"]),
    (["optimize", "threshold", "--alpha", "0.8", "--stay", "0.9"], ["--stay '0.9' applies to --markov only"]),
    (["optimize", "threshold", "--markov", "0.9,1.3"], ["--markov must lie in [0, 1]; got 1.3"]),
    (["optimize", "threshold", "--alpha", "0.8", "--k-max", "0"], ["k_max must be an integer in [1, 128]; got 0"]),
    (["plan", "--drafter", "a:0.5:0.1", "--k-max", "0"], ["k_max must be an integer in [1, 1024]; got 0"]),
    (["optimize", "tree", "--rank-alphas", "0.6,x"], ["--rank-alphas", "'0.6,x'"]),
    (["optimize", "tree", "--rank-alphas", ""], ["--rank-alphas is empty ('')", "leave --rank-alphas out"]),
    (["optimize", "tree", "--rank-alphas", "0.6,1.5"], ["--rank-alphas must lie in [0, 1]; got 1.5"]),
    (["optimize", "tree", "--rank-alphas", "0.6", "--verify-cost", "0,1"], ["--verify-cost '0,1'", "A > 0 and B >= 0; got A 0, B 1"]),
    (["optimize", "tree", "--rank-alphas", "0.6", "--verify-cost", "-1,0.002"], ["--verify-cost '-1,0.002'", "got A -1, B 0.002"]),
    (["optimize", "tree", "--rank-alphas", "0.6", "--verify-cost", "1"], ["--verify-cost must be exactly 2", "'1'"]),
    (["optimize", "tree", "--rank-alphas", "0.6", "--verify-cost", "1,2,3"], ["--verify-cost must be exactly 2", "'1,2,3'"]),
    (["optimize", "tree", "--rank-alphas", "0.6", "--budget", "0"], ["budget must be an integer in [1, 4096]; got 0"]),
    (["optimize", "tree", "--rank-alphas", "0.6", "--draft-cost", "-1"], ["draft_cost must be a finite cost >= 0; got -1"]),
    # --- trace info
    (["trace", "info", "{W}/nothing"], ["no trace at", "nothing (not a folder)"]),
    (["trace", "info", "{W}/afile.txt"], ["no trace at", "afile.txt (not a folder)"]),
    (["trace", "info", "{W}/missingdir"], ["missingdir: manifest.json is missing"]),
    (["trace", "info", "{W}/list"], ["manifest.json holds a JSON list", "a manifest is a JSON object"]),
    (["trace", "info", "{W}/string"], ["manifest.json holds a JSON str", "a manifest is a JSON object"]),
    (["trace", "info", "{W}/notjson"], ["manifest.json is not valid JSON"]),
    (["trace", "info", "{W}/noprompts"], ["lacks its prompts list"]),
    (["trace", "info", "{W}/version9"], ["schema version 9", "reads version 1"]),
    (["trace", "info", "{W}/runtrace"], ["not a draftsim.trace trace", "use draftsim check-sim"]),
    (["trace", "info", "{W}/escape"], ["'../../../etc/passwd'", "outside the trace folder"]),
    (["trace", "info", "{W}/absolute"], ["'/etc/passwd'", "outside the trace folder"]),
    (["trace", "info", "{W}/linkout"], ["'calls/a.parquet' leads outside the trace folder"]),
    (["trace", "info", "{W}/duplicate"], ["prompt 'a' is listed twice"]),
    (["trace", "info", "{W}/samefile"], ["'calls/a.parquet' is listed twice"]),
    (["trace", "info", "{W}/badrows"], ["the sequences entry must have a path, a row count >= 0 and a sha256"]),
    (["trace", "info", "{W}/notentry"], ["manifest prompt 0 is a list, not an object"]),
    (["trace", "info", "{W}/drafters5"], ["metadata drafters must be a list of strings; got 5"]),
    (["check-sim", "{W}/runtokens"], ["metadata max_new_tokens must be an integer >= 1; got \"lots\""]),
    (["trace", "info", "{W}/fifo"], ["manifest.json is not a regular file (a FIFO)"]),
    (["trace", "info", "{W}/zero"], ["manifest.json is not a regular file (a character device)"]),
    (["trace", "info", "{W}/mdir"], ["manifest.json is not a regular file (a folder)"]),
    # --- check-sim
    (["check-sim", "{W}/list"], ["manifest.json holds a JSON list"]),
    (["check-sim", "{E}"], ["not a draftsim.run trace", "use draftsim replay"]),
    (["check-sim", "{W}/nothing"], ["nothing (not a folder)"]),
    (["check-sim", "{W}/runescape"], ["'../../../etc/passwd'", "outside the trace folder"]),
    (["check-sim", "{W}/runduplicate"], ["prompt 'a' is listed twice"]),
    (["check-sim", "{W}/nometadata"], ["metadata lacks", "policy"]),
    (["check-sim", "{E}", "{E}"], ["is given twice; name each run trace once"]),
    (["trace", "info", "{W}/recnometadata"], ["metadata lacks", "target"]),
    (["check-sim", "{W}/zero"], ["not a regular file (a character device)"]),
    # --- replay
    (["replay", "--trace", "{E}", "--policy", "vertical:n=2,k=3", "--drafter", "maxgram", "--drafter", "maxgram"],
     ["names a drafter twice (maxgram, maxgram)"]),
    (["replay", "--trace", "{E}", "--policy", "fixed:k=3", "--drafter", "maxgram", "--drafter", "distilled"],
     ["policy fixed:k=3 uses 1 drafter(s)", "names 2"]),
    (["replay", "--trace", "{E}", "--policy", "fixed:k=3", "--cost", "0.1", "--cost", "0.2"], ["give --cost once per drafter", "got 2"]),
    (["replay", "--trace", "{E}", "--policy", "fixed:k=3", "--drafter", "nope"], ["unknown drafter 'nope'", "distilled", "maxgram"]),
    (["replay", "--trace", "{E}", "--policy", "fixed:k=3", "--kind", "tv"], ["invalid choice: 'tv'", "'prob'"]),
    (["replay", "--trace", "{E}", "--policy", "warp"], ["unknown policy 'warp'"]),
    (["replay", "--trace", "{W}/list", "--policy", "fixed:k=3"], ["manifest.json holds a JSON list"]),
    (["replay", "--trace", "{W}/duplicate", "--policy", "fixed:k=3"], ["prompt 'a' is listed twice"]),
    (["replay", "--trace", "{E}", "--policy", "fixed:k=3", "--cost", "-1"], ["cost must be a finite cost >= 0; got -1"]),
    # --- record (checked before the model loads)
    (["record", "--drafter", "maxgram", "--out", "rec", "--prompts", ""], ["--prompts must be comma-separated prompt sets", "code", "got ''"]),
    (["record", "--drafter", "maxgram", "--out", "rec", "--prompts", "code,nope"], ["unknown prompt set 'nope'", "arithmetic"]),
    (["record", "--drafter", "maxgram", "--out", "rec", "--prompts", "code,code"], ["'code,code' names a prompt set twice"]),
    (["record", "--drafter", "maxgram", "--drafter", "maxgram", "--out", "rec"], ["--drafter maxgram is given twice"]),
    (["record", "--drafter", "nope", "--out", "rec"], ["--drafter 'nope': unknown drafter", "maxgram"]),
    (["record", "--drafter", "maxgram", "--out", "/proc/rec"], ["--out '/proc/rec'", "cannot create files in '/proc'"]),
    (["record", "--drafter", "maxgram", "--out", "{W}/afile.txt"], ["afile.txt' is a file, not a folder"]),
    (["record", "--drafter", "maxgram", "--out", "{E}"], ["already holds a trace", "--resume"]),
    (["record", "--drafter", "maxgram", "--out", "{W}/nonempty"], ["nonempty' is a folder with other files in it"]),
    (["record", "--drafter", "maxgram", "--out", "rec", "--model", "tiny:x"], ["'tiny:x'", "tiny:SEED"]),
    (["record", "--drafter", "maxgram", "--out", "rec", "--device", "gpu"], ["--device must be auto, cpu, cuda or cuda:N; got 'gpu'"]),
    (["record", "--drafter", "maxgram", "--out", "rec", "--n", "0"], ["n must be an integer in [1, 100000]; got 0"]),
    (["record", "--drafter", "maxgram", "--out", "rec", "--top-k", "100"], ["top_k must be an integer in [1, 64]; got 100"]),
    (["record", "--drafter", "maxgram", "--out", "rec", "--split", "dev"], ["invalid choice: 'dev'", "'train'"]),
    # --- distill
    (["distill", "--model", "nope"], ["unknown --target 'nope'", "tiny[:SEED]"]),
    (["distill", "--device", "cuda:x"], ["--device must be auto, cpu, cuda or cuda:N; got 'cuda:x'"]),
    (["distill", "--layers", "0"], ["layers must be an integer in [1, 64]; got 0"]),
    (["distill", "--minutes", "0"], ["minutes must be finite and > 0; got 0"]),
    (["distill", "--minutes", "inf"], ["minutes must be finite and > 0; got inf"]),
    (["distill", "--lr", "-1"], ["lr must be finite and > 0; got -1"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--seed", "1\x001"], ["contains a NUL byte"]),
    (["serve-sim", "--policy", "ar", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--qps", "2", "--prompt-len", "fixed:200000"],
     ["200,000 prompt", "context of 131,072 tokens"]),
    (["cost", "--target", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "3"], ["--tp 3 does not divide", "64 attention heads", "valid: 1, 2, 4"]),
    (["cost", "--target", "llama-2-7b", "--drafter-model", "smollm2-135m", "--hardware", "h100-sxm", "--tp", "2", "--drafter-tp", "2"],
     ["--tp 2 does not divide smollm2-135m's 9 attention heads"]),
    # a drafter without devices of its own: --drafter-tp would change nothing (it was ignored)
    (["cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--drafter-model", "eagle3", "--drafter-tp", "3"],
     ["--drafter-tp 3 sizes a draft model's own devices", "eagle3 has none", "leave --drafter-tp out"]),
    (["cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--drafter-tp", "2"], ["--drafter-tp 2", "no drafter is named"]),
    (["serve-sim", "--alpha", "0.8", "--target", "llama-3.1-8b", "--drafter-model", "ngram", "--hardware", "h100-sxm", "--drafter-tp", "4",
      "--qps", "1"], ["--drafter-tp 4", "ngram has none"]),
    (["cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--batch", ",".join(map(str, range(1, 401))),
      "--new-tokens", ",".join(map(str, range(1, 401))), "--context", ",".join(map(str, range(101)))], ["16,160,000 rows", "at most 100,000"]),
    # --- calibrate
    (["calibrate", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--out", "c.json"], ["exactly one of --profile, --step-table or --vllm-result"]),
    (["calibrate", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--profile", "{W}/afile.txt", "--out", "c.json"], ["afile.txt"]),
    (["calibrate", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--vllm-result", "{W}/nonempty", "--out", "c.json"],
     ["nonempty is not a regular file (a folder)"]),
    (["calibrate", "--target", "nope-9b", "--hardware", "h100-sxm", "--step-table", "{W}/afile.txt", "--out", "c.json"], ["nope-9b"]),
    (["calibrate", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--step-table", "{W}/afile.txt", "--out", "c.txt"], ["c.txt", ".json"]),
    (["check-serve", "--vllm-result", "{W}/afile.txt", "--target", "llama-3.1-8b", "--hardware", "h100-sxm"], ["afile.txt", "not valid JSON"]),
    # --- train-head
    (["train-head", "--out", "."], ["--out '.' is the current folder"]),
    (["train-head", "--out", "{W}/nonempty"], ["nonempty' is a folder with other files and no head"]),
    (["train-head", "--out", "{W}/afile.txt"], ["afile.txt' is a file, not a folder"]),
    (["train-head", "--out", "/proc/head"], ["--out '/proc/head'", "cannot create files in '/proc'"]),
    (["train-head", "--out", "head", "--drafter", "maxgram"], ["--drafter maxgram is not a neural model", "distilled"]),
    (["train-head", "--out", "head", "--drafter", "nope"], ["--drafter 'nope': unknown drafter"]),
    (["train-head", "--out", "head", "--model", "tiny:q"], ["'tiny:q'", "tiny:SEED"]),
    (["train-head", "--out", "head", "--mix", "1.5"], ["mix must lie in [0, 1]; got 1.5"]),
    (["train-head", "--out", "head", "--depth", "17"], ["depth must be an integer in [0, 16]; got 17"]),
    (["train-head", "--out", "head", "--epochs", "0"], ["epochs must be an integer in [1, 10000]; got 0"]),
    (["train-head"], ["required: --out"]),
    # --- run (every argument checked before the model loads)
    (["run", "--prompts", ""], ["--prompts must be comma-separated prompt sets", "got ''"]),
    (["run", "--prompts", "code,nope"], ["unknown prompt set 'nope'"]),
    (["run", "--method", "fast"], ["invalid choice: 'fast'", "'sd'"]),
    (["run", "--method", "ar", "--drafter", "maxgram"], ["method ar takes no --drafter"]),
    (["run", "--policy", "warp"], ["unknown policy 'warp'"]),
    (["run", "--rule", "magic"], ["unknown rule 'magic'"]),
    (["run", "--drafter", "nope"], ["'nope'", "unknown"]),
    (["run", "--method", "csd", "--drafter", "maxgram,maxgram"], ["--drafter maxgram is given twice", "name each drafter once"]),
    (["run", "--policy", "vertical:n=2,k=3"], ["policy vertical:n=2,k=3 uses 2 drafter(s) but --drafter names 1"]),
    (["run", "--method", "csd", "--drafter", "maxgram", "--policy", "fixed:k=3", "--rule", "opt:alpha=0.5"], ["lossless", "opt:alpha=0.5"]),
    (["run", "--head", "{W}/head", "--drafter", "tiny:1"], ["acceptance head drives the threshold policy"]),
    (["run", "--head", "{W}/nohead", "--drafter", "tiny:1", "--policy", "threshold:h=0.7"], ["--head", "nohead: no such file or folder"]),
    (["run", "--trace", "/proc/tr"], ["--trace '/proc/tr'", "cannot create files in '/proc'"]),
    (["run", "--trace", "{W}/afile.txt"], ["afile.txt' is a file, not a folder"]),
    (["run", "--trace", "{W}/nonempty"], ["nonempty' is a folder with other files in it"]),
    (["run", "--resume"], ["--resume needs --trace"]),
    (["run", "--top-k", "5"], ["--top-k applies to sampling"]),
    (["run", "--sequential"], ["--sequential applies to --method cascade"]),
    (["run", "--device", "gpu"], ["--device must be auto, cpu, cuda or cuda:N; got 'gpu'"]),
    (["run", "--model", "tiny:x"], ["'tiny:x'", "tiny:SEED"]),
    (["run", "--model", "nope"], ["'nope'", "tiny[:SEED]"]),
    (["run", "--n", "0"], ["n must be an integer in [1, 10000]; got 0"]),
    (["run", "--temperature", "-1"], ["temperature must be a finite cost >= 0; got -1"]),
    (["run", "--max-new-tokens", "0"], ["max_new_tokens must be an integer in [1, 4096]; got 0"]),
    # --- cost, profile, serving and sweeps (commands built on the same argument checks)
    (["cost", "--batch", "0"], ["batch must be an integer >= 1; got 0"]),
    (["cost", "--batch", "２", "--target", "x", "--hardware", "y"], ["'２'", ASCII]),
    (["cost", "--target", "nope", "--hardware", "nope"], ["unknown hardware 'nope'", "h100-sxm"]),
    (["profile", "--out", "/proc/profile.json", "--model", "tiny"], ["--out '/proc/profile.json'", "cannot create files in '/proc'"]),
    (["profile", "--out", "profile.json", "--repeats", "0"], ["repeats must be an integer in [1, 10000]; got 0"]),
    (["serve", "--qps", "-1"], ["qps must be finite and > 0; got -1"]),
    (["serve", "--prompts", ""], ["--prompts must be comma-separated prompt sets", "got ''"]),
    (["serve-sim", "--alpha", "1.5"], ["alpha must lie in [0, 1]; got 1.5"]),
    (["serve-sim", "--alpha", "0.8", "--target", "llama-3.1-8b", "--drafter-model", "eagle3", "--hardware", "h100-sxm", "--qps", "2",
      "--workload", "sharegtp"], ["unknown workload preset 'sharegtp'", "did you mean sharegpt", "lmsys-chat"]),
    # found by tests/test_fuzz.py: a denormal utilisation made every step infinite and the clock nan (a traceback)
    (["serve-sim", "--alpha", "0.8", "--target", "llama-3.1-8b", "--drafter-model", "eagle3", "--hardware", "h100-sxm", "--qps", "2",
      "--requests", "8", "--mbu", "1e-320"], ["mbu must lie in [1e-06, 1]"]),
    (["cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--mfu", "1e-9"], ["mfu must lie in [1e-06, 1]; got 1e-09"]),
    (["serve-sim", "--qps", "１"], ["'１'", ASCII]),
    (["sweep", "{W}/nothing.toml", "--out", "sw"], ["nothing.toml' is not a file", "TOML"]),
    (["sweep", "{W}/afile.txt", "--out", "sw"], ["afile.txt' is not valid TOML"]),
    (["capacity", "{W}/nothing.toml", "--out", "cap"], ["nothing.toml' is not a file"]),
    # --check checks the outputs a run would write (it returned before them): a figure in a missing folder, a report over a file
    (["capacity", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--slo", "ttft:p99=2s", "--out", "cap",
      "--figure", "{W}/missing/x.png", "--check"], ["--figure", "missing' does not exist; create it first"]),
    (["capacity", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--slo", "ttft:p99=2s", "--out", "cap",
      "--report", "{W}/afile.txt", "--check"], ["--report", "afile.txt' is a file, not a folder"]),
    (["check-serve", "{W}/nothing"], ["no trace at", "nothing (not a folder)"]),
    (["check-serve", "{E}"], ["not a draftsim.serve trace", "use draftsim replay"]),
    (["check-serve", "{W}/list"], ["manifest.json holds a JSON list"]),
    (["cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--drafter-model", "mtp"], ["drafter mtp needs a target", "llama-3.1-8b"]),
    (["cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--drafter-model", "eagle3:vocab=3"], ["unknown option 'vocab=3'", "draft_vocab"]),
    (["serve-sim", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--drafter-model", "selfspec", "--alpha", "0.7", "--requests", "3"],
     ["selfspec needs window=B"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.7", "--match", "2", "--cost", "0.1"], ["--match", "[0, 1]"]),
    (["acceptance", "no-such-entry"], ["unknown acceptance entry 'no-such-entry'", "draftsim acceptance lists them"]),
    (["acceptance", "--method", "lookahead"], ["--method", "'lookahead'"]),
    (["simulate", "--policy", "fixed:k=3", "--alpha", "0.7", "--borrow", "--cost", "0.1"], ["--borrow applies to --acceptance"]),
    (["simulate", "--policy", "fixed:k=1", "--acceptance", "mtp-deepseek-v3-report", "--cost", "0.1"],
     ["reports a range 0.85..0.9", "mtp-deepseek-v3-report@low"]),
    (["simulate", "--policy", "fixed:k=3", "--acceptance", "eagle3-llama-3.1-8b-vllm-issue20780@top", "--cost", "0.1"], ["low or high"]),
    (["cost", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--kv-dtype", "int4"], ["--kv-dtype", "'int4'"]),
    (["simulate", "--policy", "fixed:k=4", "--positional", "0.9,0.8", "--cost", "0.1"], ["gives 2 position(s)", "drafts up to 4"]),
    (["sweep-plot", "{W}/nothing", "--out", "plot.png", "--x", "a", "--metric", "b"], ["holds no sweep", "draftsim sweep"]),
    (["sweep-plot", "{W}/emptydir", "--out", "/proc/plot.png", "--x", "a", "--metric", "b"], ["--out '/proc/plot.png'", "cannot create files"]),
    # --- demo
    (["demo", "--out", "/proc/figs"], ["--out '/proc/figs'", "cannot create files in '/proc'"]),
    (["demo", "--out", "{W}/afile.txt"], ["afile.txt' is a file, not a folder"]),
    (["demo", "--out", "{W}/afile.txt/sub"], ["afile.txt' is a file, not a folder"]),
    (["demo", "--out", ""], ["--out needs a folder path; got ''"]),
]


OUTPUTS = ("--out", "--timeline", "--timeline-png", "--trace")
#: Subcommands without cases here (none: every subcommand has some).
UNCOVERED: set = set()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _argv(case, world) -> list[str]:
    return [arg.replace("{W}", str(world)).replace("{E}", E) for arg in case]


@pytest.mark.slow  # 13.4 s measured (pytest --durations, 2-core machine, total of 301 items)
@pytest.mark.parametrize("argv, fragments", CASES, ids=[f"{i:03d}-{' '.join(c[0][:2]) or 'none'}" for i, c in enumerate(CASES)])
def test_bad_input(argv, fragments, world, tmp_path, monkeypatch, capsys):
    argv = _argv(argv, world)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before = _files(world)
    options = OUTPUTS if argv and argv[0] != "replay" else ()
    outputs = {argv[i + 1]: Path(argv[i + 1]).exists() for i in range(len(argv) - 1) if argv[i] in options and argv[i + 1]}
    t0 = time.perf_counter()
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse usage errors
        status = exc.code
    seconds = time.perf_counter() - t0
    out, err = capsys.readouterr()
    assert status == 2, (status, err)
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert "Traceback" not in err
    assert err.startswith("draftsim"), err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert _files(cwd) == [], "something was written in the working folder"
    assert _files(world) == before, "something was written next to the inputs"
    for target, existed in outputs.items():  # the outputs the case names were not created
        assert existed or not Path(target).exists(), f"{target} was written"
    assert seconds < 10, f"took {seconds:.1f} s: was a model loaded?"


def test_the_table_is_large_and_covers_every_subcommand():
    from draftsim.cli import build_parser

    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    covered = {c[0][0] for c in CASES if c[0]}
    assert commands - covered <= UNCOVERED, commands - covered
    assert len(CASES) >= 100


def test_unwritable_outputs_leave_nothing_written(tmp_path, monkeypatch, capsys):
    """A bad second output is found before the first is written (the JSON timeline used to be
    left behind when the PNG's folder was missing)."""
    monkeypatch.chdir(tmp_path)
    status = main(["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--tokens", "100",
                   "--timeline", "tl.json", "--timeline-png", "missing/tl.png"])
    assert status == 2 and "missing" in capsys.readouterr().err
    assert not (tmp_path / "tl.json").exists() and list(tmp_path.iterdir()) == []


def test_written_files_respect_the_umask(tmp_path, capsys):
    """Atomic writes (temp file + rename) give the file the umask's mode, not mkstemp's 0600."""
    old = os.umask(0o022)
    try:
        status = main(["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--tokens", "200",
                       "--timeline", str(tmp_path / "tl.json")])
    finally:
        os.umask(old)
    capsys.readouterr()
    assert status == 0
    assert (tmp_path / "tl.json").stat().st_mode & 0o777 == 0o644


def _script(*argv, timeout=30):
    script = Path(sys.executable).with_name("draftsim")
    return subprocess.run([str(script), *argv], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.slow  # 5.5 s measured (pytest --durations, 2-core machine)
@pytest.mark.parametrize("name, fragment", [("fifo", "(a FIFO)"), ("zero", "(a character device)")])
def test_special_manifests_neither_block_nor_read_forever(world, name, fragment):
    """A FIFO would block ``open``; a link to /dev/zero would never end: both are refused at once."""
    t0 = time.perf_counter()
    done = _script("trace", "info", str(world / name), timeout=30)
    assert time.perf_counter() - t0 < 30
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and fragment in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow  # 5.9 s measured (pytest --durations, 2-core machine)
def test_negative_values_are_checked_not_missing():
    """``--alpha -inf`` is the bad value -inf, not a missing argument (also through the script)."""
    done = _script("optimize", "tree", "--rank-alphas", "0.6", "--verify-cost", "-1,0.002")
    assert done.returncode == 2 and "expected one argument" not in done.stderr
    assert "got A -1, B 0.002" in done.stderr and done.stderr.count("\n") == 1


def test_oversized_manifest_is_refused_without_reading_it(monkeypatch, capsys):
    import draftsim.sim.traces
    monkeypatch.setattr(draftsim.sim.traces, "MANIFEST_MAX_BYTES", 100)
    assert main(["trace", "info", E]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "draftsim reads at most 100" in err


def test_a_write_that_fails_after_the_checks_is_one_line(tmp_path, monkeypatch, capsys):
    """A write that passes the checks but fails anyway (disk full) is reported, not raised."""
    import errno

    from draftsim.sim.simulate import SimResult

    def full(self, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(SimResult, "save_timeline", full)
    status = main(["simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--cost", "0.1", "--executor", "des", "--tokens", "100",
                   "--timeline", str(tmp_path / "tl.json")])
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and err.count("\n") == 1
    assert "tl.json" in err and "No space left on device" in err and "Traceback" not in err


def test_cuda_without_cuda_is_blamed_on_the_device_not_the_model_name(capsys):
    """``run --target tiny:2 --device cuda`` on a machine without CUDA once said "tiny models are
    named tiny or tiny:SEED" (DraftsimError is a ValueError, caught around the device check)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the device is valid")
    from draftsim.cli import main

    assert main(["run", "--target", "tiny:2", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device 'cuda' requested but CUDA is not available" in err and "tiny models" not in err, err
