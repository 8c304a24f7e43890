"""BERT's token-level heads through ``glm finetune``: span extraction (``--task span``, SQuAD) and
token classification (``--task tokens``), from any encoder family and XLNet.

- span: rows in SQuAD's format (``context``, ``question``, ``answers: {text, answer_start}``); the
  input is the family's pair template of question and context (the longer cut first), the
  answer's first and last tokens are found from the tokenizer's character offsets, and the loss is
  the mean cross-entropy of the start and end positions. A prediction is the context span i <= j
  (at most ``MAX_ANSWER_TOKENS``) of the highest start + end score, cut from the context by its
  offsets; scored with SQuAD's exact match and F1 (``eval/squad.py``).
- tokens: rows of ``tokens`` (words) and ``tags`` (a tag per word; null: not scored); each word's
  first sub-token carries its label (BERT's NER recipe), scored by word accuracy.

XLNet's inputs are padded on the left (its <cls> ends the sequence), the others' on the right.
Both train through ``glm finetune``'s one loop (transfer/loop.py) with its tricks, the head as the top
layer group; ``SpanTask`` and ``TaggingTask`` are what differs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tokenizers import Encoding, Tokenizer
from torch import nn

from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.eval.squad import squad_scores
from glm_dist.models.heads import SpanExtractor, TokenClassifier
from glm_dist.ops.cross_entropy import IGNORE_INDEX
from glm_dist.transfer.files import finish, read_manifest_ids, train_valid_rows
from glm_dist.transfer.inputs import batch_on, batch_rows, pad_ids
from glm_dist.transfer.loop import Batch, TensorRows, finetune_task
from glm_dist.transfer.options import FinetuneArgs, FinetuneError

MAX_ANSWER_TOKENS = 30
# each task's fields when --text-field / --pair-field / --label-field are not given
FIELDS = {
    "span": {"text_field": "context", "pair_field": "question", "label_field": "answers"},
    "tokens": {"text_field": "tokens", "label_field": "tags"},
}


def fields(args: FinetuneArgs) -> dict[str, str]:
    """The row fields a token-level task reads: the options given, else the task's defaults."""
    given = {k: getattr(args, k) for k in FIELDS[args.task]}
    return {k: v if v != getattr(FinetuneArgs, k) else FIELDS[args.task][k] for k, v in given.items()}


def pad(encodings: list[Encoding], pad_id: int, *, left: bool) -> tuple[dict[str, torch.Tensor], list[int]]:
    """Input tensors of a batch of (unpadded) encodings, and each row's shift (left padding moves its tokens)."""
    ids, mask = pad_ids([e.ids for e in encodings], pad_id, left=left)
    types, _ = pad_ids([e.type_ids for e in encodings], 0, left=left)
    shifts = ids.shape[1] - mask.sum(1) if left else torch.zeros(len(encodings), dtype=torch.long)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}, shifts.tolist()


def answer_tokens(enc: Encoding, start_char: int, end_char: int) -> tuple[int, int] | None:
    """First and last context tokens of the character span [start_char, end_char), None if the
    truncation cut any of it off."""
    inside = [
        i
        for i, (seq, (a, b)) in enumerate(zip(enc.sequence_ids, enc.offsets))
        if seq == 1 and b > start_char and a < end_char
    ]
    if not inside or enc.offsets[inside[-1]][1] < end_char:
        return None
    return inside[0], inside[-1]


def span_data(rows: list[dict], tok: Tokenizer, f: dict, *, max_len: int, pad_id: int, left: bool) -> dict:
    """Tensors of the rows with the answer's token positions (-100 when it was cut off), and what
    predictions need: each row's context token offsets and its context."""
    tok.no_padding()
    tok.enable_truncation(max_len, strategy="longest_first")
    encodings = tok.encode_batch([(str(r[f["pair_field"]]), str(r[f["text_field"]])) for r in rows])
    data, shifts = pad(encodings, pad_id, left=left)
    positions, contexts = torch.full((len(rows), 2), IGNORE_INDEX), []
    for i, (row, enc, shift) in enumerate(zip(rows, encodings, shifts)):
        answers = row[f["label_field"]]
        start = answers["answer_start"][0]
        found = answer_tokens(enc, start, start + len(answers["text"][0]))
        if found is not None:
            positions[i] = torch.tensor(found) + shift
        contexts.append({shift + j: off for j, (seq, off) in enumerate(zip(enc.sequence_ids, enc.offsets)) if seq == 1})
    return {
        **data,
        "positions": positions,
        "contexts": contexts,
        "texts": [str(r[f["text_field"]]) for r in rows],
        "golds": [list(r[f["label_field"]]["text"]) for r in rows],
    }


