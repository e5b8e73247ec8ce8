"""The registries (issue 39 item 3): every drafting method and every engine is one entry of
:mod:`draftsim.sim.registry`; every help text that lists them is generated from it, every entry is
reachable from the command line's help and from the pricing path, adding a method is one entry,
and sim/data/engines.json is read through a schema that refuses a damaged file in one line."""

from __future__ import annotations

import argparse
import copy
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftsim.cli import build_parser
from draftsim.sim import registry as R
from draftsim.sim.acceptance_catalog import METHODS as ACCEPTANCE_METHODS
from draftsim.sim.cost.assembly import CHEAP_DRAFTERS, Deployment, assemble
from draftsim.sim.cost.methods import FACTS, HEADS, LAYOUTS, LOOKUPS, parse_drafter
from draftsim.sim.errors import DraftsimError

ROOT = Path(__file__).resolve().parents[2]
PARSER = build_parser()


def _actions(dest: str):
    """(command, action) for every subcommand option that stores ``dest``."""
    for name, sub in PARSER._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            if action.dest == dest:
                yield name, action


def _listed(text: str, start: str, end: str, items) -> list[str]:
    """Which of ``items`` the list in ``text`` from ``start`` to the first match of ``end`` (a
    pattern; ``a, b, c or d``) holds, in its order; anything else in it fails."""
    body = text[text.index(start) + len(start):]
    cut = re.search(end, body)
    body = body[: cut.start()] if cut else body
    found = sorted((body.index(x), x) for x in items if x in body)
    for _, x in found:
        body = body.replace(x, "", 1)
    assert not [x for x in re.split(r", | or ", body) if x.strip()], body
    return [x for _, x in found]


# --- every entry from the command line ----------------------------------------------------------

def test_every_drafter_option_lists_exactly_the_registrys_methods():
    actions = list(_actions("drafter_model"))
    assert {name for name, _ in actions} >= {"cost", "simulate", "serve-sim", "plan", "ewif"}
    for name, action in actions:
        assert R.drafter_help() in action.help, name
        usages = [m.usage for m in R.METHODS.values()]
        assert _listed(action.help, "drafter (repeat, in drafter order): ", r" \((draftsim|default)", usages) == usages


def test_the_real_commands_list_the_lookups_that_run_here():
    helps = {name: a.help for name, a in _actions("drafter") if name in ("run", "serve", "record")}
    assert len(helps) == 3
    for name, text in helps.items():
        assert R.lookup_drafters() in text, name
    assert R.lookup_drafters().split(", ") == [m.name for m in R.METHODS.values() if m.pricing == "lookup" and m.real_drafter]


def test_the_front_doors_method_option_lists_the_served_methods_and_parses_each():
    from draftsim.commands.frontdoor import parse_method

    action = next(a for n, a in _actions("method") if n == "capacity")
    served = [m.name for m in R.METHODS.values() if m.served and m.pricing != "draft_model"]
    every = [m.name for m in R.METHODS.values()]
    assert _listed(action.help, "NAME ", ";", [*every, "a catalog draft model"]) == [*served, "a catalog draft model"]
    for name in served:
        m = parse_method(f"{name}:k=2")
        assert (m.drafter, m.ks, m.title) == (name, (2,), R.METHODS[name].title)
    for entry in R.METHODS.values():
        if not entry.served and entry.pricing == "lookup":
            with pytest.raises(DraftsimError, match="papers' drafters"):
                parse_method(entry.name)


def test_every_engine_is_in_the_engine_help_with_its_numbers_from_the_data():
    helps = [a.help for _, a in _actions("engine")]
    assert len(helps) >= 2
    for engine in R.ENGINES.values():
        line = engine.help_line()
        assert all(line in h for h in helps), line
        if engine.name != "none":
            assert f"{engine.per_step * 1e3:.2f} ms per step" in line
            assert all(m in line for m in engine.batch_expansion)
    for _, a in _actions("engine"):
        if a.choices is not None:
            assert list(a.choices) == list(R.ENGINES)


