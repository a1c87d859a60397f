"""Communication at scale on H100 nodes (issue 17 item 2): what autoplan predicts, and how much of
it is communication, for the layouts a published nanotron sweep on 1-64 H100 nodes found far
slower than predicted (HF Ultra-Scale Playbook; the rows themselves are not used here):

- a Llama-3.2-1B-like model (16 layers, hidden 2048, GQA 32/8, SwiGLU 8192, vocabulary 128256,
  untied: ~1.5B parameters) with DP 256 x TP 2 on 512 H100 (64 nodes), seq 4096, mbs 1,
  global batch 256 sequences (~1M tokens);
- a 1.34B GPT with DP 256 on 512 H100 under ZeRO 0-3 (Megatron and DeepSpeed), and with
  TP 16/32 on 2-4 nodes;
- TP 8, 16 and 32 for Llama 2 7B-like and 70B-like models (TP 16/32 cross nodes);
- predicted throughput (tokens/s/GPU) of TP 8/16/32 and of DP 8..256 for a ~1.3B and a ~8B
  Llama on p5-like nodes (8 H100, 32x 100 Gb/s EFA);
- Narayanan et al. 2021 (SC21, arXiv 2104.04473) Figure 13: a 162.2B GPT on 64 A100 (DGX A100,
  8x HDR per node), (tp, pp) from (2, 32) to (32, 2), batch 32 and 128. The paper plots the peak
  at (8, 8), about 142 TFLOP/s per GPU at batch 32 and 166 at batch 128 (readings of the plot,
  ../shared/data/README.md section 2.1), falling off on both sides and steeply once TP leaves
  the node.

    .venv/bin/python benchmarks/comm_at_scale.py
"""

from __future__ import annotations

import csv
import types
from pathlib import Path

import autoplan
from autoplan.cluster.topology import group_links
from autoplan.costmodels import comm
from autoplan.zoo import GPT, GPTConfig, Llama, LlamaConfig, next_token_loss


def _model(name: str, config: LlamaConfig | GPTConfig) -> types.ModuleType:
    module = types.ModuleType(name)
    module.build_model = lambda: (GPT if isinstance(config, GPTConfig) else Llama)(config)
    module.loss = next_token_loss
    return module


LLAMA_1B = _model("llama_1b", LlamaConfig(num_layers=16, hidden_size=2048, num_heads=32,
                                          num_kv_heads=8, ffn_hidden_size=8192,
                                          vocab_size=128256))
LLAMA_7B = _model("llama_7b", LlamaConfig(num_layers=32, hidden_size=4096, num_heads=32,
                                          num_kv_heads=32, ffn_hidden_size=11008))
LLAMA_70B = _model("llama_70b", LlamaConfig(num_layers=80, hidden_size=8192, num_heads=64,
                                            num_kv_heads=64, ffn_hidden_size=28672))
"""Llama 2 70B's shapes with full multi-head attention, so that TP 16 and 32 divide its heads."""
LLAMA_1B_MHA = _model("llama_1b_mha", LlamaConfig(num_layers=16, hidden_size=2048, num_heads=32,
                                                  num_kv_heads=32, ffn_hidden_size=8192,
                                                  vocab_size=128256))
"""Llama 3.2 1B's shapes with 32 KV heads (TP 32 must divide them): with tied embeddings
these are 1.34B parameters; autoplan's Llama unties them (1.6B)."""
LLAMA_8B = _model("llama_8b", LlamaConfig(num_layers=32, hidden_size=4096, num_heads=32,
                                          num_kv_heads=32, ffn_hidden_size=14336,
                                          vocab_size=128256))
"""Llama 3 8B's shapes with 32 KV heads (TP 32 must divide them)."""
GPT_1B3 = _model("gpt_1b3", GPTConfig(num_layers=24, hidden_size=2048, num_heads=32,
                                      vocab_size=51200, max_seq_len=2048))
"""A 1.34B GPT (GPT-3 XL's 24 x 2048 with 32 heads so that TP 32 divides them): 12 l h^2 +
V h = 1.21e9 + 0.10e9, with biases, norms and 2048 positions 1.32e9."""
GPT_162B = _model("gpt_162b", GPTConfig(num_layers=32, hidden_size=20480, num_heads=128,
                                        vocab_size=51200, max_seq_len=2048))
"""Narayanan et al.'s 162.2B GPT: 12*l*h^2 + V*h = 12*32*20480^2 + 51200*20480 = 162.1e9
(the paper gives the count, not the shapes; 32 layers of 20480 reproduce it, 128 heads of 160
divide every tp of the figure)."""


