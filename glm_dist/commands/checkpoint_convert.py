"""``glm checkpoint convert``: a format-2 checkpoint (DeepSpeed's files + ``universal/``) as format 3."""

from __future__ import annotations

import argparse
import json

from glm_dist.checkpoint.convert import convert

HELP = "a format-2 checkpoint (DeepSpeed's files + universal/) as format 3"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True, help="a new folder")


def run(args: argparse.Namespace) -> int:
    print(json.dumps(convert(args.checkpoint, args.out)))
    return 0
