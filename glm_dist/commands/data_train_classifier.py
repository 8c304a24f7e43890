"""``glm data train-classifier``: GPT-3's quality classifier, curated text against raw crawl, saved for a
recipe's ``classifier.model``."""

from __future__ import annotations

import argparse
import json

from data_pipeline.filters.classifier import train
from data_pipeline.readers import load_texts

HELP = "train GPT-3's quality classifier (positives: curated text, negatives: crawl)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--positive", nargs="+", required=True, help="curated text: JSONL/Parquet/text/WARC paths or globs")
    p.add_argument("--negative", nargs="+", required=True, help="raw crawl: JSONL/Parquet/text/WARC paths or globs")
    p.add_argument("--out", required=True, help="model file (.npz) for the recipe's classifier.model")
    p.add_argument("--text-field", default="text")
    p.add_argument("--max-docs", type=int, default=100_000, help="per class")
    p.add_argument("--l2", type=float, default=0.1, help="L2 penalty (smaller: more confident scores)")


def run(args: argparse.Namespace) -> int:
    pos = load_texts(args.positive, args.text_field, args.max_docs)
    neg = load_texts(args.negative, args.text_field, args.max_docs)
    clf = train(pos, neg, l2=args.l2)
    clf.save(args.out)
    print(json.dumps(clf.info))
    return 0
