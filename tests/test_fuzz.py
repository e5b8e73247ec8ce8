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

The same contract holds for the files draftsim reads from outside (the second half of this
module): vllm bench serve results (check-serve, calibrate), acceptance JSONL and Prometheus
scrapes (simulate --acceptance-file) and Hugging Face config.json files (cost --target), each
generated valid, damaged and extreme.

Real-model subcommands (run, serve, profile, record, train-head, distill, demo) are left to
tests/test_badinput.py, whose cases are rejected before any model loads.

``FUZZ_CLI_EXAMPLES=3000`` runs a longer campaign of the commands (by default 300 invocations and 40
files of each format, the fast tier); ``FUZZ_LOG=FILE`` appends every invocation, its
status and its error line to FILE (to see what the campaign covered).

At the end, :class:`TestEveryReaderAtScale` (the slow tier) runs each format's generator through
its reader in-process, ``FUZZ_EXAMPLES`` files of each (default 4,000, the issue's count: 139 s of
CPU for the six readers).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import warnings

import pytest
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


@settings(max_examples=int(os.environ.get("FUZZ_CLI_EXAMPLES", "300")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
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
    ends_cleanly(capsys, argv, work)


def ends_cleanly(capsys, argv: list[str], work) -> tuple[int, str]:
    """Run ``draftsim argv`` in ``work`` and hold it to the contract (module docstring); return
    (status, stderr)."""
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
    return status, out.err


# -- the readers of outside formats: valid, damaged and extreme files --------------------------------
#
# Each example writes one file of a format draftsim reads — a vllm bench serve result, an
# acceptance JSONL, a Prometheus scrape, a Hugging Face config.json — valid (as its producer
# writes it), damaged (a field replaced by a hostile value or removed, an array cut or holding a
# hostile entry, the bytes cut, re-encoded, nested deep, doubled) or extreme, and runs the
# command that reads it, held to the same contract (:func:`ends_cleanly`). ``FUZZ_CLI_EXAMPLES`` sets
# their count too (default :data:`READER_EXAMPLES`: the fast tier).

from vllmfiles import vllm_doc  # noqa: E402

READER_EXAMPLES = int(os.environ.get("FUZZ_CLI_EXAMPLES", "40"))
READER_SETTINGS = settings(max_examples=READER_EXAMPLES, deadline=None,
                           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: Hostile JSON values for a field (NaN and the infinities as Python's json writes them).
JSON_VALUES = ["inf", "nan", "Infinity", float("nan"), float("inf"), float("-inf"), -1, 0, -0.0, 1e-300, 5e-324, 1e300, 2**70,
               10**400, "", "two", "lots", None, True, False, [], {}, [1, "a"], [[]], [[[[[1]]]]], 1.5, 544.67, "１２", "\x00"]


def _hostile(draw, value):
    """``value`` damaged: replaced, or (a list) one entry replaced, cut or emptied."""
    if isinstance(value, list) and value and draw(st.booleans()):
        value = list(value)
        how = draw(st.sampled_from(["entry", "cut", "empty", "grow"]))
        if how == "entry":
            value[draw(st.integers(0, len(value) - 1))] = draw(st.sampled_from(JSON_VALUES))
        elif how == "cut":
            value = value[: draw(st.integers(0, len(value) - 1))]
        elif how == "empty":
            value = []
        else:
            value = value + value[:1]
        return value
    return draw(st.sampled_from(JSON_VALUES))


def _damage_doc(draw, doc: dict, extra_keys=()) -> dict:
    doc = dict(doc)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(doc) + list(extra_keys)))
        if key in doc and draw(st.integers(0, 4)) == 0:
            del doc[key]
        else:
            doc[key] = _hostile(draw, doc.get(key))
    return doc


def _damage_bytes(draw, data: bytes) -> bytes:
    how = draw(st.sampled_from(["cut", "latin1", "nul", "deep", "twice", "bom", "flip"]))
    if how == "cut":
        return data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    if how == "latin1":
        return data.decode("utf-8").replace("e", "\xe9", 1).encode("latin-1", "replace")
    if how == "nul":
        return data + b"\x00"
    if how == "deep":
        n = draw(st.sampled_from([40, 5000, 100_000]))
        return b"[" * n + data + b"]" * n
    if how == "twice":
        return data + b"\n" + data
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    i = draw(st.integers(0, max(len(data) - 1, 0)))
    return data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]


def _dumps(doc) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


@st.composite
def vllm_results(draw):
    """A vllm bench serve result (tests/vllmfiles.py: as vLLM's serve.py writes it) and what
    reads it: check-serve or calibrate."""
    doc = vllm_doc(n=draw(st.integers(1, 12)), failed=draw(st.integers(0, 3)), rate=draw(st.sampled_from(["inf", 0.5, 2.0, 20.0])),
                   max_concurrency=draw(st.sampled_from([None, 1, 4])), prompt=draw(st.lists(st.integers(1, 4000), min_size=1, max_size=4)),
                   output=draw(st.integers(1, 200)), detailed=draw(st.booleans()) or draw(st.booleans()),
                   start_times=draw(st.booleans()), seed=draw(st.integers(0, 9)))
    if draw(st.booleans()):
        doc["spec_decode_per_position_acceptance_rates"] = draw(st.sampled_from([[0.8, 0.6, 0.4], [80.0, 50.0], [0.5]]))
    kind = draw(st.sampled_from(["valid", "field", "field", "bytes"]))
    if kind == "field":
        doc = _damage_doc(draw, doc, extra_keys=("ramp_up_strategy", "p99_ttft_ms"))
    data = _dumps(doc)
    if kind == "bytes":
        data = _damage_bytes(draw, data)
    command = draw(st.sampled_from(["check-serve", "calibrate"]))
    return data, command


@READER_SETTINGS
@given(vllm_results())
def test_every_vllm_result_ends_cleanly(tmp_path_factory, capsys, case):
    data, command = case
    work = tmp_path_factory.mktemp("vllm")
    (work / "result.json").write_bytes(data)
    if command == "check-serve":
        argv = ["check-serve", "--vllm-result", str(work / "result.json"), "--target", "llama-3.1-8b", "--hardware", "h100-sxm"]
        if b"spec_decode_per_position" in data:  # a speculative run: replayed with its acceptance
            argv += ["--drafter-model", "eagle3"]
    else:
        argv = ["calibrate", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--holdout", "0", "--out", str(work / "cat.json")]
        argv += ["--vllm-result", str(work / "result.json")] * 3
    status, err = ends_cleanly(capsys, argv, work)
    if status == 2 and "vllm result" in err:
        assert "result.json" in err, err  # a refusal of the file names it


@st.composite
def acceptance_files(draw):
    """Per-request accepted lengths (JSONL) or a vLLM Prometheus scrape, valid or damaged."""
    if draw(st.booleans()):
        rows = []
        for i in range(draw(st.integers(1, 5))):
            k = draw(st.integers(1, 5))
            key = draw(st.sampled_from(["acc_len", "accepted"]))
            low = 1 if key == "acc_len" else 0
            row = {"id": f"r{i}", key: draw(st.lists(st.integers(low, k + low), min_size=1, max_size=30)), "k": k}
            if draw(st.booleans()):
                row["prompt_len"] = draw(st.integers(0, 5000))
            rows.append(row)
        kk = max(r["k"] for r in rows)
        for r in rows:
            r["k"] = kk
        if draw(st.booleans()):
            i = draw(st.integers(0, len(rows) - 1))
            rows[i] = _damage_doc(draw, rows[i])
        if draw(st.integers(0, 5)) == 0:  # extreme: a short line asking for a huge replay table
            rows.append({"id": "big", "k": 1024, "accepted": [1024] * 20_000})
        data = b"".join(_dumps(r) + b"\n" for r in rows)
    else:
        k = draw(st.integers(1, 4))
        drafts = draw(st.integers(0, 10**6))
        per_pos = sorted(draw(st.lists(st.integers(0, drafts), min_size=k, max_size=k)), reverse=True)
        engines = draw(st.integers(1, 2))
        lines = []
        for e in range(engines):
            lab = f'engine="{e}"'
            lines += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}", f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {drafts * k}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {sum(per_pos)}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}' for i, v in enumerate(per_pos)]
        if draw(st.booleans()):
            i = draw(st.integers(0, len(lines) - 1))
            how = draw(st.sampled_from(["value", "again", "drop", "garbage"]))
            if how == "value":
                name = lines[i].rsplit(" ", 1)[0]
                lines[i] = f"{name} {draw(st.sampled_from(['-1', 'NaN', '+Inf', '1e400', '1.5', '', 'x', '9' * 5000]))}"
            elif how == "again":
                lines.append(lines[i])
            elif how == "drop":
                del lines[i]
            else:
                lines.insert(i, draw(st.sampled_from(["vllm:spec_decode_num_drafts_total{", "# TYPE x counter", "vllm:", "{}"])))
        data = ("# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n" + "\n".join(lines) + "\n").encode()
    if draw(st.integers(0, 3)) == 0:
        data = _damage_bytes(draw, data)
    return data


@READER_SETTINGS
@given(acceptance_files())
def test_every_acceptance_file_ends_cleanly(tmp_path_factory, capsys, data):
    work = tmp_path_factory.mktemp("acc")
    (work / "acc.txt").write_bytes(data)
    ends_cleanly(capsys, ["simulate", "--policy", "fixed:k=1", "--acceptance-file", str(work / "acc.txt"), "--cost", "0.1",
                          "--tokens", "2000"], work)


#: config.json of a dense (Llama-3.1-8B's fields) and a MoE (Qwen3-MoE layout) and an MLA
#: (DeepSeek-V3 layout) target, trimmed to the fields the roofline reads.
CONFIGS = [
    {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
     "max_position_embeddings": 131072, "tie_word_embeddings": False, "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}},
    {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
     "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "num_experts": 128,
     "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1, "mlp_only_layers": []},
    {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61, "num_attention_heads": 128,
     "num_key_value_heads": 128, "vocab_size": 129280, "max_position_embeddings": 163840, "n_routed_experts": 256,
     "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 3, "moe_layer_freq": 1,
     "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
     "num_nextn_predict_layers": 1},
]


@st.composite
def config_files(draw):
    doc = dict(draw(st.sampled_from(CONFIGS)))
    if draw(st.integers(0, 3)):
        doc = _damage_doc(draw, doc, extra_keys=("head_dim", "num_key_value_heads", "is_encoder_decoder", "shared_expert_intermediate_size"))
    data = _dumps(doc)
    if draw(st.integers(0, 4)) == 0:
        data = _damage_bytes(draw, data)
    return data


@READER_SETTINGS
@given(config_files())
def test_every_config_json_ends_cleanly(tmp_path_factory, capsys, data):
    work = tmp_path_factory.mktemp("cfg")
    (work / "m").mkdir()
    (work / "m" / "config.json").write_bytes(data)
    status, err = ends_cleanly(capsys, ["cost", "--target", str(work / "m" / "config.json"), "--hardware", "h100-sxm"], work)
    if status == 2 and "field '" in err:
        assert "config.json" in err, err


#: The metadata fields of a serving trace (draftsim serve's manifest) a damage may touch.
TRACE_KEYS = ["target", "drafter", "policy", "controller", "sampling", "seed", "max_batch", "requests", "kv_tokens", "block_size", "model",
              "machine", "threads", "device", "cache", "scheduling"]


@st.composite
def trace_edits(draw):
    """Edits of a serving trace's metadata (a hand-edited manifest): fields replaced or removed."""
    edits = {}
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(TRACE_KEYS))
        edits[key] = "<missing>" if draw(st.integers(0, 4)) == 0 else draw(st.sampled_from(
            JSON_VALUES + ["static", "ragged", {"layout": "x"}, {"layout": "ragged", "compact_ratio": "x"}, {"layout": "static"},
                           "fixed:k=999999", "tree:width=2,depth=2", "ngram", [[0.0, 8, 4, "x"]], [[0.0, 1e300, 4]]]))
    return edits, draw(st.booleans())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from servetracefiles import serving_trace

    return serving_trace(tmp_path_factory.mktemp("served") / "trace")


@READER_SETTINGS
@given(trace_edits())
def test_every_edited_serving_trace_ends_cleanly(tmp_path_factory, capsys, served, case):
    import shutil

    edits, catalog = case
    work = tmp_path_factory.mktemp("trace")
    trace = work / "trace"
    shutil.copytree(served, trace)
    manifest = json.loads((trace / "manifest.json").read_text())
    for key, value in edits.items():
        if value == "<missing>":
            manifest["metadata"].pop(key, None)
        else:
            manifest["metadata"][key] = value
    (trace / "manifest.json").write_bytes(_dumps(manifest))
    argv = ["check-serve", str(trace)] + (["--target", "llama-3.1-8b", "--hardware", "h100-sxm"] if catalog else [])
    ends_cleanly(capsys, argv, work)


@st.composite
def catalog_files(draw):
    """A user catalog (draftsim.models or draftsim.hardware, as write_catalog writes it), valid or
    with an entry's fields damaged, and the cost invocation that reads it."""
    from draftsim.sim.cost import default_catalog
    from draftsim.sim.cost.catalog import hardware_to_entry, model_to_entry

    cat = default_catalog()
    if draw(st.booleans()):
        entry = model_to_entry(cat.model(draw(st.sampled_from(["llama-3.1-8b", "qwen2.5-0.5b", "deepseek-v3"]))))
        schema, key, name, argv = "draftsim.models", "models", "mine", ["--target", "mine", "--hardware", "h100-sxm"]
    else:
        entry = hardware_to_entry(cat.hardware_spec(draw(st.sampled_from(["h100-sxm", "local-cpu"]))))
        schema, key, name, argv = "draftsim.hardware", "hardware", "mine", ["--target", "llama-3.1-8b", "--hardware", "mine"]
    if draw(st.integers(0, 3)):
        entry = _damage_doc(draw, entry, extra_keys=("aliases", "unsupported", "measured"))
    doc = {"schema": schema, "version": 1, key: {name: entry}}
    if draw(st.integers(0, 5)) == 0:
        doc = _damage_doc(draw, doc)
    data = _dumps(doc)
    if draw(st.integers(0, 5)) == 0:
        data = _damage_bytes(draw, data)
    return data, argv


@READER_SETTINGS
@given(catalog_files())
def test_every_catalog_ends_cleanly(tmp_path_factory, capsys, case):
    data, argv = case
    work = tmp_path_factory.mktemp("cat")
    (work / "cat.json").write_bytes(data)
    ends_cleanly(capsys, ["cost", "--catalog", str(work / "cat.json"), *argv], work)


# -- every reader at CI scale, in-process ------------------------------------------------------------
#
# The generators above, each run FUZZ_EXAMPLES times through the reader itself rather than the
# command around it (a command also simulates what it read). The contract of a reader: it returns,
# or raises a DraftsimError whose message is one line naming the file — never another exception.
# Measured (FUZZ_EXAMPLES=4000, all six readers, /usr/bin/time around pytest on the 2-core
# development machine): 139 s of CPU (5.8 ms an example: generating it, writing it, reading it),
# clean. make test took 7 min 26 s on 2 cores with 2,000 of each (2026-11-26), which leaves room for
# the 4,000 (~70 s of CPU more) inside its 12-minute budget.

SCALE_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "4000"))

