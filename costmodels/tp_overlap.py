"""Transformer Engine's userbuffers overlap of a block's sequence-parallel TP collectives with
its GEMMs: Megatron-LM's ``--tp-comm-overlap`` (runtime setting ``tp_comm_overlap``).

As Transformer Engine 1.8 sets it up with no ``--tp-comm-overlap-cfg`` (the version
Megatron-Core r0.8 ran; transformer_engine/pytorch/module/base.py ``initialize_ub``, the
schedules in csrc/comm_gemm_overlap.h), each TP region of a block (column-parallel Linears,
then a row-parallel one) overlaps its collectives three ways:

- ``ring_exchange`` (qkv_fprop, fc1_fprop; proj_dgrad, fc2_dgrad): the all-gather of the
  sequence-sharded input is ``tp - 1`` point-to-point steps on the copy engines
  (``use_ce``), each under the GEMM of the chunk already there (the GEMM in ``tp`` chunks of
  ``1/tp`` of the rows); it takes no SMs.
- ``pipeline`` (proj_fprop, fc2_fprop): the row-parallel GEMM runs in ``num_splits`` = 4 row
  chunks and each chunk's reduce-scatter runs on 16 SMs (``num_sm``) beside the next chunk's
  GEMM; the last chunk's reduce-scatter runs alone.
- ``bulk`` (qkv_dgrad, fc1_dgrad / qkv_wgrad, fc1_wgrad): the column Linear's backward
  all-gathers its input under the input-gradient GEMM and reduce-scatters the input gradient
  under the weight-gradient GEMM, each collective on 16 SMs beside the whole GEMM.

The chunk GEMMs rotate over up to three compute streams (``_NUM_MAX_UB_STREAMS``), so a chunk
whose input is there starts while the one before drains its last wave: together they take
what the whole GEMM takes, split evenly. ``set_sm_margin`` is 0 by default, so a GEMM beside
an SM-driven collective keeps its launch size and loses the collective's SMs while both run:
priced as the GEMM slowed by the SMs' share for the time they overlap. The collectives take
the time NCCL's would (costmodels.comm); TE's userbuffers reach the GPUs of one NVLink domain
only, so a TP group across nodes is priced without the overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

UB_COMM_SMS = 16
"""SMs of the userbuffers reduce-scatter and bulk kernels (``add_ub`` num_sm default)."""

PIPELINE_SPLITS = 4
"""Row chunks of a ``pipeline`` GEMM + reduce-scatter (``num_splits`` default)."""


@dataclass(frozen=True, slots=True)
class Region:
    """One TP region of a block for one micro-batch, in seconds: the all-gather of its input
    (and of its output gradient), the reduce-scatter of its output (and of its input gradient),
    its column- and row-parallel GEMMs (each backward GEMM as long as the forward one)."""

    gather_s: float
    scatter_s: float
    column_s: float
    row_s: float


def ring_exchange_s(gather_s: float, gemm_s: float, tp: int) -> float:
    """Seconds of a GEMM in ``tp`` chunks under a ring-exchange all-gather: ``tp - 1`` steps
    each as long as the longer of one chunk's GEMM and one point-to-point hop, then the last
    chunk's GEMM."""
    chunk, hop = gemm_s / tp, gather_s / (tp - 1)
    return (tp - 1) * max(chunk, hop) + chunk


def beside_s(comm_s: float, gemm_s: float, sm_share: float) -> float:
    """Seconds of a GEMM and an SM-driven collective run at once: the longer of the two, the
    GEMM slowed by the collective's share of the SMs while they overlap."""
    return max(comm_s, gemm_s + sm_share * min(comm_s, gemm_s))


def pipelined_s(scatter_s: float, gemm_s: float, sm_share: float,
                splits: int = PIPELINE_SPLITS) -> float:
    """Seconds of a GEMM in ``splits`` row chunks whose reduce-scatters are pipelined: the first
    chunk's GEMM, ``splits - 1`` steps of a GEMM beside the previous chunk's reduce-scatter,
    then the last chunk's reduce-scatter alone."""
    chunk, scatter = gemm_s / splits, scatter_s / splits
    return chunk + (splits - 1) * beside_s(scatter, chunk, sm_share) + scatter


def exposed_forward_s(region: Region, tp: int, sm_share: float) -> float:
    """The forward's exposed TP time of one region: what its overlapped GEMMs take beyond the
    GEMMs alone (the compute time counts those)."""
    overlapped = (ring_exchange_s(region.gather_s, region.column_s, tp)
                  + pipelined_s(region.scatter_s, region.row_s, sm_share))
    return overlapped - region.column_s - region.row_s


def exposed_backward_s(region: Region, tp: int, sm_share: float) -> float:
    """The backward's exposed TP time of one region: the output gradient ring-exchanged under
    the row Linear's input-gradient GEMM, the column Linear's input all-gathered under its
    input-gradient GEMM and its input gradient reduce-scattered under its weight-gradient GEMM
    (bulk)."""
    overlapped = (ring_exchange_s(region.gather_s, region.row_s, tp)
                  + beside_s(region.gather_s, region.column_s, sm_share)
                  + beside_s(region.scatter_s, region.column_s, sm_share))
    return overlapped - region.row_s - 2 * region.column_s
