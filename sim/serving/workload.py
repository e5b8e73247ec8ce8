"""Requests and workloads: when requests arrive, how long their prompts and outputs are.

A workload is a finite table of requests (:class:`Workload`): arrival time, prompt tokens,
output tokens and a priority class. It comes from

* an **arrival process** (:data:`ARRIVALS`): ``poisson`` (exponential gaps of mean 1/qps),
  ``gamma:cv=C`` (gamma gaps of mean 1/qps and coefficient of variation C: C > 1 is bursty,
  C = 1 is Poisson; Vidur's ``gamma`` request-interval generator), ``closed:clients=N,think=S``
  (N clients that each send a request, wait for its last token and think an exponential time
  of mean S before the next: the arrival times are made by the server, see
  :class:`ClosedLoop`) and ``fixed`` (evenly spaced, deterministic);
* **length distributions** (:data:`LENGTHS`): ``fixed:N``, ``uniform:LO,HI``,
  ``lognormal:median=M,sigma=S[,max=X]``, ``zipf:a=A,max=X[,min=N]`` (P(n) ∝ n^-a on
  [min, max]) and ``empirical:FILE`` (lengths listed in a file, resampled);
* or a **request trace** (:func:`read_request_trace`): CSV or JSONL with an arrival time, the
  prompt tokens and the output tokens of each request. Column names of the public traces are
  understood: Azure LLM inference traces (``TIMESTAMP``, ``ContextTokens``,
  ``GeneratedTokens``; timestamps are dates, made relative to the first), Vidur's trace-replay
  files (``Time``, ``PromptTokenCount``, ``CompletionTokenCount``) and Vidur's length traces
  and request records (``arrived_at``, ``num_prefill_tokens``, ``num_decode_tokens``). A
  trace without a time column gives lengths only (arrivals then come from ``--arrivals``).

Every sampler takes a :class:`numpy.random.Generator`; times are seconds.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from ..errors import DraftsimError, as_count, as_positive, parse_seconds, shown, unknown
from ..files import parse_json, read_text
from ..params import Entry, Param, Parametrised, Registry, ascii_float, ascii_int

__all__ = [
    "Workload",
    "LengthDist",
    "Fixed",
    "Uniform",
    "LogNormal",
    "Zipf",
    "Empirical",
    "Arrivals",
    "Poisson",
    "GammaArrivals",
    "EvenArrivals",
    "ClosedLoop",
    "LENGTHS",
    "ARRIVALS",
    "parse_lengths",
    "parse_arrivals",
    "WorkloadPreset",
    "workload_preset",
    "workload_presets",
    "workload_lengths",
    "read_request_trace",
    "make_workload",
    "MAX_TOKENS",
]

#: Largest prompt or output length accepted (tokens).
MAX_TOKENS = 1 << 22


@dataclass
class Workload:
    """Requests sorted by arrival (arrays of one length; ``arrival`` is NaN for closed-loop
    requests, whose arrival the server decides)."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    priority: np.ndarray

    def __post_init__(self):
        n = len(self.prompt)
        if n == 0:
            raise DraftsimError("a workload needs at least one request")
        if not (len(self.arrival) == len(self.output) == len(self.priority) == n):
            raise DraftsimError("workload columns must have one entry per request")
        as_count("prompt tokens", self.prompt, minimum=1, maximum=MAX_TOKENS)
        as_count("output tokens", self.output, minimum=1, maximum=MAX_TOKENS)

    def __len__(self) -> int:
        return len(self.prompt)


# ---------------------------------------------------------------- length distributions

class LengthDist(Parametrised):
    """A distribution of token counts >= 1; ``sample(n, rng)`` returns int64 lengths."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def max(self) -> int:  # pragma: no cover - abstract
        """The largest length it can draw."""
        raise NotImplementedError

    @property
    def mean(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


def _length(name: str, value) -> int:
    return int(as_count(name, value, minimum=1, maximum=MAX_TOKENS))


class Fixed(LengthDist):
    """Every request has ``n`` tokens."""

    def __init__(self, n: int):
        self.n = _length("fixed length", n)

    def sample(self, n, rng):
        return np.full(n, self.n, dtype=np.int64)

    @property
    def max(self):
        return self.n

    @property
    def mean(self):
        return float(self.n)


class Uniform(LengthDist):
    """Uniform integers on [lo, hi]."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = _length("uniform lo", lo), _length("uniform hi", hi)
        if self.lo > self.hi:
            raise DraftsimError(f"uniform lengths need lo <= hi; got {self.lo} > {self.hi}")

    def sample(self, n, rng):
        return rng.integers(self.lo, self.hi + 1, size=n, dtype=np.int64)

    @property
    def max(self):
        return self.hi

    @property
    def mean(self):
        return (self.lo + self.hi) / 2.0


