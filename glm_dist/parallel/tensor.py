"""Tensor parallelism (Megatron-LM's scheme, Shoeybi et al. 2019): attention heads and the FFN width
split over the ranks of a tensor-parallel group.

Each attention layer keeps ``n_head / tp`` heads: its query/key/value projection is *column*
parallel (each rank computes its heads' outputs from the whole input) and its output projection
*row* parallel (each rank multiplies its heads' slice; one all-reduce sums the partial outputs).
The FFN is the same pair: first linear column parallel, second row parallel. So a block costs two
all-reduces forward and two backward, and everything between blocks (LayerNorms, residuals,
embeddings, the output head) is replicated and computed identically on every tensor rank.

The model is built whole (from the run's seed, like every other layout) and then sharded in place:
each rank keeps its slice of the same weights, so a TP run starts where a one-process run starts
and follows its loss. Which modules split how is a table keyed by the model's own classes
(``SHARD_PLANS``); the model code stays free of distribution code (ARCHITECTURE.md decision 2).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from glm_dist.parallel.topology import Topology


# families whose attention and FFN modules have a shard plan below
TENSOR_PARALLEL_FAMILIES = ("gpt", "bert", "roberta", "albert", "electra")


# -- the two communication primitives (Megatron's f and g) ---------------------------------------
class _CopyToTensorRegion(torch.autograd.Function):
    """Identity forward; all-reduce of the input's gradient backward (each rank's column slice
    contributes a partial gradient of the replicated input)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorRegion(torch.autograd.Function):
    """All-reduce forward (sum the row slices' partial outputs); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """``rows`` of a linear layer's output features (and their bias) on this rank."""

    def __init__(self, full: nn.Linear, rows: torch.Tensor, group, parts: int = 1):
        super().__init__()
        self.group = group
        self.in_features, self.out_features = full.in_features, len(rows)
        self.weight = nn.Parameter(full.weight.detach()[rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[rows].clone()) if full.bias is not None else None
        for p in self.parameters():
            p.tensor_parallel = (0, parts)  # (split dimension, equal side-by-side parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_CopyToTensorRegion.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``cols`` of a linear layer's input features on this rank; the bias is added once, after the
    partial outputs are summed, so it stays replicated."""

    def __init__(self, full: nn.Linear, cols: torch.Tensor, group):
        super().__init__()
        self.group = group
        self.in_features, self.out_features = len(cols), full.out_features
        self.weight = nn.Parameter(full.weight.detach()[:, cols].clone())
        self.weight.tensor_parallel = (1, 1)
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _ReduceFromTensorRegion.apply(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


# -- which modules split how -----------------------------------------------------------------------
@dataclass(frozen=True)
class ShardPlan:
    """Attribute paths of one module class: column-parallel linears (``fused`` ones hold several
    equal parts side by side, e.g. GPT's [q; k; v]), row-parallel linears, and the attribute that
    counts heads (divided by the tensor-parallel size)."""

    column: tuple[str, ...] = ()
    row: tuple[str, ...] = ()
    fused: dict | None = None  # path -> number of equal parts
    heads: str | None = None


def _plans() -> dict[type, ShardPlan]:
    from glm_dist.models import bert, common

    return {common.CausalSelfAttention: ShardPlan(column=("qkv",), row=("proj",), fused={"qkv": 3}, heads="n_head"),
            common.MLP: ShardPlan(column=("fc",), row=("proj",)),
            bert.SelfAttention: ShardPlan(column=("query", "key", "value"), row=("dense",), heads="n_head"),
            bert.EncoderBlock: ShardPlan(column=("ffn.fc",), row=("ffn.proj",))}


def _slice(n: int, rank: int, size: int, parts: int = 1) -> torch.Tensor:
    """Indices of this rank's share of ``n`` features made of ``parts`` equal side-by-side parts."""
    width = n // parts
    share = width // size
    return torch.cat([torch.arange(p * width + rank * share, p * width + (rank + 1) * share) for p in range(parts)])


def _get(module: nn.Module, path: str) -> nn.Module:
    for name in path.split("."):
        module = module[name] if isinstance(module, nn.ModuleDict) else getattr(module, name)
    return module


def _set(module: nn.Module, path: str, value: nn.Module) -> None:
    *parents, name = path.split(".")
    for p in parents:
        module = module[p] if isinstance(module, nn.ModuleDict) else getattr(module, p)
    if isinstance(module, nn.ModuleDict):
        module[name] = value
    else:
        setattr(module, name, value)


def shard_model(model: nn.Module, rank: int, size: int, group) -> int:
    """Replace, in place, every planned linear by this rank's column or row slice; returns how many
    modules were sharded. A module shared by several blocks (ALBERT) is sharded once."""
    if size == 1:
        return 0
    plans, done = _plans(), set()
    for module in list(model.modules()):
        plan = next((plans[c] for c in type(module).__mro__ if c in plans), None)
        if plan is None or id(module) in done:
            continue
        done.add(id(module))
        for path in plan.column:
            full = _get(module, path)
            if isinstance(full, ColumnParallelLinear):
                continue
            parts = (plan.fused or {}).get(path, 1)
            if full.out_features % (parts * size):
                raise ValueError(f"{type(module).__name__}.{path}: {full.out_features} outputs do not split "
                                 f"into {parts} x {size} tensor-parallel slices")
            _set(module, path, ColumnParallelLinear(full, _slice(full.out_features, rank, size, parts), group, parts))
        for path in plan.row:
            full = _get(module, path)
            if isinstance(full, RowParallelLinear):
                continue
            if full.in_features % size:
                raise ValueError(f"{type(module).__name__}.{path}: {full.in_features} inputs do not split "
                                 f"into {size} tensor-parallel slices")
            _set(module, path, RowParallelLinear(full, _slice(full.in_features, rank, size), group))
        if plan.heads:
            setattr(module, plan.heads, getattr(module, plan.heads) // size)
    return len(done)


def mark_for_grad_norm(model: nn.Module, tensor_rank: int, *, exclude: set[int] = frozenset()) -> None:
    """DeepSpeed sums a gradient's square over the model-parallel group when the parameter is
    marked ``model_parallel`` and otherwise only on model-parallel rank 0. Slices are marked on
    every rank (each holds different numbers); replicated parameters on tensor rank 0 only, so each
    counts once. ``exclude``: ids of parameters never to mark (a pipeline's tied copy)."""
    for p in model.parameters():
        p.model_parallel = id(p) not in exclude and (hasattr(p, "tensor_parallel") or tensor_rank == 0)


def local_slice(p: nn.Parameter, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's slice of a whole tensor shaped like the unsplit parameter ``p`` came from."""
    dim, parts = p.tensor_parallel
    return full.index_select(dim, _slice(full.shape[dim], rank, size, parts))


def gather_slices(p: nn.Parameter, local: torch.Tensor, group, size: int) -> torch.Tensor:
    """The whole tensor from every tensor rank's slice of it (collective over ``group``)."""
    dim, parts = p.tensor_parallel
    shards = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(shards, local.contiguous(), group=group)
    full_shape = list(local.shape)
    full_shape[dim] *= size
    full = torch.empty(full_shape, dtype=local.dtype)
    for r, shard in enumerate(shards):
        full.index_copy_(dim, _slice(full_shape[dim], r, size, parts), shard)
    return full


# -- the process groups DeepSpeed is handed (its ``mpu``) when nothing else builds them ------------
class ParallelGroups:
    """Data- and tensor-parallel process groups of a (pipeline-free) topology, with the methods
    DeepSpeed's engine and ZeRO optimizers call on an ``mpu``: gradients are averaged over the
    data group, the gradient norm summed over the tensor ("model-parallel") group."""

    def __init__(self, topo: Topology, rank: int):
        self.topo, self.rank = topo, rank
        self.coords = topo.coords(rank)
        self._groups = {}
        for axis in ("data", "tensor"):
            # every rank creates every group, in the same order (torch.distributed requires it)
            seen = set()
            for r in range(topo.world_size):
                ranks = tuple(topo.group(axis, r))
                if ranks in seen:
                    continue
                seen.add(ranks)
                group = dist.new_group(list(ranks))
                if rank in ranks:
                    self._groups[axis] = (group, list(ranks))

    def get_data_parallel_group(self):
        return self._groups["data"][0]

    def get_data_parallel_group_ranks(self):
        return self._groups["data"][1]

    def get_data_parallel_rank(self):
        return self.coords["data"]

    def get_data_parallel_world_size(self):
        return self.topo.data

    def get_model_parallel_group(self):
        return self._groups["tensor"][0]

    def get_model_parallel_rank(self):
        return self.coords["tensor"]

    def get_model_parallel_world_size(self):
        return self.topo.tensor

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size

    def get_tensor_model_parallel_src_rank(self):
        return self._groups["tensor"][1][0]
