"""BART's registry row: an encoder-decoder (two stacks) that tensor-splits and fine-tunes text to text."""

from __future__ import annotations

from glm_dist.families.bart import model as bart
from glm_dist.families.spec import FamilySpec
from glm_dist.models import common

FAMILIES = {
    "bart": FamilySpec(
        bart.FLAVORS,
        bart.bart_config,
        bart.Bart,
        ("denoising",),
        tokenizer_profile="roberta",
        stacks=2,
        tensor_plans=bart.TENSOR_PLANS,
        init_std=common.normal_init_std,
        hf="glm_dist.families.bart.hf",
        hf_classes=("BartForConditionalGeneration",),
        finetune=("seq2seq",),
        decoder_start="eos",
        adapter_sites=("self_attn.out_proj", "cross_attn.out_proj", "fc2"),
    ),
}
