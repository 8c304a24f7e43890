"""``glm finetune``: sequence classification from a pretrained encoder checkpoint.

Reads (text, label) or (text_a, text_b, label) rows from JSONL or CSV, tokenizes them with the
checkpoint's own tokenizer (the family's [CLS] ... [SEP] template), adds one new weight matrix on the
final [CLS] state (``SequenceClassifier``) and trains everything on the DeepSpeed engine with
AdamW, linear warmup and decay (BERT's recipe: lr 2e-5..5e-5, 2-4 epochs). Prints held-out
accuracy after every epoch and writes the result as JSON.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import fsspec
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from glm_dist.config.loader import load_config
from glm_dist.eval.run import load_checkpoint_model
from glm_dist.models.heads import SequenceClassifier
from glm_dist.parallel.distributed import init_distributed
from glm_dist.parallel.engine import build_engine, set_lr
from glm_dist.train.optim import build_optimizer


@dataclass
class FinetuneArgs:
    checkpoint: str
    train: str
    valid: str | None = None
    text_field: str = "text"
    pair_field: str | None = None
    label_field: str = "label"
    epochs: int = 3
    lr: float = 5e-5
    batch_size: int = 16
    max_len: int = 128
    valid_per_mille: int = 200  # held out by row hash when no --valid file
    seed: int = 0
    out: str | None = None


def read_rows(path: str) -> list[dict]:
    """JSONL (.jsonl / .json, optionally compressed) or CSV with a header row."""
    with fsspec.open(path, "rt", compression="infer", encoding="utf-8") as f:
        if ".csv" in path:
            return list(csv.DictReader(f))
        return [json.loads(line) for line in f if line.strip()]


def split_rows(rows: list[dict], per_mille: int) -> tuple[list[dict], list[dict]]:
    held = [int(hashlib.sha1(json.dumps(r, sort_keys=True).encode()).hexdigest()[:8], 16) % 1000 < per_mille for r in rows]
    return [r for r, h in zip(rows, held) if not h], [r for r, h in zip(rows, held) if h]


def encode(rows: list[dict], tok: Tokenizer, args: FinetuneArgs, labels: dict[str, int], pad_id: int) -> dict[str, torch.Tensor]:
    tok.enable_truncation(args.max_len)
    tok.enable_padding(pad_id=pad_id, length=args.max_len)
    for row in rows:
        for key in (args.text_field, args.label_field) + ((args.pair_field,) if args.pair_field else ()):
            if key not in row:
                raise KeyError(f"row {row!r} has no field {key!r}; set --text-field / --pair-field / --label-field")
    pairs = [(r[args.text_field], r[args.pair_field]) if args.pair_field else r[args.text_field] for r in rows]
    enc = tok.encode_batch(pairs)
    return {"input_ids": torch.tensor([e.ids for e in enc]), "token_type_ids": torch.tensor([e.type_ids for e in enc]),
            "attention_mask": torch.tensor([e.attention_mask for e in enc]),
            "labels": torch.tensor([labels[str(r[args.label_field])] for r in rows])}


@torch.no_grad()
def accuracy(model, data: dict[str, torch.Tensor], batch_size: int, device) -> float:
    model.eval()
    right = 0
    for i in range(0, len(data["labels"]), batch_size):
        part = {k: v[i:i + batch_size].to(device) for k, v in data.items()}
        logits = model(part["input_ids"], part["token_type_ids"], part["attention_mask"])
        right += int((logits.argmax(-1) == part["labels"]).sum())
    model.train()
    return right / len(data["labels"])


def finetune(args: FinetuneArgs) -> dict:
    init_distributed()
    torch.manual_seed(args.seed)
    encoder, meta = load_checkpoint_model(args.checkpoint)
    if meta["model_family"] == "electra":
        encoder = encoder.discriminator
    if not hasattr(encoder, "embed") or meta["model_family"] == "gpt":
        raise ValueError(f"glm finetune classifies with an encoder (bert, roberta, albert, electra); "
                         f"{args.checkpoint} is a {meta['model_family']!r} checkpoint")
    tok = Tokenizer.from_file(str(Path(args.checkpoint) / "tokenizer.json"))
    rows = read_rows(args.train)
    train_rows, valid_rows = (rows, read_rows(args.valid)) if args.valid else split_rows(rows, args.valid_per_mille)
    labels = {name: i for i, name in enumerate(sorted({str(r[args.label_field]) for r in train_rows}))}
    valid_rows = [r for r in valid_rows if str(r[args.label_field]) in labels]
    pad = encoder.cfg.pad_id
    train, valid = encode(train_rows, tok, args, labels, pad), encode(valid_rows, tok, args, labels, pad)
    model = SequenceClassifier(encoder, len(labels))
    steps = args.epochs * math.ceil(len(train_rows) / args.batch_size)
    cfg = load_config(None, [f"train.micro_batch_size={args.batch_size}", f"train.lr={args.lr}", "train.weight_decay=0.01",
                             "parallel.zero_stage=0", "train.precision=fp32"])
    engine = build_engine(model, build_optimizer(model, cfg.train), cfg, dp_size=1)
    history = []
    g = torch.Generator().manual_seed(args.seed)
    step = 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(train_rows), generator=g)
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            part = {k: v[order[i:i + args.batch_size]].to(engine.device) for k, v in train.items()}
            warm = max(1, steps // 10)  # 10% warmup, then linear decay to 0
            set_lr(engine, args.lr * min((step + 1) / warm, max(0.0, (steps - step) / (steps - warm))))
            loss = F.cross_entropy(engine(part["input_ids"], part["token_type_ids"], part["attention_mask"]).float(),
                                   part["labels"])
            engine.backward(loss)
            engine.step()
            step += 1
        history.append({"epoch": epoch + 1, "valid_accuracy": accuracy(engine, valid, args.batch_size, engine.device),
                        "train_accuracy": accuracy(engine, train, args.batch_size, engine.device)})
    counts = torch.bincount(valid["labels"], minlength=len(labels))
    result = {"checkpoint": args.checkpoint, "labels": list(labels), "train_examples": len(train_rows),
              "valid_examples": len(valid_rows), "majority_baseline": counts.max().item() / max(1, len(valid_rows)),
              "valid_accuracy": history[-1]["valid_accuracy"], "history": history}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "finetune.json").write_text(json.dumps(result, indent=2))
        torch.save({"classifier": model.state_dict(), "labels": labels}, Path(args.out, "classifier.pt"))
    return result