class LogNormal(LengthDist):
    """round(exp(N(log median, sigma²))), clipped to [1, max] (LLM output lengths are close to
    log-normal, e.g. the Azure traces)."""

    def __init__(self, median: float, sigma: float, max: int = 32768):
        self.median = float(as_positive("lognormal median", median))
        self.sigma = float(as_positive("lognormal sigma", sigma))
        self.cap = _length("lognormal max", max)
        if self.sigma > 5:
            raise DraftsimError(f"lognormal sigma must be <= 5 (a spread of e^5 = 148x per sigma); got {self.sigma:g}")

    def sample(self, n, rng):
        x = np.rint(self.median * np.exp(self.sigma * rng.standard_normal(n)))
        return np.clip(x, 1, self.cap).astype(np.int64)

    @property
    def max(self):
        return self.cap

    @property
    def mean(self):
        return float(min(self.median * np.exp(self.sigma**2 / 2), self.cap))


class Zipf(LengthDist):
    """P(n) ∝ n^(−a) on [min, max] (a heavy tail of long requests)."""

    def __init__(self, a: float, max: int, min: int = 1):
        self.a = float(as_positive("zipf a", a))
        self.lo, self.hi = _length("zipf min", min), _length("zipf max", max)
        if self.lo > self.hi:
            raise DraftsimError(f"zipf lengths need min <= max; got {self.lo} > {self.hi}")
        if self.hi - self.lo > 1 << 20:
            raise DraftsimError(f"zipf support max - min must be <= {1 << 20}; got {self.hi - self.lo}")
        support = np.arange(self.lo, self.hi + 1, dtype=np.float64)
        w = support ** (-self.a)
        self._cdf = np.cumsum(w) / w.sum()
        self._mean = float((support * w).sum() / w.sum())

    def sample(self, n, rng):
        idx = np.searchsorted(self._cdf, rng.random(n), side="right")
        return (self.lo + np.minimum(idx, self.hi - self.lo)).astype(np.int64)

    @property
    def max(self):
        return self.hi

    @property
    def mean(self):
        return self._mean


class Empirical(LengthDist):
    """Lengths resampled (with replacement) from observed values: a list, or a text file with
    one integer per line (or comma-separated)."""

    def __init__(self, values):
        if isinstance(values, (str, Path)):
            path = Path(values)
            text = read_text(path, "empirical lengths file")
            items = [t for t in text.replace(",", "\n").split() if t]
            try:
                values = [ascii_int(t) for t in items]
            except ValueError:
                raise DraftsimError(f"empirical lengths: {str(path)!r} must hold integers (one per line)") from None
            self.source = str(path)
        arr = as_count("empirical lengths", values, minimum=1, maximum=MAX_TOKENS)
        if arr.ndim != 1 or arr.size == 0:
            raise DraftsimError("empirical lengths need at least one value")
        self.values = arr

    def sample(self, n, rng):
        return self.values[rng.integers(0, len(self.values), size=n)]

    @property
    def max(self):
        return int(self.values.max())

    @property
    def mean(self):
        return float(self.values.mean())

    def __repr__(self):
        return f"Empirical({getattr(self, 'source', f'{len(self.values)} values')})"


def _uniform(lo: int | None = None, hi: int | None = None, **_) -> Uniform:
    if lo is None or hi is None:
        raise DraftsimError("uniform lengths need lo and hi (e.g. uniform:128,1024 or uniform:lo=128,hi=1024)")
    return Uniform(lo, hi)


