"""``glm data vectors``: the word vectors of a checkpoint (its model's ``vectors()``, GloVe's) in GloVe's text
format, ``word v1 v2 ...`` per line."""

from __future__ import annotations

import argparse
import json

from data_pipeline.cooccur.vectors import write_text
from data_pipeline.tokenize.word import vocabulary
from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.errors import GlmError
from glm_dist.eval.run import load_checkpoint_model

HELP = "a word-vector checkpoint (GloVe) as a text file: 'word v1 v2 ...' per line"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (…/checkpoints/step_N)")
    p.add_argument("--out", required=True, help="the text file to write")


def run(args: argparse.Namespace) -> int:
    model, meta = load_checkpoint_model(args.checkpoint)
    if not hasattr(model, "vectors"):
        raise GlmError(f"checkpoint {args.checkpoint} is a {meta['model_family']} model, which has no word vectors")
    tok = checkpoint_tokenizer(args.checkpoint)
    words = [w if i not in tok.get_added_tokens_decoder() else "" for i, w in enumerate(vocabulary(tok))]
    vectors = model.vectors().float().numpy()
    written = write_text(args.out, words[: len(vectors)], vectors[: len(words)])
    print(json.dumps({"out": args.out, "words": written, "dim": vectors.shape[1]}))
    return 0
