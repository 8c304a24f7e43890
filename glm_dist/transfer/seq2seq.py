"""Text-to-text fine-tuning of T5 / BART (``--task seq2seq``): teacher-forced cross-entropy on the
target tokens; held-out exact match (and the other text scores) of greedy generations after every
epoch, and how many of them are answers the task has (its output space)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from glm_dist.models.generate import GenerationConfig, generate
from glm_dist.eval.text_metrics import text_scores
from glm_dist.ops.cross_entropy import IGNORE_INDEX
from glm_dist.transfer.loop import Batch, TensorRows, finetune_task
from glm_dist.transfer.options import FinetuneArgs


def encode_texts(tok: Tokenizer, texts: list[str], max_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The family's template (T5: ``text </s>``; BART: ``<s> text </s>``), truncated and padded."""
    tok.enable_truncation(max_len)
    tok.enable_padding(pad_id=pad_id)
    enc = tok.encode_batch(texts)
    return torch.tensor([e.ids for e in enc]), torch.tensor([e.attention_mask for e in enc])


def encode_pairs(rows: list[dict], tok: Tokenizer, args: FinetuneArgs, *, pad_id: int, start: int) -> Batch:
    """Inputs (``--prefix`` + text), targets (ignored at padding) and the decoder's inputs: the targets
    shifted right behind the family's decoder start token."""
    x, mask = encode_texts(tok, [args.prefix + str(r[args.text_field]) for r in rows], args.max_len, pad_id)
    y, ymask = encode_texts(tok, [str(r[args.label_field]) for r in rows], args.max_len, pad_id)
    labels = y.masked_fill(ymask == 0, IGNORE_INDEX)
    dec = torch.cat([torch.full((len(rows), 1), start), y[:, :-1]], dim=1)
    return {"input_ids": x, "attention_mask": mask, "labels": labels, "decoder_input_ids": dec}


@dataclass
class TextToText(TensorRows):
    """The whole encoder-decoder trains (its own LM head is the top layer group); ``predictions``
    holds the latest epoch's generations for ``valid``."""

    valid: Batch | None = None
    targets: list[str] = field(default_factory=list)
    tok: Tokenizer | None = None
    start: int = 0
    eos: int = 0
    predictions: list[str] = field(default_factory=list)
    head = None

    @property
    def backbone(self) -> nn.Module:
        return self.model

    def loss(self, engine: nn.Module, batch: Batch) -> torch.Tensor:
        logits = engine(batch["input_ids"], batch["decoder_input_ids"], attention_mask=batch["attention_mask"])[
            "logits"
        ]
        return F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)

    def evaluate(self, engine: nn.Module) -> dict:
        config = GenerationConfig(max_new_tokens=self.valid["labels"].shape[1] + 2, eos_id=self.eos)
        out = generate(
            self.model,
            self.valid["input_ids"],
            config,
            attention_mask=self.valid["attention_mask"],
            start_id=self.start,
        )
        self.predictions = [self.tok.decode(row.tolist()).strip() for row in out[:, 1:]]
        return {f"valid_{k}": v for k, v in text_scores(self.predictions, self.targets).items()}


def text_to_text(
    args: FinetuneArgs,
    model: nn.Module,
    tok: Tokenizer,
    train_rows: list[dict],
    valid_rows: list[dict],
    *,
    ids: dict,
    start_role: str,
    adapter_sites: tuple[str, ...],
) -> dict:
    """Train ``model`` on the rows; the result without the checkpoint's name, the model under ``model``."""
    start = ids[start_role]
    train, valid = (encode_pairs(part, tok, args, pad_id=ids["pad"], start=start) for part in (train_rows, valid_rows))
    task = TextToText(
        model,
        train,
        adapter_sites,
        valid=valid,
        tok=tok,
        start=start,
        eos=ids["eos"],
        targets=[str(r[args.label_field]).strip() for r in valid_rows],
    )
    history, _ = finetune_task(task, args)
    predictions = task.predictions
    targets = [str(r[args.label_field]) for r in valid_rows]
    majority = max(targets.count(t) for t in set(targets)) / len(targets)
    answers = {str(r[args.label_field]).strip() for r in train_rows}  # the task's output space
    return {
        "task": "seq2seq",
        "train_examples": len(train_rows),
        "valid_examples": len(valid_rows),
        "majority_baseline": majority,
        **{k: v for k, v in history[-1].items() if k.startswith("valid_")},
        "history": history,
        "valid_in_output_space": sum(p in answers for p in predictions) / len(predictions),
        "examples": [
            {"input": r[args.text_field][:80], "target": r[args.label_field], "output": p}
            for r, p in zip(valid_rows[:3], predictions[:3])
        ],
        "model": model,
    }
