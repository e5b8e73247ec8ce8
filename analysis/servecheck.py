"""The serving simulator held to a real serving run (``draftsim check-serve``).

A serving trace (:mod:`draftsim.realrun.servetrace`) is replayed in the serving simulator
(:func:`draftsim.sim.serving.serve`) with

* the **same workload**: every request's arrival, prompt tokens and output tokens;
* the **acceptance each request realised**: a :class:`draftsim.sim.acceptance.TraceDriven` process with
  one recorded sequence per request (the output after its first token): per round start
  and draft index whether the drafted token was accepted, so a fixed-k replay drafts,
  accepts and emits what the run did round by round;
* the **same policy, controller and scheduler**: the real server's admissions and step
  plans come from the serving simulator's own scheduler
  (:func:`draftsim.realrun.serving.server_scheduler`: ``max_num_seqs`` = the run's
  ``--max-batch``, no token budget, whole-prompt prefills, its queue), so the replay
  schedules what the server scheduled; and the **same cache layout**: one dense ragged
  cache whose width — what a verification attends over — the simulator follows step by step (:mod:`draftsim.sim.serving.layout`, with the server's
  compaction rule from the trace);
* **step costs**: the target's forward time from a ``draftsim profile --path server`` of the
  same model on the same machine (:class:`draftsim.sim.cost.ProfileCost`, the server's own forward
  call, its medians as measured; optionally a second one for the prefills, batch 1 and long
  calls, so that the first can hold every batch size cheaply), or an affine model fitted to the
  forward calls of another serving run of the same model on the same machine
  (``costs_from``: a calibration run, out of sample), or, without either, to the run's own
  calls (in-sample: says how well the *structure* of the simulator fits, not how well it
  predicts) — with a static cache each call at its padded shape, each joiner's prefill at the
  tokens it computes (and, given a draft model's prefill profile, its read of the prompt); a
  neural drafter's calls at the run's mean seconds per call, or (``--draft-profile``) each at its
  shape from a profile of its model (:class:`DraftStepCost`) — plus the server's **measured per-step
  overhead** (its wall time outside model calls, Max-Gram's proposal time, and the loop's
  busy time between steps such as trace commits, :func:`busy_gaps`), fitted as a + b·B over
  the run's steps of B sequences (:class:`StepCost`).

Both runs are summarised by the same function (:func:`draftsim.sim.serving.metrics.summarize_run`):
TTFT, TPOT and end-to-end latency (p50, p90) and throughput, predicted against measured,
relative error = (predicted − measured) / measured.

What the replay cannot follow exactly: policies that stop on the drafter's confidence (the
serving trace keeps each round's counts, not the drafter's confidences), and steps that
prefill while others decode — the real server runs the prefill as a forward call of its
own, the simulator prices the step as one call over all its tokens (:class:`StepCost`
adds the second call's fixed part for such steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..sim.acceptance import TraceDriven
from ..sim.controllers import parse_controller
from ..sim.cost.base import BatchStats, CostModel
from ..sim.cost.linear import CallCost
from ..sim.cost.methods import LOOKUPS
from ..sim.cost.profile import ProfileCost, load_profile, static_new_tokens
from ..sim.errors import DraftsimError
from ..sim.policies import parse_policy
from ..sim.replay import VARIABLE_PROPOSALS, RecordedLengths
from ..sim.serving import ServingConfig, serve
from ..sim.serving.layout import RaggedLayout
from ..sim.serving.metrics import summarize_run
from ..sim.serving.scheduler import SchedulerConfig
from ..sim.serving.workload import Workload

__all__ = ["StepCost", "AffineCost", "robust_nnls", "realised_process", "busy_gaps", "trace_scheduler", "cache_layout", "check_serve",
           "CHECKED"]

#: The metrics check-serve compares: (name, summary key, statistic or None).
CHECKED = (("ttft_p50", "ttft", "p50"), ("ttft_p90", "ttft", "p90"), ("tpot_p50", "tpot", "p50"), ("tpot_p90", "tpot", "p90"),
           ("e2e_p50", "e2e", "p50"), ("e2e_p90", "e2e", "p90"), ("throughput", "throughput", None))


@dataclass(eq=False)
class AffineCost(CostModel):
    """t = a + b·B + c·N + d·P over a call's batch sums (B sequences, N new tokens, P
    query–key pairs in thousands): a forward call's cost fitted to measured calls."""

    a: float
    b: float
    c: float
    d: float
    name: str = "affine fit"

    def _time(self, stats: BatchStats):
        return self.a + self.b * stats.sequences + self.c * stats.tokens + self.d * stats.pairs / 1e3

    def _bound(self, stats: BatchStats):
        return np.where(self.a >= self.c * stats.tokens, 1, 3)

    @classmethod
    def fit(cls, sequences, tokens, pairs, seconds) -> "AffineCost":
        """Non-negative least squares, robust to stalls of a busy machine (:func:`robust_nnls`)."""
        X = np.column_stack([np.ones(len(seconds)), sequences, tokens, np.asarray(pairs) / 1e3])
        return cls(*map(float, robust_nnls(X, np.asarray(seconds, dtype=np.float64))))


