"""CoVe's registry row: an attentional LSTM translation model over frozen GloVe inputs; its encoder
exports the features."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from glm_dist.families.cove import model as cove
from glm_dist.families.spec import FamilySpec, option


@dataclass
class CoVeOptions:
    cvt_decoders: Optional[bool] = option(
        "two auxiliary decoders for Cross-View Training (objective.name="
        "cvt_translation): attention dropout and future-word prediction"
    )
    cvt_attention_dropout: Optional[float] = option(
        "with cvt_decoders: fraction of the attention-dropout view's attention weights zeroed (0.5)", bounds="[0, 1)"
    )
    cvt_beam: Optional[int] = option(
        "with cvt_decoders: beam of the primary decoder's translations of unlabelled "
        "sources, the auxiliary decoders' targets (4; 1: greedy)",
        bounds="[1, 1024]",
    )


FAMILIES = {
    "cove": FamilySpec(
        cove.FLAVORS,
        cove.cove_config,
        cove.CoVe,
        ("translation", "cvt_translation"),
        tokenizer_profile="word",
        prepare="glm_dist.families.cove.model:load_inputs",
        features="glm_dist.transfer.cove:cove_features",
        options=CoVeOptions,
    ),
}
