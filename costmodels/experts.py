"""Expert parallelism (EP) of mixture-of-experts layers: what a GPU holds and what it sends.

Megatron-core's scheme (megatron/core/transformer/moe, MoEAlltoAllTokenDispatcher): the experts
of each MoE layer are split over ``ep`` ranks taken from the data-parallel replicas, so a GPU
holds ``num_experts / ep`` of them (TP still splits each expert, as it does by default:
expert tensor parallelism = TP). Each MoE layer adds, per micro-batch, two all-to-alls of the
routed tokens forward (dispatch to the experts' ranks, combine back) and two backward (their
gradients), plus the forward's two again when the layer is fully recomputed. They sit between
the router and the experts, on the critical path, and are counted exposed (no overlap with
compute is modelled).

The trace records the experts as one Linear over all ``tokens * top_k`` routed rows (balanced
routing). What runs (``--moe-grouped-gemm``, as the Megatron export sets) is one grouped GEMM
over the ``num_experts / ep`` local experts, each of ``tokens * top_k * ep / num_experts`` rows:
every group pads its rows to whole tiles, and the GPU whose experts drew the most tokens sets
the time of the EP group (the others wait at the combine all-to-all). Around it the dispatcher
moves the routed rows through memory: permute before the dispatch and unpermute after the
combine (``moe_utils.permute``/``unpermute``), and with several local experts the two
``sort_chunks_by_idxs`` that order the received rows by expert. :func:`routing_time` prices
this against the balanced single GEMM compute.py already counted.
"""

from __future__ import annotations

from math import ceil, gcd, sqrt
from statistics import NormalDist

from autoplan.cluster.catalog import GpuSpec
from autoplan.cluster.topology import GroupLinks
from autoplan.costmodels import comm
from autoplan.costmodels.compute import GEMM_TILE, Split, gemm_time, local_shape
from autoplan.costmodels.profiles import ComputeProfile
from autoplan.costmodels.quantization import HALF_BYTES
from autoplan.graph.layer_graph import Experts, Layer

TOKEN_BYTES = 2
"""bf16/fp16 bytes per element of a routed token's hidden vector."""

FORWARD_ALL_TO_ALLS = 2  # dispatch and combine
BACKWARD_ALL_TO_ALLS = 2  # their gradients, in reverse

ROUTED_PASSES_FORWARD = 2
"""Memory passes over the routed rows in the forward of the all-to-all dispatcher: permute
(gather each token's top_k copies into expert order) and unpermute (scatter them back, weighted
by the router's probabilities); each reads and writes ``tokens * top_k`` hidden vectors."""

SORT_PASSES_FORWARD = 2
"""``sort_chunks_by_idxs`` after the dispatch and before the combine, run when a GPU holds
more than one expert (MoEAlltoAllTokenDispatcher.dispatch_postprocess/combine_preprocess)."""


def expert_params(layer: Layer) -> int:
    """Parameters of the layer's experts (all of them, before TP or EP split them)."""
    return sum(e.num_experts * e.params_per_expert for e in layer.experts)


def expert_hidden_size(layer: Layer, experts: Experts) -> int:
    """Width of a routed token: the output of the experts' last Linear (the down projection
    back to the hidden size), from the layer's traced GEMMs."""
    own = [g for g in layer.gemms if g.name.startswith(experts.name)]
    return own[-1].out_features


def routed_bytes(layer: Layer, split: Split) -> float:
    """Bytes one GPU sends in one all-to-all of one micro-batch, summed over the layer's MoE
    modules: its tokens (the sequence split by CP, and by TP: Megatron requires sequence
    parallelism with EP and TP) times top_k copies of the hidden vector."""
    rows = sum(e.tokens_per_expert * e.num_experts * expert_hidden_size(layer, e)
               for e in layer.experts)  # tokens * top_k hidden vectors per sample
    return rows * TOKEN_BYTES * split.mbs / (split.cp * split.tp)


def all_to_alls(full_recompute: bool) -> int:
    """All-to-alls per MoE layer and micro-batch (the recomputed forward repeats its two)."""
    return BACKWARD_ALL_TO_ALLS + FORWARD_ALL_TO_ALLS * (2 if full_recompute else 1)


def ep_comm_time(layer: Layer, split: Split, ep_links: GroupLinks, *,
                 full_recompute: bool) -> float:
    """Exposed all-to-all seconds of one layer for one micro-batch over the EP group."""
    if not layer.experts or ep_links.size <= 1:
        return 0.0
    return all_to_alls(full_recompute) * comm.all_to_all_time(routed_bytes(layer, split), ep_links)


