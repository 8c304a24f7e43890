"""A checkpoint of any layout -> the unsplit model's fp32 state dict (``glm eval``, ``export-hf``,
``finetune``), assembled one parameter at a time from the shards every rank wrote: memory holds
the output and at most one parameter being assembled. Only the fp32 shards (and the small JSON
files) are verified and read; the optimizer moments are not touched."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from glm_dist.checkpoint.files import MAX_TOKENIZER_BYTES, verify
from glm_dist.checkpoint.shards import ShardIndex
from glm_dist.checkpoint.storage import Storage

READ_FOR_WEIGHTS = re.compile(r"^(shards/rank\d{5}\.(fp32|buffer)\.safetensors|shards/rank\d{5}\.json)$")


def consolidated_state_dict(path: str | Path | Storage) -> tuple[dict[str, torch.Tensor], dict]:
    """fp32 model weights (and persistent buffers) of any checkpoint, under the one-process model's
    names, tied names included, + its meta.json."""
    ckpt = path if isinstance(path, Storage) else Storage(path)
    meta = verify(ckpt, only=lambda rel: "/" not in rel or READ_FOR_WEIGHTS.match(rel) is not None)
    index = ShardIndex(ckpt, meta)
    sd = {name: index.whole(name, "fp32", torch.float32) for name in index.names("fp32")}
    sd.update({name: index.whole(name, "buffer") for name in index.names("buffer")})
    return _with_tied(sd, meta), meta


def _with_tied(sd: dict[str, torch.Tensor], meta: dict) -> dict[str, torch.Tensor]:
    """Add the names a tied weight also goes by (GPT's ``head.lm_head.weight`` is the token
    embedding), as a full ``state_dict()`` lists them."""
    from glm_dist.models.registry import build_model, model_config_from_dict

    with torch.device("meta"):
        model = build_model(meta["model_family"], model_config_from_dict(meta["model_family"], meta["model_config"]))
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), name)
        if name not in sd and first[id(p)] in sd:
            sd[name] = sd[first[id(p)]]
    return sd


def checkpoint_tokenizer(path: str | Path | Storage):
    """The run's tokenizer, saved in the checkpoint (a local folder or a URL), read with a bound."""
    from tokenizers import Tokenizer

    from glm_dist.checkpoint.files import CheckpointError

    ckpt = path if isinstance(path, Storage) else Storage(path)
    text = ckpt.read("tokenizer.json", max_bytes=MAX_TOKENIZER_BYTES)
    try:
        return Tokenizer.from_str(text.decode("utf-8"))
    except Exception as err:  # tokenizers raises its own Exception subclass for a malformed file
        raise CheckpointError(f"checkpoint file {ckpt}/tokenizer.json is corrupt ({str(err)[:200]}); use an earlier "
                              f"checkpoint") from None


def saved_layout(meta: dict) -> dict:
    """The (data, pipeline, tensor, ZeRO) layout a checkpoint was saved at."""
    return meta["layout"]
