"""Every collective of the project goes through here (docs/architecture.md, decision 13).

A process group's backend decides where a collective's tensors must live: NCCL takes tensors on
the current CUDA device, gloo takes CPU tensors, a mixed ``cpu:gloo,cuda:nccl`` group takes
either. Each helper puts its tensors on that device and hands the result back on the device the
caller's tensor is on, so no call site needs to know the backend -- and a CPU test run under
gloo exercises the same calls an NCCL run makes.

Under a world of one the helpers return at once, unless ``GLM_FORCE_COLLECTIVES=1``: then every
call site runs its real collective, so one GPU exercises them all with NCCL.

A collective that one rank never joins times out after ``parallel.collective_timeout_s``; the
others then ask a side gloo group which ranks are missing (``diagnose_timeout``), so the message
names the rank instead of leaving a silent hang.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re

import torch
import torch.distributed as dist

FORCE_ENV = "GLM_FORCE_COLLECTIVES"
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
# device types each backend's collectives accept (gloo's CUDA support is partial: use the CPU)
BACKEND_DEVICES = {
    "gloo": ("cpu",),
    "nccl": ("cuda",),
    "mpi": ("cpu",),
    "ucc": ("cpu", "cuda"),
    "xccl": ("xpu",),
    "ccl": ("cpu", "xpu"),
    "hccl": ("hpu",),
}
_side_group = None  # gloo group for diagnostics (monitored barrier), made by ``init_side_group``


def forced() -> bool:
    return os.environ.get(FORCE_ENV, "0").lower() in ("1", "true", "yes")


def active(group=None) -> bool:
    """Whether a collective over ``group`` has to run (more than one rank, or forced)."""
    return dist.is_available() and dist.is_initialized() and (dist.get_world_size(group) > 1 or forced())


def group_rank(group=None) -> int:
    """This process's rank in ``group`` (0 without a process group)."""
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


def group_size(group=None) -> int:
    """The ranks in ``group`` (1 without a process group)."""
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def backend_devices(backend: str) -> tuple[str, ...]:
    """Device types a backend's collectives take: ``"nccl"`` -> ``("cuda",)``;
    ``"cpu:gloo,cuda:nccl"`` -> ``("cpu", "cuda")``."""
    if ":" in backend:
        return tuple(part.split(":", 1)[0] for part in backend.split(","))
    return BACKEND_DEVICES.get(backend.lower(), ("cpu",))


def device_for_backend(backend: str, prefer: torch.device | None = None) -> torch.device:
    """The device a collective's tensors go to: ``prefer``'s when the backend takes it, else the CPU
    when it takes CPU tensors, else the current device of the backend's accelerator."""
    kinds = backend_devices(backend)
    if prefer is not None and prefer.type in kinds:
        return prefer
    if "cpu" in kinds:
        return torch.device("cpu")
    kind = kinds[0]
    return torch.device(kind, getattr(torch, kind).current_device())


def comm_device(group=None, prefer: torch.device | None = None) -> torch.device:
    return device_for_backend(str(dist.get_backend(group)), prefer)


def all_reduce_(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """Reduce ``tensor`` over ``group`` in place (on the backend's device) and return it."""
    if not active(group):
        return tensor
    device = comm_device(group, prefer=tensor.device)
    if tensor.device == device:
        dist.all_reduce(tensor, op=OPS[op], group=group)
        return tensor
    buf = tensor.to(device)
    dist.all_reduce(buf, op=OPS[op], group=group)
    return tensor.copy_(buf)


def all_reduce_values(values: list[float], op: str = "sum", group=None) -> list[float]:
    """Reduce a few Python floats (float64) over ``group``. A host round trip by design: for
    per-evaluation or per-save agreement, never per micro-batch."""
    if not active(group):
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=comm_device(group))
    dist.all_reduce(t, op=OPS[op], group=group)
    return t.tolist()


def all_gather(tensor: torch.Tensor, group=None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape on all ranks), in rank order, on ``tensor``'s device."""
    if not active(group):
        return [tensor]
    device = comm_device(group, prefer=tensor.device)
    local = tensor.contiguous().to(device)
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local, group=group)
    return [p.to(tensor.device) for p in parts]


def all_gather_dim(tensor: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Every rank's ``tensor`` (same shape on all ranks) concatenated along ``dim`` in rank order."""
    if not active(group):
        return tensor
    return torch.cat(all_gather(tensor, group), dim=dim)


def reduce_scatter_dim(tensor: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """The sum of every rank's ``tensor``, cut into equal pieces along ``dim``: this rank's piece."""
    if not active(group):
        return tensor
    size = dist.get_world_size(group)
    if tensor.shape[dim] % size:
        raise ValueError(f"reduce-scatter of {tensor.shape[dim]} along dim {dim} over {size} ranks: not divisible")
    device = comm_device(group, prefer=tensor.device)
    parts = [part.contiguous().to(device) for part in tensor.chunk(size, dim=dim)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts, group=group)
    return out.to(tensor.device)


def all_gather_bytes(data: bytes, group=None) -> list[bytes]:
    """Every rank's ``data`` (of any length), in rank order: results cross ranks as bytes (JSON),
    never pickled."""
    if not active(group):
        return [data]
    device = comm_device(group)
    sizes = [int(n) for n in all_gather(torch.tensor([len(data)], device=device), group)]
    buf = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    if data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return [p[:n].cpu().numpy().tobytes() for p, n in zip(all_gather(buf, group), sizes)]


def broadcast_bytes(data: bytes | None, group=None) -> bytes:
    """Group rank 0's ``data`` on every rank of ``group`` (the others pass None)."""
    if not active(group):
        return data or b""
    device, src = comm_device(group), _group_src(group)
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src, group=group)
    buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if data:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, src=src, group=group)
    return buf.cpu().numpy().tobytes()


