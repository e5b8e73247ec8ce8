"""The acceptance catalog: published acceptance of speculative decoding, each entry cited.

``sim/data/acceptance.json`` (schema ``draftsim.acceptance``, version 1) holds entries for
method × target model × dataset (× engine and hardware where they matter). An entry says
what its source reported — per-position ``cumulative`` or ``conditional`` rates, the
``mean_length`` (tokens per verification step, bonus included) or vLLM's
``draft_acceptance_rate`` — for chains of k drafted tokens (``k``), for a tree, or for a
draft the source does not describe (``k`` null); a value is a list of k rates, a number,
or ``{low, high}`` where the source gives a range (for per-position rates, two lists of k
rates: each position's lowest and highest value). The rates follow the convention of
:mod:`draftsim.sim.acceptance_rates`. Each entry names its source (paper table or figure,
issue, pull request, blog) with a verbatim quote where there is one, says which values
are arithmetic on quoted data (``derived``), and lists what the source leaves open
(``assumptions``). Where a source shows more than a mean, ``shape`` holds it: the share of
steps that accept nothing or draft nothing (n-gram lookups are bimodal), or the trend of
the conditional rates (flat for EAGLE-3, falling for EAGLE; EAGLE-3 paper Fig. 7).

The file is validated entry by entry when read; a bad field raises one-line
:class:`DraftsimError` naming the file, the entry and the field.

A value given as a range is a bracket: ``NAME@low`` and ``NAME@high`` are the entry at each end
(:meth:`AcceptanceEntry.end`), so a team runs both and reports both. An entry is used on its own
target with its own drafting method; :func:`check_use` refuses another, or with ``borrow`` says
in one line per difference what was borrowed (every output carries those lines).

    >>> entry = acceptance_entry("eagle3-llama-3.1-8b-vllm-issue20780")
    >>> entry.chain_lengths, round(entry.mean_length(4), 2)
    ((2, 3, 4, 5, 6, 7), 3.08)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from .acceptance import Positional
from .acceptance_rates import (
    conditional_from_cumulative,
    conditional_from_mean_length,
    cumulative_from_conditional,
    mean_length,
    mean_length_from_draft_rate,
)
from .errors import K_MAX_LIMIT, DraftsimError, unknown
from .registry import methods as drafting_methods

__all__ = [
    "SCHEMA",
    "VERSION",
    "CATALOG_PATH",
    "METHODS",
    "REPORTED",
    "AcceptanceEntry",
    "Range",
    "Shape",
    "load_catalog",
    "acceptance_entry",
    "list_entries",
    "check_target",
    "check_use",
    "same_model",
]

SCHEMA = "draftsim.acceptance"
VERSION = 1
#: The catalog shipped with draftsim.
CATALOG_PATH = Path(__file__).resolve().parent / "data" / "acceptance.json"
#: Drafting methods by the names vLLM and SGLang use (the registry's served ones, draftsim.sim.registry).
METHODS = drafting_methods(served=True)
#: What a source reported (see :mod:`draftsim.sim.acceptance_rates` for the convention).
REPORTED = ("cumulative", "conditional", "mean_length", "draft_acceptance_rate")
#: How the measured draft was shaped: a chain of k tokens, a tree, or not stated.
DRAFTS = ("chain", "tree", "unstated")
#: What a shape claim describes: probabilities per k (``share_…``) or a trend in words.
SHAPES = ("share_of_steps_accepting_nothing", "share_of_steps_without_proposal", "conditional_rates_trend")

_FIELDS = ("method", "target", "target_checkpoint", "drafter", "dataset", "engine", "hardware", "temperature", "draft", "tree",
           "reported", "values", "shape", "derived", "source", "quote", "assumptions")
_SHAPE_FIELDS = ("what", "statement", "values", "source", "quote", "derived")
_NAME = re.compile(r"[a-z0-9][a-z0-9.\-]*")


@dataclass(frozen=True)
class Range:
    """A value the source gives as a range (e.g. "85% to 90%"); for per-position rates each end
    is a tuple of k rates (the positions' lowest and highest values over the source's runs)."""

    low: float | tuple
    high: float | tuple

    def __str__(self) -> str:
        def one(v):
            return "[" + ", ".join(f"{x:g}" for x in v) + "]" if isinstance(v, tuple) else f"{v:g}"

        return f"{one(self.low)}..{one(self.high)}"


@dataclass(frozen=True)
class Shape:
    """Something a source shows beyond a mean: ``values`` maps k (None: any) to a probability."""

    what: str
    statement: str
    values: dict
    source: str
    quote: str | None
    derived: str | None


@dataclass(frozen=True)
class AcceptanceEntry:
    """One published measurement of acceptance (see the module docstring for the fields).

    ``values`` maps k (drafted tokens of a chain; None for a tree or an unstated draft) to
    what the source reported: a tuple of k rates, a number or a :class:`Range`.
    """

    name: str
    method: str
    target: str | None
    target_checkpoint: str | None
    drafter: str | None
    dataset: str | None
    engine: str | None
    hardware: str | None
    temperature: float | None
    draft: str
    tree: str | None
    reported: str
    values: dict
    shape: tuple
    derived: str | None
    source: str
    quote: str | None
    assumptions: tuple

    @property
    def chain_lengths(self) -> tuple[int, ...]:
        """The chain lengths k for which the source gives a value (ranges included)."""
        return tuple(sorted(k for k in self.values if k is not None))

    def summary(self) -> str:
        """One line: name, method, target, dataset, what was reported and for which k."""
        ks = ",".join(map(str, self.chain_lengths)) or self.draft
        return (f"{self.name}: {self.method} on {self.target or 'unstated target'}, {self.dataset or 'unstated dataset'}; "
                f"{self.reported.replace('_', ' ')} at k={ks}")

    @property
    def usable_lengths(self) -> tuple[int, ...]:
        """The chain lengths k that :meth:`process` accepts (empty for a tree, an unstated
        draft or a range): 1..the longest reported chain for per-position rates, the
        reported k for a mean length or draft acceptance rate."""
        if self.draft != "chain":
            return ()
        ks = [k for k in self.chain_lengths if not isinstance(self.values[k], Range)]
        if self.reported in ("cumulative", "conditional"):
            return tuple(range(1, max(ks) + 1)) if ks else ()
        return tuple(ks)

    def _valid_ks(self) -> str:
        ks = self.usable_lengths
        if not ks:
            return "none"
        if self.reported in ("cumulative", "conditional"):
            return f"k = 1..{max(ks)}"
        return "k = " + ", ".join(map(str, ks))

    def conditional(self, k) -> np.ndarray:
        """Conditional rates c_1..c_k for a chain of ``k`` (:mod:`draftsim.sim.acceptance_rates`).

        * per-position rates: those of the smallest reported chain with at least k positions,
          cut to the first k (in a chain the first i tokens are accepted or not whatever
          follows them);
        * a mean length or draft acceptance rate: only at a reported k, through
          :func:`conditional_from_mean_length` — a constant conditional rate, or, where the
          entry's shape gives the share of steps accepting nothing at that k, c_1 = 1 − that
          share and a constant rate after it.

        Anything else (a tree, an unstated draft, a range, a k the source does not cover)
        raises :class:`DraftsimError` saying what is valid.
        """
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or not 1 <= int(k) <= K_MAX_LIMIT:
            raise DraftsimError(f"k must be an integer in [1, {K_MAX_LIMIT}]; got {k!r}")
        k = int(k)
        if self.draft != "chain":
            what = f"a tree draft ({self.tree})" if self.draft == "tree" else "a draft whose shape and length the source does not state"
            raise DraftsimError(f"acceptance entry {self.name!r} reports the {self.reported.replace('_', ' ')} of {what}; "
                                "it gives no per-position rates for a chain of k (pick an entry with draft 'chain')")
        if self.reported in ("cumulative", "conditional"):
            longer = [j for j in self.chain_lengths if j >= k and not isinstance(self.values[j], Range)]
            ranged = [j for j in self.chain_lengths if j >= k and isinstance(self.values[j], Range)]
            if not longer and ranged:
                raise DraftsimError(f"acceptance entry {self.name!r} reports per-position rates at k={ranged[0]} as a range "
                                    f"{self.values[ranged[0]]}, not one value: use its ends as a bracket, {self.name}@low and "
                                    f"{self.name}@high (run both and report both)")
            if not longer:
                raise DraftsimError(f"acceptance entry {self.name!r} has per-position rates for at most "
                                    f"{max(self.chain_lengths)} positions; k={k} needs {k} (valid: {self._valid_ks()})")
            rates = np.asarray(self.values[min(longer)], dtype=float)[:k]
            return conditional_from_cumulative(rates) if self.reported == "cumulative" else rates
        value = self.values.get(k)
        if value is None:
            raise DraftsimError(f"acceptance entry {self.name!r} reports a {self.reported.replace('_', ' ')} only at "
                                f"{self._valid_ks()}; got k={k} (a mean at one k does not give another k's)")
        if isinstance(value, Range):
            raise DraftsimError(f"acceptance entry {self.name!r} reports a range {value} at k={k}, not one value: "
                                f"use its ends as a bracket, {self.name}@low and {self.name}@high (run both and report both)")
        length = value if self.reported == "mean_length" else mean_length_from_draft_rate(value, k)
        nothing = [s.values[k] for s in self.shape if s.what == "share_of_steps_accepting_nothing" and k in s.values]
        first = 1.0 - nothing[0] if nothing else None
        return conditional_from_mean_length(length, k, first=first)

    def share_without_proposal(self, k) -> float | None:
        """The share of steps that drafted nothing (no n-gram match) at chain length ``k`` where
        the source counts it (shape ``share_of_steps_without_proposal`` at that k, or for any k);
        None where it does not."""
        for s in self.shape:
            if s.what == "share_of_steps_without_proposal":
                if k in s.values:
                    return float(s.values[k])
                if None in s.values:
                    return float(s.values[None])
        return None

    @property
    def ranges(self) -> dict:
        """The values the source gives as ranges, by k."""
        return {k: v for k, v in self.values.items() if isinstance(v, Range)}

    def end(self, which: str) -> "AcceptanceEntry":
        """The entry with every range replaced by its ``"low"`` or ``"high"`` end (named
        ``NAME@low`` / ``NAME@high``): a published range used as a bracket, one run per end.
        Refused for an entry that reports no range."""
        if which not in ("low", "high"):
            raise DraftsimError(f"acceptance entry {self.name!r}: a bracket's end is low or high; got {which!r}")
        if not self.ranges:
            raise DraftsimError(f"acceptance entry {self.name!r} reports no range, so it has no {which} end; use {self.name}")
        values = {k: (getattr(v, which) if isinstance(v, Range) else v) for k, v in self.values.items()}
        bracket = ", ".join(f"k={k}: {v}" for k, v in sorted(self.ranges.items()))
        return replace(self, name=f"{self.name}@{which}", values=values,
                       assumptions=(*self.assumptions, f"the {which} end of the published range ({bracket}); "
                                                       f"{self.name}@{'high' if which == 'low' else 'low'} is the other end"))

    def cumulative(self, k) -> np.ndarray:
        """Cumulative rates a_1..a_k (vLLM's per-position acceptance) for a chain of ``k``."""
        return cumulative_from_conditional(self.conditional(k))

    def mean_length(self, k) -> float:
        """Mean acceptance length (bonus token included) for a chain of ``k``."""
        return mean_length(self.cumulative(k))

    def process(self, k, **kwargs) -> Positional:
        """The :class:`~draftsim.sim.acceptance.Positional` process for a chain of ``k``, echoed
        in the convention its source reported (cumulative rates when it reported those, else
        conditional ones); ``kwargs`` go to it (noise models)."""
        echo = self.cumulative(k) if self.reported == "cumulative" else None
        return Positional(self.conditional(k), cumulative=echo, **kwargs)


# ------------------------------------------------------------------------------ reading


class _Reader:
    """Checks one entry's fields; every error names the file, the entry and the field."""

    def __init__(self, origin: str, name: str):
        self.origin, self.name = origin, name

    def fail(self, field: str, message: str):
        raise DraftsimError(f"{self.origin}: acceptance entry {self.name!r}, field {field!r}: {message}")

    def text(self, e: dict, field: str, optional: bool = True):
        value = e[field]
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value.strip():
            self.fail(field, f"must be a non-empty string{' or null' if optional else ''}; got {value!r}")
        return value

    def choice(self, e: dict, field: str, options: tuple) -> str:
        value = e[field]
        if value not in options:
            self.fail(field, f"must be one of {', '.join(options)}; got {value!r}")
        return value

    def number(self, field: str, value, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            self.fail(field, f"must be a number in [{low}, {high}]; got {value!r}")
        return float(value)

    def k(self, field: str, value, optional: bool) -> int | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= K_MAX_LIMIT:
            self.fail(field, f"k must be an integer in [1, {K_MAX_LIMIT}]{' or null' if optional else ''}; got {value!r}")
        return value

    def scalar(self, field: str, value, low: float, high: float):
        if isinstance(value, dict):
            if set(value) != {"low", "high"}:
                self.fail(field, f"a range must be {{low, high}}; got keys {sorted(value)}")
            lo, hi = self.number(field, value["low"], low, high), self.number(field, value["high"], low, high)
            if lo > hi:
                self.fail(field, f"a range needs low <= high; got {lo}..{hi}")
            return Range(lo, hi)
        return self.number(field, value, low, high)

    def value(self, reported: str, k: int | None, value, field: str):
        if reported in ("cumulative", "conditional"):
            if k is None:
                self.fail(field, f"{reported} rates need the chain length k; got k null")
            if isinstance(value, dict):  # per-position ranges: each end a list of k rates
                if set(value) != {"low", "high"}:
                    self.fail(field, f"a range must be {{low, high}}; got keys {sorted(value)}")
                lo, hi = self.rates(reported, k, value["low"], field), self.rates(reported, k, value["high"], field)
                if any(a > b for a, b in zip(lo, hi)):
                    self.fail(field, f"a range needs low <= high at every position; got {list(lo)}..{list(hi)}")
                return Range(lo, hi)
            return self.rates(reported, k, value, field)
        if reported == "mean_length":
            return self.scalar(field, value, 1.0, float(k + 1) if k is not None else float(K_MAX_LIMIT + 1))
        return self.scalar(field, value, 0.0, 1.0)

    def rates(self, reported: str, k: int, value, field: str) -> tuple:
        if not isinstance(value, list) or len(value) != k:
            self.fail(field, f"{reported} rates at k={k} must be a list of {k} rates (or {{low, high}} of two such lists); got {value!r}")
        rates = tuple(self.number(field, v, 0.0, 1.0) for v in value)
        if reported == "cumulative" and any(b > a for a, b in zip(rates, rates[1:])):
            self.fail(field, f"cumulative rates (P(tokens 1..i all accepted)) must not increase; got {list(rates)}")
        return rates

    def points(self, field: str, points, optional_k: bool, probability: bool = False, reported: str = "") -> dict:
        if not isinstance(points, list) or not points:
            self.fail(field, f"must be a non-empty list of {{k, value}}; got {points!r}")
        out = {}
        for i, p in enumerate(points):
            where = f"{field}[{i}]"
            if not isinstance(p, dict) or set(p) != {"k", "value"}:
                self.fail(where, f"must be an object {{k, value}}; got {p!r}")
            k = self.k(where, p["k"], optional_k)
            if k in out:
                self.fail(where, f"k={k} appears twice")
            out[k] = self.number(where, p["value"], 0.0, 1.0) if probability else self.value(reported, k, p["value"], where)
        return out


def _entry(origin: str, name, e) -> AcceptanceEntry:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise DraftsimError(f"{origin}: acceptance entry name must be lower-case letters, digits, '.' and '-'; got {name!r}")
    r = _Reader(origin, name)
    if not isinstance(e, dict):
        raise DraftsimError(f"{origin}: acceptance entry {name!r} must be an object; got {type(e).__name__}")
    missing = [f for f in _FIELDS if f not in e]
    if missing:
        r.fail(missing[0], "is missing")
    extra = sorted(set(e) - set(_FIELDS))
    if extra:
        r.fail(extra[0], f"is not a field of an entry (fields: {', '.join(_FIELDS)})")
    method = r.choice(e, "method", METHODS)
    draft = r.choice(e, "draft", DRAFTS)
    reported = r.choice(e, "reported", REPORTED)
    values = r.points("values", e["values"], optional_k=draft != "chain", reported=reported)
    if draft == "chain" and None in values:
        r.fail("values", "a chain's values need k")
    if draft != "chain" and set(values) != {None}:
        r.fail("values", f"a {draft} draft has one value with k null; got k {sorted(k for k in values if k is not None)}")
    tree = r.text(e, "tree", optional=draft != "tree")
    temperature = e["temperature"]
    if temperature is not None:
        temperature = r.number("temperature", temperature, 0.0, 100.0)
    if not isinstance(e["shape"], list):
        r.fail("shape", f"must be a list of shape claims; got {e['shape']!r}")
    shape = []
    for i, s in enumerate(e["shape"]):
        where = f"shape[{i}]"
        if not isinstance(s, dict) or set(s) != set(_SHAPE_FIELDS):
            r.fail(where, f"must be an object with fields {', '.join(_SHAPE_FIELDS)}; got {s!r}")
        what = r.choice(s, "what", SHAPES)
        pts = {} if s["values"] is None else r.points(f"{where}.values", s["values"], optional_k=True, probability=True)
        if what.startswith("share_") and not pts:
            r.fail(f"{where}.values", f"a {what} claim needs values")
        shape.append(Shape(what, r.text(s, "statement", optional=False), pts, r.text(s, "source", optional=False),
                           r.text(s, "quote"), r.text(s, "derived")))
    assumptions = e["assumptions"]
    if not isinstance(assumptions, list) or not all(isinstance(a, str) and a.strip() for a in assumptions):
        r.fail("assumptions", f"must be a list of non-empty strings; got {assumptions!r}")
    entry = AcceptanceEntry(
        name=name, method=method, target=r.text(e, "target"), target_checkpoint=r.text(e, "target_checkpoint"),
        drafter=r.text(e, "drafter"), dataset=r.text(e, "dataset"), engine=r.text(e, "engine"), hardware=r.text(e, "hardware"),
        temperature=temperature, draft=draft, tree=tree, reported=reported, values=values, shape=tuple(shape),
        derived=r.text(e, "derived"), source=r.text(e, "source", optional=False), quote=r.text(e, "quote"), assumptions=tuple(assumptions),
    )
    for k in entry.chain_lengths:  # a mean and a share of steps accepting nothing must fit together
        if not isinstance(values[k], Range):
            try:
                entry.conditional(k)
            except DraftsimError as exc:
                r.fail("values", f"at k={k}: {exc}")
    return entry


def _parse(doc, origin: str) -> dict[str, AcceptanceEntry]:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise DraftsimError(f"{origin}: not an acceptance catalog (schema must be {SCHEMA!r}; got {doc.get('schema') if isinstance(doc, dict) else doc!r})")
    if doc.get("version") != VERSION:
        raise DraftsimError(f"{origin}: acceptance catalog version must be {VERSION}; got {doc.get('version')!r}")
    entries = doc.get("entries")
    if not isinstance(entries, dict) or not entries:
        raise DraftsimError(f"{origin}: 'entries' must be a non-empty object of named entries")
    return {name: _entry(origin, name, e) for name, e in entries.items()}


def load_catalog(path=None) -> dict[str, AcceptanceEntry]:
    """Every entry of an acceptance catalog (default: the shipped one), validated, by name."""
    path = str(Path(path) if path is not None else CATALOG_PATH)
    try:
        stamp = Path(path).stat().st_mtime_ns
    except OSError as exc:
        raise DraftsimError(f"cannot read acceptance catalog {path}: {exc.strerror}") from None
    return dict(_load(path, stamp))


@lru_cache(maxsize=8)
def _load(path: str, stamp: int) -> tuple:
    """The parsed catalog at ``path`` as it was at modification time ``stamp``."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise DraftsimError(f"cannot read acceptance catalog {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise DraftsimError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return tuple(_parse(doc, path).items())


# ------------------------------------------------------------------------------ lookup


def acceptance_entry(name: str, path=None) -> AcceptanceEntry:
    """The entry called ``name`` (``NAME@low`` / ``NAME@high``: an end of its published range,
    :meth:`AcceptanceEntry.end`); an unknown name raises :class:`DraftsimError` listing close ones."""
    catalog = load_catalog(path)
    base, at, which = str(name).rpartition("@") if "@" in str(name) else (str(name), "", "")
    if at and base in catalog:
        return catalog[base].end(which)
    if name in catalog:
        return catalog[name]
    raise unknown("acceptance entry", name, list(catalog), known=f"{len(catalog)} entries (draftsim acceptance lists them)")


def list_entries(method: str | None = None, target: str | None = None, dataset: str | None = None, path=None) -> list[AcceptanceEntry]:
    """Entries, in file order, filtered by method, target model (:func:`same_model`) and dataset."""
    if method is not None and method not in METHODS:
        raise unknown("drafting method", method, METHODS)
    out = []
    for entry in load_catalog(path).values():
        if method is not None and entry.method != method:
            continue
        if target is not None and (entry.target is None or not same_model(entry.target, target)):
            continue
        if dataset is not None and (entry.dataset is None or entry.dataset.lower() != str(dataset).lower()):
            continue
        out.append(entry)
    return out


#: Suffixes that name a variant of the same architecture and weights' base (chat tuning,
#: packaging, quantisation), dropped before comparing model names.
_VARIANT = re.compile(r"-(instruct|chat|it|hf|base|fp8|int8|int4|awq|gptq)$")


def _model_key(name: str) -> str:
    """A model name reduced for comparison: no organisation prefix, lower case, hyphens
    between letters and digits, no variant suffix (``meta-llama/Llama-3.1-8B-Instruct`` and
    ``llama3.1-8b`` both give ``llama-3.1-8b``)."""
    s = str(name).strip().lower().rsplit("/", 1)[-1]
    s = re.sub(r"[\s_-]+", "-", s).strip("-")
    while _VARIANT.search(s):
        s = _VARIANT.sub("", s)
    s = re.sub(r"(?<=[a-z])(?=\d)", "-", s)
    return re.sub(r"^meta-(?=llama)", "", s)


def same_model(a: str, b: str) -> bool:
    """Whether two model names denote the same target (see :func:`_model_key`)."""
    return _model_key(a) == _model_key(b)


def check_target(entry: AcceptanceEntry | str, target: str) -> AcceptanceEntry:
    """``entry`` (or the entry of that name) if it was measured on ``target``; otherwise
    :class:`DraftsimError` naming both models and the entries that were measured on ``target``."""
    if isinstance(entry, str):
        entry = acceptance_entry(entry)
    if entry.target is None:
        raise DraftsimError(f"acceptance entry {entry.name!r} does not name its target model (its source leaves it open), "
                            f"so it cannot be checked against {target!r}; pick an entry measured on {target!r}")
    if not same_model(entry.target, target):
        mine = [e.name for e in list_entries(target=target)]
        hint = f"entries for {target!r}: {', '.join(mine[:6])}{' …' if len(mine) > 6 else ''}" if mine else f"the catalog has no entry for {target!r}"
        raise DraftsimError(f"acceptance entry {entry.name!r} was measured on {entry.target!r}, not on the target {target!r}; {hint}")
    return entry


def check_use(entry: AcceptanceEntry | str, target: str | None = None, method: str | None = None,
              borrow: bool = False) -> list[str]:
    """Whether ``entry`` may price this run: measured on ``target`` (None: no target named) with
    ``method`` (the drafter's, as :data:`METHODS` names them; None: not known). A difference is
    refused in one line naming both sides, or with ``borrow`` returned as one warning line each
    (the caller puts them in every output); an end of a range adds the line saying so."""
    if isinstance(entry, str):
        entry = acceptance_entry(entry)
    warnings = []
    if target and (entry.target is None or not same_model(entry.target, target)):
        if not borrow:
            try:
                check_target(entry, target)
            except DraftsimError as exc:
                raise DraftsimError(f"{exc}; add --borrow to use it anyway (every output then says so)") from None
        warnings.append(f"acceptance borrowed: entry {entry.name!r} was measured on "
                        f"{entry.target or 'a target its source does not name'}, not on {target}")
    if method and method != entry.method:
        if not borrow:
            raise DraftsimError(f"acceptance entry {entry.name!r} was measured with drafting method {entry.method}, the drafter here "
                                f"is {method}; pick an entry of {method} (draftsim acceptance --method {method}) or add --borrow")
        warnings.append(f"acceptance borrowed: entry {entry.name!r} was measured with {entry.method}, the drafter here is {method}")
    if borrow and not warnings:  # asked to borrow, nothing borrowed: say what the entry was measured on, unchecked or matching
        unchecked = [w for w, given in (("no target", target), ("no drafter", method)) if not given]
        warnings.append(f"--borrow borrowed nothing: entry {entry.name!r} was measured on {entry.target or 'a target its source does not name'} "
                        f"with {entry.method}; " + (f"this run names {' and '.join(unchecked)} to compare with"
                                                    if unchecked else "this run's target and drafter are the same"))
    if "@" in entry.name:
        warnings.append(f"acceptance bracket: {entry.assumptions[-1]}")
    return warnings
