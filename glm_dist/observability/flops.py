"""Model FLOPs utilisation: achieved model FLOP/s over the hardware's peak."""
from __future__ import annotations

import os
import time

import torch

# Dense bf16 peak TFLOP/s by device name substring (vendor datasheets).
GPU_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "A10G": 125.0, "L4": 121.0, "V100": 125.0}


def peak_flops() -> float | None:
    """Peak FLOP/s: ``GLM_PEAK_TFLOPS`` if set, a known GPU's datasheet bf16 figure, else None
    (on a CPU measure it with ``measure_matmul_peak``)."""
    if os.environ.get("GLM_PEAK_TFLOPS"):
        return float(os.environ["GLM_PEAK_TFLOPS"]) * 1e12
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, tflops in GPU_PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12
    return None


def measure_matmul_peak(dtype: torch.dtype = torch.float32, n: int = 2048, seconds: float = 1.0,
                        device: str = "cpu") -> float:
    """Best FLOP/s of an n x n x n matmul over ``seconds`` -- the machine's practical peak."""
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        best = max(best, 2 * n**3 / (time.perf_counter() - t))
    return best
