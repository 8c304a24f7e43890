"""Building blocks shared by the model families. No distribution code here (ARCHITECTURE.md, 2)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention on ``scaled_dot_product_attention``.

    ``window``: when set, each query sees only the previous ``window`` positions (itself
    included) -- the locally banded pattern of GPT-3's sparse layers.
    """

    def __init__(self, d_model: int, n_head: int, *, dropout: float = 0.0, window: int | None = None):
        super().__init__()
        assert d_model % n_head == 0, f"n_head={n_head} must divide d_model={d_model}"
        self.n_head, self.window, self.dropout = n_head, window, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.resid_drop = nn.Dropout(dropout)
        self._band_cache: dict[tuple[int, torch.device], torch.Tensor] = {}

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        """``cache``: a dict this layer keeps its keys/values in, for incremental decoding."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=2)  # each (B, T, width): width = d_model, or this rank's heads
        width = q.shape[-1]
        # (B, T, width) -> (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        past = 0
        if cache is not None:
            if "k" in cache:
                past = cache["k"].shape[2]
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        p = self.dropout if self.training else 0.0
        if past == 0 and (self.window is None or self.window >= T):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self._band(T, x.device, past=past), dropout_p=p)
        y = y.transpose(1, 2).contiguous().view(B, T, width)
        return self.resid_drop(self.proj(y))

    def _band(self, T: int, device: torch.device, past: int = 0) -> torch.Tensor:
        """(T, past + T) boolean: causal, and within the window for sparse layers."""
        key = (T, past, device)
        if key not in self._band_cache:
            q = torch.arange(past, past + T, device=device)
            offset = q[:, None] - torch.arange(past + T, device=device)[None, :]  # query minus key position
            allowed = offset >= 0
            if self.window is not None:
                allowed &= offset < self.window
            self._band_cache[key] = allowed
        return self._band_cache[key]


class MLP(nn.Module):
    """Position-wise feed-forward: Linear -> GELU (tanh approximation, as GPT-2) -> Linear."""

    def __init__(self, d_model: int, d_ff: int, *, dropout: float = 0.0):
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff)
        self.proj = nn.Linear(d_ff, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


def init_gpt_weights(module: nn.Module, *, n_layer: int, std: float = 0.02) -> None:
    """GPT-2 init: N(0, 0.02) weights, zero biases, unit norms; residual projections (the
    ``proj`` of attention and MLP) get std / sqrt(2 * n_layer) so the residual stream's variance
    does not grow with depth."""
    for name, p in module.named_parameters():
        if name.endswith("proj.weight"):
            nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * n_layer))
        elif name.endswith(".bias"):
            nn.init.zeros_(p)
        elif "ln" in name.split(".")[-2]:
            nn.init.ones_(p)
        else:
            nn.init.normal_(p, mean=0.0, std=std)


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (tied weights counted once); works on the meta device."""
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class Flavor:
    """A named size: its config, the published parameter count as REFERENCE.md prints it (0 for
    test flavors), the relative tolerance of the count check, and why the tolerance is what it is."""

    cfg: Any
    params: float = 0
    tol: float = 0.01
    note: str = ""
