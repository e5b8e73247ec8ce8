"""Real batched serving (realrun.serving): the ragged KV cache, lossless greedy and sampled
outputs whatever the batch composition, serving traces, metrics and the serve CLI.

Tiny random models only (the SmolLM2 check is a documented slow test at the end, run with
``DRAFTSIM_SLOW=1``). Chi-square tests use fixed seeds at significance 1e-3.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
from scipy import stats

from draftsim.realrun.drafters import MaxGram, NeuralDraft
from draftsim.realrun.executor import Sampling
from draftsim.realrun.kvcache import BatchKV
from draftsim.realrun.models import load_model
from draftsim.realrun.servetrace import Member, RequestRecord, ServeTrace, ServeTraceWriter, Step, TokenRecord, serving_metrics
from draftsim.realrun.serving import Server, ServeRequest, check_memory, check_requests
from draftsim.sim import policies as P
from draftsim.sim.errors import DraftsimError
from draftsim.sim.traces import TraceError

TEXTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):", "hello world, hello", "abcabcabc", "x = 1\ny = 2\nx = 1\n",
         "The quick brown fox", "aaaa", "q"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run ~15x faster on one thread than on two contended ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target():
    return load_model("tiny:1")


@pytest.fixture(scope="module")
def drafters(target):
    return {"maxgram": MaxGram(target.vocab_size), "tiny2": NeuralDraft(load_model("tiny:2"), "tiny2")}


def ids(target, text):
    return tuple(target.tokenizer(text)["input_ids"])


def own_greedy(target, prompt, n):
    with torch.inference_mode():
        out = target.model.generate(torch.tensor([list(prompt)]), max_new_tokens=n, do_sample=False,
                                    pad_token_id=target.tokenizer.pad_token_id)
    return out[0, len(prompt):].tolist()


class FakeClock:
    """A clock that advances only when the server sleeps (arrivals become deterministic)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1e-4  # every reading moves time on a little: steps take time
        return self.t

    def sleep(self, s):
        self.t += s


# ---------------------------------------------------------------- the ragged cache

