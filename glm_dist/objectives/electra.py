"""ELECTRA replaced-token detection (google-research/electra pretrain_helpers.py).

The generator sees an MLM input: 15% of tokens selected (25% for large), of those 85% replaced by
[MASK] and 15% kept (no random replacement: the generator's samples play that role). The
discriminator sees the generator's samples at the selected positions and predicts, for every
position, whether the token differs from the original. Loss = generator MLM + 50 x discriminator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from glm_dist.objectives.base import IGNORE_INDEX, encoder_inputs, option, selected_nll, token_sums
from glm_dist.objectives.mlm import MaskedLM, MaskingOptions

GENERATOR_MASKING = MaskingOptions(mask_rate=0.15, mask_frac=0.85, random_frac=0.0)
DISCRIMINATOR_WEIGHT = 50.0


@dataclass(frozen=True)
class GeneratorOptions:
    """The keys of ``electra`` under ``objective:``: the generator's selection; how the selected
    tokens are replaced is ELECTRA's (85% mask, 15% kept)."""

    mask_rate: float = option(0.15, "fraction of the maskable tokens selected for prediction", bounds="(0, 1]")
    whole_word: bool = option(False, "mask all pieces of a word together")


def discriminator_inputs(
    input_ids: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace the selected positions with the generator's samples; targets = (token != original)."""
    selected = labels != IGNORE_INDEX
    original = torch.where(selected, labels, input_ids)
    replaced = torch.where(selected, sampled, original)
    return replaced, (replaced != original).float()


def loss(
    gen_logits: torch.Tensor,
    batch: dict[str, torch.Tensor],
    disc_logits: torch.Tensor,
    disc_targets: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The generator's MLM loss over the selected positions only (their rows of the (B, T, V) logits
    gathered, then cast to fp32; no host sync) + 50 x the discriminator's mean over real tokens."""
    nll, count, _, _ = selected_nll(gen_logits, batch)
    gen = nll / count.clamp(min=1)
    weight = attention_mask.float() if attention_mask is not None else torch.ones_like(disc_targets)
    disc = F.binary_cross_entropy_with_logits(disc_logits.float(), disc_targets, weight=weight, reduction="sum")
    return gen + DISCRIMINATOR_WEIGHT * disc / weight.sum()


def rate_for(flavor: str) -> float:
    """Generator mask rate: 25% for ELECTRA-large, 15% otherwise (the paper's appendix)."""
    return 0.25 if flavor.endswith("large") else 0.15


class ReplacedTokenDetection(MaskedLM):
    """ELECTRA: the generator's MLM input from FULL-SENTENCES units; the discriminator's targets
    come from the generator's samples inside the model."""

    Options = GeneratorOptions

    def masking(self, opts) -> MaskingOptions:
        return replace(GENERATOR_MASKING, mask_rate=opts.mask_rate, whole_word=opts.whole_word)

    def loss(self, model, batch, *, metrics):
        out = model(
            batch["input_ids"],
            batch["labels"],
            masked_positions=batch.get("masked_positions"),
            **{k: v for k, v in encoder_inputs(batch).items() if k != "input_ids"},
        )
        total = loss(out["gen_logits"], batch, out["disc_logits"], out["disc_targets"], batch.get("attention_mask"))
        if not metrics:
            return total, {}
        nll, _, picked, targets = selected_nll(out["gen_logits"], batch)
        real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(batch["labels"]).bool()
        disc_right = ((out["disc_logits"] > 0).float() == out["disc_targets"])[real]
        return total, {
            **token_sums(nll, picked, targets),
            "disc_tokens": int(real.sum()),
            "disc_correct": int(disc_right.sum()),
        }

    def report(self, totals):
        return {**super().report(totals), "replaced_accuracy": totals["disc_correct"] / max(totals["disc_tokens"], 1)}

    def stage_inputs(self, batch, device):
        raise NotImplementedError(f"objective {self.name} does not run in a pipeline")


ELECTRA = ReplacedTokenDetection(
    name="electra", salt=1006, padded=True, sums=("nll", "targets", "correct", "disc_tokens", "disc_correct")
)
