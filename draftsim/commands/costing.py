"""``draftsim profile`` and ``draftsim cost``: forward times from measurement or from hardware.

``profile`` measures a real model on this machine over a grid (batch × new tokens × context)
and writes a profile file; ``--probe`` also measures the machine (memory bandwidth, FLOP/s)
and writes a ``local-cpu`` hardware entry whose fixed overhead is fitted to the profile.

``cost`` prints t(forward) of a target and its drafters for every asked shape from the
roofline (catalog models on catalog hardware) or from a measured profile, the cost
coefficients c and what bounds each call (:class:`CostConfig` → :func:`cost` →
:class:`CostResult`). :class:`HardwareOptions` and :class:`PricedOptions` give ``plan``,
``ewif``, ``simulate``, ``serve-sim`` and ``optimize`` the same model/hardware options (in
place of ``--cost``), assembled by :func:`draftsim.sim.cost.assembly.assemble`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields, replace

import numpy as np

from draftsim.analysis.table import format_table
from draftsim.sim.cost import RooflineModel, default_catalog
from draftsim.sim.cost.assembly import CHEAP_DRAFTERS, KV_DTYPES, Assembly, Deployment, assemble
from draftsim.sim.cost.callparts import SPLIT_NOTES, split_basis, split_calls
from draftsim.sim.cost.catalog import DTYPE_BYTES, hardware_from_entry, model_from_entry, write_catalog
from draftsim.sim.cost.methods import OperatorHead
from draftsim.sim.cost.operators import COST_MODELS, SYSTEMS, OperatorModel
from draftsim.sim.cost.overheads import ENGINES
from draftsim.sim.cost.profile import PATHS as PROFILE_PATHS
from draftsim.sim.cost.profile import ProfileCost
from draftsim.sim.errors import DraftsimError, as_count, parse_numbers
from draftsim.sim.registry import drafter_help, engine_help

from .. import args as a
from ..config import add_options, as_dict, check, default_of, flag_of, from_namespace, option
from ..progress import count_bar
from .table import summary

HARDWARE = "hardware"


#: ``--help`` titles of the hardware group: in place of ``--cost`` (planners) or the only costs.
HARDWARE_TITLES = {HARDWARE: "models on hardware (in place of --cost)"}
SHAPES_TITLES = {HARDWARE: "models and hardware"}


def _machine() -> dict:
    """This machine's fingerprint (a CPU profile must have been measured on it)."""
    from draftsim.realrun.profiling import machine_fingerprint

    return machine_fingerprint("cpu")


