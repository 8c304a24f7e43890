"""AWD-LSTM (Merity et al. 2017), the language model of ULMFiT (Howard & Ruder 2018).

- A word embedding (``d_model`` = 400) with embedding dropout (whole words, ``embed_dropout``),
  then locked (variational) dropout on it (``input_dropout``).
- ``n_layer`` = 3 LSTM layers: d_model -> d_hidden (1150) -> d_hidden -> d_model, the last one back
  to the embedding's width so the output layer can share the embedding matrix (tied weights,
  Press & Wolf 2016; Inan et al. 2016). DropConnect on every layer's hidden-to-hidden matrix
  (``weight_drop``, one mask per forward pass), locked dropout between layers (``hidden_dropout``)
  and on the last layer's output (``output_dropout``).
- The output layer: logits = dropped output x embedding^T + a bias of its own.

The ``awd_lm`` objective adds activation regularisation (AR, ``ar_alpha`` x mean of the dropped
output squared) and temporal activation regularisation (TAR, ``tar_beta`` x mean squared difference
of consecutive raw outputs) from ``forward``'s ``output`` and ``raw_output``. Padding never changes a result: with
``attention_mask`` the LSTMs run over packed sequences (recurrent.py's ``LSTMLayer``) and dropout masks
are per sequence. ``encode`` also takes and returns each layer's (h, c), so a long document can be
read in windows with the state carried (ULMFiT's BPT3C, ``glm_dist/transfer/ulmfit.py``).

The dropout values are those of the authors' code (salesforce/awd-lstm-lm ``main.py`` defaults:
dropoute 0.1, dropouti 0.65, dropouth 0.3, dropout 0.4, wdrop 0.5; alpha 2, beta 1; bptt 70).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glm_dist.models.common import Flavor, flavor_config
from glm_dist.models.recurrent import LockedDropout, LSTMLayer, State, WordDropEmbedding


@dataclass(frozen=True)
class AwdLstmConfig:
    vocab_size: int
    d_model: int = 400  # embedding, and the last LSTM layer's output (tied weights)
    d_hidden: int = 1150  # the other LSTM layers' cells
    n_layer: int = 3
    context_length: int = 70  # tokens per training window (BPTT); inference takes any length
    embed_dropout: float = 0.1  # whole words of the embedding matrix
    input_dropout: float = 0.65  # locked dropout on the embedded input
    hidden_dropout: float = 0.3  # locked dropout between LSTM layers
    output_dropout: float = 0.4  # locked dropout on the last layer's output
    weight_drop: float = 0.5  # DropConnect on the hidden-to-hidden matrices
    ar_alpha: float = 2.0  # the awd_lm objective's activation regularisation (also in ULMFiT's classifier)
    tar_beta: float = 1.0  # ... and temporal activation regularisation
    n_head: int = 1  # (no attention: the layout checks read it)

    def widths(self) -> list[tuple[int, int]]:
        """(input, output) width of each LSTM layer."""
        return [
            (self.d_model if i == 0 else self.d_hidden, self.d_model if i == self.n_layer - 1 else self.d_hidden)
            for i in range(self.n_layer)
        ]


# The AWD-LSTM paper's Penn Treebank model (table 1, "AWD-LSTM (tied)", 24M): three LSTMs of
# 7,139,200 + 10,589,200 + 2,483,200 (torch keeps two bias vectors per gate, as the authors' code),
# the 10,000 x 400 embedding shared with the output layer and the output bias: 24.22M.
FLAVORS: dict[str, Flavor] = {
    "awd-lstm-tiny": Flavor(AwdLstmConfig(vocab_size=8192, d_model=32, d_hidden=128)),
    # the same without dropout: runs compared across layouts (each rank draws its own dropout masks)
    "awd-lstm-tiny-plain": Flavor(
        AwdLstmConfig(
            vocab_size=8192,
            d_model=32,
            d_hidden=128,
            embed_dropout=0.0,
            input_dropout=0.0,
            hidden_dropout=0.0,
            output_dropout=0.0,
            weight_drop=0.0,
        )
    ),
    "awd-lstm": Flavor(AwdLstmConfig(vocab_size=10_000), 24e6, 0.01, "the paper's Penn Treebank model (10k words)"),
}


awd_lstm_config = flavor_config(FLAVORS, "AWD-LSTM")


class AwdLstm(nn.Module):
    def __init__(self, cfg: AwdLstmConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = WordDropEmbedding(cfg.vocab_size, cfg.d_model, p=cfg.embed_dropout)
        self.input_drop = LockedDropout(cfg.input_dropout)
        self.rnns = nn.ModuleList(LSTMLayer(d_in, d_out, weight_drop=cfg.weight_drop) for d_in, d_out in cfg.widths())
        self.hidden_drop = LockedDropout(cfg.hidden_dropout)
        self.output_drop = LockedDropout(cfg.output_dropout)
        self.out_bias = nn.Parameter(torch.zeros(cfg.vocab_size))  # the output layer's weight is the embedding
        self.activation_checkpointing = False  # (not used: the recurrences dominate, not stored activations)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)  # the authors' init_weights

    def layers(self) -> list[nn.Module]:
        """The parts in order (for planning): embedding, LSTM layers."""
        return [self.embed, *self.rnns]

    def layer_groups(self) -> list[list[nn.Parameter]]:
        """ULMFiT's layer groups, bottom to top: the embedding, then each LSTM layer (the last with
        the output bias) -- what discriminative learning rates and gradual unfreezing step through."""
        groups = [[self.embed.weight]] + [list(rnn.parameters()) for rnn in self.rnns]
        groups[-1].append(self.out_bias)
        return groups

    def encode(
        self, input_ids: torch.Tensor, lengths: torch.Tensor | None = None, state: list[State] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, list[State]]:
        """(B, T) ids -> the last layer's dropped output and raw output, each (B, T, d_model) (zeros
        at padded positions), and each layer's final (h, c)."""
        x = self.input_drop(self.embed(input_ids))
        new_state = []
        for i, rnn in enumerate(self.rnns):
            x, s = rnn(x, lengths, state=None if state is None else state[i])
            new_state.append(s)
            if i < len(self.rnns) - 1:
                x = self.hidden_drop(x)
        return self.output_drop(x), x, new_state

    def forward(
        self, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None, state: list[State] | None = None
    ) -> dict:
        """``logits`` (B, T, V) scoring token t + 1 at t, ``output`` (dropped) and ``raw_output``
        (B, T, d_model) of the last layer, and ``state`` (each layer's final (h, c))."""
        lengths = None if attention_mask is None else attention_mask.sum(dim=1)
        output, raw, new_state = self.encode(input_ids, lengths, state)
        return {
            "logits": F.linear(output, self.embed.weight, self.out_bias),
            "output": output,
            "raw_output": raw,
            "state": new_state,
        }

    def num_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, 6 per weight use (forward + backward): the LSTMs and the output layer."""
        return 6 * (sum(p.numel() for p in self.rnns.parameters()) + self.embed.weight.numel())
