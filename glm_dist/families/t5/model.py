"""T5 (1.0 and v1.1): the text-to-text encoder-decoder.

Pre-norm blocks with RMS layer norm and no biases; relative position buckets (one bias table per
stack, in its first layer, shared by all its layers; bidirectional in the encoder, causal in the
decoder); no absolute positions; attention logits are not scaled (the init accounts for it).
1.0: ReLU FFN, embeddings tied with the output (logits scaled by d_model^-0.5). v1.1: gated-GELU
FFN, untied output layer. Decoder inputs are the targets shifted right, starting with the pad id.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from glm_dist.models.common import Flavor, ShardPlan, flavor_config


@dataclass(frozen=True)
class T5Config:
    n_layer: int  # per stack
    n_head: int
    d_model: int
    d_ff: int
    d_kv: int = 64
    vocab_size: int = 32128
    context_length: int = 512
    num_buckets: int = 32
    max_distance: int = 128
    gated: bool = False  # v1.1: gated GELU
    tied: bool = True  # 1.0: tied embeddings; v1.1: untied
    layer_norm_eps: float = 1e-6
    dropout: float = 0.0
    pad_id: int = 0

    @property
    def ffn_width(self) -> int:
        """The FFN's inner width (what tensor parallelism splits), as every transformer family names it."""
        return self.d_ff


class RMSNorm(nn.Module):
    """T5's layer norm: scale only, no mean subtraction, no bias."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


def relative_bucket(
    relative: torch.Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """Mesh TensorFlow's bucketing: exact buckets for small distances, log-spaced up to max_distance."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).long() * num_buckets
        relative = relative.abs()
    else:
        relative = -torch.clamp(relative, max=0)
    exact = num_buckets // 2
    large = (
        exact
        + (
            torch.log(relative.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (num_buckets - exact)
        ).long()
    )
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(relative < exact, relative, large)


class T5Attention(nn.Module):
    def __init__(self, cfg: T5Config, *, relative: bool, bidirectional: bool):
        super().__init__()
        inner = cfg.n_head * cfg.d_kv
        self.cfg, self.bidirectional = cfg, bidirectional
        self.n_head = cfg.n_head  # this rank's heads under tensor parallelism (the bias table's columns too)
        self.q, self.k, self.v = (nn.Linear(cfg.d_model, inner, bias=False) for _ in range(3))
        self.o = nn.Linear(inner, cfg.d_model, bias=False)
        self.relative_bias = nn.Embedding(cfg.num_buckets, cfg.n_head) if relative else None

    def position_bias(self, q_len: int, k_len: int, device, past: int = 0) -> torch.Tensor:
        """(1, H, q_len, k_len) bias for queries at positions past .. past + q_len - 1."""
        rel = torch.arange(k_len, device=device)[None, :] - torch.arange(past, past + q_len, device=device)[:, None]
        buckets = relative_bucket(
            rel, bidirectional=self.bidirectional, num_buckets=self.cfg.num_buckets, max_distance=self.cfg.max_distance
        )
        return self.relative_bias(buckets).permute(2, 0, 1)[None]  # (1, H, q, k)

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor | None, kv: torch.Tensor | None = None, cache: dict | None = None
    ) -> torch.Tensor:
        """``bias``: additive, in q's dtype (None: nothing masked, so SDPA may pick a flash kernel);
        ``cache``: keys/values kept for incremental decoding (cross-attention: computed once)."""
        B, T, _ = x.shape
        split = lambda t: t.view(B, -1, self.n_head, self.cfg.d_kv).transpose(1, 2)  # noqa: E731
        q = split(self.q(x))
        if kv is not None and cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            src = x if kv is None else kv
            k, v = split(self.k(src)), split(self.v(src))
        if cache is not None:
            if kv is None and "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        # T5 does not scale by 1/sqrt(d_kv): SDPA's scale=1.0; the bias carries positions and masks.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class T5FFN(nn.Module):
    def __init__(self, cfg: T5Config):
        super().__init__()
        self.gated = cfg.gated
        if cfg.gated:
            self.wi_0, self.wi_1 = (nn.Linear(cfg.d_model, cfg.d_ff, bias=False) for _ in range(2))
        else:
            self.wi = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.wo(F.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x))
        return self.wo(F.relu(self.wi(x)))


