"""The published training runs of data/published_runs.csv (the repository's copy of the
project's shared reference data) as autoplan questions: for each row, the model (a GPT built
from the row's shape), the cluster (DGX A100 nodes as on Selene), the training settings and the
plan the authors ran. Shared by the accuracy benchmark and the tests that cite rows."""

from __future__ import annotations

import csv
import re
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from autoplan.zoo import GPT, GPTConfig, next_token_loss

DATA = Path(__file__).resolve().parents[1] / "data"
CSV = DATA / "published_runs.csv"


@dataclass(frozen=True)
class PublishedRun:
    row_id: str
    model: types.ModuleType
    cluster: dict
    seq_len: int
    global_batch: int
    pins: dict
    runtime: str
    precision: str
    step_time_s: float
    runtime_settings: dict
    source: str = "N21/K22"
    gpu: str = "a100-sxm4-80gb"
    attention: str = "explicit"


def _vpp(text: str) -> int:
    match = re.search(r"=> (\d+) chunks|(\d+) stages/chunks|m=(\d+)", text)
    return int(next(g for g in match.groups() if g)) if match else 1


ASYNC_TP_ALLREDUCE_YEAR = 2022
"""Megatron-LM overlaps the TP all-reduce of input gradients with the weight-gradient GEMM since
its asynchronous ColumnParallelLinear backward (late 2021): Korthikanti et al. 2022 ran with it
(their Table 4), the SC'21 runs of Narayanan et al. (arXiv 2104.04473, April 2021) without."""


OVERLAP_GRAD_REDUCE_YEAR = 2023
"""Megatron-LM reduces gradients bucket by bucket under the backward since its own DDP gained
--overlap-grad-reduce (2023, megatron-core's DistributedDataParallel); the runs before it
(Narayanan et al. 2021, Korthikanti et al. 2022) ran its default local DDP, which all-reduces
the gradients after the backward."""


TRANSFORMER_ENGINE_YEAR = 2023
"""Megatron-LM runs Transformer Engine's modules since ``--transformer-impl`` (2023, its
default later); the runs before it (Narayanan et al. 2021, Korthikanti et al. 2022) ran its
own: apex FusedLayerNorm, jit-fused bias-GeLU and bias-dropout-add (costmodels/fused_kernels.py,
``local``)."""


def _runtime_settings(row: dict, zero3: bool) -> dict:
    """What the row says of how its framework ran: the software of its year, and stated
    settings such as a DP gradient all-reduce not overlapped with backward."""
    settings = {}
    year = int(re.search(r"\b(20\d\d)\b", row["source"]).group(1))
    if not zero3 and year < ASYNC_TP_ALLREDUCE_YEAR:
        settings["tp_bwd_overlap"] = False
    if not zero3 and year < OVERLAP_GRAD_REDUCE_YEAR:
        settings["overlap_grad_reduce"] = False
    if not zero3 and year < TRANSFORMER_ENGINE_YEAR:
        settings["transformer_impl"] = "local"
    if "no overlap of DP gradient all-reduce" in row["notes"]:
        settings["dp_overlap"] = 0.0
    return settings


def _same_config_row(row: dict, rows: list[dict]) -> dict:
    """The row whose configuration a row says it shares ("config assumed same as Sec 6.3 row"),
    or the row itself."""
    match = re.search(r"config assumed same as (.+?) row", row["exactness"] + row["notes"])
    if not match:
        return row
    key = _squeezed(match.group(1))
    return next(r for r in rows if key in _squeezed(r["table_or_fig"]))


def _squeezed(text: str) -> str:
    return re.sub(r"[\s.]", "", text)


def _recompute(text: str) -> str:
    return "selective" if text.startswith("selective") else "full" if text.startswith("full") else "none"


@cache
def _gpt_module(layers: int, hidden: int, heads: int, vocab: int, seq: int,
                ffn: int | None = None, dropout: float = 0.1) -> types.ModuleType:
    module = types.ModuleType(f"gpt_{layers}x{hidden}")
    config = GPTConfig(num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=vocab,
                       max_seq_len=seq, ffn_hidden_size=ffn, dropout=dropout)
    module.build_model = lambda: GPT(config)
    module.loss = next_token_loss
    return module


def selene(num_gpus: int) -> dict:
    """DGX A100 nodes as on Selene: NVSwitch, 8x HDR 200 Gb/s per node (README 2.1)."""
    return {"name": f"selene-{num_gpus}", "gpu": "a100-sxm4-80gb", "nodes": num_gpus // 8,
            "gpus_per_node": 8, "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"},
            "inter_node": {"link": "infiniband", "nics_per_node": 8, "bandwidth": "200Gbps",
                           "latency": "5us"}}


def _run(row: dict, rows: list[dict]) -> PublishedRun:
    zero3 = row["zero_or_dist_opt"].startswith("ZeRO-3")
    layout = _same_config_row(row, rows)["VPP_or_layers_per_virtual_stage"]
    pins = {"tp": int(row["TP"]), "pp": int(row["PP"]), "dp": int(row["DP"]),
            "mbs": int(row["micro_batch"]), "vpp": _vpp(layout),
            "recompute": _recompute(row["recompute"]), "sp": row["sequence_parallel"] == "y",
            "zero": 3 if zero3 else 0}
    layers, seq = int(row["num_layers"]), int(row["seq_len"])
    return PublishedRun(
        row_id=row["row_id"],
        model=_gpt_module(layers, int(row["hidden"]), int(row["num_heads"]), int(row["vocab"]), seq),
        cluster=selene(int(row["num_gpus"])), seq_len=seq,
        global_batch=int(row["global_batch_seqs"]), pins=pins,
        runtime="deepspeed" if zero3 else "megatron",
        precision="fp16" if "fp16" in row["precision"] else "bf16",
        step_time_s=float(row["step_time_s"]), runtime_settings=_runtime_settings(row, zero3),
        source=row["row_id"].split("-")[0],
    )


def published_runs() -> list[PublishedRun]:
    """Every row with a full configuration and a step time (the Sec. 5.1 estimate has neither
    TP nor PP and is skipped)."""
    with CSV.open() as f:
        rows = list(csv.DictReader(f))
    return [_run(r, rows) for r in rows if r["TP"] and r["step_time_s"]]