def h100_nodes(nodes: int, network: str) -> dict:
    """DGX H100 nodes (8 GPUs on NVSwitch, 8x 400 Gb/s InfiniBand) or p5-like ones (the same
    GPUs, 32x 100 Gb/s EFA) on one fat tree."""
    spec = {"name": f"h100-{network}-x{nodes}", "preset": "dgx-h100", "nodes": nodes}
    if network == "efa":
        spec["inter_node"] = {"link": "efa", "nics_per_node": 32, "bandwidth": "100Gbps"}
    return spec


NETWORKS = ("ib", "efa")


def _comm(estimate) -> dict[str, float]:
    parts = estimate.time_breakdown_s
    return {k: parts.get(k, 0.0) for k in ("tp_comm", "pp_comm", "dp_comm")}


def _show(label: str, result) -> float:
    est = result.estimate
    comm = _comm(est)
    print(f"  {label:34} step {est.step_time_s * 1e3:9.1f} ms   "
          + "  ".join(f"{k} {v * 1e3:8.1f} ms" for k, v in comm.items()))
    return est.step_time_s


def dp_at_scale() -> None:
    print("1.5B Llama-like, 512 H100 (64 nodes), DP 256 x TP 2, seq 4096, mbs 1, 256 sequences")
    for network in NETWORKS:
        for runtime, zero in (("megatron", 0), ("megatron", 1), ("fsdp", 3)):
            pins = {"tp": 2, "pp": 1, "dp": 256, "mbs": 1, "recompute": "none", "zero": zero}
            result = autoplan.estimate(LLAMA_1B, h100_nodes(64, network), pins, seq_len=4096,
                                       global_batch=256, runtime=runtime)
            _show(f"{network:3} {runtime} zero {zero}", result)


def gpt_1b3_at_scale() -> None:
    """The issue's 1.34B model with DP 256 on 512 GPUs (TP 2) under each ZeRO stage of
    Megatron and DeepSpeed, and with TP 16/32 on 2-4 nodes (seq 2048, mbs 1)."""
    print("\n1.34B GPT, seq 2048, mbs 1: DP 256 x TP 2 on 64 nodes (256 sequences); "
          "TP 16/32 (8 sequences per DP rank)")
    for network in NETWORKS:
        for runtime, zero in (("megatron", 0), ("megatron", 1), ("deepspeed", 0),
                              ("deepspeed", 1), ("deepspeed", 2), ("deepspeed", 3)):
            pins = {"tp": 2, "pp": 1, "dp": 256, "mbs": 1, "recompute": "none", "zero": zero}
            result = autoplan.estimate(GPT_1B3, h100_nodes(64, network), pins, seq_len=2048,
                                       global_batch=256, runtime=runtime)
            _show(f"{network:3} DP 256 {runtime} zero {zero}", result)
        for tp, nodes in ((16, 2), (16, 4), (32, 4)):
            dp = nodes * 8 // tp
            pins = {"tp": tp, "pp": 1, "dp": dp, "mbs": 1, "recompute": "none", "zero": 1}
            result = autoplan.estimate(GPT_1B3, h100_nodes(nodes, network), pins, seq_len=2048,
                                       global_batch=8 * dp, runtime="megatron")
            _show(f"{network:3} TP {tp} DP {dp} ({nodes} nodes) megatron", result)


