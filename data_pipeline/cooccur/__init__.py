"""GloVe's co-occurrence counts: word-level token shards -> sparse count shards (``glm data cooccur``)."""

import numpy as np

# One co-occurrence: word i, context word j, X_ij (a count block's ``tokens.npy`` is an array of these).
TRIPLE = np.dtype([("word", "<u4"), ("context", "<u4"), ("count", "<f4")])
