"""AdamW with decay / no-decay parameter groups (GPT-2/3 practice: no decay on biases and norms)."""
from __future__ import annotations

import torch
from torch import nn

from glm_dist.config.schema import TrainConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Matrices and embeddings (dim >= 2) decay; biases and norm gains (dim < 2) do not."""
    decay, no_decay = [], []
    for p in model.parameters():  # unique parameters: a tied weight appears once
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
            {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]


def build_optimizer(model: nn.Module, t: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, betas=(t.beta1, t.beta2),
                             eps=t.eps)
