"""Model-on-hardware assembly: "a target and its drafters on hardware X, TP n, from the catalogs".

A :class:`Deployment` names what to price (catalog names or ``config.json`` paths, a hardware
entry, parallelism, dtype, measured profiles, utilisation overrides); :func:`assemble` turns it
into one :class:`~draftsim.sim.cost.base.CostModel` per model — the roofline of the catalog
model on the catalog hardware (:class:`~draftsim.sim.cost.roofline.RooflineModel`), a measured
profile (:class:`~draftsim.sim.cost.profile.ProfileCost`) where one names the model, and for the
statistical drafters (Max-Gram, bigram) a profile's measured proposal time, else nothing.

Everything is checked before any heavy work: names, hardware, that every profile was measured
on this kind of device for this model in this dtype, and that every profile is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import DraftsimError, unknown
from ..registry import METHODS, methods
from .base import CostModel
from .catalog import DTYPE_BYTES, WEIGHT_ONLY, Catalog, HardwareSpec, default_catalog
from .linear import Costs
from .methods import DrafterSpec, HeadCost, Lookup, head_cost, parse_drafter
from .operators import COST_MODELS, OperatorModel
from .overheads import EngineOverheads, SchedulerDefaults, default_engine, engine_overheads
from .profile import ProfileCost, load_profile
from .roofline import RooflineModel

__all__ = ["CHEAP_DRAFTERS", "KV_DTYPES", "Deployment", "Assembly", "assemble"]

#: Drafters that are not neural models: priced by a profile's proposal timing, else free (the registry's lookups).
CHEAP_DRAFTERS = methods(pricing="lookup")
#: Dtypes a KV cache may be held in (``--kv-dtype``; "auto": the activations').
KV_DTYPES = tuple(d for d in DTYPE_BYTES if d not in WEIGHT_ONLY)
#: the KV dtypes the operator model reads measured attention rows at: AIConfigurator's tables measure bfloat16 and
#: FP8 KV caches (float16 read at the bfloat16 rows: the same bytes)
OPERATOR_KV_DTYPES = ("auto", "bfloat16", "float16", "float8")


@dataclass(frozen=True)
class Deployment:
    """What to price: a target and its drafters on one hardware entry of the catalogs.

    ``target`` and ``drafters`` are catalog model names (or HF ``config.json`` paths, or for a
    drafter ``maxgram``/``bigram``); ``hardware`` a catalog hardware name. The target runs on
    ``tp`` tensor-parallel devices × ``pp`` pipeline stages, each draft model on ``drafter_tp``
    (default: the target's ``tp``); heads (eagle, eagle3, medusa, mtp, selfspec) share the
    target's devices (:mod:`draftsim.sim.cost.methods`).
    ``profiles`` are measured profile files (``draftsim profile``) that replace the roofline
    of the model they name; ``catalogs`` extra model/hardware catalog files. ``mfu``/``mbu``
    override the hardware's utilisations (0, 1]; ``overhead`` replaces its per-call and
    per-layer overhead by fixed seconds per forward call. ``overheads`` names the serving engine
    (``--engine``) whose overheads go on the rooflines (:mod:`draftsim.sim.cost.overheads`): its
    per-step time to the target's call, its per-draft-forward time to each draft model's, and its
    CUDA-graph padding; None: the hardware's default engine
    (:func:`~draftsim.sim.cost.overheads.default_engine`: vllm on catalog GPUs, none on a CPU or
    calibrated hardware). ``cost_model`` ``"operators"`` prices the target and draft models from kernel
    times measured on real GPUs (:mod:`draftsim.sim.cost.operators`, the ``operators`` extra) in
    place of the catalog roofline, the engine's host costs on top (heads too: :class:`~draftsim.sim.cost.methods.OperatorHead`).
    ``kv_dtype`` holds every model's KV cache in that dtype (vLLM's ``--kv-cache-dtype``: fp8 halves
    the bytes attention reads and the cache holds against bfloat16); "auto": the model's data type, as the engines' ``auto`` (bfloat16 under quantised weights,
    :data:`~draftsim.sim.cost.catalog.KV_AUTO`).
    """

    target: str
    hardware: str
    drafters: tuple[str, ...] = ()
    tp: int = 1
    pp: int = 1
    drafter_tp: int | None = None  # None: the target's tp (as vLLM runs a draft model)
    dtype: str = "bfloat16"
    profiles: tuple[str, ...] = ()
    catalogs: tuple[str, ...] = ()
    mfu: float | None = None
    mbu: float | None = None
    overhead: float | None = None
    overheads: str | None = None  # the serving engine (sim/data/engines.json); None: the hardware's default
    expert_parallel: bool = False  # the target's routed experts whole across its tp devices (draftsim.sim.cost.moe)
    cost_model: str = "roofline"  # "operators": models priced from measured kernel tables (draftsim.sim.cost.operators)
    kv_dtype: str = "auto"  # the KV cache's dtype (vLLM's --kv-cache-dtype): auto = the activations' (the weights' but for int4)


@dataclass
class Assembly:
    """The cost models of a :class:`Deployment`: the target's, each drafter's (in order), and
    ``info`` — hardware, dtype, tp, pp and, per model name, the backend that prices it."""

    target: CostModel
    drafters: list[CostModel]
    info: dict = field(default_factory=dict)
    #: the target's cost model in a server that does not speculate, where the engine prices that
    #: one apart (an overlapped scheduler that speculation turns off, sim/data/engines.json
    #: ``host_overlap``); None: ``target``
    plain_target: CostModel | None = None
    #: the serving engine whose overheads and scheduler defaults the deployment runs
    engine: EngineOverheads | None = None
    #: the catalog hardware entry
    hardware: HardwareSpec | None = None

    def scheduler_defaults(self) -> SchedulerDefaults:
        """The engine's scheduler defaults on this hardware (without an engine: the ``none``
        entry's; without hardware: the smallest tier)."""
        return (self.engine or engine_overheads("none")).scheduler(self.hardware)

    @property
    def models(self) -> list[CostModel]:
        """The target, then the drafters."""
        return [self.target, *self.drafters]

    def check_fits(self, batches, contexts, new_tokens) -> None:
        """Raise unless every roofline model holds its weights and the KV cache of the largest
        batch at the longest context plus new tokens in its devices' memory."""
        heads = [m for m in self.drafters if isinstance(m, HeadCost)]
        extra_w = sum(h.weight_bytes() for h in heads)
        extra_kv = sum(h.kv_bytes_per_token() for h in heads)
        for m in self.models:
            if isinstance(m, RooflineModel):
                if m is self.target:
                    m.check_fits(max(batches), max(contexts) + max(new_tokens), extra_w, extra_kv)
                else:
                    m.check_fits(max(batches), max(contexts) + max(new_tokens))

    def coefficients(self, batch: int = 1, context: int = 512) -> tuple[float, list[float]]:
        """The target's one-token call in seconds at ``batch`` × ``context``, and each drafter's
        cost coefficient c: its one-token call over the target's (the papers' c)."""
        self.check_fits([batch], [context], [1])
        t0 = float(self.target.shape_time(batch, 1, context))
        return t0, [float(d.shape_time(batch, 1, context)) / t0 for d in self.drafters]

    def costs(self, batch: int = 1, context: int = 512) -> Costs:
        """:class:`~draftsim.sim.cost.linear.Costs` in target calls for the simulators: each model's
        t(n) at ``batch`` × ``context`` fitted as a + b·n (:meth:`Costs.from_models`). Refused
        where a server without speculation decodes a token at another price than a speculating
        one's one-token call (their speedups count autoregressive decoding as one target call per
        token)."""
        if self.plain_target is not None and not np.isclose(float(self.plain_target.shape_time(batch, 1, context)),
                                                            float(self.target.shape_time(batch, 1, context)), rtol=1e-12, atol=0.0):
            raise DraftsimError(f"{self.info.get('engine_name', 'this engine')} prices plain decoding's step apart from a speculating "
                                "server's (an overlapped scheduler), which speedups counted in target calls cannot hold; use serve-sim, "
                                "capacity or sweep, or --engine vllm")
        return Costs.from_models(self.models, batch=batch, context=context)

    def verify_table(self, n_max: int, batch: int = 1, context: int = 512) -> list[float]:
        """The target's verification cost v(n) = t(n) / t(1), n = 1..``n_max``, at ``batch`` ×
        ``context`` (:func:`draftsim.sim.analytic.ewif`'s ``verify``); a profile's table stops
        where its grid of new tokens does."""
        n = np.arange(1, n_max + 1)
        if isinstance(self.target, ProfileCost):
            inside = ~np.asarray(self.target.outside(batch, n, context))
            n = n[: int(np.argmin(inside)) if not inside.all() else n.size]
            if n.size == 0:
                raise DraftsimError(f"the profile of {self.target.model} does not hold batch {batch}, context {context}: "
                                    "pass --cost-batch/--cost-context inside its grid")
        t = np.asarray(self.target.shape_time(batch, n, context), dtype=np.float64)
        return (t / t[0]).tolist()


