"""Read measured step time, throughput and peak memory out of training logs.

Megatron-LM (megatron/training/training.py ``training_log``) prints one line per logging
interval::

     [2025-08-01 07:19:50] iteration        2/    5000 | consumed samples:          256 | elapsed time per iteration (ms): 12936.1 | throughput per GPU (TFLOP/s/GPU): 118.7 | ...

and, once, a memory report per rank holding data-parallel rank 0
(megatron/training/utils.py ``report_memory``)::

    [Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max allocated: ... | reserved: ... | max reserved: 16334.0

Megatron-LM's TensorBoard/W&B exports name the same number ``mem-max-reserved-bytes``
(torch.cuda.memory_stats()["reserved_bytes.all.peak"]); a ``mem-max-reserved-bytes: N`` line is
read as well. Megatron-Bridge (megatron/bridge/training/utils/train_utils.py ``report_memory``)
prints that statistic converted to gigabytes of 1e9 bytes, renamed ``...-gigabytes``::

    [Rank 0] (after 10 iterations) memory (GB) | mem-allocated-gigabytes: 9.7876 | ... | mem-max-reserved-gigabytes: 18.254 | ...
 torchtitan (torchtitan/components/metrics.py ``MetricsProcessor.log``) prints::

    step: 10  loss:  7.8542  grad_norm:  1.2345  memory: 35.12GiB(44.37%)  tps: 6,321  tflops: 296.23  mfu: 29.95%

where ``tps`` is tokens per second per GPU (a data-parallel rank's tokens over the interval,
divided by the interval and by tp*pp*cp, its non-data-parallel size) and ``memory`` the rank's
max reserved GiB (torch.cuda.memory_stats()["reserved_bytes.all.peak"]).

The first logged interval holds start-up (compilation, allocator warm-up), so the step time is
the median of the later ones (the only one when there is one).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from autoplan.errors import PlanFileError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MEGATRON_ITERATION = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+)")
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.]+)")
_MEGATRON_BATCH = re.compile(r"global batch size:\s*([0-9]+)")
_MEGATRON_MAX_RESERVED_MB = re.compile(r"memory \(MB\).*\|\s*max reserved:\s*([0-9.]+)")
_MEGATRON_MAX_RESERVED_BYTES = re.compile(r"mem-max-reserved-bytes\W+([0-9.eE+]+)")
_BRIDGE_MAX_RESERVED_GB = re.compile(r"mem-max-reserved-gigabytes\W+([0-9.eE+]+)")
_TITAN_STEP = re.compile(r"step:\s*(\d+)\s.*\btps:\s*([0-9,]+)")
_TITAN_MEMORY = re.compile(r"\bmemory:\s*([0-9.]+)\s*GiB")
GIB = 2**30


@dataclass(frozen=True)
class LoggedRun:
    """What a training log measured."""

    framework: str
    step_time_s: float | None = None
    """Megatron: median elapsed time per iteration."""
    tokens_per_s_per_gpu: float | None = None
    """torchtitan: median tps."""
    tflops_per_gpu: float | None = None
    peak_memory_gib: float | None = None
    """Allocator-reserved peak of the most loaded GPU the log reports on."""
    global_batch: int | None = None
    intervals: int = 0


def _steady(values: list[float]) -> float:
    """Median of the logged intervals after the first (start-up), or the only one."""
    return statistics.median(values[1:] if len(values) > 1 else values)


def _megatron(lines: list[str]) -> LoggedRun:
    times, tflops, batches = [], [], []
    peaks = []
    for line in lines:
        if (match := _MEGATRON_ITERATION.search(line)) is not None:
            times.append(float(match.group(1)) / 1e3)
            if (flops := _MEGATRON_TFLOPS.search(line)) is not None:
                tflops.append(float(flops.group(1)))
            if (batch := _MEGATRON_BATCH.search(line)) is not None:
                batches.append(int(batch.group(1)))
        elif (match := _MEGATRON_MAX_RESERVED_MB.search(line)) is not None:
            peaks.append(float(match.group(1)) * 2**20 / GIB)
        elif (match := _MEGATRON_MAX_RESERVED_BYTES.search(line)) is not None:
            peaks.append(float(match.group(1)) / GIB)
        elif (match := _BRIDGE_MAX_RESERVED_GB.search(line)) is not None:
            peaks.append(float(match.group(1)) * 1e9 / GIB)
    return LoggedRun("megatron", step_time_s=_steady(times),
                     tflops_per_gpu=_steady(tflops) if tflops else None,
                     peak_memory_gib=max(peaks) if peaks else None,
                     global_batch=batches[-1] if batches else None, intervals=len(times))


def _torchtitan(lines: list[str]) -> LoggedRun:
    tps, peaks = [], []
    for line in lines:
        if (match := _TITAN_STEP.search(line)) is None:
            continue
        tps.append(float(match.group(2).replace(",", "")))
        if (memory := _TITAN_MEMORY.search(line)) is not None:
            peaks.append(float(memory.group(1)))
    return LoggedRun("torchtitan", tokens_per_s_per_gpu=_steady(tps),
                     peak_memory_gib=max(peaks) if peaks else None, intervals=len(tps))


def read_training_log(path: str | Path) -> LoggedRun:
    """The measurements of a Megatron-LM or torchtitan training log."""
    path = Path(path)
    try:
        lines = [_ANSI.sub("", line) for line in path.read_text(errors="replace").splitlines()]
    except OSError as err:
        raise PlanFileError(f"{path}: cannot be read ({err.strerror}).") from None
    if any(_MEGATRON_ITERATION.search(line) for line in lines):
        run = _megatron(lines)
        if run.step_time_s:
            return run
        raise PlanFileError(f"{path}: every Megatron-LM iteration line shows an elapsed time per "
                            "iteration of 0 ms; log iterations that trained (after the first) to "
                            "calibrate on.")
    if any(_TITAN_STEP.search(line) for line in lines):
        run = _torchtitan(lines)
        if run.tokens_per_s_per_gpu:
            return run
        raise PlanFileError(f"{path}: every torchtitan step line shows tps 0; log steps that "
                            "trained (after the first) to calibrate on.")
    raise PlanFileError(
        f"{path}: no Megatron-LM iteration line ('elapsed time per iteration (ms): ...') and no "
        "torchtitan step line ('step: N ... tps: ...'); give the training log's stdout.")
