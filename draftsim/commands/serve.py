"""``draftsim serve`` and ``draftsim check-serve``: real batched speculative serving, and the
serving simulator held against what it did."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from draftsim.analysis.table import format_table
from draftsim.sim.cost.operators import COST_MODELS
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import POLICY_HELP
from draftsim.sim.registry import drafter_help, engine_help, lookup_drafters
from draftsim.sim.serving.scheduler import SCHEDULING_POLICIES

from .. import args as a
from ..config import add_options, check, from_namespace, option, typed
from ..progress import count_bar, null_bar
from .servesim import ServeSummary
from .table import summary


@dataclass(kw_only=True)
class ServeConfig:
    """``draftsim serve``: a workload of real prompts served with continuous batching and
    speculative decoding on real models."""

    target: str = option("smollm2", "target: smollm2 (embedded), tiny[:SEED], random:NAME[:SEED] (random weights, a catalog model's shape), a checkpoint folder or a .gguf file",
                         aliases=("--model",))
    drafter: str = option("maxgram", f"{lookup_drafters()} (default maxgram), distilled, a neural model, controlled:R[@MODEL] "
                                     "(prescribed acceptance R, each draft token costing a batched forward of MODEL), or none")
    policy: str | None = option(help="sim policy of one drafter (default fixed:k=4; ar without a drafter)")
    controller: str = option("none", "speculation controller per step (sim.controllers; default none)")
    qps: float | None = option(help="mean arrival rate, requests/s", type=a.positive("qps"))
    arrivals: str = option("poisson", "arrival process: poisson (default), gamma:cv=C, fixed")
    request_trace: str | None = option(help="CSV/JSONL request trace (arrival time, prompt and output tokens)")
    duration: float | None = option(help="how long arrivals come: seconds, or with a unit (90, 500ms, 2m, 1h)", type=a.duration("duration"))
    requests: int | None = option(help="number of requests", type=a.count("requests", 1, 1_000_000))
    prompt_len: str = option("bundled", "prompt lengths: bundled (the prompts as they are) or a distribution "
                             "(fixed:N, uniform:LO,HI, lognormal:..., zipf:...)")
    output_len: str = option("fixed:64", "output lengths (default fixed:64)")
    prompts: str = option("code,instructions,docstrings,arithmetic", "bundled prompt sets, comma-separated")
    eos: bool = option(False, "end a request at EOS (default: at its output length)", flag=True)
    max_batch: int = option(16, "most running sequences (default 16)", type=a.count("max_batch", 1, 4096))
    kv_tokens: int | None = option(help="KV pool in tokens: the scheduler admits and preempts by it as serve-sim's does (a preempted "
                                   "request is recomputed when readmitted; default: no pool, max_batch bounds the batch)",
                                   type=a.count("kv_tokens", 1))
    block_size: int = option(16, "KV block size in tokens of the pool (default 16)", type=a.count("block_size", 1, 4096))
    scheduling: str = option("fcfs", "waiting queue of the scheduler the server runs (the serving simulator's; default fcfs)",
                             choices=SCHEDULING_POLICIES)
    temperature: float = option(0.0, "0 = greedy", type=a.cost("temperature"))
    top_k: int | None = option(type=a.count("top_k", 1, 1_000_000))
    seed: int = option(0, type=a.count("seed"))
    trace: str | None = option(help="write the serving trace to this new folder")
    device: str = option("auto", "auto (CUDA when present), cpu or cuda[:N]")
    dtype: str = option("float32", choices=("float32", "bfloat16", "float16"))
    static_cache: bool = option(False, "execute through static KV caches with fixed shapes (CUDA graphs on a CUDA device; "
                                "draftsim.realrun.statickv)", flag=True)
    threads: int | None = option(help="torch CPU threads (default torch's; 1 is steadier on a busy machine)",
                                 type=a.count("threads", 1, 1024))


@dataclass(kw_only=True)
class CheckServeConfig:
    """``draftsim check-serve``: a serving trace replayed in the serving simulator and compared
    with the run."""

    trace: str | None = option(help="serving trace folder (draftsim serve --trace); or give --vllm-result", positional=True, nargs="?")
    vllm_result: str | None = option(help="a vllm bench serve --save-result --save-detailed file as the measurement: its workload "
                                     "replayed in serve-sim on --target/--hardware (a speculative run: with --drafter-model and the "
                                     "file's per-position acceptance)", metavar="FILE", group="vLLM result")
    target: str | None = option(help="with --vllm-result or --hardware: the served model (catalog name or config.json; default for a "
                                "trace: its target, random:NAME as NAME)", metavar="MODEL", group="catalog deployment")
    hardware: str | None = option(help="the catalog hardware the run served on: with --vllm-result; with a TRACE, price it by the catalog rooflines "
                                  "and engine overheads instead of measured costs", metavar="HW", group="catalog deployment")
    tp: int = option(1, "tensor-parallel devices (default 1)", type=a.count("tp", 1, 1024), group="catalog deployment")
    dtype: str = option("bfloat16", "dtype (default bfloat16)", group="catalog deployment")
    drafter_model: list[str] | None = option(help=f"a speculative run's {drafter_help()} (default for a trace: its "
                                             "drafter's model, a controlled drafter's cost model)", append=True,
                                             metavar="MODEL", group="catalog deployment")
    engine: str | None = option(help=f"the serving engine whose overheads go on the rooflines: {engine_help()} (default: vllm on "
                                "catalog GPUs; none for a draftsim calibrate entry, whose fit holds them)", group="catalog deployment",
                                aliases=("--overheads",))
    catalog: list[str] = option([], "extra catalog file (e.g. draftsim calibrate's)", append=True, metavar="FILE",
                                group="catalog deployment")
    cost_model: str = option("roofline", "with --hardware: how the models' forwards are priced, roofline (default) or operators "
                             "(kernel times measured by NVIDIA AIConfigurator; see draftsim cost --help)", choices=COST_MODELS,
                             group="catalog deployment")
    profile: str | None = option(help="cost profile of the target on this machine (draftsim profile --path server)")
    prefill_profile: list[str] = option([], "a second profile that prices the joiners' prefills (batch 1, context 0, new tokens "
                                        "up to the longest prompt, its last-row table; of a --static-cache run: profile --path "
                                        "server-prefill): the step grid then needs no long calls (default: --profile prices both). "
                                        "Repeat it with the draft model's to price the drafter's read of each prompt, which the "
                                        "server times inside the prefill", append=True, metavar="FILE")
    draft_profile: str | None = option(help="a profile of the draft model on the server's path (profile --path server-static for "
                                       "a --static-cache run, else server) that prices the drafter's batched calls at their shapes "
                                       "(default: the run's mean seconds per call)", metavar="FILE")
    costs_from: str | None = option(help="fit the target's costs to another serving trace of the same model and machine (a "
                                    "calibration run); default, without --profile: fitted to TRACE itself (in-sample)",
                                    metavar="TRACE")


@dataclass
class ServeResult:
    """What ``draftsim serve`` did: the setting, the workload's size, the run's serving metrics
    typed (the serving simulator's summary of the run: TTFT, TPOT, ITL, E2E, throughput, vLLM's
    spec-decode counters) and ``data``, the JSON document ``--json`` prints."""

    target: str
    drafter: str | None
    policy: str
    controller: str
    max_batch: int
    qps: float | None
    requests_planned: int
    planned_tokens: int
    trace: str | None
    seconds: float  #: wall seconds of the run
    overhead_per_step: float  #: mean seconds per step outside the models' forward calls
    metrics: ServeSummary
    data: dict

    def to_dict(self) -> dict:
        return self.data


@dataclass(frozen=True)
class CheckRow:
    """One metric of a check: predicted by the serving simulator, measured in the run."""

    metric: str
    predicted: float
    measured: float
    relative_error: float


@dataclass
class CheckServeResult:
    """What ``draftsim check-serve`` found: the run's setting, how its costs were priced, and
    per metric the simulator's prediction against the measurement (``data``: the whole
    comparison; ``--json`` prints its ``metrics`` rows)."""

    path: str
    target: str | None
    drafter: str | None
    policy: str | None
    requests: int
    costs: str
    metrics: list[CheckRow]
    data: dict

    def to_dict(self) -> dict:
        return self.data


def register(sub, common) -> None:
    p = sub.add_parser("serve", parents=[common], help=summary("serve"),
                       description="Serve a workload of real prompts with continuous batching: requests arrive in wall-clock time "
                       "(--qps with --arrivals, or --request-trace), are prefilled, and the running batch is decoded with speculative "
                       "decoding (the drafter proposes for every sequence, the target verifies all blocks in one batched forward). "
                       "Prints TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99), throughput and vLLM's spec-decode "
                       "metrics; --trace writes a serving trace for draftsim check-serve.",
                       epilog=POLICY_HELP + "\n\nDrafters: maxgram, bigram, distilled, tiny[:SEED], a checkpoint folder, or none "
                       "(autoregressive serving).", formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p, ServeConfig)
    p.set_defaults(run=run)

    c = sub.add_parser("check-serve", parents=[common], help=summary("check-serve"),
                       description="Replay a real serving run (draftsim serve --trace) in the serving simulator: the same "
                       "arrivals and lengths, each request's realised acceptance, step costs from a draftsim profile of the same "
                       "model and machine and the measured per-step overhead (or, with --hardware, the catalog rooflines and "
                       "engine overheads of that deployment, nothing measured). Reports predicted against measured TTFT, TPOT, "
                       "end-to-end latency (p50, p90) and throughput with relative errors.")
    add_options(c, CheckServeConfig)
    c.set_defaults(run=run_check)


def _controller(spec: str, policy, max_batch: int):
    """A speculation controller from its mini-language (``none``: no cap), bound to the run."""
    from draftsim.sim.controllers import Goodput, parse_controller

    if spec.strip() == "none":
        return None
    controller = parse_controller(spec)
    if isinstance(controller, Goodput):
        raise DraftsimError("--controller goodput needs cost models and an acceptance model; real serving takes none, disable:above=B "
                            "or table:k=... (simulate goodput with draftsim serve-sim)")
    controller.bind(policy, None, None, [], max_batch)
    return controller


def _workload(config: ServeConfig):
    import numpy as np

    from draftsim.sim.serving.workload import make_workload, parse_arrivals, parse_lengths

    if config.request_trace is None and config.qps is None:
        raise DraftsimError("give --qps (with --requests or --duration) or --request-trace")
    rng = np.random.default_rng(config.seed)
    arrivals = parse_arrivals(config.arrivals)
    if arrivals.closed:
        raise DraftsimError("draftsim serve takes open-loop arrivals (poisson, gamma:cv=C, fixed); closed loops are simulated only")
    bundled = config.prompt_len.strip() == "bundled"
    prompt = parse_lengths("fixed:1" if bundled else config.prompt_len, "--prompt-len")
    output = parse_lengths(config.output_len, "--output-len")
    w = make_workload(arrivals=arrivals, qps=config.qps, requests=config.requests, duration=config.duration, prompt=prompt,
                      output=output, rng=rng, trace=config.request_trace)
    prompt_tokens = np.zeros(len(w), dtype=np.int64) if bundled and config.request_trace is None else w.prompt
    return w.arrival, prompt_tokens, w.output, w.priority


def serve(config: ServeConfig, bar=null_bar, models: dict | None = None) -> ServeResult:
    """Serve ``config``'s workload with real models; the serving metrics (TTFT, TPOT, ITL, E2E,
    throughput, vLLM's spec-decode counts: :func:`draftsim.realrun.servetrace.serving_metrics`)
    with the run's setting, and the serving trace written where ``config.trace`` says.
    ``bar(total, desc)`` is a progress-bar context. Everything but the model is checked before
    it loads.

    ``models``: a dict this call loads its models into, keyed by (name, device, dtype), and takes
    them from when a run before it in the same process loaded them: their weights, and on a static
    cache the buffers and CUDA graphs released to each model's pool. On an H200 a serving process
    spent 75-90 s loading an 8B random model and capturing graphs before its first request (its
    requests took 27-50 s), so several runs in one process fit a lent GPU's minutes."""
    import numpy as np

    from draftsim.realrun.executor import Sampling
    from draftsim.realrun.methods import make_drafter
    from draftsim.realrun.models import check_all_fit, load_model, pick_device
    from draftsim.realrun.profiling import machine_fingerprint, model_fingerprint
    from draftsim.realrun.servetrace import ServeTraceWriter, serving_metrics
    from draftsim.realrun.serving import Server, check_memory, check_requests, prompt_pool, requests_from
    from draftsim.sim.policies import parse_policy

    check(config)
    if config.top_k is not None and config.temperature == 0:
        raise DraftsimError("--top-k applies to sampling; give --temperature > 0")
    a.model_name("--target", config.target)
    a.device(config.device)
    drafter_name = None if config.drafter.strip() == "none" else a.drafter_names("--drafter", [config.drafter])[0]
    policy_spec = config.policy or ("fixed:k=4" if drafter_name else "ar")
    policy = parse_policy(policy_spec)
    controller = _controller(config.controller, policy, config.max_batch)
    sets = a.prompt_sets("--prompts", config.prompts)
    if config.trace is not None:
        trace = a.output_folder("--trace", config.trace)
        if trace.exists() and any(trace.iterdir()):
            raise DraftsimError(f"--trace {config.trace!r} is not empty; serving traces are written to a new folder (a run's clock "
                                "cannot be resumed)")
    arrival, prompt_tokens, output_tokens, priority = _workload(config)
    if config.kv_tokens is not None and prompt_tokens.all():  # lengths known before the model loads: check the pool now
        from draftsim.realrun.serving import server_pool

        i = int(np.argmax(prompt_tokens + output_tokens))
        server_pool(config.kv_tokens, config.block_size, policy.max_draft).check_request(int(prompt_tokens[i]), int(output_tokens[i]))
    if not np.all(np.isfinite(arrival)):
        raise DraftsimError("the workload has no arrival times; give --qps or a request trace with a time column")
    if drafter_name is not None and drafter_name.startswith("controlled") and config.temperature != 0:
        raise DraftsimError(f"--drafter {drafter_name} proposes the target's greedy output; give --temperature 0")
    sampling = Sampling(config.temperature, config.top_k)
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    def load(name, device, dtype):
        if models is None:
            return load_model(name, device=device, dtype=dtype)
        key = (name, device, dtype)
        if key not in models:
            models[key] = load_model(name, device=device, dtype=dtype)
        return models[key]

    if models is None or (config.target, config.device, config.dtype) not in models:  # what is loaded already fits
        check_all_fit([config.target, *([drafter_name] if drafter_name else [])], pick_device(config.device), config.dtype)
    target = load(config.target, config.device, config.dtype)
    drafter = make_drafter(drafter_name, target, load=load) if drafter_name else None
    requests = requests_from(arrival, prompt_tokens, output_tokens, prompt_pool(target, sets), priority)
    check_requests(target, requests)
    from draftsim.commands.running import static_cache

    batched = [target] + ([drafter.batch_model] if drafter is not None and drafter.batch_model is not None else [])
    if config.static_cache:
        longest = max(len(r.prompt) + r.max_new_tokens for r in requests)
        static_cache(batched, longest + policy.max_draft + 1)
    else:  # a model a run before this one set to a static cache serves eagerly now
        for m in batched:
            m.static_tokens = None
    server = Server(target, drafter, policy, controller, sampling, max_batch=config.max_batch, seed=config.seed,
                    stop_at_eos=config.eos, scheduling=config.scheduling, kv_tokens=config.kv_tokens, block_size=config.block_size)
    if server.pool is not None:
        longest = max(requests, key=lambda r: len(r.prompt) + r.max_new_tokens)
        server.pool.check_request(len(longest.prompt), longest.max_new_tokens)
    check_memory(server.models, requests, config.max_batch, server.max_draft)
    import torch

    meta = {
        "target": target.name, "drafter": drafter_name, "policy": policy_spec, "controller": config.controller,
        "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k}, "seed": config.seed, "max_batch": config.max_batch,
        "scheduling": server.scheduling.policy, "kv_tokens": config.kv_tokens, "block_size": config.block_size,
        "eos": config.eos, "requests": [[r.arrival, len(r.prompt), r.max_new_tokens, r.priority] for r in requests],
        "workload": {"qps": config.qps, "arrivals": config.arrivals, "request_trace": config.request_trace, "duration": config.duration,
                     "prompt_len": config.prompt_len, "output_len": config.output_len, "prompts": sets},
        "model": model_fingerprint(target), "machine": machine_fingerprint(target.device), "device": target.device,
        "threads": torch.get_num_threads(), "load_average_start": list(os.getloadavg()),
        "cache": ({"layout": "static", "static_tokens": target.static_tokens} if config.static_cache else
                  {"layout": "ragged", "compact_ratio": server.layout.compact_ratio, "compact_min": server.layout.compact_min}),
    }
    writer = ServeTraceWriter(config.trace, meta) if config.trace else None
    total = sum(r.max_new_tokens for r in requests)
    with bar(len(requests), "serving") as b:
        def on_step(log, finished):
            if finished:
                b.update(len(finished))
            if writer is not None:
                writer.add(log, finished)

        log = server.run(requests, on_step=on_step, check=False)
    m = serving_metrics(log.requests, log.tokens, log.members, log.steps)
    overhead = [s.overhead_seconds for s in log.steps]
    m["overhead_per_step"] = float(np.mean(overhead)) if overhead else 0.0
    m["seconds"] = log.seconds
    m["preempted"] = [[step, rid] for step, rid in log.preemptions]
    m["load_average_end"] = list(os.getloadavg())
    if writer is not None:
        writer.close(log, seconds=log.seconds, load_average_end=m["load_average_end"])
    data = {"target": target.name, "drafter": drafter_name, "policy": policy_spec, "controller": config.controller,
            "max_batch": config.max_batch, "qps": config.qps, "requests_planned": len(requests), "planned_tokens": total,
            "trace": str(config.trace) if config.trace else None, **m,
            "max_batch_setting": config.max_batch}  # (m's max_batch: the largest batch the run reached, as serve-sim's)
    return ServeResult(target.name, drafter_name, policy_spec, config.controller, config.max_batch, config.qps, len(requests), total,
                       data["trace"], log.seconds, m["overhead_per_step"], typed(ServeSummary, {**m, "replications": 1}), data)


