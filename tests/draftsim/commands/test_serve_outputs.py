"""serve-sim's outputs (--timeline, --figure, --load-figure, --report) live apart from its
configuration (draftsim.commands.servesim.ServeSimOutputs): a ServeSimConfig — a sweep's point —
holds only what to compute, the command line keeps every flag, and a sweep needs no list of
output options to forbid."""

from __future__ import annotations

import dataclasses
import json

import pytest

from draftsim.cli import main
from draftsim.commands.servesim import ServeSimConfig, ServeSimOutputs
from draftsim.sim.errors import DraftsimError
from draftsim.sweepkinds import COMMANDS, KINDS

OUTPUTS = {"timeline", "figure", "load_figure", "report"}
RUN = ["serve-sim", "--hardware", "h100-sxm", "--target", "llama-3.1-8b", "--drafter-model", "eagle3", "--alpha", "0.7",
       "--policy", "fixed:k=3", "--qps", "4", "--requests", "12", "--prompt-len", "fixed:64", "--output-len", "fixed:8",
       "--replications", "1"]


def test_the_configuration_holds_what_to_compute_and_the_outputs_what_to_write():
    names = {f.name for f in dataclasses.fields(ServeSimConfig)}
    assert not names & OUTPUTS and {f.name for f in dataclasses.fields(ServeSimOutputs)} == OUTPUTS
    assert "figure" not in KINDS["serve"].forbidden and "report" not in KINDS["serve"].forbidden
    point = COMMANDS["serve"].config({"target": "llama-3.1-8b", "hardware": "h100-sxm", "alpha": 0.7, "qps": 2.0})
    assert isinstance(point, ServeSimConfig) and not any(hasattr(point, n) for n in OUTPUTS)
    with pytest.raises(DraftsimError, match="figure"):  # a sweep point naming an output: no such option of the computation
        COMMANDS["serve"].config({"target": "llama-3.1-8b", "hardware": "h100-sxm", "alpha": 0.7, "figure": "x.png"})


@pytest.mark.slow
def test_the_command_line_still_writes_every_output(tmp_path, capsys):
    files = {"timeline": tmp_path / "t.json", "figure": tmp_path / "f.png", "load_figure": tmp_path / "l.png"}
    flags = [x for k, v in files.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    assert main([*RUN, *flags, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key, path in files.items():
        assert path.stat().st_size > 0 and data[f"{key}_path"] == str(path)
