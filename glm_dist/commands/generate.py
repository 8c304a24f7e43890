"""``glm generate``: continue a prompt from a checkpoint, greedy, beam or sampled, streamed to stdout."""

from __future__ import annotations

import argparse
import math
import sys

from glm_dist.errors import GlmError
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


# option -> (what it must be, the test), checked before the checkpoint is read
CHECKS = {
    "max_new_tokens": ("an integer >= 1", lambda v: v >= 1),
    "num_beams": ("an integer >= 1", lambda v: v >= 1),
    "length_penalty": ("a finite number", math.isfinite),
    "temperature": ("a number > 0 (greedy decoding is --strategy greedy)", lambda v: math.isfinite(v) and v > 0),
    "top_k": ("an integer >= 0 (0: all tokens)", lambda v: v >= 0),
    "top_p": ("a number in (0, 1] (1: off)", lambda v: 0 < v <= 1),
}


def check_options(args: argparse.Namespace) -> None:
    for name, (what, ok) in CHECKS.items():
        if not ok(getattr(args, name)):
            raise GlmError(f"--{name.replace('_', '-')} {getattr(args, name)} must be {what}")


def run(args: argparse.Namespace) -> int:
    check_options(args)
    options = {k: v for k, v in vars(args).items() if k not in ("command", "checkpoint", "prompt")}
    generate_to(sys.stdout, args.checkpoint, args.prompt, **options)
    return 0
