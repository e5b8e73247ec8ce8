"""``draftsim capacity`` without a spec: the serving team's front door.

    draftsim capacity --target llama-3.1-70b --hardware h100-sxm --tp 4 --load 12 \\
        --slo ttft:p99=2s --slo tpot:p90=60ms --method eagle3:k=1..4 --workload sharegpt --alpha 0.7

builds the capacity spec a TOML file would hold (:func:`build_spec`; written to OUT/spec.toml so
the same search can be rerun or edited), searches it with the serving simulator on the engine's
own defaults, and ends in the answer: which method and k (or none), how many replicas, the
margin and its interval (:func:`recommend`), and the engine configuration that deploys it
(:func:`deploy`: ``vllm serve`` flags with its ``--speculative-config`` JSON, or SGLang's
``launch_server`` flags). Plain decoding is always searched beside the methods: it is what the
answer is measured against.

The answer is computed from the spec, not from the flags (:func:`answer`): rerunning OUT/spec.toml
gives the same answer, and a hand-written serve spec gets one too where it names one deployment
and a load (else one line says what it lacks).

Grammar of the flags: :data:`HELP`.
"""
from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field, replace

from draftsim.analysis.capacity import LATENCIES, PER_TOKEN, validate_once
from draftsim.sim.errors import TIME_UNITS, DraftsimError, parse_seconds, suggest

__all__ = ["SLO_NAMES", "SLO_STATS", "HELP", "parse_slo", "slo_warnings", "parse_method", "Method", "build_spec", "Recommendation",
           "recommend", "deploy", "hf_id", "toml_text", "configuration_name", "search_range", "Answer", "answer", "point_names",
           "check_points"]

#: ``draftsim capacity --help``'s text after the options.
HELP = """\
The front door (no SPEC): the flags build the search, and the output ends in the answer.

  draftsim capacity --target llama-3.1-70b --hardware h100-sxm --tp 4 --load 12 \\
      --slo ttft:p99=2s --slo tpot:p90=60ms --method eagle3:k=1..4 --workload sharegpt --alpha 0.7

  --slo NAME:STAT=VALUE[UNIT]  NAME ttft, tpot, itl, e2e or queue; STAT mean, p50, p90 or p99;
                               UNIT us, ms, s, m or h (no unit: seconds; ttft:p99=2s, tpot:p90=60ms)
  --method NAME[:k=K]          a drafting method serving engines deploy (eagle, eagle3, ...) or a
                               catalog draft model (qwen2.5-0.5b); K a list or range of draft
                               lengths (k=2, k=1..4, k=2,4,6; default 1..4). Plain decoding is
                               always searched beside them.

It prints the answer (which method and k, or none; how many replicas; the margin over the load
and its 95% interval), the engine and its scheduler settings as simulated, how far draftsim's
speedups like the answer's were from published ones (the model error), the table of every
configuration, and the command that deploys the answer (vllm serve or SGLang's launch_server).
It writes OUT/spec.toml: `draftsim capacity OUT/spec.toml --out OUT` reruns the same search and
prints the same answer.

A SPEC is a sweep spec (draftsim sweep --help) of kind serve with a [capacity] table:

  [capacity]
  slo = { ttft_p99 = 1.0, tpot_p50 = 0.05 }  # metric = upper bound (latencies in seconds)
  load = 40.0          # requests/s: the fewest replicas per configuration meeting the SLOs at it
  devices = ["replicas", "tp"]   # options whose product is the devices a configuration takes
  price_per_hour = 2.5 # price of one device-hour: the cost per 1M output tokens
  compare = "policy"   # the axis drawn side by side in the figure
  start, minimum, maximum, tolerance, max_evaluations, max_lengthening, throughput, latency:
                       # the search itself (defaults fit the spec's duration)

Each configuration's capacity is the largest request rate whose steady-state simulation meets
every SLO (mean over the replications); runs that have not settled are rerun longer. With a
load, each configuration's fewest replicas are simulated at the load itself. Results:
OUT/results/*.parquet, OUT/manifest.json and the figure OUT/capacity.png.
"""

