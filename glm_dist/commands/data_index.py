"""``glm data index``: the index file of every shard of a shard set that lacks one (random access for shard
sets built before index files existed)."""

from __future__ import annotations

import argparse
import json
import sys

from data_pipeline.executors.cpus import available_cpus
from glm_dist.commands.shared import folder_lock
from glm_dist.data.index import index_shard_set

HELP = (
    "write the index file (documents' token counts, sentence lengths, byte offsets) of every shard of DIR that "
    "lacks one: random access for shard sets built before index files existed"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="the shard set (data.shards_dir): a path or an fsspec URL")
    p.add_argument("--workers", type=int, default=0, help="processes indexing shards (0: one per core)")


def run(args: argparse.Namespace) -> int:
    with folder_lock(args.dir, "glm data index", "DIR"):
        result = index_shard_set(args.dir, workers=args.workers or available_cpus())
    print(json.dumps(result))
    if result["failed"]:  # recorded in the manifest (index_error) and skipped by the loader: said, not silent
        print(
            f"glm data index: {len(result['failed'])} shard(s) could not be indexed (their reasons under "
            f"'failed' above): training skips them; rebuild them with glm data tokenize",
            file=sys.stderr,
        )
        return 2
    return 0
