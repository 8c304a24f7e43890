"""Initialising a pipeline stage without building the whole model (``train.init=local``).

By default every rank builds the whole model from the run's seed and copies its stage out of it:
pipelined runs then start exactly where a one-process run starts. At published scale that whole
model does not fit a host (GPT-3 175B is ~700 GB in fp32), so with ``train.init=local`` the model
is only described on the meta device, DeepSpeed's ``PipelineModule`` builds this stage's layers,
and each parameter is drawn from its own generator, seeded by the run's seed and the parameter's
name in the unsplit model. The initial weights therefore do not depend on the layout: every
pipeline and data-parallel layout starts from the same model (only the one-process run, which draws
from one global stream, differs), tensor ranks of a stage draw the same full layer before it is
sliced, and the tied embedding is the same on the first and the last stage. The std of each draw
is the family's (its registry row's ``init_std``): N(0, 0.02) for BERT, GPT-1 and BART, GPT-2's
residual projections scaled by 1 / sqrt(2 n_layer), T5's Mesh TensorFlow variances scaled by fan-in.
"""

from __future__ import annotations

import zlib
from typing import Callable

import torch
from torch import nn


StdRule = Callable[[str], float]  # a parameter's name in the unsplit model -> the std of its normal draw


def _draw(name: str, shape: torch.Size, *, std: StdRule, seed: int) -> torch.Tensor:
    """The initial value of the unsplit parameter ``name``, from a generator of its own: LayerNorm
    (and T5's RMSNorm) gains 1, biases 0, every other tensor normal with the family's ``std(name)``."""
    *path, leaf = name.split(".")
    if path and "ln" in path[-1]:  # LayerNorm gain and bias (ln_1, ln_f, ln_attn, ...)
        return torch.ones(shape) if leaf == "weight" else torch.zeros(shape)
    if leaf == "bias":
        return torch.zeros(shape)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen) * std(name)


@torch.no_grad()
def init_stage(module: nn.Module, rename, *, std: StdRule, seed: int) -> int:
    """Initialise every parameter of this stage's ``module`` (full layers, before tensor slicing)
    under its unsplit name (``rename``); returns how many were set."""
    count = 0
    for key, p in module.named_parameters():
        name = rename(key)
        if name is None:
            raise KeyError(f"pipeline parameter {key!r} has no name in the unsplit model")
        p.copy_(_draw(name, p.shape, std=std, seed=seed))
        count += 1
    return count


@torch.no_grad()
def init_whole(module: nn.Module, *, std: StdRule, seed: int) -> int:
    """``train.init=local`` without pipeline stages: every parameter of the whole model drawn by the
    same per-parameter rule (so one process starts where a ZeRO-3 run built with
    :func:`partitioned_build` starts)."""
    return init_stage(module, lambda key: key, std=std, seed=seed)


@torch.no_grad()
def partitioned_build(build, ds_config: dict, *, std: StdRule, seed: int) -> nn.Module:
    """ZeRO-3 without a whole-model build: ``build()`` runs under ``deepspeed.zero.Init``, which
    partitions each module's parameters over the data-parallel ranks as soon as the module exists
    (a rank never holds more than one module's parameters whole), then every rank sets its own
    partition of each parameter from the per-parameter rule -- drawing the whole tensor one parameter
    at a time and keeping its slice, with no communication. The weights equal :func:`init_whole`'s."""
    import deepspeed
    import torch.distributed as dist

    with deepspeed.zero.Init(config_dict_or_path=ds_config):
        module = build()
    rank = dist.get_rank() if dist.is_initialized() else 0
    for name, p in module.named_parameters():
        part = p.ds_tensor  # this rank's partition: elements [rank * n, (rank + 1) * n) of the flat, padded tensor
        n = part.ds_numel
        flat = _draw(name, p.ds_shape, std=std, seed=seed).reshape(-1)
        mine = flat[rank * n : (rank + 1) * n]
        part.data.zero_()
        part.data[: mine.numel()].copy_(mine.to(part.dtype))
    return module
