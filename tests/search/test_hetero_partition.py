"""The partition's CP-SAT model on node groups (``partition.best_split_on_groups``): on tables
worked by hand, and for every shape, switch setting and stage-to-group assignment of small
heterogeneous clusters against every composition of the blocks estimated with estimate()."""

import pytest

from autoplan.api import load_cluster
from autoplan.costmodels.problem import MIB, memory_mib
from autoplan.costmodels.step import estimate
from autoplan.problems import make_problem, training_spec
from autoplan.search.groups_space import (
    assignments, capacity, group_plan, group_shapes, shape_switches, stage_groups,
)
from autoplan.search.partition import (
    GroupStageCosts, PartitionModel, StageTable, best_split_on_groups, interchangeable_classes,
    read_problem,
)
from autoplan.search.space import balanced_stages, compositions, make_plan
from autoplan.training import Pins
from tests.search.test_hetero import blocks_on, custom_gpu, gpt, group

# --- the model on tables worked by hand ------------------------------------------------------


def linear_row(per_block: int, counts, after=lambda c: 0) -> dict:
    return {c: (per_block * c, after(c)) for c in counts}


def pool(rows, blocks: int, m: int) -> list[tuple[int, ...]]:
    """The model's window with no share and no rounding: the optimal splits alone."""
    return PartitionModel(StageTable(tuple(rows), blocks, m, 0.0, 0)).solve().pool


def test_a_faster_stage_gets_more_blocks():
    """Two stages, 4 blocks, m = 3, a block costs 10 on stage 0 and 20 on stage 1; objective
    (m - 1) T + S + E: (1, 3): T 60, S 10 + 60 = 70, 2*60 + 70 = 190; (2, 2): T 40, S 60, 140;
    (3, 1): T 30, S 50, 110. The fast stage takes 3."""
    assert pool([linear_row(10, range(1, 4)), linear_row(20, range(1, 4))], 4, 3) == [(3, 1)]


def test_memory_and_the_post_drain_term_move_the_split():
    """The same stages: stage 0 fitting at most 2 blocks leaves (1, 3) 190 and (2, 2) 140;
    with all counts fitting but stage 0's post-drain term 100 from 3 blocks on, (3, 1) costs
    110 + 100 = 210 against (2, 2)'s 140."""
    slow = linear_row(20, range(1, 4))
    assert pool([linear_row(10, range(1, 3)), slow], 4, 3) == [(2, 2)]
    heavy = linear_row(10, range(1, 4), after=lambda c: 100 if c >= 3 else 0)
    assert pool([heavy, slow], 4, 3) == [(2, 2)]


def test_stages_with_equal_rows_are_searched_once_and_every_order_is_returned():
    """Four stages, 6 blocks, m = 2 (objective T + S): the ends cost 30 a block, the two middle
    stages 10 (equal rows). The ends at 1 block each (T = 30; one more makes T 60) leave 4
    blocks to the middles with both at most 3 (T stays 30): (1, 1, 3, 1), (1, 2, 2, 1),
    (1, 3, 1, 1), each S = 30 + 40 + 30 = 100, objective 130. The symmetry constraint keeps
    the middles ascending; the answer lists the permutations too."""
    end, middle = linear_row(30, range(1, 4)), linear_row(10, range(1, 4))
    model = PartitionModel(StageTable((end, middle, middle, end), 6, 2, 0.0, 0))
    names = {c.name for c in model.model.proto.constraints}
    assert "symmetry_1_2" in names and "symmetry_0_3" in names
    assert model.solve().pool == [(1, 1, 3, 1), (1, 2, 2, 1), (1, 3, 1, 1)]


