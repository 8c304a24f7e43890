"""``glm data gettext``: translation pairs (English -> a language) from the gettext catalogs installed on the
machine, held out by message id."""

from __future__ import annotations

import argparse
import json

from data_pipeline.readers.gettext import catalog_paths
from data_pipeline.translation_pairs import write_pairs
from glm_dist.commands.shared import in_range

HELP = (
    "translation pairs (English -> a language) from gettext catalogs as train.jsonl / validation.jsonl (held "
    "out by message id) and stats.json"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="the pair folder (a translation config's data.source)")
    p.add_argument("--language", default="de", help="catalogs of this language (default de)")
    p.add_argument(
        "--roots",
        nargs="+",
        default=["/usr/share/locale"],
        help="folders searched for <language>/LC_MESSAGES/*.mo|po (default /usr/share/locale)",
    )
    p.add_argument("--val-per-mille", type=int, default=50, help="messages held out, per thousand")


def run(args: argparse.Namespace) -> int:
    in_range("--val-per-mille", args.val_per_mille, 1, 999)  # 0 or 1000: one of the two files empty
    catalogs = catalog_paths(args.language, args.roots)
    if not catalogs:
        raise FileNotFoundError(
            f"no {args.language} catalogs under {' '.join(args.roots)} (<language>/LC_MESSAGES/"
            f"*.mo): install the packages of launch/setup_env.sh's APT_PACKAGES"
        )
    print(json.dumps(write_pairs(catalogs, args.out, val_per_mille=args.val_per_mille)))
    return 0