def robust_nnls(X: np.ndarray, y: np.ndarray, rounds: int = 3, cut: float = 4.0) -> np.ndarray:
    """Non-negative least squares of y on X with winsorised responses (Huber-like): a point
    more than ``cut`` robust standard deviations (1.4826 MAD) above the fit is pulled down
    to that bound and the fit repeated (``rounds`` times). A stall of the machine then
    counts as a slow call, not as one that drags every coefficient."""
    from scipy.optimize import nnls

    coef, _ = nnls(X, y)
    for _ in range(rounds):
        fit = X @ coef
        res = y - fit
        mad = np.median(np.abs(res - np.median(res))) or np.abs(res).mean() or 1.0
        yw = np.minimum(y, fit + np.median(res) + cut * 1.4826 * mad)
        coef, _ = nnls(X, yw)
    return coef


@dataclass(eq=False)
class StepCost(CostModel):
    """The target's cost in a serving step of the real server (:mod:`draftsim.realrun.serving`):
    ``base`` prices its forward calls, plus the server's own time per step, ``overhead +
    per_sequence``·B.

    With a measured profile (:class:`draftsim.sim.cost.ProfileCost`) and a step that says how it is
    made up (``BatchStats.padded`` and ``prefill``, as the serving simulator's steps do) the
    calls are those the server makes: one verification of the decoding sequences as the
    **right-padded batch** it computes (every row fed the most new tokens of any row, over the
    cache's width: the simulator's :class:`draftsim.sim.serving.RaggedLayout`, set from the trace,
    replays the server's stale slots, trims and compactions; the longest context without
    one), and **one prefill call per joiner** (its prompt at context 0, keeping one logit
    row). Otherwise the step is one call of its sums (mean tokens and context per
    sequence), plus a one-token call for a step of two or more sequences that prefills (more
    tokens than its sequences can verify, ``k_max`` + 1 each).

    The profile answers inside its grid; a call with more new tokens per sequence than the
    grid's largest (a prefill) is priced as the same number of tokens in more sequences of
    the grid's largest size, and a call of more sequences than the grid's largest as that
    call scaled by the ratio (forward time grows linearly in tokens once compute-bound, as
    prefills are).

    **A static cache** (``static_rows``: ``draftsim serve --static-cache``, whose profile is
    ``profile --path server-static``) computes each verification at fixed shapes
    (:mod:`draftsim.realrun.statickv`): the batch padded to the next power of two (up to its
    rows'), the new tokens per row likewise, and attention over the next power of two ≥ the
    longest row after the call (at least 16 slots, at most the cache's). Its time is a step
    function of that shape, so the step is priced at the profile's grid point of the same
    padded shape (the largest such batch, new tokens and context in the grid), not interpolated
    between grid points of different shapes (17 rows between grid batches 16 and 24 run as 32 rows:
    the interpolation gives mostly the 16-row time). A shape the grid holds no point of is
    interpolated as before.
    """

    base: CostModel
    overhead: float
    per_sequence: float
    k_max: int
    name: str = "serving step"
    #: A profile that prices the joiners' prefill calls (default: ``base``): one of batch 1 and
    #: long calls, so that ``base`` needs no long calls at every batch size.
    prefill: ProfileCost | None = None
    #: Prefill profiles of the draft models (``profile --path server-prefill`` of each): a joiner's
    #: prefill also feeds its prompt but the last token to each drafter's cache, in the same timed call.
    drafter_prefills: tuple = ()
    #: A static cache's rows and tokens (``static_tokens``; None: unbounded): its steps are priced at
    #: their padded shapes (see the class docstring). None: a ragged cache.
    static_rows: int | None = None
    static_tokens: int | None = None
    step_shape = True  # reads BatchStats.padded/prefill (a class attribute, not a field)

    def _static(self, B, n, c):
        """The verification of B sequences × n new tokens, the longest at context c, through a static
        cache: the profile at its grid point of the same padded shape, else interpolated at (B, n, c)."""
        B, n, c = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (B, n, c)))
        t = self.base.static_time(B, n, c, max_rows=self.static_rows, max_tokens=self.static_tokens)
        miss = np.isnan(t)
        if miss.any():
            t = np.array(t, dtype=np.float64)
            t[miss] = self._call(B[miss], n[miss], c[miss])
        return t

    def _prefill_tokens(self, n):
        """The tokens a joiner's prefill of ``n`` prompt tokens computes: through a static cache its
        padded count where that fits the cache (:func:`~draftsim.sim.cost.profile.static_new_tokens`,
        the rule ``StaticKV.forward`` runs), so a prompt of 129 tokens is priced as the 256 it
        computes; else ``n``."""
        if not self.static_rows:
            return n
        return static_new_tokens(n, 0.0, self.static_tokens or np.inf)

    def _call(self, S, n, c, rows_per_sequence=None, base=None):
        """A uniform call of S sequences × n new tokens at context c, priced by the profile
        (``base``, default :attr:`base`)."""
        base = base or self.base
        S, n = np.maximum(S, 1.0), np.maximum(n, 1.0)
        n_max, b_max = float(base.new_tokens[-1]), float(base.batch[-1])
        over = n > n_max
        S_eff = np.where(over, S * n / n_max, S)
        scale = np.maximum(S_eff / b_max, 1.0)
        c = np.clip(c, base.context[0], base.context[-1])
        t = base.lookup(np.minimum(S_eff, b_max), np.where(over, n_max, n), c) * scale
        if rows_per_sequence is None:
            return t
        zero = np.zeros(np.shape(t))
        return base.rows_adjusted(t, BatchStats(S + zero, S * n + zero, zero, zero, rows=S * rows_per_sequence + zero))

    def _forward(self, stats: BatchStats):
        if not isinstance(self.base, ProfileCost):
            return self.base.stats_time(stats)
        t = self._call(stats.sequences, stats.mean_new_tokens, stats.mean_context)
        t = self.base.rows_adjusted(t, stats)  # prefills keep one logit row
        return np.where(stats.sequences > 0, t, 0.0)

    def _time(self, stats: BatchStats):
        own = self.overhead + self.per_sequence * stats.sequences
        if isinstance(self.base, ProfileCost) and stats.padded is not None and stats.prefill is not None:
            B, n, c = (stats.padded[..., i] for i in range(3))
            verify = np.where(B > 0, self._static(B, n, c) if self.static_rows else self._call(B, n, c), 0.0)
            joiners, tokens = stats.prefill[..., 0], stats.prefill[..., 1]
            n = tokens / np.maximum(joiners, 1.0)
            each = self._call(1.0, self._prefill_tokens(n), 0.0, rows_per_sequence=1.0, base=self.prefill)
            for d in self.drafter_prefills:  # the drafter reads the prompt but its last token (the first draft feeds that)
                each = each + self._call(1.0, self._prefill_tokens(np.maximum(n - 1.0, 1.0)), 0.0, rows_per_sequence=1.0, base=d)
            prefills = np.where(joiners > 0, joiners * each, 0.0)
            return verify + prefills + own
        t = self._forward(stats) + own
        prefill = (stats.tokens > stats.sequences * (self.k_max + 1)) & (stats.sequences >= 2)
        one = float(self._forward(BatchStats.of_shape(1, 1, 0)))
        return np.where(prefill, t + one, t)

    def _bound(self, stats: BatchStats):
        return np.full(np.shape(stats.tokens), 1)


