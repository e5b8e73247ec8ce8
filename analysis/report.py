"""A report a team can read: one self-contained HTML page and a Markdown summary.

A :class:`Report` holds the setup, the assumptions with their sources (which costs are measured
or calibrated and which are catalog defaults), tables and figures; :meth:`Report.write` puts into
a folder

* ``report.html`` — one page, nothing to fetch: inline style, the figures embedded as PNG data;
  a short inline script only marks on ``<body>`` how many figures the browser drew
  (``data-figures-drawn``, read by the tests through a headless browser);
* ``report.md`` — the same text as Markdown, the figures beside it as PNG files.

:func:`headline` lays serving summaries out as ``vllm bench serve`` prints its result (duration,
request and token throughput, mean / median / P99 of TTFT, TPOT, ITL and E2E latency), one
column per configuration.
"""

from __future__ import annotations

import base64
import html
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..sim.errors import DraftsimError
from ..sim.files import atomic_write_text

__all__ = ["Table", "Figure", "Report", "prepare_folder", "headline", "copy_figure", "step_table"]


@dataclass
class Table:
    """A table: its caption, column headers and rows of text; ``note`` is printed under it.
    ``bars``: (label, [(part, share)]) rows the HTML page also draws as stacked bars (shares of
    one whole, summing to 1), e.g. a step's time by part."""

    caption: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""
    bars: list[tuple[str, list[tuple[str, float]]]] | None = None


@dataclass
class Figure:
    """A PNG figure already written into the report's folder, with its caption."""

    caption: str
    path: Path


@dataclass
class Report:
    """What a report says (see the module docstring). ``setup``: (item, value) pairs;
    ``assumptions``: (what, value, source or status) triples."""

    title: str
    subtitle: str = ""
    setup: list[tuple[str, str]] = field(default_factory=list)
    assumptions: list[tuple[str, str, str]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def html(self) -> str:
        """The page: self-contained (figures as data URIs, no external resource)."""
        e = html.escape
        parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(self.title)}</title>",
                 f"<style>{_CSS}</style></head>\n<body data-figures=\"{len(self.figures)}\">",
                 f"<h1>{e(self.title)}</h1>"]
        if self.subtitle:
            parts.append(f"<p class=\"sub\">{e(self.subtitle)}</p>")
        for table in self.tables:
            parts.append(_html_table(table))
        if self.figures:
            parts.append("<h2>Figures</h2>")
            for fig in self.figures:
                data = base64.b64encode(Path(fig.path).read_bytes()).decode("ascii")
                parts.append(f"<figure><img alt=\"{e(fig.caption)}\" src=\"data:image/png;base64,{data}\">"
                             f"<figcaption>{e(fig.caption)}</figcaption></figure>")
        if self.setup:
            parts.append(_html_table(Table("Setup", ["item", "value"], [[k, v] for k, v in self.setup])))
        if self.assumptions:
            parts.append(_html_table(Table("Assumptions and their sources", ["what", "value", "source or status"],
                                           [list(a) for a in self.assumptions])))
        if self.notes:
            parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in self.notes) + "</ul>")
        parts.append(f"<script>{_SCRIPT}</script>")
        parts.append("</body></html>\n")
        return "\n".join(parts)

    def markdown(self) -> str:
        """The summary as Markdown (figures linked as files beside it)."""
        out = [f"# {self.title}", ""]
        if self.subtitle:
            out += [self.subtitle, ""]
        for table in self.tables:
            out += _md_table(table)
        if self.figures:
            out += ["## Figures", ""]
            for fig in self.figures:
                out += [f"![{fig.caption}]({Path(fig.path).name})", "", f"*{fig.caption}*", ""]
        if self.setup:
            out += _md_table(Table("Setup", ["item", "value"], [[k, v] for k, v in self.setup]))
        if self.assumptions:
            out += _md_table(Table("Assumptions and their sources", ["what", "value", "source or status"], [list(a) for a in self.assumptions]))
        if self.notes:
            out += ["## Notes", ""] + [f"- {n}" for n in self.notes] + [""]
        return "\n".join(out)

    def write(self, folder) -> dict:
        """Write ``report.html`` and ``report.md`` into ``folder`` (atomically each); their paths."""
        folder = Path(folder)
        paths = {"html": folder / "report.html", "markdown": folder / "report.md"}
        atomic_write_text(paths["html"], self.html())
        atomic_write_text(paths["markdown"], self.markdown())
        return {k: str(v) for k, v in paths.items()}


def prepare_folder(path: str, flag: str = "--report") -> Path:
    """The report folder, made now (before any long work) so a bad path fails first: a path
    that is a file, or a folder that cannot be written, is refused."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise DraftsimError(f"{flag} {path}: exists and is not a folder; give a folder path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".draftsim-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise DraftsimError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None
    return folder


def copy_figure(src, folder: Path, name: str) -> Path:
    """A figure written elsewhere, copied into the report's folder."""
    dst = folder / name
    if Path(src).resolve() != dst.resolve():
        shutil.copyfile(src, dst)
    return dst


