"""Clusters: the cluster.yaml schema, the hardware catalog, and the topology graph."""

from autoplan.cluster.spec import Cluster, ClusterSpec, load_cluster_spec, resolve

__all__ = ["Cluster", "ClusterSpec", "load_cluster_spec", "resolve"]
