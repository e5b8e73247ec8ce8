"""Sweeps (analysis.sweep, draftsim sweep): spec schema and expansion, per-point seeds,
bit-identical results with 1 and 2 workers and on Ray, resume after SIGKILL, failed points,
malformed specs refused up front with nothing written."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from draftsim.analysis import sweep as sw
from draftsim.cli import main
from draftsim.sim.errors import DraftsimError
from draftsim.sweepkinds import KINDS

GRID = """
version = 1
kind = "simulate"
seed = 11
replications = 2
metrics = ["ewif", "ewif_se", "acceptance_rate", "analytic_ewif"]
[base]
cost = [0.05]
tokens = {tokens}
[grid]
alpha = [0.6, 0.75, 0.9]
[[zip]]
policy = ["fixed:k=2", "fixed:k=5"]
verify-per-token = [0.0, 0.01]
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def spec_of(text: str) -> sw.Spec:
    import tomllib

    return sw.parse_spec(tomllib.loads(text), KINDS)


def frame(folder) -> dict:
    """The stored table as {column: list}, sorted by task, without the timing column."""
    table = sw.load(folder)
    return {c: table.column(c).to_pylist() for c in table.column_names if c not in ("seconds", "cpu_seconds")}


# --- spec schema and expansion ----------------------------------------------------------------


def test_points_grid_zip_ranges_and_random():
    spec = spec_of("""
version = 1
kind = "simulate"
seed = 5
[base]
cost = [0.05]
[grid]
alpha = { start = 0.5, stop = 0.9, num = 3 }
tokens = { start = 1000, stop = 3000, step = 1000 }
[[zip]]
policy = ["fixed:k=2", "fixed:k=3"]
sequences = [16, 32]
[random]
n = 4
seed = 9
pred-noise = { uniform = [0.0, 1.0] }
requests = { integers = [1, 3] }
""")
    assert spec.axes == ["alpha", "tokens", "policy", "sequences", "pred_noise", "requests"]
    assert spec.n_points == 3 * 3 * 2 * 4
    points = list(spec.points())
    assert len(points) == spec.n_points and [p.index for p in points] == list(range(spec.n_points))
    assert sorted({p.values["alpha"] for p in points}) == pytest.approx([0.5, 0.7, 0.9])
    assert sorted({p.values["tokens"] for p in points}) == [1000, 2000, 3000]
    assert all(isinstance(p.values["tokens"], int) for p in points)
    # zipped lists move together; the last axis varies fastest
    assert {(p.values["policy"], p.values["sequences"]) for p in points} == {("fixed:k=2", 16), ("fixed:k=3", 32)}
    assert [p.values["pred_noise"] for p in points[:4]] != [p.values["pred_noise"] for p in points[:1]] * 4
    assert points[0].values["alpha"] == points[4].values["alpha"] and points[0].config["cost"] == [0.05]
    # random samples: seeded, in range, the same on every expansion
    again = list(sw.parse_spec(spec.raw, KINDS).points())
    assert [p.values for p in again] == [p.values for p in points]
    assert all(0 <= p.values["pred_noise"] <= 1 and 1 <= p.values["requests"] <= 3 for p in points)


def test_seeds_are_per_task_and_independent_of_order():
    spec = spec_of(GRID.format(tokens=1000))
    tasks = list(spec.tasks())
    assert [t.id for t in tasks] == list(range(spec.n_tasks)) == list(range(3 * 2 * 2))
    seeds = [t.seed for t in tasks]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**63 for s in seeds)
    assert seeds == [sw.derive_seed(11, t.point, t.replication) for t in tasks]
    other = spec_of(GRID.format(tokens=1000).replace("seed = 11", "seed = 12"))
    assert not set(seeds) & {t.seed for t in other.tasks()}


# --- running: identical with any number of workers, on Ray, and after resume ----------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The grid run in this process (1 worker)."""
    out = tmp_path_factory.mktemp("ref") / "out"
    spec = spec_of(GRID.format(tokens=20000))
    summary = sw.run_sweep(spec, KINDS["simulate"], out, workers=1)
    assert (summary.ran, summary.failed, summary.already_done) == (spec.n_tasks, 0, 0)
    return out


