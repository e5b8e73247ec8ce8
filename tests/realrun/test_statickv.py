"""The static KV cache (realrun.statickv: fixed shapes, CUDA graphs on a CUDA device) against the
eager ragged cache (realrun.kvcache.BatchKV): the same logits within float tolerance through
ragged forwards, rollbacks, rows leaving, joining and moving, and tree attention; the same tokens
end to end in `draftsim run` (chains and trees) and in `draftsim serve`; and refusals where it is
full. On this CPU the fixed-shape path runs without capture (no CUDA here: the graphs' replay is
exercised where a GPU is lent)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.realrun.kvcache import BatchKV
from draftsim.realrun.models import tiny_model
from draftsim.realrun.statickv import StaticKV, bucket
from draftsim.sim.errors import DraftsimError

ATOL = 1e-4


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(5, layers=2, hidden=64)


@given(n=st.integers(1, 5000), floor=st.integers(1, 64))
def test_bucket_is_the_next_power_of_two(n, floor):
    b = bucket(n, floor=floor)
    assert b >= n and b >= floor and b & (b - 1) == 0 and (b // 2 < max(n, floor) or b == 1)


def _close(a, b):
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.shape == y.shape and float((x - y).abs().max()) < ATOL


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_static_cache_computes_what_the_eager_one_does(tiny, seed):
    """A random life of a batch: ragged feeds, rollbacks of random depth, rows leaving and
    joining (a prefilled cache merged in): logits within 1e-4, the same tokens held per row."""
    rng = np.random.default_rng(seed)
    eager, static = BatchKV(tiny), StaticKV(tiny, rows=6, tokens=256)
    for kv in (eager, static):
        kv.add_rows(3)

    def tokens(n):
        return [int(t) for t in rng.integers(5, 95, n)]

    for _ in range(6):
        op = rng.integers(0, 4)
        if op == 0 and eager.rows > 1:  # a row leaves, the others keep their order
            keep = sorted(rng.choice(eager.rows, eager.rows - 1, replace=False).tolist())
            eager.keep_rows(keep)
            static.keep_rows(keep)
        elif op == 1 and eager.rows < 6:  # a row joins, prefilled apart
            prompt = tokens(int(rng.integers(1, 30)))
            one_e, one_s = BatchKV(tiny), StaticKV(tiny, rows=1, tokens=256)
            for one in (one_e, one_s):
                one.add_rows(1)
            _close(one_e.forward([prompt], [1]), one_s.forward([prompt], [1]))
            eager.merge(one_e)
            static.merge(one_s)
        elif op == 2:  # rollbacks: each row keeps a random prefix of what it holds
            for r in range(eager.rows):
                held = list(eager.ids[r])
                cut = int(rng.integers(0, len(held) + 1))
                ctx = held[:cut] + tokens(3)
                assert eager.rollback(r, ctx, len(ctx) - 1) == static.rollback(r, ctx, len(ctx) - 1)
            eager.trim()
            static.trim()
        feeds = [tokens(int(rng.integers(0, 9))) if r else tokens(int(rng.integers(1, 9))) for r in range(eager.rows)]
        keep = [int(rng.integers(0, len(f) + 1)) for f in feeds]
        _close(eager.forward(feeds, keep), static.forward(feeds, keep))
        assert eager.ids == static.ids


def test_tree_attention_through_the_static_cache(tiny):
    """attend (the single-stream tree verification) gives the eager cache's logits."""
    import torch

    eager, static = BatchKV(tiny), StaticKV(tiny, rows=1, tokens=128)
    for kv in (eager, static):
        kv.add_rows(1)
        kv.forward([[7, 8, 9, 10, 11]], [0])
    T = 5  # a root with two children, one grandchild under the first child
    allowed = torch.zeros((4, T + 4), dtype=torch.bool)
    allowed[:, :T] = True
    for i, parents in enumerate([[0], [0, 1], [0, 2], [0, 1, 3]]):
        allowed[i, [T + p for p in parents]] = True
    nodes, positions = [12, 13, 14, 15], [5, 6, 6, 7]
    _close([eager.attend(nodes, positions, allowed, 4)], [static.attend(nodes, positions, allowed, 4)])


def test_a_full_static_cache_says_so(tiny):
    kv = StaticKV(tiny, rows=2, tokens=16)
    kv.add_rows(2)
    with pytest.raises(DraftsimError, match="holds 2 rows"):
        kv.add_rows(1)
    with pytest.raises(DraftsimError, match="outgrows the static cache's 16 tokens"):
        kv.forward([list(range(5, 25)), [5]], [1, 1])
    with pytest.raises(DraftsimError, match="CUDA graphs need a CUDA device"):
        StaticKV(tiny, rows=1, tokens=16, graphs=True)


