"""Write sim/data/evidence.json: every scored point of the published suite, with its setup and error.

    python benchmarks/published/evidence.py [--check] [--out PATH]

Runs the suite (``reproduce.py``'s sources and predictions, the roofline and each source's engine:
the defaults a user runs) and writes each point that carries an error — brackets and crossovers
carry none — with where it ran and how it drafted (:class:`draftsim.sim.evidence.EvidencePoint`),
atomically. ``--check`` writes nothing and exits 1 if the file on disk differs from the run.
Rerun it whenever a source, the catalogs or the cost model change (a test refuses a stale file).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from draftsim.sim.cost import default_catalog
from draftsim.sim.evidence import EVIDENCE_FILE, SCHEMA, VERSION, method_family
from draftsim.sim.files import atomic_write_json

HERE = Path(__file__).parent


def reproduce():
    """reproduce.py of this folder, as a module."""
    spec = importlib.util.spec_from_file_location("reproduce", HERE / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("reproduce", module)
    spec.loader.exec_module(module)
    return module


def batch_of(shared: dict) -> int | None:
    """The batch a point held: its closed loop's clients (``closed:clients=N``); None for an open loop
    (its batch was not held)."""
    arrivals = str(shared.get("arrivals", ""))
    if arrivals.startswith("closed:"):
        fields = dict(kv.split("=", 1) for kv in arrivals.split(":", 1)[1].split(","))
        return int(fields["clients"])
    return None


def points(docs: list[dict], rows: list[dict]) -> list[dict]:
    """The evidence records of ``rows`` (``reproduce.predict``'s, over ``docs``): one per row with an error."""
    catalog = default_catalog()
    scored = {(r["source"], r["label"]): r for r in rows if "error" in r}
    out = []
    for doc in docs:
        for point in doc["points"]:
            row = scored.get((doc["id"], point["label"]))
            if row is None:
                continue
            shared = {**doc["common"], **point.get("run", {})}
            drafter = (point["spec"].get("drafter_model") or [None])[0]
            out.append({"source": doc["id"], "label": point["label"], "metric": doc["metric"], "engine": shared.get("engine", "none"),
                        "hardware": shared["hardware"], "target": shared["target"], "moe": catalog.model(shared["target"]).experts > 0,
                        "tp": int(shared.get("tp", 1)), "method": method_family(drafter), "batch": batch_of(shared),
                        "published": float(row["published"]), "predicted": round(float(row["predicted"]), DIGITS),
                        "error": round(float(row["error"]), DIGITS)})
    return out


#: Decimals the file keeps of a prediction and an error; :func:`differences` allows half a unit of the
#: next-to-last (a machine's own last bits do not make the file stale; a change of the model does).
DIGITS = 6


def differences(written: list[dict], fresh: list[dict]) -> list[str]:
    """Where the points written differ from a fresh run's: a point missing or added, a setup
    field that changed, a prediction or error that moved by more than 5e-5."""
    key = lambda p: (p["source"], p["label"])  # noqa: E731
    old, new = {key(p): p for p in written}, {key(p): p for p in fresh}
    out = [f"{s} / {lab}: {'not in the file' if (s, lab) in new else 'no longer in the suite'}" for s, lab in old.keys() ^ new.keys()]
    for k in old.keys() & new.keys():
        for field, was in old[k].items():
            now = new[k].get(field)
            moved = abs(now - was) > 5e-5 if isinstance(was, float) and isinstance(now, float) else now != was
            if moved:
                out.append(f"{k[0]} / {k[1]}: {field} {was} in the file, {now} now")
    return sorted(out)


def document(records: list[dict]) -> dict:
    return {"schema": SCHEMA, "version": VERSION,
            "about": "Every scored point of benchmarks/published/ (reproduce.py, the roofline and each source's engine), its setup "
                     "and error = predicted / published - 1. Written by `python benchmarks/published/evidence.py`; never edit by hand.",
            "points": records}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file differs from this run")
    ap.add_argument("--out", default=str(EVIDENCE_FILE), help=f"where to write (default {EVIDENCE_FILE})")
    args = ap.parse_args()
    mod = reproduce()
    docs = mod.sources()
    rows = [r for doc in docs for r in mod.predict(doc)]
    doc = document(points(docs, rows))
    if args.check:
        diff = differences(json.loads(Path(args.out).read_text())["points"], doc["points"])
        print(f"{args.out}: {'matches' if not diff else 'DIFFERS from'} the suite's {len(doc['points'])} scored points")
        print("\n".join(f"  {d}" for d in diff[:20]))
        return 1 if diff else 0
    atomic_write_json(args.out, doc)
    print(f"{len(doc['points'])} scored points written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