def test_results_load_with_pandas_and_pyarrow(reference):
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(reference / "results").sort_values("task")
    assert list(df["task"]) == list(range(12)) and (df["status"] == "ok").all()
    assert {"alpha", "policy", "verify_per_token", "ewif", "ewif_se", "seed", "replication"} <= set(df.columns)
    assert pq.read_table(reference / "results").num_rows == 12
    info = sw.read_manifest(reference)
    assert info["complete"] and info["done"] == info["tasks"] == 12 and info["failed"] == 0
    # the analytic EWIF (known for constant verification cost) is within a few standard errors
    assert df["analytic_ewif"].isna().tolist() == (df["verify_per_token"] > 0).tolist()
    for _, row in df[df["analytic_ewif"].notna()].iterrows():
        assert abs(row["ewif"] - row["analytic_ewif"]) < 6 * row["ewif_se"] + 1e-3
    # the two replications are independent draws
    assert df.groupby("point")["ewif"].nunique().min() == 2


@pytest.mark.slow  # 6.5 s measured (pytest --durations, 2-core machine)
def test_two_workers_give_identical_results(reference, tmp_path):
    status = main(["sweep", str(write(tmp_path, GRID.format(tokens=20000))), "--out", str(tmp_path / "two"), "--workers", "2"])
    assert status == 0
    assert frame(tmp_path / "two") == frame(reference)


KILL_SPEC = GRID.replace("[grid]\nalpha = [0.6, 0.75, 0.9]", "[grid]\nalpha = {{ start = 0.5, stop = 0.9, num = 10 }}")


def _child(spec_text: str, out: str, workers: int, hook: str | None, count: int) -> None:
    """Run the sweep in a new process group; with ``hook``, SIGKILL this process the
    ``count``-th time the store reaches that point of a commit."""
    os.setsid()
    if hook == "before_manifest":  # the shard is renamed into place, the manifest is not rewritten
        original = sw.Store.write_manifest
        calls = {"n": 0}

        def write_manifest(self, complete):
            calls["n"] += 1
            if calls["n"] == count:
                os.kill(os.getpid(), signal.SIGKILL)
            original(self, complete)

        sw.Store.write_manifest = write_manifest
    elif hook == "before_rename":  # the shard is written to its temporary file only
        original_replace = os.replace
        calls = {"n": 0}

        def replace(src, dst):
            if str(dst).endswith(".parquet"):
                calls["n"] += 1
                if calls["n"] == count:
                    os.kill(os.getpid(), signal.SIGKILL)
            original_replace(src, dst)

        os.replace = replace
    sw.run_sweep(spec_of(spec_text), KINDS["simulate"], out, workers=workers, resume=True, flush_seconds=0.0)


def _resume_until_done(spec_text: str, out: Path) -> sw.Summary:
    return sw.run_sweep(spec_of(spec_text), KINDS["simulate"], out, workers=1, resume=True)


# the manifest is first written when the store opens: call 2 follows the first shard
@pytest.mark.parametrize("hook,count", [("before_manifest", 2), ("before_manifest", 5), ("before_rename", 1), ("before_rename", 3)])
def test_kill_at_a_commit_point_then_resume(tmp_path, hook, count):
    text = KILL_SPEC.format(tokens=5000)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_child, args=(text, str(tmp_path / "out"), 1, hook, count))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    stored = {int(t) for s in (tmp_path / "out" / "results").glob("part-*.parquet") for t in pq.read_table(s)["task"].to_pylist()}
    assert len(stored) == (count - 1 if hook == "before_rename" else count - 1)  # one task per shard (flush_seconds 0)
    _resume_until_done(text, tmp_path / "out")
    clean = tmp_path / "clean"
    sw.run_sweep(spec_of(text), KINDS["simulate"], clean, workers=1)
    got = frame(tmp_path / "out")
    assert got["task"] == list(range(40))  # nothing lost, nothing twice
    assert got == frame(clean)
    assert not list((tmp_path / "out" / "results").glob(".*"))  # temporaries of the killed run removed


def _stored(out: Path) -> int:
    shards = list((out / "results").glob("part-*.parquet")) if (out / "results").exists() else []
    return sum(pq.read_metadata(s).num_rows for s in shards)


