"""``glm data docstring-task``: the built-in classification task (a docstring -> its module) as JSONL rows."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_pipeline.embedded import docstring_task

HELP = "write the built-in classification task (docstring -> module) as JSONL"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True)


def run(args: argparse.Namespace) -> int:
    rows = docstring_task()
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} rows -> {args.out}")
    return 0
