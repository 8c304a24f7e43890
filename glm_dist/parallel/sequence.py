"""Sequence parallelism (Korthikanti et al. 2022) inside a tensor-parallel group.

Plain tensor parallelism leaves the LayerNorms, the dropouts and the residual stream of every
block replicated: each tensor rank holds all T positions of them. Here the residual stream is cut
along the sequence (dim 1 of (B, T, C)): rank r of ``tp`` holds positions ``[r T/tp, (r+1) T/tp)``,
and the two collectives of a block's sublayer change places with the all-reduce:

    x (B, T/tp, C) -> LayerNorm -> all-gather (T) -> column-parallel linear -> ... (this rank's heads /
    FFN columns) -> row-parallel linear -> reduce-scatter (T/tp) -> + bias -> dropout -> + x

All-gather + reduce-scatter move the same bytes as one all-reduce, so communication stays what it
was, while everything between a reduce-scatter and the next all-gather -- the LayerNorms, the
dropout masks, the residual additions -- is 1/tp per rank. The embedding's output (replicated, its
dropout drawn alike on every rank) is cut at the first block; the head gathers the whole sequence
back, so the heads and the (vocabulary-parallel) loss see every position.

Parameters used inside the cut region (LayerNorm gains and biases, the row-parallel biases) see
only this rank's positions, so their gradients are all-reduced over the tensor group as they are
made. Dropout there draws from each rank's own stream (``parallel/rng.py``): its positions are its
own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glm_dist.parallel import comm

DIM = 1  # the sequence dim of (B, T, C)


def _own(x: torch.Tensor, group) -> torch.Tensor:
    """This rank's piece of ``x`` along the sequence."""
    size = comm.group_size(group)
    if x.shape[DIM] % size:
        raise ValueError(
            f"sequence parallelism cuts {x.shape[DIM]} positions into {size} equal pieces: not divisible; "
            f"use a sequence length that is a multiple of the tensor-parallel size"
        )
    return x.chunk(size, dim=DIM)[comm.group_rank(group)].contiguous()


class ScatterToSequence(torch.autograd.Function):
    """Replicated (B, T, C) -> this rank's (B, T/tp, C); backward all-gathers the pieces' gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _own(x, group)

    @staticmethod
    def backward(ctx, grad):
        return comm.all_gather_dim(grad.contiguous(), DIM, group=ctx.group), None


class SequenceColumnLinear(torch.autograd.Function):
    """A column-parallel linear on this rank's (B, T/tp, C) positions: all-gather them to (B, T, C),
    multiply by this rank's rows. Only the (B, T/tp, C) piece is kept for backward, which gathers it
    again (Korthikanti et al. 2022, section 4.2.2), and the input's gradient -- partial on each
    rank, from its rows -- is reduce-scattered back to the positions."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        return F.linear(comm.all_gather_dim(x.contiguous(), DIM, group=group), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        full = comm.all_gather_dim(x.contiguous(), DIM, group=ctx.group).to(grad.dtype)  # (B, T, C)
        grad_x = comm.reduce_scatter_dim(grad @ weight.to(grad.dtype), DIM, group=ctx.group).to(x.dtype)
        g, f = grad.reshape(-1, grad.shape[-1]), full.reshape(-1, full.shape[-1])
        grad_w = (g.T @ f).to(weight.dtype)
        grad_b = g.sum(0).to(weight.dtype) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


class ReduceScatterToSequence(torch.autograd.Function):
    """A row-parallel linear's partial (B, T, C) sums -> this rank's summed (B, T/tp, C); backward
    all-gathers."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return comm.reduce_scatter_dim(x.contiguous(), DIM, group=group)

    @staticmethod
    def backward(ctx, grad):
        return comm.all_gather_dim(grad.contiguous(), DIM, group=ctx.group), None


class GatherToReplicated(torch.autograd.Function):
    """(B, T/tp, C) pieces -> (B, T, C), computed alike on every rank from here on (the head); the
    gradient arriving is then the same on every rank, and each keeps its own piece of it."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return comm.all_gather_dim(x.contiguous(), DIM, group=group)

    @staticmethod
    def backward(ctx, grad):
        return _own(grad, ctx.group), None
