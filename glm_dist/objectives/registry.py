"""The objectives by name: one row per objective (docs/architecture.md, decision 10).

Each row is the object its own file defines (``objectives/<name>.py``), with its options; nothing
else in the library tests an objective's name. Also here: what the config's ``objective`` section
reads of the rows (which keys an objective takes), and the collation of samples into a batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from glm_dist.objectives import (
    awd_lm,
    bilm,
    clm,
    cvt,
    denoising,
    electra,
    glove,
    mlm,
    mlm_nsp,
    plm,
    sop,
    span_corruption,
)
from glm_dist.objectives.base import IGNORE_INDEX, Objective
from glm_dist.objectives.cvt_translation import CVT_TRANSLATION
from glm_dist.objectives.translation import TRANSLATION

OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        clm.CLM,
        mlm.MLM,
        mlm_nsp.MLM_NSP,
        sop.SOP,
        span_corruption.SPAN_CORRUPTION,
        denoising.DENOISING,
        electra.ELECTRA,
        plm.PLM,
        glove.GLOVE,
        bilm.BILM,
        TRANSLATION,
        awd_lm.AWD_LM,
        cvt.CVT,
        CVT_TRANSLATION,
    )
}


def get_objective(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise KeyError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


def options_from_config(section, model_cfg=None):
    """What objective ``section.name`` reads as ``opts``: the section's options of that objective
    and what its data takes from ``model_cfg`` (the built model config)."""
    return get_objective(section.name).options(section.options, model_cfg)


def option_keys() -> dict[str, tuple[dataclasses.Field, list[str]]]:
    """Every key an objective takes under ``objective:`` -> (its field, the objectives that take
    it). Objectives that share a key share its type and default (MLM's and ELECTRA's
    ``mask_rate``), so a config written for one reads the same for the other."""
    keys: dict[str, tuple[dataclasses.Field, list[str]]] = {}
    for name, objective in OBJECTIVES.items():
        for f in dataclasses.fields(objective.Options):
            if f.name in keys:
                first, users = keys[f.name]
                if (first.type, first.default) != (f.type, f.default):
                    raise TypeError(
                        f"objective key {f.name!r}: {name} declares {f.type} = {f.default!r}, "
                        f"{users[0]} {first.type} = {first.default!r}; give them one meaning"
                    )
                users.append(name)
            else:
                keys[f.name] = (f, [name])
    return keys


def options_schema(name: str, keys: dict) -> tuple[type | None, dict]:
    """The options dataclass of objective ``name`` for ``keys`` set under ``objective:`` beside
    it, and the keys to build it from. A key of another objective at its default is no setting
    (a resolved config of an earlier version lists every objective's keys) and is dropped; set to
    anything else it is kept, so the config loader refuses it as not this objective's key. An
    unknown objective is left to the config checks to name."""
    if name not in OBJECTIVES:
        return None, keys
    others = option_keys()
    return OBJECTIVES[name].Options, {
        k: v for k, v in keys.items() if k not in others or name in others[k][1] or v != others[k][0].default
    }


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
                np.stack([np.arange(to) < a.shape[0] for a in arrays]).astype(np.int64)
            )
    return batch
