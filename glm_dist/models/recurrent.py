"""Recurrent building blocks of the LSTM-era families: ELMo uses them, AWD-LSTM / ULMFiT and CVT
build on them. Plain modules, batch-first: activations are (B, T, D); ``lengths`` (B,) are the real
lengths of right-padded sequences (None: no padding).

- ``LSTMLayer``: one ``nn.LSTM`` layer (``proj_size``: its output projected, the LSTMP of Sak et al.
  2014 that ELMo uses) run over packed sequences, so padding never reaches a real position's state;
  ``reverse=True`` runs every sequence from its last real token back to its first (a backward LM).
- ``WeightDrop``: DropConnect on an LSTM's hidden-to-hidden matrices (Wan et al. 2013; AWD-LSTM,
  Merity et al. 2017): one mask per forward pass, the same at every time step, the fused kernel kept.
- ``LockedDropout``: variational dropout (Gal & Ghahramani 2016): one mask per sequence and feature,
  the same at every time step.
- ``WordDropEmbedding``: embedding dropout (Gal & Ghahramani 2016; AWD-LSTM): a dropped word is zero
  at every position of the batch, the others scaled by 1 / (1 - p).
- ``CharCNN`` + ``Highway``: a word from its characters (Kim et al. 2016; ELMo): character
  embeddings, one convolution per filter width max-pooled over the word, ReLU, highway layers
  (Srivastava et al. 2015), a linear projection.
- ``AttentionLSTMDecoder``: CoVe's decoder (McCann et al. 2017; Luong et al. 2015's global
  attention with input feeding): an LSTM stack over [previous target embedding; previous h~],
  alpha_t = softmax(H (W1 s_t + b1)) over the encoder states H, h~_t = tanh(W2 [H^T alpha_t; s_t] + b2).
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (1, B, size)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """Each sequence's real positions in reverse order, padding left where it is: (B, T, ...)."""
    if lengths is None:
        return x.flip(1)
    t = torch.arange(x.size(1), device=x.device)[None]  # (1, T)
    lengths = lengths.to(x.device)[:, None]  # (B, 1)
    index = torch.where(t < lengths, lengths - 1 - t, t)  # (B, T)
    return x.gather(1, index.view(*index.shape, *[1] * (x.dim() - 2)).expand_as(x))


class LockedDropout(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D): the same dropped features at every time step of a sequence."""
        if not self.training or self.p == 0:
            return x
        mask = x.new_empty(x.size(0), 1, x.size(2)).bernoulli_(1 - self.p) / (1 - self.p)
        return x * mask


class WordDropEmbedding(nn.Embedding):
    """``nn.Embedding`` (same weights, same state-dict keys) whose rows are dropped whole in training."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, p: float = 0.0, **kw):
        super().__init__(num_embeddings, embedding_dim, **kw)
        self.p = p

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return super().forward(ids)
        mask = self.weight.new_empty(self.weight.size(0), 1).bernoulli_(1 - self.p) / (1 - self.p)  # (V, 1)
        return F.embedding(
            ids,
            self.weight * mask,
            self.padding_idx,
            self.max_norm,
            self.norm_type,
            self.scale_grad_by_freq,
            self.sparse,
        )


class WeightDrop(nn.Module):
    """Wraps an ``nn.LSTM``: in training each call runs it with ``weights`` (default: every layer's
    hidden-to-hidden matrix) dropped out; the LSTM keeps its parameters and their names."""

    def __init__(self, lstm: nn.LSTM, p: float, weights: Sequence[str] | None = None):
        super().__init__()
        self.lstm, self.p = lstm, p
        self.weights = tuple(weights or (n for n, _ in lstm.named_parameters() if n.startswith("weight_hh")))

    def forward(self, *args):
        if not self.training or self.p == 0:
            return self.lstm(*args)
        dropped = {name: F.dropout(getattr(self.lstm, name), self.p, training=True) for name in self.weights}
        return functional_call(self.lstm, dropped, args)


class LSTMLayer(nn.Module):
    """One (projected) LSTM layer over padded batches; see the module docstring."""

    def __init__(
        self, d_in: int, d_hidden: int, *, proj_size: int = 0, weight_drop: float = 0.0, bidirectional: bool = False
    ):
        super().__init__()
        self.lstm = nn.LSTM(d_in, d_hidden, batch_first=True, proj_size=proj_size, bidirectional=bidirectional)
        self.rnn = WeightDrop(self.lstm, weight_drop) if weight_drop else self.lstm
        self.d_out = (proj_size or d_hidden) * (2 if bidirectional else 1)  # bidirectional: [forward; backward]

    def forward(
        self, x: torch.Tensor, lengths: torch.Tensor | None = None, *, reverse: bool = False, state: State | None = None
    ) -> tuple[torch.Tensor, State]:
        """(B, T, d_in) -> (B, T, d_out) (zeros at padded positions) and the final (h, c) of each sequence."""
        if reverse:
            x = reverse_padded(x, lengths)
        if lengths is None:
            out, state = self.rnn(x, state)
        else:  # lengths on the host: pack_padded_sequence needs them there
            packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            out, state = self.rnn(packed, state)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        return (reverse_padded(out, lengths) if reverse else out), state


