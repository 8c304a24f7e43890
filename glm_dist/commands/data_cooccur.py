"""``glm data cooccur``: GloVe's training set. Tokenize ``data.source`` into ``data.shards_dir``/tokens (word
profile), then count co-occurrences into count shards (map per token shard, reduce per word block)."""

from __future__ import annotations

import argparse
import json

from data_pipeline.cooccur.counts import CooccurSpec, prepare_cooccurrence
from glm_dist.commands.shared import config_args, folder_lock, tokenize_spec
from glm_dist.config.checks import check_locations
from glm_dist.config.loader import load_config
from glm_dist.data.shards import read_shard

HELP = (
    "GloVe: tokenize into DIR/tokens (word profile), then co-occurrence count shards in data.shards_dir "
    "(map per token shard, reduce per word block)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--stage", choices=["map", "reduce"], help="run only this stage (SLURM arrays; tokenize first)")
    p.add_argument("--task", type=int, help="with --stage: run only this task")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    check_locations(cfg)
    with folder_lock(cfg.data.shards_dir, "glm data cooccur", "data.shards_dir", task=args.task):
        return write_counts(cfg, stage=args.stage, task=args.task)


def write_counts(cfg, *, stage: str | None, task: int | None) -> int:
    """The count set (also what ``glm data tokenize`` writes for an objective that trains on counts)."""
    d = cfg.data
    counts = CooccurSpec(
        out_dir=d.shards_dir,
        reader=read_shard,
        window=d.cooccur_window,
        blocks=d.cooccur_blocks,
        shard_max_bytes=d.shard_max_bytes,
    )
    tokenize = {k: v for k, v in tokenize_spec(d).items() if k != "out_dir"}
    manifest = prepare_cooccurrence(counts, tokenize, workers=d.encode_workers, stage=stage, task=task)
    if manifest is not None:
        print(json.dumps(manifest["cooccurrence"]))
    return 0