SLO_NAMES = LATENCIES  # the serve kind's latencies (analysis.capacity)
SLO_STATS = ("mean", "p50", "p90", "p99")
#: The most draft lengths one --method may search (each is a configuration of its own).
MAX_KS = 16
#: Seconds of arrivals per simulation the front door starts from (capacity lengthens runs that have not settled).
DEFAULT_DURATION = 120.0
#: Highest per-replica rate the front door searches: LOAD_SPAN x the load (a capacity above it is shown as ">="), or
#: without a load MAX_RATE; lowered where the longest run would exceed the search's request bound.
LOAD_SPAN, MAX_RATE = 4.0, 1e4


def parse_slo(text: str) -> tuple[str, float]:
    """``ttft:p99=2s`` → (``ttft_p99``, 2.0): the serve kind's metric name and its bound in seconds, the
    bound read as every time is (:func:`~draftsim.sim.errors.parse_seconds`: 60ms, 2s, 1.5; us, m, h)."""
    m = re.fullmatch(r"\s*([a-z0-9]+)\s*:\s*([a-z0-9]+)\s*=(.*)", str(text).lower())
    if not m or not m.group(3).strip():
        raise DraftsimError(f"--slo {text!r}: write NAME:STAT=VALUE[UNIT], e.g. ttft:p99=2s or tpot:p90=60ms "
                            f"(NAME: {', '.join(SLO_NAMES)}; STAT: {', '.join(SLO_STATS)}; UNIT: {', '.join(TIME_UNITS)})")
    name, stat, value = m.groups()
    if name not in SLO_NAMES:
        raise DraftsimError(f"--slo {text!r}: unknown latency {name!r}; valid: {', '.join(SLO_NAMES)}")
    if stat not in SLO_STATS:
        raise DraftsimError(f"--slo {text!r}: unknown statistic {stat!r}; valid: {', '.join(SLO_STATS)}")
    v = parse_seconds(f"--slo {text!r}:", value)
    if not (math.isfinite(v) and v > 0):
        raise DraftsimError(f"--slo {text!r}: the bound must be a finite number > 0")
    return f"{name}_{stat}", v


def slo_warnings(texts) -> list[str]:
    """A warning per ``--slo`` that bounds a per-token latency (TPOT, ITL) by 1 s or more with
    no unit (read as seconds: ``tpot:p90=60`` is 60 s a token), saying how to write ms."""
    out = []
    for text in texts:
        m = re.fullmatch(r"\s*([a-z0-9]+)\s*:\s*([a-z0-9]+)\s*=\s*([0-9.eE+-]+)\s*", str(text).lower())
        if m is None or m.group(1) not in PER_TOKEN:
            continue
        metric, bound = parse_slo(text)
        if bound >= 1.0:
            value = m.group(3)
            out.append(f"--slo {text}: no unit, so {metric} <= {bound:g} s per token; for milliseconds write "
                       f"{m.group(1)}:{m.group(2)}={value}ms")
    return out


@dataclass(frozen=True)
class Method:
    """One ``--method``: the drafter option serve-sim takes and the draft lengths to search."""

    name: str  #: as the user wrote it (eagle3, qwen2.5-0.5b)
    drafter: str  #: serve-sim's --drafter value
    ks: tuple[int, ...]

    @property
    def title(self) -> str:
        from draftsim.sim.registry import METHODS

        entry = METHODS.get(self.name)
        return entry.title if entry is not None and entry.served and entry.pricing != "draft_model" else f"draft model {self.name}"