from draftsim.sim.errors import DraftsimError  # noqa: E402

SCALE_SETTINGS = settings(max_examples=SCALE_EXAMPLES, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])


def reads_cleanly(read, path, name: str):
    """``read(path)``, held to a reader's contract: success, or one line naming ``name``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return read(path)
        except DraftsimError as exc:
            text = str(exc)
            assert "\n" not in text and name in text, text
            return None


@st.composite
def shard_edits(draw):
    """A sweep shard damaged: its bytes (cut, flipped, inserted, another file's) or its table (a
    column dropped, retyped, nulled; ids out of range, repeated, or another shard's)."""
    how = draw(st.sampled_from(["bytes", "bytes", "table"]))
    if how == "bytes":
        kind = draw(st.sampled_from(["cut", "flip", "flips", "insert", "other"]))
        return kind, draw(st.integers(0, 2**32)), draw(st.integers(1, 16))
    return "table", draw(st.sampled_from(["drop", "retype", "null", "range", "negative", "twice", "other shard", "grow"])), 0


def _damage_shard(edit, data: bytes, table):
    import random

    import pyarrow as pa

    kind, seed, n = edit
    rng = random.Random(seed)
    if kind == "cut":
        return data[: rng.randrange(len(data))]
    if kind in ("flip", "flips"):
        b = bytearray(data)
        for _ in range(1 if kind == "flip" else n):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if kind == "insert":
        i = rng.randrange(len(data))
        return data[:i] + bytes(rng.randrange(256) for _ in range(n)) + data[i:]
    if kind == "other":
        return b"PAR1" + data[: rng.randrange(len(data))][::-1] + b"PAR1"
    how = seed
    task = table.schema.get_field_index("task")
    if how == "drop":
        table = table.drop_columns([table.column_names[-1]])
    elif how == "retype":
        table = table.set_column(task, "task", pa.array([str(t) for t in table.column("task").to_pylist()]))
    elif how == "null":
        table = table.set_column(task, "task", pa.array([None] + table.column("task").to_pylist()[1:], pa.int64()))
    elif how in ("range", "negative", "twice", "other shard"):
        ids = table.column("task").to_pylist()
        ids[0] = {"range": 10**6, "negative": -1, "twice": ids[-1], "other shard": 0}[how]
        table = table.set_column(task, "task", pa.array(ids, pa.int64()))
    else:
        table = pa.concat_tables([table] * 3)
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


@pytest.fixture(scope="module")
def sweep_folder(tmp_path_factory):
    """A finished sweep of 4 tasks in two shards (tasks 0-1, 2-3): the second is damaged per example."""
    import pyarrow.parquet as pq

    from draftsim.analysis import sweep as sw

    base = tmp_path_factory.mktemp("sweep")
    (base / "spec.toml").write_text(SPEC.replace("[0.6, 0.8]", "[0.6, 0.7, 0.8, 0.9]"))
    assert main(["sweep", str(base / "spec.toml"), "--out", str(base / "out"), "--workers", "1", "--json"]) == 0
    table = sw.load(base / "out")
    for shard in (base / "out" / "results").glob("part-*.parquet"):
        shard.unlink()
    pq.write_table(table.slice(0, 2), base / "out" / "results" / "part-000000-a.parquet")
    pq.write_table(table.slice(2, 2), base / "out" / "results" / "part-000001-b.parquet")
    return base / "out", table.slice(2, 2)


@READER_SETTINGS
@given(shard_edits())
def test_every_damaged_sweep_shard_ends_cleanly(capsys, sweep_folder, edit):
    """draftsim sweep --resume over a damaged shard (the fast tier's count)."""
    out, part = sweep_folder
    shard = out / "results" / "part-000001-b.parquet"
    original = shard.read_bytes()
    try:
        shard.write_bytes(_damage_shard(edit, original, part))
        status, err = ends_cleanly(capsys, ["sweep", str(out.parent / "spec.toml"), "--out", str(out), "--resume", "--workers", "1"],
                                   out.parent)
        if status == 2:
            assert "part-000001-b.parquet" in err and ("delete that shard" in err or "start a new" in err), err
    finally:
        shard.write_bytes(original)


@pytest.mark.slow
class TestEveryReaderAtScale:
    """Each format's generator, FUZZ_EXAMPLES files (2,000 by default), read in-process by its reader."""

    @SCALE_SETTINGS
    @given(vllm_results())
    def test_vllm_results(self, tmp_path_factory, case):
        from draftsim.sim.vllm_bench import read_vllm_bench

        path = tmp_path_factory.getbasetemp() / "scale-result.json"
        path.write_bytes(case[0])
        reads_cleanly(read_vllm_bench, path, path.name)

    @SCALE_SETTINGS
    @given(acceptance_files())
    def test_acceptance_files(self, tmp_path_factory, data):
        from draftsim.sim.acceptance_import import load_acceptance_file

        path = tmp_path_factory.getbasetemp() / "scale-acc.txt"
        path.write_bytes(data)
        reads_cleanly(load_acceptance_file, path, path.name)

    @SCALE_SETTINGS
    @given(config_files())
    def test_config_json(self, tmp_path_factory, data):
        from draftsim.sim.cost.catalog import model_from_hf_config

        path = tmp_path_factory.getbasetemp() / "scale-config" / "config.json"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        reads_cleanly(model_from_hf_config, path, "config.json")

    @SCALE_SETTINGS
    @given(catalog_files())
    def test_catalogs(self, tmp_path_factory, case):
        from draftsim.sim.cost.catalog import load_catalog

        path = tmp_path_factory.getbasetemp() / "scale-cat.json"
        path.write_bytes(case[0])
        reads_cleanly(load_catalog, path, path.name)

    @SCALE_SETTINGS
    @given(trace_edits())
    def test_serving_traces(self, tmp_path_factory, served, case):
        import shutil

        from draftsim.analysis.servecheck import check_serve

        edits, _ = case
        trace = tmp_path_factory.getbasetemp() / "scale-trace"
        if not trace.exists():
            shutil.copytree(served, trace)
        manifest = json.loads((served / "manifest.json").read_text())
        for key, value in edits.items():
            if value == "<missing>":
                manifest["metadata"].pop(key, None)
            else:
                manifest["metadata"][key] = value
        (trace / "manifest.json").write_bytes(_dumps(manifest))
        reads_cleanly(check_serve, trace, str(trace))

    @SCALE_SETTINGS
    @given(shard_edits())
    def test_sweep_shards(self, sweep_folder, edit):
        from draftsim.analysis import sweep as sw

        out, part = sweep_folder
        shard = out / "results" / "part-000001-b.parquet"
        original = shard.read_bytes()
        try:
            shard.write_bytes(_damage_shard(edit, original, part))
            table = reads_cleanly(sw.load, out, "part-000001-b.parquet")
            if table is not None:
                assert table.column("task").to_pylist() == [0, 1, 2, 3]
        finally:
            shard.write_bytes(original)
