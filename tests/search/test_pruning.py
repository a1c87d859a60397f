"""The solver's exact pruning rests on three claims about estimate(); each is checked here by
enumerating the candidate space with estimate() itself."""

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.api import load_cluster
from autoplan.problems import make_problem, training_spec
from autoplan.costmodels.bounds import shape_lower_bound_s
from autoplan.costmodels.step import step_and_peak
from autoplan.search.space import (Shape, candidate_plans, family_of, leanest, leanest_members,
                                   max_chunk_blocks, switches)
from autoplan.plan import one_line
from autoplan.search.table import Table
from autoplan.training import Pins
from tests.search.moe_models import tiny_moe
from tests.search.test_solver import cluster, tiny_gpt

small = st.fixed_dictionaries({
    "layers": st.sampled_from([4, 6]),
    "width": st.sampled_from([(64, 4), (128, 8)]),
    "nodes": st.sampled_from([1, 2]),
    "gpus": st.sampled_from([2, 4, 8]),
    "batch": st.sampled_from([8, 16]),
    "runtime": st.sampled_from(["megatron", "deepspeed", "fsdp"]),
    "moe": st.booleans(),  # a Mixtral of 4 experts: ep among the searched degrees
})


def _problem(case):
    hidden, heads = case["width"]
    model = (tiny_moe(case["layers"], hidden, 4) if case.get("moe")
             else tiny_gpt(case["layers"], hidden, heads))
    training = training_spec(256, case["batch"], "bf16", case["runtime"], "flash")
    return make_problem(model, load_cluster(cluster(case["nodes"], case["gpus"], False)), training)


def _plans(problem):
    return candidate_plans(problem.graph, world=problem.cluster.num_gpus,
                           gpus_per_node=problem.cluster.gpus_per_node,
                           training=problem.training, pins=Pins())


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(small)
def test_no_plan_beats_its_shape_bound(case):
    problem = _problem(case)
    for plan in _plans(problem):
        bound = shape_lower_bound_s(problem, tp=plan.tp, pp=plan.pp, cp=plan.cp,
                                    mbs=plan.micro_batch_size, vpp=plan.vpp,
                                    num_microbatches=plan.num_microbatches,
                                    zero_bubble=plan.pipeline_schedule is not None)
        assert bound <= step_and_peak(problem, plan)[0] * (1 + 1e-12)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(small)
def test_leanest_switches_need_the_least_memory_of_their_zero_stage(case):
    problem = _problem(case)
    by_layout = defaultdict(dict)
    for plan in _plans(problem):
        layout = (plan.tp, plan.pp, plan.dp, plan.micro_batch_size, plan.vpp, plan.stages,
                  plan.zero_stage, plan.placement, plan.ep)
        by_layout[layout][(plan.recompute, plan.recompute_num_layers, plan.sequence_parallel,
                           plan.offload)] = step_and_peak(problem, plan)[1]
    for layout, peaks in by_layout.items():
        tp, pp, dp, mbs, vpp, stages, zero, placement, ep = layout
        shape = Shape(tp=tp, pp=pp, dp=dp, cp=1, mbs=mbs, vpp=vpp, placement=placement, ep=ep)
        options = [sw for sw in switches(shape, runtime=problem.training.runtime, pins=Pins(),
                                         blocks_per_chunk=max_chunk_blocks(problem.graph, stages))
                   if sw.zero == zero]
        lean = leanest(options)
        lean_peak = peaks[(lean.recompute, lean.recompute_num_layers, lean.sp, lean.offload)]
        assert lean_peak <= min(peaks.values())


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(small)
def test_more_data_parallelism_and_smaller_micro_batches_never_need_more_memory(case):
    """The claim of space.leanest_members: within a family (tp, pp, cp, vpp, ep), a stage
    layout and switches, no plan needs less memory than one of the family's leanest members
    (largest DP for the smallest micro-batch; placement aside)."""
    problem = _problem(case)
    plans = list(_plans(problem))
    peak = {id(plan): step_and_peak(problem, plan)[1] for plan in plans}
    shape_of = {id(p): Shape(p.tp, p.pp, p.dp, p.cp, p.micro_batch_size, p.vpp, p.placement,
                             p.ep) for p in plans}
    front = leanest_members(shape_of.values())
    least = defaultdict(lambda: float("inf"))  # (family, stages, switches) -> at the front
    for plan in plans:
        shape = shape_of[id(plan)]
        if shape in front[family_of(shape)]:
            key = (family_of(shape), plan.stages, plan.zero_stage, plan.recompute,
                   plan.recompute_num_layers, plan.sequence_parallel, plan.offload)
            least[key] = min(least[key], peak[id(plan)])
    assert plans
    for plan in plans:
        shape = shape_of[id(plan)]
        key = (family_of(shape), plan.stages, plan.zero_stage, plan.recompute,
               plan.recompute_num_layers, plan.sequence_parallel, plan.offload)
        assert least[key] <= peak[id(plan)] * (1 + 1e-12), one_line(plan)


def test_equal_blocks_share_one_cost_class():
    # 6 identical transformer blocks between the embedding and the head: one class, counted 6
    # times, whatever the module names that tell the blocks apart.
    problem = _problem({"layers": 6, "width": (64, 4), "nodes": 1, "gpus": 2, "batch": 8,
                        "runtime": "megatron"})
    counts = dict(problem.layer_counts(0, len(problem.graph.layers)))
    assert 6 in counts.values()
    assert len(counts) == len(problem.graph.layers) - 5


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(small)
def test_pruned_table_keeps_the_best_fitting_row_of_the_full_table(case):
    problem = _problem(case)
    full, pruned = Table.build(problem, Pins(), prune=False), Table.build(problem, Pins())
    if not full.eligible():
        assert not pruned.eligible()
        return
    best = min(full.eligible(), key=full.key)
    assert min(pruned.key(r) for r in pruned.eligible()) == full.key(best)