@dataclass(kw_only=True)
class HardwareOptions:
    """A target and its drafters on catalog hardware (or measured profiles): the options every
    command that prices calls from hardware shares (:class:`draftsim.sim.cost.assembly.Deployment`)."""

    target: str | None = option(help="target model: a catalog name (draftsim cost --list) or a config.json path", metavar="MODEL",
                                group=HARDWARE)
    drafter_model: list[str] | None = option(help=drafter_help() + " (draftsim.sim.cost.methods says how each is priced, with sources)",
                                             append=True, metavar="MODEL", group=HARDWARE)
    hardware: str | None = option(help="hardware from the catalog (draftsim cost --list)", metavar="HW", group=HARDWARE)
    tp: int = option(1, "tensor-parallel devices for the target (default 1)", type=a.count("tp", 1, 1024), group=HARDWARE)
    pp: int = option(1, "pipeline stages for the target (default 1)", type=a.count("pp", 1, 1024), group=HARDWARE)
    drafter_tp: int | None = option(help="tensor-parallel devices per draft model (default: the target's --tp, as vLLM runs it)",
                                    type=a.count("drafter_tp", 1, 1024), group=HARDWARE)
    dtype: str = option("bfloat16", "weights/activations dtype (default bfloat16); int4: 4-bit weights (AWQ/GPTQ) with bfloat16 "
                        "activations and GEMMs, embedding and LM head in bfloat16 (an assumption of the roofline)",
                        choices=tuple(DTYPE_BYTES), group=HARDWARE)
    kv_dtype: str = option("auto", "KV-cache dtype, as vLLM's --kv-cache-dtype (fp8 = float8: half the bytes of bfloat16 to read and "
                           "hold); auto: the model's data type as vLLM and SGLang take it, bfloat16 under float8/int8/int4 weights (default)", choices=("auto", "fp8", *KV_DTYPES), group=HARDWARE)
    profile: list[str] = option([], "measured profile (draftsim profile) for a model it names", append=True, metavar="FILE",
                                group=HARDWARE)
    catalog: list[str] = option([], "extra model or hardware catalog file (repeat)", append=True, metavar="FILE", group=HARDWARE)
    mfu: float | None = option(help="override the hardware's model FLOP utilisation (0, 1]", type=a.positive("mfu"), group=HARDWARE)
    mbu: float | None = option(help="override the hardware's memory bandwidth utilisation (0, 1]", type=a.positive("mbu"), group=HARDWARE)
    overhead: float | None = option(help="fixed seconds per forward call, replacing the hardware's per-call and per-layer overhead",
                                    type=a.cost("overhead"), group=HARDWARE)
    engine: str | None = option(help=f"serving engine the deployment runs, with its overheads on the rooflines and its scheduler's "
                                f"defaults on the device: {engine_help()}; default: vllm on catalog GPUs, none on a CPU or "
                                "calibrated hardware (each value cited in sim/data/engines.json)",
                                choices=tuple(ENGINES), group=HARDWARE, aliases=("--overheads",))
    expert_parallel: bool = option(False, "place a MoE target's routed experts whole across its --tp devices (vLLM's "
                                   "--enable-expert-parallel at data parallelism 1): each step waits for the busiest device",
                                   flag=True, group=HARDWARE)
    cost_model: str = option("roofline", "how a model's forward is priced: roofline (the catalog's peak and utilisations, default) or "
                             "operators (kernel times measured on real GPUs by NVIDIA AIConfigurator, aiconfigurator-core 0.12.0: "
                             f"pip install 'draftsim[operators]'; dense bfloat16 models (and MoE in float8) on {', '.join(SYSTEMS)}; the engine's "
                             "host costs on top; draftsim.sim.cost.operators says what is measured and what estimated)",
                             choices=COST_MODELS, group=HARDWARE)

    def uses_hardware(self) -> bool:
        """Whether any model or hardware is named (then calls are priced from them)."""
        return bool(self.target or self.hardware or self.drafter_model)

    def pricing_options_given(self) -> list[str]:
        """The flags of the hardware group given other than the models and the hardware (--tp,
        --engine, --dtype, ...): each only shapes a price taken from models on hardware."""
        named = {"target", "hardware", "drafter_model"}
        return [flag_of(f.name) for f in fields(self) if "option" in f.metadata and f.metadata["option"].group == HARDWARE
                and f.name not in named and getattr(self, f.name) != default_of(f)]

    def deployment(self, drafters: list[str] | None = None) -> Deployment:
        """The :class:`Deployment` these options name (``drafters`` in place of --drafter-model)."""
        return Deployment(self.target, self.hardware, tuple(self.drafter_model or () if drafters is None else drafters), self.tp,
                          self.pp, self.drafter_tp, self.dtype, tuple(self.profile), tuple(self.catalog), self.mfu, self.mbu,
                          self.overhead, self.engine, self.expert_parallel, cost_model=self.cost_model,
                          kv_dtype="float8" if self.kv_dtype == "fp8" else self.kv_dtype)

    def assembly(self, drafters: list[str] | None = None) -> Assembly:
        """The target's and drafters' cost models (:func:`draftsim.sim.cost.assembly.assemble`),
        everything checked before any heavy work."""
        return assemble(self.deployment(drafters), machine=_machine)


