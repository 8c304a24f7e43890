"""Layer groups and discriminative rates (ULMFiT, Howard & Ruder 2018, section 3.2): the model is cut
into groups bottom to top and group l learns at eta^l = eta^(l+1) / factor. ``glm train`` reads them for
``train.discriminative_lr`` and ``glm finetune``'s tricks (transfer/tricks.py) for its options.

Layer groups: a model's ``layer_groups()`` where it defines one (AWD-LSTM: embedding, each LSTM
layer); else its ``layers()`` (embedding, blocks, pretraining head) with the pretraining head joined
to the top block (GPT's final norm lies on the way to any task head); else the parameters outside
the transformer blocks, then each block in order (T5, BART: encoder blocks, then decoder blocks). A
tied weight belongs to its lowest group; a task head is one more group on top.
"""

from __future__ import annotations

from torch import nn

from glm_dist.errors import GlmError
from glm_dist.train.optim import matrix


class TrickError(GlmError, ValueError):
    """A fine-tuning option that does not apply to the model."""


def _params(part) -> list[nn.Parameter]:
    if isinstance(part, nn.Parameter):
        return [part]
    if isinstance(part, nn.Module):
        return list(part.parameters())
    return [p for item in part for p in _params(item)]


def _block_lists(model: nn.Module) -> list[nn.Module]:
    return [
        block
        for name, m in model.named_modules()
        if name.split(".")[-1] == "blocks" and isinstance(m, nn.ModuleList)
        for block in m
    ]


def layer_groups(model: nn.Module, head: nn.Module | None = None) -> list[list[nn.Parameter]]:
    """The model's parameters as layer groups, bottom to top (see the module docstring), ``head``'s
    as one more on top; every parameter in exactly one group, empty groups dropped."""
    if hasattr(model, "layer_groups"):
        parts = list(model.layer_groups())
    elif hasattr(model, "layers"):
        parts = list(model.layers())
        parts = parts[:-2] + [parts[-2:]] if len(parts) > 2 else parts
    else:
        blocks = _block_lists(model)
        if not blocks:
            raise TrickError(
                f"{type(model).__name__} has neither layer_groups(), layers() nor transformer blocks: "
                "no layer groups for discriminative rates or gradual unfreezing"
            )
        inside = {id(p) for b in blocks for p in b.parameters()}
        parts = [[p for p in model.parameters() if id(p) not in inside], *blocks]
    if head is not None:
        parts.append(head)
    seen, groups = set(), []
    for part in parts:
        group = [p for p in _params(part) if id(p) not in seen and not seen.add(id(p))]
        if group:
            groups.append(group)
    missing = [n for n, p in model.named_parameters() if id(p) not in seen]
    if missing:
        groups[-1 if head is None else -2].extend(dict(model.named_parameters())[n] for n in missing)
    return groups


def discriminative_param_groups(groups: list[list[nn.Parameter]], *, factor: float, weight_decay: float) -> list[dict]:
    """Optimizer groups: layer group l of L learns at lr / factor^(L - 1 - l) (``lr_scale``, which
    ``set_lr`` multiplies in, so the schedule stays one number); matrices and embeddings decay, biases
    and norms do not. Frozen parameters are left out."""
    out = []
    for i, group in enumerate(groups):
        scale = factor ** -(len(groups) - 1 - i)
        trainable = [p for p in group if p.requires_grad]
        for decay, name in ((True, "decay"), (False, "no_decay")):
            params = [p for p in trainable if matrix(p) == decay]
            if params:
                out.append(
                    {
                        "params": params,
                        "weight_decay": weight_decay if decay else 0.0,
                        "lr_scale": scale,
                        "name": f"group{i}_{name}",
                    }
                )
    return out
