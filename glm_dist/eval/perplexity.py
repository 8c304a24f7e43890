"""Validation loss, perplexity and bits per byte.

Bits per byte = total NLL (nats) / (ln 2 x UTF-8 bytes of the predicted tokens), which compares
across tokenizers; special tokens count zero bytes.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from tokenizers import Tokenizer

from data_pipeline.tokenize.vocab_tables import token_byte_lengths
from glm_dist.objectives.steps import forward_loss
from glm_dist.parallel.distributed import all_reduce


def byte_length_table(tok: Tokenizer, vocab_size: int) -> torch.Tensor:
    """Bytes per token id, padded with zeros to the model's (possibly larger) vocabulary."""
    lengths = token_byte_lengths(tok)
    return torch.from_numpy(np.pad(lengths, (0, vocab_size - len(lengths))))


@torch.no_grad()
def evaluate(forward: Callable, batches: list[tuple[dict, float]], *, byte_lengths: torch.Tensor,
             device: torch.device | str = "cpu", objective: str = "clm") -> dict[str, float]:
    """``batches``: (batch, weight) pairs from ``validation_batches``; sums over all ranks.
    CLM: loss, perplexity, bits per byte. MLM-style: loss and perplexity over the masked tokens,
    accuracy, the sentence task's loss and accuracy where there is one, and ELECTRA's replaced-token
    detection accuracy."""
    keys = ("nll", "targets", "bytes", "correct", "sentence_nll", "sentences", "sentence_correct", "disc_tokens",
            "disc_correct")
    totals = dict.fromkeys(keys, 0.0)
    for batch, weight in batches:
        _, sums = forward_loss(objective, forward, batch, device)
        labels = sums.pop("labels", None)
        if labels is not None:
            sums["bytes"] = byte_lengths[labels.cpu()].sum().item()
        for key, value in sums.items():
            totals[key] += weight * value
    totals = dict(zip(keys, all_reduce([totals[k] for k in keys])))
    loss = totals["nll"] / max(totals["targets"], 1)
    out = {"loss": loss, "perplexity": math.exp(min(loss, 50)), "tokens": int(totals["targets"])}
    if objective == "clm":
        out["bits_per_byte"] = totals["nll"] / math.log(2) / max(totals["bytes"], 1)
    else:
        out["accuracy"] = totals["correct"] / max(totals["targets"], 1)
    if totals["disc_tokens"]:  # ELECTRA's discriminator: replaced-token detection accuracy
        out["replaced_accuracy"] = totals["disc_correct"] / totals["disc_tokens"]
    if totals["sentences"]:
        out["sentence_loss"] = totals["sentence_nll"] / totals["sentences"]
        out["sentence_accuracy"] = totals["sentence_correct"] / totals["sentences"]
    return out
