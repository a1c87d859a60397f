"""Transformer Engine's userbuffers overlap of a block's sequence-parallel TP collectives with
its GEMMs: Megatron-LM's ``--tp-comm-overlap``, NeMo's ``ub_tp_comm_overlap`` (runtime setting
``tp_comm_overlap``; ``tp_comm_overlap_cfg`` as ``--tp-comm-overlap-cfg`` / NeMo's
``ub_tp_comm_overlap_cfg`` give it).

As Transformer Engine 1.8 sets it up (the version Megatron-Core r0.8 ran;
transformer_engine/pytorch/module/base.py ``initialize_ub``, the schedules in
csrc/comm_gemm_overlap.h), a block's two TP regions, attention (``qkv`` column-parallel, then
``proj`` row-parallel) and MLP (``fc1``, then ``fc2``), overlap their collectives three ways:

- ``ring_exchange`` (qkv_fprop, fc1_fprop; proj_dgrad, fc2_dgrad): the all-gather of the
  sequence-sharded input is ``tp - 1`` point-to-point steps on the copy engines
  (``use_ce``), each under the GEMM of the chunk already there (the GEMM in ``tp`` chunks of
  ``1/tp`` of the rows); it takes no SMs.
- ``pipeline`` (proj_fprop, fc2_fprop): the row-parallel GEMM runs in ``num_splits`` row
  chunks and each chunk's reduce-scatter runs on ``num_sm`` SMs beside the next chunk's GEMM;
  the last chunk's reduce-scatter runs alone.
- ``bulk`` (qkv_dgrad, fc1_dgrad / qkv_wgrad, fc1_wgrad): the column Linear's backward
  all-gathers its input under the input-gradient GEMM and reduce-scatters the input gradient
  under the weight-gradient GEMM, each collective on ``num_sm`` SMs beside the whole GEMM.

The chunk GEMMs rotate over up to three compute streams (``_NUM_MAX_UB_STREAMS``), so a chunk
whose input is there starts while the one before drains its last wave: together they take
what the whole GEMM takes, split evenly. A GEMM beside an SM-driven collective either keeps its
launch size and loses the collective's SMs while both run (``set_sm_margin`` 0, the default:
priced as the GEMM slowed by the SMs' share for the time they overlap) or is launched on the
other SMs for its whole length (``set_sm_margin`` 1: ``_math_sms = SMs - num_sm``). Defaults as
``initialize_ub`` has them without a config: 16 SMs, no margin, 4 splits, no aggregation. The collectives take
the time NCCL's would (costmodels.comm); userbuffers reach the GPUs of one NVLink domain only,
so a TP group across nodes is priced without the overlap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autoplan.errors import ConstraintError

METHODS = {"qkv_fprop": "ring_exchange", "fc1_fprop": "ring_exchange",
           "proj_dgrad": "ring_exchange", "fc2_dgrad": "ring_exchange",
           "proj_fprop": "pipeline", "fc2_fprop": "pipeline",
           "qkv_dgrad": "bulk", "qkv_wgrad": "bulk", "fc1_dgrad": "bulk", "fc1_wgrad": "bulk"}
"""Each overlapped GEMM and its default method (``initialize_ub``'s ``methods``); other
methods are not priced."""

REGION_OPS = (("qkv", "proj"), ("fc1", "fc2"))
"""The names of a block's regions in order: column-parallel Linear, row-parallel Linear."""

UB_COMM_SMS = 16
"""SMs of the userbuffers reduce-scatter and bulk kernels (``add_ub`` num_sm default)."""

PIPELINE_SPLITS = 4
"""Row chunks of a ``pipeline`` GEMM + reduce-scatter (``num_splits`` default)."""

IGNORED_KEYS = ("method", "cga_size", "atomic_gemm", "use_ce", "fp8_buf")
"""Keys of an op's config that leave its price as it is (checked where they could not)."""


AG_BUFFER_OPS = ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "fc1_fprop", "fc1_dgrad", "fc2_dgrad")
"""``layers_all_gather_overlap``: their buffers hold FP8 under an FP8 recipe (``fp8_buf``)."""

UB_STREAMS = 3
"""``_NUM_MAX_UB_STREAMS``: ``initialize_ub`` widens TE's cuBLAS workspace to this many
copies, one per compute stream of the chunk GEMMs."""