def _run(capsys, *extra):
    from draftsim.cli import main

    assert main(["run", "--target", "tiny:1", "--prompts", "code", "--n", "2", "--max-new-tokens", "20", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_run_with_a_static_cache_keeps_the_target_output(capsys):
    """`run --static-cache`: greedy output is the target's (chains and trees), with the eager
    run's counts."""
    for method in (["--method", "sd", "--drafter", "tiny:1", "--policy", "fixed:k=3"],
                   ["--method", "tsd", "--drafter", "tiny:1", "--policy", "tree:width=2,depth=3"]):
        eager, static = _run(capsys, *method), _run(capsys, *method, "--static-cache")
        assert static["quality"]["identical_to_target"] == 1.0 == eager["quality"]["identical_to_target"]
        assert [(lv["drafted"], lv["accepted"]) for lv in static["levels"]] == [(lv["drafted"], lv["accepted"]) for lv in eager["levels"]]


def test_check_sim_prices_a_static_run_and_a_controlled_drafter_by_profiles_of_their_path(tmp_path, capsys):
    """A `run --static-cache` trace is priced by `profile --path server-static` (batch 1), not by a
    profile of the model's own call; the controlled drafter by a profile of the path its cost
    model's forwards took, as the trace records it: through a one-row static cache in a static run
    (before 2026-11-26 they were plain forwards, 17.7 ms each on an H200 where the static-cache
    profile said 2.9 ms)."""
    from draftsim.cli import main

    trace = tmp_path / "run"
    assert main(["run", "--target", "tiny:1", "--method", "sd", "--drafter", "controlled:0.8@tiny:2", "--policy", "fixed:k=3",
                 "--static-cache", "--prompts", "code", "--n", "1", "--max-new-tokens", "16", "--trace", str(trace), "--json"]) == 0
    for model in ("tiny:1", "tiny:2"):
        for path in ("server-static", "model"):
            assert main(["profile", "--model", model, "--path", path, "--batch", "1", "--new-tokens", "1,2,4,8", "--context", "0,64,256",
                         "--repeats", "1", "--drafters", "", "--out", str(tmp_path / f"{model}-{path}.json"), "--json"]) == 0
    capsys.readouterr()
    assert json.loads((trace / "manifest.json").read_text())["metadata"]["controlled_cost_path"] == "server-static"
    given = ["--profile", str(tmp_path / "tiny:1-server-static.json"), "--profile", str(tmp_path / "tiny:2-server-static.json")]
    assert main(["check-sim", str(trace), *given]) == 0
    out = capsys.readouterr().out
    assert "profile of tiny:2 (controlled drafter's cost model)" in out and "counts identical" in out
    assert main(["check-sim", str(trace), "--profile", str(tmp_path / "tiny:1-server-static.json"), "--profile",
                 str(tmp_path / "tiny:2-model.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "tiny:2" in err and "--path server-static" in err and len(err.splitlines()) == 1
    assert main(["check-sim", str(trace), "--profile", str(tmp_path / "tiny:1-model.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--path server-static" in err and len(err.splitlines()) == 1


def test_serving_with_static_caches_emits_the_same_tokens(tmp_path, capsys):
    """`serve --static-cache`: every request's tokens and every round's acceptances equal the
    eager server's (continuous batching: rows join, leave and move)."""
    import pyarrow.parquet as pq

    from draftsim.cli import main

    runs = {}
    for label, extra in (("eager", []), ("static", ["--static-cache"])):
        out = tmp_path / label
        assert main(["serve", "--target", "tiny:1", "--drafter", "tiny:3", "--policy", "fixed:k=3", "--qps", "20", "--requests", "10",
                     "--max-batch", "4", "--trace", str(out), "--json", *extra]) == 0
        capsys.readouterr()
        tokens = pq.read_table(out / "tokens").sort_by([("request", "ascending"), ("index", "ascending")])
        members = pq.read_table(out / "members")
        runs[label] = (tokens.column("request").to_pylist(), tokens.column("token").to_pylist(),
                       sorted(zip(members.column("request").to_pylist(), members.column("drafted").to_pylist(),
                                  members.column("accepted").to_pylist())))
    assert runs["eager"] == runs["static"] and len(runs["eager"][1]) > 0
    # the static run is recorded as such, and check-serve prices it with a profile of the same path only
    for path in ("server-static", "server"):
        assert main(["profile", "--model", "tiny:1", "--path", path, "--batch", "1,2,4", "--new-tokens", "1,4", "--context", "0,64",
                     "--repeats", "1", "--drafters", "", "--out", str(tmp_path / f"{path}.json"), "--json"]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "server-static.json").read_text())["fingerprint"]["path"] == "server-static"
    assert main(["check-serve", str(tmp_path / "static"), "--profile", str(tmp_path / "server-static.json"), "--json"]) == 0
    assert {r["metric"] for r in json.loads(capsys.readouterr().out)} >= {"ttft_p50", "throughput"}
    assert main(["check-serve", str(tmp_path / "static"), "--profile", str(tmp_path / "server.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "server-static" in err and len(err.splitlines()) == 1


def test_precapture_walks_every_step_shape(tiny, monkeypatch):
    """Before a timed serving run on a GPU every decoding shape is captured: padded batches up
    to the capacity, new tokens up to the draft window, widths up to the buffer (the capture
    itself needs CUDA; here the walk runs the decoder eagerly in its place)."""
    kv = StaticKV(tiny, rows=3, tokens=64)
    seen = []

    def replay(ids, pos, write, allowed):
        seen.append((ids.shape[0], ids.shape[1], allowed.shape[-1]))
        return kv._decoder(ids, pos, write, allowed)

    monkeypatch.setattr(kv, "_replay", replay)
    kv.graphs = True
    assert kv.precapture(5) == len(seen)
    assert sorted(set(seen)) == sorted(seen)
    assert {b for b, _, _ in seen} == {1, 2, 4} and {n for _, n, _ in seen} == {1, 2, 4, 8} and {t for _, _, t in seen} == {16, 32, 64}
    kv.add_rows(1)
    with pytest.raises(DraftsimError, match="before any row holds tokens"):
        kv.precapture(5)


def test_a_static_profile_grows_its_contexts_in_one_cache_per_batch(tiny, monkeypatch):
    """``profile --path server-static`` fills each batch size's rows once, to the longest context,
    growing them context by context (prefixes of one random sequence) in one cache whose buffers
    and CUDA graphs serve every context, and runs the fills eagerly (no graph captured for a shape
    met once) — where a fresh cache per context refilled it and captured the fill: on the float32
    H200 run, 378 grid points did not finish in 537 s. The timed calls are the only graphed ones."""
    from draftsim.realrun.profiling import profile_model

    made, calls = [], []
    init, forward = StaticKV.__init__, StaticKV.forward

    def counting_init(self, *args, **kwargs):
        made.append(args[0] if args else None)
        init(self, *args, **kwargs)

    def counting_forward(self, feeds, keep, hidden=False, graph=True):
        calls.append((len(feeds), max(len(f) for f in feeds), graph))
        return forward(self, feeds, keep, hidden, graph)

    monkeypatch.setattr(StaticKV, "__init__", counting_init)
    monkeypatch.setattr(StaticKV, "forward", counting_forward)
    tiny.kv_pool.clear()
    prof = profile_model(tiny, [1, 2], [1, 4], [0, 40, 100], repeats=1, warmup=0, path="server-static")
    assert prof.path == "server-static" and (prof.seconds > 0).all()
    assert len(made) == 2  # batch 1 and batch 2, each cache reused across the contexts (and by the last-row table)
    fills = [(b, n) for b, n, graph in calls if not graph]
    # per batch size the rows grow 0 -> 40 -> 100 (the last-row table of batch 1 again): 40 then 60 tokens each time
    assert fills == [(1, 40), (1, 60), (2, 40), (2, 60), (1, 40), (1, 60)]
    assert {n for _, n, graph in calls if graph} == {1, 4}  # the timed calls


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(1, 9))
def test_the_cache_runs_the_padded_shape_the_simulator_prices(tiny, rows, held, n):
    """StaticKV.forward's padded shape (rows, new tokens, attention width) is the one
    draftsim.sim.cost.profile.static_shape prices (its one definition, read by check-sim and
    check-serve), wherever the padded width fits the buffer."""
    from draftsim.sim.cost.profile import static_shape

    held = (held * rows)[:rows]
    kv = StaticKV(tiny, 6, 64, graphs=False)
    kv.add_rows(rows)
    kv.forward([[3] * h for h in held], [0] * rows)
    seen = []
    run = kv._run

    def spy(ids, pos, allowed, *args, **kwargs):
        seen.append((ids.shape[0], ids.shape[1], allowed.shape[-1]))
        return run(ids, pos, allowed, *args, **kwargs)

    kv._run = spy
    kv.forward([[5] * n] * rows, [1] * rows)
    want = tuple(int(x) for x in static_shape(rows, n, max(held), 6, 64))
    if max(held) + want[1] <= kv.tokens:  # past the buffer the call runs at its own width (not priced padded)
        assert seen[-1] == want


def test_a_server_prefill_profile_times_a_fresh_eager_one_row_cache_per_call(tiny, monkeypatch):
    """``profile --path server-prefill`` times what the server's joiner prefill runs
    (``Server._prefill``): every call a fresh one-row static cache without CUDA graphs; only batch 1
    at context 0 (refused otherwise, before anything runs)."""
    import draftsim.realrun.kvcache as kvcache
    from draftsim.realrun.profiling import profile_model

    made, make = [], kvcache.make_kv

    def spy(loaded, rows=1, graphs=None):
        made.append((rows, graphs, loaded.static_tokens))
        return make(loaded, rows, graphs)

    monkeypatch.setattr(kvcache, "make_kv", spy)
    prof = profile_model(tiny, [1], [1, 4, 16], [0], repeats=2, warmup=1, path="server-prefill")
    assert prof.fingerprint["path"] == "server-prefill" and prof.last_row_seconds is not None
    # one cache per timed call (warm-ups, repeats, the last-row pass), each one row, eager, a static cache
    assert len(made) >= 2 * 3 * 3 and {(r, g) for r, g, _ in made} == {(1, False)} and all(t for _, _, t in made)
    assert tiny.static_tokens is None  # the model's setting is restored
    for batch, context in (([1, 2], [0]), ([1], [0, 64])):
        with pytest.raises(DraftsimError, match="server-prefill times a joiner's prefill"):
            profile_model(tiny, batch, [1], context, path="server-prefill")


def test_check_serve_prices_the_drafters_prompt_read_from_its_own_prefill_profile(tmp_path, capsys):
    """A static serving run's prefills priced by the target's ``server-prefill`` profile and, given
    a second ``--prefill-profile``, the draft model's read of each prompt (the server times it inside
    the prefill) on top: the predicted TTFT grows; a second profile of another model is refused in
    one line."""
    from draftsim.cli import main

    trace = tmp_path / "static"
    assert main(["serve", "--target", "tiny:1", "--drafter", "tiny:3", "--policy", "fixed:k=3", "--qps", "20", "--requests", "8",
                 "--max-batch", "4", "--trace", str(trace), "--json", "--static-cache"]) == 0
    for model, path, batch, context in (("tiny:1", "server-static", "1,2,4", "0,64"), ("tiny:1", "server-prefill", "1", "0"),
                                        ("tiny:3", "server-prefill", "1", "0")):
        assert main(["profile", "--model", model, "--path", path, "--batch", batch, "--new-tokens", "1,4,16,64", "--context", context,
                     "--repeats", "1", "--drafters", "", "--out", str(tmp_path / f"{model}-{path}.json"), "--json"]) == 0
    capsys.readouterr()
    step, target, drafter = (str(tmp_path / f) for f in ("tiny:1-server-static.json", "tiny:1-server-prefill.json", "tiny:3-server-prefill.json"))
    ttft = {}
    for label, files in (("target", [target]), ("both", [target, drafter])):
        assert main(["check-serve", str(trace), "--profile", step, *[x for p in files for x in ("--prefill-profile", p)], "--json"]) == 0
        ttft[label] = next(r["predicted"] for r in json.loads(capsys.readouterr().out) if r["metric"] == "ttft_p50")
    assert ttft["both"] > ttft["target"]
    assert main(["check-serve", str(trace), "--profile", step, "--prefill-profile", target, "--prefill-profile", target]) == 2
    err = capsys.readouterr().err.strip()
    assert "drafter's prompt read" in err and "tiny:3" in err and len(err.splitlines()) == 1
    # the drafter's calls from a profile of its model on the static path (--draft-profile); another path, another model or
    # the catalog deployment beside it refused in one line
    assert main(["profile", "--model", "tiny:3", "--path", "server-static", "--batch", "1,2,4", "--new-tokens", "1,2", "--context",
                 "0,64", "--repeats", "1", "--drafters", "", "--out", str(tmp_path / "tiny:3-server-static.json"), "--json"]) == 0
    capsys.readouterr()
    calls = str(tmp_path / "tiny:3-server-static.json")
    assert main(["check-serve", str(trace), "--profile", step, "--draft-profile", calls, "--json"]) == 0
    assert {r["metric"] for r in json.loads(capsys.readouterr().out)} >= {"tpot_p50", "throughput"}
    for bad, words in ((["--profile", step, "--draft-profile", drafter], "--path server-static"),
                       (["--profile", step, "--draft-profile", step], "must be of its model"),
                       (["--hardware", "h100-sxm", "--draft-profile", calls], "not both")):
        assert main(["check-serve", str(trace), *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
