"""The plan-on-cluster picture: every GPU labelled with its full coordinate (labels unique), every
pipeline stage shown however many nodes, a legend; checked on the layout and the figure objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan import api, plots
from autoplan.api import load_model
from autoplan.zoo import GPT, GPTConfig
from tests.graph.models import model_file
from tests.search.moe_models import tiny_moe

ROOT = Path(__file__).parents[1]
DGX128 = ROOT / "examples/clusters/dgx-a100-x128.yaml"
DGX16 = ROOT / "examples/clusters/dgx-a100-x16.yaml"
DGX1 = ROOT / "examples/clusters/dgx-a100-x1.yaml"
GPT32 = load_model(model_file("gpt32", lambda: GPT(GPTConfig(
    num_layers=32, hidden_size=64, num_heads=8, vocab_size=256, max_seq_len=256, dropout=0.0))))


@pytest.fixture(scope="module")
def gpt3_like():
    """Megatron's GPT-3 175B layout on 128 DGX A100: TP8 x PP16 x DP8 (a tiny 32-block GPT:
    the picture depends on the plan, not on the widths)."""
    return api.estimate(GPT32, DGX128, {"tp": 8, "pp": 16, "dp": 8}, seq_len=256, global_batch=64)


def _figure(monkeypatch, draw, result, tmp_path):
    kept = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.setdefault("fig", fig))
    draw(result, tmp_path / "p.png")
    return kept["fig"]


def test_a_large_cluster_shows_the_first_node_of_every_stage(gpt3_like):
    layout = plots.plan_layout(gpt3_like)
    # tp-cp-dp-pp: stage s holds ranks 64s .. 64s+63 (TP8 x DP8), i.e. nodes 8s .. 8s+7.
    assert layout.shown == tuple(8 * s for s in range(16))
    assert {box.coords["pp"] for box in layout.boxes} == set(range(16))
    assert len(layout.boxes) == 16 * 8
    assert "16 of 128 nodes" in layout.note and "each of the 16 pipeline stages" in layout.note
    # Node 8, GPU 3 is rank 67: TP rank 67 % 8 = 3, DP rank (67 // 8) % 8 = 0, stage 67 // 64 = 1.
    box = next(b for b in layout.boxes if b.node == 8 and b.gpu == 3)
    assert (box.rank, box.label) == (67, "rank 67\nS1 T3 D0")


def test_the_figure_has_a_legend_entry_per_stage_and_a_box_text_per_gpu(monkeypatch, tmp_path, gpt3_like):
    ax = _figure(monkeypatch, plots.plan_on_cluster, gpt3_like, tmp_path).axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [t.split(":")[0] for t in legend[:16]] == [f"stage {s}" for s in range(16)]
    assert legend[16] == "one TP group (8 GPUs)"
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == len(set(texts)) == 128
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"node {8 * s}" for s in range(16)]
    assert "first node of each of the 16 pipeline stages" in ax.get_title()


def test_context_parallel_ranks_of_one_node_are_told_apart():
    result = api.estimate(GPT32, DGX16, {"tp": 4, "cp": 2, "pp": 2, "dp": 8}, seq_len=256,
                          global_batch=64)
    layout = plots.plan_layout(result)
    assert len(layout.shown) == 16  # 128 GPUs: every node fits
    labels = [box.label for box in layout.boxes]
    assert len(labels) == len(set(labels)) == 128
    # Ranks 0 and 4 of node 0: both TP rank 0 of DP rank 0 and stage 0, CP ranks 0 and 1.
    assert labels[0] == "rank 0\nS0 T0 C0 D0" and labels[4] == "rank 4\nS0 T0 C1 D0"
    assert {box.coords["pp"] for box in layout.boxes} == {0, 1}


def test_expert_parallel_ranks_follow_megatron_core():
    result = api.estimate(tiny_moe(2, 64, 4), DGX1, {"tp": 1, "pp": 2, "dp": 4, "ep": 2},
                          seq_len=128, global_batch=8)
    labels = [box.label for box in plots.plan_layout(result).boxes]
    # EP rank = DP rank mod 2 (ep innermost over each stage's dp replicas, cp = 1).
    assert labels == [f"rank {r}\nS{r // 4} D{r % 4} E{r % 2}" for r in range(8)]


def test_with_interleaving_a_stage_lists_the_chunks_it_runs(monkeypatch, tmp_path):
    result = api.estimate(GPT32, DGX1, {"tp": 2, "pp": 2, "dp": 2, "vpp": 2}, seq_len=256,
                          global_batch=16)
    ax = _figure(monkeypatch, plots.plan_on_cluster, result, tmp_path).axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    # Megatron's interleaving: pipeline rank r runs chunks r and r + pp of the pp*vpp stages.
    ranges = [f"{st.first_layer}-{st.first_layer + st.num_layers - 1}" for st in result.plan.stages]
    assert legend[:2] == [f"stage 0: layers {ranges[0]}, {ranges[2]}",
                          f"stage 1: layers {ranges[1]}, {ranges[3]}"]
    assert "2 interleaved chunks" in ax.get_title()


def test_a_short_pipeline_on_many_nodes_shows_several_nodes_of_each_stage():
    result = api.estimate(GPT32, DGX128, {"tp": 8, "pp": 2, "dp": 64}, seq_len=256,
                          global_batch=128)
    layout = plots.plan_layout(result)
    # Stage 0 is nodes 0-63, stage 1 nodes 64-127; 16 rows give each stage its first 8 nodes.
    assert layout.shown == (*range(8), *range(64, 72))
    assert "the first 8 nodes of each of the 2 pipeline stages" in layout.note
