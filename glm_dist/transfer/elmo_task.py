"""A task model that takes ELMo (Peters et al. 2018, section 3.3): classify one word of a sentence.

    x_k = [e_k; ELMo_k^in]  ->  biLSTM  ->  [h_k; ELMo_k^out]  ->  linear  ->  class of word k

``e_k`` is the task model's own word embedding (trained from scratch over its training words);
``ELMo_k^in`` and (``elmo_output``) ``ELMo_k^out`` are two scalar mixes of a frozen biLM's layers
(``ElmoEmbedder``): only the mixes' weights and gammas and the task model learn. Without an embedder
it is the same model without ELMo, the baseline of the paper's tables. The biLM runs inside the
forward pass, or its layers come precomputed (``layers``: the same numbers, since a frozen biLM in
eval mode is a fixed function -- what a learning curve over many runs uses to save time).

``fit`` trains with Adam for a number of updates, validating now and then and keeping the best weights.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from glm_dist.transfer.elmo import ElmoEmbedder
from glm_dist.transfer.inputs import batch_rows, pad_ids

PAD, UNK = 0, 1


def task_vocabulary(rows: Sequence[dict], *, min_count: int = 1) -> dict[str, int]:
    """Word -> id over the rows' ``words`` (0 pads, 1 is every other word)."""
    counts = Counter(w for r in rows for w in r["words"])
    words = sorted(w for w, c in counts.items() if c >= min_count)
    return {w: i + 2 for i, w in enumerate(words)}


class WordInContext(nn.Module):
    def __init__(
        self,
        *,
        vocab_size: int,
        num_classes: int,
        d_embed: int = 64,
        d_hidden: int = 64,
        elmo: ElmoEmbedder | None = None,
        elmo_output: bool = False,
        dropout: float = 0.2,
    ):
        super().__init__()
        if elmo is not None and len(elmo.mixes) != 1 + elmo_output:
            raise ValueError(
                f"the embedder has {len(elmo.mixes)} mixes; this model takes {1 + elmo_output} "
                f"(input{' and output' if elmo_output else ''})"
            )
        if elmo is None and elmo_output:
            raise ValueError("elmo_output needs an ELMo embedder")
        d_elmo = 2 * elmo.bilm.cfg.d_model if elmo is not None else 0
        self.elmo, self.elmo_output = elmo, elmo_output
        self.embed = nn.Embedding(vocab_size, d_embed, padding_idx=PAD)
        self.rnn = nn.LSTM(d_embed + d_elmo, d_hidden, batch_first=True, bidirectional=True)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(2 * d_hidden + (d_elmo if elmo_output else 0), num_classes)

    def forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        position: torch.Tensor,
        *,
        bilm_inputs: dict[str, torch.Tensor] | None = None,
        layers: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T) task word ids, (B, T) mask of real words, (B,) the word to classify -> (B, classes) logits.
        With ELMo: ``bilm_inputs`` (``<bos> words <eos>``: ``elmo.encode``) or ``layers`` (L + 1, B, T, D)."""
        x = self.embed(ids)  # (B, T, d_embed)
        rows = torch.arange(ids.size(0), device=ids.device)
        mixed = []
        if self.elmo is not None:
            if layers is None:
                layers = self.elmo.layers(**bilm_inputs)[:, :, 1 : ids.size(1) + 1]  # the words, not the marks
            mixed = [mix(layers, mask) for mix in self.elmo.mixes]  # each (B, T, 2 d_model)
            x = torch.cat([x, mixed[0]], dim=-1)
        lengths = mask.sum(dim=1).cpu()
        packed = pack_padded_sequence(self.drop(x), lengths, batch_first=True, enforce_sorted=False)
        h, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True, total_length=ids.size(1))
        at = h[rows, position]  # (B, 2 d_hidden)
        if self.elmo_output:
            at = torch.cat([at, mixed[1][rows, position]], dim=-1)
        return self.out(self.drop(at))


def collate(rows: Sequence[dict], vocab: dict[str, int], *, with_layers: bool) -> dict[str, torch.Tensor]:
    """Rows ``{words, position, label[, layers (L + 1, words, D)]}`` -> a right-padded batch."""
    ids, mask = pad_ids([[vocab.get(w, UNK) for w in r["words"]] for r in rows], PAD)
    width = ids.shape[1]
    batch = {
        "ids": ids,
        "mask": mask,
        "position": torch.tensor([r["position"] for r in rows]),
        "labels": torch.tensor([r["label"] for r in rows]),
    }
    if with_layers:
        first = rows[0]["layers"]
        layers = np.zeros((first.shape[0], len(rows), width, first.shape[-1]), dtype=np.float32)
        for b, r in enumerate(rows):
            layers[:, b, : r["layers"].shape[1]] = r["layers"]
        batch["layers"] = torch.from_numpy(layers)
    return batch


def _logits(model: WordInContext, batch: dict) -> torch.Tensor:
    return model(batch["ids"], batch["mask"], batch["position"], layers=batch.get("layers"))


@torch.no_grad()
def accuracy(model: WordInContext, rows: Sequence[dict], vocab: dict[str, int], *, batch_size: int = 256) -> float:
    model.eval()
    right = 0
    for part in batch_rows(len(rows), batch_size):
        batch = collate(rows[part], vocab, with_layers=model.elmo is not None)
        right += int((_logits(model, batch).argmax(-1) == batch["labels"]).sum())
    return right / len(rows)


def fit(
    model: WordInContext,
    train: Sequence[dict],
    valid: Sequence[dict],
    vocab: dict[str, int],
    *,
    seed: int,
    lr: float = 2e-3,
    batch_size: int = 32,
    min_steps: int = 600,
    min_epochs: int = 2,
    max_epochs: int = 100,
    validations: int = 15,
) -> dict:
    """Adam for enough epochs to make ``min_steps`` updates (between ``min_epochs`` and ``max_epochs``),
    validating after every few epochs (about ``validations`` times in all); the model keeps the weights
    of its best validation."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    epochs = min(max_epochs, max(min_epochs, math.ceil(min_steps / math.ceil(len(train) / batch_size))))
    every = max(1, epochs // validations)
    best, best_state = -1.0, None
    for epoch in range(epochs):
        model.train()
        order = rng.permutation(len(train))
        for part in batch_rows(len(train), batch_size):
            rows = [train[i] for i in order[part]]
            batch = collate(rows, vocab, with_layers=model.elmo is not None)
            loss = F.cross_entropy(_logits(model, batch), batch["labels"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if (epoch + 1) % every == 0 or epoch + 1 == epochs:
            score = accuracy(model, valid, vocab)
            if score > best:
                best, best_state = score, copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    return {"valid_accuracy": best, "epochs": epochs}
