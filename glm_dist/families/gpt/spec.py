"""GPT's registry row: GPT-2/GPT-3 decoders, every layout (data, ZeRO, pipeline, tensor, sequence)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from glm_common.config_bounds import TOKENS
from glm_dist.families.gpt import model as gpt
from glm_dist.families.spec import FamilySpec, PipelineSpec, option
from glm_dist.models import common


@dataclass
class GPTOptions:
    sparse_window: Optional[int] = option(
        "GPT-3 sparse option: odd layers attend to a local causal band of this many tokens", bounds=f"[1, {TOKENS}]"
    )


# GPT's fine-tuning (Radford et al. 2018): the last (extract) token's state through W_y, LM loss as auxiliary.
GPT_FINETUNE = dict(
    finetune=("classify", "entailment", "similarity", "multiple_choice"),
    summary_position=-1,
    finetune_with="glm_dist.transfer.gpt:finetune_gpt",
    adapter_sites=("attn.proj", "mlp.proj"),
)

FAMILIES = {
    "gpt": FamilySpec(
        gpt.FLAVORS,
        gpt.gpt_config,
        gpt.GPT,
        ("clm",),
        tokenizer_profile="gpt2",
        next_token_logits=True,
        init_std=gpt.local_init_std,
        tensor_plans=common.GPT_TENSOR_PLANS,
        vocab_plans=gpt.VOCAB_PLANS,
        sequence_parallel=True,
        pipeline=PipelineSpec(
            "glm_dist.families.gpt.pipeline:gpt_pipeline",
            "glm_dist.families.gpt.pipeline:gpt_source_name",
            ("clm",),
        ),
        hf="glm_dist.families.gpt.hf",
        hf_classes=("GPT2LMHeadModel",),
        options=GPTOptions,
        **GPT_FINETUNE,
    ),
}
