"""A serving workload as domain objects, parsed once at a command's boundary
(:class:`WorkloadSpec`): the arrival process, the prompt and output length distributions, how
many requests or how long, a request trace read once and the priority classes. Everything after
the boundary — the budget estimate, the check against memory, each replication's draw — uses
the objects (:mod:`draftsim.sim.serving.workload` draws them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .workload import Arrivals, LengthDist, RequestTrace, Workload, make_workload, parse_arrivals, parse_lengths, read_request_trace

__all__ = ["WorkloadSpec"]


@dataclass(frozen=True)
class WorkloadSpec:
    """What a serving run draws its requests from. ``requests`` or ``duration`` bound it (or the
    ``trace``: a :class:`~draftsim.sim.serving.workload.RequestTrace` already read, which gives
    arrival times and lengths, or lengths only); ``priorities`` classes are drawn uniformly."""

    arrivals: Arrivals
    prompt: LengthDist
    output: LengthDist
    requests: int | None = None
    duration: float | None = None
    trace: RequestTrace | None = None
    priorities: int = 1

    @classmethod
    def parse(cls, *, arrivals: str | Arrivals, prompt_len: str | LengthDist, output_len: str | LengthDist,
              requests: int | None = None, duration: float | None = None, request_trace=None, priorities: int = 1,
              default_requests: int | None = None) -> WorkloadSpec:
        """The workload the options name, each given as its mini-language text or as the object;
        a request trace path is read here, once (it may be a pipe). ``default_requests``: the count
        where neither ``requests``, ``duration`` nor a trace bounds the workload."""
        arrivals = arrivals if isinstance(arrivals, Arrivals) else parse_arrivals(arrivals)
        prompt = prompt_len if isinstance(prompt_len, LengthDist) else parse_lengths(prompt_len, "--prompt-len")
        output = output_len if isinstance(output_len, LengthDist) else parse_lengths(output_len, "--output-len")
        if request_trace is None and requests is None and duration is None:
            requests = default_requests
        trace = request_trace if request_trace is None or isinstance(request_trace, RequestTrace) else read_request_trace(request_trace)
        return cls(arrivals, prompt, output, requests, duration, trace, priorities)

    def make(self, rng: np.random.Generator, qps: float | None = None) -> Workload:
        """One draw of the workload at ``qps`` requests/s (None: the trace's times, or closed loop)."""
        return make_workload(arrivals=self.arrivals, qps=qps, requests=self.requests, duration=self.duration, prompt=self.prompt,
                             output=self.output, rng=rng, trace=self.trace, priorities=self.priorities)