def run(args: argparse.Namespace) -> int:
    out = serve(from_namespace(ServeConfig, args), count_bar).to_dict()
    if args.json:
        a.emit_json(out)
        return 0
    print(f"{out['target']} + {out['drafter'] or 'no drafter'} ({out['policy']}, controller {out['controller']}), --max-batch "
          f"{out['max_batch_setting']}: {out['requests']} requests, {out['output_tokens']} tokens in {out['seconds']:.2f} s, mean batch "
          f"{out['mean_batch']:.2f}, largest batch seen {out['max_batch']} of at most {out['max_batch_setting']}")
    _print_metrics(out)
    if out["trace"]:
        print(f"serving trace: {out['trace']}")
    return 0


def _print_metrics(m: dict) -> None:
    rows = [[name.upper(), *(1000 * m[name][q] for q in ("mean", "p50", "p90", "p99"))] for name in ("ttft", "tpot", "itl", "e2e")]
    print(format_table(["latency (ms)", "mean", "p50", "p90", "p99"], rows))
    s = m["spec_decode"]
    print(f"throughput {m['throughput']:.1f} output tokens/s; spec decode: {s['num_drafts']} drafts, {s['num_draft_tokens']} draft "
          f"tokens, {s['num_accepted_tokens']} accepted ({s['draft_acceptance_rate']:.1%}), mean acceptance length "
          f"{s['mean_acceptance_length']:.2f}")


