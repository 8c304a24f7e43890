"""Pipeline parallelism with DeepSpeed's ``PipelineModule``, cut from the model's own layers.

The generic half: a family's pipeline module (``families/<family>/pipeline.py``, named by its row's
``PipelineSpec``) lists its layers as DeepSpeed layer specs -- the embedding, the blocks, the head --
with the output projection a ``TiedLayerSpec`` of the token embedding, so the first and the last stage
hold the same matrix and DeepSpeed all-reduces its gradient between them; ``build_pipeline`` cuts them.
Stages get equal numbers of transformer blocks (DeepSpeed's ``type:<Block>``; the embedding joins the
first, the head the last), which also keeps a block on every stage: a stage holding only the tied
output copy hangs ZeRO-1 (``parallel.pipeline_partition=parameters`` balances parameter counts
instead, and is refused when it would leave a stage without a block). The stage's weights are then
copied from the whole model built with the run's seed, so a pipelined run starts from the same weights
as an unpipelined one and follows the same loss trajectory. (Building the whole model first is fine
up to what one host holds; beyond that, construct on the meta device.) The loss runs on the last
stage (``NonFiniteGuard``, ``pipeline_validate``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from glm_dist.objectives.base import IGNORE_INDEX, token_report
from glm_dist.parallel import comm
from glm_dist.parallel.init import init_stage
from glm_dist.parallel.tensor import mark_for_grad_norm as mark_tensor_parallel

TIED = "embed"


PARTITIONS = {"blocks": "type:{block}", "parameters": "parameters"}


def check_partition(specs: list, stages: int, method: str, block: type) -> list[int]:
    """The stage boundaries DeepSpeed will cut ``specs`` at (``parameters``: balanced parameter
    counts; ``blocks``: equal numbers of ``block`` layers). Refused when a stage would get no
    block -- e.g. the last stage holding only the tied output projection, which leaves ZeRO-1
    hanging -- with the stages' contents in the message."""
    from deepspeed.runtime import utils as ds_utils

    is_block = [getattr(spec, "typename", None) is not None and issubclass(spec.typename, block) for spec in specs]
    if method == "parameters":
        with torch.device("meta"):
            weights = [sum(p.numel() for p in spec.build().parameters()) for spec in specs]
    else:  # what DeepSpeed's "type:" method balances: one per block
        weights = [int(b) for b in is_block]
    parts = [int(i) for i in ds_utils.partition_balanced(weights=weights, num_parts=stages)]
    empty = [s for s in range(stages) if not any(is_block[parts[s] : parts[s + 1]])]
    if empty:
        names = [
            [getattr(spec, "typename", type(spec)).__name__ for spec in specs[parts[s] : parts[s + 1]]]
            for s in range(stages)
        ]
        raise ValueError(
            f"partitioning {len(specs)} layers into {stages} stages by {method} leaves stage(s) {empty} "
            f"without a {block.__name__} ({names}); "
            f"use parallel.pipeline_partition=blocks or fewer stages"
        )
    return parts


def _fill(model: nn.Module, pipe: nn.Module, rename, local_seed: int | None, *, std) -> None:
    """The stage's weights: copied from the whole model, or (``local_seed``) drawn per parameter
    without it (``parallel/init.py``)."""
    if local_seed is None:
        copy_weights(model, pipe, rename=rename)
    else:
        init_stage(pipe, rename, std=std(model.cfg), seed=local_seed)


def build_pipeline(
    model: nn.Module,
    specs: list,
    *,
    block: type,
    rename,
    std,
    stages: int,
    loss_fn,
    topology=None,
    partition: str = "blocks",
    checkpoint_interval: int = 0,
    local_seed: int | None = None,
    checkpointable: str | None = None,
):
    """A family's layer ``specs`` cut into ``stages`` (``block``: its transformer block class, what
    the stages balance), weights from ``model`` (``rename``: a stage's state-dict key -> the model's
    name; ``std``: model config -> the per-parameter std of a ``local_seed`` draw).
    ``checkpointable``: the layer class activation checkpointing recomputes (default the block's name;
    never the embedding, whose input is token ids)."""
    from deepspeed.pipe import PipelineModule

    check_partition(specs, stages, partition, block)
    pipe = PipelineModule(
        specs,
        num_stages=None if topology is not None else stages,
        topology=topology,
        loss_fn=loss_fn,
        partition_method=PARTITIONS[partition].format(block=block.__name__),
        activation_checkpoint_interval=checkpoint_interval,
        checkpointable_layers=[checkpointable or block.__name__],
    )
    _fill(model, pipe, rename, local_seed, std=std)
    mark_for_grad_norm(pipe)
    return pipe