def beyond_grid(members: list, prof: ProfileCost) -> str:
    """What of a run the profile's grid does not reach: its verifications' longest contexts past the
    grid's largest (priced there by clamping, so under the time a longer attention takes), said in
    the description of the costs ('' when the grid covers the run)."""
    longest: dict = {}
    for m in members:
        if not m.prefill:
            longest[m.step] = max(longest.get(m.step, 0), m.context)  # the cached context, as the profile's axis counts it
    if not longest:
        return ""
    c = np.array(list(longest.values()))
    top = int(prof.context[-1])
    share = float(np.mean(c > top))
    return ("" if share == 0 else f"; {share:.0%} of the verifications attend past the profile's largest context ({top:,}, up to "
            f"{int(c.max()):,}): priced at {top:,}, so under their time (profile --context up to {int(c.max()):,})")



def _rounds(requests: list, members: list):
    """The decoding rounds of each request in order: (its index in id order, output tokens after
    the first emitted before the round, the member record)."""
    index = {r.request: i for i, r in enumerate(sorted(requests, key=lambda r: r.request))}
    emitted = [0] * len(index)
    for m in sorted(members, key=lambda m: (m.step, m.request)):
        i = index.get(m.request)
        if i is None or m.prefill:
            continue
        yield i, emitted[i], m
        emitted[i] += m.emitted


def realised_process(requests: list, members: list, width: int) -> TraceDriven:
    """One recorded sequence per request (in id order): its output after the first token;
    per round start and draft index whether the drafted token was accepted."""
    reqs = sorted(requests, key=lambda r: r.request)
    lengths = [max(r.output_tokens - 1, 1) for r in reqs]
    flags = [np.zeros(n) for n in lengths]
    rounds = [np.full((n, max(width, 1)), np.nan) for n in lengths]
    for i, p, m in _rounds(requests, members):
        for j in range(m.drafted):
            if p + j < lengths[i]:
                flags[i][p + j] = float(j < m.accepted)
                rounds[i][p, j] = float(j < m.accepted)
    return TraceDriven(flags, rounds={(1, 0): rounds})


def realised_lengths(requests: list, members: list) -> list[dict[int, int]]:
    """Per request (in id order), the tokens its drafter proposed at each round start: what a
    lookup drafter proposes is a property of the text (0 where nothing matched), replayed as
    recorded (:class:`draftsim.sim.replay.RecordedLengths`)."""
    out: list[dict[int, int]] = [{} for _ in requests]
    for i, p, m in _rounds(requests, members):
        out[i][p] = int(m.drafted)
    return out


def _rel(pred: float, meas: float) -> float:
    return float((pred - meas) / meas) if meas else float("nan")


