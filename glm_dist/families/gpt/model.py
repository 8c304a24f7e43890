"""GPT-2 / GPT-3 decoder, as the GPT-2 paper describes it, and GPT-1 by one config field.

Pre-LN blocks, a final LayerNorm, learned absolute positions, tied input/output embeddings, GELU,
residual projections initialised with std 0.02 / sqrt(2 * n_layer). ``post_ln=True`` is GPT-1's
arrangement (Radford et al. 2018; ``families/gpt1``): the norms after each residual sum, no final
LayerNorm, every weight N(0, 0.02) -- GPT-2 moved the norms and scaled the residual init. The model is an ordered list
of layers -- ``GPTEmbedding``, ``n_layer`` x ``GPTBlock``, ``GPTHead`` -- so pipeline stages can be cut
from the same definition (``GPT.layers()``).

``pad_vocab_to_multiple_of`` stores the tied embedding with its rows rounded up (128: GPT-2's 50257
-> 50304, as Megatron-LM and nanoGPT do) so the output matmuls get tensor-core-friendly shapes. The
model stays the unpadded one: its logits are the real vocabulary's, the loss never puts the padding
in its softmax (``ops/cross_entropy.py``'s ``vocab_padding``), parameter counts, FLOPs and exports
leave the padding out, and an unpadded state dict (a checkpoint from before, a transformers model)
loads with zero padding rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from glm_dist.models.common import (
    Flavor,
    MLP,
    CausalSelfAttention,
    OutputLinear,
    VocabPlan,
    count_parameters,
    init_gpt_weights,
    flavor_config,
    pad_vocab_rows,
    padded_size,
)
from glm_dist.ops.cross_entropy import real_logits, vocab_padding


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int = 50257
    context_length: int = 1024
    d_ff: int | None = None  # None: 4 * d_model
    dropout: float = 0.0
    sparse_window: int | None = None  # GPT-3: odd layers use a local band of this width
    layer_norm_eps: float = 1e-5
    pad_vocab_to_multiple_of: int = 1  # the embedding's rows rounded up to a multiple of this (1: vocab_size)
    post_ln: bool = False  # GPT-1: post-LN blocks, no final LayerNorm, unscaled residual init

    @property
    def ffn_width(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token embedding and the output matrix: ``vocab_size`` and its padding."""
        return padded_size(self.vocab_size, self.pad_vocab_to_multiple_of)


# The GPT-3 paper names sizes with two significant figures ("350M" is 355.9M with its own
# layer/width table); those rows allow 2% and say so. GPT-2 counts equal transformers' exactly.
ROUNDED = "the paper's name is rounded; layers/width/heads are the paper's"
FLAVORS: dict[str, Flavor] = {
    "tiny": Flavor(GPTConfig(n_layer=4, n_head=4, d_model=128, vocab_size=8192, context_length=256)),
    "gpt2-small": Flavor(GPTConfig(n_layer=12, n_head=12, d_model=768), 124e6),  # 124.4M
    "gpt2-medium": Flavor(
        GPTConfig(n_layer=24, n_head=16, d_model=1024),
        350e6,  # 354.8M
        0.02,
        ROUNDED,
    ),
    "gpt2-large": Flavor(GPTConfig(n_layer=36, n_head=20, d_model=1280), 774e6),  # 774.0M
    "gpt2-xl": Flavor(GPTConfig(n_layer=48, n_head=25, d_model=1600), 1.56e9),  # 1.558B
    # GPT-3 (Brown et al. 2020, table 2.1); context 2048.
    "gpt3-small": Flavor(GPTConfig(n_layer=12, n_head=12, d_model=768, context_length=2048), 125e6),
    "gpt3-medium": Flavor(
        GPTConfig(n_layer=24, n_head=16, d_model=1024, context_length=2048), 350e6, 0.02, ROUNDED
    ),  # 355.9M
    "gpt3-large": Flavor(GPTConfig(n_layer=24, n_head=16, d_model=1536, context_length=2048), 760e6),
    # The paper prints 24 heads for xl, which does not divide 2048; 16 heads of 128 as Megatron.
    "gpt3-xl": Flavor(
        GPTConfig(n_layer=24, n_head=16, d_model=2048, context_length=2048), 1.3e9, 0.02, ROUNDED
    ),  # 1.316B
    "gpt3-2.7b": Flavor(
        GPTConfig(n_layer=32, n_head=32, d_model=2560, context_length=2048), 2.7e9, 0.02, ROUNDED
    ),  # 2.652B
    "gpt3-6.7b": Flavor(GPTConfig(n_layer=32, n_head=32, d_model=4096, context_length=2048), 6.7e9),
    # The paper prints d_model 5140, which 40 heads do not divide; 5120 as Megatron-DeepSpeed.
    "gpt3-13b": Flavor(
        GPTConfig(n_layer=40, n_head=40, d_model=5120, context_length=2048), 13e9, 0.02, ROUNDED
    ),  # 12.85B
    "gpt3-175b": Flavor(GPTConfig(n_layer=96, n_head=96, d_model=12288, context_length=2048), 175e9),
}


