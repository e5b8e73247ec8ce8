"""check-serve says when a serving trace is priced on another machine than the one it was
measured on (a CPU trace on a catalog GPU): its errors then compare two machines."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from clirun import run

from draftsim.analysis.servecheck import machine_mismatch
from tests.servetracefiles import serving_trace

GPU = SimpleNamespace(name="h100-sxm", kind="gpu")


@pytest.fixture
def cpu_trace(tmp_path):
    """A complete serving trace whose manifest says it was served on this CPU (device cpu)."""
    return serving_trace(tmp_path / "serve", 4)


def test_a_cpu_trace_priced_on_a_gpu_says_so_in_text_and_json(capsys, cpu_trace):
    status, out, err = run(capsys, "check-serve", str(cpu_trace), "--hardware", "h100-sxm")
    assert status == 0, err
    header = out.splitlines()
    assert header[1].startswith("warning: ") and "measured on a CPU" in header[1] and "h100-sxm" in header[1]
    status, out, err = run(capsys, "check-serve", str(cpu_trace), "--hardware", "h100-sxm", "--json")
    assert status == 0, err
    rows = json.loads(out)
    assert all("measured on a CPU" in r["warning"] and "h100-sxm" in r["warning"] for r in rows)


def test_a_trace_priced_on_its_own_kind_of_machine_warns_of_nothing(capsys, cpu_trace):
    status, out, err = run(capsys, "check-serve", str(cpu_trace), "--hardware", "local-cpu", "--dtype", "float32", "--json")
    assert status == 0, err
    assert not any("warning" in r for r in json.loads(out))
    status, out, err = run(capsys, "check-serve", str(cpu_trace), "--hardware", "local-cpu", "--dtype", "float32")
    assert status == 0 and "warning" not in out + err


@pytest.mark.parametrize(("gpu", "hardware", "same"), [
    ("NVIDIA H200", "h200", True),
    ("NVIDIA H100 80GB HBM3", "h100-sxm", True),
    ("NVIDIA A100-SXM4-80GB", "a100-80g", True),
    ("NVIDIA GeForce RTX 4090", "rtx-4090", True),
    ("NVIDIA H200", "h100-sxm", False),
    ("NVIDIA L40S", "l4", False),
    ("NVIDIA GeForce RTX 3090", "rtx-4090", False),
])
def test_a_gpu_trace_is_matched_by_its_family(gpu, hardware, same):
    meta = {"device": "cuda", "machine": {"cpu": "x", "device": "cuda", "gpu": gpu}}
    line = machine_mismatch(meta, SimpleNamespace(name=hardware, kind="gpu"), "T")
    assert (line is None) == same
    if not same:
        assert gpu in line and hardware in line


def test_a_trace_without_a_recorded_device_or_hardware_warns_of_nothing():
    assert machine_mismatch({}, GPU, "T") is None
    assert machine_mismatch({"device": "cpu"}, None, "T") is None
    assert "a CPU" in machine_mismatch({"device": "cpu"}, GPU, "T")