def best_span(start: torch.Tensor, end: torch.Tensor, offsets: dict[int, tuple[int, int]], text: str) -> str:
    """The context span i <= j < i + MAX_ANSWER_TOKENS with the highest start[i] + end[j]."""
    where = torch.tensor(sorted(offsets))
    scores = start[where, None] + end[None, where]  # (C, C)
    span = torch.triu(torch.ones_like(scores, dtype=torch.bool)) & ~torch.triu(
        torch.ones_like(scores, dtype=torch.bool), diagonal=MAX_ANSWER_TOKENS
    )
    best = int(scores.masked_fill(~span, float("-inf")).flatten().argmax())
    i, j = (int(where[k]) for k in divmod(best, len(where)))
    return text[offsets[i][0] : offsets[j][1]].strip()


def token_data(
    rows: list[dict], tok: Tokenizer, f: dict, tags: dict[str, int], *, max_len: int, pad_id: int, left: bool
) -> dict:
    """Tensors of the rows; each word's first sub-token labelled with its tag (the rest -100)."""
    tok.no_padding()
    tok.enable_truncation(max_len)
    encodings = tok.encode_batch([[str(w) for w in r[f["text_field"]]] for r in rows], is_pretokenized=True)
    data, shifts = pad(encodings, pad_id, left=left)
    labels = torch.full_like(data["input_ids"], IGNORE_INDEX)
    for i, (row, enc, shift) in enumerate(zip(rows, encodings, shifts)):
        seen = set()
        for j, word in enumerate(enc.word_ids):
            tag = row[f["label_field"]][word] if word is not None and word not in seen else None
            seen.add(word)
            if tag is not None and str(tag) in tags:
                labels[i, shift + j] = tags[str(tag)]
    return {**data, "labels": labels}


def _inputs(part: dict) -> dict:
    return {k: part[k] for k in ("input_ids", "token_type_ids", "attention_mask")}


@torch.no_grad()
def predict_spans(model: SpanExtractor, data: dict, batch_size: int) -> list[str]:
    device, out = next(model.parameters()).device, []
    for rows in batch_rows(len(data["input_ids"]), batch_size):
        start, end = model(**batch_on(_inputs(data), device, rows))
        out += [
            best_span(s.float().cpu(), e.float().cpu(), offsets, text)
            for s, e, offsets, text in zip(start, end, data["contexts"][rows], data["texts"][rows])
        ]
    return out


@dataclass
class SpanTask(TensorRows):
    """Span extraction for the loop: the mean cross-entropy of the answer's start and end."""

    valid: dict | None = None  # span_data of the held-out rows
    batch_size: int = 16

    @property
    def backbone(self) -> nn.Module:
        return self.model.encoder

    @property
    def head(self) -> nn.Module:
        return self.model.start_end

    def loss(self, engine: nn.Module, batch: Batch) -> torch.Tensor:
        start, end = engine(**_inputs(batch))
        first, last = batch["positions"].unbind(1)
        return (F.cross_entropy(start.float(), first) + F.cross_entropy(end.float(), last)) / 2

    def evaluate(self, engine: nn.Module) -> dict:
        predictions = predict_spans(self.model, self.valid, self.batch_size)
        return {f"valid_{k}": v for k, v in squad_scores(predictions, self.valid["golds"]).items()}


def train_span(
    encoder: nn.Module,
    tok: Tokenizer,
    train_rows: list[dict],
    valid_rows: list[dict],
    args: FinetuneArgs,
    *,
    pad_id: int,
    pad_left: bool,
    adapter_sites: tuple[str, ...] = (),
) -> dict:
    f = fields(args)
    train, valid = (
        span_data(rows, tok, f, max_len=args.max_len, pad_id=pad_id, left=pad_left) for rows in (train_rows, valid_rows)
    )
    keep = (train["positions"] >= 0).all(1)  # answers the truncation cut off are not trained on
    train = {k: v[keep] for k, v in train.items() if isinstance(v, torch.Tensor)}
    model = SpanExtractor(encoder)
    history, settings = finetune_task(
        SpanTask(model, train, adapter_sites, valid=valid, batch_size=args.batch_size), args
    )
    first_word = [t.split()[0] if t.split() else "" for t in valid["texts"]]
    longest = [max(t.split(), key=len) if t.split() else "" for t in valid["texts"]]
    baselines = {
        f"{name}: {k}": v
        for name, guess in (("first word", first_word), ("longest word", longest))
        for k, v in squad_scores(guess, valid["golds"]).items()
    }
    return {
        "task": "span",
        "train_examples": int(keep.sum()),
        "train_answers_cut_off": int((~keep).sum()),
        "valid_examples": len(valid_rows),
        **history[-1],
        "baselines": baselines,
        "history": history,
        "settings": settings,
        "model": model,
    }