def check_serve(config: CheckServeConfig) -> CheckServeResult:
    """The serving trace replayed in the serving simulator and compared with the run: predicted
    against measured TTFT, TPOT, E2E and throughput with relative errors
    (:func:`draftsim.analysis.servecheck.check_serve`)."""
    from draftsim.analysis.servecheck import check_serve as compare

    check(config)
    if (config.trace is None) == (config.vllm_result is None):
        raise DraftsimError("give a serving TRACE folder or --vllm-result FILE (one of them)")
    if config.cost_model != "roofline" and not config.hardware:
        raise DraftsimError(f"--cost-model {config.cost_model} prices the catalog deployment: give --hardware HW with it")
    if config.vllm_result is not None:
        out = _check_vllm(config)
    else:
        models = _catalog_models(config) if config.hardware else None
        out = compare(config.trace, config.profile, costs_from=config.costs_from, prefill_profile=config.prefill_profile or None,
                      models=models, draft_profile=config.draft_profile)
    rows = [CheckRow(r["metric"], r["predicted"], r["measured"], r["relative_error"]) for r in out["metrics"]]
    return CheckServeResult(out["path"], out["target"], out["drafter"], out["policy"], out["requests"], out["costs"], rows, out)


def catalog_name(model: str | None) -> str | None:
    """The catalog entry a served model stands for: ``random:NAME[:SEED]`` is NAME's shape; the
    controlled drafter's cost model is the model after its ``@``; other names as they are."""
    if model is None:
        return None
    if model.startswith("controlled"):
        from draftsim.realrun.drafters import parse_controlled

        model = parse_controlled(model)[1]
        if model is None:
            return None
    if model.startswith("random:"):
        return model.split(":")[1]
    return model


