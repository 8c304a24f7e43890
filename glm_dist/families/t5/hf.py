"""T5 <-> transformers' T5ForConditionalGeneration (1.0 and v1.1)."""

from __future__ import annotations

import re

import torch

from glm_dist.families.t5.model import T5, T5Config
from glm_dist.families.spec import hf_tokenizer, save_exported, state_dict_keys


def hf_name(ours: str) -> str:
    if ours in ("shared.weight", "lm_head.weight"):
        return ours
    m = re.match(r"(encoder|decoder)\.ln_final\.weight$", ours)
    if m:
        return f"{m.group(1)}.final_layer_norm.weight"
    m = re.match(r"(encoder|decoder)\.blocks\.(\d+)\.(.+)$", ours)
    if not m:
        raise KeyError(f"no transformers name for {ours!r}")
    stack, i, rest = m.groups()
    ffn_layer = 2 if stack == "decoder" else 1
    table = {
        "ln_self.weight": "layer.0.layer_norm.weight",
        "ln_cross.weight": "layer.1.layer_norm.weight",
        "ln_ffn.weight": f"layer.{ffn_layer}.layer_norm.weight",
        "self_attn.relative_bias.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    }
    if rest in table:
        return f"{stack}.block.{i}.{table[rest]}"
    part, proj = rest.split(".", 1)
    prefix = {
        "self_attn": "layer.0.SelfAttention",
        "cross_attn": "layer.1.EncDecAttention",
        "ffn": f"layer.{ffn_layer}.DenseReluDense",
    }[part]
    return f"{stack}.block.{i}.{prefix}.{proj}"


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor], ours_keys: list[str]) -> dict[str, torch.Tensor]:
    return {k: hf_sd[hf_name(k)] for k in ours_keys}


def to_hf_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {hf_name(k): v for k, v in sd.items()}
    out["encoder.embed_tokens.weight"] = out["decoder.embed_tokens.weight"] = sd["shared.weight"]
    return out


def to_hf_config(cfg: T5Config, *, eos_id: int = 1):
    from transformers import T5Config as HFConfig

    return HFConfig(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        d_kv=cfg.d_kv,
        d_ff=cfg.d_ff,
        num_layers=cfg.n_layer,
        num_decoder_layers=cfg.n_layer,
        num_heads=cfg.n_head,
        relative_attention_num_buckets=cfg.num_buckets,
        relative_attention_max_distance=cfg.max_distance,
        dropout_rate=0.0,
        layer_norm_epsilon=cfg.layer_norm_eps,
        feed_forward_proj="gated-gelu" if cfg.gated else "relu",
        tie_word_embeddings=cfg.tied,
        pad_token_id=cfg.pad_id,
        eos_token_id=eos_id,
        decoder_start_token_id=cfg.pad_id,
    )


def from_hf_config(hf_cfg) -> T5Config:
    """Our config from a transformers one (the inverse of ``to_hf_config``); T5 has no position table,
    so the context length is our default. transformers 5 forces ``tie_word_embeddings`` on and keeps what
    it was as ``scale_decoder_outputs`` (1.0's tied head scales the decoder output by d_model^-0.5)."""
    if hf_cfg.num_decoder_layers != hf_cfg.num_layers:
        raise ValueError("T5 with different encoder and decoder depths is not implemented here")
    if hf_cfg.feed_forward_proj not in ("relu", "gated-gelu"):
        raise ValueError(
            f"feed_forward_proj={hf_cfg.feed_forward_proj!r}: only 'relu' (1.0) and 'gated-gelu' "
            "(v1.1) are implemented here"
        )
    return T5Config(
        n_layer=hf_cfg.num_layers,
        n_head=hf_cfg.num_heads,
        d_model=hf_cfg.d_model,
        d_ff=hf_cfg.d_ff,
        d_kv=hf_cfg.d_kv,
        vocab_size=hf_cfg.vocab_size,
        num_buckets=hf_cfg.relative_attention_num_buckets,
        max_distance=hf_cfg.relative_attention_max_distance,
        gated=hf_cfg.feed_forward_proj == "gated-gelu",
        tied=getattr(hf_cfg, "scale_decoder_outputs", hf_cfg.tie_word_embeddings),
        layer_norm_eps=hf_cfg.layer_norm_epsilon,
        dropout=hf_cfg.dropout_rate,
        pad_id=hf_cfg.pad_token_id,
    )


def import_hf(hf_model) -> tuple[T5Config, dict[str, torch.Tensor]]:
    """A transformers ``T5ForConditionalGeneration`` -> our config and state dict."""
    cfg = from_hf_config(hf_model.config)
    return cfg, from_hf_state_dict(hf_model.state_dict(), state_dict_keys(T5, cfg))


def export_hf(
    cfg: T5Config,
    state_dict: dict[str, torch.Tensor],
    out_dir: str,
    *,
    tokenizer_file: str | None = None,
    profile: str | None = None,
) -> None:
    from transformers import T5ForConditionalGeneration

    if not cfg.tied:
        raise ValueError(
            "transformers 5 always ties T5's output layer to its embedding, so an untied T5 v1.1 "
            "cannot be exported faithfully; export T5 1.0 (tied) models"
        )
    tokenizer = hf_tokenizer(
        tokenizer_file, {"pad": "<pad>", "eos": "</s>", "unk": "<unk>"}, context_length=cfg.context_length
    )
    model = T5ForConditionalGeneration(to_hf_config(cfg))
    save_exported(out_dir, model, to_hf_state_dict(state_dict), tokenizer)
