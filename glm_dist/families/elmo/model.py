"""ELMo's bidirectional language model (Peters et al. 2018; the authors' bilm-tf).

- Token representation shared by both directions: a character CNN (filters of widths 1-7 with
  32/32/64/128/256/512/1024 channels = 2048, ReLU after max-pooling), two highway layers and a
  projection to 512; or (``char_cnn=False``) a word embedding of that size.
- A forward and a backward LM, each L = 2 LSTM layers of 4096 cells projected to 512 (LSTMP,
  ``nn.LSTM``'s ``proj_size``), a residual connection around every layer but the first, dropout on
  each layer's input and on the top layer's output.
- One softmax over the vocabulary shared by both directions: the forward LM's state at t predicts
  token t + 1, the backward LM's (which read t..T) predicts token t - 1. The ``bilm`` objective
  sums the two directions' NLL.

Padding never changes a result: with ``attention_mask`` the LSTMs run over packed sequences (the
backward one from each sequence's last real token), and everything else is per position.
``layers=True`` also returns the 2L + 1 representations as L + 1 layers of width 2 x d_model --
the token layer duplicated, then [forward; backward] of each LSTM layer -- what the scalar mix in
``glm_dist/transfer/elmo.py`` weighs. bilm-tf's cell and projection clipping (+-3) and its sampled
softmax are not reproduced (the full softmax is exact; plain LSTMs keep the fused kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from glm_dist.models.common import Flavor, flavor_config
from glm_dist.models.recurrent import CharCNN, LSTMLayer

MAX_CHARS = 50  # characters per word (data_pipeline/tokenize/word.py)
PAPER_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))


@dataclass(frozen=True)
class ElmoConfig:
    vocab_size: int
    d_model: int = 512  # token representation and each LSTM's projected output
    d_lstm: int = 4096  # LSTM cells
    n_layer: int = 2  # LSTM layers per direction
    context_length: int = 20  # tokens per training window (bilm-tf's unroll_steps); inference takes any length
    char_cnn: bool = True  # token representation from characters (else a word embedding)
    char_vocab: int = 262  # data_pipeline/tokenize/word.py's character ids
    char_dim: int = 16
    filters: tuple = PAPER_FILTERS  # (width, channels) per convolution
    n_highway: int = 2
    dropout: float = 0.1
    n_head: int = 1  # (no attention: the layout checks read it)

    def __post_init__(self) -> None:  # a config read back from JSON has lists
        object.__setattr__(self, "filters", tuple(tuple(f) for f in self.filters))


# The paper's 93.6M is the biLM without its softmax (the 1B Word Benchmark's 793,471-word output
# layer alone is 407M): char CNN + highway + projection 18.04M, four LSTMP layers 75.63M (torch's
# LSTM keeps two bias vectors, bilm-tf one: +65,536) = 93.67M.
FLAVORS: dict[str, Flavor] = {
    "elmo-tiny": Flavor(
        ElmoConfig(
            vocab_size=8192,
            d_model=64,
            d_lstm=256,
            context_length=64,
            char_dim=8,
            filters=((1, 16), (2, 16), (3, 32), (4, 64)),
            n_highway=1,
            dropout=0.0,
        )
    ),
    "elmo-tiny-words": Flavor(
        ElmoConfig(vocab_size=8192, d_model=64, d_lstm=256, context_length=64, char_cnn=False, dropout=0.0)
    ),  # word embeddings as the token layer: learns faster
    "elmo": Flavor(ElmoConfig(vocab_size=793_471), 93.6e6, 0.01, "softmax excluded (as the paper counts)"),
}


elmo_config = flavor_config(FLAVORS, "ELMo")


class ELMo(nn.Module):
    def __init__(self, cfg: ElmoConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        if cfg.char_cnn:
            self.tokens = CharCNN(
                char_vocab=cfg.char_vocab,
                char_dim=cfg.char_dim,
                filters=cfg.filters,
                num_highway=cfg.n_highway,
                out_dim=d,
            )
        else:
            self.tokens = nn.Embedding(cfg.vocab_size, d)
        self.forward_lm = nn.ModuleList(LSTMLayer(d, cfg.d_lstm, proj_size=d) for _ in range(cfg.n_layer))
        self.backward_lm = nn.ModuleList(LSTMLayer(d, cfg.d_lstm, proj_size=d) for _ in range(cfg.n_layer))
        self.drop = nn.Dropout(cfg.dropout)
        self.softmax = nn.Linear(d, cfg.vocab_size)  # shared by both directions
        self.activation_checkpointing = False  # (not used: the recurrences dominate, not stored activations)

    def layers(self) -> list[nn.Module]:
        """The parts in order (for planning): token layer, forward LSTMs, backward LSTMs, softmax."""
        return [self.tokens, *self.forward_lm, *self.backward_lm, self.softmax]

    def token_layer(self, input_ids: torch.Tensor | None, char_ids: torch.Tensor | None) -> torch.Tensor:
        """(B, T, d_model) context-independent token representations."""
        if self.cfg.char_cnn:
            if char_ids is None:
                raise ValueError(
                    "this ELMo reads characters: pass char_ids (B, T, 50) -- the bilm objective makes "
                    "them from a word-level tokenizer (data.tokenizer_profile=word)"
                )
            return self.tokens(char_ids)
        return self.tokens(input_ids)

    def _direction(
        self, lm: nn.ModuleList, x: torch.Tensor, lengths: torch.Tensor | None, reverse: bool
    ) -> list[torch.Tensor]:
        outs = []
        for i, layer in enumerate(lm):
            h, _ = layer(self.drop(x), lengths, reverse=reverse)
            x = h + x if i > 0 else h  # residual around every layer but the first
            outs.append(x)
        return outs

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        *,
        char_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        layers: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Logits of each direction (B, T, V): ``forward_logits`` at t score token t + 1,
        ``backward_logits`` at t score token t - 1; with ``layers`` also (L + 1, B, T, 2 d_model)."""
        x = self.token_layer(input_ids, char_ids)  # (B, T, d)
        lengths = None if attention_mask is None else attention_mask.sum(dim=1)
        fwd = self._direction(self.forward_lm, x, lengths, reverse=False)
        bwd = self._direction(self.backward_lm, x, lengths, reverse=True)
        out = {"forward_logits": self.softmax(self.drop(fwd[-1])), "backward_logits": self.softmax(self.drop(bwd[-1]))}
        if layers:
            out["layers"] = torch.stack(
                [torch.cat([x, x], dim=-1)] + [torch.cat(pair, dim=-1) for pair in zip(fwd, bwd)]
            )
        return out

    def num_params(self, *, softmax: bool = True) -> int:
        """Parameters; ``softmax=False``: without the output layer (the paper's count)."""
        n = sum(p.numel() for p in self.parameters())
        return n if softmax else n - sum(p.numel() for p in self.softmax.parameters())

    def num_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, 6 per weight use (forward + backward): the LSTMs, the softmax twice
        (one per direction), the highway and projection, each convolution weight at each of a word's
        50 character positions."""
        uses = sum(p.numel() for lm in (self.forward_lm, self.backward_lm) for p in lm.parameters())
        uses += 2 * sum(p.numel() for p in self.softmax.parameters())
        if self.cfg.char_cnn:
            t = self.tokens
            uses += sum(p.numel() for m in (t.highway, t.proj) for p in m.parameters())
            uses += MAX_CHARS * sum(p.numel() for p in t.convs.parameters())
        return 6 * uses
