"""Process-group setup: one plain process, torchrun, the deepspeed launcher or SLURM's srun.

DeepSpeed picks the accelerator (CUDA -> nccl, CPU -> gloo); a plain ``glm train`` becomes a
world of one so the same code path runs everywhere.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> DistInfo:
    """Initialise (once) the default process group through DeepSpeed and describe this rank."""
    import deepspeed

    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ and "WORLD_SIZE" not in os.environ:
        # srun without torchrun: SLURM's variables describe the world.
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"],
                          LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"))
    if "RANK" not in os.environ:  # a plain process: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", str(_free_port())))
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_init_required=True, verbose=False)
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Sum (or max/min) a few Python floats over all ranks, in float64."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t.tolist()
