"""Review mends (helper-61): one reader of times with units for every time-valued option; the
sweep's and serve-sim's load tables honest about runs not at steady state; labels that say what
a number is; text and --json agreeing; output folders created like the other commands'."""

from __future__ import annotations

import json

import pytest
from clirun import run

from draftsim import args as a
from draftsim.sim.errors import DraftsimError

BASE = ("serve-sim", "--target", "llama-2-7b", "--drafter", "smollm2-135m", "--hardware", "h100-sxm", "--alpha", "0.8")


# ------------------------------------------------------------------ 1. times with units


@pytest.mark.parametrize("text, seconds", [("30", 30.0), ("0.5", 0.5), ("500ms", 0.5), ("500 ms", 0.5), ("2s", 2.0), ("2m", 120.0),
                                           ("2min", 120.0), ("1.5h", 5400.0), ("250us", 250e-6), ("1e3ms", 1.0), ("2M", 120.0)])
def test_a_time_is_seconds_or_a_number_with_a_unit(text, seconds):
    assert a.parse_seconds("duration", text) == pytest.approx(seconds)
    assert a.duration("duration")(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, message", [("5xs", "unknown unit 'xs'; valid: us, µs, ms, s, m, min, h"),
                                           ("ms", "must be a time, a number of seconds, or a number with a unit"),
                                           ("１s", "must be a time"), ("", "must be a time"), ("0", "must be finite and > 0; got 0"),
                                           ("-2m", "must be finite and > 0; got -2m"), ("inf", "must be finite and > 0")])
def test_a_bad_time_names_the_value_and_what_is_valid(text, message):
    with pytest.raises(Exception) as info:
        a.duration("duration")(text)
    assert message in str(info.value)
    if not message.startswith("must be finite"):
        with pytest.raises(DraftsimError):
            a.parse_seconds("duration", text)


def test_serve_sim_takes_units_for_every_time_option(capsys):
    """--duration 0.25m and --slo-ttft 500ms --slo-tpot 50ms read as 15 s, 0.5 s and 0.05 s: the
    same run as the bare seconds (before: '500ms' and '2m' were refused, seconds only)."""
    common = (*BASE, "--qps", "4", "--output-len", "fixed:32", "--prompt-len", "fixed:64", "--replications", "1", "--json")
    status, out, err = run(capsys, *common, "--duration", "0.25m", "--slo-ttft", "500ms", "--slo-tpot", "50ms")
    assert status == 0, err
    units = json.loads(out)
    status, out, err = run(capsys, *common, "--duration", "15", "--slo-ttft", "0.5", "--slo-tpot", "0.05")
    assert status == 0, err
    bare = json.loads(out)
    assert units["requests"] == bare["requests"] and units["goodput"] == bare["goodput"] and units["ttft"] == bare["ttft"]


@pytest.mark.parametrize("argv, message", [
    ((*BASE, "--qps", "2", "--slo-ttft", "5xs"), "argument --slo-ttft: slo_ttft '5xs': unknown unit 'xs'"),
    ((*BASE, "--qps", "2", "--duration", "-1s"), "argument --duration: duration must be finite and > 0; got -1s"),
    (("serve", "--duration", "2q"), "argument --duration: duration '2q': unknown unit 'q'"),
    (("capacity", "--duration", "soon"), "argument --duration: duration must be a time"),
])
def test_a_bad_time_on_the_command_line_is_one_line_exit_2(capsys, argv, message):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_serve_and_capacity_read_times_with_units(capsys):
    """draftsim serve and capacity's front door take the same reader (their --duration)."""
    from draftsim.commands.serve import ServeConfig
    from draftsim.commands.sweeping import CapacityConfig
    from draftsim.config import options

    for cls in (ServeConfig, CapacityConfig):
        assert options(cls)["duration"][1].type("2m") == 120.0


# ------------------------------------------------------------------ 2. the sweep's table and steady state

SERVE_SPEC = """version = 1
kind = "serve"
seed = 3
replications = 1
metrics = [{metrics}]
[base]
target = "llama-3.1-8b"
hardware = "h100-sxm"
policy = "ar"
duration = 10.0
prompt-len = "fixed:256"
output-len = "fixed:256"
replications = 1
[grid]
qps = [2.0, 200.0]
"""


