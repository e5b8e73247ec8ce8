"""The serving report's headline sentence: every number once with its unit (no doubled one)."""

from __future__ import annotations

import re

import pytest
from clirun import run

SERVE = ["serve-sim", "--hardware", "h100-sxm", "--target", "llama-2-7b", "--drafter-model", "smollm2-135m", "--alpha", "0.8",
         "--prompt-len", "fixed:128", "--output-len", "fixed:32", "--qps", "4", "--requests", "30"]


@pytest.mark.parametrize("replications", ["1", "2"])
def test_the_report_subtitle_says_each_unit_once(tmp_path, capsys, replications):
    status, out, err = run(capsys, *SERVE, "--replications", replications, "--report", str(tmp_path / "r"))
    assert status == 0, err
    md = (tmp_path / "r" / "report.md").read_text()
    said = re.search(r"\(([\d.]+) s without, ([\d.]+)( ± [\d.]+)? s with\)", md)
    assert said, md[:600]
    assert (said.group(3) is not None) == (replications == "2")
    assert not re.search(r"\bs s\b", md)
