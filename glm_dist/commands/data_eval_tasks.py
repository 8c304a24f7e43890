"""``glm data eval-tasks``: the offline lm-eval tasks (data, card, YAML), one folder each, for
``glm eval --include-path``."""

from __future__ import annotations

import argparse

from data_pipeline.tokenize.prepare import read_documents
from glm_dist.commands.shared import names
from glm_dist.eval.tasks import build_tasks

HELP = "build the offline lm-eval tasks (data, card, YAML) into DIR/<task>/"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="the folder to give glm eval --include-path")
    p.add_argument("--tasks", help="comma-separated (default: all of glm_dist/eval/tasks)")
    p.add_argument(
        "--source", help="pydoc_cloze, doc_summary: a JSONL corpus of {id, text} documents (default: the embedded one)"
    )
    p.add_argument("--wordnet-dir", help="wordnet_mc, wordnet_qa: WordNet's data.* files (default /usr/share/wordnet)")


def run(args: argparse.Namespace) -> int:
    documents = read_documents(args.source) if args.source else None
    tasks = names(args.tasks) if args.tasks else None
    for name, folder in build_tasks(args.out, tasks, documents=documents, wordnet_dir=args.wordnet_dir).items():
        print(f"{name}: {folder}")
    return 0
