"""What this rank actually holds: bytes of parameters (this rank's partition under ZeRO-3),
gradients and optimizer states (fp32 master partitions and moments), measured from the tensors."""

from __future__ import annotations

import torch


def _bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def rank_model_states(engine) -> dict[str, int]:
    module_params = list(engine.module.parameters())
    seen = {id(p) for p in module_params}
    params = sum(_bytes(p.ds_tensor) if hasattr(p, "ds_tensor") else _bytes(p.data) for p in module_params)
    grads = sum(_bytes(p.grad) for p in module_params)
    opt = engine.optimizer
    # BF16_Optimizer (bf16 + ZeRO-1, or bf16 pipelines) accumulates into one flat buffer per group for
    # the whole stage-local model, kept from the first micro-batch to the end of the run; the master
    # partition's .grad is a view into it (fp32 accumulation) or a copy made and freed inside the
    # step, so it is counted here and not again below.
    accum = getattr(opt, "fp32_groups_gradients_flat", [])
    grads += sum(_bytes(buf) for buf in accum)
    inner = getattr(opt, "optimizer", opt)
    optimizer = 0
    for group in inner.param_groups:  # fp32 master partitions that are not the module's own tensors
        for p in group["params"]:
            if id(p) not in seen:
                optimizer += _bytes(p)
                grads += 0 if accum else _bytes(p.grad)
    for state in inner.state.values():
        optimizer += sum(_bytes(v) for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
    return {"params": params, "grads": grads, "optimizer": optimizer}
