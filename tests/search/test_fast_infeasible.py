"""An infeasible question on a large cluster is answered from the memory-leanest shapes of each
family, not by evaluating every candidate (issue 14 item 8: Llama 3 405B on 8,192 H100 ran six
minutes, then died in explain_conflict)."""

from __future__ import annotations

import pytest

from autoplan import api
from autoplan.errors import InfeasibleError
from autoplan.search.solver import Table
from autoplan.search.space import family_of, leanest_members, shapes
from autoplan.training import Pins
from tests.search.test_solver import tiny_gpt

BIG = {"preset": "dgx-h100", "nodes": 1024}  # 8,192 GPUs


@pytest.fixture(scope="module")
def problem():
    model = tiny_gpt(4, 64, 4)
    training = api._training(256, 2048, "bf16", "megatron", "flash")
    return api.make_problem(model, api.load_cluster(BIG), training, mem_limit=2**20)  # 1 MiB


def test_nothing_fitting_is_found_from_each_familys_leanest_shapes_only(problem):
    table = Table.build(problem, Pins(), every_dp=True)
    assert len(table) and not table.eligible()
    every = shapes(problem.graph, world=8192, gpus_per_node=8, training=problem.training,
                   pins=Pins(), every_dp=True)
    front = leanest_members(every)
    fronts = {(family, s.dp, s.mbs) for family, members in front.items() for s in members}
    for plan in table.plans:
        family = (plan.tp, plan.pp, plan.cp, plan.vpp, plan.ep)
        assert (family, plan.dp, plan.micro_batch_size) in fronts
    assert len(table) < len(every)  # far fewer rows than shapes, let alone plans


def test_pinned_degrees_that_do_not_fit_get_exit_3_naming_them(problem):
    """Pins like the issue's on 8,192 GPUs (TP 4 x PP 4 x DP 512, no recompute; the model has
    four blocks) under a 1 MiB limit: exit 3 saying nothing fits, no traceback."""
    pins = {"tp": 4, "pp": 4, "dp": 512, "recompute": "none"}
    with pytest.raises(InfeasibleError, match="nothing fits in"):
        api.solve(tiny_gpt(4, 64, 4), BIG, seq_len=256, global_batch=2048, pins=pins,
                  mem_limit=2**20)


def test_family_of_ignores_dp_mbs_and_placement(problem):
    shape = shapes(problem.graph, world=64, gpus_per_node=8, training=problem.training,
                   pins=Pins())[0]
    assert family_of(shape) == (shape.tp, shape.pp, shape.cp, shape.vpp, shape.ep)
