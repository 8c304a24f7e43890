"""Learning-rate schedules: linear warmup, then cosine / linear decay to ``min_lr_ratio * lr``;
or T5's inverse square root; or ULMFiT's slanted triangular rates.

A pure function of the step, so the scheduler's whole state is the step counter (exact resume).
"""

from __future__ import annotations

import math

from glm_dist.config.schema import TrainConfig


def slanted_triangular(step: int, total: int, *, peak: float, cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """ULMFiT's slanted triangular rates (Howard & Ruder 2018, eq. 3) at step ``step`` (0-based) of
    ``total``: with cut = floor(total cut_frac), p = step / cut for step < cut, else
    1 - (step - cut) / (cut (1 / cut_frac - 1)); eta = peak (1 + p (ratio - 1)) / ratio."""
    cut = max(1, math.floor(total * cut_frac))
    p = step / cut if step < cut else 1 - (step - cut) / (cut * (1 / cut_frac - 1))
    return peak * (1 + max(p, 0.0) * (ratio - 1)) / ratio


def warmup_linear(step: int, total: int, *, peak: float, warmup: float) -> float:
    """Linear warmup over ``warmup`` x total steps (at least one), then linear decay to 0 (BERT's and
    GPT's fine-tuning schedule)."""
    warm = max(1, round(warmup * total))
    return peak * min((step + 1) / warm, max(0.0, (total - step) / max(1, total - warm)))


def lr_at(step: int, t: TrainConfig) -> float:
    """LR for optimizer step ``step`` (0-based)."""
    if t.schedule == "stlr":  # ULMFiT's slanted triangular rates
        return slanted_triangular(step, t.max_steps, peak=t.lr, cut_frac=t.stlr_cut_frac, ratio=t.stlr_ratio)
    if t.schedule == "inverse_sqrt":  # T5: 1/sqrt(max(n, warmup)) -- flat during warmup, no ramp
        return t.lr / math.sqrt(max(step + 1, t.warmup_steps, 1))
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    if t.schedule == "constant":
        return t.lr
    progress = min(1.0, (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps))
    floor = t.lr * t.min_lr_ratio
    if t.schedule == "cosine":
        return floor + 0.5 * (t.lr - floor) * (1 + math.cos(math.pi * progress))
    return t.lr - (t.lr - floor) * progress  # linear
