"""Cross-View Training's sequence tagger (Clark et al. 2018; the authors' ``cvt_text``).

- Token representation: a word embedding, concatenated (``char_cnn``) with a character CNN's
  max-pooled filters (widths 2, 3, 4, 100 each, ReLU), dropout.
- Layer 1: a bidirectional LSTM (1024 cells per direction projected to 512, LSTMP); layer 2: a
  bidirectional LSTM of 512 cells over layer 1's [forward; backward]; dropout on every output.
- Per task, a *primary* prediction module over [layer 1; layer 2] at each token: two fully
  connected layers (512, ReLU, then the tags) -- the softmax is the objective's.
- Per task, four *auxiliary* modules of the same shape on layer 1's states that each see a
  restricted view of the sentence: ``fwd`` (h_fwd at t: the words up to t), ``bwd`` (h_bwd
  at t: from t on), ``future`` (h_fwd at t - 1: the words before t, not t itself) and
  ``past`` (h_bwd at t + 1: the words after t).

``mode`` says which modules run and with which dropout: ``supervised`` the primary modules with
``dropout`` (the authors' labelled keep probability 0.5), ``teacher`` the primary modules without
dropout (the objective runs it without gradients: its soft targets), ``student`` the auxiliary
modules with ``unlabelled_dropout`` (keep 0.8). In eval mode nothing is dropped.

Padding never changes a result: the LSTMs run over packed sequences, and the shifted views read a
real neighbour (every sentence is ``<bos> words <eos>``) or a zero state at the sentence's edge.
Differences from ``cvt_text``: the character CNN keeps ``CharCNN``'s linear projection (300 -> 300)
and reads ELMo's 50-character spelling (the authors cut words at 20); layer 2 has no projection
(torch's ``proj_size`` must be below the cell count; the authors project 512 -> 512); no learned
embedding scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glm_dist.models.common import Flavor, flavor_config
from glm_dist.models.recurrent import CharCNN, LSTMLayer

MAX_CHARS = 50  # characters per word (data_pipeline/tokenize/word.py)
VIEWS = ("fwd", "bwd", "future", "past")  # (ModuleDict keys: "forward" is taken)
MODES = ("supervised", "teacher", "student")


@dataclass(frozen=True)
class CvtConfig:
    vocab_size: int
    tags: tuple = (17,)  # tags per task (one primary module and four auxiliary ones each)
    d_word: int = 300  # word embedding (the authors: GloVe 300-d)
    d_lstm: int = 1024  # layer 1's cells per direction
    d_model: int = 512  # layer 1's projected output, and the prediction modules' hidden layer
    d_lstm2: int = 512  # layer 2's cells per direction
    char_cnn: bool = True
    char_vocab: int = 262  # data_pipeline/tokenize/word.py's character ids
    char_dim: int = 50
    filters: tuple = ((2, 100), (3, 100), (4, 100))  # (width, channels)
    dropout: float = 0.5  # on labelled minibatches
    unlabelled_dropout: float = 0.2  # on unlabelled minibatches (the student's)
    context_length: int = 100  # words per sentence (the authors' max_sentence_length)
    n_layer: int = 2  # (two bidirectional layers by construction: the layout checks read it)
    n_head: int = 1  # (no attention: the layout checks read it)

    def __post_init__(self) -> None:  # a config read back from JSON has lists
        object.__setattr__(self, "tags", tuple(self.tags))
        object.__setattr__(self, "filters", tuple(tuple(f) for f in self.filters))


# cvt_text's sizes (base/configure.py); the paper prints no parameter count. With a 400,000-word
# GloVe vocabulary and 17 tags (CoNLL NER, BIOES) this is 138.8M, 120M of it the word embedding.
FLAVORS: dict[str, Flavor] = {
    "cvt-tiny": Flavor(
        CvtConfig(
            vocab_size=8192,
            d_word=48,
            d_lstm=96,
            d_model=48,
            d_lstm2=48,
            char_dim=8,
            filters=((2, 16), (3, 16), (4, 16)),
            context_length=72,
        )
    ),
    "cvt-tiny-words": Flavor(
        CvtConfig(vocab_size=8192, d_word=48, d_lstm=96, d_model=48, d_lstm2=48, char_cnn=False, context_length=72)
    ),
    "cvt": Flavor(CvtConfig(vocab_size=400_000)),
}


cvt_config = flavor_config(FLAVORS, "CVT")


class PredictionModule(nn.Module):
    """Two fully connected layers: (..., d_in) -> ReLU(hidden) -> (..., n_tags) logits."""

    def __init__(self, d_in: int, d_hidden: int, n_tags: int):
        super().__init__()
        self.hidden, self.out = nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, n_tags)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.hidden(x)))


def shift(x: torch.Tensor, steps: int) -> torch.Tensor:
    """(B, T, D) moved ``steps`` positions later in time (earlier when negative), zeros filling in."""
    zeros = x.new_zeros(x.size(0), abs(steps), x.size(2))
    return torch.cat([zeros, x[:, :-steps]], 1) if steps > 0 else torch.cat([x[:, -steps:], zeros], 1)


class CVT(nn.Module):
    def __init__(self, cfg: CvtConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_word)
        d_in = cfg.d_word
        if cfg.char_cnn:
            width = sum(c for _, c in cfg.filters)
            self.chars = CharCNN(
                char_vocab=cfg.char_vocab, char_dim=cfg.char_dim, filters=cfg.filters, num_highway=0, out_dim=width
            )
            d_in += width
        self.layer1 = nn.ModuleList(LSTMLayer(d_in, cfg.d_lstm, proj_size=cfg.d_model) for _ in range(2))  # fwd, bwd
        self.layer2 = nn.ModuleList(LSTMLayer(2 * cfg.d_model, cfg.d_lstm2) for _ in range(2))
        d_full = 2 * cfg.d_model + 2 * cfg.d_lstm2
        self.primary = nn.ModuleList(PredictionModule(d_full, cfg.d_model, n) for n in cfg.tags)
        self.auxiliary = nn.ModuleList(
            nn.ModuleDict({view: PredictionModule(cfg.d_model, cfg.d_model, n) for view in VIEWS}) for n in cfg.tags
        )
        self.activation_checkpointing = False  # (not used: the recurrences dominate, not stored activations)

    def layers(self) -> list[nn.Module]:
        """The parts in order (for planning)."""
        return [
            self.embed,
            *([self.chars] if self.cfg.char_cnn else []),
            *self.layer1,
            *self.layer2,
            *self.primary,
            *self.auxiliary,
        ]

    def encode(
        self, input_ids: torch.Tensor, char_ids: torch.Tensor | None, lengths: torch.Tensor | None, p: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer 1's forward and backward states (B, T, d_model) each and layer 2's (B, T, 2 d_lstm2)."""
        drop = (lambda x: F.dropout(x, p, training=True)) if p > 0 else (lambda x: x)
        x = drop(self.embed(input_ids))
        if self.cfg.char_cnn:
            if char_ids is None:
                raise ValueError(
                    "this CVT model reads characters: pass char_ids (B, T, 50) -- the cvt objective makes "
                    "them from the tagging shard set's word-level tokenizer"
                )
            x = torch.cat([x, drop(self.chars(char_ids))], dim=-1)
        fwd = drop(self.layer1[0](x, lengths)[0])
        bwd = drop(self.layer1[1](x, lengths, reverse=True)[0])
        uni = torch.cat([fwd, bwd], dim=-1)
        bi = torch.cat([drop(self.layer2[0](uni, lengths)[0]), drop(self.layer2[1](uni, lengths, reverse=True)[0])], -1)
        return fwd, bwd, bi

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        char_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mode: str = "supervised",
    ) -> dict[str, list]:
        """``primary``: per task (B, T, tags) logits (``supervised``, ``teacher``); ``auxiliary``: per
        task a dict view -> (B, T, tags) logits (``student``); logits at t always score token t."""
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: one of {', '.join(MODES)}")
        rate = {"supervised": self.cfg.dropout, "teacher": 0.0, "student": self.cfg.unlabelled_dropout}[mode]
        lengths = None if attention_mask is None else attention_mask.sum(dim=1)
        fwd, bwd, bi = self.encode(input_ids, char_ids, lengths, rate if self.training else 0.0)
        if mode != "student":
            full = torch.cat([fwd, bwd, bi], dim=-1)
            return {"primary": [module(full) for module in self.primary]}
        views = {"fwd": fwd, "bwd": bwd, "future": shift(fwd, 1), "past": shift(bwd, -1)}
        return {"auxiliary": [{v: modules[v](views[v]) for v in VIEWS} for modules in self.auxiliary]}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def num_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, 6 per weight use: the LSTMs and the prediction modules (a
        supervised step runs the primary ones, an unlabelled step the auxiliary ones; counted as
        the larger), each convolution weight at each of a word's 50 character positions."""
        uses = sum(p.numel() for m in (*self.layer1, *self.layer2) for p in m.parameters())
        uses += max(
            sum(p.numel() for p in self.primary.parameters()), sum(p.numel() for p in self.auxiliary.parameters())
        )
        if self.cfg.char_cnn:
            uses += MAX_CHARS * sum(p.numel() for p in self.chars.convs.parameters())
            uses += sum(p.numel() for p in self.chars.proj.parameters())
        return 6 * uses
