"""T5's registry row: an encoder-decoder (two stacks) that tensor-splits and fine-tunes text to text."""

from __future__ import annotations

from glm_dist.families.spec import FamilySpec
from glm_dist.families.t5 import model as t5

FAMILIES = {
    "t5": FamilySpec(
        t5.FLAVORS,
        t5.t5_config,
        t5.T5,
        ("span_corruption",),
        tokenizer_profile="t5",
        stacks=2,
        tensor_plans=t5.TENSOR_PLANS,
        init_std=t5.local_init_std,
        hf="glm_dist.families.t5.hf",
        hf_classes=("T5ForConditionalGeneration",),
        finetune=("seq2seq",),
        decoder_start="pad",
        adapter_sites=("self_attn.o", "cross_attn.o", "ffn.wo"),
    ),
}
