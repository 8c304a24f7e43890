"""BART <-> transformers' BartForConditionalGeneration."""

from __future__ import annotations

import re

import torch

from glm_dist.families.bart.model import Bart, BartConfig
from glm_dist.families.spec import hf_tokenizer, save_exported, state_dict_keys

_BLOCK = {
    "self_attn": "self_attn",
    "ln_self": "self_attn_layer_norm",
    "cross_attn": "encoder_attn",
    "ln_cross": "encoder_attn_layer_norm",
    "fc1": "fc1",
    "fc2": "fc2",
    "ln_ffn": "final_layer_norm",
}


def hf_name(ours: str) -> str:
    if ours in ("shared.weight", "lm_head.weight", "final_logits_bias"):
        return ours if ours != "shared.weight" else "model.shared.weight"
    m = re.match(r"(encoder|decoder)\.(position|ln_embed)\.(weight|bias)$", ours)
    if m:
        name = "embed_positions" if m.group(2) == "position" else "layernorm_embedding"
        return f"model.{m.group(1)}.{name}.{m.group(3)}"
    m = re.match(r"(encoder|decoder)\.blocks\.(\d+)\.([a-z_0-9]+)\.(.+)$", ours)
    if not m:
        raise KeyError(f"no transformers name for {ours!r}")
    stack, i, part, rest = m.groups()
    return f"model.{stack}.layers.{i}.{_BLOCK[part]}.{rest}"


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor], ours_keys: list[str]) -> dict[str, torch.Tensor]:
    return {k: hf_sd[hf_name(k)] for k in ours_keys}


def to_hf_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {hf_name(k): v for k, v in sd.items()}
    out["model.encoder.embed_tokens.weight"] = out["model.decoder.embed_tokens.weight"] = sd["shared.weight"]
    return out


def to_hf_config(cfg: BartConfig, *, bos_id: int = 0, eos_id: int = 2):
    from transformers import BartConfig as HFConfig

    return HFConfig(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_layer,
        decoder_layers=cfg.n_layer,
        encoder_attention_heads=cfg.n_head,
        decoder_attention_heads=cfg.n_head,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        max_position_embeddings=cfg.context_length,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_function="gelu",
        pad_token_id=cfg.pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        decoder_start_token_id=eos_id,
        forced_eos_token_id=eos_id,
        scale_embedding=False,
        tie_word_embeddings=True,
    )


def from_hf_config(hf_cfg) -> BartConfig:
    """Our config from a transformers one (the inverse of ``to_hf_config``): BART's post-LN stacks of one
    depth and width, GELU, unscaled embeddings (mBART's pre-LN and scaled variants are refused)."""
    if (hf_cfg.decoder_layers, hf_cfg.decoder_attention_heads, hf_cfg.decoder_ffn_dim) != (
        hf_cfg.encoder_layers,
        hf_cfg.encoder_attention_heads,
        hf_cfg.encoder_ffn_dim,
    ):
        raise ValueError("BART with different encoder and decoder shapes is not implemented here")
    if hf_cfg.activation_function != "gelu" or hf_cfg.scale_embedding:
        raise ValueError(
            "only BART's GELU with unscaled embeddings is implemented here "
            f"(activation_function={hf_cfg.activation_function!r}, "
            f"scale_embedding={hf_cfg.scale_embedding})"
        )
    return BartConfig(
        n_layer=hf_cfg.encoder_layers,
        n_head=hf_cfg.encoder_attention_heads,
        d_model=hf_cfg.d_model,
        d_ff=hf_cfg.encoder_ffn_dim,
        vocab_size=hf_cfg.vocab_size,
        context_length=hf_cfg.max_position_embeddings,
        pad_id=hf_cfg.pad_token_id,
        dropout=hf_cfg.dropout,
    )


def import_hf(hf_model) -> tuple[BartConfig, dict[str, torch.Tensor]]:
    """A transformers ``BartForConditionalGeneration`` -> our config and state dict."""
    cfg = from_hf_config(hf_model.config)
    return cfg, from_hf_state_dict(hf_model.state_dict(), state_dict_keys(Bart, cfg))


def export_hf(
    cfg: BartConfig,
    state_dict: dict[str, torch.Tensor],
    out_dir: str,
    *,
    tokenizer_file: str | None = None,
    profile: str | None = None,
) -> None:
    from transformers import BartForConditionalGeneration

    roles = {"bos": "<s>", "eos": "</s>", "pad": "<pad>", "unk": "<unk>", "mask": "<mask>"}
    tokenizer = hf_tokenizer(tokenizer_file, roles, context_length=cfg.context_length)
    model = BartForConditionalGeneration(to_hf_config(cfg))
    save_exported(out_dir, model, to_hf_state_dict(state_dict), tokenizer)
