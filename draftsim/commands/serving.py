"""``draftsim serve-sim``: a serving simulation — continuous batching with speculative decoding
under a workload, on models priced from hardware (roofline) or measured profiles."""

from __future__ import annotations

import argparse

import numpy as np

from draftsim.analysis.table import format_table
from draftsim.sim import acceptance as A
from draftsim.sim.controllers import CONTROLLER_HELP, parse_controller
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import POLICY_HELP, parse_policy
from draftsim.sim.serving import SLO, SchedulerConfig, ServingConfig, make_workload, run_replications, write_chrome_trace
from draftsim.sim.serving.router import ROUTERS
from draftsim.sim.serving.scheduler import SCHEDULING_POLICIES
from draftsim.sim.serving.workload import ARRIVAL_HELP, LENGTH_HELP, parse_arrivals, parse_lengths

from .. import args as a
from ..progress import count_bar
from .costing import add_hardware_options, build_models
from .simulation import add_acceptance_options, build_process, float_list

#: CPU seconds per simulated request (measured by benchmarks/bench_serving.py, upper value).
SECONDS_PER_REQUEST = 1e-3
#: Bytes kept per request, plus per output token (its rounds, inter-token gaps and steps).
BYTES_PER_REQUEST, BYTES_PER_TOKEN = 200.0, 12.0


