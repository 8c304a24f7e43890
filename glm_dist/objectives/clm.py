"""Causal language modelling (GPT): documents packed with end-of-text separators into blocks;
``TokenPacker`` also serves T5 (fixed-length raw spans).

Packing is deterministic given the document stream, and its only state is the tail of the
last document not yet emitted (``tail``), so a resumed run emits exactly the same blocks.
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator

import numpy as np
import torch

from glm_dist.objectives.base import Objective, token_report
from glm_dist.ops.cross_entropy import LinearCE, cross_entropy, linear_cross_entropy


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
            block = self.tail[: self.block_len]
            self.tail = self.tail[self.stride :]  # advance before yielding: state is exact
            yield block

    def units(self, docs: Iterable, rng_for=None) -> Iterator[np.ndarray]:
        return self.blocks(docs)

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
    """Mean next-token cross-entropy of given (B, T, vocab) logits (a pipeline's last stage), in
    fp32 a chunk of tokens at a time (logits may be bf16)."""
    return cross_entropy(logits, batch["labels"], reduction="mean")


def fused_nll(model, batch: dict[str, torch.Tensor]) -> LinearCE:
    """The model's final hidden states scored against the labels through its output matrix, a
    chunk of tokens at a time: the (B, T, vocab) logits never exist (ops/cross_entropy.py)."""
    labels = batch["labels"]
    return model(batch["input_ids"], project=lambda h, w, b: linear_cross_entropy(h, w, labels, bias=b))


class CausalLM(Objective):
    """GPT: next-token prediction over packed blocks; evaluation adds bits per byte."""

    def builder(self, *, seq_len, vocab, opts, stream=0):
        return clm_packer(seq_len, vocab.id("eot"))

    def sample(self, unit, rng, *, vocab, opts):
        return {"input_ids": unit[:-1], "labels": unit[1:]}

    def loss(self, model, batch, *, metrics):
        ce = fused_nll(model, batch)
        mean = ce.nll / ce.count.clamp(min=1)
        if not metrics:
            return mean, {}
        return mean, {"nll": ce.rows.sum().item(), "targets": ce.rows.numel(), "labels": batch["labels"]}

    def report(self, totals):
        return {**token_report(totals), "bits_per_byte": totals["nll"] / math.log(2) / max(totals["bytes"], 1)}

    def stage_inputs(self, batch, device):
        return batch["input_ids"].to(device), batch["labels"].to(device)

    def stage_loss(self, logits, labels):
        return loss(logits, {"labels": labels})


CLM = CausalLM(name="clm", salt=1000, sums=("nll", "targets", "bytes"))
