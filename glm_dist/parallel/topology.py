"""The named axes of a run: data x pipeline x tensor parallelism (docs/architecture.md, decision 2).

The sizes and their checks (product = world size, the model can be split that way) are the config's
(``config/layout.py``); a ``Topology`` adds the rank order, mapping a global rank to its coordinates.
Rank order is DeepSpeed's ``PipeModelDataParallelTopology`` (and Megatron's): tensor-parallel ranks are
adjacent (they talk every layer, so they share a node), then data-parallel replicas, and pipeline
stages outermost.
"""

from __future__ import annotations

from dataclasses import dataclass

from glm_dist.config.layout import Layout


@dataclass(frozen=True)
class Topology(Layout):
    def coords(self, rank: int) -> dict[str, int]:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        return {
            "tensor": rank % self.tensor,
            "data": (rank // self.tensor) % self.data,
            "pipeline": rank // (self.tensor * self.data),
        }

    def rank(self, data: int, pipeline: int, tensor: int) -> int:
        return (pipeline * self.data + data) * self.tensor + tensor

    def group(self, axis: str, rank: int) -> list[int]:
        """The ranks that differ from ``rank`` only along ``axis`` (one communication group)."""
        c = self.coords(rank)
        size = {"data": self.data, "pipeline": self.pipeline, "tensor": self.tensor}[axis]
        return [self.rank(**{**c, axis: i}) for i in range(size)]
