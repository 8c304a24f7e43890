"""Linear probes of frozen features (Peters et al. 2018, section 5.3; Tenney et al. 2019): how much of
a label a layer's vectors hold is the accuracy of a linear classifier trained on them alone.

Features are standardised with the training split's mean and variance; the classifier (softmax
regression) trains with Adam on mini-batches, and the test accuracy reported is the one at the epoch
with the best validation accuracy. ``allowed`` optionally restricts each item's choice to some
classes (a supersense among its part of speech's, as word sense disambiguation knows the word).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class ProbeSplit:
    x: np.ndarray  # (N, D) features
    y: np.ndarray  # (N,) class ids
    allowed: np.ndarray | None = None  # (N, C) bool: the classes an item may take (None: all)


def majority_accuracy(train: ProbeSplit, test: ProbeSplit) -> float:
    """The score of always answering the training split's most frequent class (among the allowed ones)."""
    width = test.allowed.shape[1] if test.allowed is not None else int(max(train.y.max(), test.y.max())) + 1
    counts = np.bincount(train.y, minlength=width).astype(float)
    guesses = counts.argmax() if test.allowed is None else np.where(test.allowed, counts[None], -1.0).argmax(1)
    return float((guesses == test.y).mean())


def _scores(w: torch.nn.Linear, split: ProbeSplit, mean, std) -> torch.Tensor:
    logits = w((torch.from_numpy(split.x).float() - mean) / std)
    if split.allowed is not None:
        logits = logits.masked_fill(~torch.from_numpy(split.allowed), float("-inf"))
    return logits


def linear_probe(
    train: ProbeSplit,
    valid: ProbeSplit,
    test: ProbeSplit,
    *,
    num_classes: int,
    seed: int,
    epochs: int = 20,
    lr: float = 1e-2,
    batch_size: int = 256,
    weight_decay: float = 1e-4,
) -> dict:
    """Validation and test accuracy of softmax regression on ``train`` (the best validation epoch's)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(train.x).float()
    mean, std = x.mean(0), x.std(0).clamp(min=1e-6)
    w = torch.nn.Linear(x.size(1), num_classes)
    with torch.no_grad():
        w.weight.normal_(0, 0.01, generator=gen)
        w.bias.zero_()
    opt = torch.optim.Adam(w.parameters(), lr=lr, weight_decay=weight_decay)
    y = torch.from_numpy(train.y).long()
    best = {"valid_accuracy": -1.0}
    for epoch in range(epochs):
        for idx in torch.randperm(len(y), generator=gen).split(batch_size):
            part = ProbeSplit(
                train.x[idx.numpy()],
                train.y[idx.numpy()],
                None if train.allowed is None else train.allowed[idx.numpy()],
            )
            loss = F.cross_entropy(_scores(w, part, mean, std), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            v = float((_scores(w, valid, mean, std).argmax(1).numpy() == valid.y).mean())
            if v > best["valid_accuracy"]:
                t = float((_scores(w, test, mean, std).argmax(1).numpy() == test.y).mean())
                best = {"valid_accuracy": v, "test_accuracy": t, "epoch": epoch + 1}
    return best
