"""``glm features``: contextual features of texts (ELMo's biLM layers) from a checkpoint, as ``.npz``."""

from __future__ import annotations

import argparse
import json

from glm_dist.transfer.features import export_features, read_texts

HELP = "contextual features of texts (ELMo's biLM layers) from a checkpoint, as .npz"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (…/checkpoints/step_N)")
    p.add_argument("--input", required=True, help="a text file (one text per line) or JSONL rows (--text-field)")
    p.add_argument("--out", required=True, help="the .npz to write: arrays '0', '1', ... in input order")
    p.add_argument("--text-field", default="text")
    p.add_argument("--batch-size", type=int, default=32)


def run(args: argparse.Namespace) -> int:
    features = export_features(
        args.checkpoint, read_texts(args.input, text_field=args.text_field), out=args.out, batch_size=args.batch_size
    )
    print(json.dumps({"out": args.out, "texts": len(features), "first_shape": list(features[0].shape)}))
    return 0
