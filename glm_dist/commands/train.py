"""``glm train``: one writer per ``train.out_dir``. Rank 0 takes the folder's lock and every rank learns the
outcome from it (a refusal ends every rank with exit code 2, rank 0 printing the line)."""

from __future__ import annotations

import argparse
import json

from glm_common.outlock import FolderLocked, acquire, held
from glm_dist import commands
from glm_dist.commands.shared import config_args
from glm_dist.config.loader import load_config
from glm_dist.parallel import comm
from glm_dist.parallel.distributed import init_distributed
from glm_dist.train.loop import train

HELP = "train (one process, torchrun, deepspeed or srun)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_args(parser)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    commands.run_dir = cfg.train.out_dir
    dist = init_distributed(timeout_s=cfg.parallel.collective_timeout_s)
    lock, refusal = None, None
    if dist.is_main:
        try:
            lock = acquire(cfg.train.out_dir, command="glm train", key="train.out_dir")
        except Exception as err:  # noqa: BLE001 -- every rank must hear of it, or they wait for rank 0
            refusal = str(err) if isinstance(err, FolderLocked) else f"cannot lock train.out_dir: {err}"
    refusal = comm.first_error(refusal)
    if refusal is not None:
        if dist.is_main:
            raise FolderLocked(refusal)
        return 2
    with held(lock):
        summary = train(cfg)
    if dist.is_main:
        print(json.dumps(summary, indent=2))
    return 0
