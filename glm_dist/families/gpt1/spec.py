"""GPT-1's registry row: GPT's layers with post-LN blocks; data parallelism and ZeRO only (the
pipeline cuts GPT-2's blocks)."""
from __future__ import annotations

from glm_dist.families.gpt.spec import GPT_FINETUNE
from glm_dist.families.gpt1 import model as gpt1
from glm_dist.families.spec import FamilySpec
from glm_dist.models import common

FAMILIES = {
    "gpt1": FamilySpec(gpt1.FLAVORS, gpt1.gpt1_config, gpt1.GPT1, ("clm",), next_token_logits=True,
                       init_std=common.normal_init_std,
                       hf="glm_dist.families.gpt1.hf",
                       hf_classes=("OpenAIGPTLMHeadModel",), **GPT_FINETUNE),
}
