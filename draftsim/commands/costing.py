"""``draftsim profile`` and ``draftsim cost``: forward times from measurement or from hardware.

``profile`` measures a real model on this machine over a grid (batch × new tokens × context)
and writes a profile file; ``--probe`` also measures the machine (memory bandwidth, FLOP/s)
and writes a ``local-cpu`` hardware entry whose fixed overhead is fitted to the profile.

``cost`` prints t(forward) of a target and its drafters for every asked shape from the
roofline (catalog models on catalog hardware) or from a measured profile, the cost
coefficients c and what bounds each call. :func:`add_hardware_options` and
:func:`hardware_coefficients` give ``plan``, ``ewif``, ``simulate`` and ``optimize`` the same
model/hardware options in place of ``--cost``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

import numpy as np

from draftsim.analysis.table import format_table
from draftsim.sim.cost import CallCost, CostModel, RooflineModel, default_catalog, load_profile
from draftsim.sim.cost.catalog import DTYPE_BYTES, Catalog, hardware_from_entry, model_from_entry, write_catalog
from draftsim.sim.errors import DraftsimError, as_count, parse_numbers

from .. import args as a
from ..progress import count_bar

#: Drafters that are not neural models: priced by a profile's proposal timing, else free.
CHEAP_DRAFTERS = ("maxgram", "bigram")


def _ints(name: str, minimum: int):
    def parse(text: str) -> list[int]:
        try:
            out = as_count(name, parse_numbers(name, text), minimum=minimum)
        except DraftsimError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return sorted(set(int(v) for v in out))

    parse.__name__ = name
    return parse


def add_hardware_options(p, *, drafter_flag: str = "--drafter-model", shapes: bool = False) -> None:
    """The model/hardware options shared by ``cost`` and the planning commands."""
    g = p.add_argument_group("models and hardware" if shapes else "models on hardware (in place of --cost)")
    g.add_argument("--target", dest="target_model", metavar="MODEL", help="target model: a catalog name (draftsim cost --list) or a config.json path")
    g.add_argument(drafter_flag, dest="drafter_models", action="append", metavar="MODEL",
                   help="draft model (repeat, in drafter order): catalog name, config.json path, maxgram or bigram")
    g.add_argument("--hardware", metavar="HW", help="hardware from the catalog (draftsim cost --list)")
    g.add_argument("--tp", type=a.count("tp", 1, 1024), default=1, help="tensor-parallel devices for the target (default 1)")
    g.add_argument("--pp", type=a.count("pp", 1, 1024), default=1, help="pipeline stages for the target (default 1)")
    g.add_argument("--drafter-tp", type=a.count("drafter_tp", 1, 1024), default=1, help="tensor-parallel devices per drafter (default 1)")
    g.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="bfloat16", help="weights/activations dtype (default bfloat16)")
    g.add_argument("--profile", action="append", default=[], metavar="FILE", help="measured profile (draftsim profile) for a model it names")
    g.add_argument("--catalog", action="append", default=[], metavar="FILE", help="extra model or hardware catalog file (repeat)")
    g.add_argument("--mfu", type=a.positive("mfu"), help="override the hardware's model FLOP utilisation (0, 1]")
    g.add_argument("--mbu", type=a.positive("mbu"), help="override the hardware's memory bandwidth utilisation (0, 1]")
    g.add_argument("--overhead", type=a.cost("overhead"), help="fixed seconds per forward call, replacing the hardware's per-call and per-layer overhead")
    if not shapes:
        g.add_argument("--cost-batch", type=a.count("cost_batch", 1, 1 << 20), default=1, help="batch size the cost coefficients are taken at (default 1)")
        g.add_argument("--cost-context", type=a.count("cost_context", 0, 1 << 24), default=512, help="context length for the cost coefficients (default 512)")


def uses_hardware(args) -> bool:
    return any(getattr(args, k, None) for k in ("target_model", "hardware", "drafter_models"))


def _same_model(catalog: Catalog, x: str, y: str) -> bool:
    if x.lower() == y.lower():
        return True
    canon = lambda n: catalog.aliases.get(n.lower(), n.lower())  # noqa: E731
    return canon(x) == canon(y)


def build_models(args) -> tuple[CostModel, list[CostModel], dict]:
    """The target's and each drafter's cost model from the options; validates everything
    (names, hardware, memory, profiles' fingerprints) before any heavy work."""
    if not args.target_model or not args.hardware:
        raise DraftsimError("give --target MODEL and --hardware HW (and drafters) to price calls from hardware; draftsim cost --list names them")
    catalog = default_catalog(args.catalog)
    hw = catalog.hardware_spec(args.hardware)
    profiles = [load_profile(p) for p in args.profile]
    used = set()
    info = {"hardware": hw.name, "dtype": args.dtype, "tp": args.tp, "pp": args.pp, "backends": {}}

    def profile_for(name: str):
        for i, prof in enumerate(profiles):
            if _same_model(catalog, prof.model, name):
                if hw.kind != "cpu" or prof.device.split(":")[0] != "cpu":
                    raise DraftsimError(f"the profile {args.profile[i]} was measured on {prof.device} "
                                        f"({prof.fingerprint.get('machine', {}).get('cpu', '?')}), not on {hw.name}; use --hardware local-cpu")
                from draftsim.realrun.profiling import machine_fingerprint

                here = machine_fingerprint("cpu")
                prof.check_fingerprint(machine={k: here[k] for k in ("cpu", "cores")})
                try:
                    spec = catalog.model(name)
                except DraftsimError:
                    spec = None  # a model the catalog does not know (e.g. tiny:SEED): its name must do
                if spec is not None and prof.fingerprint.get("model", {}).get("architecture") not in (None, spec.architecture):
                    raise DraftsimError(f"the profile {args.profile[i]} was measured for another model: architecture "
                                        f"{prof.fingerprint['model']['architecture']}, not {name}'s {spec.architecture}")
                if prof.dtype and prof.dtype != args.dtype:
                    raise DraftsimError(f"the profile {args.profile[i]} was measured in {prof.dtype}, not {args.dtype}; pass --dtype {prof.dtype}")
                used.add(i)
                return prof
        return None

    def one(name: str, tp: int, pp: int) -> CostModel:
        if name.lower() in CHEAP_DRAFTERS:
            for i, prof in enumerate(profiles):
                if name.lower() in prof.drafters:
                    used.add(i)
                    info["backends"][name] = f"measured proposal time per token ({prof.model} profile)"
                    return CallCost(0.0, float(prof.drafters[name.lower()]["seconds_per_token"]))
            info["backends"][name] = "free (no profile with its proposal timing)"
            return CallCost(0.0)
        prof = profile_for(name)
        if prof is not None:
            info["backends"][name] = f"profile {prof.name}"
            return prof
        spec = catalog.model(name)
        model = RooflineModel(spec, hw, args.dtype, tp, pp, mfu=args.mfu, mbu=args.mbu, overhead=args.overhead,
                              overhead_per_layer=None if args.overhead is None else 0.0)
        info["backends"][name] = f"roofline: {model.name}"
        return model

    target = one(args.target_model, args.tp, args.pp)
    drafters = [one(d, args.drafter_tp, 1) for d in (args.drafter_models or [])]
    unused = [args.profile[i] for i in range(len(profiles)) if i not in used]
    if unused:
        raise DraftsimError(f"the profile {unused[0]} is of model {profiles[args.profile.index(unused[0])].model!r}, "
                            f"neither the target nor a drafter")
    return target, drafters, info


def hardware_coefficients(args, n_drafters: int | None = None) -> tuple[list[float], dict]:
    """Cost coefficients c of the drafters (one-token call over the target's, at
    --cost-batch and --cost-context) from the model/hardware options, and a description."""
    target, drafters, info = build_models(args)
    if n_drafters is not None and len(drafters) != n_drafters:
        raise DraftsimError(f"give one --drafter-model per drafter ({n_drafters}); got {len(drafters)}")
    b, ctx = args.cost_batch, args.cost_context
    _check_memory([target, *drafters], [b], [ctx], [1])
    t0 = float(target.shape_time(b, 1, ctx))
    cs = [float(d.shape_time(b, 1, ctx)) / t0 for d in drafters]
    info.update({"batch": b, "context": ctx, "target_seconds": t0, "coefficients": cs})
    return cs, info


def verify_table(args, n_max: int) -> list[float]:
    """The target's verification cost v(n) = t(n) / t(1), n = 1..``n_max``, at --cost-batch
    and --cost-context (:func:`draftsim.sim.analytic.ewif`'s ``verify``); a profile's table stops
    where its grid of new tokens does."""
    from draftsim.sim.cost.profile import ProfileCost

    target, _, _ = build_models(args)
    b, ctx = args.cost_batch, args.cost_context
    n = np.arange(1, n_max + 1)
    if isinstance(target, ProfileCost):
        inside = ~np.asarray(target.outside(b, n, ctx))
        n = n[: int(np.argmin(inside)) if not inside.all() else n.size]
        if n.size == 0:
            raise DraftsimError(f"the profile of {target.model} does not hold batch {b}, context {ctx}: pass --cost-batch/--cost-context inside its grid")
    t = np.asarray(target.shape_time(b, n, ctx), dtype=np.float64)
    return (t / t[0]).tolist()


def coefficients_or_hardware(args, given, n_drafters: int | None = None) -> tuple[list[float], dict | None]:
    """The cost coefficients typed with --cost (``given``), or computed from the model/hardware
    options (exactly one of the two); with the description of the hardware ones."""
    hardware = uses_hardware(args)
    if hardware and given:
        raise DraftsimError("give either --cost or the model/hardware options (--target, --drafter-model, --hardware), not both")
    if not hardware:
        if not given:
            raise DraftsimError("give --cost (the drafter's cost coefficient) or --target MODEL --drafter-model MODEL --hardware HW")
        return list(given), None
    return hardware_coefficients(args, n_drafters)


def hardware_costs(args, n_drafters: int | None = None):
    """:class:`draftsim.sim.cost.Costs` in target calls for the simulators: each model's t(n) at
    --cost-batch and --cost-context fitted as a + b·n over n = 1..16 (the one-token call exact)."""
    from draftsim.sim.cost import Costs

    coefficients, info = hardware_coefficients(args, n_drafters)
    target, drafters, _ = build_models(args)
    return Costs.from_models([target, *drafters], batch=args.cost_batch, context=args.cost_context), info


def hardware_times(args, n_drafters: int | None = None) -> tuple[CostModel, list[CostModel], dict]:
    """The target's and drafters' cost models, checked to fit at --cost-batch/--cost-context
    (for planners that take a whole t(n) rather than a coefficient)."""
    hardware_coefficients(args, n_drafters)
    return build_models(args)


def drafter_specs(args, specs: list[str]) -> list[str]:
    """``NAME:ALPHA:MODEL`` drafter specs with the model's cost coefficient in place of MODEL
    (specs whose third field is already a number are kept)."""
    out, models, where = list(specs), [], []
    for i, spec in enumerate(specs):
        parts = spec.split(":")
        if len(parts) == 3:
            try:
                float(parts[2])
            except ValueError:
                models.append(parts[2])
                where.append(i)
    if args.drafter_models:
        raise DraftsimError("with plan, name each drafter's model in its spec: --drafter NAME:ALPHA:MODEL")
    if not models:
        raise DraftsimError("with --target/--hardware, give drafters as NAME:ALPHA:MODEL (e.g. small:0.8:llama-2-7b)")
    args.drafter_models = models
    cs, info = hardware_coefficients(args, len(models))
    for i, c in zip(where, cs):
        name, alpha, _ = out[i].split(":")
        out[i] = f"{name}:{alpha}:{c!r}"
    return out, info


def describe_coefficients(info: dict) -> str:
    text = (f"costs from {info['hardware']} ({info['dtype']}, batch {info['batch']}, context {info['context']}): target call "
            f"{info['target_seconds'] * 1e3:.3f} ms, c = " + ", ".join(f"{c:.4g}" for c in info["coefficients"]))
    if info.get("verify"):
        v = info["verify"]
        shown = ", ".join(f"v({n})={v[n - 1]:.3g}" for n in (1, 2, 3, 5, 9, 17, 33) if n <= len(v))
        text += f"\ntarget's verification of n tokens over one (drafts up to {len(v) - 1} tokens): {shown}"
    return text


def _check_memory(models, batches, contexts, new_tokens) -> None:
    for m in models:
        if isinstance(m, RooflineModel):
            m.check_fits(max(batches), max(contexts) + max(new_tokens))


def register(sub, common) -> None:
    p = sub.add_parser(
        "cost", parents=[common], help="forward times, cost coefficients and bounds from hardware or a profile",
        description="Time of one forward call of the target and each drafter for every asked shape (batch x new tokens x "
        "context), from the roofline (catalog model on catalog hardware) or a measured profile; the cost coefficient c "
        "(time over the target's one-new-token call at the same batch and context); and whether the call is memory-, "
        "compute- or overhead-bound.",
    )
    add_hardware_options(p, drafter_flag="--drafter", shapes=True)
    p.add_argument("--batch", type=_ints("batch", 1), default=[1], help="batch sizes, comma-separated (default 1)")
    p.add_argument("--new-tokens", type=_ints("new_tokens", 1), default=[1], help="new tokens per sequence, comma-separated (default 1)")
    p.add_argument("--context", type=_ints("context", 0), default=[512], help="cached tokens per sequence, comma-separated (default 512)")
    p.add_argument("--list", action="store_true", help="list the catalog's models and hardware and exit")
    p.set_defaults(run=run_cost)

    p = sub.add_parser(
        "profile", parents=[common], help="measure a real model's forward times on this machine",
        description="Time a model's forward call over a grid of batch sizes x new tokens x context lengths (warm-up, "
        "repeats, median and spread) and write a profile file for draftsim cost --profile; --probe also measures this "
        "machine (memory bandwidth, FLOP/s) and writes a local-cpu hardware entry fitted to the profile.",
    )
    p.add_argument("--model", default="smollm2", help="smollm2 (embedded), distilled (draftsim distill's draft of smollm2), tiny[:SEED], "
                   "a checkpoint folder or a .gguf file (one model per run: profile the target and each neural drafter, then "
                   "pass every file to cost --profile or check-sim --profile)")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="profile file to write")
    p.add_argument("--batch", type=_ints("batch", 1), default=[1, 2, 4], help="batch sizes (default 1,2,4)")
    p.add_argument("--new-tokens", type=_ints("new_tokens", 1), default=[1, 2, 4, 8, 16], help="new tokens per sequence (default 1,2,4,8,16)")
    p.add_argument("--context", type=_ints("context", 0), default=[128, 512], help="cached tokens (default 128,512)")
    p.add_argument("--repeats", type=a.count("repeats", 1, 10_000), default=5, help="timed calls per grid point (default 5)")
    p.add_argument("--warmup", type=a.count("warmup", 0, 10_000), default=1, help="untimed calls first (default 1)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="weights and activations (default float32)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    p.add_argument("--drafters", default="maxgram,bigram", help="cheap drafters whose proposal time is measured ('' for none)")
    p.add_argument("--probe", metavar="HW.json", help="also measure this machine and write a local-cpu hardware catalog file")
    p.add_argument("--threads", type=a.count("threads", 1, 1024), help="torch CPU threads (default torch's; 1 is steadier on a busy machine)")
    p.add_argument("--path", choices=("model", "server"), default="model",
                   help="the forward call timed: model = the model's own call (what the single-stream executors make and "
                   "check-sim prices, default); server = the batched serving loop's (ragged attention mask, per-row positions: "
                   "what draftsim serve makes and check-serve prices)")
    p.add_argument("--seed", type=a.count("seed"), default=0)
    p.set_defaults(run=run_profile)


def _list(args) -> int:
    cat = default_catalog(args.catalog)
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
    if args.json:
        a.emit_json({"models": models, "hardware": hardware})
        return 0
    rows = [[m["name"], f"{m['parameters'] / 1e9:.3g}B" if m["supported"] else "-", m.get("layers", "-"), m.get("hidden", "-"),
             f"{m['heads']}/{m['kv_heads']}" if m["supported"] else "-", "" if m["supported"] else "unsupported: encoder-decoder"]
            for m in models]
    print(format_table(["model", "params", "layers", "hidden", "heads/kv", "note"], rows))
    rows = [[h["name"], h["kind"], f"{h['memory_gb']:.0f}", f"{h['bandwidth_gbs']:.0f}",
             ", ".join(f"{k} {v:g}" for k, v in h["peak_tflops"].items())] for h in hardware]
    print(format_table(["hardware", "kind", "memory GB", "GB/s", "peak TFLOP/s"], rows))
    return 0


def run_cost(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    target, drafters, info = build_models(args)
    names = [args.target_model] + list(args.drafter_models or [])
    _check_memory([target, *drafters], args.batch, args.context, args.new_tokens)
    B, N, C = (np.array(v) for v in np.meshgrid(args.batch, args.new_tokens, args.context, indexing="ij"))
    B, N, C = B.ravel(), N.ravel(), C.ravel()
    unit = target.shape_time(B, 1, C)
    records = []
    for name, model in zip(names, [target, *drafters]):
        secs = np.atleast_1d(model.shape_time(B, N, C))
        bounds = np.atleast_1d(model.shape_bound(B, N, C))
        for b, n, c, s, bd, u in zip(B, N, C, secs, bounds, unit):
            records.append({"model": name, "role": "target" if model is target else "drafter", "batch": int(b), "new_tokens": int(n),
                            "context": int(c), "seconds": float(s), "bound": str(bd), "c": float(s / u)})
    if args.json:
        a.emit_json({**info, "records": records})
        return 0
    print(f"{info['hardware']}, {info['dtype']}" + (f", target on tp {args.tp}" if args.tp > 1 else "") + (f" x pp {args.pp}" if args.pp > 1 else ""))
    for name, backend in info["backends"].items():
        print(f"  {name}: {backend}")
    rows = [[r["model"], r["batch"], r["new_tokens"], r["context"], f"{r['seconds'] * 1e3:.4g}", r["bound"], f"{r['c']:.4g}"] for r in records]
    print(format_table(["model", "batch", "new tokens", "context", "ms", "bound", "c (vs target 1-token call)"], rows))
    return 0


def run_profile(args: argparse.Namespace) -> int:
    out = a.output_file("--out", args.out, ".json")
    if args.probe:
        a.output_file("--probe", args.probe, ".json")
        a.distinct_outputs(("--out", args.out), ("--probe", args.probe))
    a.device(args.device)
    if args.model != "distilled":
        a.model_name("--model", args.model)
    drafter_names = [d.strip().lower() for d in args.drafters.split(",") if d.strip()]
    bad = [d for d in drafter_names if d not in CHEAP_DRAFTERS]
    if bad:
        raise DraftsimError(f"--drafters knows {', '.join(CHEAP_DRAFTERS)}; got {bad[0]!r}")
    from draftsim.realrun.models import load_model
    from draftsim.realrun.profiling import drafter_seconds, model_spec, probe_hardware, profile_model

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.model == "distilled":  # named as run traces name it, so that check-sim matches it
        from draftsim.realrun.distill import load_distilled

        loaded = load_distilled(load_model("smollm2", device=args.device, dtype=args.dtype))
    else:
        loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    if args.model.startswith("tiny") and args.dtype != "float32":
        loaded.model.to(getattr(__import__("torch"), args.dtype))
        loaded.dtype = args.dtype
    points = len(args.batch) * len(args.new_tokens) * len(args.context)
    with count_bar(points, f"profiling {loaded.name}") as bar:
        prof = profile_model(loaded, args.batch, args.new_tokens, args.context, repeats=args.repeats, warmup=args.warmup,
                             seed=args.seed, progress=bar.update, path=args.path)
    if drafter_names:
        prof.drafters = drafter_seconds(drafter_names, loaded.vocab_size)
    result = {"profile": args.out, "model": loaded.name, "dtype": loaded.dtype, "device": loaded.device, "path": args.path, "points": []}
    comparison = None
    if args.probe:
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
        write_catalog(args.probe, hardware={"local-cpu": hw})
        result["probe"] = {"file": args.probe, "measured": hw.measured, "overhead_per_layer_s": per_layer}
        result["roofline_vs_profile"] = comparison
    prof.save(out)
    for i, b in enumerate(prof.batch):
        for j, n in enumerate(prof.new_tokens):
            for k, c in enumerate(prof.context):
                result["points"].append({"batch": b, "new_tokens": n, "context": c, "seconds": float(prof.seconds[i, j, k]),
                                         "spread": float(prof.spread[i, j, k])})
    result["drafters"] = prof.drafters
    result["load_average"] = list(os.getloadavg())
    if args.json:
        a.emit_json(result)
        return 0
    rows = [[p["batch"], p["new_tokens"], p["context"], f"{p['seconds'] * 1e3:.3f}", f"{p['spread'] * 1e3:.3f}"] for p in result["points"]]
    print(f"{loaded.name} ({loaded.dtype}, {loaded.device}, {args.path} forward path), {args.repeats} repeats after {args.warmup} warm-up; load average "
          + " ".join(f"{x:.2f}" for x in result["load_average"]))
    print(format_table(["batch", "new tokens", "context", "median ms", "spread ms"], rows))
    for name, d in prof.drafters.items():
        print(f"{name}: {d['seconds_per_token'] * 1e6:.1f} us per proposed token")
    if comparison:
        print(f"roofline (local-cpu; fitted overhead {comparison['overhead_per_layer_s'] * 1e6:.0f} us/layer, MFU {comparison['mfu']:.3f}) "
              f"vs profile: median |error| {comparison['median_abs_error']:.1%}, worst {comparison['worst_abs_error']:.1%} (probe "
              f"numbers alone: median {comparison['roofline_without_fit_median_abs_error']:.1%}); hardware entry written to {args.probe}")
    print(f"profile written to {args.out}")
    return 0
