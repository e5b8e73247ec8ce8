"""``draftsim serve`` and ``draftsim check-serve``: real batched speculative serving, and the
serving simulator held against what it did."""

from __future__ import annotations

import argparse
import os

from draftsim.analysis.table import format_table
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import POLICY_HELP
from draftsim.sim.serving.scheduler import SCHEDULING_POLICIES

from .. import args as a


def register(sub, common) -> None:
    p = sub.add_parser("serve", parents=[common], help="serve requests with real models: continuous batching + speculative decoding",
                       description="Serve a workload of real prompts with continuous batching: requests arrive in wall-clock time "
                       "(--qps with --arrivals, or --request-trace), are prefilled, and the running batch is decoded with speculative "
                       "decoding (the drafter proposes for every sequence, the target verifies all blocks in one batched forward). "
                       "Prints TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99), throughput and vLLM's spec-decode "
                       "metrics; --trace writes a serving trace for draftsim check-serve.",
                       epilog=POLICY_HELP + "\n\nDrafters: maxgram, bigram, distilled, tiny[:SEED], a checkpoint folder, or none "
                       "(autoregressive serving).", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", "--model", dest="model", default="smollm2", help="target: smollm2 (embedded), tiny[:SEED], a checkpoint folder or a .gguf file")
    p.add_argument("--drafter", default="maxgram", help="maxgram (default), bigram, distilled, a neural model, or none")
    p.add_argument("--policy", help="sim policy of one drafter (default fixed:k=4; ar without a drafter)")
    p.add_argument("--controller", default="none", help="speculation controller per step (sim.controllers; default none)")
    p.add_argument("--qps", type=a.positive("qps"), help="mean arrival rate, requests/s")
    p.add_argument("--arrivals", default="poisson", help="arrival process: poisson (default), gamma:cv=C, fixed")
    p.add_argument("--request-trace", help="CSV/JSONL request trace (arrival time, prompt and output tokens)")
    p.add_argument("--duration", type=a.positive("duration"), help="seconds of arrivals")
    p.add_argument("--requests", type=a.count("requests", 1, 1_000_000), help="number of requests")
    p.add_argument("--prompt-len", default="bundled", help="prompt lengths: bundled (the prompts as they are) or a distribution "
                   "(fixed:N, uniform:LO,HI, lognormal:..., zipf:...)")
    p.add_argument("--output-len", default="fixed:64", help="output lengths (default fixed:64)")
    p.add_argument("--prompts", default="code,instructions,docstrings,arithmetic", help="bundled prompt sets, comma-separated")
    p.add_argument("--eos", action="store_true", help="end a request at EOS (default: at its output length)")
    p.add_argument("--max-batch", type=a.count("max_batch", 1, 4096), default=16, help="most running sequences (default 16)")
    p.add_argument("--scheduling", choices=SCHEDULING_POLICIES, default="fcfs",
                   help="waiting queue of the scheduler the server runs (the serving simulator's; default fcfs)")
    p.add_argument("--temperature", type=a.cost("temperature"), default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=a.count("top_k", 1, 1_000_000))
    p.add_argument("--seed", type=a.count("seed"), default=0)
    p.add_argument("--trace", help="write the serving trace to this new folder")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda[:N]")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--threads", type=a.count("threads", 1, 1024), help="torch CPU threads (default torch's; 1 is steadier on a busy machine)")
    p.set_defaults(run=run)

    c = sub.add_parser("check-serve", parents=[common], help="replay a serving trace in the serving simulator and compare",
                       description="Replay a real serving run (draftsim serve --trace) in the serving simulator: the same "
                       "arrivals and lengths, each request's realised acceptance, step costs from a draftsim profile of the same "
                       "model and machine and the measured per-step overhead. Reports predicted against measured TTFT, TPOT, "
                       "end-to-end latency (p50, p90) and throughput with relative errors.")
    c.add_argument("trace", help="serving trace folder (draftsim serve --trace)")
    c.add_argument("--profile", help="cost profile of the target on this machine (draftsim profile --path server)")
    c.add_argument("--prefill-profile", metavar="FILE", help="a second profile that prices the joiners' prefills (batch 1, new "
                   "tokens up to the longest prompt, its last-row table): the step grid then needs no long calls "
                   "(default: --profile prices both)")
    c.add_argument("--costs-from", metavar="TRACE", help="fit the target's costs to another serving trace of the same model and "
                   "machine (a calibration run); default, without --profile: fitted to TRACE itself (in-sample)")
    c.set_defaults(run=run_check)


