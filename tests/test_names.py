"""Names (issue 36 item 8): every lookup of a name refuses an unknown one in one line with the
closest valid names (one helper, :func:`draftsim.sim.errors.unknown`); Hugging Face repository
ids resolve to catalog entries, case-insensitively; per-position acceptance is echoed in the
convention it was given in, and positions the policy never drafts are said."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim import acceptance as A
from draftsim.sim.acceptance_catalog import acceptance_entry, list_entries
from draftsim.sim.controllers import parse_controller
from draftsim.sim.cost.assembly import Deployment, assemble
from draftsim.sim.cost.catalog import default_catalog
from draftsim.sim.cost.overheads import engine_overheads
from draftsim.sim.errors import DraftsimError, close_names, unknown
from draftsim.sim.policies import parse_policy
from draftsim.sim.serving.workload import ARRIVAL_HELP, parse_arrivals, parse_lengths, workload_preset
from draftsim.sim.traces import EMBEDDED_TRACE

CAT = default_catalog()
MODELS = json.loads((Path(A.__file__).parent / "data" / "models.json").read_text())["models"]


# --- the helper --------------------------------------------------------------------------------

def test_unknown_suggests_the_closest_and_lists_the_rest():
    e = unknown("model", "lama-3.1-8b", ["llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b"])
    assert str(e) == "unknown model 'lama-3.1-8b'; did you mean llama-3.1-8b or llama-3.1-70b? known: llama-3.1-8b, qwen2.5-7b, llama-3.1-70b"
    assert isinstance(e, DraftsimError) and "\n" not in str(e)
    assert str(unknown("policy", "warp", ["fixed", "cascade"])) == "unknown policy 'warp'; known: fixed, cascade"
    # a prefix is a suggestion; an alias suggests its entry; ``known`` stands for a long list
    assert close_names("eagle3-llama", ["eagle-llama-2-7b", "eagle3-llama-3.1-8b-x"])[0] == "eagle3-llama-3.1-8b-x"
    assert close_names("llama2-7", {"llama2-7b": "llama-2-7b", "llama-2-7b": "llama-2-7b"}) == ["llama-2-7b"]
    assert str(unknown("entry", "x", ["a"] * 3, known="3 entries")) == "unknown entry 'x'; 3 entries"


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=30), valid=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=30, unique=True))
def test_suggestions_are_valid_names_other_than_the_input(name, valid):
    close = close_names(name, valid)
    assert len(close) <= 3 and len(set(close)) == len(close)
    assert all(c in valid and c.lower() != name.strip().lower() for c in close)
    assert str(unknown("thing", name, valid)).startswith(f"unknown thing {name!r}")


# --- every lookup uses it ------------------------------------------------------------------------

@pytest.mark.parametrize("lookup, fragment", [
    (lambda: CAT.model("lama-3.1-8b"), "unknown model 'lama-3.1-8b'; did you mean llama-3.1-8b"),
    (lambda: CAT.hardware_spec("h100-sx"), "unknown hardware 'h100-sx'; did you mean h100-sxm"),
    (lambda: engine_overheads("vlm"), "unknown engine 'vlm'; did you mean vllm"),
    (lambda: parse_policy("fixd:k=3"), "unknown policy 'fixd'; did you mean fixed"),
    (lambda: parse_policy("fixed:kk=3"), "unknown parameter 'kk'; did you mean k?"),
    (lambda: parse_controller("nnoe"), "unknown controller 'nnoe'; did you mean none"),
    (lambda: parse_lengths("lognormla:median=3,sigma=1"), "unknown length distribution 'lognormla'; did you mean lognormal"),
    (lambda: parse_arrivals("poison"), "unknown arrival process 'poison'; did you mean poisson"),
    (lambda: acceptance_entry("eagle3-llama-3.1-8b-vllm-issue2078"), "did you mean eagle3-llama-3.1-8b-vllm-issue20780"),
    (lambda: list_entries(method="eagle-3"), "unknown drafting method 'eagle-3'; did you mean eagle3"),
    (lambda: workload_preset("sharegtp"), "unknown workload preset 'sharegtp'; did you mean sharegpt"),
    (lambda: assemble(Deployment("llama-3.1-8b", "h100-sxm", ("eagle-3",))), "unknown model 'eagle-3'; did you mean eagle3"),
    (lambda: A.TraceDriven.from_trace(EMBEDDED_TRACE, drafters=["maxgrm"]), "unknown drafter 'maxgrm'; did you mean maxgram"),
])
def test_every_lookup_says_did_you_mean(lookup, fragment):
    with pytest.raises(DraftsimError) as e:
        lookup()
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_cli_says_did_you_mean_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, err = run(capsys, "cost", "--target", "Llama-3.1-8", "--hardware", "h100-sxm")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "unknown model 'Llama-3.1-8'; did you mean llama-3.1-8b" in err
    assert list(tmp_path.iterdir()) == []


# --- Hugging Face ids ----------------------------------------------------------------------------

def test_hugging_face_ids_resolve_to_the_catalog():
    assert CAT.model("meta-llama/Llama-3.1-70B-Instruct").name == "llama-3.1-70b"
    assert CAT.model("META-LLAMA/LLAMA-3.1-70B-INSTRUCT").name == "llama-3.1-70b"
    assert CAT.model("https://huggingface.co/Qwen/Qwen2.5-7B-Instruct").name == "qwen2.5-7b"
    assert CAT.model(" deepseek-ai/DeepSeek-V3 ").name == "deepseek-v3"


def test_every_source_s_repository_is_an_alias_of_its_entry():
    """An entry whose source is a Hugging Face config.json has that repository as an alias, and
    no spelling names two entries."""
    seen: dict[str, str] = {}
    for name, e in MODELS.items():
        for spelling in (name, *e.get("aliases", [])):
            assert seen.setdefault(spelling.lower(), name) == name, spelling
        src = e["source"]
        if src.startswith("config.json of https://huggingface.co/"):
            repo = re.match(r"config\.json of https://huggingface\.co/([\w.-]+/[\w.-]+)", src).group(1)
            assert repo in e["aliases"], (name, repo)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_casing_of_an_alias_resolves(data):
    pairs = [(a, n) for n, e in MODELS.items() if not e.get("unsupported") for a in e.get("aliases", []) if "/" in a]
    alias, name = data.draw(st.sampled_from(pairs))
    flips = data.draw(st.lists(st.booleans(), min_size=len(alias), max_size=len(alias)))
    mangled = "".join(c.upper() if f else c.lower() for c, f in zip(alias, flips))
    assert CAT.model(mangled).name == name


# --- acceptance echoed as given; positions beyond k said ---------------------------------------

def test_positional_echoes_the_convention_given():
    assert repr(A.Positional.from_cumulative([0.8, 0.6, 0.4])) == "Positional(cumulative=[0.8, 0.6, 0.4])"
    assert repr(A.Positional([0.8, 0.75])) == "Positional(conditional=[0.8, 0.75])"
    assert A.Positional.from_cumulative([0.8, 0.6]).alphas.tolist() == pytest.approx([0.8, 0.75])
    said = repr(A.Positional.from_cumulative([0.8, 0.6, 0.4, 0.3], drafts=2))
    assert said == "Positional(cumulative=[0.8, 0.6, 0.4, 0.3]; positions 3-4 unused: the policy drafts at most 2)"
    assert "unused" not in repr(A.Positional([0.8, 0.6], drafts=2))
    # a catalog entry is echoed as its source reported it (vLLM's cumulative rates here)
    entry = acceptance_entry("ngram-blazedit-vllm-pr24344")
    assert entry.reported == "cumulative" and repr(entry.process(2)).startswith("Positional(cumulative=[")


def test_cli_echoes_cumulative_rates_and_says_unused_positions(capsys):
    status, out, err = run(capsys, "simulate", "--policy", "fixed:k=2", "--positional", "0.8,0.6,0.4", "--cost", "0.1",
                           "--tokens", "20000")
    assert status == 0, err
    assert "Positional(cumulative=[0.8, 0.6, 0.4]; positions 3 unused: the policy drafts at most 2)" in out
    status, out, err = run(capsys, "simulate", "--policy", "fixed:k=2", "--positional", "0.8,0.75", "--conditional", "--cost", "0.1",
                           "--tokens", "20000")
    assert status == 0, err
    assert "Positional(conditional=[0.8, 0.75])" in out


def test_arrival_processes_is_spelled_right():
    assert ARRIVAL_HELP.startswith("Arrival processes on the command line")
