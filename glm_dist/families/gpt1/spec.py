"""GPT-1's registry row: GPT's model with ``post_ln=True`` flavors; data parallelism and ZeRO only
(the pipeline and the tensor plans cut GPT-2's blocks)."""

from __future__ import annotations

from glm_dist.families.gpt.model import GPT, local_init_std
from glm_dist.families.gpt.spec import GPT_FINETUNE
from glm_dist.families.gpt1 import model as gpt1
from glm_dist.families.spec import FamilySpec

FAMILIES = {
    "gpt1": FamilySpec(
        gpt1.FLAVORS,
        gpt1.gpt1_config,
        GPT,
        ("clm",),
        tokenizer_profile="gpt2",
        next_token_logits=True,
        init_std=local_init_std,
        saved_defaults={"post_ln": True},
        hf="glm_dist.families.gpt1.hf",
        hf_classes=("OpenAIGPTLMHeadModel",),
        **GPT_FINETUNE,
    ),
}
