"""CVT's registry row: a BiLSTM tagger, primary and auxiliary-view prediction modules per task
(objectives/cvt.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from glm_dist.families.cvt import model as cvt
from glm_dist.families.spec import FamilySpec, option


@dataclass
class CvtOptions:
    tags: Optional[list] = option("tags per task, one prediction module each (the tagging shard set's tasks, in order)")
    unlabelled_dropout: Optional[float] = option(
        "dropout of the auxiliary modules' encoder pass on unlabelled "
        "minibatches (model.dropout is the labelled one's)",
        bounds="[0, 1)",
    )


FAMILIES = {
    "cvt": FamilySpec(cvt.FLAVORS, cvt.cvt_config, cvt.CVT, ("cvt",), tokenizer_profile="word", options=CvtOptions),
}
