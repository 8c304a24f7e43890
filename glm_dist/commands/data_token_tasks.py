"""``glm data token-tasks``: WordNet's example sentences as ``glm finetune`` rows for the span and the
token-tagging heads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_pipeline.wordnet import FILES
from data_pipeline.wordnet_heads import pos_rows, span_rows
from glm_dist.commands.shared import in_range
from glm_dist.errors import GlmError

HELP = (
    "WordNet example sentences as glm finetune rows: DIR/wordnet_span.jsonl (--task span) and "
    "DIR/wordnet_pos.jsonl (--task tokens)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True)
    p.add_argument("--wordnet-dir", help="WordNet's data.* files (default /usr/share/wordnet)")
    p.add_argument("--parts", default="nvar", help="synsets of these parts of speech (n v a r)")
    p.add_argument("--limit", type=int, help="rows per file (default: all)")


def run(args: argparse.Namespace) -> int:
    if not args.parts or set(args.parts) - set(FILES):
        raise GlmError(f"--parts {args.parts!r}: letters of {''.join(FILES)} (noun, verb, adjective, adverb)")
    in_range("--limit", args.limit, 1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for name, build in (("wordnet_span", span_rows), ("wordnet_pos", pos_rows)):
        rows = build(args.wordnet_dir, parts=args.parts, limit=args.limit)
        Path(args.out, f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{name}: {len(rows)} rows -> {Path(args.out, name + '.jsonl')}")
    return 0
