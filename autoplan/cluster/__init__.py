"""Clusters: the cluster.yaml schema, the hardware catalog, and the topology graph."""

from autoplan.cluster.profile import NcclProfile, load_nccl_profile
from autoplan.cluster.spec import (
    Cluster, ClusterSpec, Fabric, load_cluster_spec, require_homogeneous, resolve,
)

__all__ = ["Cluster", "ClusterSpec", "Fabric", "NcclProfile", "load_cluster_spec",
           "load_nccl_profile", "require_homogeneous", "resolve"]
