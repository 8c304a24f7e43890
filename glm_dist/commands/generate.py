"""``glm generate``: continue a prompt from a checkpoint, greedy, beam or sampled, streamed to stdout."""

from __future__ import annotations

import argparse
import sys

from glm_dist.eval.stream import generate_to

HELP = "continue a prompt from a checkpoint, streamed to stdout"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--strategy", choices=["greedy", "beam", "sample"], default="greedy")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-beams", type=int, default=4)
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="sample: keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample: nucleus mass (1.0: off)")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    options = {k: v for k, v in vars(args).items() if k not in ("command", "checkpoint", "prompt")}
    generate_to(sys.stdout, args.checkpoint, args.prompt, **options)
    return 0
