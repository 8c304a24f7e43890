"""What ``glm finetune`` reads and writes, the same for every task kind: rows from JSONL or CSV, the
held-out split, the checkpoint's special-token ids, and the fine-tuned weights with the result."""

from __future__ import annotations

import csv
import hashlib
import json
import logging
from pathlib import Path

import fsspec
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from data_pipeline.tokenize.profiles import special_ids
from glm_dist.transfer.options import FinetuneArgs, FinetuneError

log = logging.getLogger(__name__)


def read_rows(path: str) -> list[dict]:
    """JSONL (.jsonl / .json, optionally compressed) or CSV with a header row; a malformed row
    stops with its file and line."""
    n = 0
    try:
        with fsspec.open(path, "rt", compression="infer", encoding="utf-8") as f:
            if ".csv" in path:
                return list(csv.DictReader(f))
            rows = []
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
    """Training and held-out rows: a row is held out by its content's hash (the same row always
    lands on the same side, whatever the file's order)."""
    held = [
        int(hashlib.sha1(json.dumps(r, sort_keys=True).encode()).hexdigest()[:8], 16) % 1000 < per_mille for r in rows
    ]
    return [r for r, h in zip(rows, held) if not h], [r for r, h in zip(rows, held) if h]


def train_valid_rows(args: FinetuneArgs, fields: tuple[str, ...] = ()) -> tuple[list[dict], list[dict]]:
    """``--train``'s rows and ``--valid``'s, or ``--valid-per-mille`` of ``--train`` held out. Every row
    holds each of ``fields`` (a row without one stops with its file and row), and there is a row to score."""
    rows = read_rows(args.train)
    check_fields(rows, fields, args.train, label_field=args.label_field)
    if args.valid:
        valid = read_rows(args.valid)
        check_fields(valid, fields, args.valid, label_field=args.label_field)
        if not valid:
            raise FinetuneError(f"--valid {args.valid} has no rows: give held-out rows, or leave --valid out")
        return rows, valid
    train, valid = split_rows(rows, args.valid_per_mille)
    if not valid:
        raise FinetuneError(
            f"none of --train {args.train}'s {len(rows)} rows is held out (~{args.valid_per_mille} per thousand): "
            "give more rows or a --valid file"
        )
    return train, valid


def check_fields(rows: list[dict], fields: tuple[str, ...], path: str, *, label_field: str) -> None:
    """Each row holds each field, and its label is a string or a number: a null label would become a class
    named "None", a boolean one a class apart from 1 (labels are compared as strings)."""
    for n, row in enumerate(rows, 1):
        for field in fields:
            value = row.get(field)
            if value is None:
                raise FinetuneError(f"{path}: row {n} has no {field!r} (fields: {sorted(row)[:10]})")
            if field == label_field and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
                raise FinetuneError(
                    f"{path}: row {n}: label {value!r} is a {type(value).__name__}; a label is a string or a number"
                )


def known_label_rows(valid_rows: list[dict], labels: dict[str, int], args: FinetuneArgs) -> list[dict]:
    """The held-out rows whose label the training rows have (the model has no output for another): the
    others are named in a warning, and none left is an error rather than an accuracy of nothing."""
    kept = [r for r in valid_rows if str(r[args.label_field]) in labels]
    if len(kept) < len(valid_rows):
        unseen = sorted({str(r[args.label_field]) for r in valid_rows} - set(labels))
        log.warning(
            "%d of %d held-out rows not scored: their labels %s are not among the training rows' %s",
            len(valid_rows) - len(kept),
            len(valid_rows),
            unseen[:10],
            list(labels)[:10],
        )
    if not kept:
        raise FinetuneError(
            f"no held-out row has a label of the training rows ({list(labels)[:10]}): "
            f"check --label-field and the files {args.train} / {args.valid or '(held out of --train)'}"
        )
    return kept


def read_manifest_ids(tok: Tokenizer, meta: dict) -> dict:
    """Special-token ids by role, from the tokenizer profile the checkpoint was trained with."""
    return special_ids(tok, meta["config"]["data"]["tokenizer_profile"])


def write_output(out: str, model: torch.nn.Module, result: dict) -> None:
    """``glm finetune --out DIR``: the fine-tuned weights as ``model.safetensors`` (data, never code;
    tied weights stored once each name) and the result -- labels or tags included -- as
    ``finetune.json``."""
    Path(out).mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()},
        str(Path(out, "model.safetensors")),
    )
    Path(out, "finetune.json").write_text(json.dumps(result, indent=2))


def finish(args: FinetuneArgs, result: dict) -> dict:
    """A task kind's result (its trained model under ``model``) as ``glm finetune`` gives it: the
    checkpoint's name first, and with ``--out`` the weights and the result written."""
    model = result.pop("model")
    result = {"checkpoint": args.checkpoint, **result}
    if args.out:
        write_output(args.out, model, result)
    return result
