"""GPT family <-> transformers' ``GPT2LMHeadModel``.

transformers' GPT-2 uses ``Conv1D`` (weight stored as (in, out)); ours uses ``nn.Linear``
((out, in)), so matrices are transposed on the way. Names map one to one. A padded vocabulary
(``pad_vocab_to_multiple_of``) is exported without its padding rows and padded again on import.
transformers' OpenAIGPT names its blocks and most config fields as GPT-2 does, so GPT-1's adapter
(``families/gpt1/hf.py``) reuses the renaming, the shared config fields and the tokenizer below.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import torch

from data_pipeline.tokenize.profiles import PROFILES
from glm_dist.families.gpt.model import GPTConfig, unpadded_state_dict
from glm_dist.families.spec import hf_tokenizer, save_exported

# ours -> transformers, for one block (prefix "blocks.{i}." / "transformer.h.{i}.")
_BLOCK = {
    "ln_1": "ln_1",
    "attn.qkv": "attn.c_attn",
    "attn.proj": "attn.c_proj",
    "ln_2": "ln_2",
    "mlp.fc": "mlp.c_fc",
    "mlp.proj": "mlp.c_proj",
}
_CONV1D = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")  # transposed in transformers
# ours -> transformers, outside the blocks
_TOP = {
    "embed.wte.weight": "transformer.wte.weight",
    "embed.wpe.weight": "transformer.wpe.weight",
    "head.ln_f.weight": "transformer.ln_f.weight",
    "head.ln_f.bias": "transformer.ln_f.bias",
    "head.lm_head.weight": "lm_head.weight",
}
_OURS = re.compile(r"blocks\.(\d+)\.(.+)\.(weight|bias)$")
_THEIRS = re.compile(r"transformer\.h\.(\d+)\.(.+)\.(weight|bias)$")


def hf_config_fields(cfg: GPTConfig, *, eot_id: int | None) -> dict[str, Any]:
    """The fields transformers' ``GPT2Config`` and ``OpenAIGPTConfig`` name alike, from ours; the
    end-of-text id (without a tokenizer, the last token's) is their BOS and EOS."""
    eot = cfg.vocab_size - 1 if eot_id is None else eot_id
    return dict(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.context_length,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        layer_norm_epsilon=cfg.layer_norm_eps,
        bos_token_id=eot,
        eos_token_id=eot,
        tie_word_embeddings=True,
    )


def config_fields(hf_cfg) -> dict[str, Any]:
    """Our ``GPTConfig`` fields read from those ``GPT2Config`` and ``OpenAIGPTConfig`` name alike."""
    return dict(
        n_layer=hf_cfg.n_layer,
        n_head=hf_cfg.n_head,
        d_model=hf_cfg.n_embd,
        vocab_size=hf_cfg.vocab_size,
        context_length=hf_cfg.n_positions,
        dropout=hf_cfg.resid_pdrop,
        layer_norm_eps=hf_cfg.layer_norm_epsilon,
    )


def to_hf_config(cfg: GPTConfig, *, eot_id: int | None = None):
    from transformers import GPT2Config

    if cfg.sparse_window is not None or cfg.post_ln:
        raise ValueError("GPT2LMHeadModel is pre-LN without banded sparse attention; export such a model")
    return GPT2Config(**hf_config_fields(cfg, eot_id=eot_id), n_inner=cfg.d_ff, activation_function="gelu_new")


def from_hf_config(hf_cfg) -> GPTConfig:
    return GPTConfig(**config_fields(hf_cfg), d_ff=hf_cfg.n_inner)


def to_hf_state_dict(sd: dict[str, torch.Tensor], *, top: dict[str, str] = _TOP) -> dict[str, torch.Tensor]:
    """Our state dict -> transformers' names; ``top`` names what is outside the blocks (GPT-1's differ)."""
    out = {}
    for key, value in sd.items():
        if key in top:
            out[top[key]] = value
            continue
        m = _OURS.match(key)
        if not m or m.group(2) not in _BLOCK:
            raise KeyError(f"no transformers name for parameter {key!r}")
        layer, part, kind = m.groups()
        transpose = part in _CONV1D and kind == "weight"
        out[f"transformer.h.{layer}.{_BLOCK[part]}.{kind}"] = value.t() if transpose else value
    return out


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor], *, top: dict[str, str] = _TOP) -> dict[str, torch.Tensor]:
    """transformers' state dict -> ours, the inverse of ``to_hf_state_dict(top=top)``; the output matrix is
    the token embedding where the model ties them."""
    theirs_top = {v: k for k, v in top.items()}
    block = {v: k for k, v in _BLOCK.items()}
    out = {}
    for key, value in hf_sd.items():
        if key in theirs_top:
            out[theirs_top[key]] = value
            continue
        m = _THEIRS.match(key)
        if m and m.group(2) in block:  # anything else is a buffer (the causal mask, masked_bias, position ids)
            layer, part, kind = m.group(1), block[m.group(2)], m.group(3)
            out[f"blocks.{layer}.{part}.{kind}"] = value.t() if part in _CONV1D and kind == "weight" else value
    out.setdefault("head.lm_head.weight", out["embed.wte.weight"])
    return out


def eot_tokenizer(tokenizer_file: str | None, profile: str | None, *, context_length: int) -> tuple[Any, int | None]:
    """The exported tokenizer, whose end-of-text token (the tokenizer ``profile``'s, GPT-2's by default) is
    also BOS, EOS and UNK, and that token's id; (None, None) without a tokenizer file."""
    eot = PROFILES[profile or "gpt2"].roles["eot"]
    tokenizer = hf_tokenizer(tokenizer_file, dict.fromkeys(("bos", "eos", "unk"), eot), context_length=context_length)
    return tokenizer, (tokenizer.convert_tokens_to_ids(eot) if tokenizer is not None else None)


def import_hf(hf_model, *, pad_vocab_to_multiple_of: int = 1) -> tuple[GPTConfig, dict[str, torch.Tensor]]:
    """A transformers GPT-2 model -> our config, its vocabulary padded to ``pad_vocab_to_multiple_of``,
    and state dict (of the real vocabulary's rows: ``GPT.load_state_dict`` pads them)."""
    cfg = replace(from_hf_config(hf_model.config), pad_vocab_to_multiple_of=pad_vocab_to_multiple_of)
    return cfg, from_hf_state_dict(hf_model.state_dict())


def export_hf(
    cfg: GPTConfig,
    state_dict: dict[str, torch.Tensor],
    out_dir: str,
    *,
    tokenizer_file: str | None = None,
    profile: str | None = None,
) -> None:
    """Write a folder ``GPT2LMHeadModel.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load;
    the tokenizer's end-of-text token (also BOS, EOS, UNK) from the tokenizer ``profile``."""
    from transformers import GPT2LMHeadModel

    tokenizer, eot_id = eot_tokenizer(tokenizer_file, profile, context_length=cfg.context_length)
    model = GPT2LMHeadModel(to_hf_config(replace(cfg, dropout=0.0), eot_id=eot_id))
    hf_sd = to_hf_state_dict(unpadded_state_dict(state_dict, cfg))
    save_exported(out_dir, model, hf_sd, tokenizer, unused=(".attn.bias", ".attn.masked_bias"))
