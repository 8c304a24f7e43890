"""``glm data tagging``: CVT's sequence-labelling tasks (python3-doc references, WordNet) and unlabelled
sentences, as a tagging shard set in ``data.shards_dir``."""

from __future__ import annotations

import argparse
import json

from data_pipeline.tasks.tagging_shards import build_tagging_set
from glm_dist.commands.shared import config_args, folder_lock, in_range
from glm_dist.config.loader import load_config

HELP = (
    "CVT: sequence-labelling tasks (python3-doc references, WordNet) and unlabelled sentences as a tagging "
    "shard set in data.shards_dir"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--tasks", default="pydoc_xref", help="comma-separated: pydoc_xref[,wordnet_pos]")
    p.add_argument("--labelled", type=int, help="labelled training sentences per task (default: all)")
    p.add_argument("--unlabelled", type=int, help="unlabelled sentences (default: all)")
    p.add_argument("--test", type=int, help="held-out sentences per task (default: all)")
    p.add_argument("--subset-seed", type=int, default=0, help="which labelled sentences --labelled keeps")


def run(args: argparse.Namespace) -> int:
    for option in ("labelled", "unlabelled", "test"):
        in_range(f"--{option}", getattr(args, option), 1)
    cfg = load_config(args.config, args.overrides)
    with folder_lock(cfg.data.shards_dir, "glm data tagging", "data.shards_dir"):  # as every data command's output
        manifest = build_tagging_set(
            cfg.data.shards_dir,
            tasks=args.tasks.split(","),
            labelled_limit=args.labelled,
            unlabelled_limit=args.unlabelled,
            test_limit=args.test,
            subset_seed=args.subset_seed,
            vocab_size=cfg.data.vocab_size,
        )
    print(json.dumps(manifest["tagging"]))
    return 0
