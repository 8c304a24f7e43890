"""The one fine-tuning loop: every ``glm finetune`` task kind -- [CLS] / last-token classification,
GPT's recipe with its auxiliary LM loss, ULMFiT's BPT3C classifier, span and token heads, text to
text -- trains through ``fit``. A task kind supplies only what differs (``FinetuneTask``): its model
and where the tricks apply, how a batch is built, its loss, its held-out scores.

The loop's part is the same for all: ``glm finetune``'s tricks (transfer/tricks.py: adapters,
layer groups with discriminative rates, gradual unfreezing, the linear or slanted triangular
schedule over the steps actually taken), AdamW on the DeepSpeed engine (one process, fp32,
ZeRO 0), one shuffle per epoch from ``--seed``, full batches only, and after every epoch a record
of the last and the mean training loss beside the task's scores, read in evaluation mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from glm_dist.config.loader import load_config
from glm_dist.parallel.engine import build_engine, set_lr
from glm_dist.train.optim import build_optimizer
from glm_dist.transfer.inputs import batch_on
from glm_dist.transfer.options import FinetuneArgs, FinetuneError
from glm_dist.transfer.tricks import Tricks

Batch = dict[str, torch.Tensor]
ADAMW = ("train.weight_decay=0.01",)  # BERT's and GPT's fine-tuning optimizer (AdamW, decay 0.01)


class FinetuneTask(Protocol):
    """What a task kind gives the loop."""

    model: nn.Module  # what the engine trains: the pretrained backbone with the task's head
    backbone: nn.Module  # the pretrained part: its layer groups, where adapters go
    head: nn.Module | None  # the new layers, one more layer group on top (None: the backbone's own)
    adapter_sites: tuple[str, ...]  # the family spec's: linear layers an adapter follows
    optimizer: tuple[str, ...]  # config overrides of the optimizer (its decay, betas)

    def __len__(self) -> int:
        """Training examples."""

    def batch(self, rows: list[int], device: torch.device) -> Batch:
        """Training examples ``rows`` as tensors on ``device``."""

    def loss(self, engine: nn.Module, batch: Batch) -> torch.Tensor:
        """The training loss of ``batch``, the model called through ``engine``."""

    def evaluate(self, engine: nn.Module) -> dict:
        """Held-out scores after an epoch (the model in evaluation mode); {} for none."""


@dataclass
class TensorRows:
    """The batching of task kinds whose examples are rows of equal-width tensors (classification,
    spans, tokens, text to text): a batch is those rows of every tensor in ``train``."""

    model: nn.Module
    train: Batch
    adapter_sites: tuple[str, ...] = ()
    optimizer: tuple[str, ...] = field(default=ADAMW)

    def __len__(self) -> int:
        return len(next(iter(self.train.values())))

    def batch(self, rows: list[int], device: torch.device) -> Batch:
        return batch_on(self.train, device, rows)


def prepare(task: FinetuneTask, args: FinetuneArgs) -> tuple[Tricks, list[dict]]:
    """``args``' tricks applied to the task's model: adapters, layer groups, the first epoch's
    freezing; the tricks and the optimizer's parameter groups."""
    tricks = Tricks.from_args(args)
    groups = tricks.prepare(task.model, task.backbone, task.head, adapter_sites=task.adapter_sites, weight_decay=0.01)
    return tricks, groups


def finetune_task(task: FinetuneTask, args: FinetuneArgs) -> tuple[list[dict], dict]:
    """Prepare the tricks and train: each epoch's record and the tricks' settings."""
    tricks, groups = prepare(task, args)
    return fit(task, args, tricks, groups), tricks.describe()


def fit(task: FinetuneTask, args: FinetuneArgs, tricks: Tricks, groups: list[dict]) -> list[dict]:
    """``args.epochs`` epochs of ``len(task) // args.batch_size`` steps; each epoch's record."""
    n = len(task)
    if n < args.batch_size:
        raise FinetuneError(f"--task {args.task}: {n} training rows are fewer than --batch-size {args.batch_size}")
    per_epoch = n // args.batch_size
    cfg = load_config(
        None,
        [
            f"train.micro_batch_size={args.batch_size}",
            f"train.lr={args.lr}",
            *task.optimizer,
            "parallel.zero_stage=0",
            "train.precision=fp32",
        ],
    )
    engine = build_engine(task.model, build_optimizer(task.model, cfg.train, groups), cfg, dp_size=1)
    g, step, history = torch.Generator().manual_seed(args.seed), 0, []
    task.model.train()  # a loaded checkpoint's model comes in evaluation mode: dropout on from the first step
    for epoch in range(args.epochs):
        tricks.start_epoch(epoch)
        order, losses = torch.randperm(n, generator=g).tolist(), []
        for i in range(0, per_epoch * args.batch_size, args.batch_size):
            batch = task.batch(order[i : i + args.batch_size], engine.device)
            set_lr(engine, tricks.lr(step, args.epochs * per_epoch, args.lr))
            loss = task.loss(engine, batch)
            engine.backward(loss)
            engine.step()
            losses.append(loss.detach())
            step += 1
        task.model.eval()
        history.append(
            {
                "epoch": epoch + 1,
                "loss": losses[-1].item(),
                "train_loss": torch.stack(losses).mean().item(),
                **task.evaluate(engine),
            }
        )
        task.model.train()
    return history
