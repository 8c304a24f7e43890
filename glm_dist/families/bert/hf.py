"""The encoder family <-> transformers: BertForPreTraining, RobertaForMaskedLM, AlbertForPreTraining,
ElectraForPreTraining (discriminator) and ElectraForMaskedLM (generator).

Names map through a small table per family; ``{i}`` is the block index (ALBERT's shared layer is
transformers' single layer 0).
"""

from __future__ import annotations

import re

import torch

from data_pipeline.tokenize.profiles import PROFILES
from glm_dist.families.bert.model import Encoder, EncoderConfig
from glm_dist.families.spec import hf_tokenizer, save_exported, state_dict_keys

_BLOCK_BERT = {  # ours -> transformers, inside "<prefix>.encoder.layer.{i}."
    "attn.query": "attention.self.query",
    "attn.key": "attention.self.key",
    "attn.value": "attention.self.value",
    "attn.dense": "attention.output.dense",
    "ln_attn": "attention.output.LayerNorm",
    "ffn.fc": "intermediate.dense",
    "ffn.proj": "output.dense",
    "ln_ffn": "output.LayerNorm",
}
_BLOCK_ALBERT = {
    "attn.query": "attention.query",
    "attn.key": "attention.key",
    "attn.value": "attention.value",
    "attn.dense": "attention.dense",
    "ln_attn": "attention.LayerNorm",
    "ffn.fc": "ffn",
    "ffn.proj": "ffn_output",
    "ln_ffn": "full_layer_layer_norm",
}
_EMBED = {
    "embed.word": "embeddings.word_embeddings",
    "embed.position": "embeddings.position_embeddings",
    "embed.token_type": "embeddings.token_type_embeddings",
    "embed.ln": "embeddings.LayerNorm",
}

FAMILY = {  # head kind -> (prefix, block table, block path, extra names)
    "mlm_nsp": (
        "bert",
        _BLOCK_BERT,
        "bert.encoder.layer.{i}",
        {
            "head.pooler": "bert.pooler.dense",
            "head.mlm.dense": "cls.predictions.transform.dense",
            "head.mlm.ln": "cls.predictions.transform.LayerNorm",
            "head.mlm.decoder": "cls.predictions.decoder",
            "head.sentence": "cls.seq_relationship",
        },
    ),
    "mlm": (
        "roberta",
        _BLOCK_BERT,
        "roberta.encoder.layer.{i}",
        {"head.mlm.dense": "lm_head.dense", "head.mlm.ln": "lm_head.layer_norm", "head.mlm.decoder": "lm_head.decoder"},
    ),
    "mlm_sop": (
        "albert",
        _BLOCK_ALBERT,
        "albert.encoder.albert_layer_groups.0.albert_layers.0",
        {
            "embed.project": "albert.encoder.embedding_hidden_mapping_in",
            "head.pooler": "albert.pooler",
            "head.mlm.dense": "predictions.dense",
            "head.mlm.ln": "predictions.LayerNorm",
            "head.mlm.decoder": "predictions.decoder",
            "head.sentence": "sop_classifier.classifier",
        },
    ),
    "rtd": (
        "electra",
        _BLOCK_BERT,
        "electra.encoder.layer.{i}",
        {
            "embed.project": "electra.embeddings_project",
            "head.dense": "discriminator_predictions.dense",
            "head.predict": "discriminator_predictions.dense_prediction",
        },
    ),
    "gen": (
        "electra",
        _BLOCK_BERT,
        "electra.encoder.layer.{i}",
        {
            "embed.project": "electra.embeddings_project",
            "head.mlm.dense": "generator_predictions.dense",
            "head.mlm.ln": "generator_predictions.LayerNorm",
            "head.mlm.decoder": "generator_lm_head",
        },
    ),
}


def hf_name(ours: str, cfg: EncoderConfig) -> str:
    prefix, block, block_path, extra = FAMILY[cfg.head]
    module, kind = ours.rsplit(".", 1)
    m = re.match(r"blocks\.(\d+)\.(.+)$", module)
    if m:
        return f"{block_path.format(i=m.group(1))}.{block[m.group(2)]}.{kind}"
    if module in _EMBED:
        return f"{prefix}.{_EMBED[module]}.{kind}"
    if module in extra:
        return f"{extra[module]}.{kind}"
    raise KeyError(f"no transformers name for {ours!r}")


def from_hf_state_dict(
    hf_sd: dict[str, torch.Tensor], ours_keys: list[str], cfg: EncoderConfig
) -> dict[str, torch.Tensor]:
    """Our state dict from transformers' (every key of ours must be found)."""
    return {key: hf_sd[hf_name(key, cfg)] for key in ours_keys}


def to_hf_state_dict(sd: dict[str, torch.Tensor], cfg: EncoderConfig) -> dict[str, torch.Tensor]:
    return {hf_name(k, cfg): v for k, v in sd.items()}


