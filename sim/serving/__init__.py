"""Serving simulator: continuous batching with speculative decoding on a discrete-event clock.

workload   requests: arrival processes, length distributions, request traces (Azure, Vidur)
workload_spec  a serve-sim workload parsed once at the boundary (WorkloadSpec: arrivals, lengths, a trace)
rounds     every request's speculative rounds, drawn by the Monte Carlo engine (same policies)
kvcache    paged KV cache: capacity from memory, blocks per request
layout     a dense ragged batch cache's width (what a step attends over in realrun's server)
scheduler  vLLM-style iteration-level scheduler: queues, budgets, chunked prefill, preemption
replica    the step loop: drafter calls then the target's verification, timed by sim.cost
router     round-robin and least-outstanding routing over replicas
metrics    TTFT/TPOT/ITL/E2E, throughput, goodput, vLLM spec-decode counters, Chrome trace
server     ServingConfig, serve (one run) and run_replications (confidence intervals)

Speculation controllers (per-step caps on drafting) live in :mod:`draftsim.sim.controllers`.
"""

from .layout import RaggedLayout
from .metrics import SLO, RunRecord, combine, summarize_run, write_chrome_trace
from .scheduler import SchedulerConfig
from .server import ServingConfig, ServingResult, run_replications, serve, workload_stream
from .workload import Workload, make_workload, parse_arrivals, parse_lengths, read_request_trace

__all__ = [
    "SLO", "RunRecord", "combine", "summarize_run", "write_chrome_trace",
    "RaggedLayout", "SchedulerConfig",
    "ServingConfig", "ServingResult", "run_replications", "serve", "workload_stream",
    "Workload", "make_workload", "parse_arrivals", "parse_lengths", "read_request_trace",
]
