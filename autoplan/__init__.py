"""autoplan: plan how to train a large PyTorch model on a GPU cluster.

The public API lives in :mod:`autoplan.api` and is re-exported here.
"""

from autoplan.api import estimate, load_cluster, load_model, place_for_inference, read_run, solve
from autoplan.errors import AutoplanError, InfeasibleError
from autoplan.plan import Estimate, Plan, Result

__all__ = [
    "AutoplanError", "Estimate", "InfeasibleError", "Plan", "Result",
    "estimate", "load_cluster", "load_model", "place_for_inference", "read_run", "solve",
]
