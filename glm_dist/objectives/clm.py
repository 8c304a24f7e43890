"""Causal language modelling (GPT): documents packed with end-of-text separators into blocks;
``TokenPacker`` also serves T5 (fixed-length raw spans).

Packing is deterministic given the document stream, and its only state is the tail of the
last document not yet emitted (``tail``), so a resumed run emits exactly the same blocks.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


class TokenPacker:
    """Concatenate documents (each followed by ``sep`` unless None) and cut blocks of ``block_len``
    tokens every ``stride`` tokens. CLM: ``block_len = seq_len + 1``, ``stride = seq_len`` (the last
    token of a block is the first input of the next, so every token is a target once); T5:
    ``block_len = stride`` = the raw length of one example, no separator."""

    def __init__(self, block_len: int, *, stride: int | None = None, sep: int | None = None):
        self.block_len, self.stride, self.sep = block_len, stride or block_len, sep
        self.tail = np.zeros(0, dtype=np.int64)  # packed tokens not yet emitted

    def blocks(self, docs: Iterable) -> Iterator[np.ndarray]:
        docs, sep = iter(docs), np.array([] if self.sep is None else [self.sep], dtype=np.int64)
        while True:
            while len(self.tail) < self.block_len:
                self.tail = np.concatenate([self.tail, next(docs).tokens.astype(np.int64), sep])
            block = self.tail[:self.block_len]
            self.tail = self.tail[self.stride:]  # advance before yielding: state is exact
            yield block

    def state_dict(self) -> dict:
        return {"tail": self.tail.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.tail = np.asarray(state["tail"], dtype=np.int64)


def clm_packer(seq_len: int, eot_id: int) -> TokenPacker:
    return TokenPacker(seq_len + 1, stride=seq_len, sep=eot_id)


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
