"""A checkpoint of any layout -> the unsplit model's fp32 state dict (``glm eval``, ``export-hf``,
``finetune``), assembled one parameter at a time from the shards every rank wrote: memory holds
the output and at most one parameter being assembled. Only the fp32 shards (and the small JSON
files) are verified and read; the optimizer moments are not touched.

The model config in meta.json is data like the rest: it is checked as a user's config is
(``saved_model_config``) before anything is built from it, and every tensor is allocated only in
the shape that model has."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from glm_common.storage import Storage
from glm_dist.checkpoint.errors import checkpoint_storage
from glm_dist.checkpoint.files import MAX_TOKENIZER_BYTES, CheckpointError, verify
from glm_dist.checkpoint.shards import ShardIndex
from glm_dist.config.checks import MODEL_OVERRIDES, check_ranges
from glm_dist.config.loader import ConfigError
from glm_dist.config.schema import Config, ModelConfig
from glm_dist.families.registry import FAMILIES, build_model, model_config_from_dict

READ_FOR_WEIGHTS = re.compile(r"^(shards/rank\d{5}\.(fp32|buffer)\.safetensors|shards/rank\d{5}\.json)$")
# the largest model the plan publishes (GPT-3 175B): a checkpoint describing a bigger one is refused
MAX_PARAMS = max(flavor.params for spec in FAMILIES.values() for flavor in spec.flavors.values())
MAX_INT = 2**24  # any integer of a model config (widths, vocabularies, ids) lies within +-this
MAX_LIST = 64  # elements of a list field (ELMo's filters, CVT's tags)
MAX_COUNT = 1024  # n_layer, n_head, n_highway: modules are built one by one (GPT-3 175B has 96 layers)


def consolidated_state_dict(path: str | Path | Storage) -> tuple[dict[str, torch.Tensor], dict]:
    """fp32 model weights (and persistent buffers) of any checkpoint, under the one-process model's
    names, tied names included, + its meta.json."""
    ckpt = checkpoint_storage(path)
    meta = verify(ckpt, only=lambda rel: "/" not in rel or READ_FOR_WEIGHTS.match(rel) is not None)
    _, model = saved_model(meta, ckpt)
    index = ShardIndex(ckpt, meta)
    expected = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    for kind in ("fp32", "buffer"):
        for name in index.names(kind):
            want = expected.get(name)
            if want is None or tuple(want.shape) != index.shape(name, kind):
                raise CheckpointError(
                    f"checkpoint {ckpt} holds {name} ({kind}) of shape "
                    f"{list(index.shape(name, kind))}, which its {meta['model_family']} model "
                    + ("does not have" if want is None else f"has as {list(want.shape)}")
                    + "; the checkpoint is corrupt or was edited"
                )
    sd = {name: index.whole(name, "fp32", torch.float32) for name in index.names("fp32")}
    sd.update({name: index.whole(name, "buffer", expected[name].dtype) for name in index.names("buffer")})
    return _with_tied(sd, model), meta


def saved_model(meta: dict, ckpt: Storage | str) -> tuple[Any, nn.Module]:
    """The model config a checkpoint's meta.json describes and its model on the meta device (shapes
    and dtypes, no memory), the config checked as a user's config is before anything is built from
    it: a known family, its config's own fields with their types, every number within the ranges
    ``glm train`` checks (``check_ranges``), the heads dividing the width; then at most
    ``MAX_PARAMS`` parameters."""
    where = f"{ckpt}/meta.json"
    name, fields = meta.get("model_family"), meta.get("model_config")
    if not isinstance(name, str) or name not in FAMILIES:
        raise CheckpointError(
            f"{where}: model_family {str(name)[:80]!r} is not a model family of this glm-dist "
            f"({', '.join(FAMILIES)}); the checkpoint is corrupt or from another program"
        )
    if not isinstance(fields, dict):
        raise CheckpointError(f"{where}: no model_config; the checkpoint is corrupt")
    _check_fields(name, fields, where)
    _check_like_a_user_config(name, fields, where)
    with torch.device("meta"):
        try:
            cfg = model_config_from_dict(name, fields)
            model = build_model(name, cfg)
        except (ValueError, TypeError, KeyError, IndexError, RuntimeError, AssertionError, ZeroDivisionError) as err:
            raise CheckpointError(
                f"{where}: its {name} model cannot be built ({type(err).__name__}: "
                f"{str(err)[:200]}); the checkpoint is corrupt"
            ) from None
    params = sum(p.numel() for p in model.parameters())
    if params > MAX_PARAMS:
        raise CheckpointError(
            f"{where}: its {name} model has {params:.3g} parameters, more than the largest the plan "
            f"publishes ({MAX_PARAMS:.3g}); the checkpoint is corrupt or crafted"
        )
    return cfg, model


def _annotation(declared: Any) -> str:
    """A dataclass field's type as written (``"int | None"``), whether or not annotations are strings."""
    return declared if isinstance(declared, str) else getattr(declared, "__name__", str(declared))


