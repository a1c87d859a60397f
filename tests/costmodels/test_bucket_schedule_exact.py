"""The bucketed gradient-reduction schedule is worked out once per chunk and priced once per
bucket size; it must give, to the last bit, what the schedule gives bucket by bucket (the
definition below, written from the public helpers), since plans are compared byte for byte."""

import dataclasses

import pytest

from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.costmodels import comm
from autoplan.costmodels.memory import WEIGHT_BYTES
from autoplan.costmodels.placement import plan_links
from autoplan.costmodels.sync import (begun_at, bucket_sizes, dp_time, filled_at,
                                      gathered_ahead, grad_bucket_params, reduced_as_ready)
from autoplan.training import Pins


def bucket_by_bucket(problem, plan, groups, backward_s, forward_s) -> float:
    """Every bucket of every chunk and group listed, sorted by when it is ready, reduced in
    turn; the gathers likewise (sync.py's docstrings, one bucket at a time)."""
    runtime = problem.runtime
    grad_bytes = runtime.reduce_bytes or runtime.grad_bytes
    chunk_s, forward_chunk_s = backward_s / plan.vpp, forward_s / plan.vpp
    ready, reduce_s, needed, gather_s = [], [], [], []
    reduce = comm.all_reduce_time if plan.zero_stage == 0 else comm.reduce_scatter_time
    for chunk in range(plan.vpp):
        for trained, links in groups:
            if plan.zero_stage == 0 and runtime.ddp_bucket_bytes:
                sizes = bucket_sizes(trained / plan.vpp, runtime.ddp_bucket_bytes / grad_bytes,
                                     runtime.ddp_first_bucket_bytes / grad_bytes)
            else:
                sizes = bucket_sizes(trained / plan.vpp, grad_bucket_params(runtime, links.size))
            ready += filled_at(sizes, chunk * plan.pp * chunk_s, chunk_s)
            needed += begun_at(sizes[::-1], (plan.vpp - 1 - chunk) * plan.pp * forward_chunk_s,
                               forward_chunk_s)
            reduce_s += [reduce(grad_bytes * size, links) for size in sizes]
            if plan.zero_stage:
                gather_s += [comm.all_gather_time(WEIGHT_BYTES * size, links)
                             for size in sizes[::-1]]
    order = sorted(range(len(ready)), key=ready.__getitem__)
    exposed = reduced_as_ready([ready[i] for i in order], [reduce_s[i] for i in order],
                               ((plan.vpp - 1) * plan.pp + 1) * chunk_s)
    if gather_s and runtime.overlap_param_gather:
        order = sorted(range(len(needed)), key=needed.__getitem__)
        return exposed + gathered_ahead([needed[i] for i in order], [gather_s[i] for i in order])
    return exposed + sum(gather_s)


@pytest.fixture(scope="module")
def model_and_cluster(examples):
    return (load_model(examples / "models/tiny_gpt.py"),
            load_cluster(examples / "clusters/dgx-a100-x16.yaml"))


@pytest.mark.parametrize("runtime,zero,vpp", [
    ("megatron", 0, 1), ("megatron", 1, 2), ("megatron", 0, 2), ("fsdp", 0, 1),
    ("deepspeed", 1, 1), ("deepspeed", 2, 1)])
def test_schedule_matches_bucket_by_bucket_to_the_last_bit(model_and_cluster, runtime, zero, vpp):
    model, cluster = model_and_cluster
    problem = make_problem(model, cluster, training_spec(256, 64, "bf16", runtime, "flash"))
    if runtime == "deepspeed":  # ZeRO 1-2 bucketed as megatron-core does, to reach that path
        problem = dataclasses.replace(problem, runtime=dataclasses.replace(
            problem.runtime, overlap_grad_reduce=True, overlap_param_gather=zero == 1))
    plan = plan_from_pins(problem, Pins(tp=1, pp=2, dp=8, zero=zero, vpp=vpp))
    dp = plan_links(problem, plan)["dp"]
    expert_links = dataclasses.replace(dp, size=2)  # a smaller expert-data-parallel group
    m = plan.num_microbatches
    # Odd, fractional parameter counts (chunks of uneven size, a remainder bucket) and many
    # buckets of every size; with experts the two groups' buckets interleave in time.
    for params, experts in [(7.3e8 + 0.5, 0.0), (1.2345678e9 / 3, 0.0), (9.1e8, 2.6e8 + 1 / 3),
                            (3e7, 0.0)]:
        for backward_s, forward_s in [(0.61, 0.3), (0.0137, 0.0071), (2.5, 1.9)]:
            compute_s = m * (backward_s + forward_s)
            fast = dp_time(problem, plan, params, dp, backward_s=backward_s,
                           compute_s=compute_s,
                           experts=(experts, expert_links) if experts else None)
            groups = [(params - experts, dp)] + ([(experts, expert_links)] if experts else [])
            slow = bucket_by_bucket(problem, plan, groups, backward_s,
                                    compute_s / m - backward_s)
            assert fast.hex() == slow.hex(), (params, experts, backward_s)