def test_no_command_or_config_copies_a_method_list_or_an_engines_number():
    """The lists and numbers are generated: no source outside the registry spells a drafter list,
    the front door's titles or a per-step time."""
    sources = [*sorted((ROOT / "draftsim" / "commands").glob("*.py")), ROOT / "draftsim" / "config.py",
               *sorted((ROOT / "sim" / "cost").glob("*.py"))]
    for path in sources:
        text = path.read_text()
        assert "eagle3[:draft_vocab=N]" not in text, path
        assert not re.search(r"\d\.\d+ ms per step", text), path
        assert not re.search(r'"mtp", "ngram"|"ngram", "suffix"|HEADS\)}, ngram', text), path
        assert '"EAGLE-3"' not in text, path


# --- every entry on the pricing path ------------------------------------------------------------

def _example(entry: R.DraftingMethod) -> str:
    if entry.pricing == "draft_model":
        return "draft_model:llama-3.2-1b"
    opts = ",".join(f"{o.key}={o.example}" for o in entry.options if o.required)
    return entry.name + (f":{opts}" if opts else "")


@pytest.mark.parametrize("name", list(R.METHODS))
def test_every_method_is_parsed_and_priced_as_its_entry_says(name):
    entry = R.METHODS[name]
    drafter = _example(entry)
    assert parse_drafter(drafter).method == name
    target = "glm-4.5-air" if entry.layout == "mtp" else "llama-3.1-8b"
    a = assemble(Deployment(target, "h100-sxm", (drafter,), tp=2 if target == "glm-4.5-air" else 1, dtype="float8"
                            if target == "glm-4.5-air" else "bfloat16"))
    backend = list(a.info["backends"].values())[-1]
    expect = {"lookup": "free (no profile", "head": "on the target's devices", "target_window": "KV window",
              "draft_model": "roofline: llama-3.2-1b"}[entry.pricing]
    assert expect in backend
    t = float(a.drafters[0].shape_time(4, 1, 512))
    assert t == 0.0 if entry.pricing == "lookup" else t > 0.0


def test_the_derived_lists_are_the_registrys():
    assert LOOKUPS == CHEAP_DRAFTERS == R.methods(pricing="lookup")
    assert HEADS == R.methods(pricing="head")
    assert ACCEPTANCE_METHODS == R.methods(served=True)


def test_every_head_has_a_layout_its_builder_and_its_facts():
    heads = [m for m in R.METHODS.values() if m.pricing == "head"]
    assert heads
    for m in heads:
        assert m.layout in LAYOUTS and m.facts in FACTS, m.name
    assert set(FACTS) <= {m.facts for m in heads}  # no facts entry belongs to no method


def test_every_real_drafter_is_a_drafter_of_realrun():
    from draftsim.realrun import drafters
    from draftsim.realrun.methods import STATISTICAL_DRAFTERS

    for m in R.METHODS.values():
        if m.real_drafter is not None:
            cls = getattr(drafters, m.real_drafter)
            assert issubclass(cls, drafters.Drafter), m.name
            assert m.pricing == "draft_model" or cls.name == m.name
    assert set(STATISTICAL_DRAFTERS) == {m.name for m in R.METHODS.values() if m.pricing == "lookup" and m.real_drafter}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_options_are_checked_against_their_ranges(data):
    entry = data.draw(st.sampled_from([m for m in R.METHODS.values() if m.options]))
    option = data.draw(st.sampled_from(entry.options))
    others = ",".join(f"{o.key}={o.example}" for o in entry.options if o.required and o is not option)
    value = data.draw(st.integers(0, option.maximum * 10))
    text = f"{entry.name}:{option.key}={value}" + (f",{others}" if others else "")
    if option.minimum <= value <= option.maximum:
        assert dict(parse_drafter(text).options)[option.key] == value
    else:
        with pytest.raises(DraftsimError) as e:
            parse_drafter(text)
        assert option.key in str(e.value) and "\n" not in str(e.value)
    if option.required:
        with pytest.raises(DraftsimError, match=f"needs {option.key}="):
            parse_drafter(entry.name + (f":{others}" if others else ""))


# --- adding a method is one entry -------------------------------------------------------------