def _same_model(catalog: Catalog, x: str, y: str) -> bool:
    if x.lower() == y.lower():
        return True
    canon = lambda n: catalog.aliases.get(n.lower(), n.lower())  # noqa: E731
    return canon(x) == canon(y)


@dataclass(frozen=True)
class _Setting:
    """What every model of one deployment is priced with: the deployment, its catalogs and
    hardware, the engine, the KV dtype, the loaded profiles and whether the engine verifies the
    drafters' proposals by batch expansion."""

    deployment: Deployment
    catalog: Catalog
    hardware: HardwareSpec
    engine: EngineOverheads
    kv_dtype: str | None
    profiles: tuple[ProfileCost, ...]
    expanded: bool


@dataclass(frozen=True)
class _Priced:
    """One model's cost model and what the assembly says of it: the name it is listed under, the
    backend that prices it, where each of its parts is priced from (``--cost-model operators``;
    keyed by ``operators_key``) and the profile it used (an index into the deployment's)."""

    name: str
    model: CostModel
    backend: str
    operators: str | None = None
    operators_key: str | None = None
    profile: int | None = None


def _check_deployment(d: Deployment) -> None:
    """Refuse a deployment that names no target or hardware, or an unknown cost model or KV dtype."""
    if not d.target or not d.hardware:
        raise DraftsimError("give --target MODEL and --hardware HW (and drafters) to price calls from hardware; draftsim cost --list names them")
    if d.cost_model not in COST_MODELS:
        raise unknown("cost model", d.cost_model, COST_MODELS)
    if d.kv_dtype != "auto" and d.kv_dtype not in KV_DTYPES:
        raise unknown("KV-cache dtype", d.kv_dtype, ("auto", *KV_DTYPES))
    if d.cost_model == "operators" and d.kv_dtype not in OPERATOR_KV_DTYPES:
        raise DraftsimError(f"--kv-dtype {d.kv_dtype}: --cost-model operators prices attention from tables measured with bfloat16 and "
                            f"FP8 KV caches; valid: {', '.join(OPERATOR_KV_DTYPES)} (--cost-model roofline for another KV dtype)")


