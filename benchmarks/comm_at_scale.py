"""Communication at scale on H100 nodes (issue 17 item 2): what autoplan predicts, and how much of
it is communication, for the layouts a published nanotron sweep on 1-64 H100 nodes found far
slower than predicted (HF Ultra-Scale Playbook; the rows themselves are not used here):

- a Llama-3.2-1B-like model (16 layers, hidden 2048, GQA 32/8, SwiGLU 8192, vocabulary 128256,
  untied: ~1.5B parameters) with DP 256 x TP 2 on 512 H100 (64 nodes), seq 4096, mbs 1,
  global batch 256 sequences (~1M tokens);
- TP 8, 16 and 32 for Llama 2 7B-like and 70B-like models (TP 16/32 cross nodes).

    .venv/bin/python benchmarks/comm_at_scale.py
"""

from __future__ import annotations

import types

import autoplan
from autoplan.cluster.topology import group_links
from autoplan.costmodels import comm
from autoplan.zoo import Llama, LlamaConfig, next_token_loss


def _model(name: str, config: LlamaConfig) -> types.ModuleType:
    module = types.ModuleType(name)
    module.build_model = lambda: Llama(config)
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


if __name__ == "__main__":
    busbw_by_ring_size()
    dp_at_scale()
    tp_across_nodes()
