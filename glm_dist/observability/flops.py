"""Model FLOPs utilisation: achieved model FLOP/s over the hardware's peak.

The peak a run is scored against (:func:`mfu_peak`) is, in this order: ``GLM_PEAK_TFLOPS`` (TFLOP/s
per device, for hardware the table lacks or a clock you know better); the datasheet figure of a
known CUDA device for the run's precision (:func:`peak_flops`); else the best matmul rate measured on
the run's own device (:func:`measure_matmul_peak`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch


@dataclass(frozen=True)
class Peak:
    """Dense (no 2:4 sparsity) datasheet TFLOP/s: bf16 on the tensor cores (fp32 accumulate), TF32
    on the tensor cores, and plain fp32 (CUDA cores)."""

    bf16: float
    tf32: float
    fp32: float


# Keyed by torch.cuda.get_device_name() exactly: a substring match gave the H100 PCIe (756) and NVL
# cards the SXM figure (989) and the L40/L40S the L4's. NVIDIA's datasheets print tensor-core
# figures "with sparsity"; the dense ones here are half of those.
DATASHEET_TFLOPS: dict[str, Peak] = {
    # Hopper
    "NVIDIA H100 80GB HBM3": Peak(989.4, 494.7, 66.9),  # SXM5
    "NVIDIA H100 PCIe": Peak(756.0, 378.0, 51.2),
    "NVIDIA H100 NVL": Peak(835.5, 417.5, 60.0),  # per GPU (the 2023 datasheet printed a pair of cards)
    "NVIDIA H200": Peak(989.4, 494.7, 66.9),  # SXM: the H100 SXM's chip with more HBM
    "NVIDIA H200 NVL": Peak(835.5, 417.5, 60.0),
    "NVIDIA GH200 480GB": Peak(989.4, 494.7, 66.9),
    # Blackwell (HGX B200, per GPU)
    "NVIDIA B200": Peak(2250.0, 1125.0, 75.0),
    # Ampere: SXM and PCIe, 40 and 80 GB, share one compute figure
    "NVIDIA A100-SXM4-40GB": Peak(312.0, 156.0, 19.5),
    "NVIDIA A100-SXM4-80GB": Peak(312.0, 156.0, 19.5),
    "NVIDIA A100-PCIE-40GB": Peak(312.0, 156.0, 19.5),
    "NVIDIA A100 80GB PCIe": Peak(312.0, 156.0, 19.5),
    "NVIDIA A10G": Peak(125.0, 62.5, 31.2),  # AWS's part; NVIDIA publishes the A10's datasheet, these figures
    # Ada
    "NVIDIA L4": Peak(121.0, 60.0, 30.3),
    "NVIDIA L40S": Peak(362.05, 183.0, 91.6),
    "NVIDIA L40": Peak(181.05, 90.5, 90.5),
    "NVIDIA GeForce RTX 4090": Peak(165.2, 82.6, 82.6),  # bf16 with fp32 accumulate (330 is fp16 accumulate)
}

PRECISIONS = ("fp32", "bf16", "bf16-autocast")  # train.precision ("auto" resolves to fp32 or bf16 when a config loads)


def matmul_dtype(precision: str) -> torch.dtype:
    """The dtype a run's matmuls compute in at ``precision`` (train.precision)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    return torch.float32 if precision == "fp32" else torch.bfloat16


def peak_flops(device_name: str, precision: str, *, tf32: bool = False) -> float | None:
    """Datasheet FLOP/s of the CUDA device ``device_name`` (``torch.cuda.get_device_name()``) for a run
    at ``precision``: bf16 and bf16-autocast -> the bf16 tensor-core peak; fp32 -> the TF32 tensor-core
    peak when ``tf32`` (this process lets fp32 matmuls run as TF32:
    ``torch.backends.cuda.matmul.allow_tf32``), else the plain fp32 peak, since that is the rate an fp32
    matmul can reach. None for a device not in :data:`DATASHEET_TFLOPS`."""
    dtype = matmul_dtype(precision)
    peak = DATASHEET_TFLOPS.get(device_name)
    if peak is None:
        return None
    tflops = peak.bf16 if dtype == torch.bfloat16 else peak.tf32 if tf32 else peak.fp32
    return tflops * 1e12


