"""Process-group setup: one plain process, torchrun, the deepspeed launcher or SLURM's srun.

DeepSpeed picks the accelerator (CUDA -> nccl, CPU -> gloo); a plain ``glm train`` becomes a
world of one so the same code path runs everywhere. The collectives themselves live in
``comm.py``.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from glm_dist.parallel import comm

DEFAULT_TIMEOUT_S = 1800.0


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


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[07-09,12],cpu1`` -> ``gpu07``."""
    head = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if head is None:
        raise ValueError(f"cannot read a host from SLURM_JOB_NODELIST={nodelist!r}")
    prefix, ranges = head.group(1), head.group(2)
    return prefix + (ranges.split(",")[0].split("-")[0] if ranges else "")


def srun_environment(env: dict[str, str], *, visible_devices: int) -> dict[str, str]:
    """The torch.distributed variables for a task started by plain ``srun`` (no torchrun):
    RANK/WORLD_SIZE from SLURM, the rendezvous on the job's first node at a port derived from
    the job id (every task computes the same one), and LOCAL_RANK naming a device this task can
    see -- 0 when SLURM binds one GPU per task (``--gpus-per-task=1``)."""
    local = int(env.get("SLURM_LOCALID", "0"))
    if visible_devices > 1 and local >= visible_devices:
        raise RuntimeError(
            f"SLURM task {local} on this node sees {visible_devices} GPUs: start one task per GPU "
            f"(--ntasks-per-node=GPUs) or bind one GPU per task (--gpus-per-task=1)"
        )
    job = int(env.get("SLURM_JOB_ID", "0"))
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": str(local if visible_devices > 1 else 0),
        "MASTER_ADDR": env.get("MASTER_ADDR") or first_host(env.get("SLURM_JOB_NODELIST", "127.0.0.1")),
        "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + job % 20000),
    }


def _visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def shutdown_distributed() -> None:
    """Tear the default process group down before the interpreter exits (a finished command). Left
    to the interpreter's teardown, a backend's threads can die in C++ destructors -- a rank that
    trained correctly then aborts with "terminate called without an active exception". Through DeepSpeed
    when it made the group: it also drops the groups it cached (its world clone), which a later
    ``init_distributed`` in the same process -- a second command run from Python -- would otherwise use
    destroyed ("Group ... is not registered")."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    comm.release_side_group()
    ds_comm = sys.modules.get("deepspeed.comm.comm")
    if ds_comm is not None and ds_comm.cdb is not None:
        ds_comm.destroy_process_group()
    else:
        dist.destroy_process_group()


def init_distributed(*, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistInfo:
    """Initialise (once) the default process group through DeepSpeed and describe this rank.
    On CUDA each rank binds its device before the first collective (an NCCL barrier on the wrong
    device hangs), whatever DeepSpeed version does."""
    import deepspeed

    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ and "WORLD_SIZE" not in os.environ:
        os.environ.update(srun_environment(dict(os.environ), visible_devices=_visible_gpus()))
    if "RANK" not in os.environ:  # a plain process: a world of one
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=os.environ.get("MASTER_PORT", str(_free_port())),
        )
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if _visible_gpus():
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        # Groups made later without a timeout (DeepSpeed's data-parallel and ZeRO groups) take
        # torch's module default (30 min), not the world's: make the default ours.
        c10d = dist.distributed_c10d
        c10d.default_pg_timeout = timeout
        if isinstance(getattr(c10d, "default_pg_nccl_timeout", None), datetime.timedelta):
            c10d.default_pg_nccl_timeout = timeout
        deepspeed.init_distributed(dist_init_required=True, verbose=False, timeout=timeout)
        comm.init_side_group(timeout_s)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)
