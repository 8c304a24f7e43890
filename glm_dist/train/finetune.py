"""``glm finetune``: sequence classification from a pretrained encoder checkpoint.

Reads (text, label) or (text_a, text_b, label) rows from JSONL or CSV, tokenizes them with the
checkpoint's own tokenizer (the family's [CLS] ... [SEP] template), adds one new weight matrix on the
final [CLS] state (``SequenceClassifier``) and trains everything on the DeepSpeed engine with
AdamW, linear warmup and decay (BERT's recipe: lr 2e-5..5e-5, 2-4 epochs). Prints held-out
accuracy after every epoch and writes the result as JSON. Every path takes the tricks of
``glm_dist/transfer/tricks.py`` (discriminative and slanted triangular rates, gradual unfreezing,
adapters).
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

from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.config.loader import load_config
from glm_dist.errors import GlmError
from glm_dist.eval.text_metrics import text_scores
from glm_dist.eval.run import load_checkpoint_model
from glm_dist.models.heads import SequenceClassifier
from glm_dist.families.registry import FAMILIES, exported_module, family, resolve
from glm_dist.parallel.distributed import init_distributed
from glm_dist.parallel.engine import build_engine, set_lr
from glm_dist.train.optim import build_optimizer
from glm_dist.transfer.tricks import Tricks


@dataclass
class FinetuneArgs:
    checkpoint: str
    train: str
    valid: str | None = None
    # classify | seq2seq (T5, BART) | entailment | similarity | multiple_choice (GPT) | span | tokens
    task: str = "classify"
    prefix: str = ""  # seq2seq: T5-style task prefix, e.g. "summarize: "
    text_field: str = "text"
    pair_field: str | None = None
    label_field: str = "label"  # seq2seq: the target text field
    choices_field: str = "choices"  # multiple_choice: the list of candidate answers
    epochs: int = 3
    lr: float = 5e-5
    batch_size: int = 16
    max_len: int = 128
    valid_per_mille: int = 200  # held out by row hash when no --valid file
    seed: int = 0
    out: str | None = None
    lm_weight: float = 0.5  # GPT: lambda of the auxiliary LM loss, L3 = L2 + lambda * L1
    warmup: float = 0.1  # --schedule linear: warmup as a fraction of the steps (linear decay after it)
    dropout: float | None = None  # GPT: every dropout of the model and the classifier's (None: 0.1 on W_y only)
    # every family (glm_dist/transfer/tricks.py): ULMFiT's three tricks and Houlsby adapters
    schedule: str = "linear"  # linear: warmup over --warmup, then decay to 0 | stlr: slanted triangular
    discriminative_lr: float = 0.0  # layer group l's lr = group l+1's / this (ULMFiT: 2.6); 0: one rate
    gradual_unfreezing: bool = False  # the top layer group trains first, one more group each epoch
    adapters: int = 0  # bottleneck adapters of this size after each block's attention and FFN, the rest frozen
    bptt: int = 70  # AWD-LSTM (ULMFiT's BPT3C): a document is read in windows of this many tokens
    drop_mult: float = 1.0  # AWD-LSTM: the classifier's dropouts are the LM's times this (fastai's drop_mult)


class FinetuneError(GlmError, ValueError):
    """Rows or a checkpoint that glm finetune cannot use."""


def read_rows(path: str) -> list[dict]:
    """JSONL (.jsonl / .json, optionally compressed) or CSV with a header row; a malformed row
    stops with its file and line."""
    try:
        with fsspec.open(path, "rt", compression="infer", encoding="utf-8") as f:
            if ".csv" in path:
                return list(csv.DictReader(f))
            rows, n = [], 0
            for n, line in enumerate(f, 1):
                if line.strip():
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise FinetuneError(f"{path}:{n}: a row must be a JSON object, got {type(row).__name__}")
                    rows.append(row)
            return rows
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise FinetuneError(f"{path}:{n}: not a JSON row ({err})") from None


def split_rows(rows: list[dict], per_mille: int) -> tuple[list[dict], list[dict]]:
    held = [int(hashlib.sha1(json.dumps(r, sort_keys=True).encode()).hexdigest()[:8], 16) % 1000 < per_mille
            for r in rows]
    return [r for r, h in zip(rows, held) if not h], [r for r, h in zip(rows, held) if h]


def encode(rows: list[dict], tok: Tokenizer, args: FinetuneArgs, labels: dict[str, int], pad_id: int, *,
           pad_left: bool = False) -> dict[str, torch.Tensor]:
    tok.enable_truncation(args.max_len)
    tok.enable_padding(pad_id=pad_id, length=args.max_len, direction="left" if pad_left else "right")
    for row in rows:
        for key in (args.text_field, args.label_field) + ((args.pair_field,) if args.pair_field else ()):
            if key not in row:
                raise FinetuneError(f"row {str(row)[:200]} has no field {key!r}; "
                                    f"set --text-field / --pair-field / --label-field")
    pairs = [(r[args.text_field], r[args.pair_field]) if args.pair_field else r[args.text_field] for r in rows]
    enc = tok.encode_batch(pairs)
    return {"input_ids": torch.tensor([e.ids for e in enc]), "token_type_ids": torch.tensor([e.type_ids for e in enc]),
            "attention_mask": torch.tensor([e.attention_mask for e in enc]),
            "labels": torch.tensor([labels[str(r[args.label_field])] for r in rows])}


def write_output(out: str, model: torch.nn.Module, result: dict) -> None:
    """``glm finetune --out DIR``: the fine-tuned weights as ``model.safetensors`` (data, never code;
    tied weights stored once each name) and the result -- labels or tags included -- as
    ``finetune.json``."""
    from safetensors.torch import save_file

    Path(out).mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()},
              str(Path(out, "model.safetensors")))
    Path(out, "finetune.json").write_text(json.dumps(result, indent=2))


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
    if args.task == "seq2seq":
        return finetune_seq2seq(args)
    encoder, meta = load_checkpoint_model(args.checkpoint)
    name = meta["model_family"]
    if args.task not in family(name).finetune:
        able = [f for f, spec in FAMILIES.items() if args.task in spec.finetune]
        raise FinetuneError(f"glm finetune --task {args.task} takes {', '.join(able)} checkpoints; {args.checkpoint} "
                            f"is a {name!r} checkpoint")
    encoder = exported_module(name, encoder)
    spec = family(name)
    if args.task in ("span", "tokens"):  # BERT's token-level heads, any encoder (transfer/token_tasks.py)
        from glm_dist.transfer.token_tasks import finetune_token_level

        return finetune_token_level(args, encoder, meta, pad_left=spec.pad_left, adapter_sites=spec.adapter_sites)
    if spec.finetune_with:  # the family's own recipe (GPT's: glm_dist/transfer)
        return resolve(spec.finetune_with)(args, encoder, meta)
    tok = checkpoint_tokenizer(args.checkpoint)
    rows = read_rows(args.train)
    train_rows, valid_rows = (rows, read_rows(args.valid)) if args.valid else split_rows(rows, args.valid_per_mille)
    labels = {name: i for i, name in enumerate(sorted({str(r[args.label_field]) for r in train_rows}))}
    valid_rows = [r for r in valid_rows if str(r[args.label_field]) in labels]
    pad = read_manifest_ids(tok, meta)["pad"]
    train, valid = (encode(part, tok, args, labels, pad, pad_left=spec.pad_left) for part in (train_rows, valid_rows))
    model = SequenceClassifier(encoder, len(labels), position=spec.summary_position)
    tricks = Tricks.from_args(args)
    groups = tricks.prepare(model, encoder, model.classifier, adapter_sites=spec.adapter_sites, weight_decay=0.01)
    steps = args.epochs * math.ceil(len(train_rows) / args.batch_size)
    cfg = load_config(None, [f"train.micro_batch_size={args.batch_size}", f"train.lr={args.lr}",
                             "train.weight_decay=0.01", "parallel.zero_stage=0", "train.precision=fp32"])
    engine = build_engine(model, build_optimizer(model, cfg.train, groups), cfg, dp_size=1)
    history = []
    g = torch.Generator().manual_seed(args.seed)
    step = 0
    engine.train()  # the checkpoint's model comes back in eval mode: dropout on from the first epoch
    for epoch in range(args.epochs):
        tricks.start_epoch(epoch)
        order = torch.randperm(len(train_rows), generator=g)
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            part = {k: v[order[i:i + args.batch_size]].to(engine.device) for k, v in train.items()}
            set_lr(engine, tricks.lr(step, steps, args.lr))
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
        write_output(args.out, model, result)
    return result


def _encode_texts(tok: Tokenizer, texts: list[str], max_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The family's template (T5: ``text </s>``; BART: ``<s> text </s>``), truncated and padded."""
    tok.enable_truncation(max_len)
    tok.enable_padding(pad_id=pad_id)
    enc = tok.encode_batch(texts)
    return torch.tensor([e.ids for e in enc]), torch.tensor([e.attention_mask for e in enc])


