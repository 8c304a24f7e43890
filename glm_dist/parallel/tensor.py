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
and follows its loss. Which modules split how is data each family declares in its registry row
(``tensor_plans``: module class -> ``ShardPlan`` of attribute paths, next to the classes in
``families/<family>/``), which the caller hands in; the model code stays free of distribution code
(docs/architecture.md, decision 2), and this module knows no family.
Encoder-decoders (T5, BART) split both stacks and their cross-attention the same way: the encoder's
output is replicated on the tensor ranks and enters each rank's key/value columns as a column-parallel
input; T5's relative-position bias table (one column per head) is split with the heads.

Vocabulary parallelism (Megatron's ``VocabParallelEmbedding`` and parallel output layer): the token
embedding's rows are cut over the tensor ranks -- rank r holds ids ``[r ceil(V/tp), (r+1) ceil(V/tp))``,
the last share shorter when tp does not divide V (the padding rows of the split are never stored,
so checkpoints keep the unsplit (V, C) shape and never predict them). A lookup zeroes the ids
outside this rank's rows and all-reduces; the tied output projection multiplies by the same rows,
giving this rank's columns of the logits, and the loss is computed from those columns without
gathering them (``ops/cross_entropy.py``'s ``vocab_split``). The replicated input of the output
projection has its gradient all-reduced, as a column-parallel linear's.

Dropout inside a rank's own region (its heads' attention probabilities) draws from the rank's own
stream (``parallel/rng.py``); ``parallel/sequence.py`` adds sequence parallelism on top.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from glm_dist.checkpoint.shards import split_bounds
from glm_dist.models.common import ShardPlan, VocabPlan
from glm_dist.ops.cross_entropy import VocabSplit
from glm_dist.parallel import comm
from glm_dist.parallel.rng import ForkedDropout, TensorRankRNG
from glm_dist.parallel.sequence import (
    GatherToReplicated,
    ReduceScatterToSequence,
    ScatterToSequence,
    SequenceColumnLinear,
)
from glm_dist.parallel.topology import Topology


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
        return comm.all_reduce_(grad.contiguous(), group=ctx.group), None


class _ReduceFromTensorRegion(torch.autograd.Function):
    """All-reduce forward (sum the row slices' partial outputs); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return comm.all_reduce_(x.contiguous(), group=group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """``rows`` of a linear layer's output features (and their bias) on this rank. Its input is
    replicated, or -- ``sequence_parallel`` -- this rank's positions, all-gathered first."""

    def __init__(self, full: nn.Linear, rows: torch.Tensor, group, parts: int = 1):
        super().__init__()
        self.group, self.sequence_parallel = group, False
        self.in_features, self.out_features = full.in_features, len(rows)
        self.weight = nn.Parameter(full.weight.detach()[rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[rows].clone()) if full.bias is not None else None
        for p in self.parameters():
            p.tensor_parallel = (0, parts)  # (split dimension, equal side-by-side parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:  # x: this rank's positions, gathered inside (and again in backward)
            return SequenceColumnLinear.apply(x, self.weight, self.bias, self.group)
        return F.linear(_CopyToTensorRegion.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``cols`` of a linear layer's input features on this rank; the bias is added once, after the
    partial outputs are summed (all-reduced, or -- ``sequence_parallel`` -- reduce-scattered to this
    rank's positions), so it stays replicated."""

    def __init__(self, full: nn.Linear, cols: torch.Tensor, group):
        super().__init__()
        self.group, self.sequence_parallel = group, False
        self.in_features, self.out_features = len(cols), full.out_features
        self.weight = nn.Parameter(full.weight.detach()[:, cols].clone())
        self.weight.tensor_parallel = (1, 1)
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leave = ReduceScatterToSequence if self.sequence_parallel else _ReduceFromTensorRegion
        y = leave.apply(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """This rank's rows ``[split.start, split.end)`` of a token embedding; ``weight`` keeps the
    name, so checkpoints and tied copies find it where the whole embedding's was."""

    def __init__(self, full: nn.Embedding, rank: int, size: int, group):
        super().__init__()
        start, end = split_bounds(full.num_embeddings, rank, size)
        if end <= start:
            raise ValueError(
                f"a vocabulary of {full.num_embeddings} tokens leaves tensor rank {rank} of {size} no rows"
            )
        self.group, self.split = group, VocabSplit(group, start, end, full.num_embeddings, comm.all_reduce_)
        self.num_embeddings, self.embedding_dim = full.num_embeddings, full.embedding_dim
        pad = full.padding_idx
        self.padding_idx = pad - start if pad is not None and start <= pad < end else None
        self.weight = _vocab_parameter(full.weight, start, end)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.split.start
        outside = (local < 0) | (local >= self.split.width)  # another rank's rows: zeros here
        out = F.embedding(local.masked_fill(outside, 0), self.weight, self.padding_idx)
        return _ReduceFromTensorRegion.apply(out.masked_fill(outside[..., None], 0.0), self.group)


class VocabParallelOutput(nn.Module):
    """The output projection onto this rank's vocabulary columns: the embedding's rows (tied) and
    the bias's slice. ``forward(x, project)`` as ``OutputLinear``: the logits' columns, or
    ``project(x, weight, bias)`` on this rank's rows -- under ``vocab_split`` a loss sees them as
    such."""

    def __init__(self, embedding: VocabParallelEmbedding, bias: torch.Tensor | None):
        super().__init__()
        self.group, self.split, self.weight = embedding.group, embedding.split, embedding.weight
        self.bias = None if bias is None else _vocab_parameter(bias, self.split.start, self.split.end)

    def forward(self, x: torch.Tensor, project: Callable | None = None):
        x = _CopyToTensorRegion.apply(x, self.group)
        return F.linear(x, self.weight, self.bias) if project is None else project(x, self.weight, self.bias)


def _vocab_parameter(full: torch.Tensor, start: int, end: int) -> nn.Parameter:
    """Rows ``[start, end)`` of ``full``, keeping the marks DeepSpeed left on it (a pipeline's later
    copies of a tied embedding carry ``ds_pipe_replicated``: counted once in the gradient norm)."""
    p = nn.Parameter(full.detach()[start:end].clone())
    p.__dict__.update(vars(full))
    p.tensor_parallel, p.unsplit_shape = (0, 1), tuple(full.shape)
    return p


def output_logits(embedding: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A pipeline's last stage: ``x`` times its copy of the (tied) embedding -- this rank's columns
    of the logits when the embedding is split over the vocabulary."""
    if isinstance(embedding, VocabParallelEmbedding):
        x = _CopyToTensorRegion.apply(x, embedding.group)
    return F.linear(x, embedding.weight)


# -- which modules split how -----------------------------------------------------------------------
# A family's row declares its plans (``tensor_plans``: module class -> ShardPlan; ``vocab_plans``: module
# class -> VocabPlan); the caller hands them in, so this module knows no family. A pipeline's stage
# modules carry their vocabulary plan as ``VOCAB_PLAN``.
def _plan_of(module: nn.Module, plans: dict):
    return next((plans[c] for c in type(module).__mro__ if c in plans), None)


def _vocab_plan_of(module: nn.Module, plans: dict[type, VocabPlan]) -> VocabPlan | None:
    """A family's plan for ``module``'s class, else the one a pipeline stage module carries."""
    return _plan_of(module, plans) or getattr(module, "VOCAB_PLAN", None)


def shard_vocab(model: nn.Module, rank: int, size: int, group, *, plans: dict[type, VocabPlan]) -> VocabSplit | None:
    """Replace, in place, the token embedding by this rank's rows and its tied output projections
    by this rank's columns (``plans``: the family's ``vocab_plans``); returns the split (None: this
    stage holds no vocabulary)."""
    split = None
    embeddings: dict[int, VocabParallelEmbedding] = {}  # id(whole weight) -> its split
    modules = list(model.modules())
    for module in modules:
        plan = _vocab_plan_of(module, plans)
        if plan is not None and plan.embedding and not isinstance(_get(module, plan.embedding), VocabParallelEmbedding):
            full = _get(module, plan.embedding)
            embeddings[id(full.weight)] = split_emb = VocabParallelEmbedding(full, rank, size, group)
            _set(module, plan.embedding, split_emb)
            split = split_emb.split
    for module in modules:
        plan = _vocab_plan_of(module, plans)
        for path in plan.outputs if plan else ():
            full = _get(module, path)
            if id(full.weight) not in embeddings:
                raise ValueError(
                    f"{type(module).__name__}.{path} is not tied to a token embedding: the vocabulary "
                    f"split shards tied output projections only"
                )
            _set(module, path, VocabParallelOutput(embeddings[id(full.weight)], full.bias))
        for path in plan.biases if plan else ():
            full = getattr(module, path)
            start, end = split_bounds(full.shape[0], rank, size)
            setattr(module, path, _vocab_parameter(full, start, end))
            split = split or VocabSplit(group, start, end, full.shape[0], comm.all_reduce_)
    return split


def vocab_parameters(model: nn.Module, plans: dict[type, VocabPlan]) -> list[nn.Parameter]:
    """The parameters ``shard_vocab`` would split with ``plans`` (on the meta device too): embedding
    weights (tied outputs share them), the outputs' biases and vocabulary-sized biases."""
    out = {}
    for module in model.modules():
        plan = _vocab_plan_of(module, plans)
        if plan is None:
            continue
        found = [_get(module, plan.embedding).weight] if plan.embedding else []
        found += [_get(module, path).bias for path in plan.outputs]
        found += [getattr(module, path) for path in plan.biases]
        out.update((id(p), p) for p in found if p is not None)
    return list(out.values())


def tensor_parameters(model: nn.Module, plans: dict[type, ShardPlan]) -> list[nn.Parameter]:
    """The parameters ``shard_model`` splits with ``plans`` by heads / FFN width (on the meta device too):
    the planned linears' weights, the column-parallel ones' biases (a row-parallel bias stays whole) and
    head tables."""
    out = {}
    for module in model.modules():
        plan = _plan_of(module, plans)
        if plan is None:
            continue
        for path in (*plan.column, *plan.row, *plan.head_tables):
            layer = _get(module, path, path in plan.optional)
            if layer is not None:
                out[id(layer.weight)] = layer.weight
                if path in plan.column and layer.bias is not None:
                    out[id(layer.bias)] = layer.bias
    return list(out.values())


def model_vocab_split(model: nn.Module) -> VocabSplit | None:
    """The vocabulary split of a sharded model (None: its vocabulary is whole)."""
    return next((m.split for m in model.modules() if isinstance(m, VocabParallelEmbedding)), None)


def _slice(n: int, rank: int, size: int, parts: int = 1) -> torch.Tensor:
    """Indices of this rank's share of ``n`` features made of ``parts`` equal side-by-side parts."""
    width = n // parts
    share = width // size
    return torch.cat([torch.arange(p * width + rank * share, p * width + (rank + 1) * share) for p in range(parts)])


def _get(module: nn.Module, path: str, optional: bool = False) -> nn.Module | None:
    """The submodule at ``path``; ``optional``: None where the module lacks it (or holds None there)."""
    for name in path.split("."):
        if isinstance(module, nn.ModuleDict):
            module = module[name] if name in module or not optional else None
        else:
            module = getattr(module, name, None) if optional else getattr(module, name)
        if module is None:
            return None
    return module


def _head_table(full: nn.Embedding, heads: torch.Tensor) -> nn.Embedding:
    """This rank's columns (heads) of a table with one column per head; the whole shape is kept for
    the checkpoint's reassembly."""
    table = nn.Embedding(full.num_embeddings, len(heads), device=full.weight.device, dtype=full.weight.dtype)
    table.weight = nn.Parameter(full.weight.detach()[:, heads].clone())
    table.weight.tensor_parallel, table.weight.unsplit_shape = (1, 1), tuple(full.weight.shape)
    return table


def _set(module: nn.Module, path: str, value: nn.Module) -> None:
    *parents, name = path.split(".")
    for p in parents:
        module = module[p] if isinstance(module, nn.ModuleDict) else getattr(module, p)
    if isinstance(module, nn.ModuleDict):
        module[name] = value
    else:
        setattr(module, name, value)


def shard_model(
    model: nn.Module,
    rank: int,
    size: int,
    group,
    *,
    plans: dict[type, ShardPlan],
    vocab_plans: dict[type, VocabPlan] | None = None,
    sequence: bool = False,
) -> int:
    """Replace, in place, every linear ``plans`` (the family's ``tensor_plans``) names by this rank's
    column or row slice; returns how many modules were sharded. A module shared by several blocks
    (ALBERT) is sharded once. ``vocab_plans`` (the family's; None: the vocabulary stays whole):
    split the token embedding and its tied output over the vocabulary too (``shard_vocab``);
    ``sequence``: then cut the residual stream along the sequence (``parallel/sequence.py``).
    Split heads draw their attention dropout from this rank's own stream (``parallel/rng.py``)."""
    if size == 1:
        return 0
    done, rng = set(), TensorRankRNG(rank)
    for module in list(model.modules()):
        plan = _plan_of(module, plans)
        if plan is None or id(module) in done:
            continue
        done.add(id(module))
        for path in plan.column:
            full = _get(module, path, path in plan.optional)
            if full is None or isinstance(full, ColumnParallelLinear):
                continue
            parts = (plan.fused or {}).get(path, 1)
            if full.out_features % (parts * size):
                raise ValueError(
                    f"{type(module).__name__}.{path}: {full.out_features} outputs do not split "
                    f"into {parts} x {size} tensor-parallel slices"
                )
            _set(module, path, ColumnParallelLinear(full, _slice(full.out_features, rank, size, parts), group, parts))
        for path in plan.row:
            full = _get(module, path, path in plan.optional)
            if full is None or isinstance(full, RowParallelLinear):
                continue
            if full.in_features % size:
                raise ValueError(
                    f"{type(module).__name__}.{path}: {full.in_features} inputs do not split "
                    f"into {size} tensor-parallel slices"
                )
            _set(module, path, RowParallelLinear(full, _slice(full.in_features, rank, size), group))
        for path in plan.head_tables:
            full = _get(module, path, path in plan.optional)
            if full is not None and not hasattr(full.weight, "tensor_parallel"):
                if full.embedding_dim % size:
                    raise ValueError(
                        f"{type(module).__name__}.{path}: {full.embedding_dim} heads do not split "
                        f"into {size} tensor-parallel slices"
                    )
                _set(module, path, _head_table(full, _slice(full.embedding_dim, rank, size)))
        if plan.heads:
            setattr(module, plan.heads, getattr(module, plan.heads) // size)
            module.probs_rng = rng.fork  # the model's hook for its attention-probability dropout
    if vocab_plans is not None:
        shard_vocab(model, rank, size, group, plans=vocab_plans)
    if sequence:
        apply_sequence_parallel(model, group, rng)
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
    return full.index_select(dim, _slice(full.shape[dim], rank, size, parts).to(full.device))


def gather_slices(p: nn.Parameter, local: torch.Tensor, group, size: int) -> torch.Tensor:
    """The whole tensor from every tensor rank's slice of it (collective over ``group``)."""
    dim, parts = p.tensor_parallel
    shards = comm.all_gather(local, group=group)  # on local's device, whatever the backend
    full_shape = list(local.shape)
    full_shape[dim] *= size
    full = torch.empty(full_shape, dtype=local.dtype, device=local.device)
    for r, shard in enumerate(shards):
        full.index_copy_(dim, _slice(full_shape[dim], r, size, parts).to(full.device), shard)
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


def apply_sequence_parallel(model: nn.Module, group, rng: TensorRankRNG) -> None:
    """Cut ``model`` (a tensor-sharded ``layers()`` list: embedding, blocks, head) along the sequence
    between its embedding and its head, in place: the blocks' parallel linears switch to all-gather /
    reduce-scatter, their dropouts to this rank's stream, and their replicated parameters get their
    gradients summed over ``group``. Module and parameter names do not change."""
    embed, *blocks, head = model.layers()
    embed.register_forward_hook(lambda module, args, out: ScatterToSequence.apply(out, group))
    head.register_forward_pre_hook(lambda module, args: (GatherToReplicated.apply(args[0], group), *args[1:]))
    seen: set[int] = set()
    for block in blocks:
        if id(block) in seen:  # ALBERT: one block object, many positions in the list
            continue
        seen.add(id(block))
        for name, module in list(block.named_modules()):
            if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
                module.sequence_parallel = True
            elif isinstance(module, nn.Dropout) and not isinstance(module, ForkedDropout):
                _set(block, name, ForkedDropout(module.p, rng))
        for p in block.parameters():
            if not hasattr(p, "tensor_parallel") and id(p) not in seen:
                seen.add(id(p))
                p.sequence_parallel = True
                p.register_hook(lambda grad: comm.all_reduce_(grad.clone(), group=group))
