"""How benchmarks/h100_public.py turns its public H100 rows into measured step times and
plans (the rows: benchmarks/data/h100_public_runs.csv, each with its source)."""

import csv

import pytest
from h100_public import CSV, measured_step_s, megatron_flops_per_sequence, public_runs


def _rows():
    with CSV.open() as f:
        return {r["row_id"]: r for r in csv.DictReader(f)}


def test_megatron_readme_tflops_become_a_step_time_by_megatrons_own_counter():
    # MLM-1.7B: 24 layers, hidden 2048, MHA, ffn 8192, vocab 131072, seq 4096; Megatron-LM's
    # num_floating_point_operations: 12 s l h^2 ((1 + 1 + s/h) + ffn/h + V/(2 l h))
    # = 12 * 4096 * 24 * 2048^2 * (4 + 4 + 131072/98304) = 4.9478e12 * 9.3333 = 4.6180e13
    # per sequence; 192 sequences on 48 GPUs at 408.8 TFLOP/s each: 8.8665e15 / 1.9622e16.
    row = _rows()["MLM-1.7B"]
    assert megatron_flops_per_sequence(row) == pytest.approx(4.6180e13, rel=1e-4)
    assert measured_step_s(row) == pytest.approx(0.45185, rel=1e-4)


def test_dgx_cloud_rows_keep_the_published_step_time_and_the_recipes_accumulation():
    # llama3.1/README_70b.md: "TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64", 64x H100, GBS 128,
    # 14.72 s per step; nemotron/README_15b.md: "TP=4, PP=1, MBS=4, GA=4", 16x H100, GBS 64.
    rows = _rows()
    runs = {r.row_id: r for r in public_runs()}
    for row_id, ga in (("DGXC-L31-70B-64", 64), ("DGXC-N4-15B-16", 4)):
        pins, row = runs[row_id].pins, rows[row_id]
        assert pins["dp"] * pins["mbs"] * ga == int(row["global_batch"])
        assert pins["tp"] * pins["pp"] * pins["cp"] * pins["dp"] == int(row["gpus"])
    assert runs["DGXC-L31-70B-64"].step_time_s == 14.72
