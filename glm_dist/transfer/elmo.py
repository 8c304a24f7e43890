"""ELMo's downstream use (Peters et al. 2018, section 3): a frozen biLM whose layers each task mixes.

    ELMo_k = gamma * sum_j softmax(w)_j h_kj

over the biLM's 2L + 1 representations of token k, arranged as L + 1 layers of width 2 x d_model
(the token layer duplicated, then [forward; backward] of every LSTM layer -- ``ELMo(layers=True)``).
``ScalarMix`` learns w and gamma, optionally layer-normalising each layer over the real positions
first; ``ElmoEmbedder`` is the frozen biLM (weights fixed, always in eval mode: no dropout) with
one mix per place the task model takes it (its input, and its output for SNLI / SQuAD).
``layer_features`` gives a biLM's layers for raw sentences (``glm features`` writes them): words are
spelled from the text itself, so a word outside the vocabulary keeps its own characters (only its id
is ``<unk>``). The task models that take these vectors are in ``elmo_task.py``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from data_pipeline.tokenize.word import BOS_CHAR, EOS_CHAR, mark_chars, word_chars
from glm_dist.transfer.inputs import batch_rows, pad_ids


def masked_layer_norm(layers: torch.Tensor, mask: torch.Tensor | None, eps: float = 1e-12) -> torch.Tensor:
    """(N, B, T, D) each layer normalised by the mean and variance of its real positions' values."""
    if mask is None:
        mask = layers.new_ones(layers.shape[1:3])
    m = mask[None, :, :, None].to(layers.dtype)  # (1, B, T, 1)
    count = m.sum(dim=(1, 2, 3), keepdim=True) * layers.size(-1)
    mean = (layers * m).sum(dim=(1, 2, 3), keepdim=True) / count
    var = (((layers - mean) * m) ** 2).sum(dim=(1, 2, 3), keepdim=True) / count
    return (layers - mean) / torch.sqrt(var + eps)


class ScalarMix(nn.Module):
    """gamma * sum_j softmax(w)_j layer_j; w starts equal (a plain average), gamma at 1."""

    def __init__(self, num_layers: int, *, layer_norm: bool = False):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))
        self.layer_norm = layer_norm

    def forward(self, layers: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(N, B, T, D) layers (and the (B, T) mask of real positions) -> (B, T, D)."""
        if self.layer_norm:
            layers = masked_layer_norm(layers, mask)
        s = torch.softmax(self.weights, dim=0).to(layers.dtype)
        return self.gamma * torch.einsum("n,nbtd->btd", s, layers)


class ElmoEmbedder(nn.Module):
    """A frozen biLM and ``num_mixes`` scalar mixes of its layers (the only trainable parameters)."""

    def __init__(self, bilm: nn.Module, *, num_mixes: int = 1, layer_norm: bool = False):
        super().__init__()
        self.bilm = bilm.requires_grad_(False).eval()
        num_layers = bilm.cfg.n_layer + 1
        self.mixes = nn.ModuleList(ScalarMix(num_layers, layer_norm=layer_norm) for _ in range(num_mixes))

    def train(self, mode: bool = True) -> "ElmoEmbedder":
        super().train(mode)
        self.bilm.eval()  # frozen: never dropout
        return self

    def layers(self, input_ids=None, *, char_ids=None, attention_mask=None) -> torch.Tensor:
        with torch.no_grad():
            return self.bilm(input_ids, char_ids=char_ids, attention_mask=attention_mask, layers=True)["layers"]

    def forward(self, input_ids=None, *, char_ids=None, attention_mask=None) -> list[torch.Tensor]:
        """One (B, T, 2 d_model) ELMo representation per mix."""
        layers = self.layers(input_ids, char_ids=char_ids, attention_mask=attention_mask)
        return [mix(layers, attention_mask) for mix in self.mixes]


def split_words(tok: Tokenizer, text: str) -> list[str]:
    """The words a word-level tokenizer sees in ``text`` (its normalizer and pre-tokenizer)."""
    normalized = tok.normalizer.normalize_str(text) if tok.normalizer is not None else text
    return [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(normalized)]


def encode(tok: Tokenizer, texts: Sequence[str | Sequence[str]]) -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    """A right-padded batch of ``<bos> words <eos>`` (input_ids, char_ids, attention_mask) and the words;
    a text is split by the tokenizer, a list of words is taken as it is."""
    unk, bos, eos = tok.token_to_id("<unk>"), tok.token_to_id("<bos>"), tok.token_to_id("<eos>")
    words = [split_words(tok, t) if isinstance(t, str) else list(t) for t in texts]
    rows = [[bos] + [tok.token_to_id(w) if tok.token_to_id(w) is not None else unk for w in ws] + [eos] for ws in words]
    ids, mask = pad_ids(rows, 0)  # <pad> = 0 in the word profile
    chars = torch.zeros(*ids.shape, 50, dtype=torch.long)  # a padding token's characters are all 0
    for b, ws in enumerate(words):
        spelled = [mark_chars(BOS_CHAR)] + [word_chars(w) for w in ws] + [mark_chars(EOS_CHAR)]
        chars[b, : len(spelled)] = torch.from_numpy(np.stack(spelled).astype(np.int64))
    return {"input_ids": ids, "char_ids": chars, "attention_mask": mask}, words


@torch.no_grad()
def layer_features(
    bilm: nn.Module, tok: Tokenizer, texts: Sequence[str | Sequence[str]], *, batch_size: int = 32
) -> list[np.ndarray]:
    """Each text's biLM layers, (L + 1, words, 2 d_model) float32, without the sentence marks (the
    ``features`` of the elmo family: ``glm features`` and ``glm_dist.transfer.features``)."""
    embedder = ElmoEmbedder(bilm)
    features = []
    for rows in batch_rows(len(texts), batch_size):
        batch, words = encode(tok, texts[rows])
        layers = embedder.layers(batch["input_ids"], char_ids=batch["char_ids"], attention_mask=batch["attention_mask"])
        features += [layers[:, b, 1 : len(ws) + 1].float().numpy() for b, ws in enumerate(words)]
    return features
