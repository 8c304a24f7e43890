"""``glm export-hf``: a checkpoint as a folder that transformers' ``from_pretrained`` loads."""

from __future__ import annotations

import argparse

from glm_dist.hf.export import export_checkpoint

HELP = "write a folder transformers' from_pretrained loads"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)


def run(args: argparse.Namespace) -> int:
    print(export_checkpoint(args.checkpoint, args.out))
    return 0
