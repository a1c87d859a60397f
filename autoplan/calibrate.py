"""``autoplan calibrate``: measure this machine and fit a compute profile to it.

The catalog profiles (costmodels/profiles.yaml) are fits to published runs; a measured profile
replaces the compute part of them for one machine (``solve``/``estimate --profile FILE``).
Three things are measured with torch: GEMM throughput over a set of (m, n, k) shapes, memory
bandwidth (a large device-to-device copy) and, when several GPUs are visible, the all-reduce bus
bandwidth (recorded, not used by the compute model). The fit is the compute model's own curve
(compute.py): a GEMM of f FLOPs takes

    t(f) = f / (peak * eff * f / (f + half)) = (f + half) / (peak * eff)

which is linear in f, so ``eff`` and ``half`` come from a least-squares line through the
points weighted by 1/t (least squares in relative error, as the accuracy benchmark scores).

Profile YAML schema (``schema: 1``; every number in SI units, unknown keys are an error)::

    schema: 1
    device: cuda                  # or cpu
    device_name: NVIDIA H100 80GB HBM3
    gpu: h100-sxm5-80gb           # catalog GPU whose peak and bandwidth are the reference;
                                  # null on CPU: the reference is what was measured
    dtype: bf16                   # bf16, or fp32 where bf16 matmul is missing or slow (CPU)
    peak_flops: 9.89e+14          # catalog dense peak for dtype, or the best measured (CPU)
    reference_memory_bandwidth_Bps: 3.35e+12   # catalog HBM bandwidth, or measured (CPU)
    gemm:                         # one entry per shape; seconds is the best of the repeats
      - {m: 4096, n: 4096, k: 4096, seconds: 2.1e-4}
    memory: {bytes: 4.0e+9, seconds: 1.6e-3}   # bytes read + written by one copy
    all_reduce:                   # only with several GPUs; null otherwise
      {num_gpus: 8, bytes: 1.0e+9, seconds: 6.0e-3}   # bus bandwidth 2(n-1)/n * bytes / s
    fitted:                       # what load_profile() derives; written for people to read
      {gemm_efficiency: 0.71, gemm_half_flops: 5.8e+9, memory_efficiency: 0.86}

``load_profile`` refits from the measured points (``fitted`` is informational) and takes the
kernels not measured here (attention, bmm, kernel overhead) from the catalog profile of ``gpu``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autoplan.cluster.catalog import get_gpu, gpu_names
from autoplan.costmodels.profiles import ComputeProfile, compute_profile
from autoplan.errors import AutoplanError, ConstraintError
from autoplan.run_profile import RunsProfile, is_runs_profile, runs_profile

logger = logging.getLogger(__name__)

SCHEMA = 1

GEMM_SHAPES = ((256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048),
               (4096, 4096, 4096), (8192, 8192, 8192), (2048, 8192, 2048), (8192, 2048, 8192))
"""Small to large GEMMs: the small ones set ``gemm_half_flops``, the large ones the plateau."""

QUICK_GEMM_SHAPES = ((16, 16, 16), (32, 32, 32), (64, 64, 64), (128, 128, 128), (256, 256, 256))
"""--quick: tiny shapes that run in well under a second on one CPU core."""

COPY_BYTES, QUICK_COPY_BYTES = 2**31, 2**24
ALL_REDUCE_BYTES = 2**30
REPEATS, QUICK_REPEATS = 10, 10


class GemmPoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    seconds: float = Field(gt=0)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


class Transfer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    bytes: float = Field(gt=0)
    seconds: float = Field(gt=0)
    num_gpus: int | None = Field(default=None, ge=2)


class MeasuredProfile(BaseModel):
    """A profile YAML as written by ``autoplan calibrate`` (the schema above)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_: int = Field(SCHEMA, alias="schema")
    device: str
    device_name: str = ""
    gpu: str | None = None
    dtype: str
    peak_flops: float = Field(gt=0)
    reference_memory_bandwidth_Bps: float = Field(gt=0)
    gemm: tuple[GemmPoint, ...] = Field(min_length=2)
    memory: Transfer
    all_reduce: Transfer | None = None
    fitted: dict[str, float] | None = None


