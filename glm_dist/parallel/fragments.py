"""What each rank holds of each parameter's fp32 master and optimizer moments, under DeepSpeed's
partitioning -- the slices a sharded checkpoint writes and reads (``checkpoint/shards.py``).

For every local parameter, a ``Piece``: its unsplit name and shape, its tensor-parallel slicing,
and the *fragment* ``[start, start + numel)`` of its flattened TP-local tensor whose fp32 master and
moments live on this rank, with views onto them (no copy, no collective):

- ZeRO-1/2 and BF16_Optimizer: the parameter's part of this rank's flat fp32 partition
  (``p._hp_mapping``: ``lp_fragment_address``, ``get_hp_fragment(key)``);
- ZeRO-3: its local partition (``ds_tensor``'s share of ``ds_numel``, padding cut off);
- ZeRO-0 in fp32 (a plain torch optimizer): the parameter itself and its per-parameter state, the
  whole TP-local tensor, the same on every data-parallel rank (bf16 at ZeRO-0 runs BF16_Optimizer,
  ``config/deepspeed_json.py``).

``Piece.write`` is the part of the fragment this rank writes: identical copies (data-parallel
ranks under ZeRO-0, tensor ranks of a parameter that is not split, a pipeline's tied copies on
the first and last stage) each write a different part, so every element is written once and
every rank writes about its share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

WRAPPERS = {"fp32_partitioned_groups_flat": "zero3", "single_partition_of_fp32_groups": "zero12", "bf16_groups": "bf16"}


class Naming:
    """How a rank's module names its parameters in the checkpoint: ``rename`` maps a local name
    to the one-process model's (None: not part of it); ``tied(key)`` gives (copy index, copies) for
    a parameter held on several pipeline stages ((0, 1) for the rest)."""

    def __init__(self, rename=None, tied=None):
        self.rename = rename or (lambda key: key)
        self.tied = tied or (lambda key: (0, 1))

    def params(self, module: nn.Module):
        for key, p in module.named_parameters():
            name = self.rename(key)
            if name is not None:
                yield key, name, p

    def buffers(self, module: nn.Module):
        """Persistent buffers (the ones a state dict holds), on the first of their tied copies."""
        params = {key for key, _ in module.named_parameters(remove_duplicate=False)}
        for key, value in module.state_dict().items():
            name = self.rename(key)
            if key not in params and name is not None and not key.endswith("_extra_state") and self.tied(key)[0] == 0:
                yield key, name, value


def pipeline_tied(pipe, rank: int):
    """``Naming.tied`` of a DeepSpeed pipeline stage: a tied module's shared weights (its
    ``weight_attr``) have one copy per stage in ``tied_comms[key]['ranks']`` (in stage order);
    the rest of a tied module lives on its stage alone."""

    def tied(key: str) -> tuple[int, int]:
        if not key.startswith("tied_modules."):
            return 0, 1
        module, _, attr = key[len("tied_modules.") :].partition(".")
        comm = getattr(pipe, "tied_comms", {}).get(module)
        if comm is None or attr not in comm["weight_attr"] or rank not in comm["ranks"]:
            return 0, 1
        return comm["ranks"].index(rank), len(comm["ranks"])

    return tied


@dataclass
class Piece:
    name: str
    shape: tuple[int, ...]  # unsplit
    tp: tuple | None  # (dim, parts, rank, size)
    start: int  # fragment of the flattened TP-local tensor held here
    numel: int
    view: Callable[[str], torch.Tensor]  # kind ("fp32" or a moment) -> flat fp32 view of the fragment
    whole: bool = False  # the whole TP-local tensor, the same on every data-parallel rank (ZeRO-0)
    moments: list[str] = field(default_factory=list)  # optimizer states held in the parameter's shape
    write: tuple[int, int] = (0, 0)  # [lo, hi) of the flattened TP-local tensor this rank writes
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # plain optimizer states of another shape


def holder(engine) -> str:
    """Who keeps the fp32 masters: 'zero3', 'zero12', 'bf16' or 'plain' (the parameters
    themselves, a torch optimizer's state per parameter). Any other DeepSpeed wrapper is refused:
    read as 'plain', its 16-bit weights would be saved as the masters and its moments not at all."""
    kind = next((kind for attr, kind in WRAPPERS.items() if hasattr(engine.optimizer, attr)), "plain")
    if kind == "plain" and base_optimizer(engine) is not engine.optimizer:
        raise TypeError(
            f"DeepSpeed chose {type(engine.optimizer).__name__}, whose fp32 masters and moments "
            f"no checkpoint here reads or writes (config/deepspeed_json.py picks the optimizer)"
        )
    return kind


def base_optimizer(engine):
    """The torch optimizer that owns the moments (DeepSpeed's ZeRO / bf16 wrappers hold it)."""
    return getattr(engine.optimizer, "optimizer", engine.optimizer)


def pieces(engine, naming: Naming, coords: dict, sizes: dict) -> list[Piece]:
    """Every local parameter's piece (tied copies too). ``coords``/``sizes``: this rank's data and
    tensor coordinates and the axes' sizes."""
    kind = holder(engine)
    moments = optimizer_step(engine)["moments"]
    out = []
    for key, name, p in naming.params(engine.module):
        tp = _tp(p, coords, sizes)
        local = tuple(p.ds_shape) if hasattr(p, "ds_shape") else tuple(p.shape)
        # a vocabulary split need not divide: its parameters name their unsplit shape
        shape = getattr(p, "unsplit_shape", None) if tp else None
        shape = shape or tuple(d * tp[3] if tp and i == tp[0] else d for i, d in enumerate(local))
        piece = _fragment(engine, kind, p, name, shape, tp)
        if piece is None:
            continue
        piece.write = _share(piece, naming.tied(key), coords, sizes, whole=piece.whole, total=math.prod(local))
        piece.moments = (
            moments
            if kind != "plain"
            else sorted(
                k
                for k, v in base_optimizer(engine).state.get(p, {}).items()
                if torch.is_tensor(v) and v.dim() > 0 and v.shape == p.shape
            )
        )
        out.append(piece)
    return out


def _tp(p: nn.Parameter, coords: dict, sizes: dict) -> tuple | None:
    if sizes["tensor"] > 1 and hasattr(p, "tensor_parallel"):
        dim, parts = p.tensor_parallel
        return (dim, parts, coords["tensor"], sizes["tensor"])
    return None


def _fragment(engine, kind: str, p: nn.Parameter, name: str, shape, tp) -> Piece | None:
    opt = engine.optimizer
    if kind == "zero3" and p.requires_grad:
        part = p.ds_tensor.ds_numel
        start = opt._get_param_partition_rank(p) * part
        numel = max(0, min(part, p.ds_numel - start))

        def view(k: str, p=p, numel=numel) -> torch.Tensor:
            return opt._get_fp32_opt_state_partition(
                p, release_swap_buffers=False, optim_state_key=None if k == "fp32" else k
            )[0][:numel]

        return Piece(name, shape, tp, start, numel, view)
    if kind in ("zero12", "bf16") and getattr(p, "_hp_mapping", None) is not None:
        address = p._hp_mapping.lp_fragment_address
        return Piece(
            name,
            shape,
            tp,
            address.start,
            address.numel,
            lambda k, m=p._hp_mapping: m.get_hp_fragment(None if k == "fp32" else k),
        )
    if kind in ("zero12", "bf16") and hasattr(p, "_hp_mapping"):
        return None  # its fp32 master lives on other data-parallel ranks
    base = base_optimizer(engine)

    def plain(k: str, p=p) -> torch.Tensor:
        return (p.detach() if k == "fp32" else base.state[p][k]).reshape(-1)

    extra = {
        k: v for k, v in base.state.get(p, {}).items() if torch.is_tensor(v) and v.dim() > 0 and v.shape != p.shape
    }
    return Piece(name, shape, tp, 0, p.numel(), plain, whole=True, extra=extra)


def _share(
    piece: Piece, tied: tuple[int, int], coords: dict, sizes: dict, *, whole: bool, total: int
) -> tuple[int, int]:
    """The part of the fragment this rank writes (``total``: elements of the TP-local tensor). Tied
    copies split the tensor's element range; identical replicas (whole fragments over the data
    ranks, unsplit tensors over the tensor ranks) split the fragment."""
    index, copies = tied
    lo = max(piece.start, total * index // copies)
    hi = max(lo, min(piece.start + piece.numel, total * (index + 1) // copies))
    c, count = 0, 1
    if whole:
        c, count = coords["data"], sizes["data"]
    if piece.tp is None and sizes["tensor"] > 1:
        c, count = c * sizes["tensor"] + coords["tensor"], count * sizes["tensor"]
    n = hi - lo
    return lo + n * c // count, lo + n * (c + 1) // count


# -- the optimizer's state ---------------------------------------------------------------------------
def optimizer_step(engine) -> dict:
    """The optimizer's step count and the moments it keeps (saved with the run state)."""
    keys, step = [], None
    for state in base_optimizer(engine).state.values():
        keys = sorted({*keys, *(k for k, v in state.items() if torch.is_tensor(v) and v.dim() > 0)})
        if "step" in state and step is None:
            step = state["step"]
    return {"moments": keys, "step": None if step is None else float(step), "step_tensor": torch.is_tensor(step)}


def link_moments(engine) -> None:
    """Point each parameter's optimizer-state fragments at the current flat moments. DeepSpeed's
    ZeRO-1/2 and bf16 optimizers link them once, right after the first group's first step, when
    the other groups (our no-decay group) have no moments yet -- so they are linked again here."""
    if hasattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state"):
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()


def step_like(optimizer, p: torch.Tensor, step: float) -> torch.Tensor:
    """The optimizer's step count as torch keeps it: fused and capturable Adam read it on the
    parameter's device (a CPU step under fused CUDA AdamW is an illegal memory access), the
    others on the CPU."""
    group = next((g for g in optimizer.param_groups if any(q is p for q in g["params"])), {})
    on_device = group.get("fused") or group.get("capturable")
    return torch.tensor(step, dtype=torch.float32, device=p.device if on_device else "cpu")


def init_state(engine, saved: dict, plain_kinds: dict[int, dict[str, tuple]]) -> None:
    """Give the optimizer moments to overwrite: DeepSpeed creates them lazily at the first step,
    so a fresh engine has none. Wrappers keep one flat fp32 partition per group (ZeRO-3's outside
    the base optimizer's groups); a plain optimizer one state per parameter (``plain_kinds``:
    id(p) -> {kind: shape})."""
    keys, step = saved.get("moments") or [], saved.get("step")
    if not keys or step is None:
        return
    base = base_optimizer(engine)

    def step_value(t: torch.Tensor):  # LAMB counts in a Python int
        return step_like(base, t, step) if saved.get("step_tensor", True) else int(step)

    if base is engine.optimizer:  # plain: per parameter
        for p in (q for g in base.param_groups for q in g["params"]):
            shapes = plain_kinds.get(id(p), {})
            base.state[p].update(
                {k: torch.zeros(shape, dtype=torch.float32, device=p.device) for k, shape in shapes.items()},
                step=step_value(p),
            )
        return
    flats = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None) or [
        flat for group in base.param_groups for flat in group["params"]
    ]
    for flat in flats:
        state = base.state[flat]
        state.update({k: torch.zeros_like(flat) for k in keys if k not in state}, step=step_value(flat))
    link_moments(engine)


def refresh_weights(engine) -> None:
    """Derive the (bf16 or fp32) module weights from the fp32 masters just loaded (ZeRO-1/2 and
    BF16_Optimizer all-gather them over the data-parallel ranks: every rank calls this)."""
    kind, opt = holder(engine), engine.optimizer
    if kind in ("zero12", "bf16"):
        opt.update_lp_params()
    elif kind == "zero3":
        opt.checkpoint_event_prologue()
        for group in range(len(opt.fp16_groups)):
            opt._reassign_or_swap_out_partitioned_parameters(group)
        opt.checkpoint_event_epilogue()
