"""Reports (``--report DIR``: draftsim.analysis.report, draftsim.commands.reporting): the page
says what the run measured (its numbers equal the command's --json), beside the baseline
without speculation, with the setup and the assumptions' sources; it is self-contained, and a
real headless browser (Debian's Chromium) renders it and draws every figure; a Markdown summary
lies beside it; a bad folder is refused before any work.

The browser: ``make test`` (and CI) installs Chromium and sets DRAFTSIM_REQUIRE_BROWSER=1, so the
browser tests cannot skip there; a plain ``pytest`` without Chromium skips them, saying why."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from draftsim.analysis.report import Figure, Report, Table, headline
from draftsim.cli import main

SERVE = ["serve-sim", "--hardware", "h100-sxm", "--target", "llama-2-7b", "--drafter-model", "smollm2-135m", "--alpha", "0.8",
         "--prompt-len", "fixed:256", "--output-len", "fixed:64", "--replications", "1"]

#: The rows of ``vllm bench serve``'s result, in its order (those draftsim reports).
VLLM_ROWS = ["Benchmark duration (s)", "Completed requests", "Total generated tokens", "Request throughput (req/s)",
             "Output token throughput (tok/s)", "Mean TTFT (ms)", "Median TTFT (ms)", "P99 TTFT (ms)", "Mean TPOT (ms)",
             "Median TPOT (ms)", "P99 TPOT (ms)", "Mean ITL (ms)", "Median ITL (ms)", "P99 ITL (ms)", "Mean E2EL (ms)",
             "Median E2EL (ms)", "P99 E2EL (ms)"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("DRAFTSIM_REQUIRE_BROWSER"):
        pytest.fail("no Chromium on PATH, but DRAFTSIM_REQUIRE_BROWSER is set (make test installs Debian's chromium)")
    pytest.skip("no Chromium on PATH (make test installs it: apt-get install chromium)")


def render(page: Path) -> tuple[str, np.ndarray]:
    """The page's DOM after load (its script run) and a screenshot, from headless Chromium."""
    exe = chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run([exe, *flags, f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=180, check=True).stdout
    shot = page.parent / "screenshot.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([exe, *flags, f"--user-data-dir={profile}", "--window-size=1200,1800", f"--screenshot={shot}", page.as_uri()],
                       capture_output=True, timeout=180, check=True)
    import matplotlib.pyplot as plt

    return dom, plt.imread(shot)