@dataclass(kw_only=True)
class PricedOptions(HardwareOptions):
    """:class:`HardwareOptions` and the shape at which the planners take cost coefficients."""

    cost_batch: int = option(1, "batch size the cost coefficients are taken at (default 1)", type=a.count("cost_batch", 1, 1 << 20),
                             group=HARDWARE)
    cost_context: int = option(512, "context length for the cost coefficients (default 512)", type=a.count("cost_context", 0, 1 << 24),
                               group=HARDWARE)

    def priced(self, n_drafters: int | None = None, drafters: list[str] | None = None) -> tuple[Assembly, dict]:
        """The assembly, checked to fit at --cost-batch/--cost-context, and its description with
        the target's one-token call (seconds) and the drafters' cost coefficients c."""
        built = self.assembly(drafters)
        if built.plain_target is not None:
            raise DraftsimError(f"--engine {built.engine.name}: this engine prices a server without speculation apart from a "
                                "speculative one (its host work overlaps the forward only then), and the single-stream "
                                "planners count plain decoding as one target call a token: use serve-sim or capacity "
                                "(draftsim cost prints both prices)")
        if n_drafters is not None and len(built.drafters) != n_drafters:
            raise DraftsimError(f"give one --drafter-model per drafter ({n_drafters}); got {len(built.drafters)}")
        t0, cs = built.coefficients(self.cost_batch, self.cost_context)
        # the tp each draft model is priced at (a head runs on the target's devices; a draft model whose heads do not split
        # over the target's tp runs on one device, as the backends say)
        tps = sorted({getattr(m, "tp", None) or self.tp for m in built.drafters}) or [self.drafter_tp or self.tp]
        info = {**public_info(built.info, built.engine), "drafter_tp": tps[0] if len(tps) == 1 else tps, "batch": self.cost_batch,
                "context": self.cost_context, "target_seconds": t0, "coefficients": cs}
        return built, info

    def refuse_unused_pricing(self, typed: str) -> None:
        """Costs typed by ``typed`` price nothing from hardware: a --tp, --engine, --dtype, ... given
        beside them would change nothing, so it is refused rather than ignored."""
        unused = self.pricing_options_given()
        if unused:
            raise DraftsimError(f"{', '.join(unused)} shape{'s' if len(unused) == 1 else ''} a price taken from models on hardware "
                                f"(--target, --drafter-model, --hardware); with {typed} it would change nothing: name the models "
                                f"and hardware, or leave {'it' if len(unused) == 1 else 'them'} out")

    def coefficients_or_hardware(self, given, n_drafters: int | None = None) -> tuple[list[float], dict | None, Assembly | None]:
        """The cost coefficients typed with --cost (``given``), or computed from the model/hardware
        options (exactly one of the two); with the description and the assembly of the hardware
        ones (None for typed ones)."""
        hardware = self.uses_hardware()
        if hardware and given:
            raise DraftsimError("give either --cost or the model/hardware options (--target, --drafter-model, --hardware), not both")
        if not hardware:
            if not given:
                raise DraftsimError("give --cost (the drafter's cost coefficient) or --target MODEL --drafter-model MODEL --hardware HW")
            self.refuse_unused_pricing("--cost")
            return list(given), None, None
        built, info = self.priced(n_drafters)
        return info["coefficients"], info, built


def _ints(name: str, minimum: int):
    def parse(text: str) -> list[int]:
        try:
            out = as_count(name, parse_numbers(name, text), minimum=minimum)
        except DraftsimError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return sorted(set(int(v) for v in out))

    def check(values) -> list[int]:
        return sorted(set(int(v) for v in as_count(name, values, minimum=minimum)))

    parse.__name__ = name
    parse.check = check
    return parse


def public_info(info: dict, engine) -> dict:
    """An assembly's description as the JSON outputs give it: ``engine`` the engine's name (``vllm``,
    ``none``), ``engine_description`` what it adds to a price, ``engine_label`` the name with its
    version (``vllm v0.10.1``), as outputs name it."""
    out = {}
    for key, value in info.items():
        if key == "engine":
            out.update(engine=engine.name if engine is not None else "none", engine_description=str(value).removeprefix("engine: "))
        elif key != "engine_name":
            out[key] = value
    return out


def deployment_terms(info: dict) -> list[str]:
    """What a priced deployment ran as its text output names it (its JSON holds the same): the
    engine (the default one too), the target's tp and pp beyond 1 and the drafters' tp where it
    is not the target's."""
    terms = [f"engine {info['engine_label']}"] if info.get("engine_label") else []
    if info.get("tp", 1) > 1:
        terms.append(f"target on tp {info['tp']}" + (f" x pp {info['pp']}" if info.get("pp", 1) > 1 else ""))
    elif info.get("pp", 1) > 1:
        terms.append(f"target on pp {info['pp']}")
    tps = info.get("drafter_tp")
    if tps is not None and tps != info.get("tp", 1):
        terms.append(f"drafters on tp {'/'.join(map(str, tps)) if isinstance(tps, list) else tps}")
    return terms


