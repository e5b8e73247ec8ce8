"""How far draftsim's speedups have been from published ones: the evidence an answer carries.

``sim/data/evidence.json`` holds every scored point of the published suite
(``benchmarks/published/``, one file per source, each point predicted from its stated setup with
the catalog's defaults): where it ran (engine, hardware, target, whether the target is a mixture
of experts, tensor parallelism), how it drafted (the drafting method, by the names of
:data:`draftsim.sim.registry.METHODS`; a catalog draft model is ``draft_model``), its batch where
the source held one, and the published value, the prediction and the error (predicted /
published − 1). It is written by ``python benchmarks/published/evidence.py`` from the suite's
own run, never by hand, and a test reruns the suite and refuses a file that no longer matches it.

:func:`evidence_for` answers "how far off were speedups like this one?": the points that share a
deployment's drafting method, whether its target is a mixture of experts, its engine, its
hardware and, where the deployment's batch is known (the mean batch a replica runs at the answer's
load), a batch within :data:`BATCH_FACTOR` of it; relaxing the most specific of these first
(hardware, then engine, then the batch; then, without the batch, hardware, engine and the method)
until at least :data:`MIN_POINTS` points remain; what it matched on is said with the numbers. The
batch is kept before the hardware and the engine are dropped entirely: a speedup's error moves
with the batch more than between like GPUs (the EAGLE-3 paper's Table 5, one GPU: EAGLE +11% … +19% at
batch 2-24, +17% … +38% at 32-56). A point whose batch the source did not hold (an open loop) never matches a
batch. Brackets and crossovers carry no error and are not in the file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import DraftsimError

__all__ = ["SCHEMA", "VERSION", "EVIDENCE_FILE", "MIN_POINTS", "BATCH_FACTOR", "EvidencePoint", "Evidence", "method_family", "read_evidence",
           "evidence_for", "overall", "record", "overall_text", "adverse_margin"]

SCHEMA = "draftsim.evidence"
VERSION = 1
EVIDENCE_FILE = Path(__file__).parent / "data" / "evidence.json"
#: Fewest points a statement rests on; fewer and :func:`evidence_for` matches on less.
MIN_POINTS = 4
#: A point "at the deployment's batch" held a batch within this factor of it (either way).
BATCH_FACTOR = 2.0
#: The relaxations :func:`evidence_for` tries, most specific first: the fields a point must share.
LEVELS = (("method", "moe", "engine", "hardware", "batch"), ("method", "moe", "engine", "batch"), ("method", "moe", "batch"),
          ("method", "moe", "engine", "hardware"), ("method", "moe", "engine"), ("method", "moe"), ("moe",), ())

#: Each point's fields and their kinds.
_FIELDS = {"source": "text", "label": "text", "metric": "text", "engine": "text", "hardware": "text", "target": "text", "moe": "flag",
           "tp": "whole number", "method": "text", "batch": "whole number or null", "published": "number", "predicted": "number",
           "error": "number"}


def _is(kind: str, v) -> bool:
    whole = isinstance(v, int) and not isinstance(v, bool)
    return {"text": isinstance(v, str) and bool(v.strip()), "flag": isinstance(v, bool), "whole number": whole,
            "whole number or null": v is None or whole,
            "number": isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}[kind]


@dataclass(frozen=True)
class EvidencePoint:
    """One scored published point: its setup (``method`` as :func:`method_family` names it) and
    ``error`` = predicted / published − 1."""

    source: str
    label: str
    metric: str
    engine: str
    hardware: str
    target: str
    moe: bool
    tp: int
    method: str
    batch: int | None
    published: float
    predicted: float
    error: float


@dataclass(frozen=True)
class Evidence:
    """The points like a deployment (``matched``: the fields they share with it, ``like``: its
    values of them) and their |error|: median and worst, the mean signed error (> 0: predicted
    too fast), and the sources they come from."""

    matched: tuple[str, ...]
    like: dict
    points: int
    median_abs_error: float
    worst_abs_error: float
    mean_error: float
    sources: tuple[str, ...]

    def describe(self) -> str:
        """'18 published runs of EAGLE-3 on dense targets with vllm on h100-sxm (3 sources)'."""
        from .registry import METHODS

        title = lambda v: METHODS[v].title if v in METHODS else v  # noqa: E731
        what = {"method": lambda v: f" of {title(v)}" if v != "draft_model" else " of draft models", "moe": lambda v: " on MoE targets" if v else " on dense targets",
                "engine": lambda v: f" with {v}", "hardware": lambda v: f" on {v}",
                "batch": lambda v: f" at batch {_batch_range(v)}"}
        n = len(self.sources)
        return (f"{self.points} published run{'s' if self.points != 1 else ''}" + "".join(what[f](self.like[f]) for f in self.matched)
                + f" ({n} source{'s' if n != 1 else ''})")

    def text(self) -> str:
        """One line: what the points are and how far their predicted speedups were off."""
        lean = "fast" if self.mean_error > 0 else "slow"
        return (f"draftsim's speedups of {self.describe()} were off by a median {self.median_abs_error:.1%} "
                f"(worst {self.worst_abs_error:.1%}; on average {abs(self.mean_error):.1%} {lean}; benchmarks/published)")

    def to_dict(self) -> dict:
        return {"matched_on": list(self.matched), "like": self.like, "points": self.points, "median_abs_error": self.median_abs_error,
                "worst_abs_error": self.worst_abs_error, "mean_error": self.mean_error, "sources": list(self.sources),
                "text": self.text()}


def method_family(drafter: str | None) -> str:
    """A drafter's method as the evidence names it: a registry method's own name (``eagle3``),
    ``draft_model`` for anything else (a catalog draft model), ``none`` for no drafter."""
    from .registry import METHODS

    if not drafter:
        return "none"
    name = str(drafter).split(":")[0].lower()
    return name if name in METHODS else "draft_model"


def _point(raw, where: str) -> EvidencePoint:
    if not isinstance(raw, dict):
        raise DraftsimError(f"{where}: expected an object; got {type(raw).__name__}")
    missing = [k for k in _FIELDS if k not in raw]
    extra = [k for k in raw if k not in _FIELDS]
    if missing or extra:
        raise DraftsimError(f"{where}: " + (f"missing {', '.join(missing)}" if missing else f"unknown key(s) {', '.join(extra)}")
                            + f" (valid: {', '.join(_FIELDS)})")
    for key, kind in _FIELDS.items():
        if not _is(kind, raw[key]):
            raise DraftsimError(f"{where}.{key}: expected a {kind}; got {json.dumps(raw[key])[:40]}")
    if raw["published"] <= 0 or raw["predicted"] <= 0:
        raise DraftsimError(f"{where}: published and predicted must be > 0; got {raw['published']}, {raw['predicted']}")
    return EvidencePoint(**{k: float(v) if _FIELDS[k] == "number" else v for k, v in raw.items()})


def read_evidence(path: Path | str = EVIDENCE_FILE) -> tuple[EvidencePoint, ...]:
    """Every point of an evidence file, checked (schema, version, each field's type); a bad file
    is refused in one line naming it and the field."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DraftsimError(f"{path}: not a readable JSON file ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") != VERSION:
        raise DraftsimError(f"{path}: not a {SCHEMA} file of version {VERSION}")
    points = doc.get("points")
    if not isinstance(points, list) or not points:
        raise DraftsimError(f"{path}: points: expected a non-empty list")
    return tuple(_point(p, f"{path}: points[{i}]") for i, p in enumerate(points))


def _batch_range(batch: float) -> str:
    """The whole batches within :data:`BATCH_FACTOR` of ``batch``, as the text says them: '16-61 (within 2x of 30.5)'."""
    lo, hi = math.ceil(max(1.0, batch / BATCH_FACTOR) - 1e-9), math.floor(batch * BATCH_FACTOR + 1e-9)
    return f"{lo}-{hi} (within {BATCH_FACTOR:g}x of {batch:.3g})"


def _shares(p: EvidencePoint, field: str, value) -> bool:
    """Whether point ``p`` shares a deployment's ``value`` of ``field`` (a batch: within :data:`BATCH_FACTOR`)."""
    if field != "batch":
        return getattr(p, field) == value
    return p.batch is not None and max(p.batch, value) <= BATCH_FACTOR * min(p.batch, value)


@lru_cache(maxsize=1)
def _catalog_points() -> tuple[EvidencePoint, ...]:
    return read_evidence()


def evidence_for(method: str, moe: bool, engine: str | None = None, hardware: str | None = None, batch: float | None = None,
                 points: tuple[EvidencePoint, ...] | None = None) -> Evidence:
    """The published points most like a deployment (module docstring): ``method`` a drafter or a
    method name (:func:`method_family`), ``moe`` whether the target is a mixture of experts,
    ``engine`` and ``hardware`` catalog names, ``batch`` the mean batch a replica runs (None: not
    matched on)."""
    pool = _catalog_points() if points is None else points
    if not pool:
        raise DraftsimError("no published points to compare with")
    if batch is not None and not (math.isfinite(batch) and batch > 0):
        batch = None  # an idle run's mean batch (NaN) says nothing of the batch
    like = {"method": method_family(method), "moe": bool(moe), "engine": engine or "none", "hardware": hardware,
            "batch": None if batch is None else float(batch)}
    for level in LEVELS:
        if any(like[f] is None for f in level):
            continue
        chosen = [p for p in pool if all(_shares(p, f, like[f]) for f in level)]
        if len(chosen) >= MIN_POINTS or not level:
            return _summary(level, {f: like[f] for f in level}, chosen)
    raise AssertionError("the last level matches every point")  # pragma: no cover


def overall(points: tuple[EvidencePoint, ...] | None = None) -> Evidence:
    """Every point of the suite: the whole record, beside the points most like a deployment."""
    return _summary((), {}, _catalog_points() if points is None else points)


def record(method: str, moe: bool, engine: str | None = None, hardware: str | None = None, batch: float | None = None) -> dict:
    """What an answer carries (``--json`` ``model_error``): :func:`evidence_for`'s points as a dict, with the
    whole suite's (:func:`overall`) under ``overall``."""
    return {**evidence_for(method, moe, engine, hardware, batch).to_dict(), "overall": overall().to_dict()}


def overall_text(error: dict) -> str:
    """A :func:`record`'s whole-suite figures in words: 'over all 78 published runs: median 7.2%, worst 38.2%'."""
    whole = error["overall"]
    return f"over all {whole['points']} published runs: median {whole['median_abs_error']:.1%}, worst {whole['worst_abs_error']:.1%}"


def model_error_lines(error: dict) -> list[str]:
    """The model error as the answer prints it: the points like it, the whole suite, the margin under them."""
    lines = [f"model error: {error['text']}", f"  {overall_text(error)}"]
    if "margin" in error:
        held = "holds" if error["margin_at_median_error"] >= 0 else "does NOT hold"
        lines.append(f"  were this gain over-predicted by {error['median_abs_error']:.1%} its margin would be "
                     f"{error['margin_at_median_error']:+.0%} ({held}), by {error['worst_abs_error']:.1%} "
                     f"{error['margin_at_worst_error']:+.0%}")
    return lines


def _summary(level: tuple[str, ...], like: dict, chosen) -> Evidence:
    errors = np.array([p.error for p in chosen])
    return Evidence(level, like, len(chosen), float(np.median(np.abs(errors))), float(np.max(np.abs(errors))), float(np.mean(errors)),
                    tuple(dict.fromkeys(p.source for p in chosen)))


def adverse_margin(margin: float, error: float) -> float:
    """A load margin (capacity over load, less 1) if speculation's gain were over-predicted by
    ``error`` (its capacity ``1 + error`` times what it is): (1 + margin) / (1 + error) − 1."""
    return (1.0 + margin) / (1.0 + abs(error)) - 1.0