#: Length distributions on the command line (``--prompt-len``, ``--output-len``).
LENGTHS = Registry("length distribution", entries=[
    Entry("fixed", Fixed, (Param("n", ascii_int, required=True),), (("fixed:512", "every request has 512 tokens"),)),
    Entry("uniform", _uniform, (Param("lo", ascii_int), Param("hi", ascii_int)), (("uniform:128,1024", "uniform integers on [128, 1024]"),)),
    Entry("lognormal", LogNormal, (Param("median", ascii_float, required=True), Param("sigma", ascii_float, required=True),
                                   Param("max", ascii_int)),
          (("lognormal:median=256,sigma=0.8[,max=32768]", "log-normal around the median, clipped to max"),)),
    Entry("zipf", Zipf, (Param("a", ascii_float, required=True), Param("max", ascii_int, required=True), Param("min", ascii_int)),
          (("zipf:a=1.2,max=4096[,min=1]", "P(n) ~ n^-a on [min, max]"),)),
    Entry("empirical", Empirical, (Param("file", str, "values", required=True),),
          (("empirical:FILE", "resample the integers listed in FILE"),)),
])


def parse_lengths(spec: str, option: str = "length") -> LengthDist:
    """A length distribution from the mini-language; shorthands ``fixed:512``,
    ``uniform:128,1024`` and ``empirical:FILE`` are read positionally, and a bare integer is
    ``fixed``."""
    if not isinstance(spec, str) or not spec.strip():
        raise DraftsimError(f"{option}: empty length distribution; e.g. fixed:512")
    text = spec.strip()
    if text.isascii() and text.isdigit():
        return Fixed(int(text))
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    try:
        if name == "fixed" and rest and "=" not in rest:
            return Fixed(ascii_int(rest))
        if name == "uniform" and rest and "=" not in rest:
            parts = rest.split(",")
            if len(parts) != 2:
                raise DraftsimError(f"uniform needs two bounds LO,HI; got {rest!r}")  # the option is prefixed below
            return Uniform(ascii_int(parts[0]), ascii_int(parts[1]))
        if name == "empirical" and rest and not rest.startswith("file="):
            return Empirical(rest)
    except ValueError as exc:
        if isinstance(exc, DraftsimError):
            raise DraftsimError(f"{option}: {exc}") from None
        raise DraftsimError(f"{option}: {spec!r} is not a valid length distribution (integers in ASCII digits)") from None
    try:
        return LENGTHS.parse(text)
    except DraftsimError as exc:
        raise DraftsimError(f"{option}: {exc}") from None


LENGTH_HELP = LENGTHS.help


# ---------------------------------------------------------------- workload presets

#: Named workloads with their sources (``--workload NAME``).
WORKLOADS_FILE = Path(__file__).parent.parent / "data" / "workloads.json"
#: The standard normal's 90th percentile: a log-normal through a median M and a P90 has
#: sigma = ln(P90 / M) / Z90.
Z90 = NormalDist().inv_cdf(0.9)


@dataclass(frozen=True)
class LengthFacts:
    """One length of a preset as its source states it: median, 90th percentile, the largest
    length drawn (``max``) and the source's mean when it gives one."""

    median: float
    p90: float
    max: int
    mean: float | None = None

    @property
    def sigma(self) -> float:
        """The log-normal's sigma through the median and the P90."""
        return math.log(self.p90 / self.median) / Z90

    @property
    def spec(self) -> str:
        """The fit in the ``--prompt-len`` / ``--output-len`` syntax."""
        return f"lognormal:median={self.median:g},sigma={self.sigma:.6g},max={self.max}"


@dataclass(frozen=True)
class WorkloadPreset:
    """A named workload (sim/data/workloads.json): the prompt and output lengths of one
    source, each a log-normal through the source's median and P90 clipped to [1, max] (the
    file's ``fit``), with the source and every assumption made in reading it."""

    name: str
    description: str
    prompt: LengthFacts
    output: LengthFacts
    source: str
    assumptions: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    @property
    def prompt_len(self) -> str:
        return self.prompt.spec

    @property
    def output_len(self) -> str:
        return self.output.spec


def _facts(name: str, which: str, raw) -> LengthFacts:
    where = f"{WORKLOADS_FILE.name}: workload {name!r} {which}"
    if not isinstance(raw, dict) or not {"median", "p90", "max"} <= set(raw):
        raise DraftsimError(f"{where} needs median, p90 and max")
    facts = LengthFacts(float(as_positive(f"{where} median", raw["median"])), float(as_positive(f"{where} p90", raw["p90"])),
                        _length(f"{where} max", raw["max"]),
                        None if raw.get("mean") is None else float(as_positive(f"{where} mean", raw["mean"])))
    if not facts.median < facts.p90 <= facts.max:
        raise DraftsimError(f"{where}: needs median < p90 <= max; got {facts.median:g}, {facts.p90:g}, {facts.max}")
    return facts