def cell(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def test_headline_follows_vllm_bench_serve():
    """The headline rows, in vLLM's order and units, from a summary's own numbers."""
    s = {"requests": 100, "output_tokens": 6400, "request_throughput": 2.0, "throughput": 128.0, "goodput": 1.5, "slo_attainment": 0.75,
         "mean_batch": 3.25, "preemptions": 0, "spec_decode": {"num_drafts": 10, "mean_acceptance_length": 2.5}}
    for i, key in enumerate(("ttft", "tpot", "itl", "e2e")):
        s[key] = {"mean": 0.001 * (i + 1), "p50": 0.002 * (i + 1), "p99": 0.004 * (i + 1)}
    table = headline({"spec": s, "none": {**s, "spec_decode": {"num_drafts": 0}}})
    names = [r[0] for r in table.rows]
    assert [n for n in names if n in VLLM_ROWS] == VLLM_ROWS
    rows = {r[0]: r[1:] for r in table.rows}
    assert rows["Benchmark duration (s)"] == ["50.00", "50.00"]  # 100 requests at 2 req/s
    assert rows["Mean E2EL (ms)"] == ["4.00", "4.00"] and rows["P99 TTFT (ms)"] == ["4.00", "4.00"]
    assert rows["Mean acceptance length"] == ["2.500", "n/a"]
    assert "Request goodput (req/s)" not in rows  # no SLO: no goodput
    assert {r[0]: r[1:] for r in headline({"a": s}, slo=True).rows}["Request goodput (req/s)"] == ["1.50"]


def test_page_is_escaped_and_self_contained(tmp_path):
    """Text is escaped; figures are embedded (nothing is fetched); the Markdown escapes pipes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    png = tmp_path / "f.png"
    fig.savefig(png)
    plt.close(fig)
    report = Report("a <b>bold</b> & title", "sub", [("k", "v|w")], [("what", "x<y", "src")],
                    [Table("T", ["a", "b"], [["1", "<script>"]])], [Figure("cap", png)], ["note"])
    (tmp_path / "r").mkdir()
    paths = report.write(tmp_path / "r")
    page = Path(paths["html"]).read_text()
    assert "a &lt;b&gt;bold&lt;/b&gt; &amp; title" in page and "&lt;script&gt;" in page
    assert re.search(r'src="data:image/png;base64,[A-Za-z0-9+/=]{100,}"', page)
    assert not re.search(r'(src|href)="(https?:|//|file:)', page)
    md = Path(paths["markdown"]).read_text()
    assert "| k | v\\|w |" in md and "![cap](f.png)" in md


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """serve-sim --report on a short run: the JSON document and the report folder."""
    folder = tmp_path_factory.mktemp("served") / "report"
    out = tmp_path_factory.mktemp("served") / "out.json"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main([*SERVE, "--qps", "4", "--requests", "80", "--slo-ttft", "0.05", "--slo-tpot", "0.004", "--report", str(folder),
                     "--json"]) == 0
    out.write_text(buf.getvalue())
    return json.loads(buf.getvalue()), folder


def test_serve_sim_report_says_what_was_measured(served):
    """The report's numbers are the run's (--json), beside the run without speculation; the
    speedup is the ratio of the two; the setup and the sources are there."""
    data, folder = served
    assert set(data["report"]) == {"html", "markdown"}
    md = (folder / "report.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): [c.strip() for c in line.strip("| \n").split(" | ")[1:]]
            for line in md.splitlines() if line.startswith("| ")}
    spec, base = data, data["baseline"]
    assert rows["metric"] == ["fixed:k=4", "no speculation"]
    assert rows["Mean TTFT (ms)"] == [cell(spec["ttft"]["mean"] * 1e3), cell(base["ttft"]["mean"] * 1e3)]
    assert rows["P99 E2EL (ms)"] == [cell(spec["e2e"]["p99"] * 1e3), cell(base["e2e"]["p99"] * 1e3)]
    assert rows["Output token throughput (tok/s)"] == [cell(spec["throughput"]), cell(base["throughput"])]
    assert rows["Request goodput (req/s)"] == [cell(spec["goodput"]), cell(base["goodput"])]
    assert rows["E2E latency speedup (mean)"] == [f"{base['e2e']['mean'] / spec['e2e']['mean']:.3f}"]
    assert base["spec_decode"]["num_drafts"] == 0 and spec["spec_decode"]["num_drafts"] > 0
    assert rows["num_drafts"] == [f"{spec['spec_decode']['num_drafts']:,.0f}"]
    # the baseline is the same workload without a drafter: same requests and tokens, slower per token at this light load
    assert base["requests"] == spec["requests"] == 80 and base["tpot"]["mean"] > spec["tpot"]["mean"]
    # setup and sources: the hardware's and the target's catalog sources, how the drafter is priced, the acceptance's origin
    assert "h100-sxm" in md and "huggingface.co/meta-llama/Llama-2-7b-hf" in md and "huggingface.co/HuggingFaceTB/SmolLM2-135M" in md
    assert "catalog architecture, roofline (not calibrated)" in md and "given on the command line (not measured)" in md
    assert "TTFT ≤ 50 ms, TPOT ≤ 4 ms" in md
    for name in ("latency-cdf.png", "load-over-time.png"):
        assert (folder / name).stat().st_size > 10_000 and f"]({name})" in md


def test_a_browser_renders_the_report(served):
    """Headless Chromium loads the page: both figures decode and draw, the headline table shows
    the run's numbers, and the screenshot is a page, not a blank."""
    data, folder = served
    dom, shot = render(folder / "report.html")
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-figures="2"' in body and 'data-figures-drawn="2"' in body, body
    assert f"<td>Mean TPOT (ms)</td><td>{cell(data['tpot']['mean'] * 1e3)}</td>" in dom
    assert "Assumptions and their sources" in dom and "draftsim serving report" in dom
    gray = shot[..., :3].mean(axis=-1)
    assert gray.std() > 0.05 and (gray < 0.3).mean() > 0.005  # text and lines on a light page


def test_load_sweep_report(tmp_path, capsys):
    """--sweep-qps --report: the speedup figure with the crossover, a row per rate, the verdict."""
    folder = tmp_path / "sweep"
    assert main([*SERVE, "--sweep-qps", "2,400", "--requests", "60", "--report", str(folder), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    md = (folder / "report.md").read_text()
    assert (folder / "speedup-vs-load.png").stat().st_size > 10_000
    for row in data["sweep"]:
        assert f"| {row['qps']:g} | {row['ar']['e2e']['mean'] * 1e3:.2f} | {row['spec']['e2e']['mean'] * 1e3:.2f} | {row['speedup']:.3f} |" in md
    cross = data["crossover_qps"]
    verdict = "pays at every load" if cross is None else f"{cross:.3g} req/s"
    assert verdict in md


def test_capacity_and_sweep_reports(tmp_path, capsys):
    """capacity --report: the table the command prints and its figure; sweep --report: each
    point's mean metrics."""
    from tests.analysis.sweep.test_sweep import GRID
    from tests.analysis.test_capacity import DES_SPEC

    spec = tmp_path / "cap.toml"
    spec.write_text(DES_SPEC)
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out"), "--workers", "1", "--report", str(tmp_path / "rc")]) == 0
    text = capsys.readouterr().out
    md = (tmp_path / "rc" / "report.md").read_text()
    assert "report written to" in text and "Capacity of each configuration" in md and (tmp_path / "rc" / "capacity.png").exists()
    for policy in ("fixed:k=0", "fixed:k=4"):
        assert f"| {policy} |" in md
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(tokens=300))
    assert main(["sweep", str(grid), "--out", str(tmp_path / "g"), "--workers", "1", "--report", str(tmp_path / "rs"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    md = (tmp_path / "rs" / "report.md").read_text()
    assert data["report"]["markdown"] == str(tmp_path / "rs" / "report.md")
    assert md.count("| fixed:k=") == 6 and "| alpha | policy | verify_per_token | ewif |" in md
    from draftsim.analysis import sweep as sw

    runs = [r for r in sw.load(tmp_path / "g").to_pylist() if r["alpha"] == 0.9 and r["policy"] == "fixed:k=5"]
    assert len(runs) == 2 and f"| 0.9 | fixed:k=5 | 0.01 | {np.mean([r['ewif'] for r in runs]):.4g} |" in md


@pytest.mark.parametrize("command", [SERVE + ["--qps", "4", "--requests", "20"], ["capacity", "SPEC", "--out", "OUT"]])
def test_a_bad_report_folder_is_refused_first(tmp_path, capsys, command):
    """A --report path that is a file: one line, exit 2, nothing run or written."""
    from tests.analysis.test_capacity import DES_SPEC

    (tmp_path / "spec.toml").write_text(DES_SPEC)
    bad = tmp_path / "a-file"
    bad.write_text("x")
    argv = [str(tmp_path / "spec.toml") if c == "SPEC" else str(tmp_path / "out") if c == "OUT" else c for c in command]
    assert main([*argv, "--report", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "exists and is not a folder" in err and str(bad) in err
    assert bad.read_text() == "x" and not (tmp_path / "out" / "results").exists()


def test_a_refused_run_makes_no_report_folder(tmp_path, capsys):
    """Options refused after parsing (a bad length distribution, a rate sweep with --qps) leave
    no report folder behind."""
    for extra in (["--qps", "4", "--prompt-len", "fixed:-3"], ["--qps", "4", "--sweep-qps", "1,2"]):
        folder = tmp_path / "never"
        assert main([*SERVE, *extra, "--report", str(folder)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1 and not folder.exists()


def test_the_setup_names_the_baselines_own_price_when_the_engine_gives_one():
    """Under --engine sglang the run without speculation is priced apart (host work overlapped):
    the report's setup says so; under vllm it has no such row."""
    from draftsim.api import ServeSimConfig
    from draftsim.commands.reporting import assumptions
    from draftsim.commands.servesim import serving_config

    for engine, expect in (("sglang", True), ("vllm", False)):
        config = ServeSimConfig(target="llama-3.1-8b", hardware="h100-sxm", drafter_model=["eagle3"], policy="fixed:k=3", alpha=0.7,
                                engine=engine)
        rows = {what: (value, src) for what, value, src in assumptions(config, serving_config(config))}
        assert ("target without speculation" in rows) == expect
        if expect:
            assert "host work overlapped" in rows["target without speculation"][0]


def test_step_table_lists_each_part_and_draws_its_shares():
    """The step table: ms and share per part and run, a part no run separates left out, one
    Markdown line per run in the note, and stacked bars of the shares on the page."""
    from draftsim.analysis.report import step_table
    from draftsim.analysis.stepbreakdown import StepBreakdown, StepPart

    def bd(ms):
        step = sum(v for v in ms.values() if v is not None)
        parts = tuple(StepPart(k, v, None if v is None else v / step) for k, v in ms.items())
        return StepBreakdown(step, 100, parts, "every step", "the roofline's own terms")

    spec = bd({"target_forward": 6.0, "drafting": 2.0, "host": 1.0, "call_overhead": 0.5, "padding": None})
    plain = bd({"target_forward": 5.0, "drafting": 0.0, "host": 1.0, "call_overhead": 0.5, "padding": None})
    table = step_table({"spec": spec, "none": plain, "empty": None})
    rows = {r[0]: r[1:] for r in table.rows}
    assert table.headers[1:] == ["spec", "none"] and rows["mean step (ms)"] == ["9.500", "6.500"]
    assert rows["drafting (the drafters' calls, their engine host time included)"] == ["2.000 (21.1%)", "0.000 (0.0%)"]
    assert not any(name.startswith("CUDA-graph padding") for name in rows)  # no run separates it
    assert "spec: mean step 9.5 ms" in table.note and "none: mean step 6.5 ms" in table.note
    assert [sum(s for _, s in parts) for _, parts in table.bars] == [pytest.approx(1.0), pytest.approx(1.0)]
    page = Report("t", tables=[table]).html()
    assert page.count('class="seg"') == 8 and 'class="legend"' in page and "width:63.158%" in page


def test_the_report_says_where_a_step_goes(served):
    """The serving report's step table holds --json's breakdown of the run and one of the run
    without speculation (no drafting there); the parts add up to the mean step."""
    data, folder = served
    md = (folder / "report.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): [c.strip() for c in line.strip("| \n").split(" | ")[1:]]
            for line in md.splitlines() if line.startswith("| ")}
    bd = data["step_breakdown"]
    assert rows["mean step (ms)"][0] == f"{bd['step_ms']:,.3f}"
    forward = bd["parts"]["target_forward"]
    assert rows["target forward (verification and prefill chunks, GPU)"][0] == f"{forward['ms_per_step']:,.3f} ({forward['share']:.1%})"
    assert rows["drafting (the drafters' calls, their engine host time included)"][1] == "0.000 (0.0%)"
    assert sum(p["ms_per_step"] for p in bd["parts"].values()) == pytest.approx(bd["step_ms"], rel=1e-12)
    assert "Where a step's time goes" in md and "The parts add up to the simulated step." in md
    page = (folder / "report.html").read_text()
    assert page.count('class="bar-row"') == 2