def _check_fields(name: str, fields: dict, where: str) -> None:
    """Every field one of the family's config, of its type; none missing that has no default."""
    declared = {f.name: f for f in dataclasses.fields(type(next(iter(FAMILIES[name].flavors.values())).cfg))}
    for key, value in fields.items():
        if (
            key not in declared
            or not _fits(value, _annotation(declared[key].type))
            or (key.startswith("n_") and isinstance(value, int) and value > MAX_COUNT)
        ):
            raise CheckpointError(
                f"{where}: model_config.{str(key)[:80]}={str(value)[:80]} is not a {name} config "
                f"field of type {declared[key].type if key in declared else '(none)'} (integers "
                f"within +-{MAX_INT}, counts up to {MAX_COUNT}); the "
                f"checkpoint is corrupt or from another program"
            )
    missing = [
        k
        for k, f in declared.items()
        if k not in fields and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise CheckpointError(f"{where}: model_config lacks {', '.join(missing)}; the checkpoint is corrupt")


def _fits(value: Any, annotation: str) -> bool:
    """Whether a JSON value is of a config field's type (``int``, ``float | None``, ``tuple``, ...),
    integers within +-``MAX_INT`` and floats finite."""
    kinds = {part.strip() for part in annotation.split("|")}
    if value is None or isinstance(value, bool):
        return ("None" if value is None else "bool") in kinds
    if isinstance(value, int):
        return bool(kinds & {"int", "float"}) and abs(value) <= MAX_INT
    if isinstance(value, float):
        return "float" in kinds and math.isfinite(value)
    if isinstance(value, str):
        return "str" in kinds and len(value) <= 64
    if isinstance(value, list):
        return (
            "tuple" in kinds
            and len(value) <= MAX_LIST
            and all(
                _fits(v, "int") or (isinstance(v, list) and len(v) <= MAX_LIST and all(_fits(x, "int") for x in v))
                for v in value
            )
        )
    return False


def _check_like_a_user_config(name: str, fields: dict, where: str) -> None:
    """The checks of a user's ``model.*`` keys (``check_ranges``), on the fields a config file can
    set, and the heads dividing the width (``validate``'s rule)."""
    cfg = Config(model=ModelConfig(family=name, **{k: fields[k] for k in MODEL_OVERRIDES if k in fields}))
    cfg.__dict__["_sources"] = {f"model.{k}": where for k in MODEL_OVERRIDES}
    try:
        check_ranges(cfg)
    except ConfigError as err:
        raise CheckpointError(f"the checkpoint's model config is unusable: {err}") from None
    d_model, n_head = fields.get("d_model"), fields.get("n_head")
    if isinstance(d_model, int) and isinstance(n_head, int) and d_model % n_head:
        raise CheckpointError(
            f"{where}: model_config.n_head={n_head} does not divide d_model={d_model}; the checkpoint is corrupt"
        )


def _with_tied(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Add the names a tied weight also goes by (GPT's ``head.lm_head.weight`` is the token
    embedding), as a full ``state_dict()`` lists them; ``model`` is the checkpoint's, on the meta device."""
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), name)
        if name not in sd and first[id(p)] in sd:
            sd[name] = sd[first[id(p)]]
    return sd


def checkpoint_tokenizer(path: str | Path | Storage):
    """The run's tokenizer, saved in the checkpoint (a local folder or a URL), read with a bound."""
    from tokenizers import Tokenizer

    ckpt = checkpoint_storage(path)
    text = ckpt.read("tokenizer.json", max_bytes=MAX_TOKENIZER_BYTES)
    try:
        return Tokenizer.from_str(text.decode("utf-8"))
    except Exception as err:  # tokenizers raises its own Exception subclass for a malformed file
        raise CheckpointError(
            f"checkpoint file {ckpt}/tokenizer.json is corrupt ({str(err)[:200]}); use an earlier checkpoint"
        ) from None


def saved_layout(meta: dict) -> dict:
    """The (data, pipeline, tensor, ZeRO) layout a checkpoint was saved at."""
    return meta["layout"]
