"""What this machine's training device computes natively, read from the hardware.

Below ``config/``: loading a config resolves ``train.precision=auto`` with :func:`native_bf16`, and
a probe of the device needs nothing of a run (no config, no process group, no model).
"""

from __future__ import annotations

import torch


def native_bf16() -> tuple[bool, str]:
    """Whether this machine's training device multiplies bf16 in hardware, and what says so.
    CUDA: ``torch.cuda.is_bf16_supported()`` (Ampere and newer). CPU: AMX or AVX512-BF16, and oneDNN
    allowed to use them (``ONEDNN_MAX_CPU_ISA`` can cap it). Without them a CPU emulates bf16: a
    matmul runs ~50x slower than in fp32 (AVX2, measured), so ``train.precision=auto`` takes fp32 there."""
    if torch.cuda.is_available():
        ok = torch.cuda.is_bf16_supported()
        return ok, f"{torch.cuda.get_device_name()} {'has' if ok else 'has no'} bf16 tensor cores"
    units = [
        name
        for name, probe in (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
        if getattr(torch.cpu, probe, lambda: False)()
    ]
    if units and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False, f"the CPU has {' and '.join(units)} but oneDNN may not use them (ONEDNN_MAX_CPU_ISA)"
    return bool(units), f"the CPU has {' and '.join(units)}" if units else "the CPU has neither AMX nor AVX512-BF16"
