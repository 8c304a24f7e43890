"""``train.compile``: ``torch.compile`` per transformer block (regional compilation).

Each block is compiled in place (``nn.Module.compile``): the module, its parameters and their names
stay what DeepSpeed, the checkpoints and the pipeline see, and one compiled graph serves every block
of the same shape (a change of shape or grad mode recompiles, up to dynamo's cache limit). Compiling
the blocks rather than the whole model keeps compile time down to one block's and leaves the parts
that do not trace well to eager: the embedding, the loss (a Python loop over chunks,
``ops/cross_entropy.py``), activation checkpointing around the block (torch's and DeepSpeed's
recompute call the compiled block again), DeepSpeed's engine and a pipeline's schedule.

Which modules are blocks: the members of the model's ``nn.ModuleList``s (GPT's, the encoders' and the
decoders' ``blocks``; the outermost lists only, ALBERT's shared block once), or, in a DeepSpeed
``PipelineModule``, this stage's layers of the class the layer list repeats most (the blocks: one
per layer, the other layers once). ZeRO-3 and tensor parallelism are refused by config validation:
ZeRO-3's parameter hooks and the tensor-parallel collectives sit inside the block and would break its
graph.
"""

from __future__ import annotations

from collections import Counter

from torch import nn


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of ``model`` (a model or a DeepSpeed PipelineModule stage), each once."""
    if hasattr(model, "_layer_specs") and hasattr(model, "forward_funcs"):  # PipelineModule
        kinds = Counter(spec.typename for spec in model._layer_specs if hasattr(spec, "typename"))
        if not kinds:
            return []
        block, count = kinds.most_common(1)[0]
        return [m for m in model.forward_funcs if count > 1 and isinstance(m, block)]
    blocks, inside = {}, []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name.startswith(prefix) for prefix in inside):
            blocks.update((id(b), b) for b in module)
            inside.append(name + ".")
    return list(blocks.values())


def compile_blocks(model: nn.Module, **options) -> int:
    """Compile every transformer block of ``model`` in place (``options``: ``torch.compile``'s, e.g.
    ``mode``); returns how many. Refuses a model without blocks (nothing would be compiled)."""
    blocks = transformer_blocks(model)
    if not blocks:
        raise ValueError(
            f"train.compile found no transformer blocks in {type(model).__name__} (no nn.ModuleList "
            f"of blocks, nor a repeated pipeline layer); set train.compile=false"
        )
    for block in blocks:
        block.compile(**options)
    return len(blocks)
