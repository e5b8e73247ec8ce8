"""Published speculative-serving results, every point predicted from its stated setup with one set
of draftsim defaults, beside the published value.

Each ``*.json`` file in this folder is one source: its citation and locator, what it states
(``stated``), what it leaves open and the assumption made for it (``unstated``), the metric, the
serve-sim options every point shares (``common``), the baseline's and each point's own
(``baseline``, ``points[].run``, ``points[].spec``) and the published value. Nothing is fitted:
a point's prediction is ``serve-sim`` with those options, and the same catalog defaults for
every source.

Metrics: ``throughput_ratio`` (output tokens/s with speculation over without, at the same
concurrency; over the whole run, first arrival to last finish, as the sources' benchmarks measure it:
vLLM's and SGLang's ``bench_serving`` divide the output tokens by the benchmark's duration — serve-sim's
steady-state window is the answer a deployment plans on, not what these tables measured) and ``tpot_speedup`` (TPOT without over with). A source marked ``bracket`` gives two
predictions per point (its data cannot tell two readings apart; see its ``unstated``), and so does
a point whose ``spec.acceptance`` is ``NAME@range``: a catalog entry published as a range (the
DeepSeek-V3 report's 85–90% MTP acceptance), run at ``NAME@low`` and ``NAME@high``, both ends
reported. A bracket is reported with whether the published value lies inside it (as printed: a
bracket that reaches a number rounding to it, 1.1199 for a printed 1.12, holds it) and, where it does
not, how far its nearer end misses it (the summary names the farthest miss); brackets are left out of
the error statistics, which are over every other point: median and worst |predicted / published − 1|.
A source marked ``crossover`` states a speedup at one load and where speculation stops paying
but not the acceptance: the one unknown (a per-token acceptance) is solved so that the first
load's speedup is the published one (that point is not scored), the speedup is predicted over
the source's request rates, and the row says whether speculation becomes slower below the rate
the source puts the crossover under (``crossover_below``); crossovers are counted apart, like
brackets.

A point whose ``spec`` names ``tree_acceptance`` (a catalog entry reporting a token tree's mean
acceptance length, e.g. SGLang's EAGLE-3 trees) runs its tree policy with one per-rank acceptance
at every rank (``--rank-alphas``), solved so that the tree it verifies (the ``nodes`` most likely
of the ``width``/``depth`` tree, :mod:`draftsim.sim.budget_tree`) accepts on average the entry's
published length: the source's own measured acceptance pins the one unknown, as a chain entry's
constant conditional rate is solved from its mean length; the speedup is what is predicted.

    python benchmarks/published/reproduce.py [--json] [--figure PATH] [--only ID] [--cost-model {roofline,operators}]

``--cost-model operators`` prices every point whose hardware has measured operator tables
(:data:`draftsim.sim.cost.operators.SYSTEMS`: h100-sxm, h200, a100-80g, b200, gb200) and whose dtype is theirs
(bfloat16) from them, its drafting heads included; the other points stay on the roofline, and the
output says which did.

Writes the figure (predicted against published, the ±10% band; default
figures/published/reproduction.png).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from draftsim.analysis.loadstudy import crossover
from draftsim.api import ServeSimConfig, serve_sim
from draftsim.sim.acceptance_catalog import acceptance_entry, check_use
from draftsim.sim.budget_tree import budget_tree
from draftsim.sim.cost import default_catalog
from draftsim.sim.cost.operators import COST_MODELS, SYSTEMS, prices_dtype
from draftsim.sim.policies import parse_policy

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def sources(only: str | None = None) -> list[dict]:
    out = []
    for path in sorted(HERE.glob("*.json")):
        doc = json.loads(path.read_text())
        if only is None or doc["id"] == only:
            out.append(doc)
    if not out:
        raise SystemExit(f"no source {only!r} in {HERE}; sources: {', '.join(json.loads(p.read_text())['id'] for p in HERE.glob('*.json'))}")
    return out


def priced_by(options: dict, cost_model: str = "roofline") -> str:
    """The cost model a run uses: ``operators`` only where its hardware has measured tables and
    the operator model prices its target in its dtype (bfloat16; float8 for a mixture of experts:
    :func:`~draftsim.sim.cost.operators.prices_dtype`, the operator model's own rule)."""
    dtype, target = options.get("dtype", "bfloat16"), options.get("target")
    priced = dtype == "bfloat16" if target is None else prices_dtype(default_catalog().model(target), dtype)
    measured = options.get("hardware") in SYSTEMS and priced
    return cost_model if cost_model == "roofline" or measured else "roofline"


class Measured:
    """A run's summary as a source's benchmark measures it: ``throughput`` over the whole run
    (``whole_run``; the summary's own is the steady state's), every other field the summary's."""

    def __init__(self, result):
        self.summary = result.summary
        self.throughput = result.data["whole_run"]["throughput"]

    def __getattr__(self, name):
        return getattr(self.summary, name)


def run(options: dict, cost_model: str = "roofline"):
    return Measured(serve_sim(ServeSimConfig(**options, cost_model=priced_by(options, cost_model))))


def value(metric: str, spec, base) -> float:
    if metric == "throughput_ratio":
        return spec.throughput / base.throughput
    if metric == "tpot_speedup":
        return base.tpot.mean / spec.tpot.mean
    if metric == "e2e_speedup":
        return base.e2e.mean / spec.e2e.mean
    raise SystemExit(f"unknown metric {metric!r}")


def solve_alpha(speedup, target: float, lo: float = 0.02, hi: float = 0.99, steps: int = 30) -> float:
    """The acceptance α in [lo, hi] at which ``speedup(α)`` (increasing in α) equals ``target``
    (bisection; an end of the range when the target lies beyond it)."""
    if speedup(hi) <= target:
        return hi
    if speedup(lo) >= target:
        return lo
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if speedup(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def tree_rank_alpha(policy: str, length: float) -> float:
    """The one per-rank acceptance α (the same at every rank) at which the tree ``policy``
    verifies accepts ``length`` tokens a round on average, bonus included (module docstring)."""
    tree = parse_policy(policy)
    if tree.kind != "tree":
        raise SystemExit(f"tree_acceptance needs a tree policy; got {policy!r}")

    def mean_length(alpha: float) -> float:
        kept = tree.kept_tree(lambda r: alpha) or budget_tree(lambda r: alpha, tree.width, tree.depth, tree.nodes)
        return 1.0 + kept.expected_accepted()

    lo, hi = 1e-4, 1.0 - 1e-9
    if not mean_length(lo) <= length <= mean_length(hi):
        raise SystemExit(f"tree {policy!r} cannot accept {length} tokens a round (range {mean_length(lo):.3f}..{mean_length(hi):.3f})")
    return solve_alpha(mean_length, length, lo, hi, steps=50)


def point_spec(spec: dict, shared: dict) -> tuple[dict, dict]:
    """A point's serve-sim options, a ``tree_acceptance`` entry resolved into per-rank rates,
    and what the row reports about it."""
    if "tree_acceptance" not in spec:
        return spec, {}
    spec = dict(spec)
    entry = acceptance_entry(spec.pop("tree_acceptance"))
    check_use(entry, shared.get("target"), (spec.get("drafter_model") or [None])[0])
    if entry.draft != "tree" or entry.reported != "mean_length" or list(entry.values) != [None]:
        raise SystemExit(f"tree_acceptance {entry.name!r} is not one tree's mean acceptance length")
    length = float(entry.values[None])
    alpha = tree_rank_alpha(spec["policy"], length)
    width = parse_policy(spec["policy"]).width
    spec.update(alpha=alpha, rank_alphas=",".join([f"{alpha:.9f}"] * width))
    return spec, {"tree_acceptance": entry.name, "tree_mean_length": length, "rank_alpha": alpha}


def crossover_row(doc: dict, point: dict, cost_model: str = "roofline") -> dict:
    """A ``crossover`` source's point (module docstring)."""
    shared = {**doc["common"], **point.get("run", {})}
    grid = [float(q) for q in doc["qps"]]
    bases = {q: run({**shared, **doc["baseline"], "qps": q}, cost_model) for q in grid}

    def speedup(q: float, alpha: float) -> float:
        return value(doc["metric"], run({**shared, **point["spec"], "alpha": alpha, "qps": q}, cost_model), bases[q])

    alpha = solve_alpha(lambda a: speedup(grid[0], a), point["published"])
    curve = [speedup(q, alpha) for q in grid]
    below = [q for q, s in zip(grid, curve) if s < 1.0]
    cross = crossover([{"qps": q, "speedup": s} for q, s in zip(grid, curve)])  # the load study's definition
    cross = None if cross is None or np.isnan(cross) else cross
    at = float(point["crossover_below"])
    return {"source": doc["id"], "label": point["label"], "published": point["published"], "cost_model": priced_by(shared, cost_model),
            "alpha": alpha,
            "calibrated": curve[0], "qps": grid, "speedups": curve, "crossover_qps": cross,
            "held": bool(below and min(below) <= at), "crossover_below": at,
            "slowdown_at": at, "predicted_slowdown": 1.0 / float(np.interp(at, grid, curve)), "published_slowdown": point["published_slowdown"]}


#: a point's ``spec.acceptance`` ending so names a catalog entry given as a published range: run at both ends, a bracket
RANGE = "@range"


def rounding(published: float) -> float:
    """Half a unit of the last decimal the published value is printed with (1.12: 0.005; 1.8: 0.05): the
    value stands for any number that rounds to it."""
    text = repr(float(published))
    decimals = len(text.split(".")[1]) if "." in text and "e" not in text else 0
    return 0.5 * 10.0 ** -decimals


def bracket_row(low: float, high: float, published: float) -> dict:
    """A bracket's fields: its ends, whether the published value lies inside (the bracket reaches the
    numbers that round to it, :func:`rounding`), and ``miss``: 0 inside, else the nearer end over the
    published value, less 1 (how far the bracket misses it)."""
    lo, hi = min(low, high), max(low, high)
    h = rounding(published)
    inside = bool(lo <= published + h and published - h <= hi)
    nearer = lo if published < lo else hi
    return {"low": lo, "high": hi, "inside": inside, "miss": 0.0 if inside else nearer / published - 1.0}


def predict(doc: dict, progress=None, cost_model: str = "roofline") -> list[dict]:
    rows = []
    if doc.get("crossover"):
        for point in doc["points"]:
            rows.append(crossover_row(doc, point, cost_model))
            if progress is not None:
                progress(rows[-1])
        return rows
    baselines: dict = {}
    for point in doc["points"]:
        shared = {**doc["common"], **point.get("run", {})}
        key = json.dumps(shared, sort_keys=True)
        if key not in baselines:
            baselines[key] = run({**shared, **doc["baseline"]}, cost_model)
        base = baselines[key]
        row = {"source": doc["id"], "label": point["label"], "published": point["published"], "cost_model": priced_by(shared, cost_model)}
        if doc.get("bracket"):
            a = acceptance_entry(point["bracket_acceptance"]).cumulative(3)
            text = lambda x: ",".join(f"{v:.6f}" for v in x)  # noqa: E731
            low = value(doc["metric"], run({**shared, **point["spec"], "positional": text(a)}, cost_model), base)
            high = value(doc["metric"], run({**shared, **point["spec"], "positional": text(a / a[0]), "match": float(a[0])}, cost_model),
                         base)
            row.update(bracket_row(low, high, point["published"]))
        elif str(point["spec"].get("acceptance", "")).endswith(RANGE):
            name = point["spec"]["acceptance"][: -len(RANGE)]
            low, high = (value(doc["metric"], run({**shared, **point["spec"], "acceptance": f"{name}@{end}"}, cost_model), base)
                         for end in ("low", "high"))
            row.update(bracket_row(low, high, point["published"]), acceptance=name)
        else:
            spec, extra = point_spec(point["spec"], shared)
            row.update(extra)
            row["predicted"] = value(doc["metric"], run({**shared, **spec}, cost_model), base)
            row["error"] = row["predicted"] / point["published"] - 1.0
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def figure(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from draftsim.analysis.figures import save_figure

    curves = [r for r in rows if "speedups" in r]
    pairs = [r for r in rows if "speedups" not in r]
    panels = int(bool(pairs)) + int(bool(curves))
    fig, axes = plt.subplots(1, panels, figsize=(5.6 * panels, 5.2), squeeze=False)
    if curves:
        crossover_panel(axes[0, -1], curves)
    if not pairs:
        path.parent.mkdir(parents=True, exist_ok=True)
        return save_figure(fig, path)
    ax = axes[0, 0]
    ids = sorted({r["source"] for r in pairs})
    for i, sid in enumerate(ids):
        pts = [r for r in pairs if r["source"] == sid]
        if "predicted" in pts[0]:
            ax.scatter([r["published"] for r in pts], [r["predicted"] for r in pts], s=18, label=sid, color=f"C{i}")
        else:
            for r in pts:
                ax.plot([r["published"]] * 2, [r["low"], r["high"]], color=f"C{i}", lw=3, alpha=0.7)
            ax.plot([], [], color=f"C{i}", lw=3, label=f"{sid} (bracket)")
    values = [v for r in rows if "speedups" not in r for v in (r["published"], r.get("predicted"), r.get("low"), r.get("high"))
              if v is not None]
    lo, hi = min(values) * 0.9, max(values) * 1.1
    grid = np.linspace(lo, hi, 2)
    ax.plot(grid, grid, color="black", lw=0.8)
    ax.fill_between(grid, grid * 0.9, grid * 1.1, color="grey", alpha=0.15, label="±10%")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("published speedup")
    ax.set_ylabel("draftsim's prediction")
    ax.set_title("Published speedups against draftsim's predictions", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


def crossover_panel(ax, rows: list[dict]) -> None:
    """Predicted speedup against the request rate for each crossover point: its QPS-1 calibration
    (the published speedup, a dot) and the rate the source puts the crossover under (a dashed line)."""
    for i, r in enumerate(rows):
        color = f"C{i}"
        ax.plot(r["qps"], r["speedups"], marker="o", ms=3, color=color,
                label=f"{r['label']} (α {r['alpha']:.2f}: {'held' if r['held'] else 'not held'})")
        ax.scatter([r["qps"][0]], [r["published"]], s=60, facecolors="none", edgecolors=color)
        ax.axvline(r["crossover_below"], color=color, ls="--", lw=0.8)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("end-to-end speedup of speculation")
    ax.set_title("Crossover: predicted speedup against load\n(circle: published QPS-1 speedup, calibrates α; dashed: slower by here)",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def summary(rows: list[dict]) -> dict:
    errors = np.array([abs(r["error"]) for r in rows if "error" in r])
    brackets = [r for r in rows if "low" in r]
    misses = [r["miss"] for r in brackets if not r["inside"]]
    crossings = [r for r in rows if "held" in r]
    return {"points": int(len(errors)), "median_abs_error": float(np.median(errors)) if len(errors) else None,
            "worst_abs_error": float(errors.max()) if len(errors) else None,
            "brackets": len(brackets), "brackets_holding_the_published_value": sum(r["inside"] for r in brackets),
            "worst_bracket_miss": max(misses, key=abs) if misses else None,
            "crossovers": len(crossings), "crossovers_held": sum(r["held"] for r in crossings)}


def by_source(rows: list[dict]) -> dict[str, dict]:
    """:func:`summary` of each source's rows, keyed by source id in the order the sources ran."""
    ids = list(dict.fromkeys(r["source"] for r in rows))
    return {i: summary([r for r in rows if r["source"] == i]) for i in ids}


def summary_line(s: dict) -> str:
    """One line of a :func:`summary`: the scored points' median and worst |error|, then the brackets
    and crossovers (each only where there are any)."""
    parts = [f"{s['points']} point{'s' if s['points'] != 1 else ''}: median |error| {s['median_abs_error']:.1%}, "
             f"worst {s['worst_abs_error']:.1%}" if s["points"] else "no scored error"]
    if s["brackets"]:
        miss = s["worst_bracket_miss"]
        parts.append(f"{s['brackets_holding_the_published_value']} of {s['brackets']} brackets hold the published value"
                     + ("" if miss is None else f" (the farthest misses it by {miss:+.1%})"))
    if s["crossovers"]:
        parts.append(f"{s['crossovers_held']} of {s['crossovers']} crossovers held")
    return "; ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print every row and the summary as JSON")
    ap.add_argument("--figure", default=str(ROOT / "figures" / "published" / "reproduction.png"))
    ap.add_argument("--only", help="one source id")
    ap.add_argument("--cost-model", choices=COST_MODELS, default="roofline",
                    help=f"how forwards are priced; operators only where the hardware has measured tables ({', '.join(SYSTEMS)}), "
                         "the roofline elsewhere (said per source)")
    args = ap.parse_args()
    rows = []

    def show(r):
        if args.json:
            return
        if "speedups" in r:
            where = f"at {r['crossover_qps']:.1f} req/s" if r["crossover_qps"] else "not within the rates run"
            print(f"  {r['label']:<22} alpha {r['alpha']:.3f} solved for the published {r['published']:.2f}x at QPS {r['qps'][0]:g}; "
                  f"speedup {' '.join(f'{q:g}:{s:.2f}' for q, s in zip(r['qps'], r['speedups']))}; crossover {where} "
                  f"({'held' if r['held'] else 'NOT held'}: published below {r['crossover_below']:g}); slowdown at "
                  f"{r['slowdown_at']:g} req/s {r['predicted_slowdown']:.2f}x (published {r['published_slowdown']:.1f}x, rate unstated)",
                  flush=True)
        elif "predicted" in r:
            tree = (f"  (tree acceptance length {r['tree_mean_length']:g}: rank rate {r['rank_alpha']:.3f})"
                    if "rank_alpha" in r else "")
            print(f"  {r['label']:<22} published {r['published']:5.2f}  predicted {r['predicted']:5.2f}  error {r['error']:+6.1%}{tree}",
                  flush=True)
        else:
            print(f"  {r['label']:<22} published {r['published']:5.2f}  predicted {r['low']:.2f} .. {r['high']:.2f}  "
                  + ("inside the bracket" if r["inside"] else f"OUTSIDE the bracket, its nearer end {r['miss']:+.1%}"), flush=True)

    for doc in sources(args.only):
        if not args.json:
            print(f"{doc['id']}: {doc['source'].get('locator', '')} — {doc['metric']}")
        got = predict(doc, show, args.cost_model)
        rows += got
        if not args.json:
            print(f"  = {summary_line(summary(got))}")
        if not args.json and args.cost_model != "roofline":
            kinds = sorted({r["cost_model"] for r in got})
            why = (f": its hardware has no measured tables (they cover {', '.join(SYSTEMS)})" if doc["common"].get("hardware") not in SYSTEMS
                   else f": the operator model does not price {doc['common'].get('target')} in {doc['common'].get('dtype')}")
            print(f"  (priced by {' and '.join(kinds)}" + ("" if kinds == [args.cost_model] else why) + ")")
    s = summary(rows)
    path = figure(rows, Path(args.figure))
    if args.json:
        print(json.dumps({"rows": rows, "summary": s, "by_source": by_source(rows), "figure": str(path)}))
    else:
        print(f"{summary_line(s)}; figure {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
