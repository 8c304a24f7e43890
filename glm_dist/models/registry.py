"""Families and their flavors, looked up by name (never ``if "gpt" in name``)."""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from glm_dist.models import bart, bert, gpt, t5


def _family(flavors: dict, prefix: str) -> dict:
    return {name: f for name, f in flavors.items() if name.startswith(prefix)}


# family -> (flavor table, config factory, model class)
FAMILIES: dict[str, tuple[dict[str, Any], Callable[..., Any], type[nn.Module]]] = {
    "gpt": (gpt.FLAVORS, gpt.gpt_config, gpt.GPT),
    **{name: (_family(bert.FLAVORS, name + "-"), bert.encoder_config, bert.Encoder)
       for name in ("bert", "roberta", "albert")},
    "electra": (_family(bert.FLAVORS, "electra-"), bert.encoder_config, bert.ElectraPair),
    "t5": (t5.FLAVORS, t5.t5_config, t5.T5),
    "bart": (bart.FLAVORS, bart.bart_config, bart.Bart),
}


def resolve_model_config(family: str, flavor: str, **overrides) -> Any:
    if family not in FAMILIES:
        raise KeyError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[family][1](flavor, **overrides)


def build_model(family: str, model_cfg: Any) -> nn.Module:
    return FAMILIES[family][2](model_cfg)


def published_flavors(family: str) -> dict[str, Any]:
    """Flavors with a published parameter count (the ``tiny`` test flavors have none)."""
    return {name: flavor for name, flavor in FAMILIES[family][0].items() if flavor.params}


def model_config_from_dict(family: str, fields: dict) -> Any:
    """Rebuild a family's model config from its saved fields (checkpoint meta.json)."""
    flavors = FAMILIES[family][0]
    config_cls = type(next(iter(flavors.values())).cfg)
    return config_cls(**fields)
