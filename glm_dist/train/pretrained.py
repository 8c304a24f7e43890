"""Starting a run from a pretrained checkpoint's weights (``train.init_from``): ULMFiT's second stage
fine-tunes the general-domain LM on the target task's text with a new optimizer, schedule and data
position. The checkpoint must be of the same family and tokenizer (its token ids mean the same)."""

from __future__ import annotations

from torch import nn

from glm_dist.checkpoint.consolidate import consolidated_state_dict
from glm_dist.config.loader import ConfigError


def check_same_tokenizer(checkpoint: str, meta: dict, tokenizer_sha256: str, *, key: str) -> None:
    """A checkpoint's weights continue only on text its own tokenizer encoded: the same vocabulary size
    does not mean the same tokens (a RoBERTa and a GPT-2 byte BPE of 2,048 ids share no meaning)."""
    if meta.get("tokenizer_sha256") != tokenizer_sha256:
        raise ConfigError(
            f"{key} was trained with another tokenizer than data.shards_dir's: use the shard set it was "
            f"trained on ({meta.get('shards_dir')}) or encode the text with its tokenizer "
            f"(data.tokenizer={checkpoint}/tokenizer.json)"
        )


def load_pretrained(model: nn.Module, checkpoint: str, *, family: str, tokenizer_sha256: str) -> dict:
    """Copy ``checkpoint``'s weights into ``model`` (every one of its parameters must be there);
    returns the checkpoint's meta.json."""
    sd, meta = consolidated_state_dict(checkpoint)
    if meta["model_family"] != family:
        raise ConfigError(f"train.init_from={checkpoint} is a {meta['model_family']!r} checkpoint, not {family!r}")
    check_same_tokenizer(checkpoint, meta, tokenizer_sha256, key=f"train.init_from={checkpoint}")
    missing = sorted(set(model.state_dict()) - set(sd))
    if missing:
        raise ConfigError(
            f"train.init_from={checkpoint} lacks weights {missing[:5]} of this model "
            "(a model config other than the checkpoint's?)"
        )
    try:
        model.load_state_dict({k: v for k, v in sd.items() if k in model.state_dict()})
    except RuntimeError as err:  # shapes: another flavor or vocabulary size
        raise ConfigError(
            f"train.init_from={checkpoint} does not fit this model: {str(err).splitlines()[-1].strip()}"
        ) from None
    return meta
