"""CoVe's registry row: an attentional LSTM translation model over frozen GloVe inputs; its encoder
exports the features."""
from __future__ import annotations

from glm_dist.families.cove import model as cove
from glm_dist.families.spec import FamilySpec

FAMILIES = {
    "cove": FamilySpec(cove.FLAVORS, cove.cove_config, cove.CoVe, ("translation", "cvt_translation"),
                       prepare="glm_dist.families.cove.model:load_inputs",
                       features="glm_dist.transfer.cove:cove_features"),
}
