"""``glm data mix -c CONFIG``: GPT-3's Table 2.2 for a run's ``data.mixture`` before it trains.

Per source: the tokens its training split holds, its weight (share of the training tokens), the
tokens ``train.max_steps`` x global batch x ``data.seq_len`` will draw from it and the epochs that
makes -- counted by the blended index itself (data/mixture.py), so the table is what the run does,
not an estimate. A source the run repeats more than ``data.max_epochs_warning`` times gets a warning
line (Muennighoff et al. 2023). Missing shard sets are tokenized first, as ``glm train`` would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TextIO

from glm_common.config_yaml import ConfigError, source_of
from glm_dist.config.checks import seq_len
from glm_dist.config.loader import load_config
from glm_dist.config.schema import Config
from glm_dist.data.mixture import build_missing, repeat_warnings, resolve_mixture

COLUMNS = ("source", "tokens", "weight", "drawn", "epochs")


def global_batch(cfg: Config, world_size: int = 1) -> int:
    """Sequences per optimizer step: train.global_batch_size, else micro x accumulation x data-parallel size."""
    if cfg.train.global_batch_size:
        return cfg.train.global_batch_size
    dp = max(1, world_size // (cfg.parallel.pipeline_stages * cfg.parallel.tensor_parallel))
    return cfg.train.micro_batch_size * cfg.train.grad_accum_steps * dp


def mix_table(cfg: Config, *, world_size: int = 1) -> list[dict]:
    """One row per source (``COLUMNS`` plus ``shards_dir``), the shard sets built where missing."""
    if not cfg.data.mixture:
        raise ConfigError(
            "data.mixture is empty: glm data mix tabulates a mixture of sources (the config trains on "
            f"the one data.shards_dir={cfg.data.shards_dir})"
        )
    build_missing(cfg.data)
    length, samples = seq_len(cfg), cfg.train.max_steps * global_batch(cfg, world_size)
    mixture = resolve_mixture(cfg.data, total_tokens=samples * length, where=source_of(cfg, "data.mixture"))
    drawn = mixture.drawn(samples, length)
    return [
        {
            "source": name,
            "shards_dir": root,
            "tokens": size,
            "weight": weight,
            "drawn": drawn[name]["tokens"],
            "epochs": drawn[name]["epochs"],
        }
        for name, root, size, weight in zip(mixture.names, mixture.shards_dirs, mixture.sizes, mixture.weights)
    ]


def warnings(rows: list[dict], limit: float) -> list[str]:
    return [f"warning: {line}" for line in repeat_warnings({r["source"]: r["epochs"] for r in rows}, limit)]


def print_table(rows: list[dict], *, limit: float, out: TextIO | None = None) -> None:
    """GPT-3's columns: source, tokens available, weight in the mix, tokens drawn, epochs elapsed."""
    out = out or sys.stdout
    width = max(len("source"), *(len(r["source"]) for r in rows))
    out.write(f"{'source':<{width}}  {'tokens':>15}  {'weight':>7}  {'drawn':>15}  {'epochs':>7}\n")
    for r in rows:
        out.write(
            f"{r['source']:<{width}}  {r['tokens']:>15,}  {r['weight']:>7.1%}  {r['drawn']:>15,}  {r['epochs']:>7.2f}\n"
        )
    total = sum(r["drawn"] for r in rows)
    out.write(f"{'total':<{width}}  {sum(r['tokens'] for r in rows):>15,}  {1:>7.1%}  {total:>15,}\n")
    for line in warnings(rows, limit):
        out.write(line + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", required=True, help="YAML config file (with optional base:)")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="override config keys, e.g. train.max_steps=1000"
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=int(os.environ.get("WORLD_SIZE", 1)),
        help="processes of the run (its data-parallel size sets the global batch)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    rows = mix_table(cfg, world_size=args.world_size)
    if args.json:
        print(json.dumps({"rows": rows, "warnings": warnings(rows, cfg.data.max_epochs_warning)}, indent=2))
    else:
        print_table(rows, limit=cfg.data.max_epochs_warning)
    return 0
