"""Sequence classification on an encoder's summary state (BERT's [CLS], XLNet's last <cls>): one new
weight matrix (``SequenceClassifier``), cross-entropy, held-out and training accuracy after every
epoch (BERT's recipe: lr 2e-5..5e-5, 2-4 epochs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from glm_dist.models.heads import SequenceClassifier
from glm_dist.transfer.files import known_label_rows
from glm_dist.transfer.inputs import batch_on, batch_rows
from glm_dist.transfer.loop import Batch, TensorRows, finetune_task
from glm_dist.transfer.options import FinetuneArgs, FinetuneError


def encode(
    rows: list[dict], tok: Tokenizer, args: FinetuneArgs, labels: dict[str, int], pad_id: int, *, pad_left: bool = False
) -> Batch:
    """Rows -> the family's [CLS] ... [SEP] template of ``--text-field`` (and ``--pair-field``),
    truncated and padded to ``--max-len``, with label indices."""
    tok.enable_truncation(args.max_len)
    tok.enable_padding(pad_id=pad_id, length=args.max_len, direction="left" if pad_left else "right")
    for row in rows:
        for key in (args.text_field, args.label_field) + ((args.pair_field,) if args.pair_field else ()):
            if key not in row:
                raise FinetuneError(
                    f"row {str(row)[:200]} has no field {key!r}; set --text-field / --pair-field / --label-field"
                )
    pairs = [(r[args.text_field], r[args.pair_field]) if args.pair_field else r[args.text_field] for r in rows]
    enc = tok.encode_batch(pairs)
    return {
        "input_ids": torch.tensor([e.ids for e in enc]),
        "token_type_ids": torch.tensor([e.type_ids for e in enc]),
        "attention_mask": torch.tensor([e.attention_mask for e in enc]),
        "labels": torch.tensor([labels[str(r[args.label_field])] for r in rows]),
    }


@torch.no_grad()
def accuracy(model: nn.Module, data: Batch, batch_size: int, device) -> float:
    model.eval()
    right = 0
    for rows in batch_rows(len(data["labels"]), batch_size):
        part = batch_on(data, device, rows)
        logits = model(part["input_ids"], part["token_type_ids"], part["attention_mask"])
        right += int((logits.argmax(-1) == part["labels"]).sum())
    model.train()
    return right / len(data["labels"])


@dataclass
class Classification(TensorRows):
    """``--task classify`` (and pairs) on a ``SequenceClassifier``; ``valid`` as ``train``."""

    valid: Batch | None = None
    batch_size: int = 16

    @property
    def backbone(self) -> nn.Module:
        return self.model.encoder

    @property
    def head(self) -> nn.Module:
        return self.model.classifier

    def loss(self, engine: nn.Module, batch: Batch) -> torch.Tensor:
        logits = engine(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        return F.cross_entropy(logits.float(), batch["labels"])

    def evaluate(self, engine: nn.Module) -> dict:
        return {
            "valid_accuracy": accuracy(engine, self.valid, self.batch_size, engine.device),
            "train_accuracy": accuracy(engine, self.train, self.batch_size, engine.device),
        }


def classify(
    args: FinetuneArgs,
    encoder: nn.Module,
    tok: Tokenizer,
    train_rows: list[dict],
    valid_rows: list[dict],
    *,
    pad_id: int,
    pad_left: bool,
    position: int,
    adapter_sites: tuple[str, ...],
) -> dict:
    """Train the classifier; the result without the checkpoint's name, the model under ``model``."""
    labels = {name: i for i, name in enumerate(sorted({str(r[args.label_field]) for r in train_rows}))}
    valid_rows = known_label_rows(valid_rows, labels, args)
    train, valid = (encode(part, tok, args, labels, pad_id, pad_left=pad_left) for part in (train_rows, valid_rows))
    model = SequenceClassifier(encoder, len(labels), position=position)
    task = Classification(model, train, adapter_sites, valid=valid, batch_size=args.batch_size)
    history, _ = finetune_task(task, args)
    counts = torch.bincount(valid["labels"], minlength=len(labels))
    return {
        "labels": list(labels),
        "train_examples": len(train_rows),
        "valid_examples": len(valid_rows),
        "majority_baseline": counts.max().item() / max(1, len(valid_rows)),
        "valid_accuracy": history[-1]["valid_accuracy"],
        "history": history,
        "model": model,
    }
