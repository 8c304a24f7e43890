"""The one place DeepSpeed is applied to a model (docs/architecture.md, decision 1)."""
from __future__ import annotations

import torch
from torch import nn

from glm_dist.config.deepspeed_json import deepspeed_config
from glm_dist.config.schema import Config


def build_engine(model: nn.Module, optimizer: torch.optim.Optimizer, cfg: Config, *, dp_size: int, mpu=None):
    """Wrap ``model`` in a DeepSpeed engine (ZeRO stage, bf16, clipping from ``cfg``). ``mpu``: the
    data/tensor process groups under tensor parallelism (a pipeline module brings its own)."""
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=mpu,
                                           config=deepspeed_config(cfg, dp_size=dp_size))
    return engine


def set_lr(engine, lr: float) -> None:
    """Set the LR on every parameter group, times its ``lr_scale`` where it has one (discriminative
    fine-tuning, transfer/tricks.py; ZeRO optimizers expose the wrapped groups with their keys)."""
    for group in engine.optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
