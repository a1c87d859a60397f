"""A cluster as the API takes it: resolved for the cost models, with the mapping it came from
(which the plan JSON keeps, so that explain and verify can rebuild it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from autoplan.cluster.spec import Cluster, load_cluster_spec, resolve
from autoplan.errors import ClusterSpecError


@dataclass(frozen=True)
class LoadedCluster:
    """A resolved cluster together with the mapping it came from (kept for the plan JSON)."""

    cluster: Cluster
    spec: dict


def load_cluster(path_or_dict: str | Path | Mapping | LoadedCluster) -> LoadedCluster:
    """Load and validate a cluster.yaml (path) or an equivalent mapping."""
    if isinstance(path_or_dict, LoadedCluster):
        return path_or_dict
    if not isinstance(path_or_dict, (str, Path, Mapping)):
        raise ClusterSpecError(f"cluster: expected the path of a cluster.yaml or a mapping; got "
                               f"{type(path_or_dict).__name__}.")
    source = dict(path_or_dict) if isinstance(path_or_dict, Mapping) else path_or_dict
    spec = load_cluster_spec(source)
    return LoadedCluster(resolve(spec), spec.model_dump(mode="json", exclude_none=True))