def _catalog_models(config: CheckServeConfig):
    """A trace priced on the catalog deployment (--hardware): the target's and the drafter's
    rooflines with engine overheads, named by the options or read from the trace."""
    from draftsim.realrun.servetrace import ServeTrace

    from .servesim import ServeSimConfig

    if config.profile is not None or config.costs_from is not None or config.draft_profile is not None or config.prefill_profile:
        raise DraftsimError("give --hardware (the catalog deployment) or --profile/--prefill-profile/--draft-profile/--costs-from "
                            "(measured costs), not both")
    meta = ServeTrace(config.trace).metadata
    target = config.target or catalog_name(meta.get("target"))
    drafters = config.drafter_model or ([d] if (d := catalog_name(meta.get("drafter"))) else None)
    ssc = ServeSimConfig(target=target, hardware=config.hardware, tp=config.tp, dtype=config.dtype, drafter_model=drafters,
                         engine=config.engine, catalog=list(config.catalog), cost_model=config.cost_model)
    built = ssc.assembly()
    calibrated = built.info.get("calibration")
    what = (f"catalog {'operator model' if config.cost_model == 'operators' else 'roofline'} of {target} on {config.hardware} (engine {built.info['engine_label']}; "
            + (f"hardware calibrated to {calibrated['fitted_to']})" if calibrated else "not calibrated)")
            + (f", drafter {', '.join(drafters)}" if drafters else ""))
    return built.target, built.drafters, what


