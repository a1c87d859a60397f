"""Trace time of very large models: a 175B GPT, a 1T GPT and Llama 3 405B.

Blocks after the first are replayed, so the time should not grow with depth; the goal is under
3 s each on a 2-core machine. Prints one line per model (wall time of ``trace_model`` alone,
the import of torch excluded).
"""

from __future__ import annotations

import time
import types

from autoplan.api import load_model
from autoplan.zoo import GPT, GPTConfig, Llama, LlamaConfig

MODELS = {
    # Listed first: the first trace in a process also pays torch's lazy imports (~1.5 s).
    "gpt-tiny": (lambda: GPT(GPTConfig(num_layers=2, hidden_size=64, num_heads=4)), 128),
    # Brown et al. 2020, Table 2.1.
    "gpt-175b": (lambda: GPT(GPTConfig(num_layers=96, hidden_size=12288, num_heads=96)), 2048),
    # Narayanan et al. 2021, Table 1 (1T row).
    "gpt-1t": (lambda: GPT(GPTConfig(num_layers=128, hidden_size=25600, num_heads=160)), 2048),
    # Llama 3 405B (Dubey et al. 2024, Table 3).
    "llama3-405b": (lambda: Llama(LlamaConfig(num_layers=126, hidden_size=16384, num_heads=128,
                                              num_kv_heads=8, ffn_hidden_size=53248,
                                              vocab_size=128256)), 8192),
}


def main() -> None:
    for name, (build, seq_len) in MODELS.items():
        module = types.ModuleType(name)
        module.build_model = build
        start = time.perf_counter()
        graph = load_model(module).trace(seq_len)
        elapsed = time.perf_counter() - start
        print(f"{name:12s} {graph.num_params / 1e9:8.1f}B params  {len(graph.block_indices()):4d} "
              f"blocks  seq {seq_len:5d}  traced in {elapsed:.2f} s")


if __name__ == "__main__":
    main()
