"""CVT's registry row: a BiLSTM tagger, primary and auxiliary-view prediction modules per task
(objectives/cvt.py)."""
from __future__ import annotations

from glm_dist.families.cvt import model as cvt
from glm_dist.families.spec import FamilySpec

FAMILIES = {
    "cvt": FamilySpec(cvt.FLAVORS, cvt.cvt_config, cvt.CVT, ("cvt",)),
}