def _sweep(capsys, tmp_path, metrics: str):
    spec = tmp_path / "spec.toml"
    spec.write_text(SERVE_SPEC.format(metrics=metrics))
    status, out, err = run(capsys, "sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "1")
    assert status == 0, err
    lines = out.splitlines()
    return lines, {line.split()[0]: line for line in lines if line[:1] == " " or line[:1].isdigit()}


def test_a_serve_sweep_marks_the_points_not_at_steady_state(capsys, tmp_path):
    """200 req/s on one H100 is far past capacity: its row says 'overloaded' in a 'steady state'
    column and a warning follows the table; 2 req/s is steady and unmarked (before: the two rows
    printed alike, shares 0 and 1 under 'steady' at best)."""
    lines, rows = _sweep(capsys, tmp_path, '"ttft_p50", "throughput", "steady", "overloaded"')
    header = next(line for line in lines if line.startswith("qps"))
    assert header.split()[-2:] == ["steady", "state"] and "overloaded" not in header
    assert rows["200"].rstrip().endswith("overloaded") and not rows["2"].rstrip().endswith(("overloaded", "steady"))
    warning = [line for line in lines if line.startswith("WARNING:")]
    assert len(warning) == 1 and "1 of 2 points not at steady state" in warning[0] and "1 overloaded" in warning[0]
    # --json says the same (on the stored runs: nothing reruns)
    status, out, err = run(capsys, "sweep", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "out"), "--resume", "--workers", "1",
                           "--json")
    assert status == 0, err
    assert json.loads(out)["steady_state"] == warning


def test_a_serve_sweep_that_records_no_steady_state_says_so(capsys, tmp_path):
    lines, _ = _sweep(capsys, tmp_path, '"ttft_p50", "throughput"')
    assert any(line.startswith('note: steady state not checked: add "steady"') for line in lines)


def test_the_serving_example_asks_for_the_steady_state_and_runs_long_enough():
    """examples/serving_study.toml records steady and overloaded, and its lowest rate gets at least
    200 arrivals per run (15 s at 2 req/s was 30: throughput 212-355 tok/s against 320 offered)."""
    from pathlib import Path

    from draftsim.analysis import sweep as sw
    from draftsim.sweepkinds import KINDS

    spec = sw.load_spec(Path(__file__).parents[3] / "examples" / "serving_study.toml", KINDS)
    assert {"steady", "overloaded"} <= set(spec.metrics)
    points = [p.config for p in spec.points()]
    assert min(p["duration"] * p["qps"] for p in points) >= 200


# ------------------------------------------------------------------ 3. the sweep's crossover and its steady-state warnings

SWEEP = ("serve-sim", "--target", "llama-2-70b", "--tp", "4", "--drafter", "llama-2-7b", "--drafter-tp", "1", "--hardware", "h100-sxm",
         "--alpha", "0.8", "--requests", "60", "--output-len", "fixed:128", "--sweep-qps", "0.5,2,8,32", "--replications", "1")


def test_the_crossover_line_says_when_its_rows_are_not_steady(capsys, tmp_path):
    """The rows either side of the crossover (2 and 8 req/s here; 8 has not settled in 60
    requests) are named in its line with the caveat; the marks sit under a 'note' header, one per
    column (before: 8 names over 9 dash groups), and each unsteady rate says which server and test."""
    status, out, err = run(capsys, *SWEEP, "--json")
    assert status == 0, err
    data = json.loads(out)
    rows = {r["qps"]: r for r in data["sweep"]}
    assert data["config"]["policy"] == "fixed:k=4" and data["config"]["controller"] == "none"
    status, out, err = run(capsys, *SWEEP)
    assert status == 0, err
    lines = out.splitlines()
    header, dashes = next((lines[i], lines[i + 1]) for i, line in enumerate(lines) if line.startswith("qps"))
    assert header.split()[-1] == "note" and len(dashes.split()) == 8 and len(header.split("  ")) - header.split("  ").count("") == 8
    assert lines[0].startswith("fixed:k=4 under Bernoulli(alpha=0.8) vs autoregressive; controller none")
    cross = next(line for line in lines if line.startswith("crossover:"))
    assert "(between 2 and 8)" in cross
    assert ("but from rows not at steady state (8 req/s not steady)" in cross) == (not rows[8.0]["steady"])
    assert not rows[8.0]["steady"]  # the case the test is about: else pick rates whose bracket has not settled
    # a draft model's published runs are none near these batches: one footnote, not the same figure on every row
    assert "model error" not in header and any(line.startswith("  no load's mean batch has 4 published runs") for line in lines)
    detail = [line for line in lines if line.startswith("  8 req/s: ")]
    assert len(detail) == 1 and "speculation" in detail[0] and "run longer" in detail[0]


