"""Out-of-sample checks of the deepspeed runtime as Megatron-DeepSpeed ran the two largest
dense models trained with it; neither run is in ../shared/data. Printed: published and
predicted step time per configuration and the error.

- MT-NLG 530B (Smith et al. 2022, arXiv 2201.11990, Table 2: 105 layers, hidden 20480, 128
  heads, sequence 2048, global batch 1920, micro-batch 1, TP 8 x PP 35 per replica on DGX A100
  nodes with 8 HDR 200 Gb/s NICs, bf16, activation checkpointing): 280, 350 and 420 nodes at
  126, 121 and 113 TFLOP/s per GPU, iterations of 60.1, 50.2 and 44.4 s.
- BLOOM 176B (BigScience train/tr11-176B-ml/tr11-176B-ml.slurm: 70 layers, hidden 14336, 112
  heads, vocabulary 250880, sequence 2048, global batch 2048, micro-batch 2, TP 4 x PP 12 x
  DP 8 on 48 Jean Zay A100 80GB nodes, bf16 with BF16_Optimizer at ZeRO stage 0, activation
  checkpointing): about 150 TFLOP/s per GPU by BigScience's formula
  ``N_B * 4 * 2 * s * GBS / (t * GPUs * 1e3)`` with N = 176.25 B, i.e. t = 102.7 s.
Megatron-DeepSpeed in 2021-22 ran explicit attention (Megatron's fused softmax, no flash
attention) with dropout 0.1.

The published MT-NLG times fit 12.7 s + 0.197 s per micro-batch: 6 s beyond the 1F1B fill
and drain ((p - 1) slots) that does not grow with the micro-batches. The last table prices
what DeepSpeed's PipelineEngine runs once per step (TrainSchedule's last step), from
DeepSpeed's source: it comes to about 0.5 s, the ZeRO-1 gradient all-reduce and parameter
all-gather nearly all of it, so the rest of the 6 s is not in that path.

    .venv/bin/python benchmarks/megatron_deepspeed_checks.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit import pose  # noqa: E402
from more_runs import JEAN_ZAY_A100, _cluster  # noqa: E402
from published_runs import PublishedRun, _gpt_module, selene  # noqa: E402

from autoplan.cluster.topology import group_links  # noqa: E402
from autoplan.costmodels import comm  # noqa: E402
from autoplan.costmodels.placement import axis_stride  # noqa: E402
from autoplan.costmodels.profiles import compute_profile, runtime_profile  # noqa: E402
from autoplan.costmodels.step import estimate  # noqa: E402

MTNLG_NODES_AND_SECONDS = ((280, 60.1), (350, 50.2), (420, 44.4))
BLOOM_SECONDS = 176.25 * 4 * 2 * 2048 * 2048 / (150 * 384 * 1e3)


def mtnlg_runs() -> list[PublishedRun]:
    model = _gpt_module(105, 20480, 128, 51200, 2048)  # GPT-2 BPE, padded to 128 x TP
    return [PublishedRun(
        row_id=f"MT-NLG-{nodes}", model=model, cluster=selene(8 * nodes), seq_len=2048,
        global_batch=1920, pins={"tp": 8, "pp": 35, "dp": nodes * 8 // 280, "mbs": 1, "vpp": 1,
                                 "recompute": "full", "sp": False, "zero": 1},
        runtime="deepspeed", precision="bf16", step_time_s=seconds,
        runtime_settings={"zero_grads_all_reduced": False},  # 2021's ZeRO-1: dist.reduce
        source="MTNLG") for nodes, seconds in MTNLG_NODES_AND_SECONDS]


def bloom_run() -> PublishedRun:
    bf16_optimizer = runtime_profile("deepspeed").bf16_optimizer_accumulation_bytes
    return PublishedRun(
        row_id="BLOOM-176B", model=_gpt_module(70, 14336, 112, 250880, 2048),
        cluster=_cluster("jean-zay-384", "a100-sxm4-80gb", 384, 8, JEAN_ZAY_A100),
        seq_len=2048, global_batch=2048,
        pins={"tp": 4, "pp": 12, "dp": 8, "mbs": 2, "vpp": 1, "recompute": "full", "sp": False,
              "zero": 1},  # BF16_Optimizer shards the optimizer states like ZeRO-1
        runtime="deepspeed", precision="bf16", step_time_s=BLOOM_SECONDS,
        runtime_settings={"grad_accumulation_bytes": bf16_optimizer, "launch_blocking": True},
        source="BLOOM")  # the launch script exports CUDA_LAUNCH_BLOCKING=1


BLOCKING_TFLOPS = (("BSPRQ-005", 512, 97.20, 91.04), ("BSPRQ-006", 512, 84.44, 84.59),
                   ("BSPRQ-006", 2048, 90.25, 90.29))
"""BigScience's own measurement of CUDA_LAUNCH_BLOCKING (chronicles-prequel.md, "dealing with
JZ hanging on the large model": the 200B model, TP 8 x PP 10, second iteration): (the row of
more_runs.csv with its shape and GPUs, global batch, TFLOP/s async, TFLOP/s blocking); BSPRQ-005
is 80 GPUs at DP 1, BSPRQ-006 160 GPUs at DP 2."""


def launch_blocking_check() -> None:
    """Each configuration of BLOCKING_TFLOPS predicted with and without launch_blocking: the
    step-time ratio against the measured one (TFLOP/s async over blocking)."""
    from dataclasses import replace

    from more_runs import more_runs

    posed = {run.row_id: run for run in more_runs()[0]}
    print("\nCUDA_LAUNCH_BLOCKING=1 against async launches (BigScience 200B, TP 8, PP 10), "
          "blocking step / async step:")
    for row_id, batch, async_tflops, blocking_tflops in BLOCKING_TFLOPS:
        runs = [replace(posed[row_id], global_batch=batch, row_id=f"{row_id}-{batch}-{on}",
                        runtime_settings={**posed[row_id].runtime_settings,
                                          "launch_blocking": on})
                for on in (False, True)]
        questions, _ = pose(runs)
        if len(questions) < 2:
            print(f"  {row_id} GBS {batch}: not posed")
            continue
        asynchronous, blocking = (estimate(q.problem, q.plan).step_time_s for q in questions)
        print(f"  {row_id} GBS {batch:>4}: measured {async_tflops / blocking_tflops:.3f}, "
              f"predicted {blocking / asynchronous:.3f} ({blocking - asynchronous:+.1f} s of "
              f"{asynchronous:.1f} s)")


def main() -> None:
    questions, refused = pose(mtnlg_runs() + [bloom_run()])
    print(f"{'run':12} {'GPUs':>5} {'published s':>11} {'predicted s':>11} {'error':>7}  breakdown")
    for q in questions:
        e = estimate(q.problem, q.plan)
        parts = " ".join(f"{k}={v:.1f}" for k, v in e.time_breakdown_s.items())
        gpus = q.plan.tp * q.plan.pp * q.plan.dp
        print(f"{q.run.row_id:12} {gpus:>5} {q.run.step_time_s:>11.1f} {e.step_time_s:>11.1f} "
              f"{e.step_time_s / q.run.step_time_s - 1:>+7.1%}  {parts}")
    for run, why in refused:
        print(f"{run.row_id:12} refused: {why}")
    mtnlg = [(q.plan.num_microbatches, q.run.step_time_s, estimate(q.problem, q.plan).step_time_s)
             for q in questions if q.run.source == "MTNLG"]
    if len(mtnlg) >= 2:
        print("\nMT-NLG step = fixed + per micro-batch x m (least squares over the three runs):")
        for label, column in (("published", 1), ("predicted", 2)):
            per_mb, fixed = _line([(row[0], row[column]) for row in mtnlg])
            print(f"  {label}: {fixed:5.1f} s + {per_mb:.3f} s x m   ((p - 1) = 34 slots of it: "
                  f"{34 * per_mb:4.1f} s)")
    print("\nWhat DeepSpeed's PipelineEngine runs once per step, after the last micro-batch "
          "(TrainSchedule's last step: ReduceTiedGrads, ReduceGrads, OptimizerStep), seconds:")
    for q in questions:
        print(f"  {q.run.row_id:12} " + "  ".join(f"{k} {v:.3f}" for k, v in _once_per_step(q)))
    launch_blocking_check()


def _once_per_step(q) -> list[tuple[str, float]]:
    """The per-step work on the pipeline's first stage (the last to finish its backward), each
    priced from what DeepSpeed 0.19.8 calls: the tied embedding's gradient all-reduced between
    the first and last stage (pipe/engine.py _exec_reduce_tied_grads: dist.all_reduce of
    weight.grad, 16-bit under ZeRO-1), the ZeRO-1 reduction and all-gather (the estimate's
    dp_comm), the gradient norm's fp64 copy of the rank's gradient partition (stage_1_and_2.py
    get_grad_norm_direct: read 2, write 8, read 8 bytes) and the optimizer step (the
    estimate's optimizer term)."""
    problem, plan = q.problem, q.plan
    e = estimate(problem, plan)
    runtime = problem.runtime
    tied = sum(layer.tied_params for layer in problem.graph.layers) / plan.tp
    ends = group_links(problem.cluster, 2, axis_stride(plan, "pp") * (plan.pp - 1))
    tied_s = comm.all_reduce_time(runtime.grad_bytes * tied, ends) if plan.pp > 1 else 0.0
    gpu = problem.cluster.gpu
    hbm = gpu.memory_bandwidth_Bps * compute_profile(gpu.name).memory_efficiency
    first = plan.stages[0]
    layers = problem.graph.layers[first.first_layer:first.first_layer + first.num_layers]
    partition = sum(layer.num_params for layer in layers) / plan.tp / (plan.dp * plan.cp)
    norm_s = partition * (2 + runtime.grad_norm_bytes * 2) / hbm
    return [("tied all-reduce", tied_s), ("dp reduce + gather", e.time_breakdown_s["dp_comm"]),
            ("grad norm", norm_s), ("optimizer", e.time_breakdown_s["optimizer"])]


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through ``points``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    slope = (sum((x - mx) * (y - my) for x, y in points)
             / sum((x - mx) ** 2 for x, _ in points))
    return slope, my - slope * mx


if __name__ == "__main__":
    main()