gpt_config = flavor_config(FLAVORS, "GPT")


VOCAB_MATRICES = ("embed.wte.weight", "head.lm_head.weight")  # (padded vocab, C), one tied tensor


def unpadded_state_dict(sd: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """``sd`` with the vocabulary matrices cut to the real vocabulary's rows (views): what transformers
    holds."""
    return {key: value[: cfg.vocab_size] if key in VOCAB_MATRICES else value for key, value in sd.items()}


def local_init_std(cfg: GPTConfig) -> Callable[[str], float]:
    """GPT-2's rule by parameter name (train.init=local; parallel/init.py): N(0, 0.02), the residual
    projections 0.02 / sqrt(2 n_layer) (GPT-1: 0.02) -- what ``init_gpt_weights`` draws from one stream."""
    scaled = 0.02 if cfg.post_ln else 0.02 / math.sqrt(2 * cfg.n_layer)
    return lambda name: scaled if name.endswith("proj.weight") else 0.02


class GPTEmbedding(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.d_model)  # ids never reach the padding rows
        pad_vocab_rows(self.wte, cfg.vocab_size)
        self.wpe = nn.Embedding(cfg.context_length, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: torch.Tensor, past: int = 0) -> torch.Tensor:
        T = input_ids.shape[1]
        pos = torch.arange(past, past + T, device=input_ids.device)
        return self.drop(self.wte(input_ids) + self.wpe(pos))  # (B, T, C)


class GPTBlock(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int):
        super().__init__()
        self.post_ln = cfg.post_ln
        sparse = cfg.sparse_window is not None and layer_idx % 2 == 1
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(
            cfg.d_model, cfg.n_head, dropout=cfg.dropout, window=cfg.sparse_window if sparse else None
        )
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg.d_model, cfg.ffn_width, dropout=cfg.dropout)

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        if self.post_ln:  # GPT-1: each norm follows its residual sum
            x = self.ln_1(x + self.attn(x, cache))  # (B, T, C)
            return self.ln_2(x + self.mlp(x))
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


