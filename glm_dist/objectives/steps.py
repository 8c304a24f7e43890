"""One forward pass and loss per objective: what the trainer and the evaluator call.

``model`` is any callable with the model's signature (the DeepSpeed engine, or the bare module).
Returns the loss and per-batch sums for validation metrics.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from glm_dist.objectives import clm, electra, mlm

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def forward_loss(objective: str, model: Callable, batch: dict[str, torch.Tensor],
                 device: torch.device | str) -> tuple[torch.Tensor, dict[str, float]]:
    """(mean loss, sums for metrics: nll, targets, correct[, sentence_correct, sentences])."""
    batch = {k: v.to(device) for k, v in batch.items()}
    if objective == "clm":
        logits = model(batch["input_ids"])
        losses = clm.token_losses(logits, batch)
        return losses.mean(), {"nll": losses.sum().item(), "targets": losses.numel(),
                               "labels": batch["labels"]}
    if objective in ("mlm", "mlm_nsp", "sop"):
        out = model(**{k: batch[k] for k in MODEL_INPUTS if k in batch})
        labels = batch["labels"]
        chosen = labels != mlm.IGNORE_INDEX
        token_nll = F.cross_entropy(out["logits"].float()[chosen], labels[chosen], reduction="sum")
        loss = token_nll / chosen.sum().clamp(min=1)
        sums = {"nll": token_nll.item(), "targets": int(chosen.sum()),
                "correct": int((out["logits"].argmax(-1)[chosen] == labels[chosen]).sum())}
        if objective != "mlm":  # BERT: mean MLM + mean NSP; ALBERT: + SOP
            sentence = F.cross_entropy(out["sentence_logits"].float(), batch["sentence_label"])
            loss = loss + sentence
            sums.update(sentence_nll=sentence.item() * len(batch["sentence_label"]),
                        sentences=len(batch["sentence_label"]),
                        sentence_correct=int((out["sentence_logits"].argmax(-1) == batch["sentence_label"]).sum()))
        return loss, sums
    if objective in ("span_corruption", "denoising"):  # encoder-decoder: CE over the target tokens
        out = model(batch["input_ids"], batch["decoder_input_ids"], attention_mask=batch.get("attention_mask"))
        labels = batch["labels"]
        chosen = labels != mlm.IGNORE_INDEX
        nll = F.cross_entropy(out["logits"].float()[chosen], labels[chosen], reduction="sum")
        return nll / chosen.sum().clamp(min=1), {
            "nll": nll.item(), "targets": int(chosen.sum()),
            "correct": int((out["logits"].argmax(-1)[chosen] == labels[chosen]).sum())}
    if objective == "electra":
        out = model(batch["input_ids"], batch["labels"], **{k: batch[k] for k in MODEL_INPUTS[1:] if k in batch})
        labels, chosen = batch["labels"], batch["labels"] != mlm.IGNORE_INDEX
        loss = electra.loss(out["gen_logits"], labels, out["disc_logits"], out["disc_targets"],
                            batch.get("attention_mask"))
        real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(chosen)
        disc_right = ((out["disc_logits"] > 0).float() == out["disc_targets"])[real]
        nll = F.cross_entropy(out["gen_logits"].float()[chosen], labels[chosen], reduction="sum")
        return loss, {"nll": nll.item(), "targets": int(chosen.sum()),
                      "correct": int((out["gen_logits"].argmax(-1)[chosen] == labels[chosen]).sum()),
                      "disc_tokens": int(real.sum()), "disc_correct": int(disc_right.sum())}
    raise ValueError(f"the trainer has no step for objective {objective!r} yet")
