"""The outside formats' readers held to issue 38's examples: each bad file refused in one line
naming the file and the field, each valid one (as vLLM writes it) read.

vLLM ``bench serve`` results (sim/vllm_bench.py, used by ``check-serve --vllm-result`` and
``calibrate --vllm-result``), step tables and calibration catalogs (sim/cost/calibrate.py).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from clirun import run
from servetracefiles import serving_trace
from vllmfiles import vllm_doc, write_vllm

from draftsim.sim.cost import default_catalog
from draftsim.sim.cost.catalog import write_catalog
from draftsim.sim.errors import DraftsimError
from draftsim.sim.files import json_depth, parse_json
from draftsim.sim.vllm_bench import read_vllm_bench

DEPLOY = ("--target", "llama-3.1-8b", "--hardware", "h100-sxm")


def check_serve(capsys, path, *extra):
    return run(capsys, "check-serve", "--vllm-result", str(path), *DEPLOY, *extra)


def refused(status, out, err, *fragments):
    assert status == 2 and out == "" and "Traceback" not in err, (status, out, err)
    assert len(err.strip().splitlines()) == 1, err
    for f in fragments:
        assert f in err, (f, err)


# -- refused in one line, naming the file and the field ------------------------------------------

@pytest.mark.parametrize("change, fragments", [
    ({"completed": "inf"}, ["'completed'", '"inf"', "whole number"]),
    ({"completed": 1e309}, ["'completed'"]),
    ({"failed": "inf"}, ["'failed'"]),
    ({"max_concurrency": "inf"}, ["'max_concurrency'"]),
    ({"max_concurrency": 0}, ["'max_concurrency'", "from 1"]),
    ({"request_rate": 0}, ["'request_rate' is 0", "a positive rate (requests/s) or 'inf' is valid"]),
    ({"request_rate": -2}, ["'request_rate' is -2"]),
    ({"request_rate": "fast"}, ["'request_rate' is \"fast\""]),
    ({"request_rate": 1e-300}, ["'request_rate' is 1e-300 req/s", "'duration'"]),
    ({"duration": 0}, ["'duration' is 0"]),
    ({"duration": "NaN"}, ["'duration'"]),
    ({"burstiness": 0}, ["'burstiness'"]),
    ({"mean_ttft_ms": -1}, ["'mean_ttft_ms' is -1"]),
    ({"mean_ttft_ms": "slow"}, ["'mean_ttft_ms'"]),
    ({"input_lens": [1e300] * 20}, ["'input_lens' holds 1e+300 at request 0", "whole numbers"]),
    ({"input_lens": [544.5] * 20}, ["'input_lens' holds 544.5"]),
    ({"output_lens": [0] * 20}, ["'output_lens' is 0 for every one of the 20 completed requests"]),
    ({"ttfts": [0.0] * 20}, ["'ttfts' is 0 for every completed request while 'mean_ttft_ms' is not"]),
    ({"itls": [[0.008, -1.0]] * 20}, ["'itls' holds a gap of -1.0"]),
    ({"itls": [0.008] * 20}, ["'itls' holds 0.008 at request 0"]),
    ({"start_times": [0.0] * 19 + [1e9]}, ["'start_times' span", "'duration'"]),
    ({"ttfts": [0.03] * 19}, ["'ttfts' has 19 entries but 'input_lens' has 20"]),
    ({"mean_e2el_ms": 1e9}, ["'mean_e2el_ms' is 1e+09 ms, longer than 'duration'"]),
    ({"latencies": [1.0] * 19 + [1e6]}, ["'latencies' holds 1e+06 s (request 19 of the completed), longer than 'duration'"]),
    ({"spec_decode_per_position_acceptance_rates": [0.5, 0.8]}, ["'spec_decode_per_position_acceptance_rates'", "must not increase"]),
    ({"spec_decode_per_position_acceptance_rates": [180.0]}, ["'spec_decode_per_position_acceptance_rates' holds 180.0"]),
    ({"spec_decode_per_position_acceptance_rates": "0.8"}, ["'spec_decode_per_position_acceptance_rates'"]),
])
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, change, fragments):
    doc = vllm_doc(start_times="start_times" in change or change.get("request_rate") not in (0, 1e-300))
    doc.update(change)
    path = write_vllm(tmp_path / "result.json", doc)
    status, out, err = check_serve(capsys, path, "--drafter-model", "eagle3") if "spec_decode" in str(change) else check_serve(capsys, path)
    refused(status, out, err, "result.json: field ", *fragments)
    assert "--positional" not in err  # a rate inside the file is the file's, never an option the user did not give


@pytest.mark.parametrize("text, fragment", [
    ("[" * 100_000 + "]" * 100_000, "nests arrays or objects 100,000 levels deep"),
    ('{"completed": ' + "1" * 5000 + "}", "holds an integer of more digits than draftsim reads (4,300)"),
    ("{nope", "is not valid JSON"),
    ("[1, 2]", "a result file is a JSON object"),
    (json.dumps(vllm_doc()) + "\n" + json.dumps(vllm_doc()), "several results one after another (vllm bench serve --append-result)"),
])
def test_a_damaged_file_is_one_line(tmp_path, capsys, text, fragment):
    path = tmp_path / "result.json"
    path.write_text(text)
    refused(*check_serve(capsys, path), "result.json", fragment)


def test_a_nan_in_a_step_table_names_the_file_column_and_row(tmp_path, capsys):
    table = tmp_path / "steps.csv"
    table.write_text("batch,new_tokens,context,seconds\n1,1,512,0.006\n4,nan,512,0.007\n16,4,512,0.01\n2,2,2,0.01\n")
    status, out, err = run(capsys, "calibrate", *DEPLOY, "--step-table", str(table), "--out", str(tmp_path / "c.json"))
    refused(status, out, err, "steps.csv", "column 'new_tokens' holds nan at row 2")
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("text, fragment", [
    ("[" * 100_000 + "]" * 100_000, "nests arrays or objects 100,000 levels deep"),
    ('[{"batch": ' + "1" * 5000 + "}]", "holds an integer of more digits"),
    ('[{"batch": 1, "new_tokens": 1, "context": 0, "seconds": 1e400}] ', "column 'seconds' holds inf at row 1"),
])
def test_a_damaged_json_step_table_is_one_line(tmp_path, capsys, text, fragment):
    (tmp_path / "steps.json").write_text(text)
    status, out, err = run(capsys, "calibrate", *DEPLOY, "--step-table", str(tmp_path / "steps.json"), "--out", str(tmp_path / "c.json"))
    refused(status, out, err, "steps.json", fragment)


def test_a_calibration_catalog_with_a_denormal_bandwidth_is_one_line(tmp_path, capsys):
    hw = default_catalog().hardware_spec("h100-sxm")
    write_catalog(tmp_path / "cat.json", hardware={"slow": dataclasses.replace(hw, name="slow", memory_bandwidth=1e-310)})
    table = tmp_path / "steps.csv"
    table.write_text("batch,new_tokens,context,seconds\n1,1,512,0.006\n4,1,512,0.007\n16,4,512,0.01\n2,2,2,0.01\n")
    status, out, err = run(capsys, "calibrate", "--target", "llama-3.1-8b", "--hardware", "slow", "--catalog", str(tmp_path / "cat.json"),
                           "--step-table", str(table), "--out", str(tmp_path / "o.json"))
    refused(status, out, err, "hardware 'slow'", "memory_bandwidth", "non-finite")
    assert not (tmp_path / "o.json").exists()


def test_the_replay_is_bounded(tmp_path, capsys, monkeypatch):
    """A 2-million-request result is refused before the replay, saying the bound (patched down here
    so that the file stays small)."""
    import draftsim.analysis.servecheck as sc

    assert sc.MAX_VLLM_REPLAY == 100_000
    monkeypatch.setattr(sc, "MAX_VLLM_REPLAY", 10)
    refused(*check_serve(capsys, write_vllm(tmp_path / "result.json", n=11)), "result.json: field 'completed' is 11",
            "replays at most 10 requests")


# -- valid files, as vLLM writes them, work --------------------------------------------------------

def test_a_result_with_failed_requests_written_as_vllm_writes_it_is_read(tmp_path, capsys):
    """vLLM writes the per-request arrays for every request sent, a failed one with output 0, TTFT
    0, no gaps and its error: the reader keeps the successful ones."""
    doc = vllm_doc(n=20, failed=3, output=64)
    bench = read_vllm_bench(write_vllm(tmp_path / "result.json", doc))
    assert bench.completed == 20 and bench.failed == 3
    assert len(bench.input_lens) == len(bench.output_lens) == len(bench.ttfts) == len(bench.itls) == len(bench.start_times) == 20
    assert (bench.output_lens == 64).all() and (bench.ttfts > 0).all() and all(len(g) == 63 for g in bench.itls)
    ok = [not e for e in doc["errors"]]
    assert bench.start_times.tolist() == [t for t, good in zip(doc["start_times"], ok) if good]
    status, out, err = check_serve(capsys, tmp_path / "result.json", "--json")
    assert status == 0, err
    rows = {r["metric"]: r for r in json.loads(out)}
    assert all(np.isfinite(r["relative_error"]) for r in rows.values())
    # without 'errors' (an older vLLM), the requests with output 0 are the failed ones
    doc.pop("errors")
    assert read_vllm_bench(write_vllm(tmp_path / "older.json", doc)).completed == 20
    # arrays of the successful requests only are read too
    keep = [i for i, good in enumerate(ok) if good]
    only = {k: ([v[i] for i in keep] if isinstance(v, list) and len(v) == 23 else v) for k, v in doc.items()}
    assert read_vllm_bench(write_vllm(tmp_path / "only.json", only)).completed == 20
    # a count that disagrees with the errors is refused, naming both fields
    doc = vllm_doc(n=20, failed=3)
    doc["completed"] = 21
    doc["failed"] = 2
    refused(*check_serve(capsys, write_vllm(tmp_path / "bad.json", doc)), "bad.json: field 'errors' marks 20", "'completed' is 21")


def test_zero_metrics_are_not_measured_and_never_printed_as_nan(tmp_path, capsys):
    """An endpoint that does not stream: vLLM writes TTFTs of 0 and mean_ttft_ms 0 — no TTFT row,
    no NaN anywhere."""
    doc = vllm_doc()
    doc["ttfts"] = [0.0] * 20
    for stat in ("mean", "median", "p99", "std"):
        doc[f"{stat}_ttft_ms"] = 0.0
    status, out, err = check_serve(capsys, write_vllm(tmp_path / "result.json", doc))
    assert status == 0, err
    assert "nan" not in out.lower() and "ttft" not in out and "tpot_mean" in out


def test_plain_results_with_a_fractional_mean_prompt_calibrate(tmp_path, capsys):
    """Five plain runs whose mean prompt is 544.67 tokens (not a whole number): the prefill point
    is a whole call of 545 tokens."""
    files = []
    for i, (rate, itl) in enumerate([(0.2, 0.0075), (0.5, 0.0076), (4.0, 0.0085), (16.0, 0.0105), (40.0, 0.013)]):
        files += ["--vllm-result", str(write_vllm(tmp_path / f"r{i}.json", n=3, rate=rate, prompt=[544, 545, 545], itl_s=itl))]
    assert read_vllm_bench(tmp_path / "r0.json").input_lens.mean() == pytest.approx(544.67, abs=0.01)
    status, out, err = run(capsys, "calibrate", *DEPLOY, *files, "--holdout", "0", "--out", str(tmp_path / "cat.json"), "--json")
    assert status == 0, err
    assert json.loads(out)["points_fitted"] >= 5


def test_max_concurrency_is_honoured_by_the_replay(tmp_path, capsys):
    """All requests sent at once under a client cap of 2: the replay keeps 2 in flight and times
    TTFT from the send, as vLLM does — not a queue of 40 blamed on the model."""
    from draftsim.analysis.servecheck import vllm_workload
    from draftsim.commands.servesim import ServeSimConfig, serving_config
    from draftsim.sim.serving import serve

    capped = read_vllm_bench(write_vllm(tmp_path / "capped.json", n=40, rate="inf", max_concurrency=2, start_times=False))
    assert capped.max_concurrency == 2
    cfg = serving_config(ServeSimConfig(target="llama-3.1-8b", hardware="h100-sxm", policy="ar", alpha=0.5, requests=40))
    wl = vllm_workload(capped)
    rec = serve(cfg, wl, max_in_flight=2)
    events = sorted([(t, 1) for t in rec.arrival] + [(t, -1) for t in rec.finish], key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([d for _, d in events])) == 2  # never more than the cap in flight
    free = serve(cfg, wl)
    assert np.median(rec.first_token - rec.arrival) < np.median(free.first_token - free.arrival) / 3
    write_vllm(tmp_path / "free.json", n=40, rate="inf", max_concurrency=None, start_times=False)
    ttft = {}
    for name in ("capped", "free"):
        status, out, err = check_serve(capsys, tmp_path / f"{name}.json", "--json")
        assert status == 0, err
        ttft[name] = {r["metric"]: r["predicted"] for r in json.loads(out)}["ttft_p50"]
    assert ttft["capped"] < ttft["free"] / 3


def test_a_speculative_result_names_its_drafter(tmp_path, capsys):
    doc = vllm_doc()
    doc["spec_decode_per_position_acceptance_rates"] = [0.8, 0.6, 0.45]  # fractions, as vLLM's benchmark() writes them
    status, out, err = check_serve(capsys, write_vllm(tmp_path / "result.json", doc), "--drafter-model", "eagle3")
    assert status == 0, err
    assert "no drafter" not in out.splitlines()[0]


# -- the bounded JSON parser (sim/files.py) ---------------------------------------------------------

def test_json_depth_leaves_strings_out_and_parse_json_bounds_it():
    assert json_depth('{"a": [[1], [2, [3]]], "b": "[[[[[[\\"[["}') == 4
    assert json_depth("[" * 50 + "]" * 50) == 50
    assert parse_json('{"a": [1]}', "x") == {"a": [1]}
    with pytest.raises(DraftsimError, match="x nests arrays or objects 33 levels deep; draftsim reads at most 32"):
        parse_json("[" * 33 + "]" * 33, "x")


# -- acceptance files (sim/acceptance_import.py) -----------------------------------------------------

SCRAPE = ('vllm:spec_decode_num_drafts_total{engine="0"} 100\nvllm:spec_decode_num_draft_tokens_total{engine="0"} 300\n'
          'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 150\n'
          + "".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {v}\n'
                    for i, v in enumerate([80, 50, 20])))


@pytest.mark.parametrize("data, fragments", [
    ('{"id": "caf\xe9", "acc_len": [1, 2]}\n'.encode("latin-1"), ["acc.txt is not UTF-8 text (byte 11)"]),
    (('{"id": 1, "acc_len": ' + "[" * 100_000 + "]" * 100_000 + "}\n").encode(), ["acc.txt", "100,001 levels deep", "at most 4"]),
    ((json.dumps({"id": 1, "k": 1024, "accepted": [1024] * 20_000}) + "\n").encode(),
     ["acc.txt", "a replay table of 20,992,000,000 cells (tokens × k); draftsim replays at most 134,217,728"]),
    (('{"id": 1, "acc_len": [' + "1" * 5000 + "]}\n").encode(), ["acc.txt:1: not a JSON object"]),
    ((SCRAPE + SCRAPE).encode(), ["acc.txt:7: the series vllm:spec_decode_num_drafts{engine=\"0\"} appears again (first on line 1)",
                                  "not two engines"]),
    (SCRAPE.replace("num_drafts_total", "num_drafts").encode() + b'vllm:spec_decode_num_drafts_total{engine="0"} 100\n',
     ["appears again"]),
])
def test_bad_acceptance_files_are_one_line_naming_the_file(tmp_path, capsys, data, fragments):
    path = tmp_path / "acc.txt"
    path.write_bytes(data)
    refused(*run(capsys, "simulate", "--policy", "fixed:k=1", "--acceptance-file", str(path), "--cost", "0.1"), *fragments)


def test_two_engines_are_summed_and_one_scrape_is_read(tmp_path, capsys):
    from draftsim.sim.acceptance_import import read_counters

    (tmp_path / "one.txt").write_text(SCRAPE)
    (tmp_path / "two.txt").write_text(SCRAPE + SCRAPE.replace('engine="0"', 'engine="1"'))
    one, two = read_counters(tmp_path / "one.txt"), read_counters(tmp_path / "two.txt")
    assert two.num_drafts == 2 * one.num_drafts and two.accepted_per_pos == tuple(2 * a for a in one.accepted_per_pos)
    assert two.cumulative.tolist() == one.cumulative.tolist() == [0.8, 0.5, 0.2]


# -- Hugging Face config.json (sim/cost/catalog.py model_from_hf_config) -------------------------------

LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}}
MOE_CONFIG = {**LLAMA_CONFIG, "model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768}


@pytest.mark.parametrize("base, change, fragments", [
    (MOE_CONFIG, {"num_experts_per_tok": "two"}, ["field 'num_experts_per_tok' is \"two\"; a whole number"]),
    (MOE_CONFIG, {"num_experts_per_tok": 129}, ["field 'num_experts_per_tok' is 129"]),
    (MOE_CONFIG, {"num_experts": 1e300}, ["field 'num_experts' is 1e+300"]),
    (LLAMA_CONFIG, {"max_position_embeddings": "lots"}, ["field 'max_position_embeddings' is \"lots\""]),
    (LLAMA_CONFIG, {"num_attention_heads": 0}, ["field 'num_attention_heads' is 0"]),
    (LLAMA_CONFIG, {"num_key_value_heads": 0}, ["field 'num_key_value_heads' is 0"]),
    (LLAMA_CONFIG, {"num_key_value_heads": 7}, ["field 'num_key_value_heads' is 7; a divisor of num_attention_heads (32)"]),
    (LLAMA_CONFIG, {"hidden_size": 4096.5}, ["field 'hidden_size' is 4096.5"]),
    (LLAMA_CONFIG, {"num_hidden_layers": True}, ["field 'num_hidden_layers' is true"]),
    (LLAMA_CONFIG, {"vocab_size": [1]}, ["field 'vocab_size' is list"]),
    (LLAMA_CONFIG, {"hidden_size": 16}, ["field 'hidden_size' is 16, less than num_attention_heads"]),
    (LLAMA_CONFIG, {"tie_word_embeddings": "no"}, ["field 'tie_word_embeddings' is \"no\""]),
    (LLAMA_CONFIG, {"rope_scaling": {"a": json.loads("[" * 40 + "]" * 40)}}, ["nests arrays or objects 42 levels deep"]),
])
def test_a_bad_config_json_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, base, change, fragments):
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**base, **change}))
    refused(*run(capsys, "cost", "--target", str(path), "--hardware", "h100-sxm"), "config.json", *fragments)


def test_a_valid_config_json_reads(tmp_path):
    from draftsim.sim.cost.catalog import model_from_hf_config

    (tmp_path / "config.json").write_text(json.dumps({**MOE_CONFIG, "hidden_size": 4096.0}))  # an integral float reads as its integer
    m = model_from_hf_config(tmp_path / "config.json")
    assert (m.hidden, m.experts, m.experts_per_token, m.expert_intermediate, m.kv_heads, m.head_dim) == (4096, 128, 8, 768, 8, 128)


def test_a_draft_vocab_of_thousands_of_digits_is_one_line(capsys):
    refused(*run(capsys, "cost", *DEPLOY, "--drafter", "eagle3:draft_vocab=" + "9" * 5000),
            "draft_vocab must be a whole number from 1 to 10,000,000")


# -- serving traces (analysis/servecheck.py check_serve): a hand-edited manifest --------------------

@pytest.mark.parametrize("key, value, fragment", [
    ("policy", "<missing>", "metadata field 'policy' is missing"),
    ("max_batch", "<missing>", "metadata field 'max_batch' is missing"),
    ("cache", "static", "metadata field 'cache' is 'static'; an object or null is valid"),
    ("model", "smollm2", "metadata field 'model' is 'smollm2'"),
    ("scheduling", 3, "metadata field 'scheduling' is 3"),
    ("policy", "inf", "metadata field 'policy': unknown policy 'inf'"),
    ("policy", "tree:width=2,depth=2", "metadata field 'policy' is 'tree:width=2,depth=2'; a chain policy of at most one drafter"),
    ("controller", "lots", "metadata field 'controller': unknown controller 'lots'"),
])
def test_an_edited_serving_trace_metadata_is_one_line(tmp_path, capsys, key, value, fragment):
    trace = serving_trace(tmp_path / "trace")
    status, out, err = run(capsys, "check-serve", str(trace))
    assert status == 0 and "nan" not in out, err
    manifest = json.loads((trace / "manifest.json").read_text())
    if value == "<missing>":
        del manifest["metadata"][key]
    else:
        manifest["metadata"][key] = value
    (trace / "manifest.json").write_text(json.dumps(manifest))
    refused(*run(capsys, "check-serve", str(trace)), "serving trace", "trace", fragment)


def test_a_plain_result_with_failed_requests_keeps_latencies_and_queue_times(tmp_path, capsys):
    """Without --save-detailed the newest vLLM still writes 'latencies' and 'queue_times' for every
    request sent (its removal list leaves them): a failed request's latency is 0.0."""
    doc = vllm_doc(n=20, failed=3, detailed=False)
    assert "latencies" in doc and "errors" not in doc and len(doc["latencies"]) == 23
    bench = read_vllm_bench(write_vllm(tmp_path / "plain.json", doc))
    assert bench.completed == 20 and not bench.detailed
    refused(*check_serve(capsys, tmp_path / "plain.json"), "plain.json", "save the run with --save-detailed")
