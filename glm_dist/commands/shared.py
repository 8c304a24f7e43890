"""What several commands share: the ``-c CONFIG key=value ...`` arguments, a data command's output lock,
comma-separated lists."""

from __future__ import annotations

import argparse
import contextlib

from glm_common.outlock import output_lock
from glm_dist.errors import GlmError


def config_args(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument("-c", "--config", required=required, help="YAML config file (with optional base:)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override config keys, e.g. train.lr=3e-4")


def folder_lock(folder: str, command: str, key: str, *, task: int | None = None):
    """The output lock of a data command, unless it runs one task of a SLURM array (``--task``): the
    array's tasks share the folder, each writing only its own files."""
    return contextlib.nullcontext() if task is not None else output_lock(folder, command=command, key=key)


def in_range(option: str, value: float | None, low: float, high: float | None = None) -> None:
    """Refuse an option's count outside [low, high] in one line (unset: None passes): a negative count
    was read as a slice (all but the last N), a zero one wrote empty files."""
    if value is not None and not (low <= value and (high is None or value <= high)):
        raise GlmError(f"{option} {value} must be >= {low}" + (f" and <= {high}" if high is not None else ""))


def names(text: str) -> list[str]:
    """``"a,b,"`` -> ``["a", "b"]``: a comma-separated option's values."""
    return [name for name in text.split(",") if name]


def tokenize_spec(data) -> dict:
    """The tokenizer and shard settings of a config's ``data`` section, as data_pipeline's tokenizing steps
    (``prepare_tokenizer``, ``prepare_shards``, the co-occurrence counts' first step) take them."""
    return dict(
        source=data.source,
        out_dir=data.shards_dir,
        tokenizer=data.tokenizer,
        profile=data.tokenizer_profile,
        vocab_size=data.vocab_size,
        val_per_mille=data.val_per_mille,
        shard_max_bytes=data.shard_max_bytes,
        text_field=data.text_field,
        max_record_mb=data.max_record_mb,
    )