@lru_cache(maxsize=1)
def workload_presets() -> dict[str, WorkloadPreset]:
    """The presets by name (read once, validated: every entry cited, its lengths ordered)."""
    doc = json.loads(WORKLOADS_FILE.read_text())
    out = {}
    for name, e in doc["workloads"].items():
        if not e.get("source"):
            raise DraftsimError(f"{WORKLOADS_FILE.name}: workload {name!r} has no source")
        out[name] = WorkloadPreset(name, e["description"], _facts(name, "prompt", e.get("prompt")), _facts(name, "output", e.get("output")),
                                   e["source"], tuple(e.get("assumptions", ())), tuple(e.get("aliases", ())))
    return out


def workload_preset(name: str) -> WorkloadPreset:
    """The preset called ``name`` or one of its aliases (case-insensitive); an unknown name is
    refused in one line listing the presets (with the closest ones)."""
    presets = workload_presets()
    spellings = {**{n: n for n in presets}, **{a: n for n, p in presets.items() for a in p.aliases}}
    key = str(name).strip().lower()
    if key not in spellings:
        raise unknown("workload preset", name, spellings, known=f"known: {', '.join(presets)} (sim/data/workloads.json)")
    return presets[spellings[key]]


def workload_lengths(workload: str | None, prompt_len: str | None, output_len: str | None,
                     default: tuple[str, str] = ("fixed:512", "fixed:256")) -> tuple[str, str]:
    """The prompt and output length specs a command runs with: each as given, else the
    ``workload`` preset's, else ``default``."""
    preset = workload_preset(workload) if workload is not None else None
    return (prompt_len if prompt_len is not None else preset.prompt_len if preset else default[0],
            output_len if output_len is not None else preset.output_len if preset else default[1])


def _workload_help() -> str:
    lines = ["Workload presets (--workload NAME; --prompt-len/--output-len, when given, win): median / P90 tokens, "
             "log-normal fits, sources in sim/data/workloads.json"]
    for p in workload_presets().values():
        also = f" (also {', '.join(p.aliases)})" if p.aliases else ""
        lines.append(f"  {p.name:<20}prompt {p.prompt.median:g} / {p.prompt.p90:g}, output {p.output.median:g} / {p.output.p90:g}{also}")
    return "\n".join(lines)


WORKLOAD_HELP = _workload_help()


# ---------------------------------------------------------------- arrival processes

class Arrivals(Parametrised):
    """An open-loop arrival process: ``times(rate, n, duration, rng)`` gives sorted arrival
    times at mean rate ``rate`` (requests/s): ``n`` of them, or all in [0, duration)."""

    closed = False

    def gaps(self, rate: float, n: int, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def times(self, rate: float, n: int | None, duration: float | None, rng: np.random.Generator) -> np.ndarray:
        rate = float(as_positive("qps", rate))
        if n is not None:
            return np.cumsum(self.gaps(rate, int(n), rng))
        duration = float(as_positive("duration", duration))
        out, t0 = [], 0.0
        block = max(int(rate * duration * 1.1) + 16, 16)
        while True:
            t = t0 + np.cumsum(self.gaps(rate, block, rng))
            out.append(t[t < duration])
            if t[-1] >= duration:
                break
            t0 = float(t[-1])
        return np.concatenate(out)


class Poisson(Arrivals):
    """Exponential gaps of mean 1/rate."""

    def gaps(self, rate, n, rng):
        return rng.exponential(1.0 / rate, size=n)


class GammaArrivals(Arrivals):
    """Gamma gaps of mean 1/rate and coefficient of variation ``cv`` (shape 1/cv²): bursty
    traffic for cv > 1 (Vidur's gamma request-interval generator)."""

    def __init__(self, cv: float):
        self.cv = float(as_positive("gamma cv", cv))
        if self.cv > 100:
            raise DraftsimError(f"gamma cv must be <= 100; got {self.cv:g}")

    def gaps(self, rate, n, rng):
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, 1.0 / (rate * shape), size=n)


class EvenArrivals(Arrivals):
    """Deterministic gaps of exactly 1/rate."""

    def gaps(self, rate, n, rng):
        return np.full(n, 1.0 / rate)


