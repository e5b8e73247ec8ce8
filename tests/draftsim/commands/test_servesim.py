"""``draftsim serve-sim``: JSON keys, the QPS sweep and its crossover, and bad input — one line on
stderr, exit status 2, nothing written."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from clirun import run
from toy import write_hand_trace

BASE = ("serve-sim", "--target", "llama-2-7b", "--drafter", "smollm2-135m", "--hardware", "h100-sxm", "--alpha", "0.8")


def test_json_keys_and_outputs(capsys, tmp_path):
    tl, fig, load = tmp_path / "tl.json", tmp_path / "cdf.png", tmp_path / "load.png"
    status, out, err = run(capsys, *BASE, "--qps", "4", "--requests", "40", "--prompt-len", "uniform:64,256", "--output-len", "fixed:64",
                           "--replications", "2", "--slo-ttft", "0.5", "--slo-tpot", "0.05", "--timeline", str(tl), "--figure", str(fig),
                           "--load-figure", str(load), "--json")
    assert status == 0, err
    data = json.loads(out)
    for key in ("ttft", "tpot", "itl", "e2e"):
        assert set(data[key]) >= {"mean", "p50", "p90", "p99"}
        assert 0 < data[key]["p50"] <= data[key]["p99"]
        assert data["ci95"][key]["mean"] >= 0
    assert data["throughput"] > 0 and data["goodput"] > 0
    sd = data["spec_decode"]
    assert {"num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos", "mean_acceptance_length"} <= set(sd)
    assert data["replications"] == 2
    trace = json.loads(tl.read_text())
    assert trace["otherData"]["schema"] == "draftsim.serving-timeline"
    assert {e["ph"] for e in trace["traceEvents"]} >= {"X", "C", "M"}
    assert fig.stat().st_size > 1000 and load.stat().st_size > 1000


def test_sweep_marks_the_crossover(capsys, tmp_path):
    fig = tmp_path / "sweep.png"
    status, out, err = run(capsys, "serve-sim", "--target", "llama-2-70b", "--tp", "4", "--drafter", "llama-2-7b", "--drafter-tp", "1", "--hardware", "h100-sxm",
                           "--alpha", "0.8", "--requests", "60", "--output-len", "fixed:128", "--sweep-qps", "0.5,2,8,32",
                           "--replications", "1", "--figure", str(fig))
    assert status == 0, err
    assert "crossover" in out and fig.exists()
    status, out, _ = run(capsys, "serve-sim", "--target", "llama-2-70b", "--tp", "4", "--drafter", "llama-2-7b", "--drafter-tp", "1", "--hardware", "h100-sxm",
                         "--alpha", "0.8", "--requests", "60", "--output-len", "fixed:128", "--sweep-qps", "0.5,2,8,32",
                         "--replications", "1", "--json")
    data = json.loads(out)
    speedups = [r["speedup"] for r in data["sweep"]]
    assert speedups[0] > 1 > speedups[-1]
    assert 0.5 < data["crossover_qps"] < 32


@pytest.mark.parametrize("extra, message", [
    (("--qps", "0", "--requests", "5"), "qps must be finite and > 0"),
    (("--qps", "-3", "--requests", "5"), "qps must be finite and > 0"),
    (("--qps", "nan", "--requests", "5"), "qps must be finite and > 0"),
    (("--qps", "2", "--requests", "0"), "requests must be an integer"),
    (("--qps", "2", "--duration", "-1"), "duration must be finite and > 0"),
    (("--qps", "2", "--requests", "5", "--prompt-len", "fixed:0"), "--prompt-len"),
    (("--qps", "2", "--requests", "5", "--output-len", "uniform:50,10"), "lo <= hi"),
    (("--qps", "2", "--requests", "5", "--output-len", "lognormal:median=-2,sigma=1"), "median must be finite and > 0"),
    (("--qps", "2", "--requests", "5", "--slo-tpot", "0"), "slo_tpot must be finite and > 0"),
    (("--qps", "2", "--requests", "5", "--kv-tokens", "300"), "memory too small for one request"),
    (("--qps", "2", "--requests", "5", "--controller", "table:k=1-4:3,6-:0"), "gap"),
    (("--qps", "2", "--requests", "5", "--controller", "table:k=1-4:3,3-:0"), "overlap"),
    (("--qps", "2", "--requests", "5", "--arrivals", "gamma:cv=-1"), "cv must be finite and > 0"),
    (("--requests", "5"), "open-loop arrivals need --qps"),
    (("--qps", "2", "--requests", "5", "--sweep-qps", "1,2"), "--sweep-qps replaces --qps"),
    (("--qps", "1000", "--duration", "100000"), "the budget is"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(capsys, tmp_path, extra, message):
    tl = tmp_path / "tl.json"
    status, out, err = run(capsys, *BASE, *extra, "--timeline", str(tl))
    assert status == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert not tl.exists() and out == ""


def test_memory_too_small_for_the_weights(capsys):
    status, _, err = run(capsys, "serve-sim", "--target", "llama-2-70b", "--hardware", "h100-sxm", "--alpha", "0.8", "--policy", "ar",
                         "--qps", "1", "--requests", "5")
    assert status == 2 and "does not fit" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text, message", [
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n", "no output tokens column"),
    ("Time,PromptTokenCount,CompletionTokenCount\n2.0,10,10\n1.0,10,10\n", "must be sorted"),
    ("Time,PromptTokenCount,CompletionTokenCount\n-1.0,10,10\n", "finite and >= 0"),
])
def test_bad_request_traces(capsys, tmp_path, text, message):
    trace = tmp_path / "trace.csv"
    trace.write_text(text)
    status, out, err = run(capsys, *BASE, "--request-trace", str(trace))
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""


def test_request_trace_replay(capsys, tmp_path):
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{10 + i // 2:02d}.{(i % 2) * 5}000000,{100 + 13 * i},{20 + 7 * i}\n" for i in range(20)))
    status, out, err = run(capsys, *BASE, "--request-trace", str(trace), "--replications", "1", "--json")
    assert status == 0, err
    assert json.loads(out)["requests"] == 20


def test_acceptance_trace_each_request_replays_a_recorded_sequence(capsys, tmp_path):
    """The hand-written trace of tests/sim/test_traces.py: with fixed k = 2, sequence 0 (flags
    1,1,0,1,1,0) takes 2 rounds accepting 4 of 4 drafted, sequence 1 (0,1,1,1) 2 rounds
    accepting 2 of 4; four requests replay sequences 0, 1, 0, 1."""
    write_hand_trace(tmp_path / "syn")
    status, out, err = run(capsys, "serve-sim", "--target", "llama-2-7b", "--drafter", "smollm2-135m", "--hardware", "h100-sxm",
                           "--acceptance-trace", str(tmp_path / "syn"), "--policy", "fixed:k=2", "--qps", "1", "--requests", "4",
                           "--replications", "1", "--json")
    assert status == 0, err
    sd = json.loads(out)["spec_decode"]
    assert (sd["num_drafts"], sd["num_draft_tokens"], sd["num_accepted_tokens"]) == (8, 16, 12)
    assert json.loads(out)["output_tokens"] == 2 * (7 + 5)
    status, _, err = run(capsys, "serve-sim", "--target", "llama-2-7b", "--drafter", "smollm2-135m", "--hardware", "h100-sxm",
                         "--acceptance-trace", str(tmp_path / "syn"), "--alpha", "0.8", "--qps", "1", "--requests", "4")
    assert status == 2 and "drop --alpha" in err


def test_request_trace_with_a_byte_order_mark_through_a_pipe_and_from_a_device(capsys, tmp_path):
    """A spreadsheet's CSV starts with a UTF-8 BOM; a pipe can be read once; /dev/zero is no file."""
    text = "Time,PromptTokenCount,CompletionTokenCount\n0.0,100,20\n0.5,120,30\n1.5,90,25\n"
    plain, bom = tmp_path / "plain.csv", tmp_path / "bom.csv"
    plain.write_text(text)
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    outputs = []
    for trace in (plain, bom):
        status, out, err = run(capsys, *BASE, "--request-trace", str(trace), "--replications", "1", "--json")
        assert status == 0, err
        outputs.append(json.loads(out))
    assert outputs[0]["requests"] == outputs[1]["requests"] == 3
    assert outputs[0]["ttft"] == outputs[1]["ttft"] and outputs[0]["e2e"] == outputs[1]["e2e"]
    piped = subprocess.run([sys.executable, "-m", "draftsim.cli", *BASE, "--request-trace", "/dev/stdin", "--replications", "1", "--json"],
                           input=text, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["e2e"] == outputs[0]["e2e"]
    status, out, err = run(capsys, *BASE, "--request-trace", "/dev/zero")
    assert status == 2 and out == "" and err.strip().splitlines() == [
        "draftsim serve-sim: error: request trace /dev/zero is not a regular file (a character device); give a file or a pipe"]


def test_defaults_a_user_expects(capsys):
    """No --requests or --duration: a default request count; --policy ar needs no acceptance; the
    goodput line only when an SLO was given; no 15-digit maxima."""
    status, out, err = run(capsys, "serve-sim", "--policy", "ar", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--qps", "4",
                           "--replications", "1")
    assert status == 0, err
    assert "goodput" not in out and "1000 requests each" in out
    assert not re.search(r"\d\.\d{6,}", out), out  # no runaway decimals
    status, out, err = run(capsys, "serve-sim", "--policy", "ar", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--qps", "4",
                           "--requests", "50", "--replications", "1", "--slo-ttft", "0.5")
    assert status == 0 and "goodput" in out and "within the SLOs" in out


def test_simulate_speaks_seconds_when_hardware_prices_the_calls(capsys):
    status, out, err = run(capsys, "simulate", "--policy", "fixed:k=4", "--alpha", "0.8", "--target", "llama-3.1-8b", "--drafter-model",
                           "eagle3", "--hardware", "h100-sxm", "--tokens", "5000")
    assert status == 0, err
    line = next(x for x in out.splitlines() if x.startswith("on h100-sxm:"))
    ms = float(line.split()[2])
    assert 1.0 < ms < 6.431 and "tokens/s per sequence" in line  # faster than one 6.431 ms target call per token
    status, out, err = run(capsys, "simulate", "--policy", "fixed:k=4", "--markov", "0.9,0.3", "--cost", "0.1", "--tokens", "2000")
    assert status == 0 and "transition=[[0.95, 0.05], [0.05, 0.95]]" in out


def test_a_speculative_run_on_a_gpu_says_how_far_speedups_like_it_were_off(capsys):
    """serve-sim's model error: the published points like the run (sim/evidence.py) printed and in
    --json, for a single load and a sweep; none for plain decoding or on this CPU."""
    from draftsim.sim.evidence import evidence_for, overall

    args = ("serve-sim", "--target", "llama-3.1-8b", "--drafter-model", "eagle3", "--hardware", "h100-sxm", "--alpha", "0.7",
            "--requests", "20", "--output-len", "fixed:32")
    status, out, err = run(capsys, *args, "--qps", "2", "--json")
    assert status == 0, err
    doc = json.loads(out)
    like = evidence_for("eagle3", False, "vllm", "h100-sxm", doc["mean_batch"])  # one load: matched at the run's mean batch too
    assert "batch" in like.matched and doc["mean_batch"] < 2.5  # 2 req/s of 32 tokens: near batch 1, where 7 published runs are
    error = doc["model_error"]
    assert error["text"] == like.text() and error["overall"]["points"] == overall().points
    status, out, err = run(capsys, *args, "--qps", "2")
    assert status == 0 and f"model error: {like.text()}; over all {overall().points} published runs" in out
    status, out, err = run(capsys, *args, "--sweep-qps", "1,2")  # a sweep's loads run at several batches: not matched on one
    assert status == 0 and f"model error: {evidence_for('eagle3', False, 'vllm', 'h100-sxm').text()}" in out
    assert "model error at its batch (median / worst, runs)" in out  # ... and each load's row at its own mean batch
    status, out, err = run(capsys, *args, "--sweep-qps", "1,2", "--json")
    assert status == 0, err
    for row in json.loads(out)["sweep"]:
        at = evidence_for("eagle3", False, "vllm", "h100-sxm", row["spec"]["mean_batch"])
        assert row["model_error"]["text"] == at.text() and row["model_error"]["matched_on"] == list(at.matched)
    status, out, err = run(capsys, *args, "--qps", "2", "--policy", "ar", "--json")
    assert status == 0 and json.loads(out)["model_error"] is None
    status, out, err = run(capsys, "serve-sim", "--target", "llama-3.2-1b", "--drafter-model", "maxgram", "--hardware", "local-cpu",
                           "--dtype", "float32", "--alpha", "0.7", "--requests", "10", "--output-len", "fixed:8", "--qps", "2", "--json")
    assert status == 0 and json.loads(out)["model_error"] is None, err
