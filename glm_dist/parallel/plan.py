"""``glm plan``: per-GPU memory of every feasible (DP, PP, TP, ZeRO, offload) layout.

Model states follow DeepSpeed's own accounting for mixed-precision Adam (its
``estimate_zero2/3_model_states_mem_needs``): per parameter 2 bytes of 16-bit weights and 18 of
16-bit grads, fp32 grads, fp32 master weights and Adam moments; ZeRO-1 partitions the fp32 states,
ZeRO-2 the 16-bit grads too, ZeRO-3 everything (plus 4 bytes per parameter of the largest layer,
gathered while it runs); offload moves the partitioned states (and with ``offload_params`` the
weights) to CPU memory. ``train.precision=fp32`` keeps 4 + 4 + 8 bytes instead.

With pipeline parallelism a rank holds one stage's parameters (the layers split evenly by count, as
glm train partitions them; the tied token embedding sits on the first and the last stage); with tensor
parallelism the transformer blocks are split ``tp`` ways (attention heads and FFN width, as glm train's
``parallel/tensor.py`` splits them) while the embedding, the output head and the fp32 logits stay whole on
every tensor rank. Activations per layer and micro-batch follow Korthikanti et al. (2022) for
a fused-attention transformer (no s x s score matrix kept): ``s*b*h*(10 + 24/tp)`` bytes in 16-bit,
``2*s*b*h`` with activation checkpointing (the layer input) plus one layer recomputed; the first
pipeline stage keeps ``min(pp, m)`` micro-batches in flight under 1F1B, and the last stage the fp32
logits. The pipeline bubble of 1F1B is ``(p - 1) / (m + p - 1)``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn

GB = 2**30


@dataclass(frozen=True)
class ModelShape:
    params: int  # distinct parameters
    units: list  # parameters of each pipeline unit (embedding, layer, ..., head), tied weights in both ends
    largest_layer: int  # the largest single module's own parameters (ZeRO-3 gathers one at a time)
    n_layer: int  # transformer layers (encoder + decoder)
    n_head: int
    d_model: int
    ffn: int
    vocab: int


def model_shape(family: str, model_cfg) -> ModelShape:
    from glm_dist.models.registry import build_model

    with torch.device("meta"):
        model = build_model(family, model_cfg)
    params = sum(p.numel() for p in model.parameters())
    units = [sum(p.numel() for p in u.parameters()) for u in _units(model)]
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    stacks = 2 if family in ("t5", "bart") else 1
    ffn = getattr(model_cfg, "d_ff", None) or 4 * model_cfg.d_model
    return ModelShape(params, units, largest, model_cfg.n_layer * stacks, model_cfg.n_head, model_cfg.d_model,
                      ffn, model_cfg.vocab_size)


def _units(model: nn.Module) -> list[nn.Module]:
    """The model as a sequence of pipeline units: its ``layers()`` if it has them, else its children
    with every ModuleList expanded (encoder blocks, then decoder blocks)."""
    if hasattr(model, "layers"):
        return list(model.layers())
    out: list[nn.Module] = []
    for child in model.children():
        if isinstance(child, nn.ModuleList):
            out.extend(child)
        elif any(isinstance(c, nn.ModuleList) for c in child.children()):
            out.extend(_units(child))
        else:
            out.append(child)
    return out


def stage_params(units: list[int], stages: int) -> list[int]:
    """Parameters per stage when the units are cut into ``stages`` contiguous runs balanced by
    parameter count (DeepSpeed's ``partition_method='parameters'``)."""
    if stages == 1:
        return [sum(units)]
    total, out, acc, k = sum(units), [], 0, 0
    bounds = [total * (i + 1) / stages for i in range(stages - 1)]
    for n in units:
        if k < len(bounds) and acc + n / 2 > bounds[k] and len(out) < stages - 1:
            out.append(acc - sum(out))
            k += 1
        acc += n
    out.append(acc - sum(out))
    return out + [0] * (stages - len(out))


def stage_params_by_layers(units: list[int], stages: int, tp: int = 1) -> list[float]:
    """Parameters per stage (per tensor rank) when the layers between the first unit (embedding) and
    the last (head) are split evenly by count -- glm train's partition (DeepSpeed ``type:GPTBlock``);
    tensor parallelism splits the layers, not the embedding or head."""
    inner = [u / tp for u in units[1:-1]]
    bounds = [round(len(inner) * i / stages) for i in range(stages + 1)]
    out = [sum(inner[bounds[i]:bounds[i + 1]]) for i in range(stages)]
    out[0] += units[0]
    out[-1] += units[-1] if len(units) > 1 else 0
    return out


def params_per_rank(shape: ModelShape, pp: int, tp: int) -> float:
    """Parameters on the fullest rank: its stage's share of the layers (split ``tp`` ways) plus the
    embedding / head its stage holds; unpipelined, the tied output weight is the embedding itself."""
    most = max(stage_params_by_layers(shape.units, pp, tp))
    return most - (sum(shape.units) - shape.params) if pp == 1 else most


@dataclass
class Layout:
    dp: int
    pp: int
    tp: int
    zero: int
    offload: str  # "none" | "optimizer" | "optimizer+params"
    weights: float = 0.0  # bytes per GPU
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    activations_ckpt: float = 0.0
    cpu: float = 0.0  # bytes of CPU memory per GPU (offload)
    bubble: float = 0.0
    micro_batches: int = 1

    @property
    def model_states(self) -> float:
        return self.weights + self.grads + self.optimizer

    def total(self, checkpointing: bool) -> float:
        return self.model_states + (self.activations_ckpt if checkpointing else self.activations)


def model_state_bytes(params: float, largest_layer: float, dp: int, zero: int, offload: str,
                      precision: str = "bf16") -> tuple[float, float, float, float]:
    """(weights, grads, optimizer states, CPU) bytes per GPU for ``params`` parameters on a rank.

    bf16 (DeepSpeed's 18 bytes beside the 16-bit weights): grads 2 (16-bit) + 4 (fp32), optimizer
    4 (fp32 master) + 8 (Adam moments). fp32: weights 4, grads 4, moments 8."""
    w16, g16, g32, states = (4, 4, 0, 8) if precision == "fp32" else (2, 2, 4, 12)
    if zero == 0:
        return w16 * params, (g16 + g32) * params, states * params, 0.0
    if zero == 1:
        w, g, o = w16 * params, g16 * params + g32 * params / dp, states * params / dp
    elif zero == 2:
        w, g, o = w16 * params, (g16 + g32) * params / dp, states * params / dp
    else:  # the partition of the 16-bit weights plus the largest layer gathered (weights + grads)
        w, g, o = w16 * params / dp + 4 * largest_layer, g32 * params / dp if g32 else g16 * params / dp, states * params / dp
    cpu = 0.0
    if offload != "none":
        cpu, g, o = g + o, (g16 * params if zero == 1 else 0.0), 0.0  # gradients stream to the CPU partition
        if zero == 1:
            cpu -= g16 * params
        if offload == "optimizer+params":
            cpu += w - 4 * largest_layer
            w = 4 * largest_layer
    return w, g, o, cpu


def plan(shape: ModelShape, *, gpus: int, gpus_per_node: int = 8, seq_len: int, micro_batch: int,
         global_batch: int, precision: str = "bf16") -> list[Layout]:
    """Every layout of ``gpus`` GPUs the model can be split into that keeps the global batch
    (``global_batch`` sequences per step; ``global / (micro x DP)`` micro-batches per replica),
    with its memory per GPU."""
    layouts = []
    for tp, pp in itertools.product(range(1, min(gpus, gpus_per_node) + 1), range(1, min(gpus, shape.n_layer) + 1)):
        if gpus % (tp * pp) or shape.n_head % tp or shape.ffn % tp:
            continue
        dp = gpus // (tp * pp)
        if global_batch % (micro_batch * dp):
            continue
        micro_batches = global_batch // (micro_batch * dp)
        rank_params = params_per_rank(shape, pp, tp)
        largest = shape.largest_layer  # the token embedding, whole on every tensor rank
        layers_per_stage = -(-shape.n_layer // pp)
        s, b, h = seq_len, micro_batch, shape.d_model
        in_flight = min(pp, micro_batches) if pp > 1 else 1
        per_layer = s * b * h * (10 + 24 / tp)
        logits = 4 * s * b * shape.vocab
        act = per_layer * layers_per_stage * in_flight + logits
        act_ckpt = 2 * s * b * h * layers_per_stage * in_flight + per_layer + logits
        bubble = (pp - 1) / (micro_batches + pp - 1) if pp > 1 else 0.0
        for zero in ((0, 1) if pp > 1 else (0, 1, 2, 3)):
            for offload in ("none", "optimizer", "optimizer+params"):
                if (offload != "none" and zero == 0) or (offload == "optimizer+params" and zero != 3):
                    continue
                w, g, o, cpu = model_state_bytes(rank_params, largest, dp, zero, offload, precision)
                layouts.append(Layout(dp, pp, tp, zero, offload, w, g, o, act, act_ckpt, cpu, bubble, micro_batches))
    return layouts


def efficiency(lay: Layout, checkpointing: bool) -> float:
    """A rough relative throughput to rank layouts that fit: the pipeline bubble idles
    ``bubble`` of the time, activation recomputation adds a forward pass (+1/3), offload and ZeRO-3
    add transfers, tensor parallelism an all-reduce per layer."""
    import math

    eff = 1.0 - lay.bubble
    eff *= 0.75 if checkpointing else 1.0
    eff *= {"none": 1.0, "optimizer": 0.85, "optimizer+params": 0.6}[lay.offload]
    eff *= 0.9 if lay.zero == 3 else 1.0
    eff *= 0.95 ** math.log2(lay.tp)
    return eff


def recommend(layouts: list[Layout], gpu_mem_gb: float, *, checkpointing: bool | None = None,
              headroom: float = 0.9) -> tuple[Layout | None, bool]:
    """The layout to use: among those that fit in ``headroom`` of the GPU memory (with or without
    activation checkpointing, unless fixed), the highest :func:`efficiency`; ties go to less model
    parallelism and the lower ZeRO stage."""
    budget = gpu_mem_gb * GB * headroom
    options = [False, True] if checkpointing is None else [checkpointing]
    fits = [(lay, ckpt) for lay in layouts for ckpt in options if lay.total(ckpt) <= budget]
    if not fits:
        return None, bool(options[-1])
    return max(fits, key=lambda lc: (round(efficiency(*lc), 6), -lc[0].tp * lc[0].pp, -lc[0].zero, not lc[1]))


def format_plan(name: str, shape: ModelShape, layouts: list[Layout], best: Layout | None, ckpt: bool,
                gpus: int, gpu_mem_gb: float, global_batch: int, show: int = 20) -> str:
    gb = lambda x: f"{x / GB:.1f}"  # noqa: E731
    lines = [f"{name}: {shape.params / 1e9:.3f}B parameters, {shape.n_layer} layers, d_model {shape.d_model}, "
             f"{shape.n_head} heads; {gpus} GPUs x {gpu_mem_gb:g} GB; {global_batch} sequences per step", "",
             "| DP | PP | TP | ZeRO | offload | micro-batches | weights | grads | optim | activations (ckpt) | total (ckpt) | CPU/GPU | bubble |",
             "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    budget = gpu_mem_gb * GB * 0.9
    ranked = sorted(layouts, key=lambda lay: (lay.total(True) > budget, lay.tp * lay.pp, lay.zero, lay.offload))
    for lay in ranked[:show]:
        mark = " **<- recommended**" if lay is best else ""
        lines.append(f"| {lay.dp} | {lay.pp} | {lay.tp} | {lay.zero} | {lay.offload} | {lay.micro_batches} | {gb(lay.weights)} | {gb(lay.grads)} | "
                     f"{gb(lay.optimizer)} | {gb(lay.activations)} ({gb(lay.activations_ckpt)}) | "
                     f"{gb(lay.total(False))} ({gb(lay.total(True))}) | {gb(lay.cpu)} | {lay.bubble:.1%} |{mark}")
    lines.append("")
    if best is None:
        lines.append(f"no layout fits in {gpu_mem_gb:g} GB per GPU (90% usable): add GPUs, or lower the micro batch / sequence length")
    else:
        lines.append(f"recommended: DP={best.dp} x PP={best.pp} x TP={best.tp}, ZeRO-{best.zero}, offload {best.offload}"
                     f"{', activation checkpointing' if ckpt else ''}: {gb(best.total(ckpt))} GB per GPU, "
                     f"pipeline bubble {best.bubble:.1%}; config: parallel.zero_stage={best.zero} "
                     f"train.grad_accum_steps={best.micro_batches} "
                     f"parallel.pipeline_stages={best.pp} parallel.tensor_parallel={best.tp}"
                     + (" parallel.offload_optimizer=true" if best.offload != "none" else "")
                     + (" parallel.offload_params=true" if best.offload == "optimizer+params" else "")
                     + (" train.activation_checkpointing=true" if ckpt else ""))
    return "\n".join(lines)