def userbuffer_bytes(activation_bytes: float, fp8: bool) -> float:
    """Device memory the userbuffers take outside PyTorch's allocator: one buffer per overlapped
    op (``register_user_buffer_collective`` allocates it), of the ``(seq * mbs / cp, hidden)``
    shape Megatron gives ``initialize_ub`` (``activation_bytes`` at 2 bytes an element; the
    all-gather ops' at 1 byte under FP8). The pipeline ops as TE's defaults have them; a
    ring-exchange reduce-scatter (not priced) would hold ``2 tp - 1`` chunks."""
    return sum(activation_bytes / 2 if fp8 and op in AG_BUFFER_OPS else activation_bytes
               for op in METHODS)


def te_workspace_bytes(compute_capability: float | None) -> float:
    """TE's cuBLAS workspace, ``get_cublas_workspace_size_bytes`` (32 MiB from Hopper on, else
    4 MiB; unknown GPUs as Hopper), in :data:`UB_STREAMS` copies as the overlap allocates it
    through PyTorch."""
    one = 4 * 2**20 if compute_capability is not None and compute_capability < 9 else 32 * 2**20
    return UB_STREAMS * one


@dataclass(frozen=True, slots=True)
class OpSettings:
    """One overlapped GEMM's settings: its collective's ``num_sm`` SMs, the GEMM launched on
    the rest (``margin``) or on all, the ``splits`` of a pipelined GEMM, a ring exchange's
    chunks sent two at a time (``aggregate``)."""

    num_sm: int = UB_COMM_SMS
    margin: bool = False
    splits: int = PIPELINE_SPLITS
    aggregate: bool = False


def frozen_cfg(cfg: Mapping | None) -> tuple[tuple[str, OpSettings], ...]:
    """A ``tp_comm_overlap_cfg`` mapping (TE's ub_cfgs: op name to its settings) as the
    runtime profile keeps it, sorted by op.

    Raises:
        ConstraintError: an op or key TE does not have, another method than the default, an
            aggregated ring exchange or atomic GEMMs (not priced).
    """
    if not cfg:
        return ()
    if not isinstance(cfg, Mapping):
        raise ConstraintError("runtime setting tp_comm_overlap_cfg must map op names (e.g. "
                              "qkv_fprop) to their settings, as --tp-comm-overlap-cfg does.")
    return tuple(sorted((op, _op_settings(op, settings)) for op, settings in cfg.items()))


def _op_settings(op: str, settings: Mapping) -> OpSettings:
    if op not in METHODS:
        raise ConstraintError(f"tp_comm_overlap_cfg names {op!r}, not an op Transformer "
                              f"Engine overlaps; choose from {', '.join(METHODS)}.")
    priced = ("num_sm", "set_sm_margin", "num_splits", "aggregate")
    unknown = sorted(set(settings) - {*priced, *IGNORED_KEYS})
    if unknown:
        raise ConstraintError(f"tp_comm_overlap_cfg {op}: {', '.join(unknown)} not known; "
                              f"autoplan prices {', '.join(priced)}.")
    if settings.get("method", METHODS[op]) != METHODS[op]:
        raise ConstraintError(f"tp_comm_overlap_cfg {op}: method {settings['method']!r} is not "
                              f"priced; autoplan prices {op} as {METHODS[op]}.")
    if settings.get("atomic_gemm"):
        raise ConstraintError(f"tp_comm_overlap_cfg {op}: atomic_gemm (FP8 only) is not "
                              "priced; set it to 0.")
    return OpSettings(num_sm=int(settings.get("num_sm", UB_COMM_SMS)),
                      margin=bool(settings.get("set_sm_margin", 0)),
                      splits=int(settings.get("num_splits", PIPELINE_SPLITS)),
                      aggregate=bool(settings.get("aggregate", 0)))


def cfg_mapping(cfg: tuple[tuple[str, OpSettings], ...]) -> dict[str, dict[str, int]] | None:
    """A frozen config back in TE's keys (the inverse of :func:`frozen_cfg` on what it
    prices), for the plan's record; None for TE's defaults."""
    return {op: {"num_sm": o.num_sm, "set_sm_margin": int(o.margin), "num_splits": o.splits,
                 "aggregate": int(o.aggregate)} for op, o in cfg} or None


