"""analysis.sweepplot: a sweep's heat map and line figures (the sweep command's figures are
exercised end to end in tests/analysis/sweep/test_sweep.py)."""

from __future__ import annotations

import math

from pngcheck import png_size

from draftsim.analysis.sweepplot import _order, heatmap, lines


def test_axis_order_is_numeric_for_numbers_else_text():
    assert _order([10, 2, 2, 33]) == [2, 10, 33]
    assert _order(["b", 1, "a"]) == [1, "a", "b"]
    assert _order([True, 2]) == [2, True]  # a bool is not a number here: text order


def test_heatmap_with_a_missing_cell(tmp_path):
    groups = {(0.1, 2): (1.5, 0.1, 3), (0.2, 2): (1.7, 0.1, 3), (0.1, 4): (1.9, math.nan, 1)}
    path = heatmap(tmp_path / "h.png", groups, "alpha", "k", "ewif", averaged=("seed",), fixed={"c": 0.05})
    assert png_size(path) and not list(tmp_path.glob(".*"))


def test_lines_numeric_log_axis_and_categories(tmp_path):
    numeric = {(1, "a"): (1.0, 0.1, 2), (100, "a"): (2.0, 0.2, 2), (1, "b"): (1.5, math.nan, 1)}
    assert png_size(lines(tmp_path / "n.png", numeric, "qps", "policy", "speedup"))
    categories = {("fixed",): (1.0, 0.0, 1), ("tree",): (1.2, 0.1, 2)}
    assert png_size(lines(tmp_path / "c.png", categories, "policy", None, "ewif"))
