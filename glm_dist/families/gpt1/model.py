"""GPT-1 (Radford et al. 2018, "Improving Language Understanding by Generative Pre-Training").

GPT-2's decoder with the original arrangement: post-LN blocks (``x = LN(x + attn(x))``,
``x = LN(x + mlp(x))``), no final LayerNorm, no LayerNorm on the embeddings (token + learned
position, then dropout), GELU (tanh form), tied input/output embeddings, every weight drawn from
N(0, 0.02) -- GPT-2's depth-scaled residual init came later. transformers' ``OpenAIGPTModel`` is
the same network (``glm_dist/families/gpt1/hf.py``). The layer list and the forward are GPT's.
"""
from __future__ import annotations


import torch
from torch import nn

from glm_dist.models.common import Flavor, flavor_config
from glm_dist.families.gpt.model import GPT, GPTBlock, GPTConfig, GPTEmbedding, GPTHead

# vocab 40478 = 40,000 BPE merges + the byte/character base, as transformers' openai-gpt.
FLAVORS: dict[str, Flavor] = {
    "gpt1-tiny": Flavor(GPTConfig(n_layer=4, n_head=4, d_model=128, vocab_size=8192, context_length=256)),
    "gpt1": Flavor(GPTConfig(n_layer=12, n_head=12, d_model=768, vocab_size=40478, context_length=512),
                   117e6),  # 116.5M
}


gpt1_config = flavor_config(FLAVORS, "GPT-1")


class GPT1Block(GPTBlock):
    """Post-LN: the norms follow each residual sum (GPT-2 moved them before each sublayer)."""

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        x = self.ln_1(x + self.attn(x, cache))  # (B, T, C)
        return self.ln_2(x + self.mlp(x))


class GPT1(GPT):
    def __init__(self, cfg: GPTConfig):
        nn.Module.__init__(self)  # GPT's parts, with post-LN blocks and no final norm
        self.cfg = cfg
        self.embed = GPTEmbedding(cfg)
        self.blocks = nn.ModuleList(GPT1Block(cfg, i) for i in range(cfg.n_layer))
        self.head = GPTHead(cfg)
        self.head.ln_f = nn.Identity()  # the last block's ln_2 is the final norm
        self.head.lm_head.weight = self.embed.wte.weight  # tied input/output embedding
        self.activation_checkpointing = False
        self.apply(_init)


def _init(module: nn.Module) -> None:
    """GPT-1 / transformers' OpenAIGPT init: N(0, 0.02) weights and embeddings, zero biases, unit norms."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