class ClosedLoop(Arrivals):
    """``clients`` users, each sending its next request ``think`` seconds (exponential, mean;
    0: at once) after the last token of its previous one. The rate is not an input here: the
    server's speed sets it."""

    closed = True

    def __init__(self, clients: int, think: float = 0.0):
        self.clients = int(as_count("clients", clients, minimum=1, maximum=1 << 20))
        think = float(think)
        if not (np.isfinite(think) and think >= 0):
            raise DraftsimError(f"think time must be finite and >= 0 seconds; got {think!r}")
        self.think = think

    def think_times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.exponential(self.think, size=n) if self.think > 0 else np.zeros(n)


def _think(text: str) -> float:
    """A closed loop's mean think time, read as every time is (:func:`~draftsim.sim.errors.parse_seconds`):
    ``think=1.5`` is seconds, ``think=500ms`` half a second."""
    return parse_seconds("think", text)


#: Arrival processes on the command line (``--arrivals``).
ARRIVALS = Registry("arrival process", plural="arrival processes", entries=[
    Entry("poisson", Poisson, (), (("poisson", "exponential gaps at rate --qps (default)"),)),
    Entry("gamma", GammaArrivals, (Param("cv", ascii_float, required=True),),
          (("gamma:cv=2", "gamma gaps at rate --qps, coefficient of variation cv (>1: bursty)"),)),
    Entry("fixed", EvenArrivals, (), (("fixed", "evenly spaced at rate --qps"),)),
    Entry("closed", ClosedLoop, (Param("clients", ascii_int, required=True), Param("think", _think)),
          (("closed:clients=32[,think=1.0]", "closed loop: each client sends its next request an exponential\n"
            "think time (mean; seconds, or with a unit: think=500ms) after its previous one ends"),)),
])

ARRIVAL_HELP = ARRIVALS.help


def parse_arrivals(spec: str) -> Arrivals:
    return ARRIVALS.parse(spec)


# ---------------------------------------------------------------- request traces

#: Column names understood for each field (matched case-insensitively, first found wins).
TIME_COLUMNS = ("timestamp", "time", "arrived_at", "arrival_time", "arrival")
PROMPT_COLUMNS = ("contexttokens", "prompttokencount", "num_prefill_tokens", "prompt_tokens", "prompt_len", "input_tokens")
OUTPUT_COLUMNS = ("generatedtokens", "completiontokencount", "num_decode_tokens", "output_tokens", "output_len", "generated_tokens")
PRIORITY_COLUMNS = ("priority",)


def _read_rows(path: Path) -> tuple[list[str], list[dict]]:
    text = read_text(path, "request trace")
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        rows = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            row = parse_json(line, f"request trace {str(path)!r} line {i}")  # nesting, long integers and bad JSON: one line
            if not isinstance(row, dict):
                raise DraftsimError(f"request trace {str(path)!r} line {i}: each line must be a JSON object")
            rows.append(row)
        columns = list(dict.fromkeys(k for r in rows for k in r))
        _distinct_columns(path, columns)
        return columns, rows
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is None:
        raise DraftsimError(f"request trace {str(path)!r} is empty")
    columns = [c.strip() for c in reader.fieldnames]
    _distinct_columns(path, columns)
    rows = []
    for r in reader:  # a row with more or fewer fields than the header: a cut or shifted line, not values to drop or guess
        if None in r or any(v is None for v in r.values()):
            fields = sum(v is not None for k, v in r.items() if k is not None) + len(r.get(None) or ())
            raise DraftsimError(f"request trace {str(path)!r} line {reader.line_num} has {fields} field(s); the header has "
                                f"{len(columns)} ({', '.join(columns)})")
        rows.append({k.strip(): v for k, v in r.items()})
    return columns, rows


def _distinct_columns(path: Path, columns: list[str]) -> None:
    """Refuse a trace that names one column twice (letter case aside): a reader would keep one
    of the two silently (the CSV header's last, the first alias found)."""
    seen: dict[str, str] = {}
    for c in columns:
        if c and c.lower() in seen:
            twice = f"twice ({seen[c.lower()]!r} and {c!r})" if seen[c.lower()] != c else f"{c!r} twice"
            raise DraftsimError(f"request trace {str(path)!r} names the column {twice}; give each column once")
        seen[c.lower()] = c


