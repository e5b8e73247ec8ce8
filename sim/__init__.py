"""draftsim's simulation layer: closed forms, verification, engines, planners, cost models
and the serving simulator.

Modules
-------
analytic      closed-form EWIF, SWI, latency and the optimal draft lengths and cascades
plan          what-if planning over a set of drafters, ranked by EWIF
distributions probability rows: validation, temperature/top-k, sampling
rules         verification rules (SD, Lossy, Chow, Diff, OPT, TokenV1-3, BiLD*, Leniency)
verify        block verification (sampling and greedy)
tree          token trees: greedy walk and multi-candidate sampling verification
exact         exact output distributions by enumeration (toy table models)
acceptance    acceptance processes for the simulators
acceptance_rates    per-position acceptance: one convention (cumulative, as vLLM counts it)
              and conversions to conditional rates, mean acceptance length, draft rate
acceptance_catalog  published acceptance by method, target and dataset, each entry cited
params        parameter objects and the spec registries behind the mini-languages
policies      drafting policies shared by every executor
controllers   speculation controllers per batch step (shared by the serving simulator and
              the real batched server)
cost/         cost models of a forward call over a batch: linear, measured profile,
              roofline; model and hardware catalogs; model-on-hardware assembly
montecarlo    vectorised Monte Carlo engine
des           simpy discrete-event executor (one stream of requests, no batching)
serving/      discrete-event serving simulator: workloads, paged KV cache, scheduler,
              replicas, router, metrics
records       run records (calls, rounds, draft events), defined once
traces        the trace family: recordings and run traces (schema, writer, validated reader)
replay        a real run replayed: its acceptance as a process, its policy, its pricing
metrics       metrics with standard errors
simulate      the simulate() entry point
predict       closed-form predictions for simulated settings
errors        the project exception (DraftsimError, a ValueError) and input checks
"""

if __name__ != "draftsim.sim":  # one tree: the folder is installed as draftsim.sim
    raise ImportError(f"import draftsim.sim, not {__name__}: the folder sim/ is installed as draftsim.sim "
                      "(pyproject package-dir); a second copy would hold other classes (e.g. another DraftsimError)")

from .errors import DraftsimError
from .simulate import SimResult, simulate

__all__ = ["DraftsimError", "SimResult", "simulate"]
