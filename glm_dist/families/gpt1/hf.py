"""GPT-1 family <-> transformers' ``OpenAIGPTLMHeadModel`` / ``OpenAIGPTDoubleHeadsModel``.

Same names as GPT-2's adapter for the blocks (``Conv1D`` weights transposed), different ones for
the embeddings (``tokens_embed`` / ``positions_embed``); there is no final LayerNorm. The double
heads model's multiple-choice head (``multiple_choice_head.summary``: one row, read at
``mc_token_ids``) is GPT's W_y of a multiple-choice fine-tuning (``glm_dist/transfer``). A padded
vocabulary is exported without its padding rows.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from glm_dist.families.gpt.model import GPTConfig, unpadded_state_dict
from glm_dist.families.spec import hf_tokenizer, load_exported

_BLOCK = {
    "ln_1": "ln_1",
    "attn.qkv": "attn.c_attn",
    "attn.proj": "attn.c_proj",
    "ln_2": "ln_2",
    "mlp.fc": "mlp.c_fc",
    "mlp.proj": "mlp.c_proj",
}
_CONV1D = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")  # (in, out) in transformers
_TOP = {
    "embed.wte.weight": "transformer.tokens_embed.weight",
    "embed.wpe.weight": "transformer.positions_embed.weight",
    "head.lm_head.weight": "lm_head.weight",
}
# W_y of a multiple-choice head (transfer.heads.TransferModel's ``classifier``) <-> the double heads model's
_MC_HEAD = {
    "classifier.weight": "multiple_choice_head.summary.weight",
    "classifier.bias": "multiple_choice_head.summary.bias",
}
_OURS = re.compile(r"blocks\.(\d+)\.(.+)\.(weight|bias)$")
_THEIRS = re.compile(r"transformer\.h\.(\d+)\.(.+)\.(weight|bias)$")


def to_hf_config(cfg: GPTConfig, *, eot_id: int | None = None):
    from transformers import OpenAIGPTConfig

    if not cfg.post_ln or cfg.sparse_window is not None or cfg.ffn_width != 4 * cfg.d_model:
        raise ValueError("OpenAIGPT is post-LN with dense attention and an FFN of 4 x d_model; export such a model")
    eot = cfg.vocab_size - 1 if eot_id is None else eot_id
    return OpenAIGPTConfig(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.context_length,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        afn="gelu",
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        layer_norm_epsilon=cfg.layer_norm_eps,
        summary_first_dropout=cfg.dropout,
        bos_token_id=eot,
        eos_token_id=eot,
        tie_word_embeddings=True,
    )


def from_hf_config(hf_cfg) -> GPTConfig:
    return GPTConfig(
        n_layer=hf_cfg.n_layer,
        n_head=hf_cfg.n_head,
        d_model=hf_cfg.n_embd,
        vocab_size=hf_cfg.vocab_size,
        context_length=hf_cfg.n_positions,
        dropout=hf_cfg.resid_pdrop,
        layer_norm_eps=hf_cfg.layer_norm_epsilon,
        post_ln=True,
    )


def to_hf_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our GPT-1 state dict (plus ``classifier.*``, a multiple-choice W_y) -> transformers' names."""
    out = {}
    for key, value in sd.items():
        if key in _TOP or key in _MC_HEAD:
            out[_TOP.get(key) or _MC_HEAD[key]] = value
            continue
        m = _OURS.match(key)
        if not m or m.group(2) not in _BLOCK:
            raise KeyError(f"no transformers name for parameter {key!r}")
        layer, part, kind = m.groups()
        transpose = part in _CONV1D and kind == "weight"
        out[f"transformer.h.{layer}.{_BLOCK[part]}.{kind}"] = value.t() if transpose else value
    return out


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' state dict -> ours (``classifier.*`` when it has a multiple-choice head)."""
    top = {v: k for k, v in {**_TOP, **_MC_HEAD}.items()}
    block = {v: k for k, v in _BLOCK.items()}
    out = {}
    for key, value in hf_sd.items():
        if key in top:
            out[top[key]] = value
            continue
        m = _THEIRS.match(key)
        if m and m.group(2) in block:  # anything else is a buffer (the causal mask, position ids)
            layer, part, kind = m.group(1), block[m.group(2)], m.group(3)
            out[f"blocks.{layer}.{part}.{kind}"] = value.t() if part in _CONV1D and kind == "weight" else value
    out.setdefault("head.lm_head.weight", out["embed.wte.weight"])
    return out


def import_hf(hf_model) -> tuple[GPTConfig, dict[str, torch.Tensor]]:
    """An ``OpenAIGPTLMHeadModel`` (or double heads model) -> our config and state dict."""
    return from_hf_config(hf_model.config), from_hf_state_dict(hf_model.state_dict())


def export_hf(
    cfg: GPTConfig,
    state_dict: dict[str, torch.Tensor],
    out_dir: str,
    *,
    tokenizer_file: str | None = None,
    profile: str | None = None,
) -> None:
    """Write a folder ``OpenAIGPTLMHeadModel.from_pretrained`` and ``AutoTokenizer.from_pretrained``
    load (safetensors); the tokenizer's end-of-text token (also BOS, EOS, UNK) from ``profile``."""
    from transformers import OpenAIGPTLMHeadModel

    from data_pipeline.tokenize.profiles import PROFILES

    eot = PROFILES[profile or "gpt2"].roles["eot"]
    tokenizer = hf_tokenizer(
        tokenizer_file, dict.fromkeys(("bos", "eos", "unk"), eot), context_length=cfg.context_length
    )
    eot_id = tokenizer.convert_tokens_to_ids(eot) if tokenizer is not None else None
    model = OpenAIGPTLMHeadModel(to_hf_config(replace(cfg, dropout=0.0), eot_id=eot_id))
    load_exported(model, to_hf_state_dict(unpadded_state_dict(state_dict, cfg)))
    model.save_pretrained(out_dir, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
