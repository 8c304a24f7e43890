"""Universal checkpoints: every parameter's fp32 weight and optimizer moments, whole and under the
unsplit model's name, so a run can resume on any layout.

A DeepSpeed checkpoint is cut the way the run was laid out: ZeRO partitions flat buffers over the
data-parallel ranks, pipeline stages save their own layers under layer numbers, tensor-parallel
ranks their slices. Alongside it each save writes ``universal/``: for every parameter a file
``<name>.pt`` holding ``{"fp32": ..., "exp_avg": ..., "exp_avg_sq": ...}`` (the full tensors,
assembled with DeepSpeed's ``safe_get_full_*`` over the data-parallel group and gathered over the
tensor-parallel group), ``<name>`` being the one-process model's parameter name; plus
``index.json`` (names, shapes, the optimizer's step count) and the run's client state. It is
written one parameter at a time, so memory stays at one parameter whatever the model size.

Resuming on a different layout (data, pipeline or tensor size, or ZeRO stage) loads the weights
into the whole model before it is cut -- pipeline stages and tensor slices are copied from it as
in a fresh run -- and then sets each local parameter's fp32 master and moments from its file,
sliced for this rank. The same files are the consolidated fp32 state dict that ``glm export-hf``
and ``glm eval`` read. (DeepSpeed's own ``ds_to_universal`` is written for Megatron-DeepSpeed's
module names and tensor-parallel metadata; this keeps our names and our slicing in one place.)
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from glm_dist.parallel.tensor import gather_slices, local_slice

DIR = "universal"


def _base_optimizer(engine):
    """The torch optimizer that owns the moments (DeepSpeed's ZeRO / bf16 wrappers hold it)."""
    return getattr(engine.optimizer, "optimizer", engine.optimizer)


def _sharded(p: nn.Parameter) -> bool:
    """DeepSpeed holds this parameter's fp32 master and moments in flat partitions."""
    return hasattr(p, "_hp_mapping") or hasattr(p, "ds_id")


def _optimizer_step(engine) -> float | None:
    for state in _base_optimizer(engine).state.values():
        if "step" in state:
            return float(state["step"])
    return None


def _moment_keys(engine) -> list[str]:
    for state in _base_optimizer(engine).state.values():
        return sorted(k for k, v in state.items() if torch.is_tensor(v) and v.dim() > 0)
    return []


def _full_tensors(engine, p: nn.Parameter, keys: list[str]) -> dict[str, torch.Tensor]:
    """This rank's view of ``p`` made whole across the data-parallel ranks (collective)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    if _sharded(p):
        out = {"fp32": safe_get_full_fp32_param(p)}
        out.update({k: safe_get_full_optimizer_state(p, k) for k in keys})
    else:  # ZeRO-0 in fp32: the parameter and its optimizer state are whole on every rank
        state = _base_optimizer(engine).state.get(p, {})
        out = {"fp32": p.detach(), **{k: state[k] for k in keys if k in state}}
    return {k: v.detach().float().cpu() for k, v in out.items()}


class Naming:
    """How a rank's module names its parameters in the universal checkpoint: ``rename`` maps a
    local name to the one-process model's (None: not part of it); ``owned`` says whether this
    rank's copy is the one saved (a pipeline's tied copy on a later stage is not)."""

    def __init__(self, rename=None, owned=None):
        self.rename = rename or (lambda key: key)
        self.owned = owned or (lambda key: True)

    def params(self, module: nn.Module, *, owned_only: bool = False):
        for key, p in module.named_parameters():
            name = self.rename(key)
            if name is not None and (self.owned(key) or not owned_only):
                yield name, p

    def buffers(self, module: nn.Module):
        params = {key for key, _ in module.named_parameters(remove_duplicate=False)}
        for key, value in module.state_dict().items():
            name = self.rename(key)
            if key not in params and name is not None and self.owned(key) and not key.endswith("_extra_state"):
                yield name, value


def save(engine, directory: Path, naming: Naming, *, writer: bool, tensor_group=None, tensor_size: int = 1,
         client_state: dict | None = None) -> None:
    """Write ``directory`` (all ranks call this; collectives over the data- and tensor-parallel
    groups). ``writer``: this rank writes (data- and tensor-parallel rank 0 of its stage)."""
    keys = _moment_keys(engine)
    if keys:
        _relink(engine)
    directory.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, p in naming.params(engine.module, owned_only=True):
        tensors = _full_tensors(engine, p, keys)
        if tensor_size > 1 and hasattr(p, "tensor_parallel"):
            tensors = {k: gather_slices(p, v, tensor_group, tensor_size) for k, v in tensors.items()}
        if writer:
            torch.save(tensors, directory / f"{name}.pt")
            index[name] = list(tensors["fp32"].shape)
    buffers = {name: b.detach().cpu() for name, b in naming.buffers(engine.module)}
    if writer:
        part = f"index-{dist.get_rank() if dist.is_initialized() else 0:05d}.json"
        (directory / part).write_text(json.dumps({"params": index, "moments": keys, "step": _optimizer_step(engine)}))
        if buffers:
            torch.save(buffers, directory / f"buffers-{part[6:-5]}.pt")
        if client_state is not None:
            torch.save(client_state, directory / "client_state.pt")


def read_index(directory: Path) -> dict:
    params, moments, step = {}, None, None
    parts = sorted(directory.glob("index-*.json"))
    if not parts:
        raise FileNotFoundError(f"{directory}: no index-*.json (not a universal checkpoint)")
    for f in parts:
        part = json.loads(f.read_text())
        params.update(part["params"])
        moments = part["moments"] if moments is None else moments
        step = part["step"] if step is None else step
    return {"params": params, "moments": moments or [], "step": step}


def state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """The consolidated fp32 weights (and persistent buffers) under the unsplit model's names."""
    out = {name: torch.load(directory / f"{name}.pt", map_location="cpu", weights_only=True)["fp32"]
           for name in read_index(directory)["params"]}
    for f in sorted(directory.glob("buffers-*.pt")):
        out.update(torch.load(f, map_location="cpu", weights_only=True))
    return out


