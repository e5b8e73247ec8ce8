"""Acceptance from outside: vLLM spec-decode counters and per-request accepted lengths."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim import acceptance_rates as R
from draftsim.sim.acceptance_import import SpecDecodeCounters, StepLengths, load_acceptance_file, read_counters, read_step_lengths
from draftsim.sim.errors import DraftsimError

MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'


def scrape(drafts, draft_tokens, per_pos, engines=1, suffix="_total", accepted=None) -> str:
    """A Prometheus text scrape of vLLM's spec-decode counters, split over ``engines`` series."""
    lines = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.", "# TYPE vllm:spec_decode_num_drafts_total counter"]
    split = lambda x, e: x // engines + (x % engines if e == 0 else 0)  # noqa: E731
    accepted = sum(per_pos) if accepted is None else accepted
    for e in range(engines):
        lab = f'engine="{e}",{MODEL}'
        lines += [f"vllm:spec_decode_num_drafts{suffix}{{{lab}}} {float(split(drafts, e))}",
                  f"vllm:spec_decode_num_draft_tokens{suffix}{{{lab}}} {float(split(draft_tokens, e))}",
                  f"vllm:spec_decode_num_accepted_tokens{suffix}{{{lab}}} {float(split(accepted, e))}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos{suffix}{{{lab},position="{i}"}} {float(split(n, e))}'
                  for i, n in enumerate(per_pos)]
    lines.append('vllm:num_requests_running{engine="0"} 3.0')
    return "\n".join(lines) + "\n"


@st.composite
def counters(draw):
    k = draw(st.integers(1, 8))
    drafts = draw(st.integers(1, 10**7))
    per_pos, last = [], drafts
    for _ in range(k):
        last = draw(st.integers(0, last))
        per_pos.append(last)
    return drafts, drafts * k, per_pos, draw(st.integers(1, 3)), draw(st.sampled_from(["_total", ""]))


@settings(max_examples=60, deadline=None)
@given(counters())
def test_imported_counters_reproduce_their_own_mean_acceptance_length(tmp_path_factory, case):
    drafts, draft_tokens, per_pos, engines, suffix = case
    path = tmp_path_factory.mktemp("m") / "metrics.txt"
    path.write_text(scrape(drafts, draft_tokens, per_pos, engines, suffix))
    c = read_counters(path)
    assert (c.num_drafts, c.num_draft_tokens, list(c.accepted_per_pos)) == (drafts, draft_tokens, per_pos)
    expected = 1 + sum(per_pos) / drafts  # vLLM's mean_acceptance_length
    assert c.mean_length == pytest.approx(expected, rel=1e-12)
    process = c.process()
    # the process's rates give back the counters' per-position rates and mean length
    assert R.mean_length(R.cumulative_from_conditional(process.alphas)) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert np.allclose(R.cumulative_from_conditional(process.alphas), np.array(per_pos) / drafts, atol=1e-12)


def test_the_process_of_counters_serves_at_their_mean_length(tmp_path, capsys):
    path = tmp_path / "metrics.txt"
    path.write_text(scrape(1000, 3000, [800, 600, 400]))
    status, out, err = run(capsys, "serve-sim", "--json", "--policy", "fixed:k=3", "--acceptance-file", str(path), "--target", "llama-3.1-8b",
                           "--drafter-model", "qwen2.5-0.5b", "--hardware", "h100-sxm", "--requests", "60", "--qps", "2")
    assert status == 0, err
    assert json.loads(out)["spec_decode"]["mean_acceptance_length"] == pytest.approx(2.8, abs=0.05)


def write_steps(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=40), min_size=1, max_size=6))
def test_replayed_requests_follow_their_recorded_steps_exactly(tmp_path_factory, k, steps):
    """Each simulated request replays one recorded request: the same number of steps and the
    same accepted tokens, so the same mean acceptance length (serving at the recorded k)."""
    steps = [[min(s, k) for s in req] for req in steps]
    path = write_steps(tmp_path_factory.mktemp("s") / "steps.jsonl",
                       [{"request_id": i, "acc_len": [s + 1 for s in req], "k": k} for i, req in enumerate(steps)])
    lengths = read_step_lengths(path)
    assert isinstance(lengths, StepLengths) and lengths.k == k
    assert lengths.mean_length == pytest.approx(1 + np.mean(np.concatenate(steps)))
    from draftsim.sim.policies import FixedK
    from draftsim.sim.serving.rounds import RoundBook

    quota = np.array([sum(s + 1 for s in req) for req in steps])
    book = RoundBook(FixedK(k), lengths.process(), quota, seed=0)
    for r, req in enumerate(steps):
        book.ensure(r)
        assert book.count[r] == len(req)
        assert book.accepted[book.start[r]: book.start[r] + book.count[r]].tolist() == req


