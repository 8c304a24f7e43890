"""AWD-LSTM's language modelling (Merity et al. 2017): next-token cross entropy over BPTT windows of
``seq_len`` tokens (documents packed with end-of-text separators, CLM's ``TokenPacker``: exact
resume), plus activation regularisation on the last layer's dropped output and temporal activation
regularisation on its raw output:

    loss = NLL + alpha * mean(output^2) + beta * mean((raw_t - raw_{t-1})^2)

(the model config's ``ar_alpha`` = 2 and ``tar_beta`` = 1, the authors' defaults: a checkpoint's
fine-tuning applies the same), the means over real positions only, so padding never changes the
loss. Evaluation reports the NLL alone (perplexity, bits per byte), as CLM does. The LSTM state is
not carried from one window to the next (the windows of a step are not consecutive text).
"""

from __future__ import annotations

import torch

from glm_dist.objectives.base import IGNORE_INDEX
from glm_dist.objectives.clm import CausalLM
from glm_dist.ops.cross_entropy import cross_entropy


def activation_penalties(
    output: torch.Tensor, raw: torch.Tensor, real: torch.Tensor, *, alpha: float, beta: float
) -> torch.Tensor:
    """AR + TAR of (B, T, D) dropped / raw outputs over the (B, T) ``real`` positions."""
    real = real.to(output.dtype)
    ar = (output.pow(2).mean(-1) * real).sum() / real.sum().clamp(min=1)
    pairs = real[:, 1:] * real[:, :-1]  # both positions of a step are real
    tar = ((raw[:, 1:] - raw[:, :-1]).pow(2).mean(-1) * pairs).sum() / pairs.sum().clamp(min=1)
    return alpha * ar + beta * tar


class AwdLM(CausalLM):
    """CLM's windows and report; the loss adds AR and TAR with the model's ``ar_alpha`` / ``tar_beta``."""

    def loss(self, model, batch, *, metrics):
        out = model(batch["input_ids"], attention_mask=batch.get("attention_mask"))
        labels = batch["labels"]
        nll = cross_entropy(out["logits"], labels, ignore_index=IGNORE_INDEX, reduction="sum")
        real = labels != IGNORE_INDEX
        count = real.sum()
        cfg = getattr(model, "module", model).cfg  # the DeepSpeed engine's model, or the model
        loss = nll / count.clamp(min=1) + activation_penalties(
            out["output"], out["raw_output"], real, alpha=cfg.ar_alpha, beta=cfg.tar_beta
        )
        if not metrics:
            return loss, {}
        return loss, {"nll": nll.item(), "targets": int(count), "labels": labels[real]}


AWD_LM = AwdLM(name="awd_lm", salt=1030, sums=("nll", "targets", "bytes"))
