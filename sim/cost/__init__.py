"""Cost models: the time of one forward call of a model over a batch.

base      the interface (:class:`CostModel`: ``forward_time``/``bound`` over (calls, batch)
          arrays of new tokens and contexts; ``shape_time`` for uniform batches)
linear    constant / a + b·n per call (:class:`CallCost`, :class:`Costs`: the papers' c)
profile   measured times on a grid of batch × new tokens × context, interpolated
roofline  per-operator roofline of a dense decoder LM on catalog hardware, tensor parallel
catalog   model architectures and hardware specs (data files, user files, HF config.json)
assembly  a target and its drafters on catalog hardware (or profiles): one cost model each
"""

from .assembly import Assembly, Deployment, assemble
from .base import BOUNDS, BatchStats, CostModel, coefficient
from .catalog import Catalog, HardwareSpec, ModelSpec, default_catalog, load_catalog, model_from_hf_config
from .linear import CallCost, Costs, linear_fit
from .profile import ProfileCost, load_profile
from .roofline import RooflineModel, fit_overhead

__all__ = [
    "Assembly", "Deployment", "assemble",
    "BOUNDS", "BatchStats", "CostModel", "coefficient",
    "Catalog", "HardwareSpec", "ModelSpec", "default_catalog", "load_catalog", "model_from_hf_config",
    "CallCost", "Costs", "linear_fit",
    "ProfileCost", "load_profile",
    "RooflineModel", "fit_overhead",
]