def op_settings(cfg: tuple[tuple[str, OpSettings], ...], op: str) -> OpSettings:
    """The op's settings in a frozen config, else TE's defaults."""
    return next((sms for name, sms in cfg if name == op), OpSettings())


@dataclass(frozen=True, slots=True)
class Region:
    """One TP region of a block for one micro-batch, in seconds: the all-gather of its input
    (and of its output gradient), the reduce-scatter of its output (and of its input gradient),
    its column- and row-parallel GEMMs, forward and each backward one (the input- and
    weight-gradient GEMMs are the forward's size, at the backward rate: FP8's split
    accumulator, costmodels.fp8.linear_rate); ``names``: TE's (column, row) names for it
    (:data:`REGION_OPS`)."""

    gather_s: float
    scatter_s: float
    column_s: float
    row_s: float
    column_bwd_s: float
    row_bwd_s: float
    names: tuple[str, str]


def ring_exchange_s(gather_s: float, gemm_s: float, tp: int, aggregate: bool = False) -> float:
    """Seconds of a GEMM in ``tp`` chunks under a ring-exchange all-gather: ``tp - 1`` steps
    each as long as the longer of one chunk's GEMM and one point-to-point hop of a chunk, then
    the last chunk's GEMM. Aggregated (``split_overlap_ag``'s ``_aggregate2``, even ``tp``):
    one chunk swapped with the neighbour first, then ``tp / 2`` steps of two chunks each."""
    chunk, hop = gemm_s / tp, gather_s / (tp - 1)
    if aggregate and tp % 2 == 0:
        return hop + (tp // 2 - 1) * 2 * max(chunk, hop) + 2 * chunk
    return (tp - 1) * max(chunk, hop) + chunk


def beside_s(comm_s: float, gemm_s: float, sms: OpSettings, sm_count: int) -> float:
    """Seconds of a GEMM and an SM-driven collective run at once: the longer of the two, the
    GEMM on the SMs the collective leaves it (with a margin) or slowed by the collective's share
    of the SMs while they overlap (without)."""
    if sms.margin:
        return max(comm_s, gemm_s * sm_count / (sm_count - sms.num_sm))
    return max(comm_s, gemm_s + sms.num_sm / sm_count * min(comm_s, gemm_s))


def pipelined_s(scatter_s: float, gemm_s: float, sms: OpSettings, sm_count: int) -> float:
    """Seconds of a GEMM in ``splits`` row chunks whose reduce-scatters are pipelined: the first
    chunk's GEMM, ``splits - 1`` steps of a GEMM beside the previous chunk's reduce-scatter,
    then the last chunk's reduce-scatter alone."""
    splits = sms.splits
    chunk, scatter = gemm_s / splits, scatter_s / splits
    first = beside_s(0.0, chunk, sms, sm_count)  # with a margin, the first chunk is slowed too
    return first + (splits - 1) * beside_s(scatter, chunk, sms, sm_count) + scatter


def exposed_forward_s(region: Region, tp: int, cfg: tuple, sm_count: int) -> float:
    """The forward's exposed TP time of one region: what its overlapped GEMMs take beyond the
    GEMMs alone (the compute time counts those)."""
    column, row = region.names
    ring = op_settings(cfg, f"{column}_fprop")
    overlapped = (ring_exchange_s(region.gather_s, region.column_s, tp, ring.aggregate)
                  + pipelined_s(region.scatter_s, region.row_s, op_settings(cfg, f"{row}_fprop"),
                                sm_count))
    return overlapped - region.column_s - region.row_s


def exposed_backward_s(region: Region, tp: int, cfg: tuple, sm_count: int) -> float:
    """The backward's exposed TP time of one region: the output gradient ring-exchanged under
    the row Linear's input-gradient GEMM, the column Linear's input all-gathered under its
    input-gradient GEMM and its input gradient reduce-scattered under its weight-gradient GEMM
    (bulk)."""
    column, row = region.names
    ring = op_settings(cfg, f"{row}_dgrad")
    column_s, row_s = region.column_bwd_s, region.row_bwd_s
    overlapped = (ring_exchange_s(region.gather_s, row_s, tp, ring.aggregate)
                  + beside_s(region.gather_s, column_s, op_settings(cfg, f"{column}_dgrad"),
                             sm_count)
                  + beside_s(region.scatter_s, column_s, op_settings(cfg, f"{column}_wgrad"),
                             sm_count))
    return overlapped - row_s - 2 * column_s
