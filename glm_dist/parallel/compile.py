"""``train.compile``: ``torch.compile`` in place, per transformer block or of the whole model.

``blocks`` (or ``true``; regional compilation): each block is compiled in place (``nn.Module.compile``):
the module, its parameters and their names stay what DeepSpeed, the checkpoints and the pipeline see,
and one compiled graph serves every block of the same shape (a change of shape or grad mode recompiles,
up to dynamo's cache limit). Compile time is one block's, and the parts that do not trace well stay
eager: the embedding, the loss, activation checkpointing around the block (torch's and DeepSpeed's
recompute call the compiled block again), DeepSpeed's engine and a pipeline's schedule.

``model``: the whole model is compiled in place, its ``forward`` one graph from the token ids to what
it returns -- with CLM's fused loss, which runs inside the forward (``project``), the summed NLL:
embedding, every block (activation checkpointing inside the graph), the final norm and the chunked
cross entropy of ``ops/cross_entropy.py`` (its autograd.Function traced, its chunk loop unrolled; on
CUDA the per-chunk kernel's function joins this graph rather than nesting its own compile), so inductor
fuses across layers and into the loss, and a step launches one forward and one backward graph instead of
a few per block. Objectives that score logits outside the forward keep that part eager. Compile time is
the whole model's (a minute or more for GPT-2 124M with inductor), paid once per shape and grad mode.
``train.compile_mode=reduce-overhead`` (inductor's CUDA graphs, for a small model whose step is bound by
kernel launches) is passed to ``torch.compile`` as it is; without CUDA it is refused.

Why not DeepSpeed's ``engine.compile()``: without DeepCompile (``compile.deepcompile`` in its JSON,
which brings its own ZeRO passes) it is exactly ``engine.module.compile(backend=...)`` -- this call --
plus a flag and NVTX ranges off, so compiling before ``deepspeed.initialize`` gives the same module.
DeepSpeed's forward pre- and post-hooks on the module (its timers, the throughput counter) stay
out of the graph: dynamo skips ``_call_impl``'s own frame (torch.nn's internals) and starts a frame at
each function it calls, so each hook is a frame that captures no tensor op and runs as written, and
``forward`` is the one graph (two: training and, under no_grad, validation); the tests count no break.
At ZeRO 0-2 the parameters are whole on every rank, so the forward needs nothing from DeepSpeed; the
gradients' reduction (ZeRO-1/2's bucketed reduce, BF16_Optimizer's fp32 accumulation) hangs on each
parameter's gradient-accumulation hook (``register_grad_hook``), which fires after the compiled backward
graph has returned the gradients, outside it.

Which modules are blocks: the members of the model's ``nn.ModuleList``s (GPT's, the encoders' and the
decoders' ``blocks``; the outermost lists only, ALBERT's shared block once), or, in a DeepSpeed
``PipelineModule``, this stage's layers of the class the layer list repeats most (the blocks: one
per layer, the other layers once). ZeRO-3 and tensor parallelism are refused by config validation
(``config/checks.py``, ``check_compile``): ZeRO-3's parameter hooks and the tensor-parallel collectives
sit inside the block and would break its graph; so is ``model`` under a pipeline, whose stages DeepSpeed
runs layer by layer.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from glm_dist.config.loader import ConfigError


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


def compile_model(model: nn.Module, *, scope: str, backend: str = "inductor", mode: str = "default") -> int:
    """``train.compile``: compile ``model`` in place at ``scope`` ("blocks" or "model") with ``backend``
    and ``mode`` (``torch.compile``'s); returns how many modules were compiled. ``mode=reduce-overhead``
    (CUDA graphs) is refused without CUDA: there is no graph to replay on the CPU."""
    if mode == "reduce-overhead" and not torch.cuda.is_available():
        raise ConfigError(
            "train.compile_mode=reduce-overhead replays CUDA graphs and this machine has no CUDA device; "
            "set train.compile_mode=default"
        )
    options = {"backend": backend, **({} if mode == "default" else {"mode": mode})}
    if scope == "model":
        model.compile(**options)
        return 1
    return compile_blocks(model, **options)
