"""The objectives by name: one row per objective (docs/architecture.md, decision 10).

Each row is the object its own file defines (``objectives/<name>.py``); nothing else in the
library tests an objective's name. Also here: the options every objective reads (the config's
``objective`` section) and the collation of samples into a batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from glm_dist.objectives import (awd_lm, bilm, clm, cvt, denoising, electra, glove, mlm, mlm_nsp, plm, sop,
                                 span_corruption)
from glm_dist.objectives.base import IGNORE_INDEX, Objective
from glm_dist.objectives.cvt_translation import CVT_TRANSLATION
from glm_dist.objectives.translation import TRANSLATION

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    clm.CLM, mlm.MLM, mlm_nsp.MLM_NSP, sop.SOP, span_corruption.SPAN_CORRUPTION, denoising.DENOISING,
    electra.ELECTRA, plm.PLM, glove.GLOVE, bilm.BILM, TRANSLATION, awd_lm.AWD_LM, cvt.CVT, CVT_TRANSLATION)}


def get_objective(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise KeyError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


@dataclass(frozen=True)
class ObjectiveOptions:
    masking: mlm.MaskingConfig = mlm.MaskingConfig()
    noise_density: float = 0.15  # T5
    mean_span: float = 3.0  # T5
    denoising: denoising.DenoisingConfig = denoising.DenoisingConfig()
    plm_probability: float = 1 / 6
    max_span: int = 5  # XLNet
    plm_layout: str = "collator"  # XLNet: collator | paper (objectives/plm.py)
    reuse_len: int = 0  # XLNet's paper layout: the tokens of a segment the next one keeps as memory
    bi_data: bool = False  # XLNet: odd streams read backwards
    tag_counts: tuple = ()  # CVT: the model's tags per task (checked against the shard set's tasks)
    cvt_unlabelled: bool = True  # CVT: unlabelled minibatches between the labelled ones


def options_from_config(o, model_cfg=None) -> ObjectiveOptions:
    """``ObjectiveOptions`` from the config tree's ``objective`` section (and the model config's
    segment layout, for objectives whose data follows the model's memory)."""
    return ObjectiveOptions(
        plm_layout=o.plm_layout, reuse_len=getattr(model_cfg, "reuse_len", 0) or 0,
        bi_data=bool(getattr(model_cfg, "bi_data", False)),
        tag_counts=tuple(getattr(model_cfg, "tags", ())), cvt_unlabelled=o.cvt_unlabelled,
        masking=mlm.MaskingConfig(rate=o.mask_rate, mask_frac=o.mask_frac, random_frac=o.random_frac,
                                  max_ngram=o.max_ngram, whole_word=o.whole_word),
        noise_density=o.noise_density, mean_span=o.mean_span,
        denoising=denoising.DenoisingConfig(mask_ratio=o.mask_ratio, poisson_lambda=o.poisson_lambda,
                                            permute_sentences=o.permute_sentences, random_ratio=o.random_ratio))


PAD_VALUES = {"labels": IGNORE_INDEX, "masked_labels": IGNORE_INDEX, "target_labels": IGNORE_INDEX}
SHORT_LISTS = ("masked_positions", "masked_labels", "target_labels")  # padded to the batch's longest, not to seq_len


def collate(samples: list[dict[str, np.ndarray]], *, pad_id: int, width: int | None = None) -> dict[str, torch.Tensor]:
    """Stack samples, right-padding sequences to ``width`` (or the longest) -- ids with ``pad_id``,
    labels with -100, the rest with 0 -- and adding ``attention_mask`` when inputs were padded."""
    batch: dict[str, torch.Tensor] = {}
    for key in samples[0]:
        arrays = [np.asarray(s[key]) for s in samples]
        if arrays[0].ndim == 0:
            batch[key] = torch.from_numpy(np.stack(arrays).astype(np.int64))
            continue
        longest = max(a.shape[0] for a in arrays)
        to = max(width or 0, longest) if arrays[0].ndim == 1 and key not in SHORT_LISTS else longest
        fill = PAD_VALUES.get(key, pad_id if key.endswith("input_ids") else 0)
        padded = [np.pad(a, [(0, to - a.shape[0])] + [(0, 0)] * (a.ndim - 1), constant_values=fill) for a in arrays]
        out = np.stack(padded)
        batch[key] = torch.from_numpy(out.astype(np.float32 if out.dtype.kind == "f" else np.int64))
        if key == "input_ids" and any(a.shape[0] < to for a in arrays):
            batch["attention_mask"] = torch.from_numpy(
                np.stack([np.arange(to) < a.shape[0] for a in arrays]).astype(np.int64))
    return batch
