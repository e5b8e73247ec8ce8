"""The report's assumptions read how each model is priced from typed records
(draftsim.sim.cost.provenance), not from the text of the assembly's ``info["backends"]``, and
take the assembly serve-sim built rather than assembling the configuration a second time."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from draftsim.api import ServeSimConfig
from draftsim.commands import costing, reporting
from draftsim.commands.servesim import serving_setup
from draftsim.sim.cost import default_catalog
from draftsim.sim.cost.catalog import hardware_to_entry, write_catalog
from draftsim.sim.cost.provenance import KINDS, pricing

PROFILE = Path(__file__).resolve().parents[2] / "figures" / "real-serving" / "profile-smollm2-cpu-steps.json"
BASE = dict(alpha=0.7, requests=4, policy="fixed:k=3")


def rows(**kw) -> dict:
    config = ServeSimConfig(**BASE, **kw)
    serving, built = serving_setup(config)
    return {what: (value, src) for what, value, src in reporting.assumptions(config, serving, built)}


def test_each_kind_of_pricing_is_said_as_before():
    """The status column of every kind the catalog deployments make: the words the report gave
    when it read the backends' text (a draft model named draft_model:NAME now finds its source)."""
    r = rows(target="llama-2-7b", hardware="h100-sxm", drafter_model=["smollm2-135m"])
    assert r["target"][1].startswith("catalog architecture, roofline (not calibrated); config.json of")
    assert r["drafter 1"][0].startswith("smollm2-135m: roofline: smollm2-135m on 1x h100-sxm (bfloat16) + vllm engine overheads")
    r = rows(target="llama-3.1-8b", hardware="h100-sxm", drafter_model=["eagle3"], engine="sglang")
    assert r["drafter 1"] == ("eagle3: roofline, on the target's devices: eagle3 head of llama-3.1-8b (draft vocabulary 32,000: the "
                              "published head's for llama-3.1-8b) + sglang engine overheads", "catalog architecture, roofline (not calibrated)")
    assert "host work overlapped" in r["target without speculation"][0]
    assert rows(target="llama-3.1-8b", hardware="h100-sxm", drafter_model=["maxgram"])["drafter 1"][1] == "no cost"
    r = rows(target="llama-3.1-70b", hardware="h100-sxm", tp=4, drafter_model=["llama-3.2-1b", "smollm2-135m"])
    assert "(at tp 1: its heads do not split over 4 devices)" in r["drafter 2"][0] and ", tp 4)" in r["drafter 1"][0]
    r = rows(target="llama-3.1-8b", hardware="h100-sxm", drafter_model=["draft_model:llama-3.2-1b"])
    assert r["drafter 1"][1].startswith("catalog architecture, roofline (not calibrated); config.json of https://huggingface.co/meta-llama/")


def test_a_profile_and_calibrated_hardware_are_said_as_measured_and_fitted(tmp_path):
    r = rows(target="smollm2-135m", hardware="local-cpu", profile=[str(PROFILE)], drafter_model=["maxgram"], dtype="float32")
    assert r["target"][1].startswith("measured (profile)") and r["drafter 1"][1] == "measured (profile)"
    assert "measured proposal time" in r["drafter 1"][0]
    hw = dataclasses.replace(default_catalog().hardware_spec("local-cpu"), name="cal-cpu", measured={"calibration": {"fitted_to": "my steps"}})
    write_catalog(tmp_path / "cal.json", hardware={"cal-cpu": hardware_to_entry(hw)})
    r = rows(target="smollm2-135m", hardware="cal-cpu", catalog=[str(tmp_path / "cal.json")], drafter_model=["smollm2-135m"], dtype="float32",
             engine="none")
    for role in ("target", "drafter 1"):
        assert r[role][1].startswith("catalog architecture, roofline on hardware calibrated to my steps")
    assert r["engine"][1] == "none added"


def test_the_records_are_typed_and_in_the_deployments_order():
    config = ServeSimConfig(**BASE, target="llama-3.1-70b", hardware="h100-sxm", tp=4, drafter_model=["llama-3.2-1b", "selfspec:window=64"])
    _, built = serving_setup(config)
    recs = pricing(built, config.deployment())
    assert [p.role for p in recs] == ["target", "drafter 1", "drafter 2"]
    assert all(p.kind in KINDS and p.engine == "vllm" and p.hardware == "h100-sxm" and p.dtype == "bfloat16" for p in recs)
    assert [p.tp for p in recs] == [4, 4, 4] and recs[0].catalog == "llama-3.1-70b"
    assert recs[2].on_target_devices and not recs[1].on_target_devices


def test_the_report_never_reads_the_backends_text_nor_assembles_again(monkeypatch):
    """Rewriting the assembly's text (a roofline described as a profile) changes nothing the
    report says, and the report given serve-sim's assembly never builds one of its own."""
    config = ServeSimConfig(**BASE, target="llama-2-7b", hardware="h100-sxm", drafter_model=["smollm2-135m"])
    serving, built = serving_setup(config)
    before = reporting.assumptions(config, serving, built)
    built.info["backends"] = {k: "profile measured, free" for k in built.info["backends"]}
    calls = []
    real = costing.HardwareOptions.assembly
    monkeypatch.setattr(costing.HardwareOptions, "assembly", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    assert reporting.assumptions(config, serving, built) == before and calls == []
    assert reporting.assumptions(config, serving) == before and calls == [1]  # without one it builds its own