def test_middle_stages_that_fit_more_blocks_the_later_they_run_are_one_class():
    """Middle stages of one kind of GPU under 1F1B: equal times, and each holds fewer
    micro-batches in flight than the one before, so it fits no fewer blocks. Five stages, 11
    blocks, the ends fitting 1 block and the middles 2, 3 and 4 (10 a block): only (1, 2, 3,
    4, 1) adds up, so a symmetry that ordered the middles any other way than ascending would
    leave the model no split. A row whose time differs at a count both have, or whose
    interval ends lower, starts a class of its own."""
    end = linear_row(30, [1])
    middles = [linear_row(10, range(1, top + 1)) for top in (2, 3, 4)]
    rows = (end, *middles, end)
    assert interchangeable_classes(rows) == [[1, 2, 3]]
    assert pool(rows, 11, 2) == [(1, 2, 3, 4, 1)]
    slower = linear_row(11, range(1, 5))
    assert interchangeable_classes((middles[1], slower, middles[2])) == [[0, 2]]
    assert interchangeable_classes((middles[2], middles[1])) == []


def test_interleaving_weighs_the_slowest_rank_by_its_chunks():
    """Interleaved with v chunks a rank, the step is m T + (S - T) / v (costmodels.pipeline);
    the model minimizes v times it, (m v - 1) T + S + v E. Two ranks, 6 blocks, at least 2 a
    rank, m = 1, v = 2, a block 10 on rank 0 and 12 on rank 1: (4, 2) T 40 S 64, step 52;
    (3, 3) T 36 S 66, step 51; (2, 4) T 48 S 68, step 58. (3, 3) wins, where S alone (the
    1F1B weights at m = 1) would take (4, 2)."""
    rows = (linear_row(10, range(2, 5)), linear_row(12, range(2, 5)))
    interleaved = PartitionModel(StageTable(rows, 6, 1, 0.0, 0, vpp=2)).solve()
    assert interleaved.pool == [(3, 3)]
    assert interleaved.best == 2 * 51
    assert pool(rows, 6, 1) == [(4, 2)]


def test_permutations_put_back_keep_every_count_admissible():
    """12 blocks over the same ends and middles fitting 3, 4 and 4 blocks (ascending
    intervals): T + S is 30 + 100 + 30 = 160 for every split of 10 blocks over the middles,
    and T = 40 wherever one middle runs 4. The optimal middles are the orderings of
    {3, 3, 4}, {2, 4, 4} that fit: (3, 3, 4), (3, 4, 3); (2, 4, 4) only, as the first middle
    fits at most 3 blocks (4, 2, 4 and 4, 4, 2 do not fit)."""
    end = linear_row(30, [1])
    rows = (end, linear_row(10, range(1, 4)), linear_row(10, range(1, 5)),
            linear_row(10, range(1, 5)), end)
    assert pool(rows, 12, 2) == [(1, 2, 4, 4, 1), (1, 3, 3, 4, 1), (1, 3, 4, 3, 1)]


# --- the model on node groups against every composition ---------------------------------------


