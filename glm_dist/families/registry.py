"""The model families: every row of every family package, by name (docs/architecture.md, decision 10).

A family is a package ``families/<family>/`` whose ``spec.py`` builds its ``FamilySpec`` row(s)
(``families/spec.py``): flavors and config factory, model class, objectives, layouts, transformers
adapter, fine-tuning facts. This module only gathers them -- adding a family is one folder, its import
and its place in ``FAMILIES`` below -- and answers the questions the rest of the library asks by family name. No other
module tests a family's name (tests/test_registries.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from glm_dist.families.awd_lstm.spec import FAMILIES as AWD_LSTM
from glm_dist.families.bart.spec import FAMILIES as BART
from glm_dist.families.bert.spec import FAMILIES as ENCODERS
from glm_dist.families.cove.spec import FAMILIES as COVE
from glm_dist.families.cvt.spec import FAMILIES as CVT
from glm_dist.families.elmo.spec import FAMILIES as ELMO
from glm_dist.families.glove.spec import FAMILIES as GLOVE
from glm_dist.families.gpt.spec import FAMILIES as GPT
from glm_dist.families.gpt1.spec import FAMILIES as GPT1
from glm_dist.families.spec import FamilySpec, PipelineSpec, resolve
from glm_dist.families.t5.spec import FAMILIES as T5
from glm_dist.families.xlnet.spec import FAMILIES as XLNET

__all__ = [
    "FAMILIES",
    "FamilySpec",
    "PipelineSpec",
    "build_model",
    "exported_module",
    "family",
    "model_config_from_dict",
    "published_flavors",
    "resolve",
    "resolve_model_config",
]

# the order is the one messages list families in
FAMILIES: dict[str, FamilySpec] = {
    **GPT,
    **GPT1,
    **ENCODERS,
    **T5,
    **XLNET,
    **BART,
    **GLOVE,
    **COVE,
    **ELMO,
    **AWD_LSTM,
    **CVT,
}


def family(name: str) -> FamilySpec:
    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def resolve_model_config(family_name: str, flavor: str, **overrides) -> Any:
    return family(family_name).config(flavor, **overrides)


def build_model(family_name: str, model_cfg: Any) -> nn.Module:
    return family(family_name).model(model_cfg)


def exported_module(family_name: str, model: nn.Module) -> nn.Module:
    """The part of a model that is exported and fine-tuned (the whole model for most families)."""
    part = family(family_name).exported
    return getattr(model, part) if part else model


def published_flavors(family_name: str) -> dict[str, Any]:
    """Flavors with a published parameter count (the ``tiny`` test flavors have none)."""
    return {name: flavor for name, flavor in family(family_name).flavors.items() if flavor.params}


def model_config_from_dict(family_name: str, fields: dict) -> Any:
    """Rebuild a family's model config from its saved fields (checkpoint meta.json); a field the save
    predates takes the family's ``saved_defaults`` value, else the field's default."""
    spec = family(family_name)
    config_cls = type(next(iter(spec.flavors.values())).cfg)
    return config_cls(**{**spec.saved_defaults, **fields})