def test_a_run_not_settled_by_mser_alone_is_not_called_overloaded(capsys):
    """300 requests of Llama-2-70B at 4 req/s (mean batch 9, throughput ratio 0.99 in the sweep):
    one replication's occupancy still moved half-way through (MSER-5's half-way limit: 78.7 s of
    arrivals span 18 mean E2E latencies) while the queue did not grow. The reason says that test
    and not 'queue still growing: overloaded' (before: the words of the queue test, which passed)."""
    status, out, err = run(capsys, "serve-sim", "--target", "llama-2-70b", "--tp", "4", "--hardware", "h100-sxm", "--policy", "ar",
                           "--requests", "300", "--replications", "2", "--qps", "4", "--engine", "none", "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["steady"] is False and data["overloaded"] is False and data["steady_replications"] == 1
    reason = data["steady_reason"]
    assert reason.startswith("not settled: the requests in the system still moved half-way through the run, run longer (MSER-5")
    assert "span 18 mean E2E latencies" in reason and "the waiting queue showed no significant growth" in reason
    assert "queue still growing" not in reason


# ------------------------------------------------------------------ 4, 6. labels; text and --json agreeing

ONE = (*BASE, "--qps", "8", "--requests", "60", "--prompt-len", "fixed:64", "--output-len", "fixed:32", "--replications", "3")


def test_serve_sim_says_the_largest_batch_seen_against_the_setting_and_the_kv_tokens_json_gives(capsys):
    """'mean batch 4.4 (max 12.3)' was a mean of the replications' maxima beside no setting: now
    the largest batch any replication reached (an integer, --json max_batch_seen) of max_num_seqs;
    the text's KV tokens are --json config.kv_tokens (whole blocks; the plan's count is said as
    rounded down), and the policy is written as given (fixed:k=4, not FixedK(k=4))."""
    status, out, err = run(capsys, *ONE, "--json")
    assert status == 0, err
    data = json.loads(out)
    seen, kv = data["max_batch_seen"], data["config"]["kv_tokens"]
    assert isinstance(seen, int) and seen >= data["max_batch"] and kv == data["config"]["kv_blocks"] * 16
    assert data["config"]["policy"] == "fixed:k=4" and data["config"]["controller"] == "none"
    assert data["config"]["memory"]["tokens"] != kv  # the case the text used to print (the plan's tokens, not the cache's)
    status, out, err = run(capsys, *ONE)
    assert status == 0, err
    max_num_seqs = data["config"]["scheduler"]["max_num_seqs"]
    assert f", largest batch seen {seen} of max_num_seqs {max_num_seqs};" in out and "(max " not in out.split("mean batch")[1].split(";")[0]
    assert f"KV cache: {kv:,} tokens ({kv // 16:,} blocks of 16, the plan's {data['config']['memory']['tokens']:,} rounded down" in out
    assert out.startswith("fixed:k=4 under Bernoulli(alpha=0.8); controller none")


def test_serve_says_the_largest_batch_seen_and_keeps_the_setting(capsys):
    """draftsim serve printed 'max batch 6', the largest batch seen, where --max-batch was 16 (and
    --json's max_batch lost the setting under the run's metric of the same name)."""
    pytest.importorskip("torch")
    argv = ("serve", "--target", "tiny:1", "--qps", "50", "--requests", "4", "--output-len", "fixed:4", "--max-batch", "16")
    status, out, err = run(capsys, *argv, "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["max_batch_setting"] == 16 and 1 <= data["max_batch"] <= 4
    status, out, err = run(capsys, *argv)
    assert status == 0, err
    first = out.splitlines()[0]
    assert "--max-batch 16:" in first and "largest batch seen" in first and "of at most 16" in first and "max batch " not in first


# ------------------------------------------------------------------ 7. output folders


def test_serve_sim_makes_missing_folders_for_its_outputs_once_everything_is_checked(capsys, tmp_path):
    """--timeline, --figure and --load-figure in folders that do not exist yet are written there
    (as profile --out and --report make theirs); a bad input leaves no folder behind."""
    tl, fig, load = tmp_path / "a" / "tl.json", tmp_path / "b" / "c" / "cdf.png", tmp_path / "a" / "load.png"
    argv = (*BASE, "--qps", "4", "--requests", "20", "--prompt-len", "fixed:64", "--output-len", "fixed:16", "--replications", "1")
    status, out, err = run(capsys, *argv, "--output-len", "uniform:50,10", "--timeline", str(tl), "--figure", str(fig))
    assert status == 2 and not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    status, out, err = run(capsys, *argv, "--timeline", str(tl), "--figure", str(fig), "--load-figure", str(load))
    assert status == 0, err
    assert tl.stat().st_size > 0 and fig.stat().st_size > 1000 and load.stat().st_size > 1000
    sweep_fig = tmp_path / "d" / "sweep.png"
    status, out, err = run(capsys, *BASE, "--requests", "20", "--output-len", "fixed:16", "--sweep-qps", "1,2", "--replications", "1",
                           "--figure", str(sweep_fig))
    assert status == 0, err
    assert sweep_fig.stat().st_size > 1000
    (tmp_path / "file").write_text("x")
    status, out, err = run(capsys, *argv, "--timeline", str(tmp_path / "file" / "tl.json"))
    assert status == 2 and "is a file, not a folder" in err and len(err.strip().splitlines()) == 1


def test_a_points_steady_mark_counts_its_overloaded_and_unsettled_runs_apart():
    """One overloaded run and two that did not settle read as such, not 'overloaded' for all three."""
    import pyarrow as pa

    from draftsim.commands.sweeping import steady_marks

    class Spec:
        axes = ["qps"]

    t = pa.table({"qps": [1.0] * 3 + [2.0] * 3 + [3.0] * 3, "status": ["ok"] * 9,
                  "steady": [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], "overloaded": [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]})
    assert steady_marks(t, Spec) == {(1.0,): "overloaded (1 of 3 runs), not steady (2 of 3 runs)", (2.0,): "not steady (1 of 3 runs)",
                                     (3.0,): "overloaded"}