def test_adding_a_method_is_one_entry(monkeypatch):
    """A new method, written once in the registry: parsed, priced, listed in the help and taken
    by the front door, with nothing else edited."""
    from draftsim.commands.frontdoor import parse_method

    new = R.DraftingMethod("eagle3-wide", "EAGLE-3 (full vocabulary)", "an EAGLE-3 head over the target's whole vocabulary", "head",
                           options=R.METHODS["eagle3"].options, layout="eagle3")
    monkeypatch.setitem(R.METHODS, new.name, new)
    assert "eagle3-wide[:draft_vocab=N]" in R.drafter_help() and "eagle3-wide" in R.served_method_help()
    assert parse_drafter("eagle3-wide:draft_vocab=128256").options == (("draft_vocab", 128256),)
    a = assemble(Deployment("llama-3.1-8b", "h100-sxm", ("eagle3-wide:draft_vocab=32000", "eagle3")))
    assert float(a.drafters[0].shape_time(8, 1, 1024)) == float(a.drafters[1].shape_time(8, 1, 1024))
    assert a.info["backends"]["eagle3-wide:draft_vocab=32000"].startswith("eagle3-wide on the target's devices")
    assert parse_method("eagle3-wide:k=3").title == "EAGLE-3 (full vocabulary)"


# --- engines.json through its schema ----------------------------------------------------------

DOC = json.loads(R.ENGINES_FILE.read_text())


def _fields(doc: dict) -> list[tuple[tuple, bool]]:
    """(path, required) of every field the schema declares that the document holds, walking
    objects, lists and nulls-or-objects alike."""
    out = []

    def walk(check, value, path):
        if isinstance(check, R.Maybe):
            if value is not None:
                walk(check.inner, value, path)
        elif isinstance(check, R.ListOf):
            for i, x in enumerate(value):
                walk(check.item, x, (*path, i))
        elif isinstance(check, R.Obj) and check.mapping is None:
            for key, (required, inner) in check.fields.items():
                if key in value:
                    out.append(((*path, key), required))
                    walk(inner, value[key], (*path, key))

    for name, entry in doc["engines"].items():
        walk(R.ENGINE_SCHEMA, entry, ("engines", name))
    return out


FIELDS = _fields(DOC)


def test_the_shipped_file_passes_and_every_engine_is_built_by_keyword(tmp_path):
    assert len(FIELDS) > 40
    path = tmp_path / "engines.json"
    path.write_text(json.dumps(DOC))
    assert R.read_engines(path) == R.ENGINES
    assert R.ENGINES["vllm"].graph_tokens == tuple([1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16)))


def _at(doc, path):
    for p in path[:-1]:
        doc = doc[p]
    return doc


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(FIELDS), st.sampled_from(["drop", "rename", "value"]), st.sampled_from([{"bad": 1}, -1.5, "1e9 tokens"]))
def test_a_damaged_copy_is_refused_in_one_line_naming_the_file_and_the_field(tmp_path, field, damage, value):
    path, required = field
    doc = copy.deepcopy(DOC)
    parent, key = _at(doc, path), path[-1]
    if damage == "drop":
        if not required:
            return
        del parent[key]
    elif damage == "rename":
        if isinstance(key, int):
            return
        parent[key + "_typo"] = parent.pop(key)
    else:
        if value == "1e9 tokens" and isinstance(parent[key], str):
            return  # a string is a valid text
        parent[key] = value
    bad = tmp_path / "engines.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(DraftsimError) as e:
        R.read_engines(bad)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{bad}: engines.{path[1]}")
    named = key + "_typo" if damage == "rename" else key
    assert (f".{named}" if isinstance(named, str) else f"[{named}]") in message


def test_a_file_that_is_no_json_or_lacks_the_none_engine_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "engines.json"
    bad.write_text("{not json")
    with pytest.raises(DraftsimError, match=r"engines\.json: not a readable JSON file"):
        R.read_engines(bad)
    doc = copy.deepcopy(DOC)
    del doc["engines"]["none"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(DraftsimError, match=r"engines\.json: engines\.none: missing"):
        R.read_engines(bad)


def test_the_help_of_every_command_still_builds():
    for sub in PARSER._subparsers._group_actions[0].choices.values():
        if isinstance(sub, argparse.ArgumentParser) and sub._actions:
            assert sub.format_help()


def test_every_served_method_says_how_vllm_deploys_it():
    """The front door's engine configuration is read from the registry (no per-method branch in
    deploy()): every method an engine serves carries vLLM's --speculative-config entries, a head
    or draft model named by a placeholder the front door fills, and SGLang's algorithm only where
    it takes a draft model path."""
    for m in R.METHODS.values():
        if not m.served:
            continue
        cfg = dict(m.vllm)
        assert cfg, m.name
        assert "method" in cfg or cfg.get("model") == "{drafter}", m.name
        if m.sglang is not None:
            assert "model" in cfg, m.name