class ProfileError(AutoplanError):
    """A --profile file that is missing or does not follow the schema."""

    exit_code = 2


def fit_gemm(points: tuple[GemmPoint, ...] | list[GemmPoint], peak_flops: float) -> tuple[float, float]:
    """(gemm_efficiency, gemm_half_flops) of the compute model's curve through the points.

    Fits ``t = a f + b`` minimising the squared relative error of t, then ``eff = 1/(a peak)``
    and ``half = b/a``; a negative intercept (no measurable launch cost) becomes 0.
    """
    # Weighted normal equations with weights w = 1/t^2 (relative residuals (a f + b - t)/t).
    w = [1.0 / p.seconds**2 for p in points]
    f = [p.flops for p in points]
    t = [p.seconds for p in points]
    sw, swf, swff = sum(w), sum(wi * fi for wi, fi in zip(w, f)), sum(wi * fi * fi for wi, fi in zip(w, f))
    swt, swft = sum(wi * ti for wi, ti in zip(w, t)), sum(wi * fi * ti for wi, fi, ti in zip(w, f, t))
    det = sw * swff - swf * swf
    a = (sw * swft - swf * swt) / det if det > 0 else swft / swff
    b = (swff * swt - swf * swft) / det if det > 0 else 0.0
    if b < 0 or a <= 0:  # through the origin: efficiency only
        a, b = swft / swff, 0.0
    return 1.0 / (a * peak_flops), b / a


def fitted_profile(measured: MeasuredProfile) -> ComputeProfile:
    """The compute profile a measured profile stands for."""
    efficiency, half = fit_gemm(measured.gemm, measured.peak_flops)
    bandwidth = measured.memory.bytes / measured.memory.seconds
    base = compute_profile(measured.gpu or "default")
    return dataclasses.replace(
        base, gemm_efficiency=efficiency, gemm_half_flops=half,
        memory_efficiency=bandwidth / measured.reference_memory_bandwidth_Bps,
        source=f"[Measured] autoplan calibrate on {measured.device_name or measured.device} "
               f"({measured.dtype}); attention/bmm/overhead from the catalog profile")


def load_profile(path: str | Path) -> ComputeProfile | RunsProfile:
    """Read a profile YAML: a machine measurement (its compute profile is fitted here) or a
    calibration on measured runs (``calibrate --runs``, applied by costmodels.parameters)."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
        if is_runs_profile(document):
            return runs_profile(document, path)
        return fitted_profile(MeasuredProfile.model_validate(document))
    except (FileNotFoundError, IsADirectoryError):
        raise ProfileError(f"{path}: no such file; write one with `autoplan calibrate --out "
                           f"{path}`.") from None
    except (ValidationError, yaml.YAMLError, TypeError, ValueError) as err:
        first = str(err).splitlines()[0]
        raise ProfileError(f"{path}: not a calibration profile ({first}); see `autoplan "
                           "calibrate --help` for the schema.") from None


def write_profile(measured: MeasuredProfile, path: str | Path) -> Path:
    """Write the profile YAML with the fitted numbers filled in."""
    profile = fitted_profile(measured)
    fitted = {"gemm_efficiency": profile.gemm_efficiency,
              "gemm_half_flops": profile.gemm_half_flops,
              "memory_efficiency": profile.memory_efficiency}
    document = measured.model_copy(update={"fitted": fitted}).model_dump(
        mode="json", by_alias=True)
    path = Path(path)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# --- measuring (torch is imported here only) -------------------------------------------------


def _catalog_gpu(device_name: str) -> str | None:
    """The catalog GPU a CUDA device name stands for (``NVIDIA H100 80GB HBM3`` ->
    ``h100-sxm5-80gb``): same family (h100, a100, rtx-4090, ...), the memory size and form
    factor (pcie) breaking ties; None when no family matches."""
    words = device_name.lower().replace("geforce ", "").replace("rtx ", "rtx-")
    matches = [n for n in gpu_names() if n.split("-")[0] in words or n in words]

    def score(name: str) -> int:
        pcie_mismatch = ("pcie" in name) != ("pcie" in words)
        return sum(part in words for part in name.split("-")[1:]) - 2 * pcie_mismatch

    return max(matches, key=score) if matches else None


def _timed(fn, repeats: int, sync) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up call: noise (other processes, a
    busy host) only ever adds time, so the minimum is the machine's own speed."""
    fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return min(samples)