def expected_max_normal(n: int) -> float:
    """Expected largest of ``n`` independent standard normal draws (Blom's approximation
    ``Phi^-1((n - 0.375) / (n + 0.25))``; 0 for one draw)."""
    return 0.0 if n <= 1 else NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def slowest_rank_load(experts: Experts, tokens_per_rank: float, ep: int) -> float:
    """Routed rows of the busiest of ``ep`` GPUs over its balanced share: each of the EP
    group's ``ep * tokens_per_rank`` tokens picks ``top_k`` distinct experts at random, so the
    rows a GPU's ``num_experts / ep`` experts receive vary (hypergeometric per token), and the
    largest of the ``ep`` sums sets the time. The sums add up to the group's rows, so they are
    ``ep`` independent normals of variance ``ep/(ep-1)`` times a GPU's, less their mean. This is the floor a uniform router reaches; a
    trained router's preferences add to it (not modelled: no transferable published figure)."""
    if ep <= 1:
        return 1.0
    share, k, e = 1.0 / ep, experts.top_k, experts.num_experts
    mean = tokens_per_rank * ep * k * share
    variance = tokens_per_rank * ep * k * share * (1 - share) * (e - k) / max(1, e - 1)
    spread = sqrt(variance * ep / (ep - 1))
    return 1.0 + expected_max_normal(ep) * spread / mean


def grouped_gemm_time(groups: int, rows: float, n: float, k: float, gpu: GpuSpec, peak: float,
                      profile: ComputeProfile) -> float:
    """Seconds of one grouped GEMM of ``groups`` problems of ``rows x k @ k x n``: one kernel
    whose tiles are those of every group, each group's rows padded to whole tiles."""
    padded = groups * ceil(rows / GEMM_TILE[0]) * GEMM_TILE[0]
    traffic = HALF_BYTES * groups * (rows * k + k * n + rows * n)  # each group's own weight
    return max(gemm_time(padded, n, k, gpu, peak, profile),
               traffic / (gpu.memory_bandwidth_Bps * profile.memory_efficiency))


def _expert_gemm_surcharge(layer: Layer, experts: Experts, split: Split, ep: int, gpu: GpuSpec,
                           peak: float, profile: ComputeProfile) -> tuple[float, float]:
    """(forward, backward) seconds the grouped expert GEMMs on the busiest GPU take beyond the
    balanced single GEMM counted for them."""
    local = experts.num_experts // ep
    fwd = bwd = 0.0
    for gemm in (g for g in layer.gemms if g.name.startswith(experts.name)):
        rows, k, n = local_shape(gemm, split)  # all routed rows of the GPU, one expert's weight
        tokens = rows / experts.top_k
        busiest = rows * slowest_rank_load(experts, tokens, ep) / local
        extra = gemm.count * (grouped_gemm_time(local, busiest, n, k, gpu, peak, profile)
                              - gemm_time(rows, n, k, gpu, peak, profile))
        fwd += extra
        bwd += extra * (int(gemm.dgrad) + int(gemm.wgrad))
    return fwd, bwd


def _routed_pass_time(layer: Layer, experts: Experts, split: Split, ep: int, gpu: GpuSpec,
                      profile: ComputeProfile) -> float:
    """Forward seconds of the dispatcher's memory passes over the routed rows (a backward
    runs the same passes on the gradients)."""
    rows = experts.tokens_per_expert * experts.num_experts * split.mbs / split.cp
    hidden = expert_hidden_size(layer, experts)
    pass_bytes = 2 * rows * hidden * TOKEN_BYTES  # read and write each routed row once
    permute = ROUTED_PASSES_FORWARD * pass_bytes / split.tp  # on the GPU's own (SP) tokens
    sort = SORT_PASSES_FORWARD * pass_bytes if experts.num_experts // ep > 1 else 0.0
    return (permute + sort) / (gpu.memory_bandwidth_Bps * profile.memory_efficiency)


def routing_time(layer: Layer, split: Split, ep: int, *, gpu: GpuSpec, peak: float,
                 profile: ComputeProfile, full_recompute: bool) -> float:
    """Compute seconds of one layer for one micro-batch that expert routing adds to the
    balanced trace: grouped GEMMs at their real shapes on the busiest GPU, and the
    dispatcher's permutation passes, forward, backward and (full recompute) forward again."""
    total = 0.0
    for experts in layer.experts:
        gemm_fwd, gemm_bwd = _expert_gemm_surcharge(layer, experts, split, ep, gpu, peak, profile)
        passes = _routed_pass_time(layer, experts, split, ep, gpu, profile)
        forward = gemm_fwd + passes
        total += forward * (2 if full_recompute else 1) + gemm_bwd + passes
    return total


def common_expert_count(layers) -> int | None:
    """The number of experts every MoE layer of the model has in common (their gcd; EP must
    divide it), or None for a dense model."""
    counts = [e.num_experts for layer in layers for e in layer.experts]
    if not counts:
        return None
    result = 0
    for c in counts:
        result = gcd(result, c)
    return result