class GPTHead(nn.Module):
    """Final LayerNorm and the output projection, whose weight is the token embedding's."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        # post-LN: the last block's ln_2 is the final norm
        self.ln_f = nn.Identity() if cfg.post_ln else nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.lm_head = OutputLinear(cfg.d_model, cfg.padded_vocab_size, bias=False)
        self.padding_columns = cfg.padded_vocab_size - cfg.vocab_size  # the output's last ones
        pad_vocab_rows(self.lm_head, cfg.vocab_size)

    def forward(self, x: torch.Tensor, project: Callable | None = None):
        """(B, T, C) -> (B, T, vocab) logits of the real vocabulary, or ``project(ln_f(x), weight, None)``
        (OutputLinear), a loss that sees the padded weight and leaves its padding out (``vocab_padding``)."""
        if not self.padding_columns:
            return self.lm_head(self.ln_f(x), project)
        with vocab_padding(self.padding_columns):
            out = self.lm_head(self.ln_f(x), project)
            return out if project is not None else real_logits(out)


class GPT(nn.Module):
    fused_loss = True  # forward takes ``project``: a loss can skip the logits (glm plan counts it)

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = GPTEmbedding(cfg)
        self.blocks = nn.ModuleList(GPTBlock(cfg, i) for i in range(cfg.n_layer))
        self.head = GPTHead(cfg)
        self.head.lm_head.weight = self.embed.wte.weight  # tied input/output embedding
        self.activation_checkpointing = False
        init_gpt_weights(self, n_layer=cfg.n_layer, scale_residuals=not cfg.post_ln)

    def layers(self) -> list[nn.Module]:
        """The model as an ordered list: embedding, blocks, head."""
        return [self.embed, *self.blocks, self.head]

    def forward(self, input_ids: torch.Tensor, cache: list[dict] | None = None, *, project: Callable | None = None):
        """(B, T) token ids -> (B, T, vocab) logits. ``cache`` (one dict per block, filled in
        place) makes decoding incremental: pass only the new tokens. ``project(hidden, weight,
        bias)`` replaces the output matmul on the final (B, T, C) hidden states -- e.g. a fused
        cross entropy, or ``lambda h, w, b: h`` for the hidden states themselves."""
        past = cache[0]["k"].shape[2] if cache and "k" in cache[0] else 0
        if past + input_ids.shape[1] > self.cfg.context_length:
            raise ValueError(
                f"sequence length {past + input_ids.shape[1]} exceeds the context length {self.cfg.context_length}"
            )
        x = self.embed(input_ids, past)
        for i, block in enumerate(self.blocks):
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x, None if cache is None else cache[i])
        return self.head(x, project)

    def add_tokens(self, count: int, *, std: float = 0.02) -> int:
        """Grow the vocabulary by ``count`` tokens, their (tied) rows drawn from N(0, std); returns the
        first new id (the old ``vocab_size``). The output shares the matrix, so the model scores the new
        tokens too. A padded vocabulary (``pad_vocab_to_multiple_of``) gives them its first padding rows
        when they fit -- the matrix keeps its shape and storage, only the padding shrinks; otherwise it
        grows to the new size padded again, the real rows kept."""
        first = self.cfg.vocab_size
        cfg = replace(self.cfg, vocab_size=first + count)
        weight = self.embed.wte.weight  # (padded vocab, C)
        with torch.no_grad():
            if cfg.padded_vocab_size != weight.shape[0]:  # past the padding: real rows kept, zero padding
                grown = weight.new_zeros(cfg.padded_vocab_size, weight.shape[1])
                grown[:first] = weight[:first]
                weight = nn.Parameter(grown)
            nn.init.normal_(weight[first : first + count], std=std)
        if hasattr(weight, "vocab_rows"):
            del weight.vocab_rows  # the old vocabulary's mark; the new modules set the new one
        with torch.device("meta"):  # the modules __init__ builds for the new size, around the kept matrix
            self.embed.wte = nn.Embedding(cfg.padded_vocab_size, cfg.d_model)
            self.head.lm_head = OutputLinear(cfg.d_model, cfg.padded_vocab_size, bias=False)
        self.embed.wte.weight = self.head.lm_head.weight = weight
        pad_vocab_rows(self.embed.wte, cfg.vocab_size)
        pad_vocab_rows(self.head.lm_head, cfg.vocab_size)
        self.head.padding_columns = cfg.padded_vocab_size - cfg.vocab_size
        self.cfg = cfg
        return first

    def num_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), PaLM appendix B:
        6 N for the weights (the real vocabulary's) + 12 L d T for attention scores."""
        n = count_parameters(self) - self.embed.wpe.weight.numel()
        return 6 * n + 12 * self.cfg.n_layer * self.cfg.d_model * seq_len


# tensor parallelism by vocabulary: the token embedding's rows and the tied output's columns
VOCAB_PLANS = {GPTEmbedding: VocabPlan(embedding="wte"), GPTHead: VocabPlan(outputs=("lm_head",))}