def describe_coefficients(info: dict) -> str:
    shape = ", ".join([*deployment_terms(info), info["dtype"], f"batch {info['batch']}", f"context {info['context']}"])
    text = (f"costs from {info['hardware']} ({shape}): target call "
            f"{info['target_seconds'] * 1e3:.3f} ms, c = " + ", ".join(f"{c:.4g}" for c in info["coefficients"]))
    if info.get("verify"):
        v = info["verify"]
        shown = ", ".join(f"v({n})={v[n - 1]:.3g}" for n in (1, 2, 3, 5, 9, 17, 33) if n <= len(v))
        text += f"\ntarget's verification of n tokens over one (drafts up to {len(v) - 1} tokens): {shown}"
    return text


@dataclass(kw_only=True)
class CostConfig(HardwareOptions):
    """``draftsim cost``: forward times of a target and its drafters over a grid of shapes."""

    drafter_model: list[str] | None = option(help=drafter_help(), append=True, metavar="MODEL", group=HARDWARE, aliases=("--drafter",))
    batch: list[int] = option([1], "batch sizes, comma-separated (default 1)", type=_ints("batch", 1))
    new_tokens: list[int] = option([1], "new tokens per sequence, comma-separated (default 1)", type=_ints("new_tokens", 1))
    context: list[int] = option([512], "cached tokens per sequence, comma-separated (default 512)", type=_ints("context", 0))
    list: bool = option(False, "list the catalog's models and hardware and exit", flag=True)


@dataclass(frozen=True)
class CostRecord:
    """One model's forward call at one shape: seconds, what bounds it, and c (over the
    target's one-new-token call at the same batch and context)."""

    model: str
    role: str  #: "target", "plain target" (the target of a server without speculation, where the engine prices it apart) or "drafter"
    batch: int
    new_tokens: int
    context: int
    seconds: float
    bound: str  #: "memory", "compute" or "overhead"
    c: float
    #: the call's seconds split (draftsim.sim.cost.callparts): GPU forward, CUDA-graph padding (None: not
    #: separated, inside the forward), the engine's host time and the fixed per-call overhead; they add up to ``seconds``
    forward: float | None = None
    padding: float | None = None
    host: float | None = None
    overhead: float | None = None


@dataclass
class CostResult:
    """What ``draftsim cost`` reports: the assembly's description (hardware, dtype, tp, pp,
    backend per model) and one record per model and shape."""

    info: dict
    records: list[CostRecord]

    def to_dict(self) -> dict:
        return {**self.info, "records": as_dict(self.records)}


#: Most rows a cost table holds (each is a record in memory and a line of output).
MAX_COST_ROWS = 100_000


