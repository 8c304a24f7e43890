"""Pipeline parallelism with DeepSpeed's ``PipelineModule``, cut from the model's own layers.

The GPT layer list -- ``GPTEmbedding``, ``n_layer`` x ``GPTBlock``, the final LayerNorm, the output
projection -- becomes layer specs of the same classes; the output projection is a ``TiedLayerSpec``
of the token embedding, so the first and the last stage hold the same matrix and DeepSpeed
all-reduces its gradient between them. Stages get equal numbers of transformer blocks (DeepSpeed's
``type:GPTBlock``; the embedding joins the first, the final norm and output the last), which also
keeps a block on every stage: a stage holding only the tied output copy hangs ZeRO-1. The stage's weights are then copied from the whole model built with the run's seed,
so a pipelined run starts from the same weights as an unpipelined one and follows the same loss
trajectory. (Building the whole model first is fine up to what one host holds; beyond that,
construct on the meta device.)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from glm_dist.models.gpt import GPT, GPTBlock, GPTEmbedding
from glm_dist.objectives import clm

TIED = "embed"


class TiedOutput(nn.Module):
    """The last stage's copy of the token embedding, used as the output projection."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)


def _logits(module: TiedOutput, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, module.wte.weight)


def clm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy, exactly ``objectives.clm.token_losses(...).mean()``."""
    return clm.token_losses(logits, {"labels": labels}).mean()


def gpt_pipeline(model: GPT, *, stages: int, topology=None, partition_method: str = "type:GPTBlock",
                 checkpoint_interval: int = 0):
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    cfg = model.cfg
    # The embedding is its own forward (a module in DeepSpeed's layer list, so its weights are saved
    # with the checkpoint); the output projection reuses it through a function, and DeepSpeed
    # re-broadcasts the tied matrix from the first stage after a load.
    specs = [TiedLayerSpec(TIED, GPTEmbedding, cfg, tied_weight_attr=["wte.weight"]),
             *[LayerSpec(GPTBlock, cfg, i) for i in range(cfg.n_layer)],
             LayerSpec(nn.LayerNorm, cfg.d_model, eps=cfg.layer_norm_eps),
             TiedLayerSpec(TIED, TiedOutput, cfg.vocab_size, cfg.d_model, forward_fn=_logits,
                           tied_weight_attr=["wte.weight"])]
    pipe = PipelineModule(specs, num_stages=None if topology is not None else stages, topology=topology,
                          loss_fn=clm_loss, partition_method=partition_method,
                          activation_checkpoint_interval=checkpoint_interval)
    copy_weights(model, pipe)
    mark_for_grad_norm(pipe)
    return pipe


def mark_for_grad_norm(pipe, tensor_rank: int = 0) -> None:
    """DeepSpeed's gradient-norm (clipping) sums a parameter over the pipeline stages (and tensor
    ranks) only if it is marked ``model_parallel`` -- unmarked ones count on model-parallel rank 0
    alone. Every stage's own parameters are marked (replicated ones on tensor rank 0 only); the
    tied embedding's copy on a later stage is not, so the shared matrix counts once."""
    from glm_dist.parallel.tensor import mark_for_grad_norm as mark

    tied = {id(p) for p in pipe.tied_modules.parameters()} if hasattr(pipe, "tied_modules") else set()
    mark(pipe, tensor_rank, exclude=tied if pipe.stage_id != 0 else set())


def _source_name(key: str, n_layer: int) -> str | None:
    """The unpipelined GPT's name for a PipelineModule state-dict key."""
    if key.startswith(f"tied_modules.{TIED}."):
        return "embed." + key[len(f"tied_modules.{TIED}."):]
    idx, _, rest = key.partition(".")
    if not idx.isdigit():
        return None
    i = int(idx)
    if 1 <= i <= n_layer:
        return f"blocks.{i - 1}.{rest}"
    if i == n_layer + 1:
        return f"head.ln_f.{rest}"
    return None


def copy_weights(model: GPT, pipe: nn.Module) -> None:
    """Give this stage's layers the whole model's weights (the tied output uses the embedding)."""
    source = model.state_dict()
    target = pipe.state_dict()
    for key in target:
        name = _source_name(key, model.cfg.n_layer)
        if name is None or name not in source:
            raise KeyError(f"pipeline parameter {key!r} has no counterpart in the model ({name!r})")
        if source[name].shape != target[key].shape:
            raise ValueError(f"{key}: shape {tuple(target[key].shape)} != model's {name} {tuple(source[name].shape)}")
        target[key] = source[name]
    pipe.load_state_dict(target, strict=True)


def pipeline_validate(engine, batches, byte_lengths: torch.Tensor) -> dict[str, float]:
    """CLM validation through the pipeline: each batch's mean loss (DeepSpeed broadcasts it to every
    stage) times its target count; sums over all ranks (every stage of a pipeline adds the same
    numbers, which cancels in the ratios)."""
    from glm_dist.parallel.distributed import all_reduce

    nll = targets = nbytes = 0.0
    for batch, weight in batches:
        ids, labels = batch["input_ids"].to(engine.device), batch["labels"].to(engine.device)
        loss = engine.eval_batch(iter([(ids, labels)]), num_micro_batches=1)
        n = labels.numel()
        nll += weight * float(loss) * n
        targets += weight * n
        nbytes += weight * byte_lengths[labels.cpu()].sum().item()
    nll, targets, nbytes = all_reduce([nll, targets, nbytes])
    loss = nll / max(targets, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50)), "tokens": int(targets),
            "bits_per_byte": nll / math.log(2) / max(nbytes, 1)}


def pipeline_state_dict(state_dir, n_layer: int) -> dict[str, torch.Tensor]:
    """The unpipelined GPT state dict from a pipelined checkpoint's per-layer files
    (``layer_XX-model_00-model_states.pt``, the module weights each stage saved), with the output
    projection tied to the token embedding again."""
    from pathlib import Path

    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(state_dir).glob("layer_*-model_00-model_states.pt")):
        idx = int(f.name.split("-")[0].split("_")[1])
        for key, value in torch.load(f, map_location="cpu", weights_only=True).items():
            name = _source_name(f"tied_modules.{TIED}.{key}" if idx == 0 else f"{idx}.{key}", n_layer)
            if name is not None:
                out[name] = value
    if "embed.wte.weight" not in out:
        raise FileNotFoundError(f"{state_dir}: no layer_00 file with the token embedding")
    out["head.lm_head.weight"] = out["embed.wte.weight"]
    return out
