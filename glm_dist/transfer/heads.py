"""GPT's supervised fine-tuning head (Radford et al. 2018, section 3.2).

The final transformer state h_l of the extract token goes through one new matrix W_y:
P(y | x) = softmax(h_l W_y). The language-modelling loss over the same inputs is kept as an
auxiliary objective, L3 = L2 + lambda * L1 (lambda = 0.5 in the paper). Similarity sums the two
orders' states before W_y; multiple choice scores every candidate with a one-column W_y and takes
the softmax over candidates -- transformers' ``OpenAIGPTDoubleHeadsModel`` multiple-choice head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glm_dist.models.common import CausalSelfAttention


def set_dropout(module: nn.Module, p: float) -> None:
    """Every dropout of ``module`` (embedding, attention, residual) to rate ``p``."""
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = p
        elif isinstance(m, CausalSelfAttention):
            m.dropout = p


class GPTTransfer(nn.Module):
    """``kind``: classify | entailment | similarity (``num_labels`` outputs) or multiple_choice
    (one score per candidate)."""

    def __init__(self, lm: nn.Module, kind: str, num_labels: int, *, dropout: float = 0.1):
        super().__init__()
        self.lm, self.kind = lm, kind
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(lm.cfg.d_model, 1 if kind == "multiple_choice" else num_labels)  # W_y
        nn.init.normal_(self.classifier.weight, std=0.02)
        nn.init.zeros_(self.classifier.bias)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(N, T) -> (N, T, C): the final states (after GPT-2's final norm; GPT-1 has none)."""
        x = input_ids
        for layer in self.lm.layers()[:-1]:
            x = layer(x)
        return self.lm.head.ln_f(x)

    def forward(
        self, input_ids: torch.Tensor, extract: torch.Tensor, lengths: torch.Tensor, choice_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """(B, S, T) ids, (B, S) extract positions / lengths / real sequences -> ``logits`` (B, K)
        (K candidates for multiple choice) and ``lm_loss``, the mean next-token loss over every
        real token of every sequence (the auxiliary L1)."""
        B, S, T = input_ids.shape
        h = self.hidden_states(input_ids.view(B * S, T))  # (B*S, T, C)
        last = h[torch.arange(B * S, device=h.device), extract.view(-1)].view(B, S, -1)  # (B, S, C)
        return {"logits": self._task_logits(last, choice_mask), "lm_loss": self._lm_loss(h, input_ids, lengths)}

    def _task_logits(self, last: torch.Tensor, choice_mask: torch.Tensor) -> torch.Tensor:
        if self.kind == "multiple_choice":
            scores = self.classifier(self.drop(last)).squeeze(-1)  # (B, S): one score per candidate
            return scores.masked_fill(~choice_mask, float("-inf"))
        if self.kind == "similarity":  # the two orders' states summed
            return self.classifier(self.drop(last.sum(1)))
        return self.classifier(self.drop(last[:, 0]))

    def _lm_loss(self, h: torch.Tensor, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        B, S, T = input_ids.shape
        targets = input_ids.view(B * S, T)[:, 1:]
        real = torch.arange(1, T, device=h.device)[None, :] < lengths.view(-1, 1)  # (B*S, T-1)
        logits = self.lm.head.lm_head(h[:, :-1]).float()  # (B*S, T-1, V)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        return (loss * real.flatten()).sum() / real.sum().clamp(min=1)

    def loss(self, out: dict[str, torch.Tensor], labels: torch.Tensor, lm_weight: float) -> torch.Tensor:
        """L3 = L2 (task cross entropy) + lm_weight * L1 (language modelling)."""
        return F.cross_entropy(out["logits"].float(), labels) + lm_weight * out["lm_loss"]
