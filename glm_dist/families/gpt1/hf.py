"""GPT-1 family <-> transformers' ``OpenAIGPTLMHeadModel`` / ``OpenAIGPTDoubleHeadsModel``.

GPT-1 is GPT by config (``post_ln=True``), and transformers' OpenAIGPT names its blocks as GPT-2 does:
``h.N.ln_1`` follows attention and ``h.N.ln_2`` the MLP, as our post-LN blocks' ``ln_1``/``ln_2`` do,
and its ``Conv1D`` weights are transposed alike. So this adapter is GPT's (``families/gpt/hf.py``) with
what differs: the embeddings are ``tokens_embed`` / ``positions_embed``, there is no final LayerNorm,
the FFN is 4 x d_model (no ``n_inner``) and the activation is ``afn``. The double heads model's
multiple-choice head (``multiple_choice_head.summary``: one row, read at ``mc_token_ids``) is GPT's W_y
of a multiple-choice fine-tuning (``glm_dist/transfer``). A padded vocabulary is exported without its
padding rows.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from glm_dist.families.gpt import hf as gpt
from glm_dist.families.gpt.model import GPTConfig, unpadded_state_dict
from glm_dist.families.spec import save_exported

# ours -> transformers, outside the blocks
_TOP = {
    "embed.wte.weight": "transformer.tokens_embed.weight",
    "embed.wpe.weight": "transformer.positions_embed.weight",
    "head.lm_head.weight": "lm_head.weight",
    # W_y of a multiple-choice head (transfer.heads.TransferModel's ``classifier``) <-> the double heads model's
    "classifier.weight": "multiple_choice_head.summary.weight",
    "classifier.bias": "multiple_choice_head.summary.bias",
}


def to_hf_config(cfg: GPTConfig, *, eot_id: int | None = None):
    from transformers import OpenAIGPTConfig

    if not cfg.post_ln or cfg.sparse_window is not None or cfg.ffn_width != 4 * cfg.d_model:
        raise ValueError("OpenAIGPT is post-LN with dense attention and an FFN of 4 x d_model; export such a model")
    return OpenAIGPTConfig(**gpt.hf_config_fields(cfg, eot_id=eot_id), afn="gelu", summary_first_dropout=cfg.dropout)


def from_hf_config(hf_cfg) -> GPTConfig:
    return GPTConfig(**gpt.config_fields(hf_cfg), post_ln=True)


def to_hf_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our GPT-1 state dict (plus ``classifier.*``, a multiple-choice W_y) -> transformers' names."""
    return gpt.to_hf_state_dict(sd, top=_TOP)


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' state dict -> ours (``classifier.*`` when it has a multiple-choice head)."""
    return gpt.from_hf_state_dict(hf_sd, top=_TOP)


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

    tokenizer, eot_id = gpt.eot_tokenizer(tokenizer_file, profile, context_length=cfg.context_length)
    model = OpenAIGPTLMHeadModel(to_hf_config(replace(cfg, dropout=0.0), eot_id=eot_id))
    save_exported(out_dir, model, to_hf_state_dict(unpadded_state_dict(state_dict, cfg)), tokenizer)
