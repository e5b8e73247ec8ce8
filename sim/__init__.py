"""draftsim's simulation layer: closed forms, verification, engines and planners.

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
policies      drafting policies shared by every executor
costs         cost models of forward calls
montecarlo    vectorised Monte Carlo engine
des           simpy discrete-event engine
metrics       metrics with standard errors
simulate      the simulate() entry point
predict       closed-form predictions for simulated settings
errors        the project exception (DraftsimError, a ValueError) and input checks
"""

from .errors import DraftsimError
from .simulate import SimResult, simulate

__all__ = ["DraftsimError", "SimResult", "simulate"]
