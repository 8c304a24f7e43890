"""Causal language modelling (GPT): documents packed with end-of-text separators into blocks.

Packing is deterministic given the document stream, and its only state is the tail of the
last document not yet emitted (``carry``), so a resumed run emits exactly the same blocks.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


class CLMPacker:
    """Concatenate ``doc + [eot]`` and cut blocks of ``seq_len + 1`` tokens at stride ``seq_len``
    (the last token of a block is the first input of the next, so every token is a target once)."""

    def __init__(self, seq_len: int, eot_id: int):
        self.seq_len, self.eot_id = seq_len, eot_id
        self.tail = np.zeros(0, dtype=np.int64)  # packed tokens not yet emitted

    def blocks(self, docs: Iterable) -> Iterator[np.ndarray]:
        docs, eot = iter(docs), np.array([self.eot_id], dtype=np.int64)
        while True:
            while len(self.tail) < self.seq_len + 1:
                self.tail = np.concatenate([self.tail, next(docs).tokens.astype(np.int64), eot])
            block = self.tail[:self.seq_len + 1]
            self.tail = self.tail[self.seq_len:]  # advance before yielding: state is exact
            yield block

    def state_dict(self) -> dict:
        return {"tail": self.tail.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.tail = np.asarray(state["tail"], dtype=np.int64)


def prepare(blocks: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """(B, seq_len + 1) token blocks -> inputs and next-token labels, each (B, seq_len)."""
    data = torch.from_numpy(np.stack(blocks))
    return {"input_ids": data[:, :-1].contiguous(), "labels": data[:, 1:].contiguous()}


def loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32 (logits may be bf16)."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), batch["labels"].view(-1),
                           ignore_index=IGNORE_INDEX)


def token_losses(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-target cross-entropy (B, T), for perplexity and bits per byte."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().view(-1, V), batch["labels"].view(-1),
                           ignore_index=IGNORE_INDEX, reduction="none").view(B, T)
