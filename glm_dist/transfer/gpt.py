"""``glm finetune`` for GPT checkpoints (GPT-1, GPT-2, GPT-3): GPT's recipe.

Rows (JSONL / CSV) are turned into the task's input transformation (``inputs``), three new tokens
(start, delimiter, extract) are added to the vocabulary, W_y reads the extract token's final state
and the LM loss on the same inputs is added with weight ``--lm-weight`` (``heads``). The schedule
is a linear warmup over ``--warmup`` of the steps, then linear decay to 0, or ``tricks``' options
(``--recipe gpt``: lr 6.25e-5, batch 32, 3 epochs, warmup 0.2%, dropout 0.1, lambda 0.5). Held-out accuracy after every
epoch, beside the majority baseline. It trains through ``glm finetune``'s one loop (``loop``);
``GPTTask`` is what differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import Tokenizer
from torch import nn

from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.families.registry import family
from glm_dist.transfer.files import finish, known_label_rows, train_valid_rows
from glm_dist.transfer.heads import GPTTransfer, set_dropout
from glm_dist.transfer.inputs import SpecialTokens, batch_on, batch_rows, pack, transform
from glm_dist.transfer.loop import ADAMW, Batch, finetune_task
from glm_dist.transfer.options import FinetuneArgs, FinetuneError


def _fields(args: FinetuneArgs) -> tuple[str, ...]:
    second = {"classify": (), "multiple_choice": (args.choices_field,)}.get(args.task, (args.pair_field or "text_b",))
    return (args.text_field, *second, args.label_field)


def label_index(rows: list[dict], args: FinetuneArgs) -> dict[str, int]:
    """Label -> output index: sorted label strings, or the candidates' positions for multiple choice."""
    if args.task == "multiple_choice":
        return {str(k): k for k in range(max(len(r[args.choices_field]) for r in rows))}
    return {name: i for i, name in enumerate(sorted({str(r[args.label_field]) for r in rows}))}


def _label(row: dict, args: FinetuneArgs, labels: dict[str, int]) -> int:
    value = row[args.label_field]
    if args.task == "multiple_choice" and not isinstance(value, int):  # the answer's text
        if value not in row[args.choices_field]:
            raise FinetuneError(f"row {str(row)[:200]}: label {value!r} is neither an index nor one of its choices")
        return row[args.choices_field].index(value)
    return labels[str(value)]


def encode_rows(
    rows: list[dict], tok: Tokenizer, args: FinetuneArgs, labels: dict[str, int], sp: SpecialTokens, max_len: int
) -> tuple[list[list[list[int]]], torch.Tensor]:
    """Rows -> each example's token sequences (the task's input transformation) and the labels."""
    fields = _fields(args)
    examples, targets = [], []
    for row in rows:
        missing = [f for f in fields if f not in row]
        if missing:
            raise FinetuneError(
                f"row {str(row)[:200]} has no field {missing[0]!r}; set --text-field / "
                "--pair-field / --choices-field / --label-field"
            )
        enc = lambda text: tok.encode(str(text), add_special_tokens=False).ids  # noqa: E731
        second = (
            None
            if args.task == "classify"
            else [enc(c) for c in row[fields[1]]]
            if args.task == "multiple_choice"
            else enc(row[fields[1]])
        )
        examples.append(transform(args.task, enc(row[args.text_field]), second, sp, max_len))
        targets.append(_label(row, args, labels))
    return examples, torch.tensor(targets)


@torch.no_grad()
def accuracy(model, examples: list, labels: torch.Tensor, batch_size: int, device) -> float:
    model.eval()
    right = 0
    for rows in batch_rows(len(examples), batch_size):
        batch = batch_on(pack(examples[rows]), device)
        right += int((model(**batch)["logits"].argmax(-1).cpu() == labels[rows]).sum())
    model.train()
    return right / max(1, len(examples))


@dataclass
class GPTTask:
    """GPT's recipe for the loop: each example is its task's token sequences (one per candidate for
    multiple choice), packed per batch; the loss adds the LM loss on the same inputs."""

    model: GPTTransfer
    examples: list[list[list[int]]]
    labels: torch.Tensor
    valid: tuple[list, torch.Tensor]
    args: FinetuneArgs
    adapter_sites: tuple[str, ...] = ()
    optimizer: tuple[str, ...] = (*ADAMW, "train.beta2=0.999")

    @property
    def backbone(self) -> nn.Module:
        return self.model.lm

    @property
    def head(self) -> nn.Module:
        return self.model.classifier

    def __len__(self) -> int:
        return len(self.examples)

    def batch(self, rows: list[int], device: torch.device) -> Batch:
        return batch_on({**pack([self.examples[j] for j in rows]), "labels": self.labels[rows]}, device)

    def loss(self, engine: nn.Module, batch: Batch) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return self.model.loss(engine(**inputs), batch["labels"], self.args.lm_weight)

    def evaluate(self, engine: nn.Module) -> dict:
        return {"valid_accuracy": accuracy(engine, *self.valid, self.args.batch_size, engine.device)}


def finetune_gpt(args: FinetuneArgs, lm: torch.nn.Module, meta: dict) -> dict:
    """Fine-tune a GPT checkpoint's model (already loaded) on ``args.train``; the result as a dict."""
    tok = checkpoint_tokenizer(args.checkpoint)
    train_rows, valid_rows = train_valid_rows(args, _fields(args))
    labels = label_index(train_rows, args)
    if args.task != "multiple_choice":
        valid_rows = known_label_rows(valid_rows, labels, args)
    sp = SpecialTokens.after(lm.add_tokens(3))
    max_len = min(args.max_len, lm.cfg.context_length)
    train, y_train = encode_rows(train_rows, tok, args, labels, sp, max_len)
    valid, y_valid = encode_rows(valid_rows, tok, args, labels, sp, max_len)
    if args.dropout is not None:
        set_dropout(lm, args.dropout)
    model = GPTTransfer(lm, args.task, len(labels), dropout=0.1 if args.dropout is None else args.dropout)
    task = GPTTask(model, train, y_train, (valid, y_valid), args, family(meta["model_family"]).adapter_sites)
    history, settings = finetune_task(task, args)
    device = next(model.parameters()).device
    history[-1]["train_accuracy"] = accuracy(model, train, y_train, args.batch_size, device)  # once: costly
    counts = torch.bincount(y_valid, minlength=len(labels))
    return finish(
        args,
        {
            "task": args.task,
            "labels": list(labels),
            "train_examples": len(train_rows),
            "valid_examples": len(valid_rows),
            "majority_baseline": counts.max().item() / max(1, len(valid_rows)),
            "valid_accuracy": history[-1]["valid_accuracy"],
            "history": history,
            "settings": {
                **{
                    k: getattr(args, k)
                    for k in ("lr", "batch_size", "epochs", "warmup", "lm_weight", "dropout", "max_len")
                },
                **settings,
            },
            "model": model,
        },
    )
