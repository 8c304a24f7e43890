"""The tensor-parallel ranks of one data-parallel replica share its read.

Every tensor rank of a replica trains on the same batch. Only tensor rank 0 reads its documents
(with its own workers and prefetching); the batches go to the other tensor ranks over the tensor
group (``comm.broadcast_batches``: a header and one buffer per step), and those ranks only advance
their sample position (``next_step(build=False)``: nothing read, noised or collated), so their saved
data position is the same. Storage reads per replica are one rank's, not ``tensor_parallel`` times it.
"""

from __future__ import annotations

import torch

from glm_dist.parallel import comm


class TensorShared:
    """``Loader``'s interface; ``lead`` (tensor rank 0) reads, the others receive."""

    def __init__(self, loader, group, *, lead: bool):
        self.loader, self.group, self.lead = loader, group, lead

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        batches = self.loader.next_step() if self.lead else self.loader.next_step(build=False)
        return comm.broadcast_batches(batches if self.lead else None, self.group)

    @property
    def global_batch_size(self) -> int:
        return self.loader.global_batch_size

    @property
    def epoch(self) -> int:
        return self.loader.epoch

    def read_counts(self) -> dict[str, int]:
        return self.loader.read_counts()

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)
