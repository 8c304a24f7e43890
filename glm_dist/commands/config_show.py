"""``glm config show``: the resolved config, validated for a world size, as YAML (or the DeepSpeed JSON)."""

from __future__ import annotations

import argparse
import json
import os

import yaml

from glm_dist.commands.shared import config_args
from glm_dist.config.checks import validate
from glm_dist.config.deepspeed_json import deepspeed_config
from glm_dist.config.loader import load_config, to_dict

HELP = "print the resolved config (or the DeepSpeed JSON)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p, required=False)
    p.add_argument("--deepspeed", action="store_true", help="print the generated DeepSpeed JSON")
    p.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    validate(cfg, world_size=args.world_size)
    if args.deepspeed:
        print(json.dumps(deepspeed_config(cfg, dp_size=args.world_size), indent=2))
    else:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0
