"""BART: a denoising encoder-decoder (Lewis et al. 2019).

Post-LN blocks with biases, learned positions with BART's offset of 2, LayerNorm on the embeddings
of both stacks, GELU, embeddings tied with the output layer (plus a final logits bias). The decoder
starts from EOS (BART's decoder_start_token_id) and reconstructs the original text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glm_dist.models.common import Flavor, ShardPlan, flavor_config

POSITION_OFFSET = 2  # fairseq's learned positions reserve the first two rows


@dataclass(frozen=True)
class BartConfig:
    n_layer: int  # per stack
    n_head: int
    d_model: int
    d_ff: int
    vocab_size: int = 50265
    context_length: int = 1024
    pad_id: int = 1
    layer_norm_eps: float = 1e-5
    dropout: float = 0.0

    @property
    def ffn_width(self) -> int:
        """The FFN's inner width (what tensor parallelism splits), as every transformer family names it."""
        return self.d_ff


class BartAttention(nn.Module):
    def __init__(self, cfg: BartConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.d_model // cfg.n_head  # n_head: this rank's under TP
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(cfg.d_model, cfg.d_model) for _ in range(4))

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        kv: torch.Tensor | None = None,
        causal: bool = False,
        cache: dict | None = None,
    ) -> torch.Tensor:
        """``cache``: keys/values kept for incremental decoding (cross-attention: computed once)."""
        B, T, _ = x.shape
        split = lambda t: t.view(B, -1, self.n_head, self.head_dim).transpose(1, 2)  # noqa: E731
        q = split(self.q_proj(x))
        if kv is not None and cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            src = x if kv is None else kv
            k, v = split(self.k_proj(src)), split(self.v_proj(src))
        past = 0
        if cache is not None:
            if kv is None and "k" in cache:
                past = cache["k"].shape[2]
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        if causal and mask is None and past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            if causal and T > 1:  # one new query (T == 1) sees every cached key: only padding can mask
                causal_mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)
                mask = causal_mask if mask is None else mask & causal_mask
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, -1))


class BartBlock(nn.Module):
    """Post-LN: self-attention, (cross-attention,) FFN -- each followed by residual + LayerNorm."""

    def __init__(self, cfg: BartConfig, *, decoder: bool):
        super().__init__()
        self.decoder = decoder
        self.self_attn, self.ln_self = BartAttention(cfg), nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        if decoder:
            self.cross_attn, self.ln_cross = BartAttention(cfg), nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.fc1, self.fc2 = nn.Linear(cfg.d_model, cfg.d_ff), nn.Linear(cfg.d_ff, cfg.d_model)
        self.ln_ffn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, mask, memory=None, memory_mask=None, cache: dict | None = None):
        self_cache = None if cache is None else cache.setdefault("self", {})
        cross_cache = None if cache is None else cache.setdefault("cross", {})
        x = self.ln_self(x + self.drop(self.self_attn(x, mask, causal=self.decoder, cache=self_cache)))
        if self.decoder:
            x = self.ln_cross(x + self.drop(self.cross_attn(x, memory_mask, kv=memory, cache=cross_cache)))
        return self.ln_ffn(x + self.drop(self.fc2(F.gelu(self.fc1(x)))))


# tensor parallelism (parallel/tensor.py): heads of self- and cross-attention and the FFN width, both stacks
TENSOR_PLANS = {
    BartAttention: ShardPlan(column=("q_proj", "k_proj", "v_proj"), row=("out_proj",), heads="n_head"),
    BartBlock: ShardPlan(column=("fc1",), row=("fc2",)),
}


class BartStack(nn.Module):
    def __init__(self, cfg: BartConfig, *, decoder: bool):
        super().__init__()
        self.position = nn.Embedding(cfg.context_length + POSITION_OFFSET, cfg.d_model)
        self.ln_embed = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.blocks = nn.ModuleList(BartBlock(cfg, decoder=decoder) for _ in range(cfg.n_layer))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, embedded, mask=None, memory=None, memory_mask=None, cache: list[dict] | None = None):
        past = cache[0]["self"]["k"].shape[2] if cache and "self" in cache[0] else 0
        pos = torch.arange(past, past + embedded.shape[1], device=embedded.device) + POSITION_OFFSET
        x = self.drop(self.ln_embed(embedded + self.position(pos)))
        for i, block in enumerate(self.blocks):
            x = block(x, mask, memory, memory_mask, None if cache is None else cache[i])
        return x


def _key_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) keep-mask -> (B, 1, 1, T) boolean for SDPA."""
    return None if mask is None else mask.bool()[:, None, None, :]


class Bart(nn.Module):
    def __init__(self, cfg: BartConfig):
        super().__init__()
        self.cfg = cfg
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.encoder, self.decoder = BartStack(cfg, decoder=False), BartStack(cfg, decoder=True)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.shared.weight  # tied
        self.register_buffer("final_logits_bias", torch.zeros(1, cfg.vocab_size))
        self.activation_checkpointing = False
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(self.shared(input_ids), _key_mask(attention_mask))

    def decode(
        self, decoder_input_ids, memory, memory_mask=None, decoder_mask=None, cache: list[dict] | None = None
    ) -> torch.Tensor:
        """Decoder logits; with ``cache`` (one dict per block, filled in place) pass only new tokens."""
        h = self.decoder(self.shared(decoder_input_ids), _key_mask(decoder_mask), memory, _key_mask(memory_mask), cache)
        return self.lm_head(h) + self.final_logits_bias  # (B, T_dec, V)

    def forward(
        self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        return {"logits": self.decode(decoder_input_ids, self.encode(input_ids, attention_mask), attention_mask)}

    def num_flops_per_token(self, seq_len: int) -> float:
        n = sum(p.numel() for p in self.parameters())
        return 6 * n + 12 * 2 * self.cfg.n_layer * self.cfg.d_model * seq_len


FLAVORS: dict[str, Flavor] = {
    "bart-tiny": Flavor(BartConfig(n_layer=2, n_head=4, d_model=128, d_ff=512, vocab_size=8192, context_length=256)),
    "bart-base": Flavor(BartConfig(n_layer=6, n_head=12, d_model=768, d_ff=3072), 140e6),
    "bart-large": Flavor(BartConfig(n_layer=12, n_head=16, d_model=1024, d_ff=4096), 400e6, 0.02),
}


bart_config = flavor_config(FLAVORS, "BART")