def _fmt(x, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a"
    return f"{x:,.{digits}f}"


def headline(summaries: dict, slo: bool = False) -> Table:
    """The ``vllm bench serve`` result layout, one column per labelled summary (the dicts of
    :func:`draftsim.sim.serving.metrics.summarize_run` or their means over replications)."""
    labels = list(summaries)
    rows: list[list[str]] = []

    def row(name, fn, digits=2):
        rows.append([name] + [_fmt(fn(summaries[k]), digits) for k in labels])

    row("Benchmark duration (s)", lambda s: s["requests"] / s["request_throughput"] if s["request_throughput"] else None)
    row("Completed requests", lambda s: float(s["requests"]), 0)
    row("Total generated tokens", lambda s: float(s["output_tokens"]), 0)
    row("Request throughput (req/s)", lambda s: s["request_throughput"])
    if slo:
        row("Request goodput (req/s)", lambda s: s["goodput"])
        row("Requests within the SLOs (%)", lambda s: 100 * s["slo_attainment"], 1)
    row("Output token throughput (tok/s)", lambda s: s["throughput"])
    for key, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2EL")):
        for stat, word in (("mean", "Mean"), ("p50", "Median"), ("p99", "P99")):
            row(f"{word} {name} (ms)", lambda s, key=key, stat=stat: s[key][stat] * 1e3)
    row("Mean batch size", lambda s: s["mean_batch"], 1)
    row("Preemptions", lambda s: float(s["preemptions"]), 0)

    def acceptance_length(s):
        sd = s.get("spec_decode") or {}
        return sd.get("mean_acceptance_length") if sd.get("num_drafts") else None

    row("Mean acceptance length", acceptance_length, 3)
    return Table("Serving benchmark result", ["metric"] + labels, rows)


def step_table(breakdowns: dict) -> Table:
    """The mean step of each labelled run, part by part (:class:`draftsim.analysis.stepbreakdown.StepBreakdown`;
    None: a run without steps): milliseconds per step and share, one column per run; the HTML page
    draws the shares as stacked bars, the Markdown says each run's split in one line (the note)."""
    from .stepbreakdown import PART_LABELS

    labels = [k for k, b in breakdowns.items() if b is not None]
    shown = {k: breakdowns[k] for k in labels}
    rows = [["mean step (ms)"] + [_fmt(b.step_ms, 3) for b in shown.values()]]
    for name, text in PART_LABELS.items():
        cells = [b.part(name) for b in shown.values()]
        if all(p.ms is None for p in cells):
            continue
        rows.append([text] + ["not separated" if p.ms is None else f"{p.ms:,.3f} ({p.share:.1%})" for p in cells])
    rows.append(["steps averaged"] + [f"{b.steps:,}" for b in shown.values()])
    bars = [(k, [(PART_LABELS[p.name], p.share) for p in b.parts if p.ms is not None]) for k, b in shown.items()]
    first = next(iter(shown.values()), None)
    note = "; ".join(f"{k}: {b.line()}" for k, b in shown.items())
    if first is not None:
        note += f". Averaged over {first.window}. The target's call: {first.split}. The parts add up to the simulated step."
    return Table("Where a step's time goes", ["part (ms per step, share)"] + labels, rows, note=note, bars=bars)


#: Colours of the stacked bars' parts, in order.
_BAR_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1")


def _html_bars(bars: list) -> str:
    e = html.escape
    out = ["<div class=\"bars\">"]
    legend = []
    for label, parts in bars:
        segs = []
        for i, (part, share) in enumerate(parts):
            colour = _BAR_COLOURS[i % len(_BAR_COLOURS)]
            if (part, colour) not in legend:
                legend.append((part, colour))
            width = max(0.0, float(share)) * 100 if np.isfinite(share) else 0.0
            segs.append(f"<span class=\"seg\" style=\"width:{width:.3f}%;background:{colour}\" title=\"{e(part)}: {share:.1%}\"></span>")
        out.append(f"<div class=\"bar-row\"><span class=\"bar-label\">{e(label)}</span><span class=\"bar\">{''.join(segs)}</span></div>")
    out.append("<div class=\"legend\">" + "".join(f"<span><i style=\"background:{c}\"></i>{e(p)}</span>" for p, c in legend) + "</div>")
    out.append("</div>")
    return "".join(out)


def _html_table(t: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in t.rows)
    note = f"<p class=\"note\">{e(t.note)}</p>" if t.note else ""
    bars = _html_bars(t.bars) if t.bars else ""
    return f"<h2>{e(t.caption)}</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{bars}{note}"


def _md_cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _md_table(t: Table) -> list[str]:
    out = [f"## {t.caption}", "", "| " + " | ".join(_md_cell(h) for h in t.headers) + " |",
           "|" + "|".join("---" for _ in t.headers) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in t.rows]
    out.append("")
    if t.note:
        out += [t.note, ""]
    return out


_CSS = ("body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}"
        ".sub{color:#555;margin-top:0}table{border-collapse:collapse;margin:.5em 0;font-size:.92em}"
        "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}th{background:#f3f3f3}"
        "td:not(:first-child){font-variant-numeric:tabular-nums}figure{margin:1em 0}img{max-width:100%;border:1px solid #eee}"
        "figcaption{color:#555;font-size:.9em}.note{color:#555;font-size:.9em}"
        ".bars{margin:.6em 0}.bar-row{display:flex;align-items:center;margin:.2em 0}.bar-label{width:12em;font-size:.9em}"
        ".bar{display:flex;width:40em;height:1.2em;border:1px solid #ccc}.seg{display:block;height:100%}"
        ".legend{font-size:.85em;color:#444;margin-top:.3em}.legend span{margin-right:1em}"
        ".legend i{display:inline-block;width:.8em;height:.8em;margin-right:.3em;vertical-align:middle}")

#: Marks on <body> how many figures the browser decoded and drew (what a headless test reads).
_SCRIPT = ("window.addEventListener('load',function(){var n=0;document.querySelectorAll('img').forEach(function(i){"
           "if(i.complete&&i.naturalWidth>0)n++;});document.body.setAttribute('data-figures-drawn',String(n));});")