class T5Block(nn.Module):
    def __init__(self, cfg: T5Config, *, decoder: bool, first: bool):
        super().__init__()
        self.ln_self = RMSNorm(cfg.d_model, cfg.layer_norm_eps)
        self.self_attn = T5Attention(cfg, relative=first, bidirectional=not decoder)
        if decoder:
            self.ln_cross = RMSNorm(cfg.d_model, cfg.layer_norm_eps)
            self.cross_attn = T5Attention(cfg, relative=False, bidirectional=True)
        self.ln_ffn = RMSNorm(cfg.d_model, cfg.layer_norm_eps)
        self.ffn = T5FFN(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, self_bias, memory=None, cross_bias=None, cache: dict | None = None):
        self_cache = None if cache is None else cache.setdefault("self", {})
        cross_cache = None if cache is None else cache.setdefault("cross", {})
        x = x + self.drop(self.self_attn(self.ln_self(x), self_bias, cache=self_cache))
        if memory is not None:
            x = x + self.drop(self.cross_attn(self.ln_cross(x), cross_bias, kv=memory, cache=cross_cache))
        return x + self.drop(self.ffn(self.ln_ffn(x)))


def _mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) keep-mask -> additive (B, 1, 1, T) bias (0 or -inf-ish)."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def _attention_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype attention's q/k/v come out in: autocast's when it is on (it runs the projections in
    it), else the activations'."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


# tensor parallelism (parallel/tensor.py): heads of self- and cross-attention with their columns of the
# relative-position bias table, and the FFN width (ReLU ``wi`` or gated ``wi_0``/``wi_1``), in both stacks;
# each rank computes the bias of its own heads from its columns of the table
TENSOR_PLANS = {
    T5Attention: ShardPlan(
        column=("q", "k", "v"), row=("o",), heads="n_head", head_tables=("relative_bias",), optional=("relative_bias",)
    ),
    T5FFN: ShardPlan(column=("wi", "wi_0", "wi_1"), row=("wo",), optional=("wi", "wi_0", "wi_1")),
}


class T5Stack(nn.Module):
    def __init__(self, cfg: T5Config, *, decoder: bool):
        super().__init__()
        self.decoder = decoder
        self.blocks = nn.ModuleList(T5Block(cfg, decoder=decoder, first=i == 0) for i in range(cfg.n_layer))
        self.ln_final = RMSNorm(cfg.d_model, cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, mask=None, memory=None, memory_mask=None, cache: list[dict] | None = None):
        T = x.shape[1]
        past = cache[0]["self"]["k"].shape[2] if cache and "self" in cache[0] else 0
        bias = self.blocks[0].self_attn.position_bias(T, past + T, x.device, past)  # (1, H, T, past + T)
        if mask is not None:
            bias = bias + _mask_bias(mask, x.dtype)  # (B, H, T, T)
        if self.decoder:  # causal: no attending to later positions
            bias = bias + torch.triu(torch.full((T, past + T), torch.finfo(x.dtype).min, device=x.device), past + 1)
        # SDPA wants the bias in q's dtype: cast once for every layer, not a (B, H, T, T) copy per layer.
        dtype = _attention_dtype(x)
        bias = bias.to(dtype)
        # Cross-attention has no position bias: without padding it needs no mask at all.
        cross = None if memory_mask is None else _mask_bias(memory_mask, x.dtype).to(dtype)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, bias, memory, cross, None if cache is None else cache[i])
        return self.drop(self.ln_final(x))


def local_init_std(cfg: T5Config) -> Callable[[str], float]:
    """``T5._init``'s variances by parameter name (train.init=local; parallel/init.py): the
    embeddings and an untied output N(0, 1), query (d_model d_kv)^-1/2, key, value, the bias table
    and the FFN input d_model^-1/2, attention output (heads d_kv)^-1/2, FFN output d_ff^-1/2."""
    d, kv, h = cfg.d_model, cfg.d_kv, cfg.n_head
    stds = {
        "shared": 1.0,
        "lm_head": 1.0,
        "q": (d * kv) ** -0.5,
        "k": d**-0.5,
        "v": d**-0.5,
        "o": (h * kv) ** -0.5,
        "relative_bias": d**-0.5,
        "wi": d**-0.5,
        "wi_0": d**-0.5,
        "wi_1": d**-0.5,
        "wo": cfg.d_ff**-0.5,
    }
    return lambda name: stds[name.split(".")[-2]]


