"""Optimizers with decay / no-decay parameter groups (no decay on biases and norms): fused AdamW,
LAMB for ALBERT's recipe, Adafactor for T5's, AdaGrad for GloVe's and ELMo's. All can skip a step
(non-finite loss)."""

from __future__ import annotations

import torch
from torch import nn

from glm_dist.config.schema import TrainConfig


def matrix(p: nn.Parameter) -> bool:
    """A matrix or embedding (dim >= 2), judged by the parameter's own shape -- ``ds_shape`` for one
    ZeRO-3 built partitioned, whose ``shape`` is the empty placeholder."""
    return len(getattr(p, "ds_shape", p.shape)) >= 2


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Matrices and embeddings (dim >= 2) decay; biases and norm gains (dim < 2) do not."""
    decay, no_decay = [], []
    for p in model.parameters():  # unique parameters: a tied weight appears once
        if p.requires_grad:
            (decay if matrix(p) else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


class Skippable:
    """Mixin: an optimizer whose next ``step()`` can be cancelled (weights and moments untouched).

    Set ``skip_next`` when any rank saw a non-finite loss. DeepSpeed's ZeRO and bf16 wrappers
    call this optimizer's ``step`` on their fp32 partitions, so one flag covers every stage.
    """

    skip_next = False

    def step(self, closure=None):
        if self.skip_next:
            return None
        return super().step(closure)


class SkippableAdamW(Skippable, torch.optim.AdamW):
    pass


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, as used for ALBERT): Adam's bias-corrected direction plus decoupled
    weight decay, rescaled per tensor by the trust ratio ||w|| / ||update||."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + group["eps"])
                update.add_(p, alpha=group["weight_decay"])
                # The trust ratio stays a 0-dim tensor on p's device: float() on it would wait for the
                # device once per parameter.
                w_norm, u_norm = p.norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.sub_(update.mul_(trust * group["lr"]))
        return None


class SkippableLamb(Skippable, Lamb):
    pass


class SkippableAdafactor(Skippable, torch.optim.Adafactor):
    pass


class AdaGrad(torch.optim.Optimizer):
    """AdaGrad (Duchi et al. 2011) as torch's: sum += g^2 per element, p -= lr g / (sqrt(sum) + eps).

    Written out rather than ``torch.optim.Adagrad`` because DeepSpeed's ZeRO-1/2 rebuilds a torch
    Adagrad over its flat partitions as a single parameter group (dropping the decay groups and the
    skip hook, and failing with more than one group). Its state is made on the first step, for the
    tensors its groups then hold (ZeRO's flat partitions): element-wise, so flattening keeps its meaning."""

    def __init__(
        self,
        params,
        lr: float = 1e-2,
        eps: float = 1e-10,
        initial_accumulator_value: float = 0.0,
        weight_decay: float = 0.0,
    ):
        if initial_accumulator_value < 0:
            raise ValueError(f"initial_accumulator_value={initial_accumulator_value} must be >= 0")
        super().__init__(
            params, dict(lr=lr, eps=eps, initial_accumulator_value=initial_accumulator_value, weight_decay=weight_decay)
        )

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.add(p, alpha=group["weight_decay"]) if group["weight_decay"] else p.grad
                state = self.state[p]
                if not state:
                    state.update(step=torch.zeros(()), sum=torch.full_like(p, group["initial_accumulator_value"]))
                state["step"] += 1
                state["sum"].addcmul_(grad, grad)
                p.addcdiv_(grad, state["sum"].sqrt().add_(group["eps"]), value=-group["lr"])
        return None


class SkippableAdagrad(Skippable, AdaGrad):
    pass


def build_optimizer(model: nn.Module, t: TrainConfig, groups: list[dict] | None = None) -> torch.optim.Optimizer:
    """``groups``: parameter groups made elsewhere (discriminative rates); default ``param_groups``."""
    groups = groups or param_groups(model, t.weight_decay)
    if t.optimizer == "adagrad":  # per-element sums of squared gradients (GloVe, ELMo's bilm-tf)
        return SkippableAdagrad(groups, lr=t.lr, eps=t.eps, initial_accumulator_value=t.adagrad_initial_accumulator)
    if t.optimizer == "lamb":
        return SkippableLamb(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps)
    if t.optimizer == "adafactor":  # factored second moments, no first moment (T5)
        return SkippableAdafactor(groups, lr=t.lr)
    # fused=True: one kernel over all tensors (CPU and CUDA since torch 2.4), ~4x faster than
    # the foreach default on the CPU (bench/train_throughput.py).
    return SkippableAdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, fused=True)
