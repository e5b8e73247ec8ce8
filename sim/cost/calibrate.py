"""A hardware entry's efficiency factors and overhead fitted to the user's own step times.

The roofline (:mod:`~draftsim.sim.cost.roofline`) prices a forward call from the catalog's peak
FLOP/s and bandwidth, scaled by the entry's model-FLOP utilisation (``mfu``) and memory
bandwidth utilisation (``mbu``), plus a fixed ``overhead`` per call. :func:`calibrate` fits those
three to measured calls of one model — (batch, new tokens per sequence, cached context,
seconds) points, from a ``draftsim profile`` file, a table of step times or a ``vllm bench
serve`` result (:mod:`draftsim.sim.vllm_bench`) — by least squares on the logarithm of the time
(relative errors count alike at every size), and reports the fit's error on the points it used
and on points it held out (every m-th point, m = round(1 / holdout)), beside the catalog's
defaults on the same points. The fitted entry keeps the catalog entry's peaks, memory and
interconnect, and says in its ``source`` and ``measured["calibration"]`` what it was fitted to.
Its overhead holds the measured engine's per-step costs, so it is priced without engine
overheads (``--overheads none``; :func:`~draftsim.sim.cost.assembly.assemble` refuses another).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..errors import DraftsimError
from .catalog import HardwareSpec, ModelSpec
from .roofline import RooflineModel

__all__ = ["StepPoints", "Calibration", "calibrate", "points_from_profile", "points_from_table", "points_from_vllm", "MAX_SHAPE"]

#: The largest batch, new tokens or context of a measured call (2^24: beyond any context window).
MAX_SHAPE = 1 << 24


@dataclass(frozen=True)
class StepPoints:
    """Measured calls: batch, new tokens per sequence, cached context per sequence and seconds
    (1-D arrays of one length), and where they come from."""

    batch: np.ndarray
    new_tokens: np.ndarray
    context: np.ndarray
    seconds: np.ndarray
    source: str

    def __post_init__(self):
        n = len(self.seconds)
        if any(len(a) != n for a in (self.batch, self.new_tokens, self.context)):
            raise DraftsimError(f"{self.source}: measured calls need batch, new tokens, context and seconds of one length each")
        for name, arr, low, whole, valid in (
                ("batch", self.batch, 1, True, f"whole numbers from 1 to {MAX_SHAPE:,}"),
                ("new_tokens", self.new_tokens, 1, True, f"whole numbers from 1 to {MAX_SHAPE:,}"),
                ("context", self.context, 0, True, f"whole numbers from 0 to {MAX_SHAPE:,}"),
                ("seconds", self.seconds, 0, False, "finite numbers > 0")):
            arr = np.asarray(arr, dtype=np.float64)
            ok = np.isfinite(arr) & (arr >= low)
            ok &= (arr > 0) if name == "seconds" else (arr <= MAX_SHAPE)
            if whole:
                ok &= arr == np.floor(np.where(np.isfinite(arr), arr, 0.0))
            if not ok.all():
                i = int(np.argmin(ok))
                raise DraftsimError(f"{self.source}: column '{name}' holds {float(arr[i])!r} at row {i + 1}; {valid} are valid")

    def __len__(self) -> int:
        return len(self.seconds)

    def take(self, idx) -> "StepPoints":
        return StepPoints(self.batch[idx], self.new_tokens[idx], self.context[idx], self.seconds[idx], self.source)


def points_from_profile(profile) -> StepPoints:
    """Every grid point of a measured profile (:class:`~draftsim.sim.cost.profile.ProfileCost`)."""
    B, N, C = np.meshgrid(profile.batch, profile.new_tokens, profile.context, indexing="ij")
    return StepPoints(B.ravel().astype(float), N.ravel().astype(float), C.ravel().astype(float),
                      np.asarray(profile.seconds, dtype=float).ravel(), f"profile of {profile.model}")


def points_from_table(rows: list[dict], source: str) -> StepPoints:
    """Rows with ``batch``, ``new_tokens``, ``context`` and ``seconds`` (a CSV's or a JSON list's)."""
    cols = {}
    for key in ("batch", "new_tokens", "context", "seconds"):
        try:
            cols[key] = np.array([float(r[key]) for r in rows])
        except KeyError:
            raise DraftsimError(f"{source}: every row needs batch, new_tokens, context and seconds; a row lacks {key}") from None
        except (TypeError, ValueError):
            raise DraftsimError(f"{source}: column {key} must hold numbers") from None
    return StepPoints(cols["batch"], cols["new_tokens"], cols["context"], cols["seconds"], source)


def points_from_vllm(results: list) -> StepPoints:
    """Calls read off plain (non-speculative) ``vllm bench serve`` runs
    (:class:`draftsim.sim.vllm_bench.VllmBench`, per-request lengths saved): per run a decode
    step at its mean concurrency (Little's law) and mean context (prompt + half the output, in whole tokens)
    taking its median inter-token latency, and where at most 1.5 requests were in flight on
    average its prefill (batch 1, the mean prompt) taking its median TTFT. Several runs at
    several rates give the fit its range."""
    rows = []
    for r in results:
        if not r.detailed:
            raise DraftsimError(f"{r.source}: per-request lengths are missing; save the run with --save-detailed")
        itl = r.metrics.get("median_itl") or r.metrics.get("mean_tpot")
        if not itl:
            raise DraftsimError(f"{r.source}: no median_itl_ms or mean_tpot_ms to fit a decode step to")
        conc = max(1.0, r.mean_concurrency())
        if conc > r.completed * (1 + 1e-6):
            raise DraftsimError(f"{r.source}: fields 'mean_e2el_ms' (or 'mean_ttft_ms', 'mean_tpot_ms' and 'output_lens') and "
                                f"'duration' give {conc:.4g} requests in flight on average (Little's law), more than the "
                                f"{r.completed:,} completed; they disagree")
        prompt, out = float(r.input_lens.mean()), float(r.output_lens.mean())
        rows.append((round(conc), 1.0, round(prompt + out / 2), itl))  # whole tokens: a mean prompt of 544.67 is 545
        if conc <= 1.5 and r.metrics.get("median_ttft"):
            rows.append((1.0, max(round(prompt), 1.0), 0.0, r.metrics["median_ttft"]))
    b, n, c, t = (np.array(x, dtype=float) for x in zip(*rows))
    return StepPoints(b, n, c, t, f"{len(results)} vllm bench serve result(s)")


@dataclass
class Calibration:
    """A fitted hardware entry and how well it fits: relative errors (predicted / measured − 1)
    of the fit and of the catalog's defaults, on the points fitted and on those held out."""

    hardware: HardwareSpec
    mfu: float
    mbu: float
    overhead: float
    fitted: int
    held_out: int
    errors: dict  #: {"fit": {...}, "held_out": {...}, "default_fit": {...}, "default_held_out": {...}}

    def to_dict(self) -> dict:
        return {"hardware": self.hardware.name, "mfu": self.mfu, "mbu": self.mbu, "overhead_s": self.overhead,
                "points_fitted": self.fitted, "points_held_out": self.held_out, "errors": self.errors}


def _errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    if not len(meas):
        return {"median_abs": None, "worst_abs": None}
    rel = pred / meas - 1.0
    return {"median_abs": float(np.median(np.abs(rel))), "worst_abs": float(np.max(np.abs(rel)))}


def calibrate(model: ModelSpec, hardware: HardwareSpec, points: StepPoints, *, dtype: str = "bfloat16", tp: int = 1,
              holdout: float = 0.25, name: str | None = None) -> Calibration:
    """Fit ``hardware``'s mfu, mbu and per-call overhead to ``points`` of ``model`` (see the module
    docstring); ``holdout`` ∈ [0, 0.5] of the points are kept out of the fit and scored."""
    from scipy.optimize import least_squares

    if not 0.0 <= holdout <= 0.5:
        raise DraftsimError(f"--holdout must lie in [0, 0.5]; got {holdout:g}")
    n = len(points)
    if n < 3:
        raise DraftsimError(f"{points.source}: a calibration fits 3 parameters and needs at least 3 measured calls; got {n}")
    every = int(round(min(1.0 / holdout, n + 1.0))) if holdout > 0 else 0  # beyond n: none held out (and no overflow)
    held = np.zeros(n, dtype=bool)
    if every:
        held[every - 1::every] = True
    if n - held.sum() < 3:
        raise DraftsimError(f"{points.source}: {n - int(held.sum())} points left to fit after holding {int(held.sum())} out; give more points or a smaller --holdout")
    fit, test = points.take(~held), points.take(held)
    shapes = len({(float(b), float(k), float(c)) for b, k, c in zip(np.ravel(fit.batch), np.ravel(fit.new_tokens), np.ravel(fit.context))})
    if shapes < 3:
        # the same call measured again tells memory time from compute time from overhead no better: three parameters fitted
        # to one or two shapes match them exactly (a 0.0% error reported, exit 0) whatever the hardware
        raise DraftsimError(f"{points.source}: the calls to fit hold {shapes} distinct shape{'s' if shapes != 1 else ''} (batch, new tokens, "
                            "context); a calibration fits 3 parameters and needs at least 3 (measure other batch sizes or contexts)")

    def model_at(mfu, mbu, overhead):
        return RooflineModel(model, hardware, dtype, tp, mfu=mfu, mbu=mbu, overhead=overhead, overhead_per_layer=0.0, check_memory=False)

    def predict(m: RooflineModel, p: StepPoints) -> np.ndarray:
        return np.asarray(m.shape_time(p.batch, p.new_tokens, p.context), dtype=float).reshape(-1)

    def residuals(x):
        with np.errstate(all="ignore"):
            return np.log(predict(model_at(x[0], x[1], x[2]), fit)) - np.log(fit.seconds)

    x0 = np.array([hardware.mfu, hardware.mbu, min(max(hardware.overhead, 0.0), float(fit.seconds.min()))])
    lo, hi = np.array([1e-3, 1e-3, 0.0]), np.array([1.0, 1.0, float(fit.seconds.max())])
    # the slowest and fastest factors the fit may try must price every call finitely (a denormal
    # bandwidth in a catalog prices a call as infinite seconds: least squares on non-finite residuals)
    for corner in (lo, hi):
        if not np.all(np.isfinite(residuals(corner))):
            raise DraftsimError(
                f"hardware {hardware.name!r}: its peaks (memory_bandwidth {hardware.memory_bandwidth:g} B/s, peak FLOP/s "
                f"{float(hardware.peak_flops.get(dtype, 0.0)):g} for {dtype}) price {model.name}'s calls as non-finite or zero seconds at "
                "utilisations in [0.001, 1]; a calibration starts from an entry whose peaks price them finitely")
    best = None
    for start in (x0, np.array([0.3, 0.5, float(fit.seconds.min()) / 2])):  # two starts: the fit is not convex
        try:
            res = least_squares(residuals, np.clip(start, lo, hi), bounds=(lo, hi),
                                x_scale=np.array([0.1, 0.1, max(fit.seconds.min(), 1e-6)]))
        except ValueError as exc:  # residuals that turn non-finite inside the bounds
            raise DraftsimError(f"{points.source}: the fit of {hardware.name!r} failed ({exc})") from None
        if best is None or res.cost < best.cost:
            best = res
    mfu, mbu, overhead = (float(v) for v in best.x)
    fitted_model, default = model_at(mfu, mbu, overhead), RooflineModel(model, hardware, dtype, tp, check_memory=False)
    errors = {"fit": _errors(predict(fitted_model, fit), fit.seconds), "held_out": _errors(predict(fitted_model, test), test.seconds),
              "default_fit": _errors(predict(default, fit), fit.seconds),
              "default_held_out": _errors(predict(default, test), test.seconds)}
    calibration = {"model": model.name, "fitted_to": points.source, "calls": len(fit), "dtype": dtype, "tp": tp,
                   "median_error": errors["fit"]["median_abs"]}
    entry = dataclasses.replace(
        hardware, name=name or f"{hardware.name}-calibrated", mfu=mfu, mbu=mbu, overhead=overhead, overhead_per_layer=0.0,
        measured={**hardware.measured, "calibration": calibration},
        source=f"{hardware.source}; calibrated by draftsim calibrate: mfu {mfu:.3g}, mbu {mbu:.3g}, overhead {overhead * 1e6:.1f} us per "
               f"call fitted to {len(fit)} calls of {model.name} ({points.source}), median error {errors['fit']['median_abs']:.1%}")
    return Calibration(entry, mfu, mbu, overhead, len(fit), len(test), errors)
