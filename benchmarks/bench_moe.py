"""MoE decode from AIConfigurator's measured tables against published decode times (benchmarks/published/moe/decode.json).

For every published point: the step priced from the tables (:func:`draftsim.sim.cost.moe_tables.decode_step`,
the engine's per-step host time from sim/data/engines.json on top; an SGLang point from SGLang's own tables,
its latent attention part by part and its shared expert fused, as the module docstring says), the catalog
roofline's plain step as ``draftsim cost`` prices it (the same engine; its routed experts at the grouped-GEMM
efficiency the GPU's MoE table measures, sim/cost/moe_tables.py), ``--cost-model operators``' step
(sim/cost/operators.py), and the error of each. Points the tables cannot price say which part is missing.
``--parts`` adds each scored point's parts (ms) and the table that priced each, from the tables and from the
operator model. Run:
``python benchmarks/bench_moe.py [--parts]`` (needs the ``operators`` extra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from draftsim.sim.cost import default_catalog
from draftsim.sim.cost.assembly import Deployment, assemble
from draftsim.sim.cost.moe_tables import decode_step
from draftsim.sim.cost.overheads import engine_overheads
from draftsim.sim.errors import DraftsimError

DATA = Path(__file__).resolve().parent / "published" / "moe" / "decode.json"


def step_of(point: dict):
    """The point's :class:`~draftsim.sim.cost.moe_tables.DecodeStep` (its engine's tables, host time and KV default)."""
    eng = engine_overheads(point["engine"])
    return decode_step(default_catalog().model(point["model"]), point["hardware"], point["engine"], point["dtype"], point["tp"],
                       point["batch"], point["context"], host=eng.per_step, overlap=bool(eng.plain_overlap))


def predict(point: dict) -> tuple[float | None, str]:
    try:
        return step_of(point).seconds * 1e3, ""
    except DraftsimError as e:
        return None, str(e)


def roofline(point: dict) -> float | None:
    try:
        a = assemble(Deployment(point["model"], point["hardware"], (), tp=point["tp"], dtype=point["dtype"], overheads=point["engine"]))
        return float((a.plain_target or a.target).shape_time(point["batch"], 1, point["context"])) * 1e3
    except DraftsimError:
        return None


def _operators(point: dict, expert_parallel: bool = False):
    return assemble(Deployment(point["model"], point["hardware"], (), tp=point["tp"], dtype=point["dtype"], overheads=point["engine"],
                               cost_model="operators", expert_parallel=expert_parallel))


def operators(point: dict, expert_parallel: bool = False) -> float | None:
    """The step as ``--cost-model operators`` prices it (sim/cost/operators.py), with the point's engine, on a
    server that does not speculate (the points are plain decoding: an overlapped scheduler's host time hidden)."""
    try:
        a = _operators(point, expert_parallel)
        return float((a.plain_target or a.target).shape_time(point["batch"], 1, point["context"])) * 1e3
    except DraftsimError:
        return None


def operator_parts(point: dict) -> None:
    """The operator model's step part by part (its MLA parts where the engine's tables price them so), as a server
    that does not speculate prices it (an overlapped scheduler's host time hidden, as the tables column's)."""
    try:
        a = _operators(point)
    except DraftsimError as e:
        print(f"  operators: {e}")
        return
    m, b, c = a.plain_target or a.target, point["batch"], point["context"]
    print(f"  operators (sim/cost/operators.py), the plain server's target: {float(m.shape_time(b, 1, c)) * 1e3:.2f} ms "
          f"(the column above, the speculating server's target: {float(a.target.shape_time(b, 1, c)) * 1e3:.2f} ms)")
    for part in m.breakdown(b, 1, c):
        print(f"    {part.part:32s} {part.seconds * 1e3:7.3f}  {part.basis:9s} {part.source[:100]}")
        if part.part == "attention":
            for sub in m.mla_parts(b, 1, c):
                print(f"      {sub.part:30s} {sub.seconds * 1e3:7.3f}  {sub.source[:100]}")


def main(argv: list[str] | None = None) -> int:
    parts = "--parts" in (sys.argv[1:] if argv is None else argv)
    points = json.loads(DATA.read_text())["points"]
    rows, scored = [], []
    for p in points:
        tables, why = predict(p)
        roof, ops = roofline(p), operators(p)
        pub = p["published_tpot_ms"]
        err, rerr, oerr = (None if x is None else x / pub - 1 for x in (tables, roof, ops))
        if p.get("scored") and err is not None:
            scored.append((err, rerr, oerr))
        rows.append((p["label"], pub, tables, err, roof, rerr, ops, oerr, "scored" if p.get("scored") else "not scored", why))
    print(f"{'point':52s} {'published':>9s} {'tables':>7s} {'error':>7s} {'roofline':>8s} {'error':>7s} {'operators':>9s} {'error':>7s}")
    for label, pub, t, e, r, re, o, oe, s, why in rows:
        f = lambda x, fmt: "—" if x is None else format(x, fmt)  # noqa: E731
        print(f"{label[:52]:52s} {pub:9.2f} {f(t, '7.2f')} {f(e, '+7.1%')} {f(r, '8.2f')} {f(re, '+7.1%')} {f(o, '9.2f')} {f(oe, '+7.1%')}  {s}"
              + (f"  ({why[:80]})" if why else ""))
    if scored:
        print(f"{len(scored)} scored points, median |error| / worst: " + "; ".join(
            f"{name} {np.median(v):.1%} / {v.max():.1%}" for name, v in
            (("tables", np.abs([x[0] for x in scored])), ("roofline", np.abs([x[1] for x in scored if x[1] is not None])),
             ("operators", np.abs([x[2] for x in scored if x[2] is not None]))) if len(v)))
    if parts:
        for p in (p for p in points if p.get("scored")):
            step = step_of(p)
            print(f"\n{p['label']}: {sum(step.parts.values()) * 1e3:.2f} ms" + (f" (missing: {'; '.join(step.missing)})" if step.missing else ""))
            for name, t in step.parts.items():
                src = step.sources.get(name, "")
                src = src.split("/systems/")[-1] if "/systems/" in src else src
                print(f"  {name:34s} {t * 1e3:7.3f}  {src[:110]}")
            operator_parts(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