def cost(config: CostConfig) -> CostResult:
    """Forward times of ``config``'s target and drafters at every (batch, new tokens, context)."""
    check(config)
    names = [config.target] + list(config.drafter_model or [])
    rows = len(config.batch) * len(config.new_tokens) * len(config.context) * len(names)
    if rows > MAX_COST_ROWS:
        raise DraftsimError(f"{len(config.batch)} batches x {len(config.new_tokens)} new-token counts x {len(config.context)} contexts x "
                            f"{len(names)} model(s) = {rows:,} rows; draftsim cost prints at most {MAX_COST_ROWS:,} (give fewer values)")
    built = config.assembly()
    built.check_fits(config.batch, config.context, config.new_tokens)
    B, N, C = (np.array(v) for v in np.meshgrid(config.batch, config.new_tokens, config.context, indexing="ij"))
    B, N, C = B.ravel(), N.ravel(), C.ravel()
    unit = built.target.shape_time(B, 1, C)
    records = []
    models = list(zip(names, built.models))
    if built.plain_target is not None:  # the engine prices a server without speculation apart
        models.insert(1, (f"{config.target} (without speculation)", built.plain_target))
    engine = built.engine
    splits = {}
    for name, model in models:
        secs = np.atleast_1d(model.shape_time(B, N, C))
        bounds = np.atleast_1d(model.shape_bound(B, N, C))
        role = "target" if model is built.target else "plain target" if model is built.plain_target else "drafter"
        host = 0.0 if engine is None else engine.per_draft_forward if role == "drafter" else engine.per_step
        parts = split_calls(model, B * N, secs, engine_host=host)
        splits[name] = SPLIT_NOTES[split_basis(model)]
        for i, (b, n, c, s, bd, u) in enumerate(zip(B, N, C, secs, bounds, unit)):
            part = {k: None if v is None else float(v[i]) for k, v in parts.items()}
            records.append(CostRecord(name, role, int(b), int(n), int(c), float(s), str(bd), float(s / u), **part))
    info = public_info(built.info, engine)
    # the device each model's calls ran on (a measured profile's own, else the hardware's kind)
    info["devices"] = {name: _device_of(model, built.hardware) for name, model in models}
    info["split"] = splits
    footprint = built.target.memory()
    if footprint is not None and isinstance(built.target, RooflineModel):  # what --kv-dtype changes: the cache per token
        info["kv_cache"] = {"dtype": built.target.kv_dtype, "bytes_per_token_per_device": footprint.kv_per_token}
    breakdown = [{"model": name, "batch": int(b), "new_tokens": int(n), "context": int(c),
                  "parts": [p.to_dict() for p in model.breakdown(int(b), int(n), int(c))]}
                 for name, model in models if isinstance(model, (OperatorModel, OperatorHead)) for b, n, c in list(zip(B, N, C))[:MAX_BREAKDOWN]]
    if breakdown:  # --cost-model operators: each call part by part, measured or estimated
        info["breakdown"] = breakdown
    return CostResult(info, records)


def _device_of(model, hardware) -> str:
    """``cpu`` or ``gpu``: where a model's calls are priced as running (a profile's measured device)."""
    device = getattr(model, "device", None) if isinstance(model, ProfileCost) else None
    if device is None:
        device = getattr(hardware, "kind", "gpu")
    return "cpu" if str(device).split(":")[0] == "cpu" else "gpu"


#: Most shapes per model whose operator breakdown ``cost`` reports.
MAX_BREAKDOWN = 64


def catalog_listing(catalogs: list[str]) -> dict:
    """The catalogs' models (architecture, or why unsupported) and hardware, as ``cost --list`` shows them."""
    cat = default_catalog(catalogs)
    models, hardware = [], []
    for name, e in sorted(cat.models.items()):
        if e.get("unsupported"):
            models.append({"name": name, "supported": False, "reason": e["unsupported"], "source": e.get("source", "")})
        else:
            m = model_from_entry(name, e)
            models.append({"name": name, "supported": True, "parameters": m.params, "layers": m.layers, "hidden": m.hidden,
                           "heads": m.heads, "kv_heads": m.kv_heads, "vocab": m.vocab, "source": m.source})
    for name, e in sorted(cat.hardware.items()):
        h = hardware_from_entry(name, e)
        hardware.append({"name": name, "kind": h.kind, "memory_gb": h.memory / 1e9, "bandwidth_gbs": h.memory_bandwidth / 1e9,
                         "peak_tflops": {k: v / 1e12 for k, v in h.peak_flops.items()}, "source": h.source})
    return {"models": models, "hardware": hardware}


def register(sub, common) -> None:
    p = sub.add_parser(
        "cost", parents=[common], help=summary("cost"),
        description="Time of one forward call of the target and each drafter for every asked shape (batch x new tokens x "
        "context), from the roofline (catalog model on catalog hardware) or a measured profile; the cost coefficient c "
        "(time over the target's one-new-token call at the same batch and context); and whether the call is memory-, "
        "compute- or overhead-bound.",
    )
    add_options(p, CostConfig, SHAPES_TITLES)
    p.set_defaults(run=run_cost)

    p = sub.add_parser(
        "profile", parents=[common], help=summary("profile"),
        description="Time a model's forward call over a grid of batch sizes x new tokens x context lengths (warm-up, "
        "repeats, median and spread) and write a profile file for draftsim cost --profile; --probe also measures this "
        "machine (memory bandwidth, FLOP/s) and writes a local-cpu hardware entry fitted to the profile.",
    )
    add_options(p, ProfileConfig)
    p.set_defaults(run=run_profile)