def finetune_seq2seq(args: FinetuneArgs) -> dict:
    """Text-to-text fine-tuning of T5 / BART: teacher-forced cross-entropy on the target tokens;
    held-out exact match of greedy generations after every epoch."""
    from glm_dist.models.generate import GenerationConfig, generate

    model, meta = load_checkpoint_model(args.checkpoint)
    start_role = family(meta["model_family"]).decoder_start
    if "seq2seq" not in family(meta["model_family"]).finetune:
        able = [f for f, spec in FAMILIES.items() if "seq2seq" in spec.finetune]
        raise FinetuneError(f"--task seq2seq needs a {' or '.join(able)} checkpoint; {args.checkpoint} is a "
                            f"{meta['model_family']!r} checkpoint")
    tok = checkpoint_tokenizer(args.checkpoint)
    ids = read_manifest_ids(tok, meta)
    start = ids[start_role]
    rows = read_rows(args.train)
    train_rows, valid_rows = (rows, read_rows(args.valid)) if args.valid else split_rows(rows, args.valid_per_mille)

    def tensors(part: list[dict]) -> dict[str, torch.Tensor]:
        x, mask = _encode_texts(tok, [args.prefix + str(r[args.text_field]) for r in part], args.max_len, ids["pad"])
        y, ymask = _encode_texts(tok, [str(r[args.label_field]) for r in part], args.max_len, ids["pad"])
        labels = y.masked_fill(ymask == 0, -100)
        dec = torch.cat([torch.full((len(part), 1), start), y[:, :-1]], dim=1)
        return {"input_ids": x, "attention_mask": mask, "labels": labels, "decoder_input_ids": dec}

    train, valid = tensors(train_rows), tensors(valid_rows)
    tricks = Tricks.from_args(args)
    groups = tricks.prepare(model, model, None, adapter_sites=family(meta["model_family"]).adapter_sites,
                            weight_decay=0.01)
    steps = args.epochs * math.ceil(len(train_rows) / args.batch_size)
    cfg = load_config(None, [f"train.micro_batch_size={args.batch_size}", f"train.lr={args.lr}",
                             "train.weight_decay=0.01", "parallel.zero_stage=0", "train.precision=fp32"])
    engine = build_engine(model, build_optimizer(model, cfg.train, groups), cfg, dp_size=1)
    g, step, history = torch.Generator().manual_seed(args.seed), 0, []
    for epoch in range(args.epochs):
        tricks.start_epoch(epoch)
        order = torch.randperm(len(train_rows), generator=g)
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            part = {k: v[order[i:i + args.batch_size]].to(engine.device) for k, v in train.items()}
            set_lr(engine, tricks.lr(step, steps, args.lr))
            logits = engine(part["input_ids"], part["decoder_input_ids"],
                            attention_mask=part["attention_mask"])["logits"]
            loss = F.cross_entropy(logits.float().flatten(0, 1), part["labels"].flatten(), ignore_index=-100)
            engine.backward(loss)
            engine.step()
            step += 1
        model.eval()
        out = generate(model, valid["input_ids"], GenerationConfig(max_new_tokens=valid["labels"].shape[1] + 2,
                                                                   eos_id=ids["eos"]),
                       attention_mask=valid["attention_mask"], start_id=start)
        model.train()
        predictions = [tok.decode(row.tolist()).strip() for row in out[:, 1:]]
        scores = text_scores(predictions, [str(r[args.label_field]).strip() for r in valid_rows])
        history.append({"epoch": epoch + 1, **{f"valid_{k}": v for k, v in scores.items()}})
    targets = [str(r[args.label_field]) for r in valid_rows]
    majority = max(targets.count(t) for t in set(targets)) / len(targets)
    answers = {str(r[args.label_field]).strip() for r in train_rows}  # the task's output space
    result = {"checkpoint": args.checkpoint, "task": "seq2seq", "train_examples": len(train_rows),
              "valid_examples": len(valid_rows), "majority_baseline": majority,
              **{k: v for k, v in history[-1].items() if k.startswith("valid_")}, "history": history,
              "valid_in_output_space": sum(p in answers for p in predictions) / len(predictions),
              "examples": [{"input": r[args.text_field][:80], "target": r[args.label_field], "output": p}
                           for r, p in zip(valid_rows[:3], predictions[:3])]}
    if args.out:
        write_output(args.out, model, result)
    return result


def read_manifest_ids(tok: Tokenizer, meta: dict) -> dict:
    """Special-token ids by role, from the tokenizer profile the checkpoint was trained with."""
    from data_pipeline.tokenize.profiles import special_ids

    return special_ids(tok, meta["config"]["data"]["tokenizer_profile"])
