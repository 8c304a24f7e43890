"""The model families: one row per family (docs/architecture.md, decision 10).

A row says everything the rest of the library asks about a family -- its flavors and config
factory, the model class, the objectives it trains, how many transformer stacks it has (for the
layout checks and ``glm plan``), whether and how it pipelines or tensor-splits, its transformers
adapter and classes, and what fine-tuning reads from it. No other module tests a family's name.
Pipelines and adapters are named as ``"module:function"`` and imported when used, so this table
(and ``models/``) never imports DeepSpeed or transformers.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from glm_dist.families.awd_lstm import model as awd_lstm
from glm_dist.families.bart import model as bart
from glm_dist.families.bert import model as bert
from glm_dist.families.cove import model as cove
from glm_dist.families.cvt import model as cvt
from glm_dist.families.elmo import model as elmo
from glm_dist.families.glove import model as glove
from glm_dist.families.gpt import model as gpt
from glm_dist.families.gpt1 import model as gpt1
from glm_dist.families.t5 import model as t5
from glm_dist.families.xlnet import model as xlnet
from glm_dist.models import common


@dataclass(frozen=True)
class PipelineSpec:
    build: str  # "module:function" -> PipelineModule of (model, stages=, topology=, partition=, ...)
    rename: str  # "module:function" -> unpipelined name of a stage's state-dict key: (key, n_layer) -> str | None
    objectives: tuple[str, ...]  # the objectives whose loss runs on the last stage
    refuse: Callable[[Any], str | None] = lambda cfg: None  # why a model config cannot be cut (None: it can)


@dataclass(frozen=True)
class FamilySpec:
    flavors: dict[str, Any]
    config: Callable[..., Any]  # (flavor, **overrides) -> the model config
    model: type[nn.Module]
    objectives: tuple[str, ...]  # what it trains
    stacks: int = 1  # transformer stacks: 2 for encoder-decoders (layers count twice)
    pipeline: PipelineSpec | None = None
    # tensor parallelism: module class -> ShardPlan (models/common.py) of how parallel/tensor.py splits it
    # (attention heads, FFN width); empty: the family does not tensor-split
    tensor_plans: dict = field(default_factory=dict)
    vocab_parallel: bool = False  # under tensor parallelism, its token embedding and tied output split by vocabulary
    # its layers() list (embedding, blocks, head) cut along the sequence between the ends
    sequence_parallel: bool = False
    next_token_logits: bool = False  # a decoder-only LM: forward(ids (B, T)) -> logits (B, T, V) (rolling
    # perplexity of documents, lm-eval tasks in the training loop)
    # train.init=local: model config -> the std of each parameter's normal draw by its name (parallel/init.py
    # draws every parameter from its own seeded generator, so no rank builds the whole model); None: refused
    init_std: Callable[[Any], Callable[[str], float]] | None = None
    hf: str | None = None  # module with ``import_hf`` / ``export_hf``
    hf_classes: tuple[str, ...] = ()  # what the export loads in transformers
    exported: str | None = None  # the submodule exported and fine-tuned (ELECTRA's discriminator)
    finetune: tuple[str, ...] = ()  # glm finetune tasks it takes: classify | seq2seq | entailment | similarity |
    # multiple_choice | span | tokens
    finetune_with: str | None = None  # "module:function" fine-tuning it (None: train/finetune.py's [CLS] classifier)
    summary_position: int = 0  # the position a classifier reads: BERT's [CLS] first, XLNet's <cls> last (-1)
    pad_left: bool = False  # fine-tuning inputs padded on the left (XLNet), so the last position is real
    decoder_start: str | None = None  # seq2seq: the token role the decoder starts from
    # "module:function" (model, manifest, shards_dir): before training, set what is read from the data set, not
    # learned (CoVe's frozen GloVe table)
    prepare: str | None = None
    # output projections of the blocks' attention / FFN sublayers (Houlsby adapters)
    adapter_sites: tuple[str, ...] = ()
    features: str | None = None  # "module:function" (model, tokenizer, texts, batch_size=) -> arrays (glm features)

    @property
    def local_init(self) -> bool:
        """Whether train.init=local can draw its weights."""
        return self.init_std is not None

    @property
    def tensor_parallel(self) -> bool:
        """Whether it tensor-splits at all."""
        return bool(self.tensor_plans)


def _flavors(table: dict, prefix: str) -> dict:
    return {name: f for name, f in table.items() if name.startswith(prefix)}


ENCODER_ADAPTERS = ("attn.dense", "ffn.proj")
# BERT's heads: [CLS] classification, span extraction and token classification (transfer/token_tasks.py)
ENCODER_FINETUNE = ("classify", "span", "tokens")
ENCODER_PIPELINE = PipelineSpec("glm_dist.parallel.pipeline:encoder_pipeline",
                                "glm_dist.parallel.pipeline:encoder_source_name", ("mlm",), bert.pipeline_refusal)


def _encoder(name: str, objectives: tuple[str, ...], *, pipeline: PipelineSpec | None = None, **kw) -> FamilySpec:
    return FamilySpec(_flavors(bert.FLAVORS, name + "-"), bert.encoder_config, bert.Encoder, objectives,
                      pipeline=pipeline, tensor_plans=bert.TENSOR_PLANS, vocab_parallel=True, sequence_parallel=True,
                      init_std=common.normal_init_std,
                      hf="glm_dist.families.bert.hf", finetune=ENCODER_FINETUNE,
                      adapter_sites=ENCODER_ADAPTERS, **kw)


# GPT's fine-tuning (Radford et al. 2018): the last (extract) token's state through W_y, LM loss as auxiliary.
GPT_FINETUNE = dict(finetune=("classify", "entailment", "similarity", "multiple_choice"), summary_position=-1,
                    finetune_with="glm_dist.transfer.finetune:finetune_gpt", adapter_sites=("attn.proj", "mlp.proj"))

FAMILIES: dict[str, FamilySpec] = {
    "gpt": FamilySpec(gpt.FLAVORS, gpt.gpt_config, gpt.GPT, ("clm",), next_token_logits=True,
                      init_std=gpt.local_init_std,
                      tensor_plans=common.GPT_TENSOR_PLANS, vocab_parallel=True,
                      sequence_parallel=True,
                      pipeline=PipelineSpec("glm_dist.parallel.pipeline:gpt_pipeline",
                                            "glm_dist.parallel.pipeline:gpt_source_name", ("clm",),
                                            gpt.pipeline_refusal),
                      hf="glm_dist.families.gpt.hf", hf_classes=("GPT2LMHeadModel",), **GPT_FINETUNE),
    # GPT-1: GPT's layers with post-LN blocks; data parallelism and ZeRO only (the pipeline cuts GPT-2's blocks).
    "gpt1": FamilySpec(gpt1.FLAVORS, gpt1.gpt1_config, gpt1.GPT1, ("clm",), next_token_logits=True,
                       init_std=common.normal_init_std,
                       hf="glm_dist.families.gpt1.hf",
                       hf_classes=("OpenAIGPTLMHeadModel",), **GPT_FINETUNE),
    "bert": _encoder("bert", ("mlm_nsp", "mlm"), pipeline=ENCODER_PIPELINE, hf_classes=("BertForPreTraining",)),
    "roberta": _encoder("roberta", ("mlm",), pipeline=ENCODER_PIPELINE, hf_classes=("RobertaForMaskedLM",)),
    "albert": _encoder("albert", ("sop", "mlm"), hf_classes=("AlbertForPreTraining",)),
    # ELECTRA's generator samples replacements from its whole logits: no vocabulary or sequence split
    "electra": FamilySpec(_flavors(bert.FLAVORS, "electra-"), bert.encoder_config, bert.ElectraPair, ("electra",),
                          tensor_plans=bert.TENSOR_PLANS, hf="glm_dist.families.bert.hf",
                          hf_classes=("ElectraForPreTraining",),
                          exported="discriminator", finetune=ENCODER_FINETUNE, adapter_sites=ENCODER_ADAPTERS),
    "t5": FamilySpec(t5.FLAVORS, t5.t5_config, t5.T5, ("span_corruption",), stacks=2, tensor_plans=t5.TENSOR_PLANS,
                     init_std=t5.local_init_std, hf="glm_dist.families.t5.hf",
                     hf_classes=("T5ForConditionalGeneration",), finetune=("seq2seq",), decoder_start="pad",
                     adapter_sites=("self_attn.o", "cross_attn.o", "ffn.wo")),
    "xlnet": FamilySpec(xlnet.FLAVORS, xlnet.xlnet_config, xlnet.XLNet, ("plm",), hf="glm_dist.families.xlnet.hf",
                        hf_classes=("XLNetLMHeadModel",), finetune=ENCODER_FINETUNE, summary_position=-1, pad_left=True,
                        adapter_sites=("attn.o", "ffn.proj")),
    "bart": FamilySpec(bart.FLAVORS, bart.bart_config, bart.Bart, ("denoising",), stacks=2,
                       tensor_plans=bart.TENSOR_PLANS, init_std=common.normal_init_std, hf="glm_dist.families.bart.hf",
                       hf_classes=("BartForConditionalGeneration",), finetune=("seq2seq",), decoder_start="eos",
                       adapter_sites=("self_attn.out_proj", "cross_attn.out_proj", "fc2")),
    # the recurrent era: data parallel + ZeRO only (no pipeline, no tensor split, no transformers export)
    "glove": FamilySpec(glove.FLAVORS, glove.glove_config, glove.GloVe, ("glove",)),
    # CoVe: an attentional LSTM translation model over frozen GloVe inputs; its encoder exports the features
    "cove": FamilySpec(cove.FLAVORS, cove.cove_config, cove.CoVe, ("translation", "cvt_translation"),
                       prepare="glm_dist.families.cove.model:load_inputs",
                       features="glm_dist.transfer.cove:cove_features"),
    "elmo": FamilySpec(elmo.FLAVORS, elmo.elmo_config, elmo.ELMo, ("bilm",),
                       features="glm_dist.transfer.elmo:layer_features"),
    # ULMFiT's LM; its classifier (concat pooling over BPT3C windows) through glm_dist/transfer/ulmfit.py
    "awd-lstm": FamilySpec(awd_lstm.FLAVORS, awd_lstm.awd_lstm_config, awd_lstm.AwdLstm, ("awd_lm",),
                           finetune=("classify",), finetune_with="glm_dist.transfer.ulmfit:finetune_ulmfit"),
    # CVT: a BiLSTM tagger, primary and auxiliary-view prediction modules per task (objectives/cvt.py)
    "cvt": FamilySpec(cvt.FLAVORS, cvt.cvt_config, cvt.CVT, ("cvt",)),
}


def family(name: str) -> FamilySpec:
    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def resolve(ref: str) -> Callable:
    """``"module:function"`` -> the function (imported now)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def resolve_model_config(family_name: str, flavor: str, **overrides) -> Any:
    return family(family_name).config(flavor, **overrides)


def build_model(family_name: str, model_cfg: Any) -> nn.Module:
    return family(family_name).model(model_cfg)


def exported_module(family_name: str, model: nn.Module) -> nn.Module:
    """The part of a model that is exported and fine-tuned (the whole model for most families)."""
    part = family(family_name).exported
    return getattr(model, part) if part else model


def published_flavors(family_name: str) -> dict[str, Any]:
    """Flavors with a published parameter count (the ``tiny`` test flavors have none)."""
    return {name: flavor for name, flavor in family(family_name).flavors.items() if flavor.params}


def model_config_from_dict(family_name: str, fields: dict) -> Any:
    """Rebuild a family's model config from its saved fields (checkpoint meta.json)."""
    flavors = family(family_name).flavors
    config_cls = type(next(iter(flavors.values())).cfg)
    return config_cls(**fields)
