"""The encoder families' rows: BERT, RoBERTa, ALBERT and ELECTRA share one model (model.py) and one
flavor table, told apart by flavor name prefix, objectives and what they split."""

from __future__ import annotations

from glm_dist.families.bert import model as bert
from glm_dist.families.spec import FamilySpec, PipelineSpec, flavors_named
from glm_dist.models import common

ENCODER_ADAPTERS = ("attn.dense", "ffn.proj")
# BERT's heads: [CLS] classification, span extraction and token classification (transfer/token_tasks.py)
ENCODER_FINETUNE = ("classify", "span", "tokens")
ENCODER_PIPELINE = PipelineSpec(
    "glm_dist.families.bert.pipeline:encoder_pipeline",
    "glm_dist.families.bert.pipeline:encoder_source_name",
    ("mlm",),
    bert.pipeline_refusal,
)


def _encoder(name: str, objectives: tuple[str, ...], *, pipeline: PipelineSpec | None = None, **kw) -> FamilySpec:
    return FamilySpec(
        flavors_named(bert.FLAVORS, name + "-"),
        bert.encoder_config,
        bert.Encoder,
        objectives,
        pipeline=pipeline,
        tensor_plans=bert.TENSOR_PLANS,
        vocab_plans=bert.VOCAB_PLANS,
        sequence_parallel=True,
        init_std=common.normal_init_std,
        hf="glm_dist.families.bert.hf",
        finetune=ENCODER_FINETUNE,
        adapter_sites=ENCODER_ADAPTERS,
        **kw,
    )


FAMILIES = {
    "bert": _encoder(
        "bert",
        ("mlm_nsp", "mlm"),
        pipeline=ENCODER_PIPELINE,
        hf_classes=("BertForPreTraining",),
        tokenizer_profile="bert",
    ),
    "roberta": _encoder(
        "roberta", ("mlm",), pipeline=ENCODER_PIPELINE, hf_classes=("RobertaForMaskedLM",), tokenizer_profile="roberta"
    ),
    "albert": _encoder("albert", ("sop", "mlm"), hf_classes=("AlbertForPreTraining",), tokenizer_profile="albert"),
    # ELECTRA's generator samples replacements from its whole logits: no vocabulary or sequence split
    "electra": FamilySpec(
        flavors_named(bert.FLAVORS, "electra-"),
        bert.encoder_config,
        bert.ElectraPair,
        ("electra",),
        tensor_plans=bert.TENSOR_PLANS,
        hf="glm_dist.families.bert.hf",
        hf_classes=("ElectraForPreTraining",),
        tokenizer_profile="bert",
        exported="discriminator",
        finetune=ENCODER_FINETUNE,
        adapter_sites=ENCODER_ADAPTERS,
    ),
}
