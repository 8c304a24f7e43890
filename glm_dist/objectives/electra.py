"""ELECTRA replaced-token detection (google-research/electra pretrain_helpers.py).

The generator sees an MLM input: 15% of tokens selected (25% for large), of those 85% replaced by
[MASK] and 15% kept (no random replacement: the generator's samples play that role). The
discriminator sees the generator's samples at the selected positions and predicts, for every
position, whether the token differs from the original. Loss = generator MLM + 50 x discriminator.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from glm_dist.objectives.mlm import IGNORE_INDEX, MaskingConfig

GENERATOR_MASKING = MaskingConfig(rate=0.15, mask_frac=0.85, random_frac=0.0)
DISCRIMINATOR_WEIGHT = 50.0


def discriminator_inputs(input_ids: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace the selected positions with the generator's samples; targets = (token != original)."""
    selected = labels != IGNORE_INDEX
    original = torch.where(selected, labels, input_ids)
    replaced = torch.where(selected, sampled, original)
    return replaced, (replaced != original).float()


def loss(gen_logits: torch.Tensor, labels: torch.Tensor, disc_logits: torch.Tensor, disc_targets: torch.Tensor,
         attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    gen = F.cross_entropy(gen_logits.float().view(-1, gen_logits.size(-1)), labels.view(-1), ignore_index=IGNORE_INDEX)
    weight = attention_mask.float() if attention_mask is not None else torch.ones_like(disc_targets)
    disc = F.binary_cross_entropy_with_logits(disc_logits.float(), disc_targets, weight=weight, reduction="sum")
    return gen + DISCRIMINATOR_WEIGHT * disc / weight.sum()


def rate_for(flavor: str) -> float:
    """Generator mask rate: 25% for ELECTRA-large, 15% otherwise (the paper's appendix)."""
    return 0.25 if flavor.endswith("large") else 0.15