def _calls(steps: list, members: list) -> tuple:
    """The target's forward calls of a serving run as (sequences, tokens, pairs, seconds)
    lists: each step's verification call and its prefill calls (grouped per step)."""
    by_step: dict = {}
    for m in members:
        by_step.setdefault(m.step, []).append(m)
    S, N, P, T = [], [], [], []
    for s in steps:
        mine = by_step.get(s.step, [])
        dec = [m for m in mine if not m.prefill]
        pre = [m for m in mine if m.prefill]
        if dec:
            S.append(len(dec))
            N.append(sum(m.new_tokens for m in dec))
            P.append(sum(m.new_tokens * (m.context + (m.new_tokens + 1) / 2) for m in dec))
            T.append(s.target_seconds)
        if pre:
            S.append(len(pre))
            N.append(sum(m.new_tokens for m in pre))
            P.append(sum(m.new_tokens * (m.new_tokens + 1) / 2 for m in pre))
            T.append(s.prefill_seconds)
    return S, N, P, T


def _same_run_setup(meta: dict, other: dict, path) -> None:
    """Raise unless ``other`` (a calibration trace's metadata) has this run's model and machine."""
    for key in ("model", "machine", "threads", "device"):
        if meta.get(key) != other.get(key):
            raise DraftsimError(f"the calibration trace {path} was served with another {key} ({other.get(key)!r}, this run "
                                f"{meta.get(key)!r}); calibrate with a run of the same model on the same machine")


def _tokens(name: str) -> list[str]:
    return ["".join(ch for ch in part if ch.isalnum()) for part in name.lower().replace("-", " ").replace("_", " ").split()]


def _same_gpu_family(gpu: str, hardware: str) -> bool:
    """Whether the device name the run recorded (``NVIDIA H100 80GB HBM3``) is of the catalog
    entry's family (``h100-sxm``: its first term, with a number after it where there is one,
    ``rtx-3090``); variants of one family (SXM, PCIe, 40 or 80 GB) are not told apart."""
    words, terms = set(_tokens(gpu)), _tokens(hardware)
    family = terms[:2] if len(terms) > 1 and terms[1].isdigit() else terms[:1]
    return bool(family) and all(t in words for t in family)


def machine_mismatch(meta: dict, hardware, path) -> str | None:
    """One line when the trace at ``path`` was measured on another machine than ``hardware`` (the
    catalog entry the replay prices it on: a CPU trace on a GPU, a GPU of another family), else
    None: the errors then compare two machines, not the simulator with the run."""
    if hardware is None:
        return None
    machine = meta.get("machine") if isinstance(meta.get("machine"), dict) else {}
    device = str(meta.get("device") or machine.get("device") or "").split(":")[0].lower()
    kind, name = getattr(hardware, "kind", "gpu"), getattr(hardware, "name", str(hardware))
    if not device:
        return None
    if device == "cpu":
        if kind == "cpu":
            return None
        measured = f"a CPU ({machine['cpu']})" if machine.get("cpu") else "a CPU"
    else:
        gpu = machine.get("gpu")
        if kind == "gpu" and (not gpu or _same_gpu_family(str(gpu), name)):
            return None
        measured = f"{gpu} ({device})" if gpu else device
    return (f"serving trace {path} was measured on {measured}, not on the {name} ({kind}) it is priced on: the errors compare two "
            "machines, not the simulator with its run (price it with --profile/--costs-from measured on the run's machine, or "
            f"record the trace on {name})")


def busy_gaps(steps: list, requests: list) -> np.ndarray:
    """Per step, the server's time between its end and the next step's start that was not
    idle: the loop's own work between steps (a trace commit, the progress bar). The server
    idles only with nothing running and nothing arrived; then it sleeps until the next
    arrival, and only what follows that arrival counts."""
    arrival = np.array([r.arrival for r in requests], dtype=np.float64)
    admitted = np.array([r.admitted for r in requests], dtype=np.float64)
    finish = np.array([r.finish for r in requests], dtype=np.float64)
    out = np.zeros(len(steps))
    for i, (a, b) in enumerate(zip(steps, steps[1:])):
        end = a.end
        running = ((admitted <= end) & (finish > end + 1e-9)).any()
        waiting = ((arrival <= end) & (admitted > end)).any()
        if running or waiting:
            out[i] = max(b.start - end, 0.0)
        else:
            later = arrival[arrival > end]
            out[i] = max(b.start - max(end, later.min() if later.size else end), 0.0)
    return out


def _profile_of(meta: dict, path) -> ProfileCost:
    """A profile file of this trace's model and machine, with its medians as measured (a
    server step's padded batch of 16 token rows can cost less than one of 15, see
    :mod:`draftsim.sim.cost.profile`, which a monotone table would price as the dearer one)."""
    prof = load_profile(path, extrapolate="clamp", monotone=False)
    model = meta.get("model", {})
    try:
        prof.check_fingerprint(model={k: model.get(k) for k in ("name", "dtype", "architecture")},
                               machine={k: meta.get("machine", {}).get(k) for k in ("cpu", "cores", "device")})
    except DraftsimError as exc:
        raise DraftsimError(f"the profile {path} does not describe this trace's run: {exc}") from None
    return prof


