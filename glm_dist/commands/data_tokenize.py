"""``glm data tokenize``: train or load the tokenizer and write the set the config's objective trains on --
token shards, or a translation pair set (``pairs`` objectives) or co-occurrence counts (``counts`` objectives)."""

from __future__ import annotations

import argparse
import json

from data_pipeline.tokenize.pairs import PairSpec, prepare_pairs
from data_pipeline.tokenize.prepare import prepare_shards, prepare_tokenizer
from glm_dist.commands.data_cooccur import write_counts
from glm_dist.commands.shared import config_args, folder_lock, tokenize_spec
from glm_dist.config.checks import check_locations
from glm_dist.config.loader import load_config
from glm_dist.objectives.registry import get_objective

HELP = "train/load the tokenizer and write token shards"


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--task", type=int, help="run only this encoding task (one input file; SLURM array index)")
    p.add_argument(
        "--prepare-only", action="store_true", help="only write the tokenizer and print the number of encoding tasks"
    )


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    check_locations(cfg)
    with folder_lock(cfg.data.shards_dir, "glm data tokenize", "data.shards_dir", task=args.task):
        objective = get_objective(cfg.objective.name)
        if objective.pairs:
            return _pairs(cfg.data)
        if objective.counts:
            return write_counts(cfg, stage=None, task=args.task)
        return _tokens(cfg.data, task=args.task, prepare_only=args.prepare_only)


def _tokens(d, *, task: int | None, prepare_only: bool) -> int:
    spec = tokenize_spec(d)
    if prepare_only:
        print(prepare_tokenizer(**spec))
        return 0
    manifest = prepare_shards(workers=d.encode_workers, task=task, **spec)
    if manifest is not None:
        print(json.dumps({s: len(v) for s, v in manifest["splits"].items()}))
    return 0


def _pairs(d) -> int:
    manifest = prepare_pairs(
        PairSpec(
            source=d.source,
            out_dir=d.shards_dir,
            vectors=d.vectors,
            vocab_size=d.vocab_size,
            target_vocab_size=d.target_vocab_size,
            shard_max_bytes=d.shard_max_bytes,
            labelled_pairs=d.labelled_pairs,
        )
    )
    print(json.dumps({"splits": {s: len(v) for s, v in manifest["splits"].items()}, **manifest["source"]}))
    return 0