def register(sub, common) -> None:
    p = sub.add_parser(
        "serve-sim",
        parents=[common],
        help="simulate a serving engine: continuous batching with speculative decoding under load",
        description="Serve a workload with continuous batching, a paged KV cache and speculative decoding; report TTFT, "
                    "TPOT, ITL, E2E latency, throughput, goodput and vLLM's spec-decode metrics, or sweep the load.",
        epilog="\n\n".join([POLICY_HELP, CONTROLLER_HELP, LENGTH_HELP, ARRIVAL_HELP]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_hardware_options(p, drafter_flag="--drafter", shapes=True)
    p.add_argument("--policy", default="fixed:k=4", help="drafting policy of every request (default fixed:k=4)")
    p.add_argument("--controller", default="none", help="speculation controller per step (default none)")
    g = p.add_argument_group("acceptance (as draftsim simulate; or --acceptance-trace)")
    add_acceptance_options(g)
    g.add_argument("--acceptance-trace", metavar="TRACE", help="trace-driven: request i replays recorded sequence i mod n")
    g.add_argument("--trace-drafter", action="append", metavar="NAME", help="the trace's drafter(s) playing models 1, 2, ...")
    w = p.add_argument_group("workload")
    w.add_argument("--qps", type=a.positive("qps"), help="mean arrival rate, requests/s (open-loop arrivals)")
    w.add_argument("--duration", type=a.positive("duration"), help="seconds of arrivals")
    w.add_argument("--requests", type=a.count("requests", 1, 1 << 24), help="number of requests")
    w.add_argument("--arrivals", default="poisson", help="arrival process (default poisson; see below)")
    w.add_argument("--prompt-len", default="fixed:512", help="prompt length distribution (default fixed:512)")
    w.add_argument("--output-len", default="fixed:256", help="output length distribution (default fixed:256)")
    w.add_argument("--request-trace", metavar="FILE", help="CSV/JSONL request trace (Azure or Vidur columns)")
    w.add_argument("--priorities", type=a.count("priorities", 1, 1 << 16), default=1, help="priority classes drawn uniformly (default 1)")
    s = p.add_argument_group("scheduler and memory (per replica)")
    s.add_argument("--max-num-seqs", type=a.count("max_num_seqs", 1, 1 << 16), default=256, help="most running requests (default 256)")
    s.add_argument("--max-num-batched-tokens", type=a.count("max_num_batched_tokens", 1, 1 << 24), default=2048,
                   help="token budget per step (default 2048)")
    s.add_argument("--no-chunked-prefill", action="store_true", help="prefill prompts whole")
    s.add_argument("--scheduling", choices=SCHEDULING_POLICIES, default="fcfs", help="waiting-queue order (default fcfs)")
    s.add_argument("--block-size", type=a.count("block_size", 1, 4096), default=16, help="KV block size in tokens (default 16)")
    s.add_argument("--kv-tokens", type=a.count("kv_tokens", 1), help="KV capacity in tokens per replica (default: from the hardware's memory for roofline models; "
                   "unlimited for measured profiles)")
    s.add_argument("--separate-drafter", action="store_true", help="drafters on a device of their own (not in the target's memory)")
    s.add_argument("--replicas", type=a.count("replicas", 1, 1024), default=1, help="replicas behind the router (default 1)")
    s.add_argument("--router", choices=tuple(ROUTERS), default="round-robin", help="routing policy (default round-robin)")
    o = p.add_argument_group("measurement and output")
    o.add_argument("--slo-ttft", type=a.positive("slo_ttft"), help="TTFT objective for goodput, seconds")
    o.add_argument("--slo-tpot", type=a.positive("slo_tpot"), help="TPOT objective for goodput, seconds")
    o.add_argument("--seed", type=a.count("seed"), default=0)
    o.add_argument("--replications", type=a.count("replications", 1, 1000), default=3, help="independent replications (default 3)")
    o.add_argument("--timeline", metavar="OUT.json", help="Chrome trace-event timeline of the first replication (Perfetto)")
    o.add_argument("--figure", metavar="OUT.png", help="latency CDFs (or, with --sweep-qps, speedup against load)")
    o.add_argument("--load-figure", metavar="OUT.png", help="batch size, waiting requests and KV use over time (first replication)")
    o.add_argument("--sweep-qps", metavar="Q1,Q2,...", help="serve at each rate with and without speculation; mark the crossover")
    p.set_defaults(run=run)


def _process(args, n_models: int) -> A.AcceptanceProcess:
    if args.acceptance_trace is not None:
        others = [n for n, v in (("--alpha", args.alpha is not None), ("--pair", bool(args.pair)), ("--positional", args.positional),
                                 ("--markov", args.markov)) if v]
        if others:
            raise DraftsimError(f"--acceptance-trace replaces the acceptance process; drop {others[0]}")
        return A.TraceDriven.from_trace(args.acceptance_trace, drafters=args.trace_drafter)
    if args.trace_drafter:
        raise DraftsimError("--trace-drafter applies to --acceptance-trace")
    if args.alpha is None and not args.pair and args.positional is None and args.markov is None:
        raise DraftsimError("give an acceptance process: --alpha A (Bernoulli), --positional, --markov or --acceptance-trace")
    return build_process(args, n_models)


def _config(args) -> ServingConfig:
    policy = parse_policy(args.policy)
    controller = parse_controller(args.controller)
    process = _process(args, policy.n_models)
    target, drafters, info = build_models(args)
    if len(drafters) < policy.n_models - 1:
        raise DraftsimError(f"policy {args.policy} uses {policy.n_models - 1} drafter(s): give --drafter MODEL for each (got {len(drafters)})")
    if args.priorities > 1 and args.scheduling != "priority":
        raise DraftsimError(f"--priorities {args.priorities} needs --scheduling priority")
    sched = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                            chunked_prefill=not args.no_chunked_prefill, policy=args.scheduling, block_size=args.block_size)
    slo = SLO(ttft=args.slo_ttft or float("inf"), tpot=args.slo_tpot or float("inf"))
    return ServingConfig(policy, process, target, drafters, controller=controller, scheduler=sched, kv_tokens=args.kv_tokens,
                         separate_drafter=args.separate_drafter, replicas=args.replicas, router=args.router, slo=slo)


def _workload_maker(args, qps=None):
    arrivals = parse_arrivals(args.arrivals)
    prompt = parse_lengths(args.prompt_len, "--prompt-len")
    output = parse_lengths(args.output_len, "--output-len")
    if args.request_trace is None and args.requests is None and args.duration is None:
        raise DraftsimError("give --requests N or --duration SECONDS (or a --request-trace)")

    def make(rng, q=qps):
        return make_workload(arrivals=arrivals, qps=q, requests=args.requests, duration=args.duration, prompt=prompt, output=output,
                             rng=rng, trace=args.request_trace, priorities=args.priorities)

    return arrivals, make


def _expected_requests(args, qps) -> int:
    if args.requests is not None:
        return int(args.requests)
    if args.duration is not None and qps is not None:
        return int(args.duration * qps * 1.05) + 10
    return 1000


def run(args: argparse.Namespace) -> int:
    if args.timeline is not None:
        a.output_file("--timeline", args.timeline, suffix=".json")
    if args.figure is not None:
        a.output_file("--figure", args.figure, suffix=".png")
    if args.load_figure is not None:
        a.output_file("--load-figure", args.load_figure, suffix=".png")
    a.distinct_outputs(("--timeline", args.timeline), ("--figure", args.figure), ("--load-figure", args.load_figure))
    config = _config(args)
    if args.sweep_qps is not None:
        return _sweep(args, config)
    arrivals, make = _workload_maker(args, args.qps)
    total = _expected_requests(args, args.qps)
    mean_output = parse_lengths(args.output_len, "--output-len").mean
    a.check_budget(f"{total:,} requests x {args.replications} replications", total * args.replications * SECONDS_PER_REQUEST,
                   total * (BYTES_PER_REQUEST + BYTES_PER_TOKEN * mean_output),
                   "give fewer --requests, a shorter --duration or fewer --replications")
    # validate the workload (lengths vs memory, trace columns) before the long part
    config.check(make(np.random.default_rng(args.seed)))
    with count_bar(total * args.replications, "serving") as bar:
        result = run_replications(config, make, seed=args.seed, replications=args.replications,
                                  arrivals=arrivals if arrivals.closed else None, progress=bar.update, keep_runs=False)
    summary = result.summary
    written = {}
    if args.timeline:
        written["timeline"] = write_chrome_trace(args.timeline, result.runs)
    if args.figure:
        from draftsim.analysis.serving import latency_cdfs

        latency_cdfs(args.figure, {args.policy: result.runs[0]})
        written["figure"] = args.figure
    if args.load_figure:
        from draftsim.analysis.serving import load_over_time

        load_over_time(args.load_figure, result.runs[0])
        written["load_figure"] = args.load_figure
    if args.json:
        out = dict(summary)
        out["config"] = _describe(config)
        out.update({f"{k}_path": v if isinstance(v, str) else v["path"] for k, v in written.items()})
        a.emit_json(out)
        return 0
    _print_summary(config, summary)
    for k, v in written.items():
        print(f"{k} written to {v if isinstance(v, str) else v['path']}")
    return 0


def _describe(config: ServingConfig) -> dict:
    kv, plan = config.kv_cache()
    return {"policy": repr(config.policy), "process": repr(config.process), "controller": repr(config.controller),
            "target": getattr(config.target, "name", repr(config.target)),
            "drafters": [getattr(d, "name", repr(d)) for d in config.drafters],
            "kv_tokens": kv.tokens if kv else None, "memory": plan.to_dict() if plan else None,
            "scheduler": vars(config.scheduler) if hasattr(config.scheduler, "__dict__") else str(config.scheduler),
            "replicas": config.replicas, "router": config.router}


def _ms(x: float) -> str:
    return "nan" if not np.isfinite(x) else f"{x * 1e3:.2f}"


def _print_summary(config: ServingConfig, s: dict) -> None:
    kv, plan = config.kv_cache()
    print(f"{config.policy!r} under {config.process!r}; controller {config.controller!r}")
    print(f"target {getattr(config.target, 'name', config.target)}; drafters " +
          ", ".join(getattr(d, "name", repr(d)) for d in config.drafters[: config.policy.n_models - 1]) or "none")
    if plan is not None:
        print(f"memory per device: {plan.describe()}")
    elif kv is not None:
        print(f"KV cache: {kv.tokens:,} tokens")
    ci = s["ci95"]
    reps = s["replications"]
    rows = []
    for name in ("ttft", "tpot", "itl", "e2e", "queue"):
        rows.append([name.upper() if name != "queue" else "queueing"] +
                    [_ms(s[name][k]) + (f" ±{_ms(ci[name][k])}" if reps > 1 else "") for k in ("mean", "p50", "p90", "p99")])
    print(format_table(["latency (ms)", "mean", "p50", "p90", "p99"], rows))
    pm = (lambda k: f" ±{ci[k]:.3g}" if reps > 1 else "")  # noqa: E731
    print(f"throughput {s['throughput']:.1f} output tokens/s{pm('throughput')}; {s['request_throughput']:.3g} requests/s; "
          f"goodput {s['goodput']:.3g} requests/s{pm('goodput')} ({s['slo_attainment']:.1%} within the SLOs)")
    extra = f"; KV use {s['kv_utilisation']:.1%} (max {s['kv_utilisation_max']:.1%})" if "kv_utilisation" in s else ""
    print(f"mean batch {s['mean_batch']:.1f} (max {s['max_batch']}){extra}; preemptions {s['preemptions']:.0f}; "
          f"busy {s['busy']:.1%}; {reps} replication(s), {s['requests']:.0f} requests each")
    sd = s["spec_decode"]
    if sd["num_drafts"]:
        per_pos = np.array(sd["num_accepted_tokens_per_pos"]) / sd["num_drafts"]
        print(f"spec decode: num_drafts {sd['num_drafts']:.0f}, num_draft_tokens {sd['num_draft_tokens']:.0f}, num_accepted_tokens "
              f"{sd['num_accepted_tokens']:.0f}, mean_acceptance_length {sd['mean_acceptance_length']:.3f}, acceptance by position "
              + " ".join(f"{x:.3f}" for x in per_pos[:8]))


def _sweep(args, config: ServingConfig) -> int:
    from draftsim.analysis.serving import crossover, speedup_vs_load, sweep_qps

    if args.qps is not None:
        raise DraftsimError("--sweep-qps replaces --qps; drop --qps")
    for option in ("timeline", "load_figure"):
        if getattr(args, option) is not None:
            raise DraftsimError(f"--{option.replace('_', '-')} applies to a single load, not to --sweep-qps")
    qps = float_list("--sweep-qps", args.sweep_qps)
    arrivals, make = _workload_maker(args, qps[0])
    if arrivals.closed:
        raise DraftsimError("--sweep-qps needs open-loop arrivals (poisson, gamma or fixed)")
    if args.request_trace is not None:
        raise DraftsimError("--sweep-qps draws arrivals at each rate; a --request-trace gives only lengths then: drop it or --sweep-qps")
    for q in qps:
        if not (np.isfinite(q) and q > 0):
            raise DraftsimError(f"--sweep-qps rates must be finite and > 0; got {q:g}")
    total = sum(_expected_requests(args, q) for q in qps) * 2 * args.replications
    biggest = _expected_requests(args, max(qps))
    mean_output = parse_lengths(args.output_len, "--output-len").mean
    a.check_budget(f"a sweep of {len(qps)} rates ({total:,} requests)", total * SECONDS_PER_REQUEST,
                   biggest * (BYTES_PER_REQUEST + BYTES_PER_TOKEN * mean_output), "give fewer rates, --requests or --replications")
    config.check(make(np.random.default_rng(args.seed), max(qps)))
    with count_bar(total, "sweeping") as bar:
        rows = sweep_qps(config, lambda rng, q: make(rng, q), qps, seed=args.seed, replications=args.replications, progress=bar.update)
    cross = crossover(rows)
    if args.figure:
        speedup_vs_load(args.figure, rows, f"{args.policy} on {getattr(config.target, 'name', '')}", cross)
    if args.json:
        a.emit_json({"sweep": [{"qps": r["qps"], "speedup": r["speedup"], "tpot_speedup": r["tpot_speedup"],
                                "throughput_ratio": r["throughput_ratio"], "spec": {k: r["spec"][k] for k in ("ttft", "tpot", "itl", "e2e", "throughput", "goodput", "spec_decode")},
                                "ar": {k: r["ar"][k] for k in ("ttft", "tpot", "itl", "e2e", "throughput", "goodput")}} for r in rows],
                     "crossover_qps": cross, "figure_path": args.figure, "config": _describe(config)})
        return 0
    table = []
    for r in rows:
        mark = " <- crossover" if cross is not None and np.isfinite(cross) and r["speedup"] < 1 <= _prev(rows, r) else ""
        table.append([f"{r['qps']:g}", _ms(r["ar"]["e2e"]["mean"]), _ms(r["spec"]["e2e"]["mean"]), f"{r['speedup']:.3f}",
                      f"{r['tpot_speedup']:.3f}", f"{r['throughput_ratio']:.3f}", f"{r['spec']['mean_batch']:.1f}" + mark])
    print(f"{config.policy!r} under {config.process!r} vs autoregressive; controller {config.controller!r}")
    print(format_table(["qps", "E2E AR (ms)", "E2E spec (ms)", "speedup", "TPOT speedup", "throughput ratio", "mean batch"], table))
    if cross is None:
        print(f"speculation pays at every load tested (up to {max(qps):g} requests/s)")
    elif not np.isfinite(cross):
        print(f"speculation does not pay even at the lowest load tested ({min(qps):g} requests/s)")
    else:
        print(f"crossover: speculation stops paying at about {cross:.3g} requests/s")
    if args.figure:
        print(f"figure written to {args.figure}")
    return 0


def _prev(rows, r) -> float:
    i = rows.index(r)
    return rows[i - 1]["speedup"] if i else float("inf")