def _controller(spec: str, policy, max_batch: int):
    """A speculation controller from its mini-language (``none``: no cap), bound to the run."""
    from draftsim.sim.controllers import Goodput, parse_controller

    if spec.strip() in ("", "none"):
        return None
    controller = parse_controller(spec)
    if isinstance(controller, Goodput):
        raise DraftsimError("--controller goodput needs cost models and an acceptance model; real serving takes none, disable:above=B "
                            "or table:k=... (simulate goodput with draftsim serve-sim)")
    controller.bind(policy, None, None, [], max_batch)
    return controller


def _workload(args):
    import numpy as np

    from draftsim.sim.serving.workload import make_workload, parse_arrivals, parse_lengths

    if args.request_trace is None and args.qps is None:
        raise DraftsimError("give --qps (with --requests or --duration) or --request-trace")
    rng = np.random.default_rng(args.seed)
    arrivals = parse_arrivals(args.arrivals)
    if arrivals.closed:
        raise DraftsimError("draftsim serve takes open-loop arrivals (poisson, gamma:cv=C, fixed); closed loops are simulated only")
    bundled = args.prompt_len.strip() == "bundled"
    prompt = parse_lengths("fixed:1" if bundled else args.prompt_len, "--prompt-len")
    output = parse_lengths(args.output_len, "--output-len")
    w = make_workload(arrivals=arrivals, qps=args.qps, requests=args.requests, duration=args.duration, prompt=prompt, output=output,
                      rng=rng, trace=args.request_trace)
    prompt_tokens = np.zeros(len(w), dtype=np.int64) if bundled and args.request_trace is None else w.prompt
    return w.arrival, prompt_tokens, w.output


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from draftsim.realrun.executor import Sampling
    from draftsim.realrun.methods import make_drafter
    from draftsim.realrun.models import load_model
    from draftsim.realrun.profiling import machine_fingerprint, model_fingerprint
    from draftsim.realrun.servetrace import ServeTraceWriter, serving_metrics
    from draftsim.realrun.serving import Server, check_memory, check_requests, prompt_pool, requests_from
    from draftsim.sim.policies import parse_policy

    from ..progress import count_bar

    # Everything but the model is checked before it loads.
    if args.top_k is not None and args.temperature == 0:
        raise DraftsimError("--top-k applies to sampling; give --temperature > 0")
    a.model_name("--target", args.model)
    a.device(args.device)
    drafter_name = None if args.drafter.strip() == "none" else a.drafter_names("--drafter", [args.drafter])[0]
    policy_spec = args.policy or ("fixed:k=4" if drafter_name else "ar")
    policy = parse_policy(policy_spec)
    controller = _controller(args.controller, policy, args.max_batch)
    sets = a.prompt_sets("--prompts", args.prompts)
    if args.trace is not None:
        trace = a.output_folder("--trace", args.trace)
        if trace.exists() and any(trace.iterdir()):
            raise DraftsimError(f"--trace {args.trace!r} is not empty; serving traces are written to a new folder (a run's clock cannot be resumed)")
    arrival, prompt_tokens, output_tokens = _workload(args)
    if not np.all(np.isfinite(arrival)):
        raise DraftsimError("the workload has no arrival times; give --qps or a request trace with a time column")
    sampling = Sampling(args.temperature, args.top_k)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    target = load_model(args.model, device=args.device, dtype=args.dtype)
    drafter = make_drafter(drafter_name, target) if drafter_name else None
    requests = requests_from(arrival, prompt_tokens, output_tokens, prompt_pool(target, sets))
    check_requests(target, requests)
    server = Server(target, drafter, policy, controller, sampling, max_batch=args.max_batch, seed=args.seed, stop_at_eos=args.eos,
                    scheduling=args.scheduling)
    models = [target] + ([drafter.loaded] if drafter is not None and drafter.neural else [])
    check_memory(models, requests, args.max_batch, server.max_draft)
    import torch

    meta = {
        "target": target.name, "drafter": drafter_name, "policy": policy_spec, "controller": args.controller,
        "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k}, "seed": args.seed, "max_batch": args.max_batch,
        "scheduling": server.scheduling.policy,
        "eos": args.eos, "requests": [[r.arrival, len(r.prompt), r.max_new_tokens] for r in requests],
        "workload": {"qps": args.qps, "arrivals": args.arrivals, "request_trace": args.request_trace, "duration": args.duration,
                     "prompt_len": args.prompt_len, "output_len": args.output_len, "prompts": sets},
        "model": model_fingerprint(target), "machine": machine_fingerprint(target.device), "device": target.device,
        "threads": torch.get_num_threads(), "load_average_start": list(os.getloadavg()),
        "cache": {"layout": "ragged", "compact_ratio": server.layout.compact_ratio, "compact_min": server.layout.compact_min},
    }
    writer = ServeTraceWriter(args.trace, meta) if args.trace else None
    total = sum(r.max_new_tokens for r in requests)
    with count_bar(len(requests), "serving") as bar:
        def on_step(log, finished):
            if finished:
                bar.update(len(finished))
            if writer is not None:
                writer.add(log, finished)

        log = server.run(requests, on_step=on_step, check=False)
    m = serving_metrics(log.requests, log.tokens, log.members, log.steps)
    overhead = [s.overhead_seconds for s in log.steps]
    m["overhead_per_step"] = float(np.mean(overhead)) if overhead else 0.0
    m["seconds"] = log.seconds
    m["load_average_end"] = list(os.getloadavg())
    if writer is not None:
        writer.close(log, seconds=log.seconds, load_average_end=m["load_average_end"])
    out = {"target": target.name, "drafter": drafter_name, "policy": policy_spec, "controller": args.controller,
           "max_batch": args.max_batch, "qps": args.qps, "requests_planned": len(requests), "planned_tokens": total,
           "trace": str(args.trace) if args.trace else None, **m}
    if args.json:
        a.emit_json(out)
        return 0
    print(f"{target.name} + {drafter_name or 'no drafter'} ({policy_spec}, controller {args.controller}), max batch {args.max_batch}: "
          f"{m['requests']} requests, {m['output_tokens']} tokens in {log.seconds:.2f} s, mean batch {m['mean_batch']:.2f}")
    _print_metrics(m)
    if args.trace:
        print(f"serving trace: {args.trace}")
    return 0


