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
from glm_dist.objectives import clm
from glm_dist.parallel.distributed import all_reduce


def byte_length_table(tok: Tokenizer, vocab_size: int) -> torch.Tensor:
    """Bytes per token id, padded with zeros to the model's (possibly larger) vocabulary."""
    lengths = token_byte_lengths(tok)
    return torch.from_numpy(np.pad(lengths, (0, vocab_size - len(lengths))))


@torch.no_grad()
def evaluate(forward: Callable[[torch.Tensor], torch.Tensor], batches: list[tuple[dict, float]], *,
             byte_lengths: torch.Tensor, device: torch.device | str = "cpu") -> dict[str, float]:
    """``batches``: (batch, weight) pairs from ``validation_batches``; sums over all ranks."""
    nll = tokens = nbytes = 0.0
    for batch, weight in batches:
        logits = forward(batch["input_ids"].to(device))
        losses = clm.token_losses(logits, {"labels": batch["labels"].to(device)})
        nll += weight * losses.sum().item()
        tokens += weight * losses.numel()
        nbytes += weight * byte_lengths[batch["labels"]].sum().item()
    nll, tokens, nbytes = all_reduce([nll, tokens, nbytes])
    loss = nll / max(tokens, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50)), "bits_per_byte": nll / math.log(2) / max(nbytes, 1),
            "tokens": int(tokens)}
