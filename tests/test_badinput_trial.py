"""Regressions from the second bad-input trial of the whole CLI (issue 38): each failure class the
trial found, held to the CLI's contract — a bad input is one line on stderr naming the value and
what is valid, exit status 2, no traceback, nothing written; valid input works.
"""

from __future__ import annotations

from tests.clirun import run


def test_capacity_without_a_method_answers_plain_decoding(tmp_path, capsys):
    """The README's first command names no --method: every run is plain decoding (the spec's
    base policy, no policy column in the results), and the answer says so (was a KeyError)."""
    status, out, err = run(capsys, "capacity", "--target", "llama-3.1-8b", "--hardware", "h100-sxm", "--load", "1", "--slo",
                           "ttft:p99=2s", "--duration", "20", "--replications", "2", "--workers", "1", "--out", str(tmp_path / "out"))
    assert status == 0, err
    assert out.startswith("answer: do not enable speculation: plain decoding needs 1 replica")
    assert "vllm serve meta-llama/Llama-3.1-8B" in out