def _print_metrics(m: dict) -> None:
    rows = [[name.upper(), *(1000 * m[name][q] for q in ("mean", "p50", "p90", "p99"))] for name in ("ttft", "tpot", "itl", "e2e")]
    print(format_table(["latency (ms)", "mean", "p50", "p90", "p99"], rows))
    s = m["spec_decode"]
    print(f"throughput {m['throughput']:.1f} output tokens/s; spec decode: {s['num_drafts']} drafts, {s['num_draft_tokens']} draft "
          f"tokens, {s['num_accepted_tokens']} accepted ({s['draft_acceptance_rate']:.1%}), mean acceptance length "
          f"{s['mean_acceptance_length']:.2f}")


def run_check(args: argparse.Namespace) -> int:
    from draftsim.analysis.servecheck import check_serve

    out = check_serve(args.trace, args.profile, costs_from=args.costs_from, prefill_profile=args.prefill_profile)
    if args.json:
        a.emit_json(out["metrics"])
        return 0
    print(f"{out['path']}: {out['target']} + {out['drafter'] or 'no drafter'} ({out['policy']}), {out['requests']} requests; "
          f"costs: {out['costs']}")
    rows = [[r["metric"], r["predicted"], r["measured"], f"{r['relative_error']:+.1%}"] for r in out["metrics"]]
    print(format_table(["metric", "predicted", "measured", "relative error"], rows))
    return 0