def _find(columns: list[str], names: tuple[str, ...]) -> str | None:
    lower = {c.lower(): c for c in columns}
    return next((lower[n] for n in names if n in lower), None)


def _times(path: Path, column: str, values: list) -> np.ndarray:
    """Seconds: numbers as they are; dates (Azure's ``2023-11-16 18:15:46.6805900``) relative
    to the first."""
    # JSON's true is no time, and an integer past float range no date (numpy reads its digits as a year)
    flag = next((v for v in values if isinstance(v, bool) or (isinstance(v, int) and abs(v).bit_length() > 1023)), None)
    if flag is not None:
        raise DraftsimError(f"request trace {str(path)!r}: column {column} must hold seconds or dates; got {shown(flag)}")
    try:
        return np.array([float(v) for v in values], dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a JSON integer past float range
        pass
    try:
        stamps = np.array([np.datetime64(str(v).strip().replace(" ", "T"), "ns") for v in values])
    except ValueError:
        bad = next(v for v in values if not _is_date(v))
        raise DraftsimError(f"request trace {str(path)!r}: column {column} must hold seconds or dates; got {shown(bad)}") from None
    return (stamps - stamps[0]).astype(np.int64) / 1e9


def _is_date(v) -> bool:
    try:
        np.datetime64(str(v).strip().replace(" ", "T"), "ns")
        return True
    except ValueError:
        return False


class RequestTrace(NamedTuple):
    """A request trace as read (:func:`read_request_trace`): arrival seconds from 0 (None when
    the trace has no time column), prompt and output tokens, priority (0 when absent)."""

    arrival: np.ndarray | None
    prompt: np.ndarray
    output: np.ndarray
    priority: np.ndarray


def read_request_trace(path) -> RequestTrace:
    """(arrival seconds or None, prompt tokens, output tokens, priority) of a CSV/JSONL request
    trace, read once (a pipe works; a spreadsheet's byte-order mark is dropped); validated:
    the length columns must be present, integers >= 1; times, when present, finite, >= 0 and
    sorted. Arrival times are shifted to start at 0."""
    path = Path(path)
    columns, rows = _read_rows(path)
    prompt_col, output_col = _find(columns, PROMPT_COLUMNS), _find(columns, OUTPUT_COLUMNS)
    missing = [what for what, col in (("prompt tokens", prompt_col), ("output tokens", output_col)) if col is None]
    if missing:
        raise DraftsimError(
            f"request trace {str(path)!r} has no {' and no '.join(missing)} column; it has {', '.join(columns) or 'none'} "
            f"(prompt: {'/'.join(('ContextTokens', 'PromptTokenCount', 'num_prefill_tokens', 'prompt_tokens'))}; output: "
            f"{'/'.join(('GeneratedTokens', 'CompletionTokenCount', 'num_decode_tokens', 'output_tokens'))})")
    if not rows:
        raise DraftsimError(f"request trace {str(path)!r} has no requests")

    def counts(col: str, minimum: int) -> np.ndarray:
        vals = [r.get(col) for r in rows]
        try:
            if any(isinstance(v, bool) for v in vals):  # JSON's true is no count
                raise TypeError
            arr = np.array([float(v) for v in vals])
        except (TypeError, ValueError, OverflowError):  # OverflowError: a JSON integer past float range
            bad = next(v for v in vals if not _number(v))
            raise DraftsimError(f"request trace {str(path)!r}: column {col} must hold integers; got {shown(bad)}") from None
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(arr) & (arr == np.round(arr)) & (arr >= minimum) & (arr <= MAX_TOKENS)
        if not ok.all():  # the file and the row, as the user sees them (1-based), and the value as written
            i = int(np.argmin(ok))
            raise DraftsimError(f"request trace {str(path)!r}: column {col} must hold integers in [{minimum}, {MAX_TOKENS}]; "
                                f"row {i + 1} has {shown(vals[i])}")
        return as_count(f"request trace column {col}", arr, minimum=minimum, maximum=MAX_TOKENS)

    prompt, output = counts(prompt_col, 1), counts(output_col, 1)
    time_col = _find(columns, TIME_COLUMNS)
    arrival = None
    if time_col is not None:
        arrival = _times(path, time_col, [r.get(time_col) for r in rows])
        bad = ~np.isfinite(arrival) | (arrival < 0)
        if bad.any():
            i = int(np.argmax(bad))
            raise DraftsimError(f"request trace {str(path)!r}: arrival times must be finite and >= 0; row {i + 1} has {float(arrival[i]):g}")
        drops = np.flatnonzero(np.diff(arrival) < 0)
        if drops.size:
            i = int(drops[0]) + 1
            raise DraftsimError(f"request trace {str(path)!r}: arrival times must be sorted; row {i + 1} ({arrival[i]:g} s) "
                                f"comes before row {i} ({arrival[i - 1]:g} s)")
        arrival = arrival - arrival[0]
    prio_col = _find(columns, PRIORITY_COLUMNS)
    priority = counts(prio_col, 0) if prio_col is not None else np.zeros(len(rows), dtype=np.int64)
    return RequestTrace(arrival, prompt, output, priority)


def _number(v) -> bool:
    if isinstance(v, bool):
        return False
    try:
        float(v)
        return True
    except (TypeError, ValueError, OverflowError):
        return False


def make_workload(*, arrivals: Arrivals, qps: float | None, requests: int | None, duration: float | None,
                  prompt: LengthDist | None, output: LengthDist | None, rng: np.random.Generator,
                  trace=None, priorities: int = 1) -> Workload:
    """Draw a workload (see the module docstring). ``trace`` (a path) gives arrival times and
    lengths (or lengths only, resampled in order, when it has no time column); ``requests``
    or ``duration`` bound it (a :class:`RequestTrace` already read may stand for the path:
    a pipe can be read only once). Closed-loop workloads have NaN arrivals and need ``requests``."""
    priorities = int(as_count("priorities", priorities, minimum=1, maximum=1 << 16))
    if requests is not None:
        requests = int(as_count("requests", requests, minimum=1, maximum=1 << 26))
    if trace is not None:
        t_arr, t_prompt, t_out, t_prio = trace if isinstance(trace, RequestTrace) else read_request_trace(trace)
        name = "the request trace" if isinstance(trace, RequestTrace) else f"request trace {str(trace)!r}"
        if t_arr is not None and qps is None and not arrivals.closed:
            keep = np.ones(len(t_arr), dtype=bool)
            if duration is not None:
                keep &= t_arr < float(as_positive("duration", duration))
            idx = np.flatnonzero(keep)[: requests]
            if idx.size == 0:
                raise DraftsimError(f"{name} has no request before --duration {duration:g} s")
            return Workload(t_arr[idx], t_prompt[idx], t_out[idx], t_prio[idx])
        n = _count(arrivals, qps, requests, duration, rng, default=len(t_prompt))
        times = n if isinstance(n, np.ndarray) else None
        m = len(times) if times is not None else n
        idx = np.arange(m) % len(t_prompt)
        arrival = times if times is not None else np.full(m, np.nan)
        return Workload(arrival, t_prompt[idx], t_out[idx], t_prio[idx])
    if prompt is None or output is None:
        raise DraftsimError("a workload needs prompt and output length distributions (or a request trace)")
    n = _count(arrivals, qps, requests, duration, rng)
    times = n if isinstance(n, np.ndarray) else None
    m = len(times) if times is not None else n
    if m == 0:
        raise DraftsimError(f"no request arrives within --duration {duration:g} s at --qps {qps:g}; lengthen the duration")
    p = prompt.sample(m, rng)
    o = output.sample(m, rng)
    prio = rng.integers(0, priorities, size=m) if priorities > 1 else np.zeros(m, dtype=np.int64)
    return Workload(times if times is not None else np.full(m, np.nan), p, o, prio)


def _count(arrivals: Arrivals, qps, requests, duration, rng, default: int | None = None):
    """Arrival times (open loop) or the request count (closed loop)."""
    if arrivals.closed:
        if qps is not None:
            raise DraftsimError("closed-loop arrivals take no --qps: the clients send as fast as the server answers")
        if requests is None:
            if default is None:
                raise DraftsimError("closed-loop arrivals need --requests (how many requests the clients send in all)")
            requests = default
        return int(requests)
    if qps is None:
        raise DraftsimError("open-loop arrivals need --qps (requests per second)")
    if requests is None and duration is None:
        if default is None:
            raise DraftsimError("give --requests N or --duration SECONDS")
        requests = default
    if requests is not None and duration is not None:
        raise DraftsimError("give --requests or --duration, not both")
    return arrivals.times(qps, requests, duration, rng)
