"""XLNet permutation language modelling inputs (zihangdai/xlnet data_utils.py; transformers'
DataCollatorForPermutationLanguageModeling).

Spans of 1..max_span tokens are chosen to be predicted, one per context of span / (1/6) tokens,
so about 1/6 of the tokens are targets. A random factorisation order (a permutation of halves, as
the reference collator) gives ``perm_mask[i, j] = 1`` when i may not attend to j.
"""

from __future__ import annotations

import numpy as np

from glm_dist.objectives.base import IGNORE_INDEX


def plm_inputs(
    tokens: np.ndarray,
    rng: np.random.Generator,
    *,
    special_ids: np.ndarray,
    plm_probability: float = 1 / 6,
    max_span: int = 5,
) -> dict[str, np.ndarray]:
    n = len(tokens)
    if n % 2:
        raise ValueError(f"permutation LM needs an even sequence length, got {n}")
    masked = np.zeros(n, dtype=bool)
    cur = 0
    while cur < n:
        span = int(rng.integers(1, max_span + 1))
        context = int(span / plm_probability)
        start = cur + int(rng.integers(0, context - span + 1))
        masked[start : start + span] = True
        cur += context
    masked &= ~np.isin(tokens, special_ids)
    labels = np.where(masked, tokens, IGNORE_INDEX)
    order = np.arange(n).reshape(-1, n // 2).T  # (n/2, 2): pairs (i, i + n/2)
    order = order[rng.permutation(n // 2)].T.reshape(-1)
    perm = np.empty(n, dtype=np.int64)
    perm[order] = np.arange(n)  # factorisation position of each token
    perm = np.where(masked, perm, -1)  # context tokens come first: everyone may see them
    perm_mask = (perm[:, None] <= perm[None, :]) & masked[None, :]  # i may not see target j ordered at or after it
    # target_mapping: one row per predicted position (XLNet's num_predict), so the query stream runs
    # for those only; the reference collator's eye(n) would run it for every position
    positions = np.flatnonzero(masked)
    target_mapping = np.zeros((len(positions), n), dtype=np.float32)
    target_mapping[np.arange(len(positions)), positions] = 1.0
    return {
        "input_ids": tokens,
        "labels": labels,
        "perm_mask": perm_mask.astype(np.float32),
        "target_mapping": target_mapping,
        "target_labels": tokens[positions],
    }


def two_part_inputs(
    tokens: np.ndarray,
    token_type_ids: np.ndarray,
    reuse_len: int,
    rng: np.random.Generator,
    *,
    special_ids: np.ndarray,
    plm_probability: float = 1 / 6,
    max_span: int = 5,
) -> dict[str, np.ndarray]:
    """XLNet's pretraining layout (data_utils.py ``_local_perm`` on each part): the first
    ``reuse_len`` positions (what the next segment keeps as memory) and the rest are permuted
    separately; the reused part never sees the rest -- its states become the next segment's memory
    and must not carry this segment's later tokens -- while the rest sees all of the reused part."""
    first = plm_inputs(
        tokens[:reuse_len], rng, special_ids=special_ids, plm_probability=plm_probability, max_span=max_span
    )
    rest = plm_inputs(
        tokens[reuse_len:], rng, special_ids=special_ids, plm_probability=plm_probability, max_span=max_span
    )
    n, r = len(tokens), reuse_len
    perm_mask = np.zeros((n, n), dtype=np.float32)
    perm_mask[:r, :r], perm_mask[:r, r:], perm_mask[r:, r:] = first["perm_mask"], 1.0, rest["perm_mask"]
    mapping = np.zeros((len(first["target_mapping"]) + len(rest["target_mapping"]), n), dtype=np.float32)
    mapping[: len(first["target_mapping"]), :r] = first["target_mapping"]
    mapping[len(first["target_mapping"]) :, r:] = rest["target_mapping"]
    return {
        "input_ids": tokens,
        "labels": np.concatenate([first["labels"], rest["labels"]]),
        "perm_mask": perm_mask,
        "target_mapping": mapping,
        "token_type_ids": token_type_ids,
        "target_labels": np.concatenate([first["target_labels"], rest["target_labels"]]),
    }