def test_serving_replays_the_recorded_mean_length(tmp_path, capsys):
    rng = np.random.default_rng(1)
    rows = [{"id": f"r{i}", "prompt_len": 100, "acc_len": rng.choice([1, 1, 1, 2, 4], size=50).tolist(), "k": 3} for i in range(10)]
    path = write_steps(tmp_path / "steps.jsonl", rows)
    recorded = 1 + np.mean(np.concatenate([np.array(r["acc_len"]) - 1 for r in rows]))
    status, out, err = run(capsys, "serve-sim", "--json", "--policy", "fixed:k=3", "--acceptance-file", str(path), "--target", "llama-3.1-8b",
                           "--drafter-model", "qwen2.5-0.5b", "--hardware", "h100-sxm", "--requests", "20", "--qps", "2")
    assert status == 0, err
    sd = json.loads(out)["spec_decode"]
    assert sd["num_drafts"] == 20 * 50 and sd["mean_acceptance_length"] == pytest.approx(recorded, abs=1e-9)
    # simulate pools the steps: the same per-position rates, drawn step by step
    status, out, _ = run(capsys, "simulate", "--json", "--policy", "fixed:k=3", "--acceptance-file", str(path), "--cost", "0.05",
                         "--tokens", "200000")
    res = json.loads(out)
    pooled = load_acceptance_file(path).cumulative
    assert np.all(np.abs(np.array(res["acceptance_by_position"]) - pooled) < 5 * np.array(res["acceptance_by_position_se"]) + 1e-9)


@pytest.mark.parametrize("text, words", [
    (scrape(1000, 3000, [800, 600, 400], accepted=1700), ["sum to 1800", "not num_accepted_tokens 1700"]),
    (scrape(1000, 3000, [800, 900, 400]), ["must not increase"]),
    (scrape(0, 0, [0, 0]), ["num_drafts is 0"]),
    ("# HELP nothing\nvllm:spec_decode_num_drafts_total 10\n", ["no vllm:spec_decode_num_draft_tokens"]),
    (scrape(10, 30, [5]).replace('position="0"', 'position="2"'), ["no position 0"]),
    ("vllm:spec_decode_num_drafts_total 1.5\n", ["whole number"]),
    ('{"id": 1, "acc_len": [1, 2]}\n{"id": 1, "acc_len": [1]}\n', ["request id '1' appears twice"]),
    ('{"id": 1, "acc_len": [0, 2]}\n', ["acc_len[0]", "[1, "]),
    ('{"id": 1, "acc_len": [1, 5], "k": 3}\n', ["accepted 4 tokens but k is 3"]),
    ('{"id": 1}\n', ["one of accepted", "acc_len"]),
    ('{"acc_len": [1]}\n', ["no request id"]),
    ('{"id": 1, "acc_len": [1]}\nnot json\n', [":2:", "not a JSON object"]),
    ("hello\n", ["neither per-request accepted lengths", "Prometheus"]),
])
def test_bad_acceptance_files_are_one_line_and_exit_2(tmp_path, capsys, text, words):
    path = tmp_path / "acc.txt"
    path.write_text(text)
    status, out, err = run(capsys, "simulate", "--policy", "fixed:k=1", "--acceptance-file", str(path), "--cost", "0.1")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_a_policy_longer_than_the_measured_draft_is_refused(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text(scrape(10, 20, [5, 2]))
    c = load_acceptance_file(path)
    assert isinstance(c, SpecDecodeCounters) and c.k == 2
    with pytest.raises(DraftsimError, match="k=3 needs 3"):
        c.process(3)
