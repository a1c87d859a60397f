"""What CP-SAT's choice of the stage split gains over the old menu (balanced, or the first/last
stage 1-2 blocks lighter for pp >= 3): the best plan's step time with each, on the example
models on a cluster of their scale, and on large-vocabulary cases (Llama-3-8B-like, 128,256-token
vocabulary, pp pinned to 2; Llama-3-70B-like, pp pinned to 8).

    .venv/bin/python benchmarks/partition_gain.py

Both columns are the same branch and bound over the same shapes and switches (``Table.build``
with ``choose_splits`` on and off) under the same cost model; only the splits differ.
"""

from __future__ import annotations

import time
import types
from pathlib import Path

import autoplan
from autoplan.api import load_cluster
from autoplan.problems import make_problem, training_spec
from autoplan.search.space import block_counts
from autoplan.search.table import Table
from autoplan.training import Pins
from autoplan.zoo import Llama, LlamaConfig, next_token_loss

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

CASES = [  # model file, cluster file, sequence, global batch, pins
    ("tiny_gpt.py", "dgx-a100-x1.yaml", 1024, 64, {}),
    ("gptj_6b.py", "dgx-a100-x16.yaml", 2048, 512, {}),
    ("llama2_7b.py", "dgx-a100-x16.yaml", 4096, 512, {}),
    ("gpt_13b.py", "dgx-a100-x16.yaml", 2048, 512, {}),
    ("llama2_70b.py", "dgx-a100-x16.yaml", 4096, 512, {}),
    ("gpt3_175b.py", "dgx-a100-x128.yaml", 2048, 1536, {}),
    ("bloom_176b.py", "dgx-a100-x128.yaml", 2048, 2048, {}),
    ("mtnlg_530b.py", "dgx-a100-x280.yaml", 2048, 1920, {}),
]

LLAMA3_8B = LlamaConfig(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                        ffn_hidden_size=14336, vocab_size=128256)
"""Llama 3 8B (Dubey et al. 2024, table 3): 32 layers, hidden 4096, 32 heads and 8 KV heads,
FFN 14336, vocabulary 128,256."""


LLAMA3_70B = LlamaConfig(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                         ffn_hidden_size=28672, vocab_size=128256)
"""Llama 3 70B (Dubey et al. 2024, table 3): 80 layers, hidden 8192, 64 heads and 8 KV heads,
FFN 28672, vocabulary 128,256: its head is about 1.2 blocks, and 80 blocks over 8 stages leave
the menu no lighter first or last stage (the rest never divides evenly over the middles)."""


def llama(config: LlamaConfig, name: str):
    module = types.ModuleType(name)
    module.build_model = lambda: Llama(config)
    module.loss = next_token_loss
    return autoplan.load_model(module)


def best(table: Table) -> int:
    return min(table.eligible(), key=table.order)


def compare(name: str, model, cluster_file: str, seq: int, batch: int, pins: dict) -> None:
    model.trace(seq)
    cluster = load_cluster(EXAMPLES / "clusters" / cluster_file)
    problem = make_problem(model, cluster, training_spec(seq, batch, "bf16", "megatron", "flash"))
    rows = {}
    for choose in (False, True):
        start = time.perf_counter()
        table = Table.build(problem, Pins(**pins), choose_splits=choose)
        row = best(table)
        rows[choose] = (table, row, time.perf_counter() - start)
    (old, r_old, s_old), (new, r_new, s_new) = rows[False], rows[True]
    plan_old, plan_new = old.plans[r_old], new.plans[r_new]
    gain = old.step_times_s[r_old] / new.step_times_s[r_new] - 1
    print(f"{name:28} {cluster_file:20} {old.step_times_s[r_old]:9.3f} "
          f"{new.step_times_s[r_new]:9.3f} {gain:7.2%}  "
          f"PP{plan_old.pp} {list(block_counts(problem.graph, plan_old.stages))} -> "
          f"PP{plan_new.pp} {list(block_counts(problem.graph, plan_new.stages))}"
          f"  ({s_old:.1f}s / {s_new:.1f}s)")


def main() -> None:
    print(f"{'model':28} {'cluster':20} {'menu s':>9} {'CP-SAT s':>9} {'gain':>7}  split "
          "(blocks per stage)  (table build: menu / CP-SAT)")
    for model_file, cluster_file, seq, batch, pins in CASES:
        compare(model_file, autoplan.load_model(EXAMPLES / "models" / model_file), cluster_file,
                seq, batch, pins)
    for tp in (1, 2):
        compare(f"llama3-8b-like pp2 tp{tp}", llama(LLAMA3_8B, "llama3_8b_like"),
                "dgx-a100-x1.yaml", 8192, 64, {"pp": 2, "tp": tp})
    compare("llama3-70b-like pp8 tp8", llama(LLAMA3_70B, "llama3_70b_like"),
            "dgx-a100-x16.yaml", 4096, 512, {"pp": 8, "tp": 8})


if __name__ == "__main__":
    main()