def _costs(meta: dict, steps: list, members: list, requests: list, profile, k_max: int, costs_from=None, prefill_profile=None):
    """(target cost, description, overhead): a profile of this model and machine (and one for
    the prefills), an affine fit to another serving run's calls (``costs_from``), or an
    in-sample fit."""
    if profile is not None and costs_from is not None:
        raise DraftsimError("give --profile or --costs-from, not both")
    prefill_profiles = [prefill_profile] if isinstance(prefill_profile, (str, Path)) else list(prefill_profile or [])
    if prefill_profiles and profile is None:
        raise DraftsimError("--prefill-profile prices the prefills next to --profile; give --profile too")
    prefill, drafter_prefills = None, []
    if profile is not None:
        base = _profile_of(meta, profile)
        static = (meta.get("cache") or {}).get("layout") == "static"
        if static != (base.path == "server-static"):
            raise DraftsimError(f"the profile {profile} times the {base.path!r} path but the run used "
                                f"{'the static cache (profile --path server-static)' if static else 'the ragged cache (profile --path server)'}")
        if prefill_profiles:
            prefill = _profile_of(meta, prefill_profiles[0])
            drafter_prefills = [_drafter_profile_of(meta, p) for p in prefill_profiles[1:]]
            for p, prof in zip(prefill_profiles, [prefill, *drafter_prefills]):
                if prof.batch[0] != 1 or prof.context[0] != 0 or prof.last_row_seconds is None:
                    raise DraftsimError(f"the prefill profile {p} must start its batch axis at 1 and its context axis at 0 and hold a "
                                        "last-row table (draftsim profile --batch 1 --context 0 ...)")
        paths = {base.path} | {p.path for p in ([prefill] if prefill is not None else []) + drafter_prefills}
        shown = ", ".join(map(str, prefill_profiles))
        what = f"profile {profile}" + (f", prefills from {shown}" if prefill_profiles else "") + (
            "" if paths <= {"server", "server-static", "server-prefill"} else
            " (of the model's own call: the server's forward adds its ragged mask; profile --path server)")
    elif costs_from is not None:
        from ..realrun.servetrace import ServeTrace

        cal = ServeTrace(costs_from)
        cal.require_complete()
        _same_run_setup(meta, cal.metadata, costs_from)
        S, N, P, T = _calls(cal.records("steps"), cal.records("members"))
        if not T:
            raise DraftsimError(f"the calibration trace {costs_from} has no forward calls to fit costs to")
        base, what = AffineCost.fit(S, N, P, T), f"affine fit to the forward calls of {costs_from}"
    else:
        S, N, P, T = _calls(steps, members)
        if not T:
            raise DraftsimError("the serving trace has no forward calls to fit costs to")
        base, what = AffineCost.fit(S, N, P, T), "affine fit to this run's forward calls (in-sample)"
    # the server's own time per step (Max-Gram's proposals included, and the time between
    # this step and the next that was not spent waiting for an arrival), a + b·B
    statistical = meta.get("drafter") in LOOKUPS
    B = np.array([s.batch + s.prefills for s in steps], dtype=np.float64)
    own = np.array([s.overhead_seconds + (s.draft_seconds if statistical else 0.0) for s in steps]) + busy_gaps(steps, requests)
    a, b = robust_nnls(np.column_stack([np.ones(len(B)), B]), own)
    cache = meta.get("cache") or {}
    static = {}
    if profile is not None and cache.get("layout") == "static":  # priced at its padded shapes (StepCost)
        static = {"static_rows": int(meta["max_batch"]), "static_tokens": cache.get("static_tokens")}
    return (StepCost(base, max(float(a), 0.0), max(float(b), 0.0), k_max, prefill=prefill, drafter_prefills=tuple(drafter_prefills),
                     **static), what,
            {"per_step": max(float(a), 0.0), "per_sequence": max(float(b), 0.0)})


def _drafter_profile_of(meta: dict, path, what: str = "after the target's, a --prefill-profile prices the drafter's prompt "
                        "read") -> ProfileCost:
    """A profile of the run's draft model (a controlled drafter's cost model, a draft model),
    measured on this run's machine: of its prefills, it prices the drafter's read of each joiner's
    prompt, which the server times inside the joiner's prefill (``Server._prefill``); of the
    server's path, the drafter's batched calls (``--draft-profile``)."""
    from ..sim.replay import seeded

    prof = load_profile(path, extrapolate="clamp", monotone=False)
    spec = str(meta.get("drafter") or "")
    model = spec.partition("@")[2] if spec.startswith("controlled") else "" if spec in LOOKUPS else spec
    if not model or seeded(prof.model) != seeded(model):
        raise DraftsimError(f"the profile {path} is of {prof.model}; {what} and must be of its model "
                            f"({model or f'this run drafts with {spec or None}, which has none'})")
    try:
        prof.check_fingerprint(machine={k: meta.get("machine", {}).get(k) for k in ("cpu", "cores", "device")})
    except DraftsimError as exc:
        raise DraftsimError(f"the profile {path} does not describe this trace's run: {exc}") from None
    return prof


