"""A plan's step time and worst rank turned into the reported Estimate (throughput, MFU,
memory breakdown)."""

from __future__ import annotations

from autoplan.costmodels.flops import hardware_flops_per_sample, model_flops_per_sample, recomputed_layers
from autoplan.costmodels.fp8 import best_gemm_peak
from autoplan.costmodels.problem import Problem, memo
from autoplan.costmodels.ranks import RankCost, outside_allocator_bytes

from autoplan.plan import Estimate, Plan
from autoplan.units import GIB


def summarize(problem: Problem, plan: Plan, *, step: float, worst: RankCost,
               memories: list[float], breakdown: dict[str, float]) -> Estimate:
    samples = plan.global_batch_size
    peak = best_gemm_peak(problem.cluster.gpu, problem.precision)  # MFU basis: FP8's under FP8
    flops_key = ("flops", plan.recompute, plan.recompute_num_layers,
                 plan.layout if plan.recompute_num_layers else None)
    if flops_key not in memo(problem):
        memo(problem)[flops_key] = (model_flops_per_sample(problem.graph),
                                     hardware_flops_per_sample(problem.graph, plan.recompute,
                                                               recomputed_layers(problem, plan)))
    model_flops, hardware_flops = memo(problem)[flops_key]
    model_tflops = model_flops * samples / (plan.world_size * step) / 1e12
    hw = hardware_flops * samples
    outside = outside_allocator_bytes(problem, plan)
    return Estimate(
        step_time_s=step,
        tokens_per_s=samples * problem.graph.seq_len / step,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hw / (plan.world_size * step) / 1e12,
        mfu=model_tflops * 1e12 / peak,
        peak_memory_gib=worst.memory / GIB,
        peak_allocated_gib=(worst.memory - outside - worst.reserved_excess) / GIB,
        peak_reserved_gib=(worst.memory - outside) / GIB,
        memory_limit_gib=problem.mem_limit_bytes / GIB,
        memory_breakdown_gib={
            "weights": worst.states.weights / GIB, "gradients": worst.states.gradients / GIB,
            "optimizer": worst.states.optimizer / GIB, "activations": worst.activations / GIB,
            "other": worst.other / GIB,
        },
        time_breakdown_s=breakdown,
        stage_memory_gib=tuple(m / GIB for m in memories),
        feasible=worst.memory <= problem.mem_limit_bytes,
    )
