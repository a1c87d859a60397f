"""Practitioners' rules of thumb (DESIGN.md, "The knowledge it encodes") as worked examples.

Each rule names a model, a cluster and training settings, and a check of the solver's plan
written from the rule, not from the solver's output. Run it to see each plan and whether the
rule holds; tests/sweep/test_rules_of_thumb.py asserts the same checks.

    .venv/bin/python examples/rules_of_thumb.py [RULE ...]
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from autoplan.costmodels.placement import axis_links
from autoplan.plan import Offload, Result
from autoplan.zoo import Llama, LlamaConfig

EXAMPLES = Path(__file__).resolve().parent


def llama_module(name: str, config: LlamaConfig) -> types.ModuleType:
    """A model.py equivalent for a Llama-shaped model of the given size."""
    module = types.ModuleType(name)
    module.build_model = lambda: Llama(config)
    return module


LLAMA_4B = LlamaConfig(num_layers=32, hidden_size=3200, num_heads=32, num_kv_heads=32,
                       ffn_hidden_size=8640)  # ~4.2B parameters: 16 B/param = 67 GB of states
LLAMA_42B = LlamaConfig(num_layers=60, hidden_size=8192, num_heads=64, num_kv_heads=8,
                        ffn_hidden_size=22016)  # ~42B: 16 B/param = 670 GB, more than 8x 80 GB


@dataclass(frozen=True)
class Rule:
    name: str
    statement: str
    model: object  # path or module
    cluster: Path | dict
    settings: dict
    holds: Callable[[Result], bool]
    expect: str
    pins: dict = field(default_factory=dict)


def _model(name: str) -> Path:
    return EXAMPLES / "models" / f"{name}.py"


def _cluster(name: str) -> Path:
    return EXAMPLES / "clusters" / f"{name}.yaml"


def pp_across_nodes_zero_at_most_1(result: Result) -> bool:
    """The pipeline crosses the nodes; the data-parallel group stays inside one; no ZeRO-3 (the
    rule's "ZeRO-1 at most" keeps ZeRO-3's per-micro-batch gathers off the slow network; with
    the DP group inside a node, FSDP's ZeRO-2 moves the bytes of a DP all-reduce there and
    never touches it, and FSDP has no ZeRO-1)."""
    from autoplan import api
    cluster, p = api.load_cluster(result.cluster).cluster, result.plan
    return (p.pp > 1 and p.zero_stage <= 2 and not axis_links(cluster, p, "dp").crosses_nodes
            and axis_links(cluster, p, "pp").crosses_nodes)


RULES = [
    Rule("one_gpu_4b", "one 80 GB GPU trains a ~4B model without offload",
         llama_module("llama_4b", LLAMA_4B), _cluster("a100-x1"),
         {"seq_len": 2048, "global_batch": 8},
         lambda r: r.plan.offload is Offload.NONE, "offload none"),
    Rule("one_gpu_4b_deepspeed", "one 80 GB GPU trains a ~4B model without offload (DeepSpeed)",
         llama_module("llama_4b", LLAMA_4B), _cluster("a100-x1"),
         {"seq_len": 2048, "global_batch": 8, "runtime": "deepspeed"},
         lambda r: r.plan.offload is Offload.NONE, "offload none"),
    Rule("one_gpu_7b", "a 7B model on one 80 GB GPU needs CPU offload",
         _model("llama2_7b"), _cluster("a100-x1"),
         {"seq_len": 2048, "global_batch": 8, "runtime": "deepspeed"},
         lambda r: r.plan.offload is not Offload.NONE, "offload optimizer or params"),
    Rule("no_nvlink_pp", "without NVLink, PP is preferred over TP (8x RTX 4090 on PCIe)",
         _model("llama2_7b"), _cluster("rtx4090-x8-pcie"), {"seq_len": 2048, "global_batch": 64},
         lambda r: r.plan.pp > r.plan.tp, "pp > tp"),
    Rule("slow_network_pp", "over 10 Gb/s Ethernet, PP goes across nodes and ZeRO-3 does not "
         "(a 42B model that needs both nodes)",
         llama_module("llama_42b", LLAMA_42B), _cluster("pcie-x2-10gbe"),
         {"seq_len": 2048, "global_batch": 64},
         pp_across_nodes_zero_at_most_1, "pp > 1 across nodes, DP inside a node, ZeRO <= 2"),
    Rule("slow_network_pp_7b", "over 10 Gb/s Ethernet, PP goes across nodes and ZeRO-3 does not "
         "(Llama 2 7B)",
         _model("llama2_7b"), _cluster("pcie-x2-10gbe"), {"seq_len": 2048, "global_batch": 64},
         pp_across_nodes_zero_at_most_1, "pp > 1 across nodes, DP inside a node, ZeRO <= 2"),
    Rule("dgx_3d", "hundreds of billions on DGX clusters: 3D parallelism, TP inside nodes",
         _model("gpt3_175b"), _cluster("dgx-a100-x16"), {"seq_len": 2048, "global_batch": 256},
         lambda r: 1 < r.plan.tp <= 8 and r.plan.pp > 1 and r.plan.dp > 1,
         "1 < tp <= 8, pp > 1, dp > 1"),
    Rule("one_node_7b", "a 7B model on one DGX node: plain ZeRO/DP (no TP, no PP)",
         _model("llama2_7b"), _cluster("dgx-a100-x1"), {"seq_len": 2048, "global_batch": 64},
         lambda r: r.plan.tp == 1 and r.plan.pp == 1, "tp = pp = 1"),
]

def check(rule: Rule) -> tuple[Result, bool]:
    from autoplan import api
    result = api.solve(rule.model, rule.cluster, pins=rule.pins, **rule.settings)
    return result, rule.holds(result)


def main(names: list[str]) -> None:
    from autoplan.explain import summary
    for rule in RULES:
        if names and rule.name not in names:
            continue
        result, holds = check(rule)
        print(f"{'HOLDS ' if holds else 'BROKEN'} {rule.name}: {rule.statement}\n"
              f"       expected {rule.expect}; solver: {summary(result.plan)}, "
              f"{result.estimate.step_time_s:.2f} s/step, {result.estimate.peak_memory_gib:.0f} GiB")


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