def tp_across_nodes() -> None:
    for name, model, gpus, pp in (("7B", LLAMA_7B, 32, 1), ("70B", LLAMA_70B, 64, 2)):
        print(f"\n{name} Llama-like on {gpus} H100, seq 4096, mbs 1, global batch {gpus // 2}")
        for network in NETWORKS:
            base = None
            for tp in (8, 16, 32):
                dp = gpus // (tp * pp)
                pins = {"tp": tp, "pp": pp, "dp": dp, "mbs": 1, "recompute": "full", "zero": 1}
                result = autoplan.estimate(model, h100_nodes(gpus // 8, network), pins,
                                           seq_len=4096, global_batch=gpus // 2,
                                           runtime="megatron")
                step = _show(f"{network:3} TP {tp:2} PP {pp} DP {dp:2}", result)
                base = base or step
                print(f"  {'':34} {step / base:5.2f}x the TP 8 step")


def busbw_by_ring_size() -> None:
    """All-reduce busbw of whole nodes (TP across nodes) and of one GPU per node (DP rings)."""
    print("all-reduce busbw (GB/s) by node count: whole nodes | one GPU per node")
    sizes = (2**20, 2**25, 2**30)
    print(f"  {'':12}" + "".join(f"{s >> 20:>9} MiB" for s in sizes * 2))
    for network in NETWORKS:
        for nodes in (2, 4, 8, 16, 64):
            cluster = autoplan.load_cluster(h100_nodes(nodes, network)).cluster
            row = []
            for size, stride in ((8 * nodes, 1), (nodes, 8)):
                links = group_links(cluster, size, stride)
                row += [2 * (size - 1) / size * m / comm.all_reduce_time(m, links) / 1e9
                        for m in sizes]
            print(f"  {network:3} {nodes:3} nodes" + "".join(f"{b:13.1f}" for b in row))


def _tokens_per_gpu(result, seq_len: int, global_batch: int, gpus: int) -> float:
    return global_batch * seq_len / result.estimate.step_time_s / gpus


def p5_throughput() -> None:
    """Tokens/s/GPU predicted for TP 8/16/32 (DP fills 64 GPUs) and for DP 8..256 (TP 1),
    seq 4096, mbs 1, 1M-token batches, Megatron with the distributed optimizer."""
    seq, batch = 4096, 256
    for name, model in (("1.3B", LLAMA_1B_MHA), ("8B", LLAMA_8B)):
        print(f"\n{name} Llama-like on p5-like nodes (efa), seq {seq}, mbs 1, {batch} sequences")
        for tp in (8, 16, 32):
            pins = {"tp": tp, "pp": 1, "dp": 64 // tp, "mbs": 1, "recompute": "none", "zero": 1}
            result = autoplan.estimate(model, h100_nodes(8, "efa"), pins, seq_len=seq,
                                       global_batch=batch, runtime="megatron")
            share = comm.communication_share(result.estimate)
            print(f"  TP {tp:2} DP {64 // tp:2} on 64 GPUs   "
                  f"{_tokens_per_gpu(result, seq, batch, 64):8.0f} tokens/s/GPU   comm {share:4.0%}")
        for dp in (8, 16, 32, 64, 128, 256):
            pins = {"tp": 1, "pp": 1, "dp": dp, "mbs": 1, "recompute": "full", "zero": 1}
            result = autoplan.estimate(model, h100_nodes(dp // 8, "efa"), pins, seq_len=seq,
                                       global_batch=batch, runtime="megatron")
            share = comm.communication_share(result.estimate)
            print(f"  TP  1 DP {dp:3} on {dp:3} GPUs  "
                  f"{_tokens_per_gpu(result, seq, batch, dp):8.0f} tokens/s/GPU   comm {share:4.0%}")


TP16_ALL_GATHER_BY_HAND_S = 226.5e-6
"""One sequence-parallel all-gather of an 8B Llama layer's activations (mbs 1 x 4096 tokens x
4096 x 2 B = 32 MiB) over TP 16 on two p5 nodes, worked from tuning.cc's constants:
busbw = 8 GPUs x 4 NICs x 12.5 GB/s x 0.80 (EFA on 2 nodes) = 320 GB/s (NVLink's 480 is higher);
ring, 15 steps of which 1 crosses the network (EFA: + 75 us per network step, twice for Simple).
  LL128:  14.0 + 14 x max(1.9, 1.0) + (4.0 + 75)    = 119.6 us + 15/16 x 32 MiB / (0.92 x 320 GB/s)
          = 119.6 + 106.9 = 226.5 us   <- NCCL's choice
  Simple:  8.4 + 14 x max(3.4, 3.0) + (14 + 2 x 75) = 220.0 us + 98.3 us = 318.3 us
  LL:      6.6 + 14 x max(0.6, 1.0) + (2.7 + 75)    =  98.3 us + 15/16 x 32 MiB / 39 GB/s = 905 us
32 layers x 4 such collectives in the forward (2 gathers, 2 reduce-scatters) are 29 ms per
micro-batch, against ~9 ms of forward GEMMs (2 x 7e9 / 16 x 4096 FLOP at ~400 TFLOP/s): TP 16
across nodes is communication-bound before any loss the model does not know about."""


def bucket_reduction_by_ranks() -> None:
    """One gradient bucket's all-reduce and reduce-scatter over DP 8..256 on p5-like nodes,
    the DP ranks on whole nodes (TP 1) or one per node (TP 8 inside the node): DDP's 25 MiB
    bucket (torch DistributedDataParallel bucket_cap_mb, also nanotron's ddp_bucket_cap_mb
    default, whose fp32 accumulation hook all-reduces the same parameters in fp32: 50 MiB)."""
    print("\nper-bucket DP reduction on p5-like nodes: ms (effective busbw GB/s)")
    for label, stride in (("whole nodes", 1), ("one GPU per node", 8)):
        for dp in (8, 16, 32, 64, 128, 256):
            nodes = max(1, dp * stride // 8)
            cluster = autoplan.load_cluster(h100_nodes(nodes, "efa")).cluster
            links = group_links(cluster, dp, stride)
            row = []
            for size in (25 * 2**20, 50 * 2**20):
                ar = comm.all_reduce_time(size, links)
                rs = comm.reduce_scatter_time(size, links)
                row.append(f"AR {ar * 1e3:6.2f} ({2 * (dp - 1) / dp * size / ar / 1e9:5.1f})  "
                           f"RS {rs * 1e3:6.2f} ({(dp - 1) / dp * size / rs / 1e9:5.1f})")
            print(f"  {label:16} DP {dp:3} ({nodes:3} nodes)  25 MiB: {row[0]}   50 MiB: {row[1]}")


def tp16_all_gather_check() -> None:
    cluster = autoplan.load_cluster(h100_nodes(2, "efa")).cluster
    seconds = comm.all_gather_time(32 * 2**20, group_links(cluster, 16, 1))
    print(f"\nTP 16 all-gather of 32 MiB on 2 p5 nodes: {seconds * 1e6:.1f} us "
          f"(worked by hand: {TP16_ALL_GATHER_BY_HAND_S * 1e6:.1f} us)")


SC21_MEGATRON = {"tp_bwd_overlap": False}
"""Megatron-LM as of the SC'21 runs (April 2021): before its asynchronous TP all-reduce of input
gradients (benchmarks/published_runs.py, ASYNC_TP_ALLREDUCE_YEAR poses N21 rows the same way)."""

NARAYANAN_FIG13_PEAK = {32: 142.0, 128: 166.0}
"""TFLOP/s per GPU at (tp, pp) = (8, 8), read off Figure 13 (../shared/data/README.md 2.1)."""


def narayanan_fig13() -> None:
    print("\nNarayanan et al. 2021 Fig. 13: 162.2B GPT on 64 A100 (8 per node, 8x HDR), "
          "seq 2048, mbs 1, full recompute; TFLOP/s per GPU (Narayanan eq. 3)")
    spec = {"name": "dgx-a100-x8", "preset": "dgx-a100", "nodes": 8}
    for batch, peak in NARAYANAN_FIG13_PEAK.items():
        row = []
        for tp, pp in ((2, 32), (4, 16), (8, 8), (16, 4), (32, 2)):
            pins = {"tp": tp, "pp": pp, "dp": 1, "mbs": 1, "recompute": "full", "zero": 0}
            try:
                result = autoplan.estimate(GPT_162B, spec, pins, seq_len=2048,
                                           global_batch=batch, runtime="megatron",
                                           runtime_settings=SC21_MEGATRON)
            except autoplan.AutoplanError as err:
                row.append(f"({tp},{pp}) -- {type(err).__name__}")
                continue
            row.append(f"({tp},{pp}) {result.estimate.hardware_tflops_per_gpu:5.1f}")
        print(f"  batch {batch:3} (published peak at (8,8): ~{peak:.0f})  " + "  ".join(row))


P5_NCCL_TESTS = Path(__file__).resolve().parents[1] / "tests" / "data" / "nccl_tests" / "p5_efa.csv"
"""nccl-tests all_gather_perf / all_reduce_perf on 2-32 p5 nodes (tests/data/nccl_tests/README.md)."""


def p5_nccl_tests() -> None:
    """Predicted against measured time of every row of the p5 table: the 32 MiB column is the
    latency that grows with the ranks, the 2 GiB one the bandwidth each node count keeps."""
    print("\nnccl-tests on p5 (8 H100, 32x 100 Gb/s EFA): predicted / measured time")
    with P5_NCCL_TESTS.open() as f:
        rows = list(csv.DictReader(f))
    sizes = sorted({int(r["size_bytes"]) for r in rows})
    print(f"  {'':22}" + "".join(f"{s >> 20:>8}M" for s in sizes))
    for collective in ("all_gather", "all_reduce"):
        for nodes in sorted({int(r["nodes"]) for r in rows}):
            cluster = autoplan.load_cluster(h100_nodes(nodes, "efa")).cluster
            links = group_links(cluster, 8 * nodes, 1)
            time = comm.all_gather_time if collective == "all_gather" else comm.all_reduce_time
            by_size = {int(r["size_bytes"]): r for r in rows
                       if r["collective"] == collective and int(r["nodes"]) == nodes}
            cells = []
            for size in sizes:
                row = by_size.get(size)
                measured = size / (float(row["algbw_GBps"]) * 1e9) if row else None
                cells.append(f"{time(size, links) / measured:9.2f}" if measured else " " * 9)
            print(f"  {collective:10} {nodes:3} nodes " + "".join(cells))


if __name__ == "__main__":
    p5_nccl_tests()
    busbw_by_ring_size()
    dp_at_scale()
    gpt_1b3_at_scale()
    tp_across_nodes()
    tp16_all_gather_check()
    bucket_reduction_by_ranks()
    p5_throughput()
    narayanan_fig13()