@torch.no_grad()
def token_accuracy(model: TokenClassifier, data: dict, batch_size: int) -> float:
    device, right, total = next(model.parameters()).device, 0, 0
    for rows in batch_rows(len(data["input_ids"]), batch_size):
        logits = model(**batch_on(_inputs(data), device, rows))
        labels = data["labels"][rows].to(device)
        scored = labels != IGNORE_INDEX
        right += int((logits.argmax(-1)[scored] == labels[scored]).sum())
        total += int(scored.sum())
    return right / max(1, total)


@dataclass
class TaggingTask(TensorRows):
    """Token classification for the loop: cross-entropy over each word's first sub-token."""

    valid: Batch | None = None  # token_data of the held-out rows
    batch_size: int = 16

    @property
    def backbone(self) -> nn.Module:
        return self.model.encoder

    @property
    def head(self) -> nn.Module:
        return self.model.classifier

    def loss(self, engine: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(
            engine(**_inputs(batch)).float().flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX
        )

    def evaluate(self, engine: nn.Module) -> dict:
        return {"valid_accuracy": token_accuracy(self.model, self.valid, self.batch_size)}


def train_tokens(
    encoder: nn.Module,
    tok: Tokenizer,
    train_rows: list[dict],
    valid_rows: list[dict],
    args: FinetuneArgs,
    *,
    pad_id: int,
    pad_left: bool,
    adapter_sites: tuple[str, ...] = (),
) -> dict:
    f = fields(args)
    counts = Counter(str(t) for r in train_rows for t in r[f["label_field"]] if t is not None)
    tags = {t: i for i, t in enumerate(sorted(counts))}
    train, valid = (
        token_data(rows, tok, f, tags, max_len=args.max_len, pad_id=pad_id, left=pad_left)
        for rows in (train_rows, valid_rows)
    )
    model = TokenClassifier(encoder, len(tags))
    history, settings = finetune_task(
        TaggingTask(model, train, adapter_sites, valid=valid, batch_size=args.batch_size), args
    )
    majority = tags[counts.most_common(1)[0][0]]
    scored = valid["labels"] != IGNORE_INDEX
    return {
        "task": "tokens",
        "tags": list(tags),
        "train_examples": len(train_rows),
        "valid_examples": len(valid_rows),
        "valid_words": int(scored.sum()),
        **history[-1],
        "majority_baseline": float((valid["labels"][scored] == majority).float().mean()),
        "history": history,
        "settings": settings,
        "model": model,
    }


TRAINERS = {"span": train_span, "tokens": train_tokens}


def finetune_token_level(
    args: FinetuneArgs, encoder: nn.Module, meta: dict, *, pad_left: bool, adapter_sites: tuple[str, ...] = ()
) -> dict:
    """``glm finetune --task span|tokens`` on a loaded encoder."""
    tok = checkpoint_tokenizer(args.checkpoint)
    train_rows, valid_rows = train_valid_rows(args)
    _check_rows(train_rows + valid_rows, fields(args), args)
    return finish(
        args,
        TRAINERS[args.task](
            encoder,
            tok,
            train_rows,
            valid_rows,
            args,
            adapter_sites=adapter_sites,
            pad_id=read_manifest_ids(tok, meta)["pad"],
            pad_left=pad_left,
        ),
    )


def _check_rows(rows: list[dict], f: dict, args: FinetuneArgs) -> None:
    for row in rows:
        missing = [v for v in f.values() if v not in row]
        if missing:
            raise FinetuneError(
                f"--task {args.task}: row {str(row)[:160]} has no field {missing[0]!r}; set "
                f"--text-field / --pair-field / --label-field"
            )
        label = row[f["label_field"]]
        if args.task == "span" and not (isinstance(label, dict) and label.get("text") and label.get("answer_start")):
            raise FinetuneError(
                f"--task span: row {row.get('id', str(row)[:80])}: {f['label_field']!r} must be "
                f"{{'text': [...], 'answer_start': [...]}} (SQuAD's format)"
            )
        if args.task == "tokens" and not (isinstance(label, list) and len(label) == len(row[f["text_field"]])):
            raise FinetuneError(
                f"--task tokens: row {row.get('id', str(row)[:80])}: {f['label_field']!r} must list "
                f"one tag per word of {f['text_field']!r}"
            )