def to_hf_config(cfg: EncoderConfig):
    """The matching transformers config (dropout off: parity and export are for inference)."""
    import transformers as tf

    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        intermediate_size=cfg.d_ff,
        hidden_act=cfg.activation,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        type_vocab_size=cfg.type_vocab_size,
        max_position_embeddings=cfg.context_length + cfg.position_offset,
        layer_norm_eps=cfg.layer_norm_eps,
        pad_token_id=cfg.pad_id,
    )
    if cfg.head == "mlm_nsp":
        return tf.BertConfig(**common)
    if cfg.head == "mlm":
        return tf.RobertaConfig(**common)
    if cfg.head == "mlm_sop":
        return tf.AlbertConfig(
            **common, embedding_size=cfg.emb, num_hidden_groups=1, inner_group_num=1, classifier_dropout_prob=0.0
        )
    return tf.ElectraConfig(**common, embedding_size=cfg.emb)


def hf_model_class(cfg: EncoderConfig):
    import transformers as tf

    return {
        "mlm_nsp": tf.BertForPreTraining,
        "mlm": tf.RobertaForMaskedLM,
        "mlm_sop": tf.AlbertForPreTraining,
        "rtd": tf.ElectraForPreTraining,
        "gen": tf.ElectraForMaskedLM,
    }[cfg.head]


_HEADS = {
    "BertForPreTraining": "mlm_nsp",
    "RobertaForMaskedLM": "mlm",
    "AlbertForPreTraining": "mlm_sop",
    "ElectraForPreTraining": "rtd",
    "ElectraForMaskedLM": "gen",
}  # what hf_model_class builds, inverted


def from_hf_config(hf_cfg, head: str) -> EncoderConfig:
    """Our config from a transformers one (the inverse of ``to_hf_config``). RoBERTa's positions start
    after the pad id, so its table holds ``pad_id + 1`` rows more than the context; ALBERT's one shared
    layer is our ``share="all"``."""
    if hf_cfg.hidden_act not in ("gelu", "gelu_new"):
        raise ValueError(f"hidden_act={hf_cfg.hidden_act!r}: only 'gelu' and 'gelu_new' are implemented here")
    if head == "mlm_sop" and (hf_cfg.num_hidden_groups, hf_cfg.inner_group_num) != (1, 1):
        raise ValueError("ALBERT with more than one layer group is not implemented here (one shared layer is)")
    offset = hf_cfg.pad_token_id + 1 if head == "mlm" else 0
    embedding = getattr(hf_cfg, "embedding_size", None)
    return EncoderConfig(
        n_layer=hf_cfg.num_hidden_layers,
        n_head=hf_cfg.num_attention_heads,
        d_model=hf_cfg.hidden_size,
        d_ff=hf_cfg.intermediate_size,
        vocab_size=hf_cfg.vocab_size,
        context_length=hf_cfg.max_position_embeddings - offset,
        type_vocab_size=hf_cfg.type_vocab_size,
        embedding_size=embedding if head in ("mlm_sop", "rtd", "gen") else None,
        position_offset=offset,
        pad_id=hf_cfg.pad_token_id,
        share="all" if head == "mlm_sop" else "none",
        activation=hf_cfg.hidden_act,
        layer_norm_eps=hf_cfg.layer_norm_eps,
        dropout=hf_cfg.hidden_dropout_prob,
        head=head,
    )


def import_hf(hf_model) -> tuple[EncoderConfig, dict[str, torch.Tensor]]:
    """A ``BertForPreTraining``, ``RobertaForMaskedLM``, ``AlbertForPreTraining``, ``ElectraForPreTraining``
    (the discriminator, what the electra row exports) or ``ElectraForMaskedLM`` (a generator) -> our
    ``Encoder``'s config and state dict."""
    kind = type(hf_model).__name__
    if kind not in _HEADS:
        raise ValueError(f"no import from transformers' {kind}: one of {', '.join(_HEADS)}")
    cfg = from_hf_config(hf_model.config, _HEADS[kind])
    return cfg, from_hf_state_dict(hf_model.state_dict(), state_dict_keys(Encoder, cfg), cfg)


def export_hf(
    cfg: EncoderConfig,
    state_dict: dict[str, torch.Tensor],
    out_dir: str,
    *,
    tokenizer_file: str | None = None,
    profile: str | None = None,
) -> None:
    """Write a folder the family's transformers class and ``AutoTokenizer`` load."""
    segments = ["token_type_ids"] if cfg.type_vocab_size > 1 else []
    tokenizer = hf_tokenizer(
        tokenizer_file,
        PROFILES[profile].roles if profile else {},
        context_length=cfg.context_length,
        model_input_names=["input_ids", *segments, "attention_mask"],
    )
    model = hf_model_class(cfg)(to_hf_config(cfg))
    unused = ("position_ids", "token_type_ids", "bias")
    save_exported(out_dir, model, to_hf_state_dict(state_dict, cfg), tokenizer, unused=unused)
