"""ELMo's registry row: a character-CNN biLM whose layers are read as features (glm features)."""

from __future__ import annotations

from glm_dist.families.elmo import model as elmo
from glm_dist.families.spec import FamilySpec

FAMILIES = {
    "elmo": FamilySpec(
        elmo.FLAVORS,
        elmo.elmo_config,
        elmo.ELMo,
        ("bilm",),
        tokenizer_profile="word",
        features="glm_dist.transfer.elmo:layer_features",
    ),
}
