"""Initialising a pipeline stage without building the whole model (``train.init=local``).

By default every rank builds the whole model from the run's seed and copies its stage out of it:
pipelined runs then start exactly where a one-process run starts. At published scale that whole
model does not fit a host (GPT-3 175B is ~700 GB in fp32), so with ``train.init=local`` the model
is only described on the meta device, DeepSpeed's ``PipelineModule`` builds this stage's layers,
and each parameter is drawn from its own generator, seeded by the run's seed and the parameter's
name in the unsplit model. The initial weights therefore do not depend on the layout: every
pipeline and data-parallel layout starts from the same model (only the one-process run, which draws
from one global stream, differs), tensor ranks of a stage draw the same full layer before it is
sliced, and the tied embedding is the same on the first and the last stage.
"""
from __future__ import annotations

import math
import zlib

import torch
from torch import nn


def _draw(name: str, shape: torch.Size, *, family: str, n_layer: int, seed: int) -> torch.Tensor:
    """The family's initial value of the unsplit parameter ``name`` (GPT-2's rule for GPT; the
    BERT rule for encoders), from a generator of its own."""
    *path, leaf = name.split(".")
    if path and "ln" in path[-1]:  # LayerNorm gain and bias (ln_1, ln_f, ln_attn, ...)
        return torch.ones(shape) if leaf == "weight" else torch.zeros(shape)
    if leaf == "bias":
        return torch.zeros(shape)
    std = 0.02
    if family == "gpt" and name.endswith("proj.weight"):  # residual projections, GPT-2's scaling
        std = 0.02 / math.sqrt(2 * n_layer)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen) * std


@torch.no_grad()
def init_stage(module: nn.Module, rename, *, family: str, n_layer: int, seed: int) -> int:
    """Initialise every parameter of this stage's ``module`` (full layers, before tensor slicing)
    under its unsplit name (``rename``); returns how many were set."""
    count = 0
    for key, p in module.named_parameters():
        name = rename(key)
        if name is None:
            raise KeyError(f"pipeline parameter {key!r} has no name in the unsplit model")
        p.copy_(_draw(name, p.shape, family=family, n_layer=n_layer, seed=seed))
        count += 1
    return count
