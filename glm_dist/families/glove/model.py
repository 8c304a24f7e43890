"""GloVe (Pennington et al. 2014): a word vector w_i, a context vector w~_j and two biases per word.

The model predicts log X_ij as w_i . w~_j + b_i + b~_j for the (i, j) pairs of a batch of
co-occurrence triples; the ``glove`` objective weighs the squared error. The word's vector is
w + w~ (the paper's final vectors), written in GloVe's text format by ``glm data vectors``.
Initialisation follows the authors' glove.c: uniform in [-0.5, 0.5) / dim for vectors and biases.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from glm_dist.models.common import Flavor, flavor_config


@dataclass(frozen=True)
class GloVeConfig:
    d_model: int  # vector size
    vocab_size: int
    context_length: int = 4096  # triples per sample (a batch is micro_batch_size x this many pairs)
    n_layer: int = 1  # (no layers: the layout checks read these)
    n_head: int = 1


FLAVORS: dict[str, Flavor] = {
    "glove-tiny": Flavor(GloVeConfig(d_model=50, vocab_size=4096)),
    "glove-300d": Flavor(GloVeConfig(d_model=300, vocab_size=400_000)),  # the paper's 6B/42B vector size
}


glove_config = flavor_config(FLAVORS, "GloVe")


class GloVe(nn.Module):
    def __init__(self, cfg: GloVeConfig):
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.context = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.word_bias = nn.Embedding(cfg.vocab_size, 1)
        self.context_bias = nn.Embedding(cfg.vocab_size, 1)
        self.activation_checkpointing = False  # (nothing to recompute)
        for table in (self.word, self.context, self.word_bias, self.context_bias):
            nn.init.uniform_(table.weight, -0.5 / cfg.d_model, 0.5 / cfg.d_model)

    def forward(self, word_ids: torch.Tensor, context_ids: torch.Tensor) -> torch.Tensor:
        """(B, N) word and context ids -> (B, N) predicted log co-occurrence."""
        dot = (self.word(word_ids) * self.context(context_ids)).sum(-1)  # (B, N)
        return dot + self.word_bias(word_ids).squeeze(-1) + self.context_bias(context_ids).squeeze(-1)

    def vectors(self) -> torch.Tensor:
        """(V, d) the word vectors: w + w~."""
        return (self.word.weight + self.context.weight).detach()

    def num_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per triple: a dot product of two d-vectors and two biases, x3 for the backward."""
        return 3 * (2 * 2 * self.cfg.d_model + 2)
