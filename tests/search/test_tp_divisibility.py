"""TP must split every layer evenly: heads, KV heads and the widths of column- and row-parallel
Linears (issue 14 item 5); the vocabulary-parallel head is padded instead (Megatron-LM)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autoplan import api
from autoplan.cli import app
from autoplan.errors import ConstraintError
from autoplan.search.space import shapes
from autoplan.training import Pins
from autoplan.problems import make_problem, training_spec

SIXTEEN = {"gpu": "a100-sxm4-80gb", "nodes": 2, "gpus_per_node": 8,
           "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"},
           "inter_node": {"link": "infiniband", "nics_per_node": 8, "bandwidth": "200Gbps"}}

MLP = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(256, 1024)
        self.down = nn.Linear(1024, 256)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def build_model():
    return nn.Sequential(*[Block() for _ in range(4)], nn.Linear(256, 256))


def example_inputs(batch_size, seq_len):
    return torch.zeros(batch_size, seq_len, 256)
'''


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = tmp_path_factory.mktemp("mlp") / "mlp.py"
    path.write_text(MLP)
    return path


def test_a_tp_that_does_not_split_the_linears_exits_2_naming_the_layer(mlp, tmp_path):
    """3 divides neither 1024 (up: column-parallel output) nor 256; the legal degrees are the
    divisors of gcd(1024, 256) = 256 up to the 16 GPUs: 1, 2, 4, 8, 16."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(json.dumps(SIXTEEN))  # JSON is YAML
    result = CliRunner().invoke(app, ["solve", str(mlp), str(cluster), "--seq-len", "64",
                                      "--global-batch", "16", "--tp", "3"])
    message = " ".join(result.output.split())
    assert result.exit_code == 2, message
    assert "--tp 3 does not divide layer 0: Linear 0.up (1024 output features, " \
           "column-parallel)" in message
    assert "TP degrees that split every layer of mlp: 1, 2, 4, 8, 16." in message


def test_the_search_never_proposes_a_tp_that_does_not_split_a_linear(tmp_path):
    """Linears 12 and 48 wide (gcd 12) on 8-GPU nodes: of the node's divisors 1, 2, 4, 8 the
    search takes 1, 2 and 4; 8 splits no 12-wide Linear."""
    path = tmp_path / "narrow.py"
    path.write_text(MLP.replace("256", "12").replace("1024", "48"))
    model = api.load_model(path)
    problem = make_problem(model, api.load_cluster(SIXTEEN),
                               training_spec(64, 16, "bf16", "megatron", "flash"))
    tps = {s.tp for s in shapes(problem.graph, world=16, gpus_per_node=8,
                                training=problem.training, pins=Pins())}
    assert tps == {1, 2, 4}


def test_estimate_of_a_plan_with_an_illegal_tp_is_refused(mlp):
    with pytest.raises(ConstraintError, match="--tp 3 does not divide"):
        api.estimate(mlp, SIXTEEN, {"tp": 3}, seq_len=64, global_batch=16)


def test_the_vocabulary_head_does_not_constrain_tp(tiny_vocab_gpt):
    """A vocabulary of 1000 (not a multiple of 8): Megatron pads it to 1024 at tp 8, so tp 8
    is legal when the heads and widths divide."""
    result = api.estimate(tiny_vocab_gpt, SIXTEEN, {"tp": 8}, seq_len=64, global_batch=16)
    assert result.plan.tp == 8


@pytest.fixture(scope="module")
def tiny_vocab_gpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt") / "gpt_vocab_1000.py"
    path.write_text("from autoplan.zoo.gpt import GPT, GPTConfig\n\n\ndef build_model():\n"
                    "    return GPT(GPTConfig(num_layers=2, hidden_size=128, num_heads=8, "
                    "vocab_size=1000, max_seq_len=64))\n")
    return path
