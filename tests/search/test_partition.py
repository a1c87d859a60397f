"""CP-SAT's stage split (search.partition) against every composition of the blocks, enumerated
with the cost model itself: for one shape and switch setting, and for a whole solve with pp
pinned, where the head's weight makes uneven stages win."""

import itertools
import types

import pytest

from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.costmodels.problem import limit_mib, memory_mib
from autoplan.costmodels.step import step_and_peak
from autoplan.search.brute import brute_force
from autoplan.search import partition
from autoplan.search.partition import applies, near_optimal_splits
from autoplan.search.solve import solve_search, solve_table
from autoplan.search.space import (Shape, Switches, balanced_stages, block_counts, compositions,
                                   make_plan, max_chunk_blocks, stages_of_rank_totals, switches)
from autoplan.training import Objective, ObjectiveTerm, Pins
from autoplan.zoo import GPT, GPTConfig, next_token_loss
from tests.search.test_solver import cluster

_MODELS: dict = {}


def wide_vocab_gpt(layers: int, vocab: int, hidden: int = 128):
    """A small GPT whose head is worth several blocks (vocab x hidden against 12 hidden^2)."""
    key = (layers, vocab, hidden)
    if key not in _MODELS:
        module = types.ModuleType(f"wide_vocab_{layers}_{vocab}_{hidden}")
        config = GPTConfig(num_layers=layers, hidden_size=hidden, num_heads=4, vocab_size=vocab,
                           max_seq_len=256)
        module.build_model = lambda: GPT(config)
        module.loss = next_token_loss
        _MODELS[key] = load_model(module)
    return _MODELS[key]


def _problem(layers: int, vocab: int, gpus: int, batch: int, runtime: str, headroom_mib: float,
             hidden: int = 128):
    limit = 1.5 * 2**30 + headroom_mib * 2**20
    return make_problem(wide_vocab_gpt(layers, vocab, hidden),
                        load_cluster(cluster(1, gpus, False)),
                        training_spec(256, batch, "bf16", runtime, "flash"), mem_limit=limit)


def _order(problem, plan):
    """The table's order within one shape and switch setting: fits, whole µs, memory; the
    enumeration order (lexicographic counts) breaks what is left."""
    step_s, peak = step_and_peak(problem, plan)
    return memory_mib(peak) > limit_mib(problem), round(step_s * 1e6), peak


CASES = [  # layers, vocab, pp, batch, runtime, memory above the CUDA context (MiB), vpp
    (6, 8192, 2, 8, "megatron", 4096),
    (6, 32768, 2, 16, "megatron", 4096),
    (8, 32768, 3, 12, "megatron", 4096),
    (8, 32768, 4, 16, "deepspeed", 4096),
    (6, 32768, 3, 12, "megatron", 140),  # tight: the first stage holds most micro-batches
    (8, 16384, 4, 8, "fsdp", 121),
    (10, 16384, 6, 12, "megatron", 4096),  # deep: the middle stages are interchangeable
    (12, 8192, 6, 24, "megatron", 40),  # ... and fit fewer blocks the earlier they run
    (11, 32768, 8, 16, "deepspeed", 4096),
    (8, 32768, 2, 8, "megatron", 4096, 2),  # interleaved: each rank's blocks over its chunks
    (12, 32768, 3, 12, "megatron", 4096, 2),
    (12, 8192, 4, 16, "megatron", 90, 2),  # tight
    (9, 16384, 3, 12, "fsdp", 4096, 3),
]


@pytest.mark.parametrize("case", CASES)
def test_cp_sat_split_equals_every_composition(case):
    """Every split of the blocks over the ranks (each rank's spread over its chunks where
    interleaved), priced one by one, against the model's near-optimal splits."""
    layers, vocab, pp, batch, runtime, headroom, vpp = (*case, 1)[:7]
    problem = _problem(layers, vocab, 8, batch, runtime, headroom)
    graph, training = problem.graph, problem.training
    shape = Shape(tp=1, pp=pp, dp=1, cp=1, mbs=1, vpp=vpp)
    assert applies(problem, pp, vpp)
    balanced = balanced_stages(graph, pp, vpp)
    checked = 0
    for sw in switches(shape, runtime=training.runtime, pins=Pins(),
                       blocks_per_chunk=max_chunk_blocks(graph, balanced)):
        plans = [make_plan(shape, sw, stages_of_rank_totals(graph, totals, vpp), training)
                 for totals in compositions(layers, pp) if min(totals) >= vpp]
        best = min(plans, key=lambda plan: _order(problem, plan))  # first of equals: lexicographic
        splits = near_optimal_splits(problem, make_plan(shape, sw, balanced, training))
        if _order(problem, best)[0]:  # nothing fits
            assert splits == []
            continue
        chosen = min((make_plan(shape, sw, stages, training) for stages in splits),
                     key=lambda plan: _order(problem, plan))
        assert _order(problem, chosen) == _order(problem, best)
        assert chosen.stages == best.stages
        checked += 1
    assert checked  # some switch setting fits


