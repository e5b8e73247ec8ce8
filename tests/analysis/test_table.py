"""analysis.table: plain-text tables for the command line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from draftsim.analysis.table import format_table


def test_numbers_right_text_left_floats_formatted():
    out = format_table(["name", "value", "n"], [["a", 1.5, 10], ["longer", 0.25, 7]], floatfmt=".2f")
    assert out.splitlines() == [
        "name    value   n",
        "------  -----  --",
        "a        1.50  10",
        "longer   0.25   7",
    ]


def test_mixed_columns_are_text_and_no_rows_is_a_header():
    out = format_table(["x"], [[1], ["-"]]).splitlines()
    assert out[2:] == ["1", "-"]
    assert format_table(["a", "bb"], []).splitlines() == ["a  bb", "-  --"]


cells = st.one_of(st.integers(-10**6, 10**6), st.floats(-1e6, 1e6, allow_nan=False), st.text("abcxyz", max_size=8))


@given(st.integers(1, 5).flatmap(lambda w: st.tuples(st.just(w), st.lists(st.lists(cells, min_size=w, max_size=w), max_size=6))))
def test_columns_line_up(shape):
    """Every column starts at the same offset on every line (two spaces apart)."""
    w, rows = shape
    headers = [f"h{i}" for i in range(w)]
    lines = format_table(headers, rows).split("\n")
    assert len(lines) == 2 + len(rows)
    rule = lines[1]
    starts = [i for i, ch in enumerate(rule) if ch == "-" and (i == 0 or rule[i - 1] == " ")]
    assert len(starts) == w
    for line in lines:
        for s in starts[1:]:
            assert line[s - 2: s] == "  " or len(line) <= s
