"""autoplan: plan how to train a large PyTorch model on a GPU cluster.

The public API lives in :mod:`autoplan.api` and is re-exported here, imported on first use so
that ``import autoplan.cli`` (``autoplan --help``) does not load the solver or torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoplan.api import (estimate, load_cluster, load_model, place_for_inference,
                              read_run, solve)
    from autoplan.errors import AutoplanError, InfeasibleError
    from autoplan.plan import Estimate, Plan, Result

_HOMES = {
    "AutoplanError": "autoplan.errors", "InfeasibleError": "autoplan.errors",
    "Estimate": "autoplan.plan", "Plan": "autoplan.plan", "Result": "autoplan.plan",
    "estimate": "autoplan.api", "load_cluster": "autoplan.api", "load_model": "autoplan.api",
    "place_for_inference": "autoplan.api", "read_run": "autoplan.api", "solve": "autoplan.api",
}

__all__ = [
    "AutoplanError", "Estimate", "InfeasibleError", "Plan", "Result",
    "estimate", "load_cluster", "load_model", "place_for_inference", "read_run", "solve",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'autoplan' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
