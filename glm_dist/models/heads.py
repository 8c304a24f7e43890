"""Downstream heads on a pretrained encoder, as the BERT paper describes them.

- Classification: the final hidden state of [CLS] (position 0; XLNet's <cls> is the last) through
  one new weight matrix W in R^{K x H}: logits = C W^T.
- Span extraction (SQuAD): a start vector S and an end vector E in R^H; P(start = i) = softmax_i(S . T_i),
  likewise for the end.
- Token classification (NER): every final hidden state T_i through one new matrix W in R^{K x H}.

Each takes any encoder whose forward maps (input_ids, token_type_ids=, attention_mask=) to a dict
with ``hidden_states`` (B, T, H): BERT, RoBERTa, ALBERT, ELECTRA's discriminator, XLNet.
"""

from __future__ import annotations

import torch
from torch import nn


class SequenceClassifier(nn.Module):
    """``position``: where the summary token is -- BERT's [CLS] first (0), XLNet's <cls> last (-1,
    with inputs padded on the left)."""

    def __init__(self, encoder: nn.Module, num_labels: int, *, dropout: float = 0.1, position: int = 0):
        super().__init__()
        self.encoder, self.drop, self.position = encoder, nn.Dropout(dropout), position
        self.classifier = nn.Linear(encoder.cfg.d_model, num_labels)
        nn.init.normal_(self.classifier.weight, std=0.02)
        nn.init.zeros_(self.classifier.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.encoder(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)["hidden_states"]
        return self.classifier(self.drop(h[:, self.position]))  # (B, T, H) -> (B, K)


class SpanExtractor(nn.Module):
    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.start_end = nn.Linear(encoder.cfg.d_model, 2)  # rows: the start vector S and end vector E

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)["hidden_states"]
        start, end = self.start_end(h).unbind(-1)  # (B, T) each
        if attention_mask is not None:
            start = start.masked_fill(attention_mask == 0, float("-inf"))
            end = end.masked_fill(attention_mask == 0, float("-inf"))
        return start, end


class TokenClassifier(nn.Module):
    def __init__(self, encoder: nn.Module, num_labels: int, *, dropout: float = 0.1):
        super().__init__()
        self.encoder, self.drop = encoder, nn.Dropout(dropout)
        self.classifier = nn.Linear(encoder.cfg.d_model, num_labels)
        nn.init.normal_(self.classifier.weight, std=0.02)
        nn.init.zeros_(self.classifier.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.encoder(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)["hidden_states"]
        return self.classifier(self.drop(h))  # (B, T, H) -> (B, T, K)