@dataclass(kw_only=True)
class ProfileConfig:
    """``draftsim profile``: a real model's forward times on this machine over a grid of shapes."""

    model: str = option("smollm2", "smollm2 (embedded), distilled (draftsim distill's draft of smollm2), tiny[:SEED], random:NAME[:SEED], a checkpoint "
                        "folder or a .gguf file (one model per run: profile the target and each neural drafter, then pass every file "
                        "to cost --profile or check-sim --profile)")
    out: str = option(help="profile file to write", required=True, metavar="PROFILE.json")
    batch: list[int] = option([1, 2, 4], "batch sizes (default 1,2,4)", type=_ints("batch", 1))
    new_tokens: list[int] = option([1, 2, 4, 8, 16], "new tokens per sequence (default 1,2,4,8,16)", type=_ints("new_tokens", 1))
    context: list[int] = option([128, 512], "cached tokens (default 128,512)", type=_ints("context", 0))
    repeats: int = option(5, "timed calls per grid point (default 5)", type=a.count("repeats", 1, 10_000))
    warmup: int = option(1, "untimed calls first (default 1)", type=a.count("warmup", 0, 10_000))
    dtype: str = option("float32", "weights and activations (default float32)", choices=("float32", "bfloat16"))
    device: str = option("cpu", "cpu, cuda or auto (default cpu)")
    drafters: str = option(",".join(CHEAP_DRAFTERS), "lookup drafters whose proposal time is measured ('' for none)")
    probe: str | None = option(help="also measure this machine and write a local-cpu hardware catalog file", metavar="HW.json")
    threads: int | None = option(help="torch CPU threads (default torch's; 1 is steadier on a busy machine)", type=a.count("threads", 1, 1024))
    path: str = option("model", "the forward call timed: model = the model's own call (what the single-stream executors make and "
                       "check-sim prices, default); server = the batched serving loop's (ragged attention mask, per-row positions: "
                       "what draftsim serve makes and check-serve prices); server-static = the same through the static cache "
                       "(draftsim serve --static-cache: fixed shapes, CUDA graphs on a CUDA device); server-prefill = a joiner's prefill "
                       "as that server runs it (a fresh one-row static cache, eager; batch 1, context 0: check-serve's "
                       "--prefill-profile of a --static-cache run)", choices=PROFILE_PATHS)
    seed: int = option(0, type=a.count("seed"))


def _print_listing(listing: dict) -> None:
    models, hardware = listing["models"], listing["hardware"]
    rows = [[m["name"], f"{m['parameters'] / 1e9:.3g}B" if m["supported"] else "-", m.get("layers", "-"), m.get("hidden", "-"),
             f"{m['heads']}/{m['kv_heads']}" if m["supported"] else "-", "" if m["supported"] else "unsupported: encoder-decoder"]
            for m in models]
    print(format_table(["model", "params", "layers", "hidden", "heads/kv", "note"], rows))
    rows = [[h["name"], h["kind"], f"{h['memory_gb']:.0f}", f"{h['bandwidth_gbs']:.0f}",
             ", ".join(f"{k} {v:g}" for k, v in h["peak_tflops"].items())] for h in hardware]
    print(format_table(["hardware", "kind", "memory GB", "GB/s", "peak TFLOP/s"], rows))


