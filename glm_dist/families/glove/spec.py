"""GloVe's registry row: the recurrent era's families run data parallel + ZeRO only (no pipeline, no
tensor split, no transformers export)."""

from __future__ import annotations

from glm_dist.families.glove import model as glove
from glm_dist.families.spec import FamilySpec

FAMILIES = {
    "glove": FamilySpec(glove.FLAVORS, glove.glove_config, glove.GloVe, ("glove",), tokenizer_profile="word"),
}