def _matmul_dtype(torch, device: str):
    """bf16 where matmul supports it at speed; fp32 on CPUs without fast bf16 GEMMs."""
    if device == "cuda":
        return torch.bfloat16, "bf16"
    a = torch.ones(256, 256)
    fp32 = _timed(lambda: a @ a, 3, lambda: None)
    try:
        b = a.to(torch.bfloat16)
        bf16 = _timed(lambda: b @ b, 3, lambda: None)
    except RuntimeError:
        return torch.float32, "fp32"
    return (torch.bfloat16, "bf16") if bf16 <= 2 * fp32 else (torch.float32, "fp32")


def measure(device: str = "cpu", *, quick: bool = False) -> MeasuredProfile:
    """Measure GEMMs, memory bandwidth and (several GPUs) all-reduce on this machine."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ProfileError("--device cuda: no CUDA GPU is visible; use --device cpu.")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dtype, dtype_name = _matmul_dtype(torch, device)
    repeats = QUICK_REPEATS if quick else REPEATS
    points = []
    for m, n, k in QUICK_GEMM_SHAPES if quick else GEMM_SHAPES:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        points.append(GemmPoint(m=m, n=n, k=k, seconds=_timed(lambda a=a, b=b: a @ b, repeats, sync)))
    size = QUICK_COPY_BYTES if quick else COPY_BYTES
    src = torch.empty(size // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy = Transfer(bytes=float(size), seconds=_timed(lambda: dst.copy_(src), repeats, sync))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    gpu = _catalog_gpu(name) if device == "cuda" else None
    if device == "cuda" and gpu is None:
        logger.warning("%s is not in the GPU catalog: its measured peak stands for it", name)
    peak = get_gpu(gpu).peak_flops(dtype_name) if gpu else max(p.flops / p.seconds for p in points)
    bandwidth = get_gpu(gpu).memory_bandwidth_Bps if gpu else copy.bytes / copy.seconds
    all_reduce = _all_reduce(torch) if device == "cuda" and torch.cuda.device_count() > 1 else None
    return MeasuredProfile(schema=SCHEMA, device=device, device_name=name, gpu=gpu,
                           dtype=dtype_name, peak_flops=peak,
                           reference_memory_bandwidth_Bps=bandwidth, gemm=tuple(points),
                           memory=copy, all_reduce=all_reduce)


def _all_reduce(torch) -> Transfer:
    """NCCL all-reduce of ALL_REDUCE_BYTES over every visible GPU (one process each)."""
    import tempfile

    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "seconds"
        mp.spawn(_all_reduce_worker, args=(world, folder), nprocs=world, join=True)
        seconds = float(result.read_text())
    return Transfer(bytes=float(ALL_REDUCE_BYTES), seconds=seconds, num_gpus=world)


def _all_reduce_worker(rank: int, world: int, folder: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{folder}/store", rank=rank,
                            world_size=world)
    buffer = torch.empty(ALL_REDUCE_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    seconds = _timed(lambda: dist.all_reduce(buffer), 5, torch.cuda.synchronize)
    if rank == 0:
        Path(folder, "seconds").write_text(repr(seconds))
    dist.destroy_process_group()


def bus_bandwidth_Bps(all_reduce: Transfer) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: 2 (n - 1) / n of the bytes per second."""
    n = all_reduce.num_gpus or 2
    return 2 * (n - 1) / n * all_reduce.bytes / all_reduce.seconds


def calibrate_machine(out: str | Path, *, device: str | None = None, quick: bool = False
                      ) -> tuple[MeasuredProfile, ComputeProfile]:
    """Measure this machine, write the profile YAML to ``out`` and return it with the compute
    profile fitted from it. ``device`` None: cuda when a GPU is visible, else cpu."""
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ConstraintError(f"--device {device!r}: use cpu or cuda.")
    measured = measure(device, quick=quick)
    write_profile(measured, out)
    return measured, fitted_profile(measured)
