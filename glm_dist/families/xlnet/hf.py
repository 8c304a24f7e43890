"""XLNet <-> transformers' ``XLNetLMHeadModel``.

transformers keeps each attention projection as one (d_model, n_head, d_head) parameter used by
einsum; ours are ``nn.Linear`` layers: q, k, v and r are the transpose of the flattened
(d_model, n_head * d_head) matrix, o is that matrix as it stands. ``mask_emb`` is (1, 1, d) there
and (d,) here. Other names map one to one.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from data_pipeline.tokenize.profiles import PROFILES
from glm_dist.families.xlnet.model import XLNet, XLNetConfig
from glm_dist.families.spec import hf_tokenizer, save_exported, state_dict_keys

_TOP = {
    "embed.word.weight": "transformer.word_embedding.weight",
    "embed.mask_emb": "transformer.mask_emb",
    "head.lm.weight": "lm_loss.weight",
    "head.lm.bias": "lm_loss.bias",
}
_BLOCK = {  # ours -> transformers, inside "blocks.{i}." / "transformer.layer.{i}."
    "attn.q.weight": "rel_attn.q",
    "attn.k.weight": "rel_attn.k",
    "attn.v.weight": "rel_attn.v",
    "attn.r.weight": "rel_attn.r",
    "attn.o.weight": "rel_attn.o",
    "attn.content_bias": "rel_attn.r_w_bias",
    "attn.position_bias": "rel_attn.r_r_bias",
    "attn.segment_bias": "rel_attn.r_s_bias",
    "attn.segment_embed": "rel_attn.seg_embed",
    "ln_attn.weight": "rel_attn.layer_norm.weight",
    "ln_attn.bias": "rel_attn.layer_norm.bias",
    "ffn.fc.weight": "ff.layer_1.weight",
    "ffn.fc.bias": "ff.layer_1.bias",
    "ffn.proj.weight": "ff.layer_2.weight",
    "ffn.proj.bias": "ff.layer_2.bias",
    "ffn.ln.weight": "ff.layer_norm.weight",
    "ffn.ln.bias": "ff.layer_norm.bias",
}
_IN_PROJ = ("attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.r.weight")  # (d, H, dh) -> (H*dh, d)


def hf_name(ours: str) -> str:
    if ours in _TOP:
        return _TOP[ours]
    m = re.match(r"blocks\.(\d+)\.(.+)$", ours)
    if not m or m.group(2) not in _BLOCK:
        raise KeyError(f"no transformers name for {ours!r}")
    return f"transformer.layer.{m.group(1)}.{_BLOCK[m.group(2)]}"


def _to_hf(ours: str, value: torch.Tensor, cfg: XLNetConfig) -> torch.Tensor:
    part = ours.split(".", 2)[-1]
    d, h = cfg.d_model, cfg.n_head
    if part in _IN_PROJ:
        return value.t().reshape(d, h, d // h)
    if part == "attn.o.weight":
        return value.reshape(d, h, d // h)
    return value.view(1, 1, d) if ours == "embed.mask_emb" else value


def _from_hf(ours: str, value: torch.Tensor) -> torch.Tensor:
    part = ours.split(".", 2)[-1]
    if part in _IN_PROJ:
        return value.flatten(1).t()
    if part == "attn.o.weight":
        return value.flatten(1)
    return value.flatten() if ours == "embed.mask_emb" else value


def to_hf_state_dict(sd: dict[str, torch.Tensor], cfg: XLNetConfig) -> dict[str, torch.Tensor]:
    return {hf_name(k): _to_hf(k, v, cfg).contiguous() for k, v in sd.items()}


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor], ours_keys: list[str]) -> dict[str, torch.Tensor]:
    """Our state dict from transformers' (every key of ours must be found; the tied output weight
    falls back to the word embedding when transformers' dict leaves it out)."""
    hf_sd = {"lm_loss.weight": hf_sd["transformer.word_embedding.weight"], **hf_sd}
    return {k: _from_hf(k, hf_sd[hf_name(k)]).contiguous() for k in ours_keys}


def to_hf_config(cfg: XLNetConfig, *, pad_id: int = 5, bos_id: int = 1, eos_id: int = 2):
    """The matching transformers config; special ids default to the ``xlnet`` tokenizer profile's
    order (``<unk> <s> </s> <cls> <sep> <pad> <mask> <eod>``). Memory is returned in training too
    when ``mem_len`` > 0, as ours does."""
    from transformers import XLNetConfig as HFConfig

    return HFConfig(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        d_inner=cfg.d_ff,
        ff_activation="gelu",
        attn_type=cfg.attn_type,
        layer_norm_eps=cfg.layer_norm_eps,
        dropout=cfg.dropout,
        mem_len=cfg.mem_len or None,
        reuse_len=cfg.reuse_len or None,
        use_mems_eval=cfg.mem_len > 0,
        use_mems_train=cfg.mem_len > 0,
        bi_data=cfg.bi_data,
        clamp_len=cfg.clamp_len if cfg.clamp_len > 0 else -1,
        same_length=False,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        tie_word_embeddings=True,
    )


def from_hf_config(hf_cfg) -> XLNetConfig:
    if hf_cfg.same_length:
        raise ValueError("same_length=True (every query sees the same number of keys) is not implemented here")
    if hf_cfg.ff_activation != "gelu":
        raise ValueError(f"ff_activation={hf_cfg.ff_activation!r}: only XLNet's 'gelu' is implemented here")
    return XLNetConfig(
        n_layer=hf_cfg.n_layer,
        n_head=hf_cfg.n_head,
        d_model=hf_cfg.d_model,
        d_ff=hf_cfg.d_inner,
        vocab_size=hf_cfg.vocab_size,
        mem_len=hf_cfg.mem_len or 0,
        reuse_len=hf_cfg.reuse_len or 0,
        attn_type=hf_cfg.attn_type,
        bi_data=hf_cfg.bi_data,
        clamp_len=max(hf_cfg.clamp_len, 0),
        layer_norm_eps=hf_cfg.layer_norm_eps,
        dropout=hf_cfg.dropout,
    )


def import_hf(hf_model) -> tuple[XLNetConfig, dict[str, torch.Tensor]]:
    """A transformers ``XLNetLMHeadModel`` -> our config and state dict."""
    cfg = from_hf_config(hf_model.config)
    return cfg, from_hf_state_dict(hf_model.state_dict(), state_dict_keys(XLNet, cfg))


def export_hf(
    cfg: XLNetConfig,
    state_dict: dict[str, torch.Tensor],
    out_dir: str,
    *,
    tokenizer_file: str | None = None,
    profile: str | None = None,
) -> None:
    """Write a folder ``XLNetLMHeadModel.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load
    (safetensors weights). The tokenizer pads on the left, as XLNet puts ``<cls>`` last, and returns
    no token_type_ids: the ``plm`` objective trains without segments, and transformers adds the
    segment term whenever they are passed."""
    from transformers import XLNetLMHeadModel

    tok = hf_tokenizer(
        tokenizer_file,
        PROFILES[profile or "xlnet"].roles,
        context_length=cfg.context_length,
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )
    ids = (
        {"pad_id": tok.pad_token_id, "bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id} if tok is not None else {}
    )
    model = XLNetLMHeadModel(to_hf_config(replace(cfg, dropout=0.0), **ids))
    save_exported(out_dir, model, to_hf_state_dict(state_dict, cfg), tok)