def load_weights(model: nn.Module, directory: Path) -> None:
    """Load the fp32 weights into the whole (uncut) model, every parameter accounted for."""
    sd = state_dict(directory)
    names = {name for name, _ in model.named_parameters()}
    missing, unknown = names - set(sd), set(sd) - set(model.state_dict())
    if missing or unknown:
        raise KeyError(f"universal checkpoint {directory} does not match the model: missing {sorted(missing)[:5]}, "
                       f"unknown {sorted(unknown)[:5]}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(sd[name])
        for name, b in model.named_buffers():
            if name in sd:
                b.copy_(sd[name])


def load_stage(module: nn.Module, directory: Path, rename) -> None:
    """Load the fp32 weights of this pipeline stage's (full, unsliced) layers only -- for runs that
    never build the whole model (``train.init=local``)."""
    with torch.no_grad():
        for key, p in module.named_parameters():
            p.copy_(torch.load(directory / f"{rename(key)}.pt", map_location="cpu", weights_only=True)["fp32"])


def load_optimizer(engine, directory: Path, naming: Naming, *, tensor_rank: int = 0, tensor_size: int = 1) -> None:
    """Set every local parameter's fp32 master and moments from its file (this rank's slice)."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    index = read_index(directory)
    keys, step = index["moments"], index["step"]
    base = _base_optimizer(engine)
    if keys and step is not None:
        _init_state(engine, base, keys, step)
    for name, p in naming.params(engine.module):  # tied copies too: each stage steps its own
        saved = torch.load(directory / f"{name}.pt", map_location="cpu", weights_only=True)
        if tensor_size > 1 and hasattr(p, "tensor_parallel"):
            saved = {k: local_slice(p, v, tensor_rank, tensor_size) for k, v in saved.items()}
        if _sharded(p):
            safe_set_full_fp32_param(p, saved["fp32"].to(p.device))
            for k in keys:
                safe_set_full_optimizer_state(p, saved[k].to(p.device), k)
        else:
            with torch.no_grad():
                p.copy_(saved["fp32"])
            if keys and step is not None:
                state = base.state[p]
                state["step"] = torch.tensor(step)
                for k in keys:
                    state[k] = saved[k].to(p.device, torch.float32).clone()


def _init_state(engine, base, keys: list[str], step: float) -> None:
    """Give the optimizer moments to overwrite: DeepSpeed creates them lazily at the first step,
    so a fresh engine has none. ZeRO / bf16 wrappers keep one flat fp32 partition per group."""
    wrapped = base is not engine.optimizer
    if not wrapped:
        return
    # ZeRO-3 keeps its flat fp32 partitions (one per sub-group) outside the base optimizer's groups
    flats = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None) or [
        flat for group in base.param_groups for flat in group["params"]]
    for flat in flats:
        state = base.state[flat]
        if not state:
            state.update({k: torch.zeros_like(flat) for k in keys})
        state["step"] = torch.tensor(step)
    _relink(engine)


def _relink(engine) -> None:
    """Point each parameter's optimizer-state fragments at the current flat moments. DeepSpeed's
    ZeRO-1/2 and bf16 optimizers link them once, right after the first group's first step, when
    the other groups (our no-decay group) have no moments yet -- so they are linked again here."""
    if hasattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state"):
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()