class T5(nn.Module):
    def __init__(self, cfg: T5Config):
        super().__init__()
        self.cfg = cfg
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.encoder = T5Stack(cfg, decoder=False)
        self.decoder = T5Stack(cfg, decoder=True)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tied:
            self.lm_head.weight = self.shared.weight
        self.activation_checkpointing = False
        self._init()

    def _init(self) -> None:
        """Mesh TensorFlow's init: variances scaled by fan-in (d_model, d_kv), embeddings N(0, 1)."""
        d, kv, h = self.cfg.d_model, self.cfg.d_kv, self.cfg.n_head
        nn.init.normal_(self.shared.weight, std=1.0)
        if not self.cfg.tied:
            nn.init.normal_(self.lm_head.weight, std=1.0)
        for m in self.modules():
            if isinstance(m, T5Attention):
                nn.init.normal_(m.q.weight, std=(d * kv) ** -0.5)
                for w in (m.k.weight, m.v.weight):
                    nn.init.normal_(w, std=d**-0.5)
                nn.init.normal_(m.o.weight, std=(h * kv) ** -0.5)
                if m.relative_bias is not None:
                    nn.init.normal_(m.relative_bias.weight, std=d**-0.5)
            elif isinstance(m, T5FFN):
                for lin in [m.wi_0, m.wi_1] if m.gated else [m.wi]:
                    nn.init.normal_(lin.weight, std=d**-0.5)
                nn.init.normal_(m.wo.weight, std=self.cfg.d_ff**-0.5)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(self.shared(input_ids), attention_mask)

    def decode(
        self, decoder_input_ids, memory, memory_mask=None, decoder_mask=None, cache: list[dict] | None = None
    ) -> torch.Tensor:
        """Decoder logits; with ``cache`` (one dict per block, filled in place) pass only new tokens."""
        h = self.decoder(self.shared(decoder_input_ids), decoder_mask, memory, memory_mask, cache)
        if self.cfg.tied:
            h = h * self.cfg.d_model**-0.5
        return self.lm_head(h)  # (B, T_dec, V)

    def forward(
        self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        memory = self.encode(input_ids, attention_mask)
        return {"logits": self.decode(decoder_input_ids, memory, attention_mask)}

    def num_flops_per_token(self, seq_len: int) -> float:
        n = sum(p.numel() for p in self.parameters())
        return 6 * n + 12 * 2 * self.cfg.n_layer * self.cfg.n_head * self.cfg.d_kv * seq_len


V11 = dict(gated=True, tied=False)
FLAVORS: dict[str, Flavor] = {
    "t5-tiny": Flavor(T5Config(n_layer=2, n_head=4, d_model=128, d_ff=512, d_kv=32, vocab_size=8192)),
    # The paper's sizes are rounded names (large "770M" is 737.7M, 3B is 2.85B); our counts equal
    # transformers' T5ForConditionalGeneration exactly, and the tolerance says how rounded each name is.
    "t5-small": Flavor(T5Config(n_layer=6, n_head=8, d_model=512, d_ff=2048), 60e6, 0.02),
    "t5-base": Flavor(T5Config(n_layer=12, n_head=12, d_model=768, d_ff=3072), 220e6, 0.02),
    "t5-large": Flavor(T5Config(n_layer=24, n_head=16, d_model=1024, d_ff=4096), 770e6, 0.05, "rounded name"),
    "t5-3b": Flavor(T5Config(n_layer=24, n_head=32, d_model=1024, d_ff=16384, d_kv=128), 3e9, 0.05, "rounded name"),
    "t5-11b": Flavor(T5Config(n_layer=24, n_head=128, d_model=1024, d_ff=65536, d_kv=128), 11e9, 0.03, "rounded name"),
    "t5-v1_1-tiny": Flavor(T5Config(n_layer=2, n_head=4, d_model=128, d_ff=256, d_kv=32, vocab_size=8192, **V11)),
    "t5-v1_1-small": Flavor(T5Config(n_layer=8, n_head=6, d_model=512, d_ff=1024, **V11)),
    "t5-v1_1-base": Flavor(T5Config(n_layer=12, n_head=12, d_model=768, d_ff=2048, **V11)),
    "t5-v1_1-large": Flavor(T5Config(n_layer=24, n_head=16, d_model=1024, d_ff=2816, **V11)),
    "t5-v1_1-xl": Flavor(T5Config(n_layer=24, n_head=32, d_model=2048, d_ff=5120, **V11)),
    "t5-v1_1-xxl": Flavor(T5Config(n_layer=24, n_head=64, d_model=4096, d_ff=10240, **V11)),
}


t5_config = flavor_config(FLAVORS, "T5")