def _engine(d: Deployment, hw: HardwareSpec) -> EngineOverheads:
    """The engine the deployment runs on ``hw`` (its own default where none is named); calibrated
    hardware holds its engine's overheads already, so it takes none."""
    engine = engine_overheads(default_engine(hw) if d.overheads is None else d.overheads)
    if hw.calibration is not None and engine.name != "none":
        raise DraftsimError(f"hardware {hw.name} is calibrated to measured steps ({hw.calibration.get('fitted_to', 'draftsim calibrate')}), "
                            f"whose times already hold their engine's overheads: use --engine none with it, not {engine.name}")
    return engine


def _info(s: _Setting) -> dict:
    """What an assembly says of its deployment before any model is priced."""
    d, hw, engine = s.deployment, s.hardware, s.engine
    return {"hardware": hw.name, "dtype": d.dtype, "kv_dtype": d.kv_dtype, "tp": d.tp, "pp": d.pp, "backends": {}, "engine": engine.describe(),
            "engine_name": f"--engine {engine.name}", "engine_label": engine.label,
            "scheduler": engine.scheduler(hw).describe(), "calibration": hw.calibration, "roofline_terms": roofline_terms(hw)}


def roofline_terms(hw: HardwareSpec) -> str:
    """What the catalog roofline prices a call on ``hw`` with: its efficiencies, and the fixed times
    per kernel and per fused-MoE call where its measured tables gave them (sim/data/hardware.json)."""
    parts = [f"MBU {hw.mbu:.3g}", f"MFU {hw.mfu:.3g}"]
    if hw.kernel_fixed:
        names = {"gemm": "GEMM", "gemm_float8": "FP8 GEMM", "attention": "decode attention", "elementwise": "elementwise", "allreduce": "all-reduce"}
        parts.append("a fixed time per kernel (" + ", ".join(f"{names.get(k, k)} {v * 1e6:.2f} us" for k, v in hw.kernel_fixed.items()) + ")")
    if hw.fused_moe:
        parts.append(f"{hw.fused_moe * 1e6:.1f} us per fused-MoE call")
    measured = " (the fixed times derived from its measured kernel tables: benchmarks/derive_affine.py, derive_fused_moe.py)" \
        if hw.kernel_fixed or hw.fused_moe else ""
    return f"roofline terms on {hw.name}: " + ", ".join(parts) + measured