def run_cost(args: argparse.Namespace) -> int:
    config = from_namespace(CostConfig, args)
    if config.list:
        listing = catalog_listing(config.catalog)
        if args.json:
            a.emit_json(listing)
        else:
            _print_listing(listing)
        return 0
    result = cost(config)
    if args.json:
        a.emit_json(result.to_dict())
        return 0
    info = result.info
    print(f"{info['hardware']}, {info['dtype']}" + (f", target on tp {config.tp}" if config.tp > 1 else "")
          + (f" x pp {config.pp}" if config.pp > 1 else ""))
    for name, backend in info["backends"].items():
        print(f"  {name}: {backend}")
    if "kv_cache" in info:
        kv = info["kv_cache"]
        print(f"  KV cache of {config.target}: {kv['dtype']}, {kv['bytes_per_token_per_device']:,.0f} bytes per cached token per device")
    print(f"  engine: {info['engine_description']}")
    if any(str(b).startswith("roofline") for b in info["backends"].values()):
        print(f"  {info['roofline_terms']}")
    rows = [[r.model, r.batch, r.new_tokens, r.context, f"{r.seconds * 1e3:.4g}", r.bound, f"{r.c:.4g}"] for r in result.records]
    print(format_table(["model", "batch", "new tokens", "context", "ms", "bound", "c (vs target 1-token call)"], rows))
    devices = sorted({d.upper() for d in info["devices"].values()})
    print(f"each call split (ms): the {' or '.join(devices)} forward, CUDA-graph padding, the engine's host time and the fixed call "
          "overhead; they add up to the call")
    print(format_table(["model", "batch", "new tokens", "context", "forward", "padding", "engine host", "fixed overhead"],
                       [[r.model, r.batch, r.new_tokens, r.context] + ["inside forward" if v is None else f"{v * 1e3:.4g}"
                                                                    for v in (r.forward, r.padding, r.host, r.overhead)]
                        for r in result.records]))
    for name, text in info["split"].items():
        print(f"  {name}: {text}")
    for text in info.get("operators", {}).values():
        print(text)
    if info.get("breakdown"):
        shown = info["breakdown"]
        print(f"each call by operator (measured: from a table; estimated: a formula or the roofline; engine: its cited host time){'; the first ' + str(MAX_BREAKDOWN) + ' shapes per model' if len(shown) >= MAX_BREAKDOWN else ''}:")
        print(format_table(["model", "batch", "new tokens", "context", "part", "ms", "", "note"],
                           [[e["model"], e["batch"], e["new_tokens"], e["context"], p["part"], f"{p['seconds'] * 1e3:.4g}",
                             p["basis"], p["note"]] for e in shown for p in e["parts"]]))
    return 0


@dataclass
class ProfileResult:
    """What ``draftsim profile`` measured: ``profile`` (a :class:`draftsim.sim.cost.ProfileCost`:
    median seconds and spread per (batch, new tokens, context), lookup drafters' seconds per
    token), where it was written, and with ``--probe`` the fitted hardware entry's error against
    it (``comparison``); ``data`` is the JSON document ``--json`` prints."""

    profile: ProfileCost
    file: str
    comparison: dict | None
    data: dict

    def to_dict(self) -> dict:
        return self.data


def run_profile(args: argparse.Namespace) -> int:
    config = from_namespace(ProfileConfig, args)
    points = len(config.batch) * len(config.new_tokens) * len(config.context)
    with count_bar(points, f"profiling {config.model}") as bar:
        result = profile(config, bar.update)
    if args.json:
        a.emit_json(result.to_dict())
        return 0
    _print_profile(config, result)
    return 0