@pytest.mark.slow  # 48.5 s measured (pytest --durations, 2-core machine)
def test_sigkill_at_random_times_with_two_workers_loses_and_repeats_nothing(tmp_path):
    """Kill the sweep (and its workers) three times at random points: once a random number of
    further tasks is stored, after a random extra delay — mid-task, mid-commit, anywhere."""
    text = KILL_SPEC.replace("num = 10", "num = 6").format(tokens=20000000)  # 24 tasks of ~0.3 s: the kills land mid-sweep
    out = tmp_path / "out"
    rng = random.Random(1234)
    # spawn: a forked child would inherit this process's forkserver (started by earlier tests)
    ctx = multiprocessing.get_context("spawn")
    kills, done = 0, [0]
    for _ in range(3):
        target = min(done[-1] + rng.randint(1, 6), 18)  # at least ~3 tasks a worker still to run
        child = ctx.Process(target=_child, args=(text, str(out), 2, None, 0))
        child.start()
        deadline = time.monotonic() + 60
        while child.is_alive() and _stored(out) < target and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.2))
        try:
            os.killpg(child.pid, signal.SIGKILL)  # the child, its forkserver and its workers
            kills += 1
        except ProcessLookupError:  # it had finished
            pass
        child.join(30)
        done.append(_stored(out))
    assert kills == 3 and done == sorted(done) and done[-1] < 24, done
    summary = sw.run_sweep(spec_of(text), KINDS["simulate"], out, workers=2, resume=True)
    got = frame(out)
    assert got["task"] == list(range(24))  # nothing lost, nothing twice
    assert summary.already_done == done[-1] and summary.already_done + summary.ran == 24
    clean = tmp_path / "clean"
    sw.run_sweep(spec_of(text), KINDS["simulate"], clean, workers=2)
    assert got == frame(clean)
    assert sw.read_manifest(out)["complete"]


def test_resume_refuses_a_different_spec_and_a_sweep_without_resume(reference, tmp_path, capsys):
    spec = write(tmp_path, GRID.format(tokens=20000).replace("seed = 11", "seed = 12"))
    assert main(["sweep", str(spec), "--out", str(reference), "--resume"]) == 2
    assert "holds a different sweep" in capsys.readouterr().err
    same = write(tmp_path, GRID.format(tokens=20000), "same.toml")
    assert main(["sweep", str(same), "--out", str(reference)]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(["sweep", str(same), "--out", str(reference), "--resume", "--json"]) == 0
    assert '"ran": 0' in capsys.readouterr().out


def test_a_sweep_killed_before_its_first_manifest_starts_afresh(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / ".part-000000-x.parquet.tmp").write_bytes(b"half a shard")
    spec = write(tmp_path, GRID.format(tokens=1000))
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1"]) == 0
    assert frame(out)["task"] == list(range(12)) and not list((out / "results").glob(".*"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "other")]) == 2
    assert "other files in it and no sweep" in capsys.readouterr().err


# --- failed points -----------------------------------------------------------------------------


def check_anything(config: dict) -> None:
    if config.get("bad") == 1:
        raise DraftsimError(f"bad = {config['bad']!r} is refused")


def run_or_fail(config: dict, seed: int | None) -> dict:
    if config["x"] % 3 == 2:
        raise RuntimeError(f"x = {config['x']} fails\nat run time")
    return {"value": {"x2": config["x"] * 2}, "seed": seed}


TOY = sw.Kind("toy", check_anything, run_or_fail, {"x2": "value.x2", "missing": "value.nothing"}, ("x2",))


def test_a_failed_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    spec = sw.parse_spec({"version": 1, "kind": "toy", "grid": {"x": [0, 1, 2, 3, 4, 5]}, "metrics": ["x2", "missing"]}, {"toy": TOY})
    summary = sw.run_sweep(spec, TOY, tmp_path / "out", workers=1)
    assert (summary.ran, summary.failed) == (6, 2)
    got = frame(tmp_path / "out")
    assert got["status"] == ["ok", "ok", "failed", "ok", "ok", "failed"]
    assert got["error"][2] == "RuntimeError: x = 2 fails at run time" and got["error"][0] is None
    assert got["x2"] == [0.0, 2.0, None, 6.0, 8.0, None] and got["missing"] == [None] * 6
    # resuming does not repeat failed points either
    assert sw.run_sweep(spec, TOY, tmp_path / "out", resume=True).ran == 0
    with pytest.raises(DraftsimError, match=r"^point 1 \(x=0, bad=1\): bad = 1 is refused$"):
        sw.validate_points(sw.parse_spec({"version": 1, "kind": "toy", "grid": {"x": [0, 1]}, "zip": {"bad": [0, 1]}}, {"toy": TOY}), TOY)


