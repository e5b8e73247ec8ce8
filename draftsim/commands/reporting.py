"""``--report DIR`` of ``serve-sim`` and ``capacity``: what each command's report says
(:mod:`draftsim.analysis.report` lays it out and writes it).

Every report carries the setup, the assumptions with their sources — which costs are measured
(a profile), which are catalog defaults priced by the roofline, which engine overheads and
which acceptance process, and where each came from — the headline table in the layout of
``vllm bench serve`` and the figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from draftsim.analysis.report import Figure, Report, Table, copy_figure, headline
from draftsim.sim.cost import default_catalog
from draftsim.sim.cost.assembly import Assembly
from draftsim.sim.cost.provenance import Pricing, pricing
from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving.steady import describe as steady_text

#: What every serving simulation assumes, whatever its options (see sim/serving's docstrings).
SERVING_MODEL = (
    ("step time", "the sum of the step's forward calls: drafter calls, then the target's verification of Σ(k+1) tokens and the "
     "prefill chunks, each priced by its cost model", "draftsim.sim.serving.replica"),
    ("scheduling", "continuous batching, vLLM-style: decodes first, then chunked prefills within the token budget; a paged KV "
     "cache, preemption by recompute", "draftsim.sim.serving.scheduler"),
    ("drafting", "rounds drawn from the acceptance process; drafting and verification run one after the other",
     "draftsim.sim.serving.rounds"),
)


def _command_line() -> str:
    return "draftsim " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("draftsim") else ""


def _source(lookup, name: str) -> str:
    try:
        return lookup(name).source or "(no source given)"
    except DraftsimError:
        return "(not in the catalog)"


#: What the report says of each way a model is priced (:data:`draftsim.sim.cost.provenance.KINDS`).
PRICED = {
    "profile": "measured (profile)",
    "operators": "measured operator tables (the roofline where they end)",
    "roofline": "catalog architecture, roofline (not calibrated)",
    "linear": "constant time per call and per token (given)",
    "free": "no cost",
    "other": "a cost model of the caller's own",
}


def _priced(p: Pricing) -> str:
    if p.kind == "fit":
        return f"catalog architecture, roofline on hardware calibrated to {p.fitted_to}"
    return PRICED[p.kind]


def assumptions(config, serving, assembly: Assembly | None = None) -> list[tuple[str, str, str]]:
    """(what, value, source or status) of a serve-sim configuration: hardware, models and how
    each is priced (:func:`draftsim.sim.cost.provenance.pricing`, typed), engine overheads,
    acceptance, memory and the simulator's own model. ``assembly``: the one ``serving`` was
    built from (:func:`draftsim.commands.servesim.serving_setup`); None assembles ``config`` again."""
    cat = default_catalog(list(config.catalog))
    built = config.assembly() if assembly is None else assembly
    hw = built.hardware
    out = [("hardware", f"{hw.name} ({config.dtype}, tp {config.tp}, pp {config.pp})", _source(cat.hardware_spec, hw.name))]
    for p in pricing(built, config.deployment()):
        if p.role == "target without speculation":  # the engine prices a server that does not speculate apart
            out.append((p.role, f"{p.name}: {p.describe()}", "sim/data/engines.json (the baseline's server)"))
            continue
        src = _source(cat.model, p.catalog or p.name)
        status = _priced(p)
        out.append((p.role, f"{p.name}: {p.describe()}", status if src == "(not in the catalog)" else f"{status}; {src}"))
    engine = built.engine
    named = engine is not None and engine.name != "none"
    out.append(("engine", engine.describe() if engine is not None else "none", "sim/data/engines.json" if named else "none added"))
    out.append(("engine scheduler defaults", built.scheduler_defaults().describe(),
                "sim/data/engines.json (the engine's own defaults on this device)"))
    out.append(("acceptance", repr(serving.process), _acceptance_source(config)))
    kv, plan = serving.kv_cache()
    if plan is not None:
        out.append(("KV memory", plan.describe(), "hardware memory minus weights and activations (draftsim.sim.serving.kvcache)"))
    elif kv is not None:
        out.append(("KV memory", f"{kv.tokens:,} tokens per replica", "given (--kv-tokens)"))
    out += [(what, value, f"model: {where}") for what, value, where in SERVING_MODEL]
    return out


def _acceptance_source(config) -> str:
    if getattr(config, "acceptance", None):
        from draftsim.sim.acceptance_catalog import acceptance_entry

        from .simulation import acceptance_warnings

        said = "; ".join(acceptance_warnings(config, getattr(config, "target", None)))  # --borrow, a bracket's end
        return f"published: {config.acceptance} — {acceptance_entry(config.acceptance).source}" + (f" (WARNING: {said})" if said else "")
    if getattr(config, "acceptance_file", None):
        return f"measured: {config.acceptance_file}"
    if getattr(config, "acceptance_trace", None):
        return f"recorded trace: {config.acceptance_trace}"
    return "given on the command line (not measured)"


def _setup(config, serving) -> list[tuple[str, str]]:
    sched = serving.scheduler
    workload = (f"{config.arrivals} arrivals" + (f" at {config.qps:g} req/s" if config.qps else "")
                + (f", {config.requests:,} requests" if config.requests else "") + (f", {config.duration:g} s" if config.duration else "")
                + f"; prompt {config.prompt_len}, output {config.output_len}")
    if config.request_trace:
        workload += f"; request trace {config.request_trace}"
    rows = [("policy", repr(serving.policy)), ("controller", repr(serving.controller)), ("workload", workload),
            ("scheduler", f"{sched.policy}, max_num_seqs {sched.max_num_seqs}, max_num_batched_tokens {sched.max_num_batched_tokens:,}, "
                          f"chunked prefill {'on' if sched.chunked_prefill else 'off'}, block {sched.block_size}"),
            ("replicas", f"{serving.replicas} ({serving.router})"),
            ("SLOs", _slo_text(serving.slo) or "none given"),
            ("replications", f"{config.replications} (seed {config.seed}); means with 95% half-widths in --json")]
    cmd = _command_line()
    if cmd:
        rows.insert(0, ("command", cmd))
    return rows


def _slo_text(slo) -> str:
    parts = [f"{name} ≤ {v * 1e3:g} ms" for name, v in (("TTFT", slo.ttft), ("TPOT", slo.tpot)) if np.isfinite(v)]
    return ", ".join(parts)


def _has_slo(serving) -> bool:
    return bool(np.isfinite(serving.slo.ttft) or np.isfinite(serving.slo.tpot))


def serving_report(config, assembly: Assembly, serving, result, baseline, folder: Path) -> dict:
    """The report of one serve-sim load: ``config`` as given, the ``assembly`` its models were
    priced with, the ``serving`` configuration built from both, ``result`` the replications
    (``baseline``: the same workloads without speculation, or None when nothing is drafted); the
    paths written."""
    from draftsim.analysis.loadstudy import autoregressive, latency_cdfs, load_over_time
    from draftsim.analysis.report import step_table
    from draftsim.analysis.stepbreakdown import step_breakdown

    label = f"{config.policy}"
    runs = {label: result.runs[0]}
    summaries = {label: result.summary}
    if baseline is not None:
        runs["no speculation"] = baseline.runs[0]
        summaries["no speculation"] = baseline.summary
    target = getattr(serving.target, "name", "target")
    figures = [Figure("Latency CDFs of the first replication" + (", speculation beside none" if baseline is not None else "")
                      + (f"; dashed: the SLOs ({_slo_text(serving.slo)})" if _has_slo(serving) else ""),
                      latency_cdfs(folder / "latency-cdf.png", runs, slo=serving.slo, title=f"Latency: {label} on {target}")),
               Figure("Batch size, waiting requests and KV use over time (first replication, replica 0)",
                      load_over_time(folder / "load-over-time.png", result.runs[0]))]
    tables = [headline(summaries, slo=_has_slo(serving))]
    tables[0].note = (f"Means over {config.replications} replication(s); latencies in ms, durations in s. "
                      "Median = p50. The layout follows vllm bench serve. Warm-up and drain are cut from every figure: "
                      + "; ".join(f"{name}: {steady_text(s)}" for name, s in summaries.items()) + ".")
    unsteady = [f"{name}: {steady_text(s)}" for name, s in summaries.items() if not s.get("steady", True)]
    if baseline is not None:
        s, b = result.summary, baseline.summary
        ratio = lambda x, y: f"{x / y:.3f}" if y else "n/a"  # noqa: E731
        tables.append(Table("Speculation against none", ["measure", "value"], [
            ["E2E latency speedup (mean)", ratio(b["e2e"]["mean"], s["e2e"]["mean"])],
            ["TPOT speedup (mean)", ratio(b["tpot"]["mean"], s["tpot"]["mean"])],
            ["TTFT p99 ratio (none / speculation)", ratio(b["ttft"]["p99"], s["ttft"]["p99"])],
            ["output throughput ratio (speculation / none)", ratio(s["throughput"], b["throughput"])],
        ], note="Above 1: speculation is faster (or serves more)."))
    steps = {label: step_breakdown(result.runs[0], serving, "the first replication")}
    if baseline is not None:
        steps["no speculation"] = step_breakdown(baseline.runs[0], autoregressive(serving), "the first replication")
    tables.append(step_table(steps))
    sd = result.summary.get("spec_decode") or {}
    if sd.get("num_drafts"):
        per_pos = np.array(sd["num_accepted_tokens_per_pos"]) / sd["num_drafts"]
        tables.append(Table("Spec-decode counters (vLLM's names)", ["counter", "value"], [
            ["num_drafts", f"{sd['num_drafts']:,.0f}"], ["num_draft_tokens", f"{sd['num_draft_tokens']:,.0f}"],
            ["num_accepted_tokens", f"{sd['num_accepted_tokens']:,.0f}"],
            ["mean_acceptance_length", f"{sd['mean_acceptance_length']:.3f}"],
            ["acceptance by position", " ".join(f"{x:.3f}" for x in per_pos[:8])]]))
    speedup = None
    if baseline is not None and result.summary["e2e"]["mean"] > 0:
        speedup = baseline.summary["e2e"]["mean"] / result.summary["e2e"]["mean"]
    subtitle = f"{label} on {target}"
    if speedup:
        b_e2e, s_e2e = baseline.summary["e2e"]["mean"], result.summary["e2e"]["mean"]
        ci = (result.summary.get("ci95") or {}).get("e2e", {}).get("mean")
        pm = f" ± {ci:.2f}" if isinstance(ci, float) and np.isfinite(ci) else ""
        verdict = (f"speculation cuts mean E2E latency {speedup:.2f}x" if speedup >= 1
                   else f"speculation makes mean E2E latency {1 / speedup:.2f}x longer")
        subtitle += f": {verdict} ({b_e2e:.2f} s without, {s_e2e:.2f}{pm} s with)"
    report = Report("draftsim serving report", subtitle, _setup(config, serving), assumptions(config, serving, assembly), tables, figures,
                    notes=unsteady + ["A simulation: every number comes from the cost models and the acceptance process named under "
                                      "Assumptions; calibrate them from your own runs (draftsim calibrate) before acting on small margins."])
    return report.write(folder)


def sweep_report(config, assembly: Assembly, serving, rows: list[dict], cross, folder: Path) -> dict:
    """The report of a serve-sim load sweep (speculation and none at each rate)."""
    from draftsim.analysis.loadstudy import speedup_vs_load

    target = getattr(serving.target, "name", "target")
    fig = speedup_vs_load(folder / "speedup-vs-load.png", rows, f"{config.policy} on {target}", cross)
    table = Table("Speculation against none at each load", ["qps", "E2E none (ms)", "E2E spec (ms)", "speedup", "TPOT speedup",
                                                             "throughput ratio", "mean batch"],
                  [[f"{r['qps']:g}", f"{r['ar']['e2e']['mean'] * 1e3:.2f}", f"{r['spec']['e2e']['mean'] * 1e3:.2f}", f"{r['speedup']:.3f}",
                    f"{r['tpot_speedup']:.3f}", f"{r['throughput_ratio']:.3f}",
                    f"{r['spec']['mean_batch']:.1f}" + ("" if r.get("steady", True) else " (not steady)")] for r in rows])
    if cross is None:
        verdict = f"speculation pays at every load tested (up to {max(r['qps'] for r in rows):g} req/s)"
    elif not np.isfinite(cross):
        verdict = f"speculation does not pay even at the lowest load tested ({min(r['qps'] for r in rows):g} req/s)"
    else:
        verdict = f"crossover: speculation stops paying at about {cross:.3g} req/s"
    unsteady = [r for r in rows if not r.get("steady", True)]
    table.note = verdict + (f". Not at steady state at {', '.join(format(r['qps'], 'g') for r in unsteady)} req/s: "
                            f"{unsteady[0]['steady_reason']}" if unsteady else "")
    lo, hi = rows[0], rows[-1]
    summaries = {f"spec @ {lo['qps']:g}": lo["spec"], f"none @ {lo['qps']:g}": lo["ar"]}
    if hi is not lo:
        summaries.update({f"spec @ {hi['qps']:g}": hi["spec"], f"none @ {hi['qps']:g}": hi["ar"]})
    head = headline(summaries, slo=_has_slo(serving))
    head.caption = "Serving benchmark result at the lowest and highest load"
    report = Report("draftsim load sweep report", f"{config.policy} on {target}: {verdict}", _setup(config, serving),
                    assumptions(config, serving, assembly), [table, head], [Figure("Speedup over no speculation against load", fig)])
    return report.write(folder)


def spec_assumptions(spec, configure, limit: int = 64) -> list[tuple[str, str, str]]:
    """The assumptions of a serve-kind spec's configurations (each distinct one once; the first
    ``limit`` points): hardware, models and their pricing, engine overheads, acceptance.
    ``configure(options)`` gives a point's (ServeSimConfig, ServingConfig) or, built once,
    (ServeSimConfig, ServingConfig, Assembly) (:func:`draftsim.commands.servesim.serving_setup`) —
    the caller's, so this module imports no command (no import circle)."""
    if spec.kind != "serve":
        return []
    seen: dict = {}
    for i, point in enumerate(spec.points()):
        if i >= limit:
            break
        try:
            rows = assumptions(*configure(point.config))
        except DraftsimError:
            continue  # a configuration that does not run is reported as failed in the table
        for row in rows:
            seen.setdefault(row, None)
    return list(seen)


