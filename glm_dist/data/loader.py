"""The training loader: a global stream of packed blocks, sliced by data-parallel rank.

Every rank builds the same global batch of ``micro_batch_size * grad_accum_steps * dp_size``
blocks per optimizer step and keeps its own slices, so all ranks see the same number of batches
and the loader's state (document position + packing tail) does not depend on the world size:
a checkpoint resumes exactly, and elastically at another data-parallel size.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from glm_dist.data.documents import DocumentStream
from glm_dist.data.shards import read_manifest, shard_urls
from glm_dist.objectives import clm


class CLMLoader:
    def __init__(self, shards_dir: str, *, split: str = "train", seq_len: int, micro_batch_size: int,
                 grad_accum_steps: int = 1, dp_rank: int = 0, dp_size: int = 1, seed: int = 0,
                 shuffle: bool = True):
        manifest = read_manifest(shards_dir)
        self.micro, self.accum = micro_batch_size, grad_accum_steps
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.stream = DocumentStream(shard_urls(shards_dir, manifest, split), seed=seed, shuffle=shuffle)
        self.packer = clm.CLMPacker(seq_len, manifest["tokenizer"]["eot_id"])
        self.steps = 0
        self._blocks: Iterator[np.ndarray] | None = None

    @property
    def global_batch_size(self) -> int:
        return self.micro * self.accum * self.dp_size

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """This rank's ``grad_accum_steps`` micro batches for the next optimizer step."""
        if self._blocks is None:
            self._blocks = self.packer.blocks(self.stream)
        blocks = [next(self._blocks) for _ in range(self.global_batch_size)]
        self.steps += 1
        out = []
        for m in range(self.accum):
            start = (m * self.dp_size + self.dp_rank) * self.micro
            out.append(clm.prepare(blocks[start:start + self.micro]))
        return out

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict(), "packer": self.packer.state_dict(),
                "steps": self.steps, "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
        self.packer.load_state_dict(state["packer"])
        self.steps = state["steps"]
        self._blocks = None


def validation_batches(shards_dir: str, *, seq_len: int, micro_batch_size: int, num_batches: int,
                       dp_rank: int = 0, dp_size: int = 1) -> list[tuple[dict[str, torch.Tensor], float]]:
    """The fixed validation set (the first ``num_batches`` batches of the held-out split, in stored
    order), split round-robin over ranks. Each rank gets the same number of (batch, weight) pairs;
    padding entries have weight 0 so every rank runs the same number of forward passes."""
    loader = CLMLoader(shards_dir, split="validation", seq_len=seq_len, micro_batch_size=micro_batch_size,
                       shuffle=False)
    first_epoch = []
    for _ in range(num_batches):
        batch = loader.next_step()[0]
        if loader.stream.position.epoch > 0 and first_epoch:
            break  # the held-out split is smaller than asked: do not repeat it
        first_epoch.append(batch)
    mine = first_epoch[dp_rank::dp_size]
    per_rank = -(-len(first_epoch) // dp_size)
    return [(b, 1.0) for b in mine] + [(first_epoch[0], 0.0)] * (per_rank - len(mine))
