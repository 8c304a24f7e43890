"""CoVe's downstream use (McCann et al. 2017, section 4): the MT-LSTM encoder of a trained translation
model, frozen, turns a word sequence into context vectors, and a task model reads

    w~ = [GloVe(w); CoVe(w)],   CoVe(w) = MT-LSTM(GloVe(w))

(``layers="all"``: [GloVe(w); CoVe-L1(w); CoVe-L2(w)], the first layer's states too). ``CoVeEmbedder``
is the frozen encoder (always in eval mode: no dropout; its GloVe table is the checkpoint's);
``glove_only=True`` gives the baseline input GloVe(w) alone. Words are the ``word`` profile's split of
the text, looked up in the checkpoint's tokenizer (GloVe's vocabulary; a word GloVe lacks reads the
zero vector of ``<unk>``). No sentence marks: the encoder was trained on plain source sentences.

``MaxPoolClassifier`` is a small task model over such vectors (a biLSTM over the sequence, max-pooled
over the real positions, a linear layer: the paper's classification network without the
biattention), ``fit_classifier`` trains it with Adam and keeps the best epoch on held-out rows.
"""

from __future__ import annotations

import copy
import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from glm_dist.models.recurrent import LSTMLayer
from glm_dist.transfer.inputs import batch_rows, pad_ids


class CoVeEmbedder(nn.Module):
    def __init__(self, model: nn.Module, *, layers: str = "top", glove_only: bool = False):
        super().__init__()
        if layers not in ("top", "all"):
            raise ValueError(f"layers={layers!r}: 'top' (CoVe = the last layer) or 'all' (every encoder layer)")
        self.model = model.requires_grad_(False).eval()
        self.layers, self.glove_only = layers, glove_only
        cfg = model.cfg
        self.dim = cfg.d_input + (0 if glove_only else 2 * cfg.d_model * (cfg.n_layer if layers == "all" else 1))

    def train(self, mode: bool = True) -> "CoVeEmbedder":
        super().train(mode)
        self.model.eval()  # frozen: never dropout
        return self

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) word ids -> (B, T, dim) vectors, zeros at padded positions."""
        if self.glove_only:
            glove = self.model.glove[input_ids]
            return glove if attention_mask is None else glove * attention_mask[..., None].to(glove.dtype)
        states = self.model.encoder_states(input_ids, attention_mask)
        out = torch.cat(states if self.layers == "all" else [states[0], states[-1]], dim=-1)
        return out if attention_mask is None else out * attention_mask[..., None].to(out.dtype)


def encode(tok: Tokenizer, texts: Sequence[str], *, max_len: int = 0) -> dict[str, torch.Tensor]:
    """A right-padded batch (``input_ids``, ``attention_mask``) of the texts' words (cut to ``max_len``
    when it is set; an empty text reads one ``<unk>``)."""
    unk, pad = tok.token_to_id("<unk>"), tok.token_to_id("<pad>")
    rows = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    rows = [(r[:max_len] if max_len else r) or [unk] for r in rows]
    ids, mask = pad_ids(rows, pad)
    return {"input_ids": ids, "attention_mask": mask}


def cove_features(model: nn.Module, tok: Tokenizer, texts: Sequence[str], *, batch_size: int = 32) -> list[np.ndarray]:
    """Each text's [GloVe; CoVe] vectors, (words, d_input + 2 d_model) float32 (``glm features``)."""
    embedder, out = CoVeEmbedder(model), []
    for rows in batch_rows(len(texts), batch_size):
        batch = encode(tok, texts[rows])
        vectors = embedder(**batch)
        out += [vectors[b, : int(n)].float().numpy() for b, n in enumerate(batch["attention_mask"].sum(1))]
    return out


class MaxPoolClassifier(nn.Module):
    """(B, T, d_in) vectors -> dropout -> biLSTM (d_hidden per direction) -> max over real positions
    -> dropout -> linear -> (B, num_classes) logits."""

    def __init__(self, d_in: int, num_classes: int, *, d_hidden: int = 128, dropout: float = 0.2):
        super().__init__()
        self.lstm = LSTMLayer(d_in, d_hidden, bidirectional=True)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(self.lstm.d_out, num_classes)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.drop(x), attention_mask.sum(1))
        h = h.masked_fill(attention_mask[..., None] == 0, float("-inf")).max(dim=1).values
        return self.out(self.drop(h))


def _batches(n: int, size: int, rng: np.random.Generator | None):
    order = rng.permutation(n) if rng is not None else np.arange(n)
    return [order[i : i + size] for i in range(0, n, size)]


def fit_classifier(
    embedder: CoVeEmbedder,
    tok: Tokenizer,
    train: Sequence[dict],
    valid: Sequence[dict],
    test: Sequence[dict],
    *,
    labels: Sequence[str],
    seed: int = 0,
    epochs: int = 4,
    batch_size: int = 64,
    lr: float = 1e-3,
    max_len: int = 40,
    d_hidden: int = 128,
) -> dict:
    """Train a ``MaxPoolClassifier`` on ``embedder``'s vectors of the rows' ``text`` (``label`` one of
    ``labels``); returns the held-out accuracy of the epoch best on ``valid``, measured on ``test``."""
    torch.manual_seed(seed)
    index = {name: i for i, name in enumerate(labels)}
    clf = MaxPoolClassifier(embedder.dim, len(labels), d_hidden=d_hidden)
    opt = torch.optim.Adam(clf.parameters(), lr=lr)
    rng = np.random.default_rng(seed)

    def inputs(rows):
        batch = encode(tok, [r["text"] for r in rows], max_len=max_len)
        return embedder(**batch), batch["attention_mask"], torch.tensor([index[r["label"]] for r in rows])

    def accuracy(rows) -> float:
        clf.eval()
        with torch.no_grad():
            hits = sum(
                int((clf(x, m).argmax(-1) == y).sum())
                for x, m, y in (inputs([rows[i] for i in b]) for b in _batches(len(rows), 256, None))
            )
        return hits / max(len(rows), 1)

    best, best_state, curve = -math.inf, None, []
    for _ in range(epochs):
        clf.train()
        for b in _batches(len(train), batch_size, rng):
            x, m, y = inputs([train[i] for i in b])
            loss = F.cross_entropy(clf(x, m), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        curve.append(accuracy(valid))
        if curve[-1] > best:
            best, best_state = curve[-1], copy.deepcopy(clf.state_dict())
    clf.load_state_dict(best_state)
    return {"valid_accuracy": best, "test_accuracy": accuracy(test), "valid_curve": curve}