def capacity_report(config, result, folder: Path, configure) -> dict:
    """The report of a capacity search: the table, the fewest-devices answer and the figure."""
    from draftsim.analysis import capacity as cap

    spec, settings = result.spec, result.settings
    headers, rows = cap.table_rows(result.table, spec.axes, settings)
    slo = cap.slo_text(settings.slo, spec.kind, "≤")  # each latency bound with its unit
    tables = [Table("Capacity of each configuration", headers, rows,
                    note=f"SLOs: {slo}; mean over {spec.replications} replication(s); tolerance {settings.tolerance:.0%}.")]
    subtitle = f"{spec.kind} capacity at {slo}"
    if settings.load is not None:
        best = cap.fewest_devices(result.table, spec.axes, result.labels)
        if best is not None:
            subtitle += f"; fewest devices for {settings.load:g} req/s: {best}"
    cheapest = cap.cheapest(result.table, spec.axes, result.labels)
    if cheapest is not None:
        subtitle += f"; cheapest per output token: {cheapest}"
    rec = getattr(result, "recommendation", None)
    if rec is not None:  # the front door: the answer leads, the deployment follows the table
        subtitle = f"Answer: {rec.sentence} (on {result.engine}; SLOs {slo} at {settings.load:g} req/s, steady state)"
        tables.append(Table("Deploy the answer", ["engine", "replicas", "command"],
                            [[result.deployment["engine"], result.deployment["replicas"], result.deployment["command"]]],
                            note=f"the scheduler as simulated: {result.scheduler}; replicas behind a round-robin router"))
    elif getattr(result, "no_answer", None):  # a serve spec that cannot give one says why, as the text does
        on = (f"{result.engine} ({result.scheduler})" if result.engine else
              "; ".join(f"{e['engine']} ({e['scheduler']}) for {', '.join(e['deployments'])}" for e in result.engines))
        subtitle = f"No answer: {result.no_answer} (on {on}; SLOs {slo}). " + subtitle[0].upper() + subtitle[1:]
    error = getattr(result, "model_error", None)
    if error is not None and spec.kind == "serve":  # how far speedups like the one named were from published ones
        from draftsim.sim.evidence import model_error_lines

        text = "; ".join(line.strip() for line in model_error_lines(error))
        named = getattr(result, "named", None)
        subtitle += ". " + (f"{named}: " if rec is None and named else "") + text[0].upper() + text[1:]
    figures = [Figure("Capacity of each configuration", copy_figure(result.figure, folder, "capacity.png"))] if result.figure else []
    setup = [("spec", str(config.spec) if config.spec is not None else f"the front door's flags ({Path(config.out) / 'spec.toml'})"),
             ("axes", ", ".join(spec.axes) or "none"), ("configurations", f"{spec.n_points:,}"),
             ("base options", " ".join(f"{k}={v}" for k, v in sorted(spec.base.items())) if isinstance(spec.base, dict) else str(spec.base)),
             ("results", str(Path(config.out) / "results"))]
    cmd = _command_line()
    if cmd:
        setup.insert(0, ("command", cmd))
    notes = ["Each configuration's capacity is the largest arrival rate at which its simulated SLO percentiles hold (bisection "
             "over the rate; see draftsim.analysis.capacity). The costs and acceptance are those of the spec's options: "
             "catalog defaults unless the spec names profiles, calibrated catalogs or measured acceptance.",
             "Every figure is a steady-state one: warm-up (MSER-5) and drain are cut; a rate whose runs had not settled is rerun "
             "longer, an overloaded one fails. The bracket is where the bisection stopped; the 95% interval comes from the "
             "replications; a margin marked (noise) reaches 0 within it and is not counted as a win.",
             *cap.lengthening_notes(result.table, spec.axes, result.labels)]
    report = Report("draftsim capacity report", subtitle, setup, spec_assumptions(spec, configure), tables, figures, notes)
    return report.write(folder)