def _ks(text: str, where: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("..")
        # ASCII digits only, as every number the command line takes: int() also reads '１' and '٣' (and '+2', '2_0')
        if not all(re.fullmatch(r"[0-9]+", x.strip()) for x in ((lo, hi) if sep else (lo,))):
            raise DraftsimError(f"{where}: k={text!r} is not a list or range of integers in ASCII digits (k=2, k=1..4, k=2,4)")
        a, b = (int(x) if len(x.strip()) <= 6 else 10**6 for x in (lo, hi if sep else lo))  # past 6 digits: out of range below
        if not (1 <= a <= b <= 64):
            raise DraftsimError(f"{where}: draft lengths must lie in 1..64 with low <= high; got {part!r}")
        out += range(a, b + 1)
    ks = tuple(sorted(set(out)))
    if len(ks) > MAX_KS:
        raise DraftsimError(f"{where}: {len(ks)} draft lengths; search at most {MAX_KS} per method")
    return ks


def parse_method(text: str, catalog=None) -> Method:
    """``eagle3:k=1..4`` → Method('eagle3', 'eagle3', (1, 2, 3, 4)); a catalog model name is a
    draft model (``qwen2.5-0.5b:k=3``)."""
    from draftsim.sim.registry import METHODS, served_method_help

    served = [m.name for m in METHODS.values() if m.served and m.pricing != "draft_model"]

    raw = str(text).strip()
    name, sep, rest = raw.partition(":k=")
    if sep and not rest.strip():
        raise DraftsimError(f"--method {text!r}: k= names no draft length; write k=2, k=1..4 or k=2,4 (or leave :k= out for 1..4)")
    if ":" in name and not rest:
        name, _, tail = name.partition(":")
        raise DraftsimError(f"--method {text!r}: write NAME or NAME:k=K (k=2, k=1..4, k=2,4); got {tail!r} after the name")
    ks = _ks(rest, f"--method {text!r}") if rest else (1, 2, 3, 4)
    low = name.lower()
    if low in served:
        return Method(low, low, ks)
    if low in METHODS and METHODS[low].pricing == "lookup":
        papers = " and ".join(m.title for m in METHODS.values() if m.pricing == "lookup" and not m.served)
        raise DraftsimError(f"--method {low}: {papers} are the papers' drafters, not a serving engine's; valid methods: {served_method_help()}")
    if catalog is None:
        from draftsim.sim.cost import default_catalog

        catalog = default_catalog()
    try:
        spec = catalog.model(name)
    except DraftsimError:
        from draftsim.sim.errors import unknown

        raise unknown("--method", name, served, known=f"known: {', '.join(served)}, or a catalog draft model (draftsim cost --list)") from None
    return Method(name, spec.name, ks)


def build_spec(config) -> dict:
    """The capacity spec (a dict as TOML reads it) that the front-door flags of ``config`` name."""
    from draftsim.sim.cost import default_catalog

    if not config.target or not config.hardware:
        raise DraftsimError("give a spec, or --target MODEL --hardware HW (and --load, --slo, --method) for the front door")
    if not config.slo:
        raise DraftsimError("give at least one --slo, e.g. --slo ttft:p99=2s --slo tpot:p90=60ms")
    catalog = default_catalog()
    catalog.model(config.target)
    catalog.hardware_spec(config.hardware)
    slo = {}
    for text in config.slo:
        metric, bound = parse_slo(text)
        if metric in slo:
            raise DraftsimError(f"--slo {text!r}: {metric} is bounded twice; give each latency and statistic once")
        slo[metric] = bound
    methods = [parse_method(m, catalog) for m in config.method]
    drafters = [m.drafter for m in methods]
    twice = next((m for i, m in enumerate(methods) if m.drafter in drafters[:i]), None)
    if twice is not None:
        raise DraftsimError(f"--method {twice.name} is given twice; give it once with all its draft lengths (e.g. {twice.name}:k=1..4)")
    if config.workload is not None:  # refused naming its flag (its run would say "unknown workload preset" alone)
        from draftsim.sim.serving.workload import workload_preset

        try:
            workload_preset(config.workload)
        except DraftsimError as exc:
            raise DraftsimError(f"--workload {config.workload}: {exc}") from None
    if config.request_trace and config.workload:  # taken silently, one of them would change nothing
        raise DraftsimError(f"--workload {config.workload} and --request-trace {config.request_trace!r} both name the requests; give one")
    if config.request_trace and config.duration is not None:
        raise DraftsimError(f"--duration {config.duration:g} applies to a --workload preset's arrivals; --request-trace "
                            f"{config.request_trace!r} runs its own requests at every rate: drop --duration")
    if getattr(config, "borrow", False) and config.acceptance is None:
        raise DraftsimError("--borrow applies to --acceptance NAME (an entry measured on another target or method)")
    duration = None if config.request_trace else (config.duration or DEFAULT_DURATION)
    minimum, start, maximum = search_range(config.load, duration)
    if methods and config.alpha is None and config.acceptance is None:
        raise DraftsimError("say how often drafts are accepted: --alpha A (per token) or --acceptance NAME (draftsim acceptance lists them)")
    if not methods and (config.alpha is not None or config.acceptance is not None):  # it would change nothing
        given = f"--alpha {config.alpha:g}" if config.alpha is not None else f"--acceptance {config.acceptance}"
        raise DraftsimError(f"{given} says how often drafts are accepted, but no --method drafts: without one the front door "
                            "searches plain decoding only; add --method NAME:k=K (e.g. eagle3:k=1..4) or drop it")
    base: dict = {"target": config.target, "hardware": config.hardware, "tp": config.tp, "replications": 1,
                  "duration": duration}
    if config.engine is not None:
        base["engine"] = config.engine
    if config.request_trace:
        base["request-trace"] = config.request_trace
        base.pop("duration")
    elif config.workload:
        base["workload"] = config.workload
    if config.alpha is not None:
        base["alpha"] = config.alpha
    if config.acceptance is not None:
        base["acceptance"] = config.acceptance
        if getattr(config, "borrow", False):
            base["borrow"] = True
    policies, drafters = ["ar"], [[]]
    for m in methods:
        for k in m.ks:
            policies.append(f"fixed:k={k}")
            drafters.append([m.drafter])
    raw = {"version": 1, "kind": "serve", "seed": config.seed,
           "description": f"front door: {config.target} on {config.tp}x {config.hardware}, load {config.load:g} req/s"
           if config.load else f"front door: {config.target} on {config.tp}x {config.hardware}",
           "replications": config.replications, "base": base}
    if len(policies) > 1:
        raw["zip"] = [{"policy": policies, "drafter-model": drafters}]
    else:
        raw["base"]["policy"] = "ar"
    cap = {"slo": slo, "devices": ["replicas", "tp"], "tolerance": 0.05, "start": start, "minimum": minimum, "maximum": maximum}
    if len(policies) > 1:
        cap["compare"] = "policy"
    if config.load is not None:
        cap["load"] = config.load
    if config.price is not None:
        cap["price_per_hour"] = config.price
    raw["capacity"] = cap
    return raw


def search_range(load: float | None, duration: float | None) -> tuple[float, float, float]:
    """(minimum, start, maximum) of the per-replica rate search for ``--load`` and ``--duration``
    (None: a request trace's own length), refused in one line naming those flags where no search
    fits the capacity search's run bounds (:data:`draftsim.analysis.capacity.MIN_RUN_REQUESTS`,
    :data:`~draftsim.analysis.capacity.MAX_RUN_REQUESTS` at the longest lengthening): a run at the
    lowest rate and at the load expects at least the fewest requests, the longest run at most
    the most. The search starts at a quarter of the load and ends at :data:`LOAD_SPAN` times it."""
    from draftsim.analysis.capacity import MAX_RUN_REQUESTS, MIN_RUN_REQUESTS, Settings

    longest = Settings.max_lengthening
    if duration is None:  # a trace: its own requests at every rate
        start = load / 4.0 if load is not None else 1.0
        return min(Settings.minimum, start), start, LOAD_SPAN * load if load is not None else MAX_RATE
    # divided one factor at a time: duration x longest overflows at --duration 1e308 (and the bound read 0)
    minimum, top = MIN_RUN_REQUESTS / duration, MAX_RUN_REQUESTS / longest / duration
    if load is not None:
        if load < minimum:
            raise DraftsimError(f"--load {load:g} req/s over --duration {duration:g} s expects {load * duration:.3g} requests per run, "
                                f"fewer than {MIN_RUN_REQUESTS}: give --load {suggest(minimum, '>=')} or --duration "
                                f"{suggest(MIN_RUN_REQUESTS / load, '>=')}")
        if load > top:
            raise DraftsimError(f"--load {load:g} req/s over --duration {duration:g} s expects {load * duration * longest:.3g} requests "
                                f"in the longest run ({longest}x the duration), more than {MAX_RUN_REQUESTS:,}: give --load "
                                f"{suggest(top, '<=', 4)} or --duration {suggest(MAX_RUN_REQUESTS / longest / load, '<=', 4)}")
    maximum = min(LOAD_SPAN * load if load is not None else MAX_RATE, top)
    start = min(max(load / 4.0 if load is not None else 1.0, minimum), maximum)
    return minimum, start, maximum


def toml_text(raw: dict) -> str:
    """The spec as a TOML file (what ``draftsim capacity SPEC`` reads back)."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(type(v))

    lines = ["# written by draftsim capacity's front door; rerun with: draftsim capacity THIS_FILE --out DIR"]
    lines += [f"{k} = {value(v)}" for k, v in raw.items() if not isinstance(v, (dict, list))]
    lines += ["", "[base]"] + [f"{json.dumps(k)} = {value(v)}" for k, v in raw["base"].items()]
    for z in raw.get("zip", []):
        lines += ["", "[[zip]]"] + [f"{json.dumps(k)} = {value(v)}" for k, v in z.items()]
    lines += ["", "[capacity]"] + [f"{json.dumps(k)} = {value(v)}" for k, v in raw["capacity"].items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Recommendation:
    """The answer of a front-door search: the winning configuration (``policy``, ``drafter``),
    the plain-decoding baseline's replicas, and the sentence that says it."""

    sentence: str
    policy: str
    drafter: str | None
    k: int
    replicas: int | None
    baseline_replicas: int | None
    row: dict


def _k(policy: str) -> int:
    m = re.search(r"k=(\d+)", str(policy))
    return int(m.group(1)) if m else 0


def _drafter(values) -> str | None:
    d = values.get("drafter_model")
    return (d[0] if d else None) if isinstance(d, (list, tuple)) else (d or None)


def _policy(values) -> str:
    """A configuration's policy: a table without a ``policy`` column (no --method) ran the
    spec's base policy, plain decoding."""
    return str(values.get("policy", "ar"))


def _title(drafter: str) -> str:
    """A drafter as the answer names it: a served method's title (EAGLE-3), else a draft model."""
    from draftsim.sim.registry import METHODS

    entry = METHODS.get(drafter)
    return entry.title if entry is not None and entry.served and entry.pricing != "draft_model" else f"draft model {drafter}"


def configuration_name(values) -> str:
    """A configuration (its ``policy``, ``drafter_model`` and ``controller``) as the answer, the
    progress lines and the refusals name it: "plain decoding", "EAGLE-3 with k = 2"; without a
    ``policy`` (no --method: every run is the spec's base policy, plain decoding) it is plain
    decoding."""
    if _policy(values) == "ar":
        return "plain decoding"
    d = _drafter(values)
    name = f"{_title(d) if d else 'no drafter'} with k = {_k(values['policy'])}"
    controller = values.get("controller")
    return name + (f" (controller {controller})" if controller and controller != "none" else "")


def point_names(points) -> dict[int, str]:
    """Each serve-kind point's configuration name (:func:`configuration_name`) where the names
    tell the points apart (the front door's spec: only the policy, the drafter and the
    controller vary); else {} (the points are named by their axes)."""
    from draftsim.sweepkinds import COMMANDS

    names = {}
    for p in points:
        try:
            c = COMMANDS["serve"].config(p.config)
        except DraftsimError:
            return {}
        names[p.index] = configuration_name({"policy": c.policy, "drafter_model": c.drafter_model or [], "controller": c.controller})
    return names if len(set(names.values())) == len(names) else {}


def recommend(table, load: float | None, devices_per_replica: int, hardware_name: str,
              configurations: dict | None = None) -> Recommendation | None:
    """The answer in one sentence, from :func:`draftsim.analysis.capacity.recommend` (the fewest
    devices meeting the SLOs at ``load`` among the clear wins; ties on the steady-state cost,
    then the latency): a method that needs no fewer replicas than plain decoding is not
    recommended, and where no margin clears its interval's noise the sentence says so instead of
    naming a winner. ``configurations``: per point, its policy, drafter_model and controller
    where the table's columns do not hold them (options of the spec's base)."""
    from draftsim.analysis import capacity as cap

    if load is None:
        return None
    rows = [r for r in table.to_pylist() if r["status"] == "ok"]
    if not rows:
        return None
    axes = [a for a in ("policy", "drafter_model") if a in table.column_names]
    best, noisy = cap.recommend(table, axes)

    def values(r) -> dict:
        return {**(configurations or {}).get(r.get("point"), {}), **{k: v for k, v in r.items() if k in ("policy", "drafter_model")}}

    def drafter_of(r) -> str | None:
        return _drafter(values(r))

    def policy(r) -> str:
        return _policy(values(r))

    def name(r) -> str:
        return configuration_name(values(r))

    def fleet(r) -> str:
        n = int(r["replicas_for_load"])
        return f"{n} replica{'s' if n != 1 else ''} ({n * devices_per_replica}x {hardware_name})"

    def margin(r) -> str:
        return f"margin {cap.margin_text(r)}"

    base = next((r for r in rows if policy(r) == "ar" and r.get("replicas_for_load") is not None), None)
    if best is None:
        seen = [r for r in rows if r.get("replicas_for_load") is not None]
        if not seen:
            return Recommendation(f"no configuration met the SLOs at {load:g} req/s within the search", "ar", None, 0, None,
                                  None, rows[0])
        fewest = min(seen, key=lambda r: (r["devices_for_load"], -(r.get("load_margin") or 0.0)))  # then the widest margin
        sentence = (f"no clear answer at {load:g} req/s: every margin lies within its 95% interval's noise; the fewest "
                    f"replicas seen are {name(fewest)}'s {fleet(fewest)}, {margin(fewest)}: add a replica to be sure, or more "
                    "--replications")
        return Recommendation(sentence, policy(fewest), drafter_of(fewest), _k(policy(fewest)),
                              int(fewest["replicas_for_load"]) + 1, None if base is None else int(base["replicas_for_load"]), fewest)
    base_reps = None if base is None else int(base["replicas_for_load"])
    reps = int(best["replicas_for_load"])
    if policy(best) != "ar" and (base_reps is None or reps < base_reps):
        versus = f"{fleet(base)} for plain decoding" if base is not None else "more than plain decoding reached in the search"
        sentence = f"enable {name(best)}: {fleet(best)} instead of {versus}, {margin(best)}"
    else:
        chosen = base if base is not None else best
        sentence = f"do not enable speculation: plain decoding needs {fleet(chosen)}, {margin(chosen)}; no method needs fewer"
        best, reps = chosen, int(chosen["replicas_for_load"])
    if noisy:
        sentence += f" ({', '.join(name(r) for r in noisy[:3])} might need fewer, within the noise)"
    return Recommendation(sentence, policy(best), drafter_of(best) if policy(best) != "ar" else None,
                          _k(policy(best)), reps, base_reps, best)


def model_error(rec: Recommendation, moe: bool, engine: str | None, hardware: str | None) -> dict | None:
    """How far draftsim's speedups were from published ones like the recommended configuration's
    (:func:`draftsim.sim.evidence.evidence_for`: its method, a dense or MoE target, its engine and
    hardware, and the mean batch a replica runs at the load) and over the whole suite, and what its
    margin would be were its gain over-predicted by that median and that worst error (None for
    plain decoding: the suite measures speculation's speedups only)."""
    from draftsim.sim.evidence import adverse_margin, record

    if rec.drafter is None:
        return None
    out = record(rec.drafter, moe, engine, hardware, rec.row.get("mean_batch_at_load"))
    margin = rec.row.get("load_margin")
    if margin is not None:
        out["margin"] = margin
        out["margin_at_median_error"] = adverse_margin(margin, out["median_abs_error"])
        out["margin_at_worst_error"] = adverse_margin(margin, out["worst_abs_error"])
    return out


@dataclass
class Answer:
    """What a serve-kind capacity search says beside its table, the same from the front door's
    flags and from its spec (:func:`answer`): the engine and its scheduler settings as simulated
    (``engines``: each distinct one with the configurations that ran on it, where they differ),
    the recommendation at the load, the engine configuration deploying it, and the model error of
    the configuration named (the answer's, else the cheapest's); ``missing``: why there is no
    recommendation, in one line."""

    engine: str | None = None
    scheduler: str | None = None
    engines: list = field(default_factory=list)
    recommendation: Recommendation | None = None
    deployment: dict | None = None
    model_error: dict | None = None
    missing: str | None = None
    named: str | None = None  #: the configuration the model error is of (the answer's, else the cheapest)


def _simulated(config):
    """(label of the engine, scheduler as simulated, assembly) of a serve-sim configuration: the
    engine's defaults on the device with the scheduler options the configuration sets."""
    from .servesim import scheduler_config

    built = config.assembly([])
    used = scheduler_config(config, built)
    sched = replace(built.scheduler_defaults(), max_num_seqs=used.max_num_seqs, max_num_batched_tokens=used.max_num_batched_tokens,
                    chunked_prefill=used.chunked_prefill, block_size=used.block_size)
    label = built.engine.label if built.engine is not None else "no engine (the roofline alone)"
    return label, sched, built


def answer(spec, points, table, load: float | None) -> Answer:
    """The answer of a serve-kind capacity search from its spec (``points``: its configurations,
    ``table``: their results, ``load``: requests/s or None); what it cannot give is said in
    ``missing``: no load, configurations on different deployments (targets, hardware, tp or
    engines), or no search that succeeded."""
    from draftsim.sim.cost import default_catalog
    from draftsim.sweepkinds import COMMANDS

    out = Answer()
    configs = {p.index: COMMANDS["serve"].config(p.config) for p in points}
    deployments: dict = {}  # one per deployment (the target without its drafters) and scheduler options
    of_point: dict = {}
    for i, c in configs.items():
        key = repr((c.deployment([]), c.max_num_seqs, c.max_num_batched_tokens, c.block_size, c.no_chunked_prefill))
        if key not in deployments:
            deployments[key] = (c, *_simulated(c))
        of_point[i] = deployments[key]
    values = {i: {"policy": c.policy, "drafter_model": c.drafter_model or [], "controller": c.controller} for i, c in configs.items()}
    names = {i: configuration_name(v) for i, v in values.items()}
    engines: dict = {}
    for c, label, sched, _ in of_point.values():
        where = engines.setdefault((label, sched.describe()), [])
        if f"{c.target} on {c.tp}x {c.hardware}" not in where:
            where.append(f"{c.target} on {c.tp}x {c.hardware}")
    if len(engines) == 1:
        (out.engine, out.scheduler), = engines
    else:
        out.engines = [{"engine": e, "scheduler": s, "deployments": where} for (e, s), where in engines.items()]
    catalog = default_catalog()

    def error_of(drafter: str | None, row: dict):
        c, _, _, built = of_point[row["point"]]
        if drafter is None or built.hardware is None or built.hardware.kind != "gpu":
            return None  # the published runs are GPUs' speculation
        rec = Recommendation("", _policy(values[row["point"]]), drafter, 0, None, None, row)
        error = model_error(rec, catalog.model(c.target).experts > 0, built.engine.name if built.engine is not None else None,
                            built.hardware.name)
        return {**error, "configuration": names[row["point"]]}

    targets = {(c.target, c.hardware, c.tp, label) for c, label, _, _ in deployments.values()}
    rows = [r for r in table.to_pylist() if r["status"] == "ok"]
    missing = []
    if not rows:
        missing.append("no configuration's search succeeded")
    if len(targets) > 1:
        differ = [f for f, k in (("target", 0), ("hardware", 1), ("tp", 2), ("engine", 3)) if len({t[k] for t in targets}) > 1]
        missing.append(f"the configurations run on different deployments ({', '.join(differ)} differ), which the "
                       "table compares: an answer needs one target, hardware, tp and engine")
    else:  # one deployment: the points may still differ in what is not the method (a scheduler, a workload, alpha)
        shown = lambda v: json.dumps(v, sort_keys=True, default=str)  # noqa: E731
        keys = {k for p in points for k in p.config if k not in METHOD_KEYS}
        besides = sorted(k for k in keys if len({shown(p.config.get(k)) for p in points}) > 1)
        if besides:
            missing.append(f"the configurations differ in {', '.join(besides)} besides the drafting method, which the table "
                           "compares: an answer compares drafting methods on one deployment, scheduler and workload")
    if load is None:
        missing.append("the spec gives no load: add --load REQ/S (or load = REQ/S under [capacity]) for the fewest replicas "
                       "meeting the SLOs and the command that deploys them")
    out.missing = "; ".join(missing) or None
    if out.missing is None:
        c, _, sched, built = next(iter(deployments.values()))
        hw = built.hardware.name if built.hardware is not None else str(c.hardware)
        rec = recommend(table, load, c.tp, hw, values)
        out.recommendation = rec
        out.deployment = deploy(rec, c, built, sched)
        out.model_error = error_of(rec.drafter, rec.row)
        out.named = names[rec.row["point"]]
    else:  # the configuration the output names instead: the cheapest per token
        priced = [r for r in rows if r.get("cost_per_million_tokens") is not None]
        if priced:
            r = min(priced, key=lambda r: r["cost_per_million_tokens"])
            out.model_error = error_of(_drafter(values[r["point"]]) if _policy(values[r["point"]]) != "ar" else None, r)
            out.named = names[r["point"]]
    return out


#: What a configuration of the front door's search varies: its drafting method (the rest is one deployment)
METHOD_KEYS = frozenset({"policy", "drafter-model", "drafter_model", "drafter", "controller"})


def check_points(spec, kind, extra: dict, names: dict) -> list:
    """Every point of the front door's spec checked with ``kind.validate`` at ``extra`` (the
    search's start rate), a refusal in one line naming what the user wrote: a refusal of plain
    decoding is one of the flags every configuration shares, told as it is (it names its flag or
    file); another configuration's is led by its name ("EAGLE-3 with k = 2: ...")."""
    points = list(spec.points())
    checked: set = set()
    for p in points:
        try:
            validate_once(kind, {**p.config, **extra}, checked)
        except DraftsimError as exc:
            text = " ".join(str(exc).split())
            name = names.get(p.index, "plain decoding")
            raise DraftsimError(text if name == "plain decoding" else f"{name}: {text}") from None
    return points


def hf_id(name: str) -> str | None:
    """The Hugging Face repo id a catalog model is published under (the first alias with an owner,
    as sim/data/models.json spells it), or None."""
    from importlib import resources

    entry = json.loads((resources.files("draftsim.sim") / "data" / "models.json").read_text())["models"].get(name, {})
    return next((a for a in entry.get("aliases", ()) if "/" in a), None)


def deploy(rec: Recommendation, config, assembly, sched=None) -> dict:
    """The engine configuration that deploys ``rec`` (``config``: its target and tp; ``sched``: the
    scheduler as simulated, default the engine's on the device): the command line of the engine
    the deployment runs (vLLM's ``vllm serve`` with ``--speculative-config``; SGLang's
    ``launch_server``), its scheduler settings as simulated, and the replicas behind a router."""
    from draftsim.sim.cost import default_catalog
    from draftsim.sim.registry import METHODS

    catalog = default_catalog()
    spec = catalog.model(config.target)
    given = str(config.target).strip()
    model = given if "/" in given else hf_id(spec.name) or f"<the Hugging Face id or path of {spec.name}>"  # the user's id first
    engine = assembly.engine.name if assembly.engine is not None else "vllm"
    sched = sched if sched is not None else assembly.scheduler_defaults()
    out: dict = {"engine": assembly.engine.label if assembly.engine is not None else engine, "replicas": rec.replicas,
                 "router": "round-robin over the replicas (as simulated)"}
    method = None if rec.drafter is None else METHODS.get(rec.drafter, METHODS["draft_model"])  # a catalog model: a draft model

    def fill(value):
        if not isinstance(value, str):
            return value
        drafter = None
        if "{drafter}" in value:
            dm = catalog.model(rec.drafter)
            drafter = hf_id(dm.name) or f"<the Hugging Face id or path of {dm.name}>"
        return value.format(target=spec.name, drafter=drafter)

    if engine.startswith("sglang"):
        cmd = ["python", "-m", "sglang.launch_server", "--model-path", model, "--tp", str(config.tp)]
        if method is not None and method.sglang:
            cmd += ["--speculative-algorithm", method.sglang, "--speculative-draft-model-path", fill(dict(method.vllm)["model"]),
                    "--speculative-num-steps", str(rec.k), "--speculative-eagle-topk", "1",
                    "--speculative-num-draft-tokens", str(rec.k + 1)]
        elif method is not None:
            cmd += ["# SGLang's launch flags for this method were not modelled; see its docs"]
        out["command"] = " ".join(shlex.quote(c) if not c.startswith("#") else c for c in cmd)
        return out
    cmd = ["vllm", "serve", model, "--tensor-parallel-size", str(config.tp)]
    if sched is not None:
        cmd += ["--max-num-seqs", str(sched.max_num_seqs), "--max-num-batched-tokens", str(sched.max_num_batched_tokens),
                "--block-size", str(sched.block_size), "--gpu-memory-utilization", f"{sched.gpu_memory_utilization:g}"]
    spec_cfg = None
    if method is not None:
        if not method.vllm:
            raise DraftsimError(f"vLLM's --speculative-config for {method.name} is not modelled; deploy another method")
        spec_cfg = {k: fill(v) for k, v in method.vllm}
        spec_cfg = {**{k: v for k, v in spec_cfg.items() if k in ("method", "model")}, "num_speculative_tokens": rec.k,
                    **{k: v for k, v in spec_cfg.items() if k not in ("method", "model")}}
    if spec_cfg is not None:
        cmd += ["--speculative-config", json.dumps(spec_cfg, separators=(",", ":"))]
        out["speculative_config"] = spec_cfg
    out["command"] = " ".join(shlex.quote(c) for c in cmd)
    return out