class Highway(nn.Module):
    """y = g * relu(W_h x) + (1 - g) * x with the transform gate g = sigmoid(W_g x), per layer; the
    gate's bias starts at -2 (mostly carry), as in bilm-tf."""

    def __init__(self, dim: int, num_layers: int):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(dim, 2 * dim) for _ in range(num_layers))
        for layer in self.blocks:
            nn.init.constant_(layer.bias[dim:], -2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.blocks:
            hidden, gate = layer(x).chunk(2, dim=-1)
            gate = torch.sigmoid(gate)
            x = gate * F.relu(hidden) + (1 - gate) * x
        return x


class CharCNN(nn.Module):
    """(B, T, C) character ids of each token -> (B, T, out_dim); id 0 pads (a padding token is all 0)."""

    def __init__(
        self, *, char_vocab: int, char_dim: int, filters: Sequence[tuple[int, int]], num_highway: int, out_dim: int
    ):
        super().__init__()
        self.embed = nn.Embedding(char_vocab, char_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(char_dim, channels, width) for width, channels in filters)
        width = sum(channels for _, channels in filters)
        self.highway = Highway(width, num_highway)
        self.proj = nn.Linear(width, out_dim)

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        B, T, C = chars.shape
        x = self.embed(chars.reshape(B * T, C)).transpose(1, 2)  # (B*T, char_dim, C)
        x = torch.cat([conv(x).max(dim=-1).values for conv in self.convs], dim=-1)  # (B*T, sum of channels)
        return self.proj(self.highway(F.relu(x))).view(B, T, -1)


class AttentionLSTMDecoder(nn.Module):
    """An LSTM stack (one ``nn.LSTMCell`` per layer, in ``blocks``) that attends over ``memory`` H
    (B, S, d_memory) at every step; see the module docstring. ``cache`` (one dict per block, batch
    first, as glm_dist/models/generate.py keeps it) carries the states and h~ from call to call: empty
    dicts start from zeros, and a call with T tokens continues where the last one stopped."""

    def __init__(self, d_in: int, d_hidden: int, d_memory: int, *, num_layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.d_hidden = d_hidden
        self.blocks = nn.ModuleList(
            nn.LSTMCell(d_in + d_hidden if i == 0 else d_hidden, d_hidden) for i in range(num_layers)
        )
        self.query = nn.Linear(d_hidden, d_memory)  # W1, b1
        self.combine = nn.Linear(d_memory + d_hidden, d_hidden)  # W2, b2
        self.drop = nn.Dropout(dropout)

    def attend(self, s: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None) -> torch.Tensor:
        """h~ (B, d_hidden) of the top state s (B, d_hidden); padded memory positions get no weight."""
        return global_attention(s, memory, memory_mask, self.query, self.combine)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        cache: list[dict] | None = None,
        *,
        frozen_attention: bool = False,
        return_states: bool = False,
    ):
        """(B, T, d_in) target embeddings (teacher forcing: the previous tokens') -> (B, T, d_hidden) h~;
        ``return_states``: also the top LSTM states s (B, T, d_hidden), what CVT's auxiliary decoders
        read. ``frozen_attention``: h~ is computed without gradient, a constant fed to the next step
        (a CVT auxiliary loss trains the shared LSTMs through their states, never the primary's
        attention; under ZeRO-3 the attention still runs as modules, whose hooks gather them)."""
        B = x.size(0)
        zeros = x.new_zeros(B, self.d_hidden)
        cache = cache if cache is not None else [{} for _ in self.blocks]
        states = [(c["h"], c["c"]) if c else (zeros, zeros) for c in cache]
        feed = cache[0].get("feed", zeros)
        outs, tops = [], []
        for t in range(x.size(1)):
            inp = torch.cat([x[:, t], feed], dim=-1)  # input feeding: h~_{t-1} beside the embedding
            for i, cell in enumerate(self.blocks):
                states[i] = cell(self.drop(inp), states[i])
                inp = states[i][0]
            tops.append(inp)
            with torch.no_grad() if frozen_attention else contextlib.nullcontext():
                feed = self.attend(inp, memory, memory_mask)
            outs.append(feed)
        for c, (h, cell_state) in zip(cache, states):
            c.update(h=h, c=cell_state)
        cache[0]["feed"] = feed
        out = self.drop(torch.stack(outs, dim=1))
        return (out, torch.stack(tops, dim=1)) if return_states else out


def global_attention(
    s: torch.Tensor,
    memory: torch.Tensor,
    memory_mask: torch.Tensor | None,
    query: nn.Linear,
    combine: nn.Linear,
    *,
    weight_dropout: float = 0.0,
) -> torch.Tensor:
    """Luong et al.'s global attention of states s (B, d) or (B, T, d) over ``memory`` H (B, S, d_memory):
    alpha = softmax(H (W1 s + b1)), h~ = tanh(W2 [H^T alpha; s] + b2), padded memory positions weighted 0.
    ``weight_dropout``: that fraction of alpha's entries zeroed (the rest scaled by 1 / (1 - p), as
    ``F.dropout``): CVT's restricted view for translation."""
    steps = s if s.dim() == 3 else s[:, None]
    scores = torch.einsum("bsd,btd->bts", memory, query(steps))  # (B, T, S)
    if memory_mask is not None:
        scores = scores.masked_fill(memory_mask[:, None] == 0, float("-inf"))
    alpha = scores.softmax(-1)
    if weight_dropout:
        alpha = F.dropout(alpha, weight_dropout, training=True)
    context = torch.einsum("bts,bsd->btd", alpha, memory)  # H^T alpha: (B, T, d_memory)
    out = torch.tanh(combine(torch.cat([context, steps], dim=-1)))
    return out if s.dim() == 3 else out[:, 0]
