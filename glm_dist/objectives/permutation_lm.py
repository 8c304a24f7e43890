"""XLNet permutation language modelling inputs (zihangdai/xlnet data_utils.py; transformers'
DataCollatorForPermutationLanguageModeling).

Spans of 1..max_span tokens are chosen to be predicted, one per context of span / (1/6) tokens,
so about 1/6 of the tokens are targets. A random factorisation order (a permutation of halves, as
the reference collator) gives ``perm_mask[i, j] = 1`` when i may not attend to j.
"""
from __future__ import annotations

import numpy as np

IGNORE_INDEX = -100


def plm_inputs(tokens: np.ndarray, rng: np.random.Generator, *, special_ids: np.ndarray,
               plm_probability: float = 1 / 6, max_span: int = 5) -> dict[str, np.ndarray]:
    n = len(tokens)
    if n % 2:
        raise ValueError(f"permutation LM needs an even sequence length, got {n}")
    masked = np.zeros(n, dtype=bool)
    cur = 0
    while cur < n:
        span = int(rng.integers(1, max_span + 1))
        context = int(span / plm_probability)
        start = cur + int(rng.integers(0, context - span + 1))
        masked[start:start + span] = True
        cur += context
    masked &= ~np.isin(tokens, special_ids)
    labels = np.where(masked, tokens, IGNORE_INDEX)
    order = np.arange(n).reshape(-1, n // 2).T  # (n/2, 2): pairs (i, i + n/2)
    order = order[rng.permutation(n // 2)].T.reshape(-1)
    perm = np.empty(n, dtype=np.int64)
    perm[order] = np.arange(n)  # factorisation position of each token
    perm = np.where(masked, perm, -1)  # context tokens come first: everyone may see them
    perm_mask = (perm[:, None] <= perm[None, :]) & masked[:, None]
    # target_mapping over all positions, as the reference collator (labels say which are predicted)
    return {"input_ids": tokens, "labels": labels, "perm_mask": perm_mask.astype(np.float32),
            "target_mapping": np.eye(n, dtype=np.float32)}