def _check_vllm(config: CheckServeConfig) -> dict:
    """A vllm bench serve result replayed in serve-sim on the named model and hardware."""
    from draftsim.analysis.servecheck import check_vllm
    from draftsim.sim.vllm_bench import read_vllm_bench

    from .servesim import ServeSimConfig, serving_config

    if not config.target or not config.hardware:
        raise DraftsimError("--vllm-result needs --target MODEL and --hardware HW (the deployment the run served)")
    given = [flag for flag, value in (("--profile", config.profile), ("--prefill-profile", config.prefill_profile or None),
                                      ("--draft-profile", config.draft_profile), ("--costs-from", config.costs_from)) if value is not None]
    if given:  # they price a serving TRACE's replay; taken silently here, they would change nothing
        raise DraftsimError(f"{'/'.join(given)} prices a serving TRACE's replay; with --vllm-result the costs are the catalog "
                            "deployment's (--target on --hardware, --catalog for a calibrated entry)")
    bench = read_vllm_bench(config.vllm_result)
    spec = dict(policy="ar", alpha=0.5)
    if config.drafter_model:
        if bench.spec_rates is None:
            raise DraftsimError(f"{bench.source} holds no spec_decode_per_position_acceptance_rates: a --drafter-model needs a "
                                "speculative run's acceptance")
        spec = dict(policy=f"fixed:k={len(bench.spec_rates)}", positional=",".join(f"{x:.6f}" for x in bench.spec_rates))
    ssc = ServeSimConfig(target=config.target, hardware=config.hardware, tp=config.tp, dtype=config.dtype,
                         drafter_model=config.drafter_model, engine=config.engine, catalog=list(config.catalog), cost_model=config.cost_model,
                         requests=bench.completed, **spec)
    return check_vllm(bench, serving_config(ssc))


def run_check(args: argparse.Namespace) -> int:
    out = check_serve(from_namespace(CheckServeConfig, args)).to_dict()
    if args.json:
        a.emit_json(out["metrics"])
        return 0
    print(f"{out['path']}: {out['target']} + {out['drafter'] or 'no drafter'} ({out['policy']}), {out['requests']} requests; "
          f"costs: {out['costs']}")
    rows = [[r["metric"], r["predicted"], r["measured"], f"{r['relative_error']:+.1%}"] for r in out["metrics"]]
    print(format_table(["metric", "predicted", "measured", "relative error"], rows))
    return 0