class MatmulPeak(NamedTuple):
    flops: float  # the best FLOP/s over every size and repeat
    size: int  # n of the n x n x n product that reached it


# Sizes that reach each kind of device's peak in a fraction of a second: a CPU core is saturated by
# a 1-2k matmul, a GPU needs 4-8k to fill its SMs.
DEFAULT_SIZES = {"cpu": (512, 1024, 2048), "cuda": (2048, 4096, 8192)}


def measure_matmul_peak(
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    sizes: Sequence[int] | None = None,
    repeats: int = 3,
    budget_s: float = 2.0,
) -> MatmulPeak:
    """The best FLOP/s of n x n x n matmuls on ``device`` over ``sizes`` (default: per device type,
    :data:`DEFAULT_SIZES`) and ``repeats`` timed products of each, after one warm-up product per size.
    A larger size is skipped once the rate so far says it would end past ``budget_s`` seconds: on a CPU
    that emulates bf16 (no AMX or AVX512-BF16: ~2 GFLOP/s) the 2048 size alone would take 40 s, and
    every run measures at its start.

    The best, not a mean: other load on a shared machine only ever slows a product down, so the
    fastest is the closest to the hardware's rate (on a 2-core CPU one single-size run measured
    808 GFLOP/s in bf16 where others gave 2,400-2,727)."""
    device = torch.device(device)
    if device.type not in DEFAULT_SIZES:
        raise ValueError(
            f"measure_matmul_peak times CPU and CUDA devices, not {device.type!r}; set "
            f"GLM_PEAK_TFLOPS to this device's peak instead"
        )
    best = MatmulPeak(0.0, 0)
    # its own generator: the run's default streams stay untouched (only the main rank measures, and
    # tensor ranks must keep drawing the same dropout masks -- parallel/rng.py)
    gen = torch.Generator(device=device).manual_seed(0)
    spent = 0.0  # in timed products (a size's warm-up takes about one more)
    for n in sizes or DEFAULT_SIZES[device.type]:
        if best.flops and spent * (repeats + 1) / repeats + (repeats + 1) * 2 * n**3 / best.flops > budget_s:
            break
        a, b = (torch.randn(n, n, dtype=dtype, device=device, generator=gen) for _ in range(2))
        a @ b  # warm-up: allocation, kernel choice, clocks
        _sync(device)
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            _sync(device)
            took = time.perf_counter() - start
            spent += took
            best = max(best, MatmulPeak(2 * n**3 / took, n))
    return best


def _sync(device: torch.device) -> None:
    """Wait for the device: a CUDA launch returns before its kernel ends."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def env_peak() -> float | None:
    """``GLM_PEAK_TFLOPS`` in FLOP/s, or None when it is not set."""
    value = os.environ.get("GLM_PEAK_TFLOPS")
    if not value:
        return None
    try:
        tflops = float(value)
    except ValueError:
        raise ValueError(
            f"GLM_PEAK_TFLOPS={value!r} is not a number; set it to the device's peak in TFLOP/s (e.g. 989) or unset it"
        ) from None
    if tflops <= 0:
        raise ValueError(f"GLM_PEAK_TFLOPS={value!r} must be positive (TFLOP/s per device)")
    return tflops * 1e12


def mfu_peak(device: torch.device, precision: str, *, measure: bool) -> float | None:
    """MFU's denominator (FLOP/s per device) for a run on ``device`` at ``precision``
    (train.precision): ``GLM_PEAK_TFLOPS`` if set; a known CUDA device's datasheet peak
    (:func:`peak_flops`, TF32 if this process allows it); else, when ``measure``, the best matmul rate
    measured on ``device`` itself in the run's matmul dtype; else None."""
    from_env = env_peak()
    if from_env is not None:
        return from_env
    if device.type == "cuda":
        datasheet = peak_flops(
            torch.cuda.get_device_name(device), precision, tf32=torch.backends.cuda.matmul.allow_tf32
        )
        if datasheet is not None:
            return datasheet
    return measure_matmul_peak(matmul_dtype(precision), device).flops if measure else None
