"""The fixed time per kernel of the GPUs with measured Hopper tables, and their MBU derived beside it,
are benchmarks/derive_affine.py's derivation."""

from __future__ import annotations

import pytest
from benchscript import load_script

pytest.importorskip("pyarrow")


def test_the_catalog_holds_the_derived_kernel_times_and_the_anchor_call_keeps_the_tables_time():
    """h100-sxm and h200 hold the fixed time per kernel kind fitted on their vLLM tables and the MBU that,
    with those times in place, gives the anchor call (Llama-3.1-8B, batch 1, context 512) the tables'
    own time; a kernel's fixed time is a few microseconds (decode attention's the largest), and every
    other GPU holds none."""
    from draftsim.sim.cost import default_catalog

    mod = _script()
    cat = default_catalog()
    for hw in mod.GPUS:
        fixed = mod.derived_fixed(hw)
        assert {k: round(v * 1e6, 2) for k, v in cat.hardware_spec(hw).kernel_fixed.items()} == fixed
        assert 1.0 < fixed["gemm"] < fixed["attention"] < 20.0 and fixed["elementwise"] == 3.0 and 1.0 < fixed["allreduce"] < 10.0
        assert fixed["gemm"] < fixed["gemm_float8"] < fixed["attention"]  # the FP8 GEMM's fixed time is the bfloat16 one's and more
        got = mod.mbu(hw, fixed)
        assert round(got["mbu"], 3) == cat.hardware_spec(hw).mbu
        assert got["anchor_with_rounded_mbu_ms"] == pytest.approx(got["operators_ms"], rel=2e-3)
        assert 0.5 < got["kernel_fixed_ms"] < 1.5  # ~30 us a layer over 32 layers
    assert all(not cat.hardware_spec(h).kernel_fixed for h in cat.hardware if h not in mod.GPUS)
    assert mod.main([]) == 0


def _script():
    return load_script("benchmarks/derive_affine.py")


def test_the_blackwell_terms_were_adopted_on_the_held_out_check_they_pass():
    """b200 and gb200 hold derived terms because they price the tables' whole decode steps of the families the fit
    did not use better than the one efficiency they had (MBU 0.7, no fixed times): at batch 1 and 32, median and worst."""
    mod = _script()
    for hw in ("b200", "gb200"):
        for label, s in mod.check(hw)["summary"].items():
            assert s["steps"] > 20
            if label.startswith("held out"):
                assert s["derived_median"] < 0.5 * s["constant_median"] and s["derived_worst"] < s["constant_worst"], (hw, label, s)


def test_the_fp8_gemms_fixed_time_was_adopted_because_every_row_it_moves_comes_closer():
    """On the B200 the catalog's gemm_float8 moves only float8 rows (DeepSeek-V3, a held-out family), and each of them
    comes closer to the tables' whole decode step than without it; no bfloat16 row moves."""
    from draftsim.sim.cost import default_catalog

    mod = _script()
    kf = {k: v * 1e6 for k, v in default_catalog().hardware_spec("b200").kernel_fixed.items() if k != "gemm_float8"}
    with_it, without = mod.check("b200")["rows"], mod.check("b200", kernel_fixed_us=kf)["rows"]
    moved = [(a, b) for a, b in zip(with_it, without) if abs(a["derived"] - b["derived"]) > 1e-9]  # (kf round-trips through us)
    assert moved and all(a["model"] == "deepseek-v3" and a["held_out"] for a, _ in moved)
    assert all(abs(a["derived"]) < abs(b["derived"]) for a, b in moved), [(a["tp"], a["batch"], a["derived"], b["derived"]) for a, b in moved]
