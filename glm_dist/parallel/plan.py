"""``glm plan``: per-GPU memory of every feasible (DP, PP, TP, ZeRO, offload) layout.

Model states follow DeepSpeed's own accounting for mixed-precision Adam (its
``estimate_zero2/3_model_states_mem_needs``): per parameter 2 bytes of 16-bit weights and 18 of
16-bit grads, fp32 grads, fp32 master weights and Adam moments; ZeRO-1 partitions the fp32 states,
ZeRO-2 the 16-bit grads too, ZeRO-3 everything (plus 4 bytes per parameter of the largest layer,
gathered while it runs); offload moves the partitioned states (and with ``offload_params`` the
weights) to CPU memory, with the 16-bit copies and staging buffers DeepSpeed keeps there (``Layout.cpu``;
ZeRO-1 then keeps its gradients on the device in fp32). ``train.precision=fp32`` keeps 4 + 4 + 8 bytes
instead (4 + 4 + 12 under ZeRO, whose fp32 master partition is a copy). bf16 with ZeRO-0 or 1 (no
offload) is DeepSpeed's BF16_Optimizer (glm train runs bf16 ZeRO-0 as ZeRO-1), which partitions only the
master weights and moments: every rank holds 2 + 2 + 4 bytes per parameter of weights, bf16 gradients
and fp32 gradient accumulation buffer.

Those are DeepSpeed's estimators' model states. What a rank holds at its peak is one of two moments
(:func:`phase_bytes`): the backward, with the activations, the gradients made so far and ZeRO's reduce
buckets (sized by ``config/deepspeed_json.py``'s ``zero_buffers``); or, once the activations are freed,
the gradient reduction and the optimizer step, with the flat copies DeepSpeed makes of the gradients
(the engine's all-reduce at ZeRO-0/1; at ZeRO-1-3 the gradient partition flattened and cast to fp32
for the master weights). ZeRO-2/3 on one data-parallel rank partitions nothing: what it holds less
than ZeRO-0/1 there is BF16_Optimizer's fp32 accumulation buffer -- it accumulates gradients in bf16,
the trade glm train declines -- so such a layout is marked and never recommended.

With pipeline parallelism a rank holds one stage's parameters (the layers split evenly by count, as
glm train partitions them; the tied token embedding sits on the first and the last stage); with tensor
parallelism the transformer blocks are split ``tp`` ways (attention heads and FFN width, as glm train's
``parallel/tensor.py`` splits them), and -- vocabulary-parallel, glm train's default where the family
supports it -- the token embedding, its tied output and the loss's logits too (``ceil(V/tp)`` columns
per rank); without it they stay whole on every tensor rank. Activations per layer and micro-batch follow
Korthikanti et al. (2022) for a fused-attention transformer (no s x s score matrix kept):
``s*b*h*(10 + 24/tp)`` bytes in 16-bit, ``s*b*h*34/tp`` with sequence parallelism (the LayerNorm and
dropout regions cut too), ``2*s*b*h`` with activation checkpointing (the layer input; ``/tp`` with
sequence parallelism) plus one layer recomputed; the first
pipeline stage keeps ``min(pp, m)`` micro-batches in flight under 1F1B, and the last stage the loss:
one chunk of fp32 logits (``ops/cross_entropy.py``'s chunk size), plus -- when the model's head
feeds the fused loss (one stage) -- the output matrix's gradient, or -- otherwise -- the whole
16-bit logits and their gradient. The pipeline bubble of 1F1B is ``(p - 1) / (m + p - 1)``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn

from glm_dist.config.deepspeed_json import zero_buffers
from glm_dist.ops.cross_entropy import CHUNK_TOKENS, loss_logits_bytes
from glm_dist.parallel.tensor import tensor_parameters, vocab_parameters

GB = 2**30
# DeepSpeed's engine all-reduces the gradients of ZeRO-0/1 from flat copies of up to this many
# elements at a time (MEMORY_OPT_ALLREDUCE_SIZE in deepspeed/runtime/engine.py; not configurable).
ALLREDUCE_ELEMENTS = 5 * 10**8


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
    max_pp: int = 0  # most pipeline stages glm train can cut (1: the family does not pipeline; 0: n_layer)
    max_tp: int = 0  # most tensor ranks (1: the family does not tensor-split; 0: any divisor)
    fused_loss: bool = False  # the loss projects the hidden states itself: no whole logits unpipelined
    vocab_units: tuple = ()  # of each unit's parameters, those split over the vocabulary under tensor parallelism
    tensor_units: tuple = ()  # of each unit's parameters, those split by heads / FFN width (the family's tensor plans)
    sequence_parallel: bool = False  # the family's blocks can be cut along the sequence


def model_shape(spec, model_cfg) -> ModelShape:
    """The shape of ``spec``'s model (a family's ``FamilySpec`` row: ``family(name)``) at ``model_cfg``,
    built on the meta device: its units, and what its plans split."""

    with torch.device("meta"):
        model = spec.model(model_cfg)
    params = sum(p.numel() for p in model.parameters())
    units = [sum(p.numel() for p in u.parameters()) for u in _units(model)]
    vocab_params = vocab_parameters(model, spec.vocab_plans)
    split = {id(p) for p in vocab_params} if spec.vocab_parallel else set()
    # the logits' columns: the vocabulary matrices' rows, padding included (model.pad_vocab_to_multiple_of)
    columns = max((p.shape[0] for p in vocab_params), default=model_cfg.vocab_size)
    vocab_units = tuple(sum(p.numel() for p in u.parameters() if id(p) in split) for u in _units(model))
    heads = {id(p) for p in tensor_parameters(model, spec.tensor_plans)}
    tensor_units = tuple(sum(p.numel() for p in u.parameters() if id(p) in heads) for u in _units(model))
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    ffn = model_cfg.ffn_width if spec.tensor_parallel else 1  # what TP must divide; max_tp=1 otherwise
    return ModelShape(
        params,
        units,
        largest,
        model_cfg.n_layer * spec.stacks,  # encoder-decoders count both
        model_cfg.n_head,
        model_cfg.d_model,
        ffn,
        columns,
        max_pp=0 if spec.pipeline else 1,
        max_tp=0 if spec.tensor_parallel else 1,
        fused_loss=getattr(model, "fused_loss", False),
        vocab_units=vocab_units,
        tensor_units=tensor_units if spec.tensor_parallel else (),
        sequence_parallel=spec.sequence_parallel,
    )


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


def stage_params_by_layers(units: list[int], stages: int, tp: int = 1, vocab_units=(), tensor_units=()) -> list[float]:
    """Parameters per stage (per tensor rank) when the layers between the first unit (embedding) and
    the last (head) are split evenly by count -- glm train's partition (DeepSpeed ``type:GPTBlock``);
    tensor parallelism splits of each layer its ``tensor_units`` parameters (the linears and head tables
    the family's plans split; none given: the whole layer), and of the embedding and head the
    ``vocab_units`` parameters (the vocabulary split; none: they stay whole)."""
    split = tensor_units[1:-1] if tensor_units else units[1:-1]
    inner = [u - t + t / tp for u, t in zip(units[1:-1], split)]
    bounds = [round(len(inner) * i / stages) for i in range(stages + 1)]
    out = [sum(inner[bounds[i] : bounds[i + 1]]) for i in range(stages)]
    ends = [u - v + v / tp for u, v in zip(units, vocab_units)] if vocab_units else units
    out[0] += ends[0]
    out[-1] += ends[-1] if len(units) > 1 else 0
    return out


def params_per_rank(shape: ModelShape, pp: int, tp: int, *, vocab_parallel: bool = True) -> float:
    """Parameters on the fullest rank: its stage's share of the layers (split ``tp`` ways) plus the
    embedding / head its stage holds (their vocabulary rows split ``tp`` ways too, ``vocab_parallel``
    and the family permitting); unpipelined, the tied output weight is the embedding itself."""
    vocab = shape.vocab_units if vocab_parallel and tp > 1 else ()
    most = max(stage_params_by_layers(shape.units, pp, tp, vocab, shape.tensor_units))
    return most - (sum(shape.units) - shape.params) / (tp if any(vocab) else 1) if pp == 1 else most


def vocab_columns(shape: ModelShape, tp: int, *, vocab_parallel: bool = True) -> int:
    """Columns of the logits (and rows of the output matrix) a tensor rank holds."""
    return -(-shape.vocab // tp) if vocab_parallel and any(shape.vocab_units) else shape.vocab


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
    sequence_parallel: bool = False  # the LayerNorm / dropout regions cut along the sequence (tp > 1, no pipeline)
    backward: float = 0.0  # bytes per GPU held through the backward besides activations (phase_bytes)
    step: float = 0.0  # bytes per GPU held in the gradient reduction and optimizer step after it
    saves_nothing: bool = False  # ZeRO-2/3 on one data-parallel rank: partitions nothing

    @property
    def model_states(self) -> float:
        return self.weights + self.grads + self.optimizer

    def total(self, checkpointing: bool) -> float:
        """The peak per GPU: the backward (activations alive) or the step after it."""
        return max(self.backward + (self.activations_ckpt if checkpointing else self.activations), self.step)


def model_state_bytes(
    params: float, largest_layer: float, dp: int, zero: int, offload: str, precision: str = "bf16"
) -> tuple[float, float, float, float]:
    """(weights, grads, optimizer states, CPU) bytes per GPU for ``params`` parameters on a rank.

    bf16 (DeepSpeed's 18 bytes beside the 16-bit weights): grads 2 (16-bit) + 4 (fp32), optimizer
    4 (fp32 master) + 8 (Adam moments). fp32: weights 4, grads 4, moments 8 (and under ZeRO the fp32
    master partition, a copy of the weights, 4)."""
    if precision == "bf16" and zero <= 1 and offload == "none":
        return bf16_optimizer_bytes(params, dp)
    w16, g16, g32, states = (4, 4, 0, 8 if zero == 0 else 12) if precision == "fp32" else (2, 2, 4, 12)
    if zero == 0:
        return w16 * params, (g16 + g32) * params, states * params, 0.0
    if zero == 1:
        w, g, o = w16 * params, g16 * params + g32 * params / dp, states * params / dp
    elif zero == 2:
        w, g, o = w16 * params, (g16 + g32) * params / dp, states * params / dp
    else:  # the partition of the 16-bit weights plus the largest layer gathered (weights + grads)
        w, g, o = (
            w16 * params / dp + 4 * largest_layer,
            g32 * params / dp if g32 else g16 * params / dp,
            states * params / dp,
        )
    cpu = 0.0
    if offload != "none":
        # ZeRO-Offload's host memory: per parameter of the partition the fp32 master weights and Adam moments
        # (``states``) and the fp32 gradient the CPU optimizer steps with (4; initialize_optimizer_states in
        # zero/stage_1_and_2.py and zero/stage3.py); at ZeRO-1/2 also a 16-bit copy of the weight partition the
        # step writes before it goes to the device (``param_buffer_of_bit16_for_cpu_offload_groups``) and a
        # staging buffer of the largest parameter (``temp_grad_buffer_for_cpu_offload``); at ZeRO-3 the 16-bit
        # (fp32: 4-byte) gradient partition itself (``grad_partitions_flat_buffer``, on the optimizer's device). With
        # ``pin_memory`` (CUDA) the same bytes, page-locked.
        if zero == 3:
            cpu = (states + 4 + g16) * params / dp
        else:
            cpu = (states + 4 + w16) * params / dp + w16 * largest_layer
        # on the device ZeRO-1 keeps every gradient until the step, in the fp32 accumulation dtype (the
        # ``grad_accum`` attribute, stage_1_and_2.py, when it differs from the weights' and gradients are not
        # partitioned); ZeRO-2/3 copy each reduced gradient to the host partition
        g, o = (4 * params if zero == 1 else 0.0), 0.0
        if offload == "optimizer+params":
            cpu += w - 4 * largest_layer
            w = 4 * largest_layer
    return w, g, o, cpu


def bf16_optimizer_bytes(params: float, dp: int) -> tuple[float, float, float, float]:
    """(weights, grads, optimizer states, CPU) bytes per GPU under DeepSpeed's BF16_Optimizer (bf16 +
    ZeRO-0 or 1 with ``data_types.grad_accum_dtype=fp32``; deepspeed/runtime/bf16_optimizer.py).

    Per parameter of the stage: the bf16 weights (2); the bf16 gradients autograd leaves on them,
    alive from the backward to the optimizer step (2); the fp32 accumulation buffer, one flat tensor
    for the whole stage-local model that is not partitioned -- every data-parallel rank holds all of
    it (4); and only the fp32 master weights and Adam moments split over the ``dp`` ranks (12 / dp)."""
    return 2 * params, (2 + 4) * params, 12 * params / dp, 0.0


def phase_bytes(
    params: float, largest_layer: float, dp: int, zero: int, offload: str, precision: str = "bf16", *, d_model: int
) -> tuple[float, float]:
    """(backward, step): bytes per GPU of model states and DeepSpeed's buffers for ``params``
    parameters on a rank (besides activations) while the backward runs -- the gradients it has made,
    the reduce buckets, a gradient larger than a bucket reduced on its own (the largest layer's) --
    and in the gradient reduction and optimizer step after it; offloaded, the device's share (the host's
    is :func:`model_state_bytes`' CPU bytes). Measured against the engine's own tensors, ZeRO 0-3 in bf16
    on 1 and 2 ranks, offloaded at ZeRO 1-3 on one (tests/test_plan_matches_engine.py)."""
    e = 4 if precision == "fp32" else 2  # bytes of a weight or gradient element
    sizes = zero_buffers(d_model, zero)
    bucket = e * sizes["reduce_bucket_size"]
    w, g, o, _ = model_state_bytes(params, largest_layer, dp, zero, offload, precision)
    partition = params / dp
    if zero == 3:
        return zero3_phase_bytes(
            partition, largest_layer, dp, o, offload, e=e, bucket=bucket, near=sizes["stage3_prefetch_bucket_size"]
        )
    buckets = (2 if zero == 2 else 1) * bucket  # ZeRO-2 overlaps: two buckets
    if offload != "none":
        # gradients stream to the host through the buckets and a device buffer of the largest parameter
        # (``temp_grad_buffer_for_gpu_offload``, stage_1_and_2.py: kept through the step); ZeRO-1 buckets and
        # reduces its fp32 accumulations (``_gradient_reduction_buffer_dtype``), a gradient larger than a bucket
        # from a flat copy (average_tensor -> allreduce_bucket); ZeRO-2 one gradient in flight
        staging = e * largest_layer
        if zero == 1:
            return w + g + 4 * sizes["reduce_bucket_size"] + staging + 2 * 4 * largest_layer, w + g + staging
        return w + g + buckets + staging + e * largest_layer, w + g + staging
    if zero == 0 or (zero == 1 and precision == "bf16"):  # no ZeRO optimizer, or BF16_Optimizer
        # the engine all-reduces the gradients (BF16_Optimizer's fp32 accumulation buffer) from flat copies
        # (deepspeed/runtime/engine.py, allreduce_bucket: ``tensor = self.flatten(bucket)``), which bf16
        # casts to its bf16 communication dtype (``tensor.to(self.communication_data_type)``): 4 + 2 bytes
        flat = 4 + 2 if precision == "bf16" else e
        return w + g + o, w + g + o + flat * min(params, ALLREDUCE_ELEMENTS)
    # ZeRO-1 keeps every gradient until the step; ZeRO-2 its partition, whose buffer holds each tensor
    # it touches whole (a tensor across its boundary: up to a layer more than 1/dp)
    held = w + e * (params if zero == 1 else min(params, partition + largest_layer)) + o
    to_fp32 = 4 * partition if e == 2 else 0.0  # the flat gradient partition cast for the fp32 masters
    return held + buckets + e * largest_layer, held + e * partition + to_fp32


def zero3_phase_bytes(
    partition: float, largest_layer: float, dp: int, optimizer: float, offload: str, *, e: int, bucket: float, near: int
) -> tuple[float, float]:
    """ZeRO-3's (backward, step): the weight partition (on the CPU with ``offload_params``), the
    gradient partition (on the CPU with the optimizer), one bucket and the optimizer states, kept from
    the start; in the backward also the largest layer and the parameters prefetched and kept for reuse,
    gathered (but for this rank's own part of them), and the layer's whole gradient before its
    reduce-scatter; at the step the gradient partition flattened and cast to fp32 for the masters."""
    weights = 0.0 if offload == "optimizer+params" else e * partition
    grads = e * partition if offload == "none" else 0.0
    held = weights + grads + optimizer + bucket
    gathered = e * (largest_layer + 2 * near) * (1 - 1 / dp) + e * largest_layer
    flat = (e * partition + (4 * partition if e == 2 else 0.0)) if offload == "none" else 0.0
    return held + gathered, held + flat


def layer_activations(
    seq_len: int, micro_batch: int, d_model: int, tp: int = 1, *, sequence_parallel: bool = False
) -> float:
    """16-bit bytes one transformer layer keeps for backward per rank (Korthikanti et al. 2022, fused
    attention): ``s b h (10 + 24/tp)`` -- the LayerNorm, dropout and residual regions (10) whole on
    every tensor rank -- or ``34 s b h / tp`` with them cut along the sequence."""
    return seq_len * micro_batch * d_model * (34 / tp if sequence_parallel else 10 + 24 / tp)


def plan(
    shape: ModelShape,
    *,
    gpus: int,
    gpus_per_node: int = 8,
    seq_len: int,
    micro_batch: int,
    global_batch: int,
    precision: str = "bf16",
    loss_chunk: int = CHUNK_TOKENS,
    vocab_parallel: bool = True,
    sequence_parallel: bool = False,
) -> list[Layout]:
    """Every layout of ``gpus`` GPUs the model can be split into that keeps the global batch
    (``global_batch`` sequences per step; ``global / (micro x DP)`` micro-batches per replica),
    with its memory per GPU; the loss's logits are counted for ``loss_chunk`` tokens at a time.
    ``vocab_parallel`` / ``sequence_parallel``: the config's ``parallel.*`` switches (where the
    family supports them; sequence parallelism in layouts with tp > 1 and one stage)."""
    layouts = []
    tps = range(1, (shape.max_tp or min(gpus, gpus_per_node)) + 1)
    pps = range(1, (shape.max_pp or min(gpus, shape.n_layer)) + 1)  # only what the family can be cut into
    for tp, pp in itertools.product(tps, pps):
        if gpus % (tp * pp) or shape.n_head % tp or shape.ffn % tp:
            continue
        dp = gpus // (tp * pp)
        if global_batch % (micro_batch * dp):
            continue
        micro_batches = global_batch // (micro_batch * dp)
        rank_params = params_per_rank(shape, pp, tp, vocab_parallel=vocab_parallel)
        columns = vocab_columns(shape, tp, vocab_parallel=vocab_parallel)
        # the token embedding: split over the vocabulary with the blocks' matrices, or whole on every rank
        largest = shape.largest_layer / tp if columns < shape.vocab else shape.largest_layer
        layers_per_stage = -(-shape.n_layer // pp)
        s, b, h = seq_len, micro_batch, shape.d_model
        in_flight = min(pp, micro_batches) if pp > 1 else 1
        sp = sequence_parallel and shape.sequence_parallel and tp > 1 and pp == 1
        per_layer = layer_activations(s, b, h, tp, sequence_parallel=sp)
        logits = loss_logits_bytes(
            s * b,
            columns,
            d_model=h,
            fused=shape.fused_loss and pp == 1,
            logit_bytes=4 if precision == "fp32" else 2,
            chunk_tokens=loss_chunk,
        )
        act = per_layer * layers_per_stage * in_flight + logits
        act_ckpt = 2 * s * b * h / (tp if sp else 1) * layers_per_stage * in_flight + per_layer + logits
        bubble = (pp - 1) / (micro_batches + pp - 1) if pp > 1 else 0.0
        for zero in (0, 1) if pp > 1 else (0, 1, 2, 3):
            for offload in ("none", "optimizer", "optimizer+params"):
                if (offload != "none" and zero == 0) or (offload == "optimizer+params" and zero != 3):
                    continue
                w, g, o, cpu = model_state_bytes(rank_params, largest, dp, zero, offload, precision)
                backward, step = phase_bytes(rank_params, largest, dp, zero, offload, precision, d_model=shape.d_model)
                layouts.append(
                    Layout(
                        dp,
                        pp,
                        tp,
                        zero,
                        offload,
                        w,
                        g,
                        o,
                        act,
                        act_ckpt,
                        cpu,
                        bubble,
                        micro_batches,
                        sp,
                        backward=backward,
                        step=step,
                        saves_nothing=zero >= 2 and dp == 1 and offload == "none",
                    )
                )
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


def recommend(
    layouts: list[Layout], gpu_mem_gb: float, *, checkpointing: bool | None = None, headroom: float = 0.9
) -> tuple[Layout | None, bool]:
    """The layout to use: among those that fit in ``headroom`` of the GPU memory (with or without
    activation checkpointing, unless fixed) and partition something, the highest :func:`efficiency`;
    ties go to less model parallelism and the lower ZeRO stage."""
    budget = gpu_mem_gb * GB * headroom
    options = [False, True] if checkpointing is None else [checkpointing]
    fits = [(lay, ckpt) for lay in layouts for ckpt in options if lay.total(ckpt) <= budget and not lay.saves_nothing]
    if not fits:
        return None, bool(options[-1])
    return max(fits, key=lambda lc: (round(efficiency(*lc), 6), -lc[0].tp * lc[0].pp, -lc[0].zero, not lc[1]))


def format_plan(
    name: str,
    shape: ModelShape,
    layouts: list[Layout],
    best: Layout | None,
    ckpt: bool,
    gpus: int,
    gpu_mem_gb: float,
    global_batch: int,
    show: int = 20,
) -> str:
    gb = lambda x: f"{x / GB:.1f}"  # noqa: E731
    lines = [
        f"{name}: {shape.params / 1e9:.3f}B parameters, {shape.n_layer} layers, d_model {shape.d_model}, "
        f"{shape.n_head} heads; {gpus} GPUs x {gpu_mem_gb:g} GB; {global_batch} sequences per step",
        "",
        "| DP | PP | TP | ZeRO | offload | micro-batches | weights | grads | optim | backward / step "
        "| activations (ckpt) | total (ckpt) | CPU/GPU | bubble |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    budget = gpu_mem_gb * GB * 0.9
    ranked = sorted(
        layouts, key=lambda lay: (lay.total(True) > budget, lay.saves_nothing, lay.tp * lay.pp, lay.zero, lay.offload)
    )
    for lay in ranked[:show]:
        mark = " **<- recommended**" if lay is best else " (saves nothing at DP=1)" if lay.saves_nothing else ""
        lines.append(
            f"| {lay.dp} | {lay.pp} | {lay.tp} | {lay.zero} | {lay.offload} | {lay.micro_batches} | "
            f"{gb(lay.weights)} | {gb(lay.grads)} | {gb(lay.optimizer)} | "
            f"{gb(lay.backward)} / {gb(lay.step)} | {gb(lay.activations)} ({gb(lay.activations_ckpt)}) | "
            f"{gb(lay.total(False))} ({gb(lay.total(True))}) | {gb(lay.cpu)} | {lay.bubble:.1%} |{mark}"
        )
    lines.append("")
    if best is None:
        lines.append(
            f"no layout fits in {gpu_mem_gb:g} GB per GPU (90% usable): add GPUs, "
            f"or lower the micro batch / sequence length"
        )
    else:
        lines.append(
            f"recommended: DP={best.dp} x PP={best.pp} x TP={best.tp}, ZeRO-{best.zero}, "
            f"offload {best.offload}"
            f"{', activation checkpointing' if ckpt else ''}: {gb(best.total(ckpt))} GB per GPU, "
            f"pipeline bubble {best.bubble:.1%}; config: parallel.zero_stage={best.zero} "
            f"train.grad_accum_steps={best.micro_batches} "
            f"parallel.pipeline_stages={best.pp} parallel.tensor_parallel={best.tp}"
            + (" parallel.sequence_parallel=true" if best.sequence_parallel else "")
            + (" parallel.offload_optimizer=true" if best.offload != "none" else "")
            + (" parallel.offload_params=true" if best.offload == "optimizer+params" else "")
            + (" train.activation_checkpointing=true" if ckpt else "")
        )
    return "\n".join(lines)