@dataclass(eq=False)
class DraftStepCost(StepCost):
    """A neural drafter's batched calls priced by a server-path profile of its model
    (``check-serve --draft-profile``): each call at its padded shape through a static cache (the
    window hands a ``step_shape`` drafter its calls' make-up, :func:`draftsim.sim.serving.window.draft_shape`),
    at its longest context through a ragged one, as :class:`StepCost` prices the target's
    verification. Its read of each prompt is priced with the target's prefills (a second
    ``--prefill-profile``), so it takes no prefill chunks (``own_prefill``). On the H200 a
    0.5B drafter's call cost 3.8 ms at one row and 17 ms at 17-32 rows, where the run's mean per
    call is 5.6 ms (figures/gpu-h200, third lease)."""

    name: str = "draft call"
    own_prefill = False  # a class attribute, not a field


def _drafter_cost(meta: dict, steps: list, draft_profile=None, k_max: int = 1) -> CostModel:
    """Lookup drafters (maxgram, bigram, ngram, suffix) cost nothing here (their time is in the step overhead); a neural
    drafter costs its measured seconds per batched call (one call per draft position), or with ``draft_profile`` each call
    as the profile of its model prices that call's shape (:class:`DraftStepCost`)."""
    if draft_profile is not None:
        prof = _drafter_profile_of(meta, draft_profile, "--draft-profile prices the drafter's batched calls")
        cache = meta.get("cache") or {}
        static = cache.get("layout") == "static"
        want = "server-static" if static else "server"
        if prof.path != want:
            raise DraftsimError(f"the draft profile {draft_profile} times the {prof.path!r} path but this run's drafter calls go "
                                f"through {'the static cache' if static else 'the ragged cache'} (draftsim profile --path {want})")
        shape = {"static_rows": int(meta["max_batch"]), "static_tokens": cache.get("static_tokens")} if static else {}
        return DraftStepCost(prof, 0.0, 0.0, k_max, **shape)
    if meta.get("drafter") is None or meta.get("drafter") in LOOKUPS:
        return CallCost(0.0)
    calls = sum(s.k_cap for s in steps if s.k_cap > 0)
    secs = sum(s.draft_seconds for s in steps)
    return CallCost(secs / calls if calls else 0.0)


def cache_layout(meta: dict, path) -> RaggedLayout | None:
    """The real server's cache layout as its trace records it (traces written before it was
    recorded ran with :class:`RaggedLayout`'s defaults, the only values the server had then).
    A static cache (``draftsim serve --static-cache``) keeps its rows compact, no stale slots:
    None, each sequence priced at its own context."""
    cache = meta.get("cache") or {}
    if not isinstance(cache, dict):
        raise DraftsimError(f"serving trace {path}: metadata field 'cache' is {cache!r:.40}; an object or null is valid")
    if cache.get("layout") == "static":
        return None
    if cache.get("layout", "ragged") != "ragged":
        raise DraftsimError(f"serving trace {path}: cache layout {cache.get('layout')!r} is not one check-serve knows (ragged, static)")
    try:
        return RaggedLayout(float(cache.get("compact_ratio", RaggedLayout.compact_ratio)),
                            int(cache.get("compact_min", RaggedLayout.compact_min)))
    except (TypeError, ValueError) as err:
        raise DraftsimError(f"serving trace {path}: cache {cache!r}: {err}") from None


def trace_scheduler(meta: dict, path) -> SchedulerConfig:
    """The scheduler the real server ran (:func:`draftsim.realrun.serving.server_scheduler`, with
    the trace's batch limit and queue; traces written before the queue was recorded ran FCFS)."""
    from ..realrun.serving import server_scheduler

    try:
        return server_scheduler(int(meta["max_batch"]), meta.get("scheduling", "fcfs"), int(meta.get("block_size") or 16))
    except (TypeError, ValueError) as err:
        raise DraftsimError(f"serving trace {path}: {err}") from None


def trace_priorities(meta: dict, by_id: list, path) -> np.ndarray:
    """Each request's priority class as the server had it (the fourth field of the metadata's
    requests; 0 in traces written before priorities were recorded)."""
    rows = meta.get("requests") or []
    try:
        return np.array([int(rows[r.request][3]) if r.request < len(rows) and len(rows[r.request]) > 3 else 0 for r in by_id],
                        dtype=np.int64)
    except (TypeError, ValueError, IndexError) as err:
        raise DraftsimError(f"serving trace {path}: the metadata's requests hold no valid priority ({err})") from None


