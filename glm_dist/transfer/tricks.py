"""Fine-tuning tricks for every family (``glm finetune`` options; ``glm train`` takes the first two).

ULMFiT's three (Howard & Ruder 2018, section 3.2 and 3.3):

- Discriminative fine-tuning (``--discriminative-lr 2.6``): the model is cut into layer groups,
  bottom to top (``layer_groups``), and group l learns at eta^l = eta^(l+1) / 2.6, the top group
  (the task head, or the LM's top layer) at the peak rate. Each optimizer group carries its
  ``lr_scale`` (``set_lr`` multiplies it in), so the schedule stays one number.
- Slanted triangular learning rates (``--schedule stlr``): with T steps, cut = floor(T cut_frac) and
  p = t / cut for t < cut, else 1 - (t - cut) / (cut (1 / cut_frac - 1)); eta_t = eta_max (1 + p (ratio - 1))
  / ratio, cut_frac 0.1, ratio 32.
- Gradual unfreezing (``--gradual-unfreezing``): in epoch e (from 0) only the top e + 1 layer groups
  train; from epoch L - 1 on, all of them.

Adapters (Houlsby et al. 2019; ``--adapters 64``): a bottleneck h + W_up GELU(W_down h) after the
output projection of every attention and feed-forward sublayer of the transformer blocks (the
family spec's ``adapter_sites``), initialised near the identity (weights N(0, 1e-2) truncated at two
standard deviations, zero biases); the pretrained weights are frozen except the layer norms, as in
the paper -- the adapters, the norms and the task head train.

Layer groups and discriminative parameter groups live in ``train/layer_groups.py`` (``glm train`` reads
them too); the schedules in ``train/schedule.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glm_dist.train.layer_groups import TrickError, discriminative_param_groups, layer_groups
from glm_dist.train.schedule import slanted_triangular, warmup_linear


# -- gradual unfreezing ---------------------------------------------------------------------------------
def unfreeze_top(groups: list[list[nn.Parameter]], count: int, trainable: set[int]) -> None:
    """Only the top ``count`` groups' parameters (of the ``trainable`` ones) take gradients."""
    for i, group in enumerate(groups):
        for p in group:
            p.requires_grad_(id(p) in trainable and i >= len(groups) - count)


# -- adapters -------------------------------------------------------------------------------------------
class Adapter(nn.Module):
    """Houlsby et al. 2019: h + W_up GELU(W_down h), a bottleneck of ``size`` with its own skip."""

    def __init__(self, dim: int, size: int, *, std: float = 1e-2):
        super().__init__()
        self.down, self.up = nn.Linear(dim, size), nn.Linear(size, dim)
        for layer in (self.down, self.up):
            nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
            nn.init.zeros_(layer.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.up(F.gelu(self.down(h)))


def _adapt(module: nn.Module, _inputs, output: torch.Tensor) -> torch.Tensor:
    return module.adapter(output)


def add_adapters(model: nn.Module, sites: tuple[str, ...], size: int) -> list[Adapter]:
    """An ``Adapter`` after every linear layer whose name ends with one of ``sites`` (the sublayers'
    output projections), as its child module ``adapter`` (a forward hook applies it; the pretrained
    weights keep their names). A module shared by several blocks (ALBERT) gets one adapter."""
    adapters, done = [], set()
    for name, module in model.named_modules():
        if (
            isinstance(module, nn.Linear)
            and id(module) not in done
            and any(name == s or name.endswith("." + s) for s in sites)
        ):
            done.add(id(module))
            module.adapter = Adapter(module.out_features, size).to(module.weight.device)
            module.register_forward_hook(_adapt)
            adapters.append(module.adapter)
    return adapters


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("Norm")


# -- one object per fine-tuning run -----------------------------------------------------------------------
@dataclass
class Tricks:
    """What ``glm finetune``'s options ask for; ``prepare`` applies them to a transfer model."""

    schedule: str = "linear"  # linear (warmup, then decay to 0) | stlr
    warmup: float = 0.1  # linear: warmup fraction of the steps
    discriminative_lr: float = 0.0  # 0: one rate for all; ULMFiT: 2.6
    gradual_unfreezing: bool = False
    adapters: int = 0  # bottleneck size (0: none)
    cut_frac: float = 0.1
    ratio: float = 32.0

    @classmethod
    def from_args(cls, args) -> "Tricks":
        if args.schedule not in ("linear", "stlr"):
            raise TrickError(f"--schedule {args.schedule!r}: linear or stlr")
        if args.discriminative_lr < 0 or 0 < args.discriminative_lr < 1:
            raise TrickError(f"--discriminative-lr {args.discriminative_lr}: a factor >= 1 (ULMFiT: 2.6), or 0 for off")
        if args.adapters < 0:
            raise TrickError(f"--adapters {args.adapters}: a bottleneck size >= 1, or 0 for none")
        return cls(args.schedule, args.warmup, args.discriminative_lr, args.gradual_unfreezing, args.adapters)

    def prepare(
        self,
        model: nn.Module,
        backbone: nn.Module,
        head: nn.Module | None,
        *,
        adapter_sites: tuple[str, ...] = (),
        weight_decay: float,
    ) -> list[dict]:
        """Adapters in ``backbone`` (the rest frozen but its norms), the layer groups of ``backbone``
        + ``head``, the first epoch's freezing; returns the optimizer's parameter groups."""
        if self.adapters:
            if not adapter_sites:
                raise TrickError(
                    f"--adapters sit in transformer blocks; {type(backbone).__name__} has none "
                    "(its family spec lists no adapter_sites)"
                )
            adapters = add_adapters(backbone, adapter_sites, self.adapters)
            keep = {id(p) for m in (*adapters, *(m for m in backbone.modules() if _is_norm(m))) for p in m.parameters()}
            for p in backbone.parameters():
                p.requires_grad_(id(p) in keep)
        self.groups = layer_groups(backbone, head)
        self.trainable = {id(p) for p in model.parameters() if p.requires_grad}
        if self.discriminative_lr:
            param_groups = discriminative_param_groups(
                self.groups, factor=self.discriminative_lr, weight_decay=weight_decay
            )
        else:
            param_groups = discriminative_param_groups(
                [[p for g in self.groups for p in g]], factor=1.0, weight_decay=weight_decay
            )
        self.start_epoch(0)
        return param_groups

    def start_epoch(self, epoch: int) -> None:
        """Gradual unfreezing: epoch ``epoch`` (from 0) trains the top epoch + 1 groups."""
        count = epoch + 1 if self.gradual_unfreezing else len(self.groups)
        unfreeze_top(self.groups, count, self.trainable)

    def lr(self, step: int, total: int, peak: float) -> float:
        if self.schedule == "stlr":
            return slanted_triangular(step, total, peak=peak, cut_frac=self.cut_frac, ratio=self.ratio)
        return warmup_linear(step, total, peak=peak, warmup=self.warmup)

    def describe(self) -> dict:
        return {
            "schedule": self.schedule,
            "discriminative_lr": self.discriminative_lr,
            "gradual_unfreezing": self.gradual_unfreezing,
            "adapters": self.adapters,
            "layer_groups": len(self.groups),
        }
