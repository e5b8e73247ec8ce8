"""draftsim's simulation layer: closed forms, planners and (later) Monte Carlo and DES engines.

Modules
-------
analytic   closed-form EWIF, SWI, latency and the optimal draft lengths and cascades
plan       what-if planning over a set of drafters, ranked by EWIF
errors     the project exception (DraftsimError, a ValueError) and input checks
"""

from .errors import DraftsimError

__all__ = ["DraftsimError"]
