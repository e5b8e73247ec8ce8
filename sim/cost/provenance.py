"""How each model of an assembly is priced, as a typed record (:class:`Pricing`).

:func:`pricing` reads it from the cost models an :class:`~draftsim.sim.cost.assembly.Assembly`
holds — their classes and fields, never the text of ``info["backends"]`` — and from the
:class:`~draftsim.sim.cost.assembly.Deployment` that named them, one record per model in the
deployment's order (the target, each drafter, and the target of a server that does not
speculate where the engine prices it apart). Reports and tools decide from ``kind``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .assembly import Assembly, Deployment
from .base import CostModel
from .linear import CallCost
from .methods import CappedContext, HeadCost, Lookup, OperatorHead
from .operators import OperatorModel
from .profile import ProfileCost
from .roofline import RooflineModel

__all__ = ["KINDS", "Pricing", "pricing", "kind_of"]

#: How a model may be priced: the catalog roofline, measured operator tables, a measured
#: profile, the roofline on hardware calibrated to measured steps (a fit), a constant per call
#: and token, nothing (a lookup drafter without a measured proposal time), or a cost model
#: none of these (a caller's own).
KINDS = ("roofline", "operators", "profile", "fit", "linear", "free", "other")


@dataclass(frozen=True)
class Pricing:
    """One model of a deployment and how it is priced.

    ``role``: "target", "drafter 1", … or "target without speculation"; ``name``: the model as
    the deployment names it (``--target``, ``--drafter-model``); ``kind``: one of :data:`KINDS`;
    ``model``: the cost model's own name (what it prices, on which devices, with which engine's
    overheads); ``catalog``: the catalog model it prices (None: a profile, a head, a lookup);
    ``engine``, ``hardware``, ``dtype``: the deployment's; ``tp``: the devices its call is split
    over (None: it runs on the host, a lookup); ``requested_tp``: the devices the deployment asked
    for (a draft model whose heads do not split over them runs at tp 1); ``fitted_to``: the
    measurements calibrated hardware was fitted to (kind ``fit``); ``proposal_seconds``: a lookup's
    measured proposal time per token; ``on_target_devices``: a drafting head (or the target over a
    window of its cache) sharing the target's devices."""

    role: str
    name: str
    kind: str
    model: str
    catalog: str | None
    engine: str
    hardware: str
    dtype: str
    tp: int | None
    requested_tp: int | None = None
    fitted_to: str | None = None
    proposal_seconds: float | None = None
    on_target_devices: bool = False

    @property
    def measured(self) -> bool:
        """Whether its times come from measurements of this model (a profile) or of the kernels it
        runs (operator tables)."""
        return self.kind in ("profile", "operators")

    def describe(self) -> str:
        """One line: how the model is priced."""
        if self.kind == "free":
            return "lookup, free (no profile with its proposal timing)"
        if self.proposal_seconds is not None:
            return f"lookup, measured proposal time {self.proposal_seconds * 1e6:.4g} µs per token (profile)"
        note = ""
        if self.tp is not None and self.requested_tp is not None and self.tp != self.requested_tp:
            note = f" (at tp {self.tp}: its heads do not split over {self.requested_tp} devices)"
        where = ", on the target's devices" if self.on_target_devices else ""
        return f"{self.kind}{where}: {self.model}{note}"


def _inner(model: CostModel) -> CostModel:
    return _inner(model.inner) if isinstance(model, CappedContext) else model


def kind_of(model: CostModel, calibrated: bool) -> str:
    """The :data:`KINDS` entry of one cost model (``calibrated``: its hardware was fitted to
    measured steps)."""
    model = _inner(model)
    if isinstance(model, ProfileCost):
        return "profile"
    if isinstance(model, (OperatorModel, OperatorHead)):
        return "operators"
    if isinstance(model, (RooflineModel, HeadCost)):
        return "fit" if calibrated else "roofline"
    if isinstance(model, Lookup):
        return "profile" if model.a > 0 or model.b > 0 else "free"  # a lookup costs something only where a profile timed it
    if isinstance(model, CallCost):
        return "linear"
    return "other"


def _record(role: str, name: str, model: CostModel, assembly: Assembly, d: Deployment, requested_tp: int | None) -> Pricing:
    hw = assembly.hardware
    calibration = hw.calibration if hw is not None else None
    kind = kind_of(model, calibration is not None)
    inner = _inner(model)
    head = isinstance(inner, HeadCost)
    if isinstance(inner, RooflineModel):
        catalog, dtype, tp = inner.model.name, inner.dtype, inner.tp
    elif isinstance(inner, ProfileCost):
        catalog, dtype, tp = None, inner.dtype, 1
    elif isinstance(inner, Lookup):
        catalog, dtype, tp = None, d.dtype, None
    else:  # a head on the target's devices, or a caller's model
        catalog, dtype, tp = None, d.dtype, d.tp if head else None
    return Pricing(role, name, kind, getattr(model, "name", type(model).__name__), catalog,
                   assembly.engine.name if assembly.engine is not None else "none", hw.name if hw is not None else d.hardware, dtype, tp,
                   requested_tp if isinstance(inner, RooflineModel) and not head else None,
                   (calibration or {}).get("fitted_to") if kind == "fit" else None,
                   float(inner.b) if isinstance(inner, Lookup) and kind == "profile" else None, head or model is not inner)


def pricing(assembly: Assembly, deployment: Deployment) -> tuple[Pricing, ...]:
    """How each model of ``assembly`` (assembled from ``deployment``) is priced: the target, each
    drafter in order, then the target of a server that does not speculate where it is priced apart."""
    d = deployment
    drafter_tp = d.tp if d.drafter_tp is None else d.drafter_tp
    out = [_record("target", d.target, assembly.target, assembly, d, d.tp)]
    out += [_record(f"drafter {i + 1}", name, m, assembly, d, drafter_tp) for i, (name, m) in enumerate(zip(d.drafters, assembly.drafters))]
    if assembly.plain_target is not None:
        out.append(_record("target without speculation", d.target, assembly.plain_target, assembly, d, d.tp))
    return tuple(out)
