"""The sizes of a run's layout -- data x pipeline x tensor parallelism -- and the checks on them.

Pure arithmetic on the config's numbers, so the config checks refuse a layout before any process
starts; ``parallel/topology.py`` adds the rank order (which rank sits where) on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from glm_common.config_yaml import ConfigError


@dataclass(frozen=True)
class Layout:
    data: int = 1
    pipeline: int = 1
    tensor: int = 1

    @property
    def world_size(self) -> int:
        return self.data * self.pipeline * self.tensor

    @classmethod
    def for_world(cls, world_size: int, pipeline: int = 1, tensor: int = 1):
        """Data parallelism takes what pipeline x tensor leave of the world."""
        if pipeline < 1 or tensor < 1:
            raise ConfigError(f"parallel.pipeline_stages={pipeline} and parallel.tensor_parallel={tensor} must be >= 1")
        if world_size % (pipeline * tensor):
            raise ConfigError(
                f"world size {world_size} is not divisible by pipeline_stages {pipeline} x "
                f"tensor_parallel {tensor} = {pipeline * tensor}; use a world size that is a multiple "
                f"of {pipeline * tensor} or change the layout"
            )
        return cls(world_size // (pipeline * tensor), pipeline, tensor)

    def describe(self) -> str:
        return f"DP={self.data} x PP={self.pipeline} x TP={self.tensor} = {self.world_size} ranks"


def check_layout(
    layout: Layout,
    *,
    n_layer: int,
    n_head: int,
    ffn: int,
    vocab: int,
    zero_stage: int,
    gpus_per_node: int | None = None,
    offload_params: bool = False,
) -> None:
    """Refuse a layout the model or the engine cannot run, with the numbers."""
    if layout.tensor > 1:
        for name, value in (("attention heads (model.n_head)", n_head), ("FFN width (model.d_ff)", ffn)):
            if value % layout.tensor:
                raise ConfigError(
                    f"tensor_parallel={layout.tensor} does not divide the {name} = {value}; "
                    f"use a tensor-parallel size that divides {value}"
                )
        if gpus_per_node and layout.tensor > gpus_per_node:
            raise ConfigError(
                f"tensor_parallel={layout.tensor} exceeds the {gpus_per_node} GPUs of a node; tensor "
                "parallelism communicates every layer and must stay inside a node"
            )
    if layout.pipeline > 1:
        if layout.pipeline > n_layer:
            raise ConfigError(f"pipeline_stages={layout.pipeline} is more than the model's {n_layer} layers")
        if zero_stage >= 2:
            raise ConfigError(
                f"pipeline parallelism (pipeline_stages={layout.pipeline}) runs with ZeRO stage 0 or 1 "
                f"only (DeepSpeed's pipeline engine rejects ZeRO-{zero_stage}); "
                f"set parallel.zero_stage=1"
            )
    if offload_params and zero_stage != 3:
        raise ConfigError(f"parallel.offload_params needs parallel.zero_stage=3 (it is {zero_stage})")