def broadcast_batches(batches: list[dict[str, torch.Tensor]] | None, group=None) -> list[dict[str, torch.Tensor]]:
    """Group rank 0's batches (lists of dicts of CPU tensors) on every rank of ``group``, as CPU
    tensors: a JSON header (names, dtypes, shapes), then every tensor's bytes in one buffer -- two
    broadcasts, nothing pickled. The others pass None."""
    if not active(group):
        return batches or []
    lead = dist.get_rank(group) == 0
    header = (
        json.dumps(
            [[(k, str(v.dtype).removeprefix("torch."), list(v.shape)) for k, v in b.items()] for b in batches]
        ).encode()
        if lead
        else None
    )
    spec = json.loads(broadcast_bytes(header, group))
    parts = (
        [v.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for b in batches for v in b.values()]
        if lead
        else []
    )
    data = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
    sizes = [math.prod(shape) * getattr(torch, dtype).itemsize for b in spec for _, dtype, shape in b]
    device = comm_device(group)
    buf = data.to(device) if lead else torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    dist.broadcast(buf, src=_group_src(group), group=group)
    chunks = iter(buf.cpu().split(sizes))
    return [
        {
            k: next(chunks).clone().view(getattr(torch, dtype)).reshape(shape)  # aligned copies
            for k, dtype, shape in b
        }
        for b in spec
    ]


def _group_src(group) -> int:
    """The global rank of ``group``'s rank 0."""
    return dist.get_global_rank(group, 0) if group is not None else 0


def new_group(ranks: list[int]):
    """A process group of ``ranks`` (None in a world of one). Every rank of the world calls this,
    members or not, in the same order."""
    return dist.new_group(ranks=list(ranks)) if active() else None


def barrier(group=None) -> None:
    if active(group):
        if dist.get_backend(group) == "nccl":  # NCCL's barrier must know this rank's device
            dist.barrier(group=group, device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier(group=group)


def first_error(message: str | None, *, max_bytes: int = 2048) -> str | None:
    """The message of the lowest rank that has one (None when no rank has), on every rank:
    ranks that checked different things agree on one failure without pickling anything."""
    if not active():
        return message
    world = dist.get_world_size()
    rank = dist.get_rank()
    first = int(all_reduce_values([rank if message is not None else world], "min")[0])
    if first == world:
        return None
    device = comm_device()
    buf = torch.zeros(max_bytes, dtype=torch.int32, device=device)
    if rank == first:
        data = message.encode("utf-8")[:max_bytes]
        buf[: len(data)] = torch.tensor(list(data), dtype=torch.int32, device=device)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    data = bytes(int(b) for b in buf.tolist() if b)
    return data.decode("utf-8", "replace")


def release_side_group() -> None:
    """Forget the side group (the process group it belongs to is being destroyed)."""
    global _side_group
    _side_group = None


def init_side_group(timeout_s: float) -> None:
    """A gloo group beside the main one, for ``diagnose_timeout``'s monitored barrier (gloo only
    has one; under NCCL it also keeps the diagnosis off the GPU)."""
    global _side_group
    if _side_group is None and dist.is_initialized() and dist.get_world_size() > 1:
        _side_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def is_timeout(err: BaseException) -> bool:
    return isinstance(err, RuntimeError) and bool(re.search(r"timed? ?out", str(err), re.IGNORECASE))


# what gloo and NCCL say when a peer's process is gone (killed, out of memory, crashed) mid-collective
PEER_GONE = re.compile(
    r"connection (reset|closed) by peer|broken pipe|communicator was aborted|remote process exited", re.IGNORECASE
)


def is_peer_gone(err: BaseException) -> bool:
    return isinstance(err, RuntimeError) and bool(PEER_GONE.search(str(err)))


def diagnose_timeout(wait_s: float = 10.0) -> list[int] | None:
    """After a collective timed out: the ranks that do not answer a monitored barrier on the side
    group within ``wait_s`` (reported by rank 0; other ranks get None), [] if all answered."""
    if _side_group is None:
        return None
    missing = wait_for_ranks(wait_s)
    return missing if dist.get_rank() == 0 else None


def wait_for_ranks(timeout_s: float) -> list[int] | None:
    """One barrier of every rank (on the side group) that waits at most ``timeout_s``: [] when all
    arrived in time; else rank 0 gets the ranks that did not and the others None (rank 0, which
    names them, did not answer them)."""
    if _side_group is None:
        return []
    try:
        dist.monitored_barrier(group=_side_group, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
    except RuntimeError as err:
        found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", str(err))
        return [int(r) for r in found.group(1).replace(" ", "").split(",") if r] if found else None
    return []