def always_fail(config: dict, seed: int | None) -> dict:
    raise RuntimeError(f"x = {config['x']} always fails")


FAILING = sw.Kind("failing", check_anything, always_fail, {"x2": "value.x2"}, ("x2",))


def test_every_run_failed_exits_1_and_sweep_plot_refuses_nothing_to_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(KINDS, "failing", FAILING)
    spec = write(tmp_path, 'version = 1\nkind = "failing"\nmetrics = ["x2"]\n[grid]\nx = [0, 1, 2]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1"]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == ["draftsim sweep: every run failed (3 of 3); first error: RuntimeError: x = 0 always fails"]
    assert "3 failed" in captured.out
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--resume", "--json"]) == 1  # still nothing
    capsys.readouterr()
    assert main(["sweep-plot", str(out), "--x", "x", "--metric", "x2", "--out", str(tmp_path / "f.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no finite value" in err[0] and "3 of 3 run(s) failed" in err[0]
    assert not (tmp_path / "f.png").exists()


def test_some_failed_runs_exit_0_with_their_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(KINDS, "toy", TOY)
    spec = write(tmp_path, 'version = 1\nkind = "toy"\nmetrics = ["x2"]\n[grid]\nx = [0, 1, 2]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    assert "failed: RuntimeError: x = 2 fails at run time" in capsys.readouterr().out


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    """Two sweeps into one folder would interleave their shards: the folder is locked by its writer."""
    spec = sw.parse_spec({"version": 1, "kind": "toy", "grid": {"x": [0, 1, 3]}, "metrics": ["x2"]}, {"toy": TOY})
    out = tmp_path / "out"
    holder = sw.storage.lock(out)  # another writer (a separate open file: flock conflicts within one process too)
    try:
        with pytest.raises(DraftsimError, match=rf"is being written by draftsim pid {os.getpid()} on .* since .*; wait for it"):
            sw.run_sweep(spec, TOY, out, workers=1)
        assert not (out / "results").exists() and not (out / "manifest.json").exists()
    finally:
        holder.close()
    assert sw.run_sweep(spec, TOY, out, workers=1).ran == 3  # released: the sweep runs
    assert sw.run_sweep(spec, TOY, out, workers=1, resume=True).ran == 0  # and the lock went with its writer


def test_check_reads_the_files_a_run_would(tmp_path, capsys):
    """sweep --check validates what every point's run would read: a missing request trace is
    refused at the check, not discovered by every run failing."""
    spec = write(tmp_path, 'version = 1\nkind = "serve"\n[base]\npolicy = "fixed:k=4"\nalpha = 0.8\nrequests = 5\n'
                           'target = "llama-3.1-8b"\nhardware = "h100-sxm"\ndrafter-model = ["eagle3"]\n'
                           f'request-trace = "{tmp_path}/missing.csv"\n[grid]\nqps = [1, 2]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "point 0 (qps=1): request trace" in err and "missing.csv: no such file" in err


def test_load_refuses_a_task_stored_twice(tmp_path):
    spec = sw.parse_spec({"version": 1, "kind": "toy", "grid": {"x": [0, 1, 3]}, "metrics": ["x2"]}, {"toy": TOY})
    sw.run_sweep(spec, TOY, tmp_path / "out", workers=1)
    shard = next((tmp_path / "out" / "results").glob("part-*.parquet"))
    (shard.parent / "part-999999-copy.parquet").write_bytes(shard.read_bytes())
    with pytest.raises(DraftsimError, match="task 0 is stored twice"):
        sw.load(tmp_path / "out")
    (shard.parent / "part-999999-copy.parquet").write_bytes(b"PAR1 garbage")
    with pytest.raises(DraftsimError, match="not readable Parquet"):
        sw.load(tmp_path / "out")


# --- malformed specs: one line, exit 2, nothing written ------------------------------------------

BASE = 'version = 1\nkind = "simulate"\n[base]\npolicy = "fixed:k=4"\ncost = [0.05]\ntokens = 1000\n'


@pytest.mark.parametrize("text,message", [
    ("version = 1\nkind = 'simulate'\nsed = 3\n", "unknown spec key 'sed'"),
    ("kind = 'simulate'\n", "needs version = 1"),
    ("version = 2\nkind = 'simulate'\n", "spec version 2 is not supported"),
    ("version = 1\nkind = 'simulat'\n", "kind 'simulat' is not a sweep kind"),
    (BASE + "[grid]\nalpha = []\n", "the axis is empty"),
    (BASE + "[grid]\nalpah = [0.5]\n", "has no option --alpah"),
    (BASE + "[grid]\nalpha = [0.5, 'high']\n", "point 1 (alpha='high'): argument --alpha"),
    (BASE + "[grid]\nalpha = [0.5, 1.5]\n", "alpha must lie in [0, 1]; got 1.5"),
    (BASE + "[grid]\nalpha = 0.5\n", "an axis is a list of values or a range table"),
    (BASE + "[grid]\nalpha = { start = 0.9, stop = 0.5, num = 3 }\n", "stop 0.5 is below start 0.9"),
    (BASE + "[grid]\nalpha = [0.5]\ntokens = [10]\n", "option 'tokens' is set in [base] and again in [grid]"),
    (BASE + "[grid]\nalpha = [0.5]\nseed = [1, 2]\n", "seeds are derived per point"),
    (BASE + "[grid]\nalpha = [0.5]\ntimeline = ['a.json']\n", "has no option --timeline"),  # an output, not a point's option
    (BASE + "[[zip]]\nalpha = [0.5, 0.6]\nrequests = [1]\n", "zipped lists must have one length"),
    (BASE + "[random]\nalpha = { uniform = [0.5, 0.9] }\n", "[random] needs n"),
    (BASE + "[random]\nn = 3\nalpha = { gaussian = [0.5, 0.9] }\n", "a random axis is one of"),
    (BASE + "replications = 0\n", "unknown"),  # a top-level key after [base] is an option of [base]
    ('version = 1\nkind = "simulate"\nreplications = 0\n', "replications must lie in [1, 100000]"),
    ('version = 1\nkind = "simulate"\nreplications = "two"\n', "replications must be an integer"),
    ('version = 1\nkind = "simulate"\nmetrics = ["ewif", "speed"]\n', "unknown metric 'speed'"),
    (BASE + "alpha = 0.8\nseparate-drafter = 1\n", "--separate-drafter is a flag"),
    (BASE + "alpha = [0.8, 0.9]\n", "--alpha takes one value"),
    ('version = 1\nkind = "simulate"\n[base\n', "is not valid TOML"),
    (BASE + "[grid]\nalpha = [0.5]\nexecutor = ['des']\nsequences = [16]\n", "--sequences 16 applies to --executor mc"),
    (BASE.replace("cost = [0.05]\n", "") + "alpha = 0.8\n", "policy fixed:k=4 uses 1 drafter(s): give --cost"),
    ('version = 1\nkind = "optimize"\n[base]\nwhat = "threshold"\n[grid]\nalpha = [0.5]\nmarkov = ["0.9,0.2"]\n',
     "give exactly one of --alpha or --markov"),
    ('version = 1\nkind = "simulate"\nmetrics = ["tokens"]\n[grid]\ntokens = [1000, 2000]\n', "both a varied option and a kept metric"),
    ('version = 1\nkind = "toy"\n', "kind 'toy' is not a sweep kind; choose from simulate, serve, optimize, replay"),
    ('version = 1\nkind = "simulate"\n[base]\nx = ' + "[" * 5000 + "]" * 5000 + "\n", "nests tables or arrays too deeply"),
    ("version = 1\n" + "#" * (5 * 2**20) + "\n", "draftsim reads at most 4,194,304"),
    (BASE + "[grid]\na = { start = 1, stop = 1000, num = 1000 }\nb = { start = 1, stop = 1000, num = 1000 }\n"
     "c = { start = 1, stop = 1000, num = 1000 }\n", "1,000,000,000 points"),
])
def test_malformed_specs_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, text, message):
    if message == "unknown":
        message = "has no option --replications"
    spec = write(tmp_path, text)
    out = tmp_path / "out"
    status = main(["sweep", str(spec), "--out", str(out)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("draftsim sweep: error:"), err
    assert message in err, err
    assert not out.exists()


def test_a_sweep_over_the_limit_needs_force(tmp_path, capsys):
    text = BASE + "alpha = 0.8\n[grid]\nrequests = { start = 1, stop = 400, step = 1 }\nsequences = { start = 16, stop = 415, step = 1 }\n"
    assert main(["sweep", str(write(tmp_path, text)), "--out", str(tmp_path / "out"), "--check"]) == 2
    assert "160,000 points x 1 replication(s) = 160,000 runs, more than 100,000: pass --force" in capsys.readouterr().err
    spec = spec_of(text)
    sw.check_size(spec, force=True)
    with pytest.raises(DraftsimError, match="more than 1,000"):
        sw.check_size(spec, limit=1000)
    assert not (tmp_path / "out").exists()


def test_check_reports_the_size_and_writes_nothing(tmp_path, capsys):
    assert main(["sweep", str(write(tmp_path, GRID.format(tokens=1000))), "--out", str(tmp_path / "out"), "--check"]) == 0
    assert "6 points x 2 replication(s) = 12 runs over alpha, policy, verify_per_token; every point is valid" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


# --- other kinds and the plot ------------------------------------------------------------------------


@pytest.mark.slow  # 6.9 s measured (pytest --durations, 2-core machine)
def test_optimize_and_replay_kinds(tmp_path):
    spec = spec_of('version = 1\nkind = "optimize"\nmetrics = ["optimal", "best_fixed_k", "oracle"]\n[base]\nwhat = "threshold"\n'
                   'sweep = "0.05,0.05,1"\n[grid]\nalpha = [0.6, 0.9]\nt-draft = [0.02, 0.2]\n')
    sw.run_sweep(spec, KINDS["optimize"], tmp_path / "opt")
    got = frame(tmp_path / "opt")
    assert got["status"] == ["ok"] * 4 and got["seed"] == [None] * 4
    assert all(o <= v for o, v in zip(got["oracle"], got["optimal"]))
    k = got["best_fixed_k"]  # points (alpha, t_draft): (0.6, 0.02), (0.6, 0.2), (0.9, 0.02), (0.9, 0.2)
    assert k[2] > k[3] and k[0] > k[1] and k[3] > k[1]  # a dearer drafter drafts less, a better one more
    from draftsim.sim.traces import EMBEDDED_TRACE

    trace = str(EMBEDDED_TRACE)
    spec = spec_of(f'version = 1\nkind = "replay"\n[base]\ntrace = "{trace}"\n[grid]\npolicy = ["fixed:k=2", "fixed:k=6"]\n')
    sw.run_sweep(spec, KINDS["replay"], tmp_path / "replay")
    got = frame(tmp_path / "replay")
    assert got["status"] == ["ok", "ok"]
    assert all(0 < e < o for e, o in zip(got["ewif"], got["oracle_speedup"]))  # the oracle is an upper bound


def test_sweep_plot_heatmap_and_lines(reference, tmp_path, capsys):
    heat, line = tmp_path / "heat.png", tmp_path / "line.png"
    assert main(["sweep-plot", str(reference), "--x", "alpha", "--y", "policy", "--metric", "ewif", "--out", str(heat)]) == 0
    assert main(["sweep-plot", str(reference), "--x", "alpha", "--metric", "ewif", "--out", str(line), "--json"]) == 0
    assert heat.stat().st_size > 1000 and line.stat().st_size > 1000
    assert '"averaged_over"' in capsys.readouterr().out
    assert main(["sweep-plot", str(reference), "--x", "alhpa", "--metric", "ewif", "--out", str(line)]) == 2
    assert main(["sweep-plot", str(reference), "--x", "alpha", "--metric", "speed", "--out", str(line)]) == 2
    assert "is not a metric of the sweep" in capsys.readouterr().err
    assert main(["sweep-plot", str(reference), "--x", "alpha", "--metric", "ewif", "--where", "policy=fixed:k=5",
                 "--out", str(line), "--json"]) == 0
    out = capsys.readouterr().out
    assert '"policy": "fixed:k=5"' in out and '"averaged_over": []' in out  # verify_per_token is zipped with policy
    assert main(["sweep-plot", str(reference), "--x", "alpha", "--metric", "ewif", "--where", "policy=fixed:k=9", "--out", str(line)]) == 2
    assert "no point has policy = fixed:k=9; its values: fixed:k=2, fixed:k=5" in capsys.readouterr().err
    groups = sw.aggregate(sw.load(reference), ["alpha"], "ewif")
    means = [groups[(a,)][0] for a in (0.6, 0.75, 0.9)]
    assert means == sorted(means) and all(groups[(a,)][2] == 4 for a in (0.6, 0.75, 0.9))
    assert np.isfinite([groups[(a,)][1] for a in (0.6, 0.75, 0.9)]).all()


# --- Ray (last: the session stays up until the module ends) ---------------------------------------------


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'draftsim[ray]')")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


def test_ray_gives_identical_results(reference, tmp_path, ray_session):
    spec = spec_of(GRID.format(tokens=20000))
    summary = sw.run_sweep(spec, KINDS["simulate"], tmp_path / "ray", workers=2, ray=True)
    assert summary.backend == "ray" and summary.ran == 12
    assert frame(tmp_path / "ray") == frame(reference)


def test_capacity_on_ray_matches_the_pool(tmp_path, ray_session):
    from draftsim.analysis import capacity as cap
    from tests.analysis.test_capacity import DES_SPEC

    spec = spec_of(DES_SPEC)
    cap.run_capacity(spec, KINDS["simulate"], tmp_path / "pool", workers=1)
    cap.run_capacity(spec_of(DES_SPEC), KINDS["simulate"], tmp_path / "ray", workers=2, ray=True)
    assert frame(tmp_path / "ray") == frame(tmp_path / "pool")


def test_the_command_line_runs_on_ray(reference, tmp_path, ray_session, capsys):
    spec = write(tmp_path, GRID.format(tokens=20000))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "cli"), "--workers", "2", "--ray", "--json"]) == 0
    assert '"backend": "ray"' in capsys.readouterr().out
    assert frame(tmp_path / "cli") == frame(reference)


@pytest.mark.parametrize("field, value", [("spec_sha256", 12345), ("axes", "alpha"), ("tasks", "12"), ("shards", {})])
def test_a_hand_edited_manifest_is_one_line(tmp_path, capsys, field, value):
    import json

    spec = sw.parse_spec({"version": 1, "kind": "toy", "grid": {"x": [0, 1]}, "metrics": ["x2"]}, {"toy": TOY})
    sw.run_sweep(spec, TOY, tmp_path / "out", workers=1)
    path = tmp_path / "out" / "manifest.json"
    info = json.loads(path.read_text())
    info[field] = value
    path.write_text(json.dumps(info))
    with pytest.raises(DraftsimError, match=f"manifest field {field} must be"):
        sw.read_manifest(tmp_path / "out")


def test_sweep_prints_a_table_of_its_points(tmp_path, capsys, monkeypatch):
    """After a sweep, one row per point (sorted by its axes) with each metric's mean over the
    replications that succeeded and their count; a failed point shows "-"; --json is unchanged."""
    monkeypatch.setitem(KINDS, "toy", TOY)
    spec = write(tmp_path, 'version = 1\nkind = "toy"\nreplications = 2\nmetrics = ["x2"]\n[grid]\nx = [3, 1, 2, 0]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split() == ["x", "x2", "runs"])
    assert [line.split() for line in lines[at + 2:at + 6]] == [["0", "0", "2"], ["1", "2", "2"], ["2", "-", "0"], ["3", "6", "2"]]
    assert main(["sweep", str(spec), "--out", str(tmp_path / "json"), "--workers", "1", "--json"]) == 0
    assert "runs" not in capsys.readouterr().out.split("\n", 1)[0]
