"""The one place DeepSpeed is applied to a model (docs/architecture.md, decision 1)."""

from __future__ import annotations

import contextlib
import importlib
import math

import torch
from torch import nn

from glm_dist.config.deepspeed_json import deepspeed_config
from glm_dist.config.schema import Config

# DeepSpeed's optimizer wrappers that read their gradient checks on the host (OnDeviceChecks)
WRAPPER_MODULES = (
    "deepspeed.runtime.bf16_optimizer",
    "deepspeed.runtime.zero.stage_1_and_2",
    "deepspeed.runtime.zero.stage3",
)


def build_engine(model: nn.Module, optimizer: torch.optim.Optimizer, cfg: Config, *, dp_size: int, mpu=None):
    """Wrap ``model`` in a DeepSpeed engine (ZeRO stage, bf16, clipping from ``cfg``). ``mpu``: the
    data/tensor process groups under tensor parallelism (a pipeline module brings its own)."""
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, mpu=mpu, config=deepspeed_config(cfg, dp_size=dp_size)
    )
    if engine.optimizer is not optimizer and fused_adam(optimizer) and not cfg.parallel.offload_optimizer:
        OnDeviceChecks(engine.optimizer, optimizer).install()
    return engine


def fused_adam(optimizer: torch.optim.Optimizer) -> bool:
    """torch's fused Adam/AdamW: its kernel takes a ``found_inf`` flag on the device."""
    return isinstance(optimizer, torch.optim.Adam) and all(g.get("fused") for g in optimizer.param_groups)


class OnDeviceChecks:
    """A DeepSpeed wrapper's ``step`` with its gradient checks kept on the device.

    BF16_Optimizer and ZeRO-1/2/3 ask "is the gradient norm finite?", ZeRO-1/2 in bf16 also "does a
    gradient hold an inf or NaN?" and BF16_Optimizer "does clipping scale down?", each with a
    ``bool(tensor)``: a host sync, two to four per step. During the step the norm check answers
    "finite" and hands its real answer to the fused Adam kernel as ``found_inf`` (which then leaves
    weights, moments and step count as they were: a bad step is still skipped, on the device);
    clipping multiplies by min(1, clip / norm) whatever the norm (by 1.0 exactly when it would not
    clip); the per-gradient scan is left out (any inf or NaN gradient makes the norm non-finite).
    Offloaded optimizer states keep DeepSpeed's checks (their flags are host values anyway)."""

    def __init__(self, wrapper, base: torch.optim.Optimizer):
        self.wrapper, self.base, self.wrapped_step = wrapper, base, wrapper.step
        self.is_invalid = importlib.import_module("deepspeed.runtime.utils").is_invalid_grad_norm

    def install(self) -> None:
        self.wrapper.step = self.step
        if hasattr(self.wrapper, "check_overflow"):
            self.wrapper.check_overflow = lambda *args, **kwargs: None  # leaves wrapper.overflow False

    def step(self, closure=None):
        self.base.found_inf = None
        try:
            with self._deferred():
                self.wrapped_step(closure)
        finally:
            found, self.base.found_inf = self.base.found_inf, None
        norm = getattr(self.wrapper, "_global_grad_norm", None)
        if found is not None and torch.is_tensor(norm):  # a skipped step's norm reads inf, as DeepSpeed's
            self.wrapper._global_grad_norm = torch.where(found > 0, math.inf, norm)

    @contextlib.contextmanager
    def _deferred(self):
        """The wrappers' modules call our check and clip while the step runs."""
        swapped = []
        ours_by_name = {"is_invalid_grad_norm": self._invalid, "clip_tensors_by_global_norm": clip_on_device}
        for module in map(importlib.import_module, WRAPPER_MODULES):
            for name, ours in ours_by_name.items():
                if hasattr(module, name):
                    swapped.append((module, name, getattr(module, name)))
                    setattr(module, name, ours)
        try:
            yield
        finally:
            for module, name, theirs in swapped:
                setattr(module, name, theirs)

    def _invalid(self, norm) -> bool:
        if not torch.is_tensor(norm):
            return self.is_invalid(norm)
        bad = (~torch.isfinite(norm) | (norm < 0)).float().reshape(())  # DeepSpeed marks a non-finite norm -1
        found = self.base.found_inf
        self.base.found_inf = bad if found is None else torch.maximum(found, bad)
        return False


def clip_on_device(input_tensors, max_norm=1.0, global_norm=None, mpu=None, eps=1e-6):
    """DeepSpeed's ``clip_tensors_by_global_norm`` for a norm already computed, without reading it."""
    torch._foreach_mul_(list(input_tensors), torch.clamp(max_norm / (global_norm + eps), max=1.0))
    return global_norm


def set_lr(engine, lr: float) -> None:
    """Set the LR on every parameter group, times its ``lr_scale`` where it has one (discriminative
    fine-tuning, transfer/tricks.py; ZeRO optimizers expose the wrapped groups with their keys)."""
    for group in engine.optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