def test_a_heavy_head_moves_blocks_to_the_first_stage():
    """pp pinned to 2 on a model whose head is worth blocks: brute force over every split and
    the search agree, and the split is uneven (the old menu had only the balanced one)."""
    # hidden 1024, vocabulary 65536: the head holds 64M weights, 5.3 blocks' 12M each
    problem = _problem(8, 65536, 2, 16, "megatron", 30000, hidden=1024)
    pins = Pins(pp=2, tp=1, dp=1, vpp=1)  # two stages (interleaving pp 2 is searched too)
    reference = brute_force(problem, pins)
    plan, estimate, info = solve_table(problem, pins, time_limit_s=30)
    assert info.status == "OPTIMAL"
    assert plan == reference[0]
    first, last = block_counts(problem.graph, plan.stages)
    assert first > last
    balanced = make_plan(Shape(1, 2, 1, 1, plan.micro_batch_size, 1), _switches_of(plan),
                         balanced_stages(problem.graph, 2), problem.training)
    assert estimate.step_time_s < step_and_peak(problem, balanced)[0]


def _switches_of(plan):
    return Switches(plan.zero_stage, plan.recompute, plan.sequence_parallel, plan.offload,
                    plan.recompute_num_layers)


@pytest.mark.parametrize("gpus,every_dp", [(4, False), (8, True)])
def test_solve_equals_brute_force_over_every_split(gpus, every_dp):
    """The whole search (shapes, splits, switches) against brute force over every composition,
    with every DP degree where asked (``every_dp``: fewer GPUs, deeper pipelines)."""
    problem = _problem(6, 32768, gpus, 16, "megatron", 4096)
    objective = Objective(terms=(ObjectiveTerm.GPUS, ObjectiveTerm.TIME)) if every_dp else None
    reference = brute_force(problem, Pins(), objective=objective)
    solution = solve_search(problem, Pins(), time_limit_s=60, objective=objective)
    assert solution.info.status == "OPTIMAL"
    assert solution.plan == reference[0]


def test_a_split_cut_short_by_the_deterministic_limit_is_reported_unproven(monkeypatch):
    """With CP-SAT's deterministic limit at zero no split is proven optimal: the search still
    answers (the greedy hint or the best split found) but says FEASIBLE, with a bound at most
    its objective; at the normal limit the same search proves its answer OPTIMAL."""
    problem = _problem(8, 65536, 2, 16, "megatron", 30000, hidden=1024)
    pins = Pins(pp=2, tp=1, dp=1, vpp=1)  # two stages (interleaving pp 2 is searched too)
    assert solve_table(problem, pins, time_limit_s=30)[2].status == "OPTIMAL"
    monkeypatch.setattr(partition, "DETERMINISTIC_LIMIT", 0.0)
    _, estimate, info = solve_table(problem, pins, time_limit_s=30)
    assert info.status == "FEASIBLE"
    assert info.bound <= info.objective == estimate.step_time_s
    assert info.gap == pytest.approx((info.objective - info.bound) / info.objective)


def test_the_partition_model_states_its_floor_only_when_the_optimum_is_unproven(monkeypatch):
    """Hand-worked table: 2 stages, 4 blocks, m = 3, blocks cost 10 and 20 (optimum (3, 1),
    objective 110, see test_hetero_partition): proven, no floor; at a zero deterministic
    limit the answer carries a floor no greater than the optimum."""
    rows = tuple({c: (per * c, 0) for c in range(1, 4)} for per in (10, 20))
    proven = partition.PartitionModel(partition.StageTable(rows, 4, 3, 0.0, 0)).solve()
    assert (proven.best, proven.pool, proven.floor) == (110, [(3, 1)], None)
    monkeypatch.setattr(partition, "DETERMINISTIC_LIMIT", 0.0)
    model = partition.PartitionModel(partition.StageTable(rows, 4, 3, 0.0, 0))
    model.add_hint((2, 2))
    cut = model.solve((2, 2))
    assert cut.floor is not None and cut.floor <= 110


def test_the_largest_admissible_count_is_found_from_any_hint():
    """A stage's largest count that fits, searched outward from the balanced count, against
    the largest of every count tried one by one: every boundary, hint and bound on small
    ranges, with a block a chunk at least (``fewest``)."""
    for fewest, most, boundary, hint in itertools.product(range(1, 4), range(14), range(15),
                                                          range(-1, 16)):
        tried = []

        def fits(c, boundary=boundary, fewest=fewest, tried=tried):
            tried.append(c)
            return fewest <= c <= boundary

        expected = max((c for c in range(fewest, most + 1) if c <= boundary), default=0)
        assert partition._largest_from(fits, hint, most, fewest) == expected
        assert all(fewest <= c <= most for c in tried)  # never a count outside the range