def _profile_for(s: _Setting, name: str, machine: Callable[[], dict] | None) -> tuple[int, ProfileCost] | None:
    """The profile that names model ``name`` (and its index), checked to have been measured on
    this machine's kind of device, for this model, in this dtype; None where none names it."""
    d, catalog, hw = s.deployment, s.catalog, s.hardware
    for i, prof in enumerate(s.profiles):
        if not _same_model(catalog, prof.model, name):
            continue
        if hw.kind != "cpu" or prof.device.split(":")[0] != "cpu":
            raise DraftsimError(f"the profile {d.profiles[i]} was measured on {prof.device} "
                                f"({prof.fingerprint.get('machine', {}).get('cpu', '?')}), not on {hw.name}; use --hardware local-cpu")
        if machine is not None:
            here = machine()
            prof.check_fingerprint(machine={k: here[k] for k in ("cpu", "cores")})
        try:
            spec = catalog.model(name)
        except DraftsimError:
            spec = None  # a model the catalog does not know (e.g. tiny:SEED): its name must do
        if spec is not None and prof.fingerprint.get("model", {}).get("architecture") not in (None, spec.architecture):
            raise DraftsimError(f"the profile {d.profiles[i]} was measured for another model: architecture "
                                f"{prof.fingerprint['model']['architecture']}, not {name}'s {spec.architecture}")
        if prof.dtype and prof.dtype != d.dtype:
            raise DraftsimError(f"the profile {d.profiles[i]} was measured in {prof.dtype}, not {d.dtype}; pass --dtype {prof.dtype}")
        return i, prof
    return None


def _lookup(s: _Setting, name: str) -> _Priced:
    """A lookup drafter: a profile's measured proposal time per token, else free."""
    for i, prof in enumerate(s.profiles):
        if name.lower() in prof.drafters:
            return _Priced(name, Lookup(0.0, float(prof.drafters[name.lower()]["seconds_per_token"])),
                           f"measured proposal time per token ({prof.model} profile)", profile=i)
    return _Priced(name, Lookup(0.0), "free (no profile with its proposal timing)")


