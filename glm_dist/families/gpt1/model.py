"""GPT-1 (Radford et al. 2018, "Improving Language Understanding by Generative Pre-Training").

GPT's decoder (``families/gpt/model.py``) with ``post_ln=True``, the original arrangement: post-LN
blocks (``x = LN(x + attn(x))``, ``x = LN(x + mlp(x))``), no final LayerNorm, no LayerNorm on the
embeddings (token + learned position, then dropout), GELU (tanh form), tied input/output embeddings,
every weight drawn from N(0, 0.02) -- GPT-2's depth-scaled residual init came later. transformers'
``OpenAIGPTModel`` is the same network (``glm_dist/families/gpt1/hf.py``). The family is its flavors.
"""

from __future__ import annotations

from glm_dist.families.gpt.model import GPTConfig
from glm_dist.models.common import Flavor, flavor_config

# vocab 40478 = 40,000 BPE merges + the byte/character base, as transformers' openai-gpt.
FLAVORS: dict[str, Flavor] = {
    "gpt1-tiny": Flavor(GPTConfig(n_layer=4, n_head=4, d_model=128, vocab_size=8192, context_length=256, post_ln=True)),
    "gpt1": Flavor(
        GPTConfig(n_layer=12, n_head=12, d_model=768, vocab_size=40478, context_length=512, post_ln=True), 117e6
    ),  # 116.5M
}


gpt1_config = flavor_config(FLAVORS, "GPT-1")