def fits(est) -> bool:
    """Every stage within its own group's limit, in whole MiB (as the brute force)."""
    return all(memory_mib(used * 2**30) <= int(limit * 2**30 // MIB)
               for used, limit in zip(est.stage_memory_gib, est.stage_memory_limit_gib))


def every_composition(problem, shape, sw, assignment):
    """(step, blocks) of the fastest composition that fits, the first of equal steps."""
    graph, training = problem.graph, problem.training
    found = []
    for blocks in compositions(len(graph.block_indices()), shape.pp):
        est = estimate(problem, group_plan(shape, sw, graph, blocks, assignment, training))
        if fits(est):
            found.append((est.step_time_s, blocks))
    return min(found, default=None)


def three_groups(limit_gib: float | None, runtime: str = "megatron", layers: int = 7):
    groups = [group("a", "h100-sxm5-80gb", 1, 2), group("b", "a100-sxm4-40gb", 1, 2),
              group("c", "v100-sxm2-32gb", 1, 4, "100Gbps")]
    training = training_spec(256, 16, "bf16", runtime, "flash")
    limit = None if limit_gib is None else limit_gib * 2**30
    return make_problem(gpt(layers, 128, 4), load_cluster({"groups": groups}), training,
                        mem_limit=limit)


# Stages of these plans hold 1.525-1.575 GiB (CUDA context, workspace, a few MiB of blocks):
# the tight limits exclude counts over a stage's limit, most on the first stages (most
# micro-batches in flight)
CASES = [(None, "megatron", 1), (1.545, "megatron", 0), (1.535, "megatron", 1),
         (None, "deepspeed", 1)]  # limit (GiB), runtime, ZeRO stage


@pytest.mark.parametrize("limit_gib,runtime,zero", CASES)
def test_split_on_groups_equals_every_composition(limit_gib, runtime, zero):
    problem = three_groups(limit_gib, runtime)
    graph, training, pins = problem.graph, problem.training, Pins(tp=1, mbs=2, zero=zero)
    checked = fitting = 0
    for shape in group_shapes(graph, problem.cluster, training, pins, every_dp=True):
        if shape.pp == 1 or shape.dp > 1:
            continue
        caps = capacity(problem.cluster, graph, shape.tp, shape.dp, pins)
        for assignment in assignments(caps, shape.pp):
            groups = stage_groups(assignment)
            for sw in shape_switches(shape, training, pins):
                plan = make_plan(shape, sw, balanced_stages(graph, shape.pp), training)
                expected = every_composition(problem, shape, sw, assignment)
                assert best_split_on_groups(problem, plan, groups) == expected, (
                    shape, sw, assignment)
                checked += 1
                fitting += expected is not None
    assert checked >= 40 and fitting  # pp 2 to 5 on up to three groups, some split fits


def test_five_stages_with_equal_middles_on_one_group():
    """pp = 5 with four stages on the V100 group: the middle ones (same group on both sides)
    have equal rows, so the symmetry constraint binds; still every composition's best."""
    problem = three_groups(1.58, layers=10)
    graph, training = problem.graph, problem.training
    pins = Pins(tp=1, dp=1, pp=5, mbs=2, zero=1, recompute="none")
    shape = next(s for s in group_shapes(graph, problem.cluster, training, pins))
    symmetric = 0
    for assignment in [(("a", 1), ("c", 4)), (("c", 4), ("b", 1))]:
        groups = stage_groups(assignment)
        for sw in shape_switches(shape, training, pins):
            plan = make_plan(shape, sw, balanced_stages(graph, 5), training)
            expected = every_composition(problem, shape, sw, assignment)
            assert best_split_on_groups(problem, plan, groups) == expected
            costs = GroupStageCosts(problem, plan, groups)
            symmetric += bool(costs.hint and interchangeable_classes(read_problem(costs).costs))
    assert symmetric


def test_one_fast_gpu_and_two_slow_stages():
    """Hand-worked: one GPU twice as fast (FLOP/s and HBM bandwidth) as each of two others,
    pp = 3 over 12 blocks of hidden 1024 at mbs 8 (the per-layer launch cost is small against
    a block). A block costs c on the fast GPU and 2c on a slow one, so the slowest stage
    max(b c, s1 2c, s2 2c) with b + s1 + s2 = 12 is least at b = 6, s1 = s2 = 3 (6c; any
    other split puts 7c or more on some stage), and with m = 32 the (m - 1) T term outweighs
    the sum (at most 12 * 2c = 24c against 31c a unit of T)."""
    fast = custom_gpu("fast-gpu", 400, "80GiB", "4000GB/s")
    slow = custom_gpu("slow-gpu", 200, "80GiB", "2000GB/s")
    cluster = {"groups": [group("fast", fast, 1, 1), group("slow", slow, 1, 2)]}
    problem = make_problem(gpt(12, 1024, 16, vocab=256), load_cluster(cluster),
                           training_spec(256, 256, "bf16", "megatron", "flash"))
    pins = Pins(pp=3, tp=1, dp=1, mbs=8, zero=0, recompute="none", sp=False, offload="none")
    shape = next(iter(group_shapes(problem.graph, problem.cluster, problem.training, pins)))
    sw = shape_switches(shape, problem.training, pins)[0]
    plan = make_plan(shape, sw, balanced_stages(problem.graph, 3), problem.training)
    for assignment, blocks in [((("fast", 1), ("slow", 2)), (6, 3, 3)),
                               ((("slow", 2), ("fast", 1)), (3, 3, 6))]:
        step, found = best_split_on_groups(problem, plan, stage_groups(assignment))
        assert found == blocks
        chosen = group_plan(shape, sw, problem.graph, found, assignment, problem.training)
        assert blocks_on(chosen, problem.graph) == {"fast": 6, "slow": 6}
