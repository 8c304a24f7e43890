"""The DeepSpeed JSON, derived from the one config tree (never written by hand; gpt-neox habit)."""

from __future__ import annotations

from glm_dist.config.checks import model_config
from glm_dist.config.schema import Config


def deepspeed_config(cfg: Config, *, dp_size: int = 1, cuda: bool | None = None) -> dict:
    """The DeepSpeed JSON for ``cfg`` on ``dp_size`` data-parallel ranks. ``cuda``: whether the run's
    accelerator is CUDA (None: whether torch sees a GPU here, so ``glm config show --deepspeed`` prints
    what this machine would run)."""
    t, p = cfg.train, cfg.parallel
    if cuda is None:
        import torch  # is_available() does not create a CUDA context

        cuda = torch.cuda.is_available()
    # bf16 at ZeRO-0 runs as ZeRO-1, DeepSpeed's BF16_Optimizer (flat fp32 masters and moments,
    # split over the data-parallel ranks; the same as ZeRO-0 on one rank). DeepSpeed's only ZeRO-0
    # bf16 wrapper of a torch optimizer, FP16_UnfusedOptimizer, reads an overflow flag per tensor (a
    # host sync each), keeps a fp32 copy per tensor and takes a zero-gradient step when it is built.
    stage = 1 if t.precision == "bf16" and p.zero_stage == 0 else p.zero_stage
    zero: dict = {"stage": stage}
    if stage >= 1:
        # ZeRO-2/3 reduce-scatter each gradient bucket on a side stream while the backward goes on
        # (two bucket buffers instead of one). ZeRO-1 keeps it off: bf16 + ZeRO-1 runs BF16_Optimizer,
        # which does not use it, and fp32 + ZeRO-1 with it is untested here.
        zero.update(overlap_comm=p.zero_stage >= 2, contiguous_gradients=True)
        zero.update(zero_buffers(model_config(cfg).d_model, stage))
    # Offloaded tensors live in pinned host memory on CUDA, so the copies to and from the GPU run
    # asynchronously at full PCIe speed; with the CPU as the accelerator there is no copy to speed up.
    if p.offload_optimizer:  # ZeRO-Offload: fp32 master weights and moments on the CPU
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
    if p.offload_params:  # ZeRO-Infinity (stage 3): the parameter partitions on the CPU as well
        zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
    extra = {}
    if t.precision == "bf16" and stage == 1:
        # Accumulate micro-batch gradients in fp32 (DeepSpeed's BF16_Optimizer, which shards the
        # optimizer states like ZeRO-1): bf16 accumulation loses low bits over many micro batches,
        # and pipelines run many. (ZeRO-2/3 accumulate into their fp32 partitions.)
        extra["data_types"] = {"grad_accum_dtype": "fp32"}
    return {
        **extra,
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.grad_accum_steps,
        "train_batch_size": t.micro_batch_size * t.grad_accum_steps * dp_size,
        "gradient_clipping": t.grad_clip,
        "zero_optimization": zero,
        # DeepSpeed's bf16 mode: bf16 weights and activations, fp32 master weights in the
        # optimizer; a non-finite gradient norm skips the step (check_grad_overflow).
        "bf16": {"enabled": t.precision == "bf16", "check_grad_overflow": True},
        "zero_allow_untested_optimizer": True,
        # Offloaded optimizer states are stepped by our own optimizer (torch's fused CPU AdamW, which
        # keeps the skip-a-bad-step hook) rather than DeepSpeedCPUAdam, which needs a compiled op.
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def zero_buffers(d_model: int, stage: int) -> dict[str, int]:
    """ZeRO's buffer sizes, in elements, for a model ``d_model`` wide: Hugging Face's rule for
    DeepSpeed's "auto" values, never above DeepSpeed's own defaults. Those defaults are sized for
    10B+ models: ZeRO-2's two 5e8-element reduce buckets alone are 2 GB of bf16 whatever the model.
    Gradients are reduced ``d_model**2`` at a time; ZeRO-3 prefetches ``0.9 d_model**2`` parameters,
    keeps gathered only those it reuses within as many, and keeps whole on every rank only tensors
    of at most ``10 d_model`` elements (biases, norms). ``glm plan`` counts these buffers."""
    square = d_model * d_model
    sizes = {"reduce_bucket_size": min(square, 5 * 10**8)}
    if stage == 3:
        near = min(int(0.9 * square), 5 * 10**7)
        sizes.update(
            stage3_prefetch_bucket_size=near,
            stage3_max_reuse_distance=near,
            stage3_param_persistence_threshold=min(10 * d_model, 10**5),
        )
    return sizes