def _head(s: _Setting, name: str, spec: DrafterSpec) -> _Priced:
    """A head on the target's devices (or self-speculation: the target over a window of its
    cache), the engine's per-draft-forward time on each call."""
    d, engine = s.deployment, s.engine
    model = head_cost(spec, s.catalog.model(d.target), s.hardware, d.dtype, d.tp, mfu=d.mfu, mbu=d.mbu, overhead=d.overhead,
                      overlap=engine.overlap, kv_dtype=s.kv_dtype, cost_model=d.cost_model, engine=engine.name,
                      graph_tokens=engine.graph_tokens)
    if engine.per_draft_forward and isinstance(model, HeadCost):
        model = model.plus(engine.per_draft_forward, f" + {engine.name} engine overheads")
    described = model.describe() if hasattr(model, "describe") else None  # --cost-model operators: where each part is priced from
    return _Priced(name, model, f"{spec.method} on the target's devices: {model.name}", described, name)


def _roofline(s: _Setting, spec_m, tp: int, pp: int, host: float, hidden: bool, expert_parallel: bool = False,
              kv_per_query: bool = False) -> RooflineModel:
    """The catalog roofline (or measured operators) of ``spec_m`` with the engine's ``host``
    seconds per call, added, or ``hidden`` behind the forward (the call takes at least that long),
    named for what it holds."""
    d, hw, engine = s.deployment, s.hardware, s.engine
    base = hw.overhead if d.overhead is None else d.overhead
    priced = {"engine": engine.name} if d.cost_model == "operators" else {}  # measured kernels (sim/cost/operators.py)
    cls = OperatorModel if priced else RooflineModel
    model = cls(spec_m, hw, d.dtype, tp, pp, **priced, mfu=d.mfu, mbu=d.mbu, overhead=base + (0.0 if hidden else host),
                overhead_per_layer=None if d.overhead is None else 0.0, graph_tokens=engine.graph_tokens,
                overlap=engine.overlap, allreduce=engine.allreduce_for(hw.name, tp), floor=host if hidden else 0.0,
                expert_parallel=expert_parallel, kv_per_query=kv_per_query, kv_dtype=s.kv_dtype)
    notes = [", verified by batch expansion" if kv_per_query else "",
             f", experts whole over {tp} devices" if expert_parallel and tp > 1 else "",
             f" + {engine.name} engine overheads" + (" (host work overlapped)" if hidden else "") if engine.name != "none" else ""]
    model.name += "".join(notes)
    return model


def _backend(model: RooflineModel) -> str:
    return f"{'operators' if isinstance(model, OperatorModel) else 'roofline'}: {model.name}"


def _model(s: _Setting, name: str, tp: int, pp: int, drafter: bool, machine: Callable[[], dict] | None) -> _Priced:
    """A model: its measured profile where one names it, else its catalog roofline; a draft
    model at the target's tp unless its heads do not split over it (then tp 1, as vLLM may)."""
    d, engine = s.deployment, s.engine
    found = _profile_for(s, name, machine)
    if found is not None:
        return _Priced(name, found[1], found[1].name, profile=found[0])
    spec_m = s.catalog.model(name, alternatives=tuple(m.spelled for m in METHODS.values() if m.pricing != "draft_model") if drafter else ())
    note = ""
    if drafter and d.drafter_tp is None and spec_m.heads % tp:  # vLLM's one other choice: draft_tensor_parallel_size 1
        tp, note = 1, f" (at tp 1: its {spec_m.heads} heads do not split over the target's {d.tp} devices)"
    model = _roofline(s, spec_m, tp, pp, engine.per_draft_forward if drafter else engine.per_step,
                      hidden=not drafter and engine.host_overlap(speculative=True), expert_parallel=not drafter and d.expert_parallel,
                      kv_per_query=not drafter and s.expanded)
    return _Priced(name, model, _backend(model) + note, model.describe() if isinstance(model, OperatorModel) else None, spec_m.name)


def _price(s: _Setting, name: str, tp: int, pp: int, machine: Callable[[], dict] | None, drafter: bool = False) -> _Priced:
    """One model of the deployment, priced as its drafting method is (:data:`draftsim.sim.registry.METHODS`
    ``pricing``): a lookup, a head on the target's devices, or a model of its own."""
    entry = METHODS.get(name.lower())
    if entry is not None and entry.pricing == "lookup":
        return _lookup(s, name)
    spec = parse_drafter(name) if drafter else None
    if spec is not None and METHODS[spec.method].pricing in ("head", "target_window"):
        return _head(s, name, spec)
    return _model(s, spec.model if spec is not None else name, tp, pp, drafter, machine)