def profile(config: ProfileConfig, progress=None) -> ProfileResult:
    """Time a real model's forward calls over ``config``'s grid on this machine (and the lookup
    drafters' proposals), write the profile (and with ``probe`` a fitted local-cpu hardware
    entry); ``progress(n)`` is told as grid points finish. Everything is checked before the
    model loads."""
    check(config)
    out = a.output_file("--out", config.out, ".json")
    if config.probe:
        a.output_file("--probe", config.probe, ".json")
        a.distinct_outputs(("--out", config.out), ("--probe", config.probe))
    a.device(config.device)
    if config.model != "distilled":
        a.model_name("--model", config.model)
    drafter_names = [d.strip().lower() for d in config.drafters.split(",") if d.strip()]
    bad = [d for d in drafter_names if d not in CHEAP_DRAFTERS]
    if bad:
        raise DraftsimError(f"--drafters knows {', '.join(CHEAP_DRAFTERS)}; got {bad[0]!r}")
    from draftsim.realrun.profiling import check_path_grid, drafter_seconds, model_spec, probe_hardware, profile_model

    check_path_grid(config.path, config.batch, config.context)
    from draftsim.realrun.models import load_model

    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    if config.model == "distilled":  # named as run traces name it, so that check-sim matches it
        from draftsim.realrun.distill import load_distilled

        loaded = load_distilled(load_model("smollm2", device=config.device, dtype=config.dtype))
    else:
        loaded = load_model(config.model, device=config.device, dtype=config.dtype)
    if config.model.startswith("tiny") and config.dtype != "float32":
        loaded.model.to(getattr(__import__("torch"), config.dtype))
        loaded.dtype = config.dtype
    prof = profile_model(loaded, config.batch, config.new_tokens, config.context, repeats=config.repeats, warmup=config.warmup,
                         seed=config.seed, progress=progress, path=config.path)
    if drafter_names:
        prof.drafters = drafter_seconds(drafter_names, loaded.vocab_size)
    result = {"profile": config.out, "model": loaded.name, "dtype": loaded.dtype, "device": loaded.device, "path": config.path, "points": []}
    comparison = None
    if config.probe:
        from draftsim.sim.cost.roofline import fit_overhead

        hw = probe_hardware(dtypes=("float32", "bfloat16"))
        spec = model_spec(loaded)
        B, N, C = np.meshgrid(prof.batch, prof.new_tokens, prof.context, indexing="ij")
        roof = RooflineModel(spec, hw, loaded.dtype, check_memory=False)
        fitted = fit_overhead(roof, B, N, C, prof.seconds, fit_mfu=True)
        per_layer = fitted.overhead / spec.layers
        hw = replace(hw, overhead_per_layer=per_layer, mfu=fitted.mfu,
                     source=hw.source + f"; overhead {per_layer * 1e6:.0f} us per layer and MFU {fitted.mfu:.3f} fitted to the "
                                        f"{loaded.name} {loaded.dtype} profile")
        final = RooflineModel(spec, hw, loaded.dtype, check_memory=False)
        err = final.shape_time(B, N, C) / prof.seconds - 1
        comparison = {"overhead_per_layer_s": per_layer, "mfu": fitted.mfu, "relative_error": err.ravel().tolist(),
                      "median_abs_error": float(np.median(np.abs(err))), "worst_abs_error": float(np.max(np.abs(err))),
                      "roofline_without_fit_median_abs_error": float(np.median(np.abs(roof.shape_time(B, N, C) / prof.seconds - 1)))}
        write_catalog(config.probe, hardware={"local-cpu": hw})
        result["probe"] = {"file": config.probe, "measured": hw.measured, "overhead_per_layer_s": per_layer}
        result["roofline_vs_profile"] = comparison
    prof.save(out)
    for i, b in enumerate(prof.batch):
        for j, n in enumerate(prof.new_tokens):
            for k, c in enumerate(prof.context):
                result["points"].append({"batch": b, "new_tokens": n, "context": c, "seconds": float(prof.seconds[i, j, k]),
                                         "spread": float(prof.spread[i, j, k])})
    result["drafters"] = prof.drafters
    result["load_average"] = list(os.getloadavg())
    return ProfileResult(prof, config.out, comparison, result)


def _print_profile(config: ProfileConfig, out: ProfileResult) -> None:
    result, prof, comparison = out.data, out.profile, out.comparison
    rows = [[p["batch"], p["new_tokens"], p["context"], f"{p['seconds'] * 1e3:.3f}", f"{p['spread'] * 1e3:.3f}"] for p in result["points"]]
    print(f"{result['model']} ({result['dtype']}, {result['device']}, {config.path} forward path), {config.repeats} repeats after {config.warmup} warm-up; load average "
          + " ".join(f"{x:.2f}" for x in result["load_average"]))
    print(format_table(["batch", "new tokens", "context", "median ms", "spread ms"], rows))
    for name, d in prof.drafters.items():
        print(f"{name}: {d['seconds_per_token'] * 1e6:.1f} us per proposed token")
    if comparison:
        print(f"roofline (local-cpu; fitted overhead {comparison['overhead_per_layer_s'] * 1e6:.0f} us/layer, MFU {comparison['mfu']:.3f}) "
              f"vs profile: median |error| {comparison['median_abs_error']:.1%}, worst {comparison['worst_abs_error']:.1%} (probe "
              f"numbers alone: median {comparison['roofline_without_fit_median_abs_error']:.1%}); hardware entry written to {config.probe}")
    print(f"profile written to {config.out}")
