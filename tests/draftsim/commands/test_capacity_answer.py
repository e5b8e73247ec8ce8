"""``draftsim capacity``'s answer, the same from the front door's flags and from the spec they
write (draftsim/commands/frontdoor.py ``answer``), its SLOs echoed with their units, its refusals
in the user's words, its help and its figure."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

from draftsim.analysis import capacity as cap
from draftsim.analysis import sweep as sw
from draftsim.cli import main
from draftsim.commands.frontdoor import build_spec
from draftsim.commands.sweeping import CapacityConfig
from draftsim.sweepkinds import KINDS

FRONT = ["capacity", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--load", "2", "--slo", "ttft:p99=2s",
         "--slo", "tpot:p90=60ms", "--workload", "sharegpt"]


def test_rerunning_the_front_doors_spec_gives_the_same_answer(tmp_path, capsys):
    """The front door's answer, engine line, model error and deploy command come back, word for
    word and key for key, from `draftsim capacity OUT/spec.toml --out OUT --resume` (once printed
    by the front door alone); --overheads is --engine's old name, as in cost and serve-sim."""
    out = str(tmp_path / "out")
    args = [*FRONT, "--method", "eagle3:k=2", "--alpha", "0.7", "--overheads", "sglang", "--duration", "5", "--replications", "2", "--workers", "1",
            "--out", out]
    assert main(args) == 0
    front = capsys.readouterr().out.splitlines()
    assert main(["capacity", f"{out}/spec.toml", "--out", out, "--resume"]) == 0
    rerun = capsys.readouterr().out.splitlines()
    assert front[0].startswith("answer: ") and front[1].startswith("  on sglang") and "60 ms" in front[1]
    assert front[2].startswith("  model error: ")
    head = front[:front.index("")]
    assert rerun[:len(head)] == head
    # every line names a configuration as the answer does ("plain decoding"), on the rerun too
    assert not [line for line in front + rerun if "policy=" in line or "drafter_model=" in line]
    # the answer is the one verdict: no 'fewest devices' line beside it (it broke ties away from plain decoding)
    assert not [line for line in front + rerun if line.startswith("fewest devices")]
    deploy = [line for line in front if "sglang.launch_server" in line]
    assert deploy and deploy == [line for line in rerun if "sglang.launch_server" in line]
    assert main([*args, "--resume", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["capacity", f"{out}/spec.toml", "--out", out, "--resume", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert set(a) == set(b)
    for key in ("recommendation", "deployment", "model_error", "engine", "scheduler", "no_answer", "slo_text"):
        assert key in a and a[key] == b[key], key
    assert a["recommendation"] == front[0][len("answer: "):] and a["engine"].startswith("sglang") and a["no_answer"] is None


def _table(points: int, policies) -> pa.Table:
    n = points
    return pa.table({"point": list(range(n)), "policy": list(policies), "status": ["ok"] * n, "error": [None] * n,
                     "capacity_qps": [4.0 + i for i in range(n)], "bracket_high": [4.5 + i for i in range(n)],
                     "cost_per_million_tokens": [1.0 - 0.1 * i for i in range(n)], "replicas_for_load": [None] * n,
                     "devices_for_load": [None] * n, "load_margin": [None] * n, "margin_within_noise": [None] * n})


def test_a_spec_that_cannot_give_an_answer_says_why_in_one_line():
    """A hand-written serve spec without a load, or over two targets, names its engine and
    scheduler and says in one line what the answer lacks, instead of dropping it silently; the
    model error is then the cheapest configuration's."""
    from draftsim.commands.frontdoor import answer

    raw = build_spec(CapacityConfig(spec=None, out=None, target="llama-3.1-8b", hardware="h100-sxm", load=None, slo=["ttft:p99=2s"],
                                    method=["eagle3:k=2"], alpha=0.7, workload="sharegpt"))
    spec = sw.parse_spec(raw, KINDS)
    points = list(spec.points())
    found = answer(spec, points, _table(2, ["ar", "fixed:k=2"]), None)
    assert found.recommendation is None and found.deployment is None
    assert "no load" in found.missing and "--load" in found.missing and "\n" not in found.missing
    assert found.engine == "vllm v0.10.1" and "max_num_seqs" in found.scheduler
    assert found.named == "EAGLE-3 with k = 2" and found.model_error["configuration"] == "EAGLE-3 with k = 2"
    two = {**raw, "base": {k: v for k, v in raw["base"].items() if k != "target"},
           "zip": [{**raw["zip"][0], "target": ["llama-3.1-8b", "qwen2.5-7b"]}]}
    two["capacity"] = {**raw["capacity"], "load": 2.0}
    spec = sw.parse_spec(two, KINDS)
    found = answer(spec, list(spec.points()), _table(2, ["ar", "fixed:k=2"]), 2.0)
    assert found.recommendation is None and "different deployments (target differ)" in found.missing


def test_every_slo_is_echoed_with_its_unit_and_a_bare_per_token_second_is_warned(tmp_path, capsys):
    """`--slo tpot:p90=60` is 60 s a token: --check says so, with the unit, and warns on stderr
    how to write milliseconds (a warning: it still exits 0); with ms, no warning."""
    from draftsim.commands.frontdoor import slo_warnings

    base = ["capacity", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--load", "4", "--check"]
    assert main([*base, "--slo", "ttft:p99=2", "--slo", "tpot:p90=60"]) == 0
    captured = capsys.readouterr()
    assert "SLOs ttft_p99 <= 2 s, tpot_p90 <= 60 s at 4 req/s" in captured.out
    assert captured.err.startswith("warning: --slo tpot:p90=60: ") and "tpot:p90=60ms" in captured.err
    assert main([*base, "--slo", "ttft:p99=2", "--slo", "tpot:p90=60ms"]) == 0
    captured = capsys.readouterr()
    assert "tpot_p90 <= 60 ms" in captured.out and captured.err == ""
    assert slo_warnings(["itl:p50=2", "ttft:p99=30", "tpot:p90=0.05"]) == [
        "--slo itl:p50=2: no unit, so itl_p50 <= 2 s per token; for milliseconds write itl:p50=2ms"]
    assert cap.slo_text({"ttft_p99": 1.0, "tpot_p50": 0.05, "e2e_mean": 2e-4}, "serve") == \
        "ttft_p99 <= 1 s, tpot_p50 <= 50 ms, e2e_mean <= 200 us"
    assert cap.slo_text({"ewif": 2.0}, "simulate") == "ewif <= 2"
    assert cap.slo_warnings({"tpot_p50": 50.0, "ttft_p99": 1.0}, "serve")[0].endswith("write tpot_p50 = 0.05")


@pytest.mark.parametrize("extra, words", [
    (["--workload", "sharegtp"], ["--workload sharegtp: unknown workload preset", "did you mean sharegpt"]),
    (["--request-trace", "nope.csv"], ["request trace nope.csv: no such file"]),
    (["--engine", "sglng", "--workload", "sharegpt"], ["--engine/--overheads", "did you mean sglang"]),
    (["--overheads", "sglng", "--workload", "sharegpt"], ["--engine/--overheads", "did you mean sglang"]),
    (["--tp", "1", "--workload", "sharegpt", "--target", "llama-3.1-70b"], ["llama-3.1-70b in bfloat16 does not fit"]),
    (["--method", "llama-3.1-70b:k=2", "--workload", "sharegpt"], ["draft model llama-3.1-70b with k = 2: llama-3.1-70b"]),
])
def test_a_front_door_refusal_names_what_the_user_typed(tmp_path, capsys, extra, words):
    """One line, exit 2, led by "draftsim capacity:", naming the flag or the configuration as the
    answer names it, never the sweep's "point 0 (policy='ar', ...)"."""
    args = ["capacity", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--load", "4", "--slo", "ttft:p99=2s",
            "--method", "eagle3:k=2", "--alpha", "0.7", "--check", *extra]
    try:
        code = main(args)
    except SystemExit as exc:  # refused by the parser itself
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("draftsim capacity: error: ")
    assert "point 0" not in err and "policy=" not in err and all(w in err for w in words), err


def test_capacity_help_speaks_to_its_user(capsys):
    with pytest.raises(SystemExit):
        main(["capacity", "--help"])
    text = capsys.readouterr().out
    assert ":func:" not in text and ":data:" not in text and "``" not in text
    assert "--slo NAME:STAT=VALUE[UNIT]" in text and "--overheads" in text and "spec.toml" in text


def test_the_figure_names_each_configuration_and_its_legend_hides_no_bar(tmp_path, monkeypatch):
    """One bar per configuration under its name (no "all" row, no empty slot), the legend
    beside the plot, and the SLOs in the title with their units."""
    from draftsim.analysis import figures

    drawn = {}

    def keep(fig, path):
        fig.canvas.draw()
        drawn["fig"] = fig
        return path

    monkeypatch.setattr(figures, "save_figure", keep)
    table = pa.table({"point": [0, 1, 2, 3, 4], "policy": ["ar", "fixed:k=1", "fixed:k=2", "fixed:k=3", "fixed:k=4"],
                      "drafter_model": [[], ["eagle3"], ["eagle3"], ["eagle3"], ["eagle3"]], "status": ["ok"] * 5, "error": [None] * 5,
                      "capacity_qps": [5.0, 6.0, 6.5, 7.0, 7.2], "capacity_ci_low": [4.8, 5.5, 6.0, 6.4, 6.8],
                      "capacity_ci_high": [5.2, 6.4, 7.0, math.inf, 7.5]})
    names = {0: "plain decoding", **{k: f"EAGLE-3 with k = {k}" for k in range(1, 5)}}
    s = cap.Settings(slo={"ttft_p99": 2.0, "tpot_p90": 0.06}, compare="policy")
    cap.figure(tmp_path / "c.png", table, ["policy", "drafter_model"], s, "serve", names)
    fig = drawn["fig"]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == list(names.values())
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # beside the plot: over no bar or label
    assert "ttft_p99 ≤ 2 s, tpot_p90 ≤ 60 ms" in fig._suptitle.get_text()
    assert "requests/s" in ax.get_xlabel()


@pytest.mark.parametrize("duration", ['"60s"', '"1m"', "60.0"])
def test_a_specs_duration_may_carry_a_unit(tmp_path, capsys, duration):
    """duration = "1m" in a spec is read as --duration 1m is (it was multiplied as text when the search
    lengthened a run: a traceback); "5xs" is one line naming the unit."""
    spec = tmp_path / "spec.toml"
    body = ('version = 1\nkind = "serve"\n[base]\ntarget = "qwen2.5-7b"\nhardware = "h100-sxm"\npolicy = "ar"\n'
            'engine = "none"\nduration = {d}\n[capacity]\nslo = {{ tpot_p50 = 0.05 }}\nminimum = 1.0\n')
    spec.write_text(body.format(d=duration))
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out"), "--check"]) == 0
    assert "SLOs tpot_p50 <= 50 ms" in capsys.readouterr().out
    spec.write_text(body.format(d='"5xs"'))
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out"), "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown unit 'xs'" in err[0]


def test_a_spec_varying_the_scheduler_gets_no_answer_and_its_report_says_why(tmp_path, capsys):
    """Points that differ in more than the drafting method (here max_num_seqs) are compared by the
    table, not answered: the answer once named 'plain decoding' (the first ar row) and deployed the
    first point's scheduler, and the report printed 'on None'."""
    spec = tmp_path / "spec.toml"
    spec.write_text('version = 1\nkind = "serve"\n[base]\ntarget = "qwen2.5-7b"\nhardware = "h100-sxm"\npolicy = "ar"\n'
                    'duration = 3.0\nengine = "none"\n[zip]\nmax-num-seqs = [4, 256]\n[capacity]\nslo = { tpot_p50 = 0.05 }\n'
                    'minimum = 4.0\nmaximum = 64.0\ntolerance = 0.2\n')
    out = tmp_path / "out"
    assert main(["capacity", str(spec), "--out", str(out), "--workers", "1", "--report", str(tmp_path / "rep")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("no answer: the configurations differ in max_num_seqs besides the drafting method")
    assert "deploy (" not in text
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "No answer: the configurations differ in max_num_seqs" in report and "None" not in report