def _plain_target(s: _Setting, target: CostModel) -> _Priced | None:
    """The target in a server that does not speculate, where the engine prices it apart from a
    speculating server's (an overlapped scheduler that speculation turns off; batch expansion);
    None where it is the same model."""
    d, engine = s.deployment, s.engine
    if not isinstance(target, RooflineModel) or (engine.host_overlap(speculative=False) == engine.host_overlap(speculative=True)
                                                 and not target.kv_per_query):
        return None
    plain = _roofline(s, target.model, d.tp, d.pp, engine.per_step, hidden=engine.host_overlap(speculative=False),
                      expert_parallel=d.expert_parallel)
    return _Priced(d.target, plain, _backend(plain), plain.describe() if isinstance(plain, OperatorModel) else None, target.model.name)


def assemble(deployment: Deployment, machine: Callable[[], dict] | None = None) -> Assembly:
    """The cost models of ``deployment``, every name, profile and the hardware checked first.

    ``machine`` returns this machine's fingerprint (``cpu``, ``cores``; e.g.
    :func:`draftsim.realrun.profiling.machine_fingerprint`): a CPU profile must have been
    measured on it. Without it that check is skipped.
    """
    d = deployment
    _check_deployment(d)
    catalog = default_catalog(list(d.catalogs))
    hw = catalog.hardware_spec(d.hardware)
    engine = _engine(d, hw)
    profiles = tuple(load_profile(p) for p in d.profiles)
    # a drafter whose proposals the engine verifies by batch expansion: the target's attention reads per query
    expanded = any(parse_drafter(name).method in engine.batch_expansion for name in d.drafters)
    s = _Setting(d, catalog, hw, engine, None if d.kv_dtype == "auto" else d.kv_dtype, profiles, expanded)
    info = _info(s)

    def record(p: _Priced, listed: bool = True) -> CostModel:
        if listed:
            info["backends"][p.name] = p.backend
        if p.operators is not None:
            info.setdefault("operators", {})[p.operators_key] = p.operators
        return p.model

    target = _price(s, d.target, d.tp, d.pp, machine)
    if d.expert_parallel and not isinstance(target.model, RooflineModel):
        raise DraftsimError(f"--expert-parallel prices the catalog roofline's expert placement; {d.target} is priced by "
                            f"{target.backend}, which holds its own: drop --expert-parallel")
    drafters = [_price(s, name, d.tp if d.drafter_tp is None else d.drafter_tp, 1, machine, drafter=True) for name in d.drafters]
    if d.drafter_tp is not None and not any(isinstance(p.model, RooflineModel) for p in drafters):
        # a head, a lookup or a profile has no devices of its own: the option would change nothing (refused, not ignored)
        which = f"{', '.join(d.drafters)} {'has' if len(d.drafters) == 1 else 'have'} none" if d.drafters else "no drafter is named"
        raise DraftsimError(f"--drafter-tp {d.drafter_tp} sizes a draft model's own devices; {which} (a head runs on the "
                            "target's devices, a lookup on none, a profiled model as measured): leave --drafter-tp out")
    used = {p.profile for p in (target, *drafters) if p.profile is not None}
    unused = [i for i in range(len(profiles)) if i not in used]
    if unused:
        raise DraftsimError(f"the profile {d.profiles[unused[0]]} is of model {profiles[unused[0]].model!r}, neither the target nor a drafter")
    plain = _plain_target(s, target.model)
    models = [record(p) for p in (target, *drafters)]
    if plain is not None:
        record(plain, listed=False)
        info["without speculation"] = f"{d.target}: {plain.backend}"
    return Assembly(models[0], models[1:], info, plain.model if plain is not None else None, engine, hw)