def test_batched_forward_matches_single_sequences(target):
    """Rows fed different numbers of tokens, with rolled-back (stale) slots, merged joiners,
    dropped rows and a compaction: every row's logits equal a plain forward of its text."""
    texts = [ids(target, t) for t in TEXTS[:4]]
    kv = BatchKV(target)
    kv.add_rows(3)
    kv.forward([texts[0][:5], texts[1][:3], texts[2]], [1, 1, 1])
    # row 0 takes 3 more tokens then rolls back 2; row 1 a long block; row 2 nothing
    kv.forward([texts[0][5:8], texts[1][3:10], []], [3, 7, 0])
    assert kv.rollback(0, texts[0][:6], 6) == 6
    assert kv.rollback(1, texts[1][:8], 8) == 8  # row 1 held the longest tail: 2 slots of it are stale for every row
    length = kv.length
    kv.trim()
    assert kv.length == length - 2 and kv.valid.shape[1] == kv.length
    assert all(layer.keys.shape[2] == kv.length for layer in kv._layers())
    kv.forward([[], texts[1][8:10], []], [0, 2, 0])  # row 1 takes its two tokens back
    joiner = BatchKV(target)
    joiner.add_rows(1)
    joiner.forward([texts[3][:4]], [1])
    kv.merge(joiner)
    kv.keep_rows([0, 1, 3])
    kv.compact()
    out = kv.forward([texts[0][6:9], texts[1][10:12], texts[3][4:6]], [3, 2, 2])
    held = [kv.ids[r] for r in range(3)]
    assert held == [list(texts[0][:9]), list(texts[1][:12]), list(texts[3][:6])]
    for row, text, n in zip(out, held, (3, 2, 2)):
        with torch.inference_mode():
            ref = target.model(torch.tensor([text])).logits[0, -n:].float()
        assert torch.allclose(row, ref, atol=1e-4), (row - ref).abs().max()
        assert (row.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("ratio, least", [(0.5, 64), (0.2, 8)])
def test_sim_layout_is_the_servers_cache_width(target, drafters, monkeypatch, ratio, least):
    """The serving simulator's ragged layout (``sim.serving.layout``) gives every verification
    the width the real server's cache has at that forward — the same joins, leaves,
    rollbacks, trims and compactions — when the simulator replays the run's own rounds."""
    from dataclasses import dataclass

    from draftsim.analysis.servecheck import realised_process
    from draftsim.realrun.serving import server_scheduler
    from draftsim.sim.cost.base import CostModel
    from draftsim.sim.cost.linear import CallCost
    from draftsim.sim.serving import ServingConfig, Workload, serve

    widths = []
    forward = BatchKV.forward

    def spy(self, feeds, keep):
        if self is server.kv:  # the batch's cache (not a joiner's prefill, not the warm-up's)
            widths.append(self.length)
        return forward(self, feeds, keep)

    prompts = [ids(target, t) * m for t, m in zip(TEXTS, (3, 1, 5, 2, 1, 9, 1))]
    reqs = [ServeRequest(i, 0.0, p, n) for i, (p, n) in enumerate(zip(prompts, (9, 14, 5, 12, 20, 7, 11)))]
    clock = FakeClock()
    server = Server(target, drafters["maxgram"], P.FixedK(3), max_batch=3, clock=clock, sleep=clock.sleep, stop_at_eos=False)
    monkeypatch.setattr(BatchKV, "forward", spy)
    server.compact_ratio, server.compact_min = ratio, least
    log = server.run(reqs)
    assert any(s.compacted for s in log.steps) and sum(s.drafted - s.accepted for s in log.steps) > 0

    @dataclass(frozen=True, eq=False)
    class Width(CostModel):  # a step "takes" 1 + the width it attends over
        name: str = "width"
        step_shape = True

        def _time(self, stats):
            return 1.0 + np.where(stats.padded[..., 0] > 0, stats.padded[..., 2], 0.0)

        def _bound(self, stats):
            return np.full(np.shape(stats.tokens), 1)

    records = sorted(log.requests, key=lambda r: r.request)
    cfg = ServingConfig(P.FixedK(3), realised_process(log.requests, log.members, 3), Width(), [CallCost(0.0)],
                        scheduler=server_scheduler(3), layout=server.layout)
    wl = Workload(np.zeros(len(records)), np.array([r.prompt_tokens for r in records]), np.array([r.output_tokens for r in records]),
                  np.zeros(len(records), dtype=np.int64))
    steps = serve(cfg, wl, seed=0).steps
    sim = [int(round(d - 1.0)) for d in steps["duration"] if d > 1.0]
    assert len(steps["duration"]) == len(log.steps)
    assert sim == widths
    # a paged layout (no ragged cache): the longest context, never wider
    cfg.layout = None
    paged = [int(round(d - 1.0)) for d in serve(cfg, wl, seed=0).steps["duration"] if d > 1.0]
    assert len(paged) == len(widths) and all(p <= w for p, w in zip(paged, widths)) and paged != widths


def test_the_server_admits_as_its_scheduler_plans(target, drafters):
    """The server's admissions come from the simulator's scheduler and its queue: FCFS admits
    in arrival order; shortest-first admits the waiting requests shortest prompt first."""
    prompts = [ids(target, t) * m for t, m in zip(TEXTS, (3, 1, 5, 2, 1, 9, 1))]
    reqs = [ServeRequest(i, 0.0, p, 4) for i, p in enumerate(prompts)]
    order = {}
    for queue in ("fcfs", "shortest-first"):
        clock = FakeClock()
        server = Server(target, drafters["maxgram"], P.FixedK(2), max_batch=2, clock=clock, sleep=clock.sleep, stop_at_eos=False,
                        scheduling=queue)
        log = server.run(reqs)
        order[queue] = [m.request for m in log.members if m.prefill]
        assert max(s.batch + s.prefills for s in log.steps) <= 2
        for r in reqs:
            assert log.outputs[r.id] == own_greedy(target, r.prompt, 4)
    assert order["fcfs"] == list(range(len(reqs)))
    first_two = sorted(range(len(reqs)), key=lambda i: (len(prompts[i]), i))[:2]
    assert order["shortest-first"][:2] == first_two  # all arrive at 0: the two shortest go first
    waiting_after = sorted(order["shortest-first"][2:], key=lambda i: (len(prompts[i]), i))
    assert order["shortest-first"][2:] == waiting_after
    with pytest.raises(DraftsimError, match="scheduling policy must be one of"):
        Server(target, drafters["maxgram"], P.FixedK(2), scheduling="lifo")


# ---------------------------------------------------------------- lossless greedy

CASES = [
    ("ar", P.Autoregressive(), None),
    ("maxgram-fixed", P.FixedK(4), "maxgram"),
    ("maxgram-heuristic", P.Heuristic(), "maxgram"),
    ("neural-fixed", P.FixedK(3), "tiny2"),
    ("neural-confidence", P.ConfidenceStop(0.5, 5), "tiny2"),
]


@pytest.mark.parametrize("name,policy,drafter", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("max_batch", [1, 3, 8])
def test_greedy_output_is_the_targets_own(target, drafters, name, policy, drafter, max_batch):
    """Staggered arrivals (joins and leaves mid-run), ragged budgets, frequent compaction:
    every request's output is the target's own greedy generation for its prompt."""
    reqs = [ServeRequest(i, 0.003 * i, ids(target, t), 12 + 3 * i) for i, t in enumerate(TEXTS)]
    clock = FakeClock()
    server = Server(target, drafters.get(drafter), policy, max_batch=max_batch, clock=clock, sleep=clock.sleep, stop_at_eos=False)
    server.compact_min = 8
    log = server.run(reqs)
    for r in reqs:
        assert log.outputs[r.id] == own_greedy(target, r.prompt, r.max_new_tokens), r.id
    assert max(s.batch for s in log.steps) <= max_batch
    if max_batch == 8:
        assert any(s.compacted for s in log.steps)
    assert sorted(m.request for m in log.members if m.prefill) == [r.id for r in reqs]
    assert sum(s.emitted for s in log.steps) == sum(r.max_new_tokens for r in reqs)
    for rec in log.requests:
        assert rec.arrival <= rec.admitted <= rec.first_token <= rec.finish
        assert rec.output_tokens == rec.max_new_tokens


def test_controller_caps_the_draft(target, drafters):
    """A controller that turns drafting off above batch size 2 (a callable here): it sees every
    running request of the step, the joiners prefilled in it included (controller_view)."""
    reqs = [ServeRequest(i, 0.0, ids(target, t), 10) for i, t in enumerate(TEXTS[:5])]
    clock = FakeClock()
    server = Server(target, drafters["maxgram"], P.FixedK(4), controller=lambda b: 0 if b > 2 else None, max_batch=5,
                    clock=clock, sleep=clock.sleep, stop_at_eos=False)
    log = server.run(reqs)
    for s in log.steps:
        if s.batch:
            assert (s.drafted == 0) == (s.batch + s.prefills > 2), s
    for r in reqs:
        assert log.outputs[r.id] == own_greedy(target, r.prompt, 10)


# ---------------------------------------------------------------- lossless sampling

def _exact_two(target, prompt, sampling):
    with torch.inference_mode():
        p1 = sampling.rows(target.model(torch.tensor([list(prompt)])).logits[0, -1:])[0]
        exact = {}
        for x in np.flatnonzero(p1 > 0):
            p2 = sampling.rows(target.model(torch.tensor([list(prompt) + [int(x)]])).logits[0, -1:])[0]
            for y in np.flatnonzero(p2 > 0):
                exact[(int(x), int(y))] = p1[x] * p2[y]
    return exact


@pytest.mark.parametrize("drafter", ["maxgram", "tiny2"])
def test_sampled_tokens_follow_the_target(target, drafters, drafter):
    """Temperature 1, top-k 4: the first two tokens of 1,000 requests of one prompt, batched
    with requests of other prompts and lengths (ragged batches), follow p exactly (chi-square)."""
    sampling = Sampling(1.0, 4)
    prompt = ids(target, "ab")
    exact = _exact_two(target, prompt, sampling)
    reqs = []
    for i in range(1000):
        reqs.append(ServeRequest(len(reqs), 0.0, prompt, 2))
        if i % 4 == 0:
            reqs.append(ServeRequest(len(reqs), 0.0, ids(target, TEXTS[i % len(TEXTS)]), 2 + i % 5))
    clock = FakeClock()
    server = Server(target, drafters[drafter], P.FixedK(2), sampling=sampling, max_batch=24, seed=7, clock=clock, sleep=clock.sleep,
                    stop_at_eos=False)
    log = server.run(reqs)
    counts: dict = {}
    for r in reqs:
        if r.prompt == prompt:
            key = tuple(log.outputs[r.id])
            counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact)
    keys = sorted(exact)
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    exp = np.array([exact[k] for k in keys]) * obs.sum()
    keep = exp >= 5
    obs, exp = np.append(obs[keep], obs[~keep].sum()), np.append(exp[keep], exp[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    assert sum(s.accepted for s in log.steps) > 0  # speculation did accept tokens


def test_sampling_does_not_depend_on_the_batch(target, drafters):
    """A request's sampled tokens come from its own generator: the same with or without company."""
    sampling = Sampling(1.0)
    alone = [ServeRequest(0, 0.0, ids(target, "hello"), 12)]
    crowd = alone + [ServeRequest(i, 0.0, ids(target, t), 5 + i) for i, t in enumerate(TEXTS, start=1)]
    outs = []
    for reqs, mb in ((alone, 1), (crowd, 8)):
        clock = FakeClock()
        server = Server(target, drafters["tiny2"], P.FixedK(3), sampling=sampling, max_batch=mb, seed=3, clock=clock, sleep=clock.sleep,
                        stop_at_eos=False)
        outs.append(server.run(reqs).outputs[0])
    assert outs[0] == outs[1]


# ---------------------------------------------------------------- bad input

def test_bad_input(target, drafters):
    long = ServeRequest(0, 0.0, ids(target, "x") * 1020, 10)
    with pytest.raises(DraftsimError, match="exceeds tiny:1's context of 1024"):
        check_requests(target, [long])
    with pytest.raises(DraftsimError, match="empty prompt"):
        check_requests(target, [ServeRequest(0, 0.0, (), 4)])
    with pytest.raises(DraftsimError, match="arrives at"):
        check_requests(target, [ServeRequest(0, -1.0, (5,), 4)])
    with pytest.raises(DraftsimError, match="appears twice"):
        check_requests(target, [ServeRequest(0, 0.0, (5,), 4), ServeRequest(0, 1.0, (5,), 4)])
    reqs = [ServeRequest(0, 0.0, (5,) * 100, 100)]
    with pytest.raises(DraftsimError, match="enough for max_batch <= 3"):
        check_memory([target], reqs, 8, 4, available=int(3.5 * 2 * 205 * 512 / 0.8))
    with pytest.raises(DraftsimError, match="policies of one drafter"):
        Server(target, drafters["maxgram"], P.HorizontalCascade((1, 2), (2, 2)))
    with pytest.raises(DraftsimError, match="tree policy"):
        Server(target, drafters["maxgram"], P.Tree(2, 2))
    with pytest.raises(DraftsimError, match="needs a drafter"):
        Server(target, None, P.FixedK(2))


# ---------------------------------------------------------------- traces and metrics

def _log(target, drafters):
    reqs = [ServeRequest(i, 0.001 * i, ids(target, t), 6) for i, t in enumerate(TEXTS[:4])]
    clock = FakeClock()
    return Server(target, drafters["maxgram"], P.FixedK(3), max_batch=2, clock=clock, sleep=clock.sleep, stop_at_eos=False).run(reqs)


def test_trace_round_trip_and_kill(target, drafters, tmp_path):
    log = _log(target, drafters)
    w = ServeTraceWriter(tmp_path / "t", {"target": "tiny:1", "requests": [[0, 1, 6]] * 4}, every=0.0)
    w.commit(log)
    killed = ServeTrace(tmp_path / "t")  # a kill after a commit: valid, partial, refused for checking
    assert not killed.complete
    with pytest.raises(DraftsimError, match="incomplete"):
        killed.require_complete()
    w.close(log)
    tr = ServeTrace(tmp_path / "t")
    tr.require_complete()
    assert tr.records("steps") == log.steps and tr.records("members") == log.members
    assert tr.records("requests") == log.requests and tr.records("tokens") == log.tokens
    with pytest.raises(DraftsimError, match="already exists"):
        ServeTraceWriter(tmp_path / "t", {})
    part = tmp_path / "t" / "steps" / "chunk-00000.parquet"
    part.write_bytes(part.read_bytes()[:-10])
    with pytest.raises(TraceError, match="truncated or corrupt"):
        ServeTrace(tmp_path / "t")


def test_trace_commits_in_the_background_in_order(target, drafters, tmp_path):
    """add() writes chunks on a background thread (the serving loop goes on); chunks land in
    order, close() waits for them; a failed background write is raised, not lost."""
    log = _log(target, drafters)
    full = (list(log.steps), list(log.members), list(log.requests), list(log.tokens))
    w = ServeTraceWriter(tmp_path / "t", {"target": "tiny:1", "requests": [[0, 1, 6]] * 4}, every=0.0)
    cut = len(log.steps) // 2
    log.steps, log.members = full[0][:cut], [m for m in full[1] if m.step < cut]
    log.requests = [r for r in full[2] if r.finish <= full[0][cut - 1].end]
    log.tokens = list(full[3])
    w.add(log, [])  # the first half, in the background
    log.steps, log.members, log.requests, log.tokens = full
    w.add(log, [])  # the rest: waits for the first chunk, then writes in the background
    w.close(log)
    tr = ServeTrace(tmp_path / "t")
    tr.require_complete()
    assert tr.records("steps") == log.steps and tr.records("members") == log.members
    assert sorted(tr.records("requests"), key=lambda r: r.request) == sorted(log.requests, key=lambda r: r.request)
    bad = ServeTraceWriter(tmp_path / "u", {"target": "tiny:1", "requests": []}, every=0.0)

    def broken(*a, **k):
        raise OSError("disk full")

    bad.writer.commit = broken
    bad.add(log, [])
    with pytest.raises(OSError, match="disk full"):
        bad.close(log)


def test_metrics_by_hand():
    reqs = [RequestRecord(0, 0.0, 5, 3, 3, 0.0, 1.0, 3.0, 0), RequestRecord(1, 1.0, 5, 2, 2, 1.0, 2.0, 4.0, 1)]
    toks = [TokenRecord(0, 0, 9, 1.0, 0), TokenRecord(0, 1, 9, 3.0, 2), TokenRecord(0, 2, 9, 3.0, 2),
            TokenRecord(1, 0, 9, 2.0, 1), TokenRecord(1, 1, 9, 4.0, 3)]
    steps = [Step(0, 0, 1, 0, 1, 0, 0, 5, 0, 0, 1, -1, 0, 0, 1, 0, False, 0), Step(1, 1, 2, 0, 1, 0, 0, 5, 0, 0, 1, -1, 0, 0, 1, 0, False, 0),
             Step(2, 2, 3, 2, 0, 6, 10, 0, 4, 1, 3, 2, 0, 1, 0, 0, False, 0), Step(3, 3, 4, 1, 0, 2, 6, 0, 0, 0, 1, 0, 0, 1, 0, 0, False, 0)]
    members = [Member(0, 0, True, 5, 0, 0, 0, 1), Member(1, 1, True, 5, 0, 0, 0, 1), Member(2, 0, False, 3, 5, 2, 1, 2),
               Member(2, 1, False, 3, 5, 2, 0, 1), Member(3, 1, False, 1, 6, 0, 0, 1)]
    m = serving_metrics(reqs, toks, members, steps)
    assert m["ttft"]["mean"] == pytest.approx(1.0) and m["e2e"]["p50"] == pytest.approx(3.0)
    assert m["tpot"]["mean"] == pytest.approx((1.0 + 2.0) / 2)
    assert m["itl"]["mean"] == pytest.approx(2.0)  # one gap per emission step
    assert m["throughput"] == pytest.approx(5 / 4)
    s = m["spec_decode"]
    assert (s["num_drafts"], s["num_draft_tokens"], s["num_accepted_tokens"]) == (2, 4, 1)
    assert s["mean_acceptance_length"] == pytest.approx(1.5) and s["num_accepted_tokens_per_pos"] == [1, 0]


# ---------------------------------------------------------------- the CLI

def test_serve_cli(tmp_path, capsys):
    from draftsim.cli import main

    trace = tmp_path / "trace"
    assert main(["serve", "--model", "tiny:1", "--qps", "50", "--requests", "6", "--output-len", "fixed:8", "--max-batch", "3",
                 "--scheduling", "shortest-first", "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 6 and out["output_tokens"] == 48
    for key in ("ttft", "tpot", "itl", "e2e"):
        assert set(out[key]) == {"mean", "p50", "p90", "p99"}
    assert ServeTrace(trace).complete
    # the queue the server ran is recorded, and check-serve replays with that same scheduler
    from draftsim.analysis.servecheck import trace_scheduler

    assert ServeTrace(trace).metadata["scheduling"] == "shortest-first"
    assert trace_scheduler(ServeTrace(trace).metadata, trace).policy == "shortest-first"
    with pytest.raises(SystemExit) as exit_:  # a usage error: argparse's exit, before any model loads
        main(["serve", "--model", "tiny:1", "--qps", "50", "--requests", "2", "--scheduling", "lifo"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "lifo" in err and "shortest-first" in err and len(err.strip().splitlines()) == 1
    assert main(["serve", "--model", "tiny:1", "--qps", "50", "--requests", "2", "--trace", str(trace)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["serve", "--model", "tiny:1", "--qps", "50", "--requests", "2", "--prompt-len", "fixed:2000"]) == 2
    err = capsys.readouterr().err
    assert "exceeds tiny:1's context of 1024" in err and len(err.strip().splitlines()) == 1
    assert main(["serve", "--model", "tiny:1", "--requests", "2"]) == 2
    assert "--qps" in capsys.readouterr().err


# ---------------------------------------------------------------- SmolLM2 (slow, documented)

@pytest.mark.skipif(not os.environ.get("DRAFTSIM_SLOW"), reason="SmolLM2 serving check: set DRAFTSIM_SLOW=1 (about a minute on 2 cores)")
def test_smollm2_batched_greedy_is_lossless():
    """SmolLM2 on 12 bundled prompts, batched with Max-Gram k=4: each output equals the
    model's own greedy generation, or differs first at a near-tie of the reference (the top
    two logits within 1e-3: batched fp32 forwards sum in another order)."""
    from draftsim.realrun.serving import prompt_pool

    target = load_model("smollm2", device="cpu")
    pool = prompt_pool(target)[:12]
    reqs = [ServeRequest(i, 0.0, tuple(p), 32) for i, p in enumerate(pool)]
    log = Server(target, MaxGram(target.vocab_size), P.FixedK(4), max_batch=12, stop_at_eos=True).run(reqs)
    for r in reqs:
        ref = own_greedy(target, r.prompt, 32)  # transformers stops after EOS, as the server does here
        got = log.outputs[r.id]
        if got != ref:
            i = next(j for j, (x, y) in enumerate(zip(got, ref)) if x != y)
            with torch.inference_mode():
                logits = target.model(torch.tensor([list(r.prompt) + ref[:i]])).logits[0, -1]
            top = torch.topk(logits, 2).values
            assert float(top[0] - top[1]) < 1e-3, (r.id, i)


# ---------------------------------------------------------------- check-serve

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from draftsim.cli import main

    trace = tmp_path_factory.mktemp("serve") / "trace"
    assert main(["serve", "--model", "tiny:1", "--qps", "40", "--requests", "10", "--output-len", "uniform:6,14", "--max-batch", "4",
                 "--policy", "fixed:k=3", "--trace", str(trace), "--json"]) == 0
    return trace


def test_check_serve_replays_the_run(served, capsys):
    """The replay serves the same requests with the rounds they realised: the same accepted
    tokens and rounds per request; every metric is reported with its relative error."""
    from draftsim.analysis.servecheck import CHECKED, check_serve
    from draftsim.cli import main

    capsys.readouterr()
    out = check_serve(served)
    meas, pred = out["measured"], out["predicted"]
    assert pred["output_tokens"] == meas["output_tokens"] and pred["requests"] == meas["requests"] == 10
    assert pred["spec_decode"]["num_accepted_tokens"] == meas["spec_decode"]["num_accepted_tokens"]
    assert [r["metric"] for r in out["metrics"]] == [c[0] for c in CHECKED]
    for r in out["metrics"]:
        assert r["relative_error"] == pytest.approx((r["predicted"] - r["measured"]) / r["measured"])
    assert main(["check-serve", str(served), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {tuple(sorted(r)) for r in rows} == {("measured", "metric", "predicted", "relative_error")}


def test_check_serve_bad_input(served, tmp_path, capsys):
    from draftsim.cli import main
    from draftsim.realrun.profiling import profile_model

    other = profile_model(load_model("tiny:3"), [1, 2], [1, 4], [0, 16], repeats=1, warmup=0)
    other.save(tmp_path / "other.json")
    assert main(["check-serve", str(served), "--profile", str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err
    assert "does not describe this trace's run" in err and "tiny:3" in err and len(err.strip().splitlines()) == 1
    killed = tmp_path / "killed"
    w = ServeTraceWriter(killed, {"target": "tiny:1", "requests": [[0, 1, 6]] * 3})
    assert main(["check-serve", str(killed)]) == 2
    assert "incomplete" in capsys.readouterr().err
    del w
    assert main(["check-serve", str(tmp_path / "nothing")]) == 2
    assert "no trace" in capsys.readouterr().err
    assert main(["serve", "--model", "tiny:2", "--qps", "50", "--requests", "2", "--output-len", "fixed:4", "--trace", str(tmp_path / "t2")]) == 0
    capsys.readouterr()
    assert main(["check-serve", str(served), "--costs-from", str(tmp_path / "t2")]) == 2
    assert "served with another model" in capsys.readouterr().err
    assert main(["check-serve", str(served), "--costs-from", str(served), "--json"]) == 0  # calibrated on itself: in-sample
    # the trace records the server's cache layout; one check-serve does not know is refused
    import shutil

    assert ServeTrace(served).metadata["cache"] == {"layout": "ragged", "compact_ratio": Server.compact_ratio,
                                                    "compact_min": Server.compact_min}
    paged = tmp_path / "paged"
    shutil.copytree(served, paged)
    manifest = json.loads((paged / "manifest.json").read_text())
    manifest["metadata"]["cache"] = {"layout": "paged"}
    (paged / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["check-serve", str(paged)]) == 2
    err = capsys.readouterr().err
    assert "cache layout 'paged'" in err and len(err.strip().splitlines()) == 1
    # the replay runs the server's own scheduler: the trace's batch limit and queue (FCFS when not recorded)
    from draftsim.analysis.servecheck import trace_scheduler
    from draftsim.realrun.serving import server_scheduler

    meta = ServeTrace(served).metadata
    assert trace_scheduler(meta, served) == server_scheduler(4)
    assert (server_scheduler(4).max_num_seqs, server_scheduler(4).chunked_prefill, server_scheduler(4).policy) == (4, False, "fcfs")
    assert trace_scheduler({**meta, "scheduling": "shortest-first"}, served).policy == "shortest-first"
    queue = tmp_path / "queue"
    shutil.copytree(served, queue)
    manifest["metadata"] = {**ServeTrace(served).metadata, "scheduling": "lifo"}
    (queue / "manifest.json").write_text(json.dumps(manifest))
    assert main(["check-serve", str(queue)]) == 2
    err = capsys.readouterr().err
    assert "scheduling policy must be one of" in err and "'lifo'" in err and len(err.strip().splitlines()) == 1


def test_a_server_path_profile_times_the_serving_loops_own_forward(target, served, tmp_path, capsys):
    """draftsim profile --path server times BatchKV.forward as the server calls it, and each
    timed call is undone as the server undoes a rejection: the next call finds the cache as
    the first did (the same logits), and a call without context starts from a fresh cache."""
    from draftsim.cli import main
    from draftsim.realrun.profiling import _ServerPath

    gen = torch.Generator().manual_seed(0)
    caller = _ServerPath(target, 2, torch.randint(target.vocab_size, (2, 5), generator=gen))
    held = [list(r) for r in caller.kv.ids]
    feed = caller.feed(torch.randint(target.vocab_size, (2, 3), generator=gen))
    first = caller.kv.forward(feed, [3, 3])
    assert caller.kv.length == 8
    caller = caller.undo(3)
    assert caller.kv.ids == held and caller.kv.length == 5 and bool(caller.kv.valid.all())
    again = caller.kv.forward(feed, [3, 3])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(first, again))
    fresh = _ServerPath(target, 1, None)
    fresh.call(fresh.feed(torch.randint(target.vocab_size, (1, 4), generator=gen)), last_row=True)
    assert fresh.undo(4).kv.rows == 1 and fresh.undo(4).kv.length == 0
    # the CLI records the path in the profile's fingerprint; check-serve and check-sim read it
    out = tmp_path / "server.json"
    assert main(["profile", "--model", "tiny:1", "--path", "server", "--batch", "1,2", "--new-tokens", "1,4,16", "--context", "0,16",
                 "--repeats", "1", "--drafters", "", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == "server"
    from draftsim.sim.cost import load_profile

    prof = load_profile(out)
    assert prof.path == "server" and prof.last_row_seconds is not None and (prof.seconds > 0).all()
    assert main(["check-serve", str(served), "--profile", str(out), "--json"]) == 0
    capsys.readouterr()
    from draftsim.analysis.servecheck import check_serve

    costs = check_serve(served, profile=out)["costs"]  # and what of the run the grid (contexts 0 and 16) does not reach
    assert costs.startswith(f"profile {out}; ") and "attend past the profile's largest context (16, up to " in costs, costs
    # the prefills from a profile of their own (batch 1, context 0, a last-row table)
    pre = tmp_path / "prefill.json"
    assert main(["profile", "--model", "tiny:1", "--path", "server", "--batch", "1", "--new-tokens", "1,8,64", "--context", "0",
                 "--repeats", "1", "--drafters", "", "--out", str(pre)]) == 0
    capsys.readouterr()
    assert check_serve(served, profile=out, prefill_profile=pre)["costs"].startswith(f"profile {out}, prefills from {pre}; 100% of")
    doc = json.loads(out.read_text())
    doc.pop("last_row_seconds")
    (tmp_path / "rowless.json").write_text(json.dumps(doc))
    for argv, msg in ((["--prefill-profile", str(pre)], "give --profile too"),
                      (["--profile", str(out), "--prefill-profile", str(tmp_path / "rowless.json")], "hold a last-row table")):
        assert main(["check-serve", str(served), *argv]) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
    prof.fingerprint.pop("path")  # a profile of the model's own call (or one from before paths): said so
    prof.save(tmp_path / "model.json")
    assert "the server's forward adds its ragged mask" in check_serve(served, profile=tmp_path / "model.json")["costs"]


def test_step_cost_and_robust_fit():
    """The fit of step costs shrugs off a stall; a step of two or more sequences that
    prefills pays the prefill's own call; profile shapes beyond the grid keep their tokens."""
    from draftsim.analysis.servecheck import AffineCost, StepCost, robust_nnls
    from draftsim.sim.cost import ProfileCost
    from draftsim.sim.cost.base import BatchStats

    rng = np.random.default_rng(0)
    n = rng.integers(1, 40, 200)
    y = 0.05 + 0.002 * n + rng.normal(0, 1e-4, 200)
    y[7] = 30.0  # the machine stalled once
    a, b = robust_nnls(np.column_stack([np.ones(200), n]), y)
    assert a == pytest.approx(0.05, abs=2e-3) and b == pytest.approx(0.002, rel=0.05)
    base = AffineCost(0.1, 0.0, 0.01, 0.0)
    cost = StepCost(base, overhead=0.02, per_sequence=0.001, k_max=4)
    decode = BatchStats.of_batch(np.array([[5, 5]]), np.array([[100, 100]]))
    mixed = BatchStats.of_batch(np.array([[5, 60]]), np.array([[100, 0]]))
    alone = BatchStats.of_batch(np.array([[60]]), np.array([[0]]))
    assert cost.stats_time(decode) == pytest.approx(0.1 + 0.1 + 0.02 + 0.002)
    assert cost.stats_time(mixed) == pytest.approx(0.1 + 0.65 + 0.02 + 0.002 + 0.11)  # + one one-token call
    assert cost.stats_time(alone) == pytest.approx(0.1 + 0.6 + 0.02 + 0.001)
    prof = ProfileCost("m", (1, 2), (1, 8), (0, 64), np.array([[[1.0, 1.0], [8.0, 8.0]], [[2.0, 2.0], [16.0, 16.0]]]))
    wide = StepCost(prof, 0.0, 0.0, k_max=8)
    assert wide.stats_time(BatchStats.of_batch(np.array([[16]]), np.array([[0]]))) == pytest.approx(16.0)  # as 2 x 8 tokens
    assert wide.stats_time(BatchStats.of_batch(np.array([[8] * 4]), np.array([[0] * 4]))) == pytest.approx(32.0)  # 2 x (2 x 8)


def test_step_cost_prices_the_servers_padded_batch_and_each_prefill_apart():
    """A step the serving simulator describes (padded decode batch, prefilling joiners) is
    priced as the real server computes it: the verification over the right-padded batch (the
    most new tokens, the longest context) and one call per joiner keeping one logit row."""
    from draftsim.analysis.servecheck import StepCost
    from draftsim.sim.cost import ProfileCost
    from draftsim.sim.cost.base import BatchStats

    B, N, C = (1, 2, 4), (1, 2, 4, 8, 64), (0, 128, 512)
    b, n, c = np.meshgrid(B, N, C, indexing="ij")
    n1, c1 = np.meshgrid(N, C, indexing="ij")
    prof = ProfileCost("m", B, N, C, 0.01 + 0.001 * b * n + 1e-5 * b * c, last_row_seconds=0.01 + 0.001 * n1 + 1e-5 * c1 - 1e-4 * (n1 - 1))
    cost = StepCost(prof, overhead=0.002, per_sequence=0.0005, k_max=4)
    # two decoding sequences (3 and 5 new tokens, contexts 100 and 300) and one joiner of 64 prompt tokens
    st = BatchStats(np.array([3.0]), np.array([72.0]), np.array([400.0]), np.array([0.0]), rows=np.array([9.0]),
                    padded=np.array([[2.0, 5.0, 300.0]]), prefill=np.array([[1.0, 64.0]]))
    verify = float(prof.lookup(2, 5, 300))  # as if both rows were fed 5 tokens over 300 cached
    prefill = float(prof.shape_time(1, 64, 0, rows=1))
    assert prefill == pytest.approx(float(prof.shape_time(1, 64, 0)) - 63 * 1e-4)
    assert cost.stats_time(st)[0] == pytest.approx(verify + prefill + 0.002 + 3 * 0.0005)
    # a second profile may price the prefills (batch 1, long calls): the step grid then needs none
    NP = (1, 16, 64, 256)
    longer = ProfileCost("m", (1,), NP, (0,), np.array([[[0.5 + 0.01 * n] for n in NP]]),
                         last_row_seconds=np.array([[0.4 + 0.01 * n] for n in NP]))
    both = StepCost(prof, overhead=0.002, per_sequence=0.0005, k_max=4, prefill=longer)
    assert both.stats_time(st)[0] == pytest.approx(verify + float(longer.shape_time(1, 64, 0, rows=1)) + 0.002 + 3 * 0.0005)
    assert float(longer.shape_time(1, 64, 0, rows=1)) == pytest.approx(0.4 + 0.64)
    # the serving simulator's steps carry that description
    from draftsim.sim.serving.window import step_stats

    assert cost.step_shape and not prof.step_shape
    s = step_stats(np.array([[3, 5, 0]]), np.array([[100, 300, 7]]), pre=(1, 64.0, 0.0, 2080.0), shape=True)
    assert s.padded.tolist() == [[2.0, 5.0, 300.0]] and s.prefill.tolist() == [[1.0, 64.0]] and s.rows.tolist() == [9.0]


# ---------------------------------------------------------------- the KV pool: preemption by recompute

def test_a_kv_pool_preempts_and_recomputes_as_the_simulator_does(target, drafters, tmp_path, capsys):
    """A pool too small for the whole batch: the scheduler preempts, the server drops the
    victim's rows and prefills its prompt and output anew when readmitted. Greedy outputs equal
    the target's own; replayed with the same pool (check-serve), the simulator preempts the same
    requests as often, in the same order of first admissions."""
    from draftsim.analysis.servecheck import check_serve
    from draftsim.cli import main
    from draftsim.realrun.serving import server_pool

    reqs = [ServeRequest(i, 0.0, ids(target, t), 24) for i, t in enumerate(TEXTS[:5])]
    longest = max(len(r.prompt) + r.max_new_tokens for r in reqs)
    pool = longest + 4 + 8  # one request and its draft window fit with a little room; five cannot grow together
    clock = FakeClock()
    server = Server(target, drafters["maxgram"], P.FixedK(3), max_batch=5, clock=clock, sleep=clock.sleep, stop_at_eos=False,
                    kv_tokens=pool, block_size=4)
    log = server.run(reqs)
    assert log.preemptions, "the pool should force preemptions"
    for r in reqs:
        assert log.outputs[r.id] == own_greedy(target, r.prompt, r.max_new_tokens), r.id
    prefills = [m.request for m in log.members if m.prefill]
    assert len(prefills) == len(reqs) + len(log.preemptions)  # each preemption costs one more prefill (recompute)
    assert sum(s.emitted for s in log.steps) == sum(r.max_new_tokens for r in reqs)
    with pytest.raises(DraftsimError, match="memory too small for one request"):
        Server(target, drafters["maxgram"], P.FixedK(3), kv_tokens=longest, block_size=4).run(reqs)
    with pytest.raises(DraftsimError, match="less than one block"):
        server_pool(3, 4, 3)

    # the same through the CLI, every request arriving at 0, then replayed by the simulator
    workload = tmp_path / "w.csv"
    workload.write_text("arrival,prompt_tokens,output_tokens\n" + "".join(f"0,{12 + 5 * i},20\n" for i in range(6)))
    trace = tmp_path / "trace"
    assert main(["serve", "--target", "tiny:1", "--request-trace", str(workload), "--max-batch", "6", "--kv-tokens", "64",
                 "--block-size", "4", "--policy", "fixed:k=3", "--trace", str(trace), "--json"]) == 0
    served = json.loads(capsys.readouterr().out)
    assert served["preempted"] and served["preemptions"] == len(served["preempted"])
    out = check_serve(trace)
    assert out["preemptions"]["predicted"] == out["preemptions"]["measured"] and sum(out["preemptions"]["measured"]) > 0
    assert out["predicted"]["output_tokens"] == out["measured"]["output_tokens"] == 120
    assert main(["serve", "--target", "tiny:1", "--request-trace", str(workload), "--kv-tokens", "40", "--block-size", "4"]) == 2
    err = capsys.readouterr().err
    assert "memory too small for one request" in err and len(err.strip().splitlines()) == 1


def test_priorities_reach_the_server_and_its_replay(tmp_path, capsys):
    """A request trace's priority column: the server's priority queue admits the lower class
    first, the trace records each request's class and check-serve replays with it."""
    from draftsim.analysis.servecheck import check_serve, trace_priorities
    from draftsim.cli import main

    workload = tmp_path / "w.csv"
    classes = [2, 1, 0, 2, 0, 1]
    workload.write_text("arrival,prompt_tokens,output_tokens,priority\n" + "".join(f"0,{10 + i},6,{c}\n" for i, c in enumerate(classes)))
    trace = tmp_path / "trace"
    assert main(["serve", "--target", "tiny:1", "--request-trace", str(workload), "--max-batch", "2", "--scheduling", "priority",
                 "--policy", "fixed:k=2", "--trace", str(trace), "--json"]) == 0
    capsys.readouterr()
    members = ServeTrace(trace).records("members")
    admitted = [m.request for m in members if m.prefill]
    assert admitted == sorted(range(6), key=lambda i: (classes[i], i))  # all wait at 0: by class, then arrival order
    reqs = sorted(ServeTrace(trace).records("requests"), key=lambda r: r.request)
    assert trace_priorities(ServeTrace(trace).metadata, reqs, trace).tolist() == classes
    out = check_serve(trace)
    assert out["predicted"]["output_tokens"] == out["measured"]["output_tokens"] == 36


def test_the_server_teaches_suffix_decoding_its_finished_requests(target):
    """Suffix decoding keeps finished requests' outputs (its global tree): the server hands each
    finished request over, so a later request repeating an earlier one is drafted from it and
    accepts more per round; greedy outputs stay the target's own."""
    from draftsim.realrun.drafters import Suffix

    prompt = ids(target, TEXTS[0])
    reqs = [ServeRequest(0, 0.0, prompt, 40), ServeRequest(1, 5.0, prompt, 40)]  # the second arrives after the first is done
    clock = FakeClock()
    drafter = Suffix(target.vocab_size)
    log = Server(target, drafter, P.FixedK(6), max_batch=2, clock=clock, sleep=clock.sleep, stop_at_eos=False).run(reqs)
    assert len(drafter.cached) == 2 and list(drafter.cached[0]) == log.outputs[0]
    accepted = {rid: sum(m.accepted for m in log.members if m.request == rid and not m.prefill) for rid in (0, 1)}
    rounds = {rid: sum(1 for m in log.members if m.request == rid and not m.prefill) for rid in (0, 1)}
    assert accepted[1] / rounds[1] > accepted[0] / rounds[0]
    assert log.outputs[1] == log.outputs[0] == own_greedy(target, prompt, 40)


def test_check_serve_on_a_lookup_drafters_trace(tmp_path, capsys):
    """An n-gram drafter proposes nothing where its context has no match: the trace records
    those empty rounds and check-serve replays them (same tokens, the same drafts and accepted
    tokens as the run), pricing the lookup inside the step's overhead."""
    from draftsim.analysis.servecheck import check_serve
    from draftsim.cli import main

    trace = tmp_path / "trace"
    assert main(["serve", "--target", "tiny:1", "--drafter", "ngram", "--policy", "fixed:k=4", "--qps", "50", "--requests", "6",
                 "--output-len", "fixed:24", "--max-batch", "3", "--trace", str(trace), "--json"]) == 0
    capsys.readouterr()
    members = [m for m in ServeTrace(trace).records("members") if not m.prefill]
    assert any(m.drafted == 0 for m in members) and any(m.drafted > 0 for m in members)  # empty rounds and proposals
    out = check_serve(trace)
    meas, pred = out["measured"], out["predicted"]
    assert pred["output_tokens"] == meas["output_tokens"] == 144
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert pred["spec_decode"][key] == meas["spec_decode"][key], key
    assert all(np.isfinite(r["relative_error"]) for r in out["metrics"])


@pytest.mark.parametrize("field, value, message", [("max_batch", "4", "max_batch must be an integer >= 1"),
                                                   ("requests", 5, "requests must be a list of"),
                                                   ("kv_tokens", -3, "kv_tokens must be an integer >= 1 or null")])
def test_a_hand_edited_serving_trace_is_one_line(served, tmp_path, capsys, field, value, message):
    import shutil

    from draftsim.cli import main

    copy = tmp_path / "trace"
    shutil.copytree(served, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["metadata"][field] = value
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert main(["check-serve", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


# ---------------------------------------------------------------- controlled acceptance in batched serving (issue 28)

def test_the_controlled_drafter_serves_losslessly_at_its_rate_with_batched_cost_forwards(target):
    """``draftsim serve`` with the controlled drafter: before the clock an autoregressive pass
    records each prompt's greedy continuation; then every draft position costs one batched
    forward of the cost model (over the rows still drafting), the proposals are the recorded
    continuation kept at the prescribed rate, and the output is the target's own."""
    from draftsim.realrun.drafters import Controlled

    cost = load_model("tiny:2")
    calls = []
    decoder = cost.model.get_decoder()  # the caches call the decoder, then the output head on the rows they keep
    hook = decoder.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        drafter = Controlled(target.vocab_size, [0.8], cost, seed=5)
        reqs = [ServeRequest(i, 0.002 * i, ids(target, TEXTS[i % len(TEXTS)]), 30) for i in range(12)]
        clock = FakeClock()
        server = Server(target, drafter, P.FixedK(4), max_batch=4, clock=clock, sleep=clock.sleep, stop_at_eos=False)
        log = server.run(reqs)
    finally:
        hook.remove()
    for r in reqs:
        assert log.outputs[r.id] == own_greedy(target, r.prompt, r.max_new_tokens), r.id
    rounds = [m for m in log.members if not m.prefill and m.drafted]
    # conditional acceptance at position 1: rounds that accepted >= 1 of those that drafted >= 1
    first = np.mean([m.accepted >= 1 for m in rounds])
    deeper = [m.accepted >= 2 for m in rounds if m.accepted >= 1 and m.drafted >= 2]
    n = len(rounds)
    assert n > 60 and abs(first - 0.8) < 4 * np.sqrt(0.16 / n), (first, n)
    assert abs(np.mean(deeper) - 0.8) < 4 * np.sqrt(0.16 / len(deeper)), np.mean(deeper)
    # one batched forward per draft position of each drafting step, batching the rows still drafting
    drafting = [s for s in log.steps if s.drafted]
    per_step = sum(max(m.drafted for m in log.members if m.step == s.step and not m.prefill) for s in drafting)
    assert len(calls) >= per_step and max(calls) > 1
    assert all(s.draft_seconds > 0 for s in drafting)
    # sampling cannot follow a recorded greedy continuation
    with pytest.raises(DraftsimError, match="temperature 0"):
        Server(target, drafter, P.FixedK(4), sampling=Sampling(1.0))


def test_serve_cli_runs_the_controlled_drafter_and_check_serve_replays_it(tmp_path, capsys):
    from draftsim.cli import main

    trace = tmp_path / "trace"
    assert main(["serve", "--model", "tiny:1", "--drafter", "controlled:0.7@tiny:2", "--qps", "40", "--requests", "6",
                 "--output-len", "fixed:16", "--max-batch", "3", "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["drafter"] == "controlled:0.7@tiny:2" and out["spec_decode"]["num_drafts"] > 0
    assert main(["check-serve", str(trace), "--json"]) == 0
    rows = {r["metric"]: r for r in json.loads(capsys.readouterr().out)}
    assert np.isfinite(rows["throughput"]["predicted"])
    # the same run priced by a catalog deployment's rooflines and overheads (no measurement of it): what serve-sim predicts
    assert main(["check-serve", str(trace), "--hardware", "h100-sxm", "--target", "smollm2-135m", "--drafter-model", "smollm2-135m"]) == 0
    text = capsys.readouterr().out
    assert "catalog roofline of smollm2-135m on h100-sxm" in text and "throughput" in text
    # ... or by the operator model (AIConfigurator's kernel tables), where its extra is installed
    if importlib.util.find_spec("aiconfigurator_core") is not None:
        assert main(["check-serve", str(trace), "--hardware", "h100-sxm", "--target", "smollm2-135m", "--drafter-model", "smollm2-135m",
                     "--cost-model", "operators", "--json"]) == 0
        ops = {r["metric"]: r for r in json.loads(capsys.readouterr().out)}
        assert np.isfinite(ops["throughput"]["predicted"]) and ops["throughput"]["predicted"] != rows["throughput"]["predicted"]
    for args, fragment in ((["--hardware", "h100-sxm"], "tiny:1"), (["--hardware", "h100-sxm", "--profile", "p.json"], "not both"),
                           (["--cost-model", "operators"], "give --hardware")):
        assert main(["check-serve", str(trace), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert fragment in err and len(err.splitlines()) == 1, err
    assert main(["serve", "--model", "tiny:1", "--drafter", "controlled:0.7@tiny:2", "--qps", "40", "--requests", "2",
                 "--temperature", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--temperature 0" in err and len(err.splitlines()) == 1
    assert main(["serve", "--model", "tiny:1", "--drafter", "controlled:0.7@nope", "--qps", "40", "--requests", "2"]) == 2
    assert "nope" in capsys.readouterr().err


def test_serving_runs_in_one_process_share_their_models_and_static_caches(tmp_path):
    """serve(..., models=cache): a second run takes the first one's models (weights, and the static
    caches released to their pools), a run without --static-cache after one with it serves eagerly,
    and each run's output is the target's greedy output whatever came before (what
    bench_real_serving.py --in-process relies on)."""
    from draftsim.commands.serve import ServeConfig, serve

    cache: dict = {}
    base = dict(target="tiny:1", drafter="controlled:0.7@tiny:2", qps=40.0, requests=4, output_len="fixed:8", max_batch=2,
                device="cpu", dtype="float32")
    first = serve(ServeConfig(**base, static_cache=True, trace=str(tmp_path / "a")), models=cache)
    target = cache[("tiny:1", "cpu", "float32")]
    assert set(cache) == {("tiny:1", "cpu", "float32"), ("tiny:2", "cpu", "float32")}
    pooled = [kv for kvs in target.kv_pool.values() for kv in kvs]
    assert target.static_tokens is not None and pooled  # the timed server's cache went back to the pool
    second = serve(ServeConfig(**base, static_cache=True, trace=str(tmp_path / "b")), models=cache)
    assert cache[("tiny:1", "cpu", "float32")] is target and set(cache) == {("tiny:1", "cpu", "float32"), ("tiny:2", "cpu", "float32")}
    assert [kv for kvs in target.kv_pool.values() for kv in kvs] == pooled  # taken and handed back, not made anew
    eager = serve(ServeConfig(**base, trace=str(tmp_path / "c")), models=cache)
    assert target.static_tokens is None
    from draftsim.realrun.servetrace import ServeTrace

    outputs = [sorted((t.request, t.token) for t in ServeTrace(tmp_path / x).records("tokens")) for x in "abc"]
    assert len(outputs[0]) == 32 and outputs[0] == outputs[1] == outputs[2]
    for r in (first, second, eager):
        assert r.metrics.output_tokens == 32
