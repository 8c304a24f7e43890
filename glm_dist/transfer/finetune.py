"""``glm finetune`` for GPT checkpoints (GPT-1, GPT-2, GPT-3): GPT's recipe.

Rows (JSONL / CSV) are turned into the task's input transformation (``inputs``), three new tokens
(start, delimiter, extract) are added to the vocabulary, W_y reads the extract token's final state
and the LM loss on the same inputs is added with weight ``--lm-weight`` (``heads``). The schedule
is a linear warmup over ``--warmup`` of the steps, then linear decay to 0 (or ``tricks``' options) (``--recipe gpt``:
lr 6.25e-5, batch 32, 3 epochs, warmup 0.2%, dropout 0.1, lambda 0.5). Held-out accuracy after every
epoch, beside the majority baseline.
"""
from __future__ import annotations


import torch
from tokenizers import Tokenizer

from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.config.loader import load_config
from glm_dist.parallel.engine import build_engine, set_lr
from glm_dist.train.finetune import FinetuneArgs, FinetuneError, read_rows, split_rows, write_output
from glm_dist.families.registry import family
from glm_dist.train.optim import build_optimizer
from glm_dist.transfer.heads import GPTTransfer, add_token_embeddings, set_dropout
from glm_dist.transfer.inputs import SpecialTokens, pack, transform
from glm_dist.transfer.tricks import Tricks


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


def encode_rows(rows: list[dict], tok: Tokenizer, args: FinetuneArgs, labels: dict[str, int],
                sp: SpecialTokens, max_len: int) -> tuple[list[list[list[int]]], torch.Tensor]:
    """Rows -> each example's token sequences (the task's input transformation) and the labels."""
    fields = _fields(args)
    examples, targets = [], []
    for row in rows:
        missing = [f for f in fields if f not in row]
        if missing:
            raise FinetuneError(f"row {str(row)[:200]} has no field {missing[0]!r}; set --text-field / "
                                "--pair-field / --choices-field / --label-field")
        enc = lambda text: tok.encode(str(text), add_special_tokens=False).ids  # noqa: E731
        second = None if args.task == "classify" else [enc(c) for c in row[fields[1]]] \
            if args.task == "multiple_choice" else enc(row[fields[1]])
        examples.append(transform(args.task, enc(row[args.text_field]), second, sp, max_len))
        targets.append(_label(row, args, labels))
    return examples, torch.tensor(targets)


@torch.no_grad()
def accuracy(model, examples: list, labels: torch.Tensor, batch_size: int, device) -> float:
    model.eval()
    right = 0
    for i in range(0, len(examples), batch_size):
        batch = {k: v.to(device) for k, v in pack(examples[i:i + batch_size]).items()}
        right += int((model(**batch)["logits"].argmax(-1).cpu() == labels[i:i + batch_size]).sum())
    model.train()
    return right / max(1, len(examples))


def finetune_gpt(args: FinetuneArgs, lm: torch.nn.Module, meta: dict) -> dict:
    """Fine-tune a GPT checkpoint's model (already loaded) on ``args.train``; the result as a dict."""
    tok = checkpoint_tokenizer(args.checkpoint)
    rows = read_rows(args.train)
    train_rows, valid_rows = (rows, read_rows(args.valid)) if args.valid else split_rows(rows, args.valid_per_mille)
    labels = label_index(train_rows, args)
    if args.task != "multiple_choice":
        valid_rows = [r for r in valid_rows if str(r[args.label_field]) in labels]
    sp = SpecialTokens.after(add_token_embeddings(lm, 3))
    max_len = min(args.max_len, lm.cfg.context_length)
    train, y_train = encode_rows(train_rows, tok, args, labels, sp, max_len)
    valid, y_valid = encode_rows(valid_rows, tok, args, labels, sp, max_len)
    if args.dropout is not None:
        set_dropout(lm, args.dropout)
    model = GPTTransfer(lm, args.task, len(labels), dropout=0.1 if args.dropout is None else args.dropout)
    tricks = Tricks.from_args(args)
    groups = tricks.prepare(model, lm, model.classifier, adapter_sites=family(meta["model_family"]).adapter_sites,
                            weight_decay=0.01)
    history = _train(model, args, (train, y_train), (valid, y_valid), tricks, groups)
    counts = torch.bincount(y_valid, minlength=len(labels))
    result = {"checkpoint": args.checkpoint, "task": args.task, "labels": list(labels),
              "train_examples": len(train_rows), "valid_examples": len(valid_rows),
              "majority_baseline": counts.max().item() / max(1, len(valid_rows)),
              "valid_accuracy": history[-1]["valid_accuracy"], "history": history,
              "settings": {**{k: getattr(args, k) for k in ("lr", "batch_size", "epochs", "warmup", "lm_weight",
                                                            "dropout", "max_len")}, **tricks.describe()}}
    if args.out:
        write_output(args.out, model, result)
    return result


def _train(model: GPTTransfer, args: FinetuneArgs, train: tuple, valid: tuple, tricks: Tricks,
           groups: list[dict]) -> list[dict]:
    (examples, labels), (v_examples, v_labels) = train, valid
    steps = args.epochs * max(1, len(examples) // args.batch_size)
    cfg = load_config(None, [f"train.micro_batch_size={args.batch_size}", f"train.lr={args.lr}",
                             "train.weight_decay=0.01", "train.beta2=0.999", "parallel.zero_stage=0",
                             "train.precision=fp32"])
    engine = build_engine(model, build_optimizer(model, cfg.train, groups), cfg, dp_size=1)
    g, step, history = torch.Generator().manual_seed(args.seed), 0, []
    engine.train()  # the checkpoint's model comes back in eval mode: dropout on from the first epoch
    for epoch in range(args.epochs):
        tricks.start_epoch(epoch)
        order = torch.randperm(len(examples), generator=g).tolist()
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            part = order[i:i + args.batch_size]
            batch = {k: v.to(engine.device) for k, v in pack([examples[j] for j in part]).items()}
            set_lr(engine, tricks.lr(step, steps, args.lr))
            loss = model.loss(engine(**batch), labels[part].to(engine.device), args.lm_weight)
            engine.backward(loss)
            engine.step()
            step += 1
        history.append({"epoch": epoch + 1, "loss": loss.item(),
                        "valid_accuracy": accuracy(engine, v_examples, v_labels, args.batch_size, engine.device)})
    history[-1]["train_accuracy"] = accuracy(engine, examples, labels, args.batch_size, engine.device)  # once: costly
    return history
