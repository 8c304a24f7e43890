"""The named axes of a run: data x pipeline x tensor parallelism (docs/architecture.md, decision 2).

One object holds the three sizes, checks that their product is the world size and that the model
can be split that way, and maps a global rank to its coordinates. Rank order is DeepSpeed's
``PipeModelDataParallelTopology`` (and Megatron's): tensor-parallel ranks are adjacent (they talk
every layer, so they share a node), then data-parallel replicas, and pipeline stages outermost.
"""
from __future__ import annotations

from dataclasses import dataclass

from glm_dist.config.loader import ConfigError

AXES = ("data", "pipeline", "tensor")


@dataclass(frozen=True)
class Topology:
    data: int = 1
    pipeline: int = 1
    tensor: int = 1

    @property
    def world_size(self) -> int:
        return self.data * self.pipeline * self.tensor

    @classmethod
    def for_world(cls, world_size: int, pipeline: int = 1, tensor: int = 1) -> "Topology":
        """Data parallelism takes what pipeline x tensor leave of the world."""
        if pipeline < 1 or tensor < 1:
            raise ConfigError(f"parallel.pipeline_stages={pipeline} and parallel.tensor_parallel={tensor} must be >= 1")
        if world_size % (pipeline * tensor):
            raise ConfigError(f"world size {world_size} is not divisible by pipeline_stages {pipeline} x "
                              f"tensor_parallel {tensor} = {pipeline * tensor}; use a world size that is a multiple "
                              f"of {pipeline * tensor} or change the layout")
        return cls(world_size // (pipeline * tensor), pipeline, tensor)

    def coords(self, rank: int) -> dict[str, int]:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        return {"tensor": rank % self.tensor, "data": (rank // self.tensor) % self.data,
                "pipeline": rank // (self.tensor * self.data)}

    def rank(self, data: int, pipeline: int, tensor: int) -> int:
        return (pipeline * self.data + data) * self.tensor + tensor

    def group(self, axis: str, rank: int) -> list[int]:
        """The ranks that differ from ``rank`` only along ``axis`` (one communication group)."""
        c = self.coords(rank)
        size = {"data": self.data, "pipeline": self.pipeline, "tensor": self.tensor}[axis]
        return [self.rank(**{**c, axis: i}) for i in range(size)]

    def describe(self) -> str:
        return f"DP={self.data} x PP={self.pipeline} x TP={self.tensor} = {self.world_size} ranks"


def check_layout(topo: Topology, *, n_layer: int, n_head: int, ffn: int, vocab: int, zero_stage: int,
                 gpus_per_node: int | None = None, offload_params: bool = False) -> None:
    """Refuse a layout the model or the engine cannot run, with the numbers."""
    if topo.tensor > 1:
        for name, value in (("attention heads (model.n_head)", n_head), ("FFN width (model.d_ff)", ffn)):
            if value % topo.tensor:
                raise ConfigError(f"tensor_parallel={topo.tensor} does not divide the {name} = {value}; "
                                  f"use a tensor-parallel size that divides {value}")
        if gpus_per_node and topo.tensor > gpus_per_node:
            raise ConfigError(f"tensor_parallel={topo.tensor} exceeds the {gpus_per_node} GPUs of a node; tensor "
                              "parallelism communicates every layer and must stay inside a node")
    if topo.pipeline > 1:
        if topo.pipeline > n_layer:
            raise ConfigError(f"pipeline_stages={topo.pipeline} is more than the model's {n_layer} layers")
        if zero_stage >= 2:
            raise ConfigError(f"pipeline parallelism (pipeline_stages={topo.pipeline}) runs with ZeRO stage 0 or 1 "
                              f"only (DeepSpeed's pipeline engine rejects ZeRO-{zero_stage}); "
                              f"set parallel.zero_stage=1")
    if offload_params and zero_stage != 3:
        raise ConfigError(f"parallel.offload_params needs parallel.zero_stage=3 (it is {zero_stage})")
