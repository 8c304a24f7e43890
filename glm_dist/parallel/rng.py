"""Random numbers of dropout under tensor parallelism (Megatron's ``CudaRNGStatesTracker`` idea, on
any device).

Dropout draws from the process's default generators, seeded with ``train.seed`` on every rank, so
tensor ranks that run the same replicated computation draw the same masks. That is what the
replicated regions need: the embeddings' dropout and the residual stream's (after the row-parallel
all-reduce) must agree on every tensor rank, or their copies of the activations part. Where a rank
holds values the others do not -- its own attention heads' probabilities, and, under sequence
parallelism, its own positions of the residual stream -- the same draws would repeat one mask on
every rank's share (head h of rank 1 dropped exactly where head h of rank 0 is). There dropout runs
inside ``TensorRankRNG.fork()``:

============================================  ===============  ====================================
region                                        mask             generator
============================================  ===============  ====================================
embeddings (token + position), all layouts    the same on all  default
residual stream (after attention / FFN)       the same on all  default (plain tensor parallelism)
residual stream, ``sequence_parallel``        this rank's      ``fork()`` (the rank's positions)
attention probabilities (a rank's heads)      this rank's      ``fork()``
============================================  ===============  ====================================

``fork()`` takes one number from the default CPU generator (the same on every tensor rank, so the
default streams stay in step), seeds the default generators with (that number, tensor rank) for
the region, and restores them after it. The per-rank stream is therefore a function of the run's
seed, the tensor rank and the position in the run: a run reproduces itself; activation
checkpointing, which replays the default generators' state when it recomputes a block, replays the
same masks; a checkpoint's saved RNG states resume it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


class TensorRankRNG:
    def __init__(self, tensor_rank: int):
        self.tensor_rank = tensor_rank

    @contextlib.contextmanager
    def fork(self) -> Iterator[None]:
        draw = int(torch.randint(0, 2**62, (), dtype=torch.int64))  # default CPU generator: no device sync
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        devices = [torch.accelerator.current_device_index()] if accelerator is not None else []
        with torch.random.fork_rng(devices=devices, device_type=accelerator.type if accelerator else "cuda"):
            torch.manual_seed((draw * 1_000_003 + self.tensor_rank) % 2**63)
            yield


class ForkedDropout(nn.Dropout):
    """Dropout whose mask comes from this tensor rank's stream (a region the rank alone holds)."""

    def __init__(self, p: float, rng: TensorRankRNG):
        super().__init__(p)
        self.rng = rng

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        with self.rng.fork():
            return super().forward(x)