#: Most rows a sweep report's table shows (the Parquet results hold them all).
SWEEP_ROWS = 200


def sweep_table_report(config, result, table, folder: Path, configure) -> dict:
    """The report of a sweep: what ran, and each point's metrics (mean over its successful
    replications), the first :data:`SWEEP_ROWS` points."""
    spec, summary = result.spec, result.summary
    axes, metrics = list(spec.axes), list(spec.metrics)
    groups: dict = {}
    for r in table.to_pylist():
        if r.get("status") != "ok":
            continue
        key = tuple(r.get(a) for a in axes)
        groups.setdefault(key, []).append(r)
    rows = []
    for key, runs in list(groups.items())[:SWEEP_ROWS]:
        means = []
        for m in metrics:
            vals = [float(x[m]) for x in runs if x.get(m) is not None and np.isfinite(float(x[m]))]
            means.append(f"{np.mean(vals):.4g}" if vals else "n/a")
        rows.append([str(v) for v in key] + means + [str(len(runs))])
    note = f"Mean over each point's successful replications; {len(groups):,} point(s) with results"
    note += f", the first {SWEEP_ROWS} shown" if len(groups) > SWEEP_ROWS else ""
    note += f". All runs: {summary.folder / 'results'} (Parquet)."
    tables = [Table(f"{spec.kind} sweep results", axes + metrics + ["replications"], rows, note=note)]
    setup = [("spec", str(config.spec)), ("kind", spec.kind), ("axes", ", ".join(axes) or "none"),
             ("points x replications", f"{spec.n_points:,} x {spec.replications}"),
             ("base options", " ".join(f"{k}={v}" for k, v in sorted(spec.base.items()))),
             ("ran", f"{summary.ran:,} runs ({summary.already_done:,} already done, {summary.failed:,} failed) in {summary.seconds:.1f} s "
                     f"on {summary.backend} with {summary.workers} worker(s)")]
    if spec.description:
        setup.insert(0, ("description", spec.description))
    cmd = _command_line()
    if cmd:
        setup.insert(0, ("command", cmd))
    notes = [f"failed: {e}" for e in result.errors]
    report = Report(f"draftsim {spec.kind} sweep report", spec.description or f"{spec.n_points:,} points over {', '.join(axes) or 'no axis'}",
                    setup, spec_assumptions(spec, configure), tables, [], notes)
    return report.write(folder)