def _metadata(meta: dict, path) -> dict:
    """The serving trace's metadata fields check-serve reads, typed and ranged: a hand-edited
    manifest is refused in one line naming the trace and the field, never a KeyError."""
    def show(v):
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    def bad(key, valid):
        raise DraftsimError(f"serving trace {path}: metadata field '{key}' is {show(meta.get(key))}; {valid} is valid")

    for key in ("policy", "max_batch"):
        if meta.get(key) is None:
            raise DraftsimError(f"serving trace {path}: metadata field '{key}' is missing (draftsim serve writes it)")
    if not isinstance(meta["policy"], str):
        bad("policy", "a policy such as 'fixed:k=3'")
    for key in ("drafter", "controller", "scheduling", "target"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            bad(key, "a name (a string) or null")
    for key in ("cache", "model", "machine", "sampling"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            bad(key, "an object or null")
    for key, required in (("max_batch", True), ("block_size", False), ("kv_tokens", False)):
        v = meta.get(key)
        if (v is not None or required) and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 30):
            bad(key, f"a whole number from 1 to {1 << 30:,}")
    for key, parse in (("policy", parse_policy), ("controller", parse_controller)):  # the parser's line, with the trace's name
        try:
            parse(meta.get(key) or "none")
        except DraftsimError as exc:
            raise DraftsimError(f"serving trace {path}: metadata field '{key}': {exc}") from None
    policy = parse_policy(meta["policy"])
    if policy.kind != "chain" or policy.n_models > 2:
        bad("policy", "a chain policy of at most one drafter (ar, fixed, heuristic, confidence, threshold: what draftsim serve runs)")
    return meta


def check_serve(path, profile=None, seed: int = 0, costs_from=None, prefill_profile=None, models=None, draft_profile=None) -> dict:
    """Replay the serving trace at ``path`` in the serving simulator and compare (module docstring).
    ``models`` = (target, drafters, description): cost models to price the run with instead of
    measurements of it (the catalog rooflines with their engine overheads: what serve-sim
    predicts for the deployment without a profile); nothing is fitted to the run then."""
    if models is not None and (profile is not None or costs_from is not None or draft_profile is not None):
        raise DraftsimError("give the catalog deployment (--hardware) or measured costs (--profile, --costs-from, --draft-profile), "
                            "not both")
    from ..realrun.servetrace import ServeTrace, run_record

    trace = ServeTrace(path)
    trace.require_complete()
    meta = _metadata(trace.metadata, path)
    steps, members, reqs, tokens = (trace.records(t) for t in ("steps", "members", "requests", "tokens"))
    if not reqs:
        raise DraftsimError(f"serving trace {path} holds no finished request")
    measured_run = run_record(reqs, tokens, members, steps)
    measured = summarize_run(measured_run, steady=False)  # the same requests on both sides: the whole run
    policy = parse_policy(meta["policy"])
    if policy.kind == "chain" and meta.get("drafter") in VARIABLE_PROPOSALS:  # a lookup: its proposals as recorded
        policy = RecordedLengths(realised_lengths(reqs, members), meta["policy"], k_max=policy.max_draft)
    controller = parse_controller(meta.get("controller") or "none")
    width = max([m.drafted for m in members] + [policy.max_draft, 1])
    process = realised_process(reqs, members, width)
    warnings = []
    if models is not None:
        target, drafters, what = models
        overhead = None
        mismatch = machine_mismatch(meta, getattr(target, "hardware", None), path)
        if mismatch:
            warnings.append(mismatch)
        if len(drafters) < policy.n_models - 1:
            raise DraftsimError(f"serving trace {path} drafts with {meta.get('drafter')}: give --drafter-model, the catalog model that "
                                "prices its forwards")
        drafters = list(drafters)[: policy.n_models - 1]
    else:
        target, what, overhead = _costs(meta, steps, members, reqs, profile, policy.max_draft, costs_from, prefill_profile)
        drafters = [_drafter_cost(meta, steps, draft_profile, policy.max_draft)] * (policy.n_models - 1)
        if draft_profile is not None:
            what += f"; the drafter's calls from {draft_profile}"
        if isinstance(target.base, ProfileCost):
            what += beyond_grid(members, target.base)
    by_id = sorted(reqs, key=lambda r: r.request)
    kv_tokens = meta.get("kv_tokens")
    if kv_tokens is None and models is not None:  # the server ran without a pool: one no request can fill, not the hardware's
        sched = trace_scheduler(meta, path)
        kv_tokens = sum(r.prompt_tokens + r.output_tokens + policy.max_draft + 1 + sched.block_size for r in reqs)
    cfg = ServingConfig(policy, process, target, drafters, controller=controller, scheduler=trace_scheduler(meta, path),
                        layout=cache_layout(meta, path), kv_tokens=int(kv_tokens) if kv_tokens is not None else None)
    wl = Workload(np.array([r.arrival for r in by_id]), np.array([r.prompt_tokens for r in by_id], dtype=np.int64),
                  np.array([r.output_tokens for r in by_id], dtype=np.int64), trace_priorities(meta, by_id, path))
    predicted_run = serve(cfg, wl, seed=seed)
    predicted = summarize_run(predicted_run, steady=False)
    rows = []
    for name, key, stat in CHECKED:
        p = predicted[key] if stat is None else predicted[key][stat]
        m = measured[key] if stat is None else measured[key][stat]
        rows.append({"metric": name, "predicted": float(p), "measured": float(m), "relative_error": _rel(p, m),
                     **({"warning": warnings[0]} if warnings else {})})  # --json prints the rows alone: each carries it
    if warnings:  # the text output's header is the costs line: the warning a line of its own under it
        what += "".join(f"\nwarning: {line}" for line in warnings)
    return {"path": str(Path(path)), "target": meta.get("target"), "drafter": meta.get("drafter"), "policy": meta.get("policy"),
            "controller": meta.get("controller"), "requests": len(reqs), "costs": what, "overhead": overhead, "metrics": rows,
            "predicted": predicted, "measured": measured,
            "preemptions": {"predicted": predicted_run.preemptions.tolist(), "measured": measured_run.preemptions.tolist()},
            **({"warnings": warnings} if warnings else {})}


#: The metrics a ``vllm bench serve`` result and the simulator's summary share: (row, the
#: result's key (seconds), the summary's metric and statistic).
VLLM_CHECKED = (("ttft_mean", "mean_ttft", "ttft", "mean"), ("ttft_p50", "median_ttft", "ttft", "p50"),
                ("ttft_p99", "p99_ttft", "ttft", "p99"), ("tpot_mean", "mean_tpot", "tpot", "mean"),
                ("tpot_p50", "median_tpot", "tpot", "p50"), ("itl_p50", "median_itl", "itl", "p50"),
                ("e2e_mean", "mean_e2el", "e2e", "mean"))


#: The most requests check-serve replays from a ``vllm bench serve`` result (a replay of 100,000
#: requests took 20 s on this repository's 2-core CPU; a larger run is a sample of the same workload: save a shorter one).
MAX_VLLM_REPLAY = 100_000


def vllm_workload(bench, seed: int = 0) -> Workload:
    """The workload a ``vllm bench serve`` run sent (its successful requests, in the order sent):
    their lengths, arriving when the client meant to send them — the recorded start times less
    the time each waited for the client's concurrency cap (``queue_times``), when saved — else all
    at once (request rate inf), else at the run's request rate with gamma gaps of its
    ``burstiness`` (vLLM's ``get_request``; 1: Poisson) drawn with ``seed``. The cap itself is
    applied by the replay (:func:`check_vllm`)."""
    if not bench.detailed:
        raise DraftsimError(f"{bench.source}: per-request lengths are missing; save the run with --save-detailed")
    n = bench.completed
    if n > MAX_VLLM_REPLAY:
        raise DraftsimError(f"{bench.source}: field 'completed' is {n:,}; check-serve replays at most {MAX_VLLM_REPLAY:,} requests "
                            "(save a shorter run: vllm bench serve --num-prompts)")
    if bench.start_times is not None:
        sent = bench.start_times - (bench.queue_times if bench.queue_times is not None else 0.0)
        arrival = sent - sent.min()
        order = np.argsort(arrival, kind="stable")
    else:
        if bench.ramp_up is not None:
            raise DraftsimError(f"{bench.source}: field 'ramp_up_strategy' is {bench.ramp_up!r} and 'start_times' is missing: the "
                                "arrivals of a ramped run are not its request_rate; save the run with a vLLM that writes start_times")
        if np.isinf(bench.request_rate):
            arrival = np.zeros(n)
        else:
            rng = np.random.default_rng([seed, 5])
            b = bench.burstiness
            gaps = rng.exponential(1.0 / bench.request_rate, n) if b == 1.0 else rng.gamma(b, 1.0 / (bench.request_rate * b), n)
            arrival = np.cumsum(gaps)
            arrival -= arrival[0]
        order = np.arange(n)
    prompt = np.maximum(bench.input_lens.astype(np.int64), 1)
    output = np.maximum(bench.output_lens.astype(np.int64), 1)
    return Workload(arrival[order], prompt[order], output[order], np.zeros(n, dtype=np.int64))


def check_vllm(bench, config: ServingConfig, seed: int = 0) -> dict:
    """Replay a ``vllm bench serve`` run's workload (:func:`vllm_workload`) on ``config``, at most
    ``max_concurrency`` requests in flight as the run's client allowed (vLLM's TTFT is timed from
    the send, after the client's queue, and so is the replay's), and compare the simulator's
    metrics with the run's own, per metric the file measured (non-zero)."""
    wl = vllm_workload(bench, seed)
    # vllm bench serve measures the whole run (every request, its drain): so does the replay
    predicted = summarize_run(serve(config, wl, seed=seed, max_in_flight=bench.max_concurrency), steady=False)
    rows = []
    for name, key, metric, stat in VLLM_CHECKED:
        if key in bench.metrics:
            p, m = float(predicted[metric][stat]), float(bench.metrics[key])
            rows.append({"metric": name, "predicted": p, "measured": m, "relative_error": _rel(p, m)})
    measured_tp = float(bench.output_lens.sum() / bench.duration)
    rows.append({"metric": "throughput", "predicted": float(predicted["throughput"]), "measured": measured_tp,
                 "relative_error": _rel(float(predicted["throughput"]), measured_tp)})
    for row in rows:
        if not (np.isfinite(row["predicted"]) and np.isfinite(row["relative_error"])):
            raise DraftsimError(f"{bench.source}: the replay gives no {row['metric']} to compare with the file's "
                                f"{row['measured']:.6g} (predicted {row['predicted']:.6g}); the run's requests are too short to measure it")
    drafter = ", ".join(getattr(d, "name", "?") for d in config.drafters) or None
    return {"path": bench.source, "target": getattr(config.target, "name", None), "drafter": drafter, "policy": repr(config.policy),
            "controller": repr(config.controller), "requests": bench.completed, "costs": getattr(config.target, "name", "?"),
            "max_concurrency": bench.max_concurrency, "failed": bench.failed,
            "metrics": rows, "predicted": predicted, "measured": {"duration": bench.duration, **bench.metrics}}
