"""Device memory at a log line, as torchtitan and Megatron-LM log it.

The caching allocator's peak bytes allocated (live tensors) and reserved (its segments, what
``nvidia-smi`` shows) since the previous log line -- the peak counters are reset after each read --
and its cumulative ``num_alloc_retries``: a retry frees every cached block and calls cudaMalloc
again, which synchronises the device; a count that grows says memory is fragmented or nearly full.
Reading them is the allocator's host-side bookkeeping: no device sync. Only CUDA keeps these
counters; on the CPU there is no reading, and the metrics carry no keys (absent, not zero).
"""

from __future__ import annotations

import torch

GIB = 2**30
# metrics.jsonl's keys; W&B's ``memory/...`` (run_logger.py)
KEYS = ("mem_max_allocated_gib", "mem_max_reserved_gib", "mem_alloc_retries")


def device_memory(device: torch.device | str) -> dict[str, float | int] | None:
    """The peaks since the last call on ``device`` and the allocator's retries so far, then the
    peaks reset; None where the device keeps no allocator statistics (the CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    row = {
        "mem_max_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "mem_max_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
        "mem_alloc_retries": int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0)),
    }
    torch.cuda.reset_peak_memory_stats(device)
    return row


def memory_postfix(metrics: dict) -> dict[str, str]:
    """The progress bar's memory fields of a metrics row: peak allocated/reserved GiB, and the
    retries once there are any; none for a row without a reading."""
    if "mem_max_allocated_gib" not in metrics:
        return {}
    out = {"mem": f"{metrics['mem_max_allocated_gib']:.1f}/{metrics['mem_max_reserved_gib']:.1f}G"}
    if metrics.get("mem_alloc_retries"):
        out["retries"] = str(metrics["mem_alloc_retries"])
    return out


def wandb_key(key: str) -> str:
    """W&B's name of a train metric: the memory readings under ``memory/``, the rest under ``train/``."""
    return f"memory/{key[len('mem_') :]}" if key in KEYS else f"train/{key}"