def mark_for_grad_norm(pipe, tensor_rank: int = 0) -> None:
    """DeepSpeed's gradient-norm (clipping) sums a parameter over the pipeline stages (and tensor
    ranks) only if it is marked ``model_parallel`` -- unmarked ones count on model-parallel rank 0
    alone. Every stage's own parameters are marked (replicated ones on tensor rank 0 only); the
    tied embedding's copy on a later stage is not, so the shared matrix counts once."""
    tied = {id(p) for p in pipe.tied_modules.parameters()} if hasattr(pipe, "tied_modules") else set()
    mark_tensor_parallel(pipe, tensor_rank, exclude=tied if pipe.stage_id != 0 else set())


def unpipelined_name(key: str, n_layer: int, after: dict[int, str]) -> str | None:
    """The unpipelined model's name for a PipelineModule state-dict key: the tied embedding, the
    blocks (layers 1..n_layer), and ``after[k]`` as the prefix of layer ``n_layer + k``."""
    if key.startswith(f"tied_modules.{TIED}."):
        return "embed." + key[len(f"tied_modules.{TIED}.") :]
    idx, _, rest = key.partition(".")
    if not idx.isdigit():
        return None
    i = int(idx)
    if 1 <= i <= n_layer:
        return f"blocks.{i - 1}.{rest}"
    prefix = after.get(i - n_layer)
    return None if prefix is None else prefix + rest


def copy_weights(model: nn.Module, pipe: nn.Module, rename) -> None:
    """Give this stage's layers the whole model's weights (the tied output uses the embedding);
    ``rename``: a stage's state-dict key -> the model's name for it."""
    source = model.state_dict()
    target = pipe.state_dict()
    for key in target:
        name = rename(key)
        if name is None or name not in source:
            raise KeyError(f"pipeline parameter {key!r} has no counterpart in the model ({name!r})")
        if source[name].shape != target[key].shape:
            raise ValueError(f"{key}: shape {tuple(target[key].shape)} != model's {name} {tuple(source[name].shape)}")
        target[key] = source[name]
    pipe.load_state_dict(target, strict=True)


class NonFiniteGuard:
    """Skip a pipelined optimizer step whose loss was not finite, on every rank at once.

    DeepSpeed's pipeline engine runs forward, backward and the optimizer step inside one
    ``train_batch``. The last stage's loss function notes a non-finite micro-batch loss; just before
    the step (the schedule's OptimizerStep, which every stage reaches) the ranks agree on it with an
    all-reduce, and the optimizer's ``skip_next`` leaves weights and moments untouched -- the same
    mechanism as the unpipelined loop. The same all-reduce agrees on a stop signal (``stop()``)."""

    def __init__(self, engine, optimizer, *, stop=lambda: False):
        from deepspeed.runtime.pipe.schedule import OptimizerStep

        self.seen_bad: torch.Tensor | None = None  # on the device: no host sync per micro batch
        self.skipped = self.stop_requested = False
        inner = engine.module.loss_fn

        def loss_fn(outputs, labels):
            loss = inner(outputs, labels)
            bad = (~torch.isfinite(loss.detach())).any()
            self.seen_bad = bad if self.seen_bad is None else self.seen_bad | bad
            return loss

        step = type(engine)._INSTRUCTION_MAP[OptimizerStep]

        def guarded_step(engine_self, *args, **kwargs):
            flags = torch.tensor([0.0, float(stop())], device=engine.device)  # [non-finite loss, stop signal]
            if self.seen_bad is not None:
                flags[0] += self.seen_bad.float()
            bad, stopping = comm.all_reduce_(flags, "max").tolist()  # the step's one host sync
            self.skipped, self.stop_requested = bad > 0, stopping > 0
            self.seen_bad = None
            optimizer.skip_next = self.skipped
            try:
                return step(engine_self, *args, **kwargs)
            finally:
                optimizer.skip_next = False

        engine.module.loss_fn = loss_fn
        engine._INSTRUCTION_MAP = {**type(engine)._INSTRUCTION_MAP, OptimizerStep: guarded_step}


def pipeline_validate(engine, batches, byte_lengths: torch.Tensor, objective) -> dict[str, float]:
    """Validation through the pipeline: each batch's mean loss (DeepSpeed broadcasts it to every
    stage) times its target count; sums over all ranks (every stage of a pipeline adds the same
    numbers, which cancels in the ratios). Bits per byte where the objective reports them."""
    nll = targets = nbytes = 0.0
    for batch, weight in batches:
        inputs, labels = objective.stage_inputs(batch, engine.device)
        loss = engine.eval_batch(iter([(inputs, labels)]), num_micro_batches=1)
        chosen = labels != IGNORE_INDEX
        n = int(chosen.sum())
        nll += weight * float(loss) * n
        targets += weight * n
        nbytes += weight * byte_lengths[labels[chosen].cpu()].sum().item()
    nll, targets, nbytes = comm.all_reduce_values([nll, targets, nbytes])
    out = token_report({"nll": nll, "targets": targets})
    if "bytes" in objective.sums:
        out["bits_per_byte"] = nll / math.log(2) / max(nbytes, 1)
    return out
