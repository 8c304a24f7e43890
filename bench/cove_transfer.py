"""GloVe-only vs [GloVe; CoVe] inputs for one task model, from a CoVe checkpoint (McCann et al. 2017's
comparison), on a real task: a WordNet synset's gloss -> its lexicographer file (45 classes,
data_pipeline/tasks/wordnet_gloss.py). The same biLSTM + max-pool classifier (glm_dist/transfer/cove.py)
reads either input; the best epoch on the validation rows is scored on the test rows, over several
seeds (mean +- std). Prints one JSON object.

    python bench/cove_transfer.py --checkpoint runs/cove-tiny-cpu/checkpoints/step_00001000 \\
        --train 8000 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tokenizers import Tokenizer

from data_pipeline.tasks.wordnet_gloss import gloss_rows, majority_accuracy, sample
from glm_dist.eval.run import load_checkpoint_model
from glm_dist.transfer.cove import CoVeEmbedder, fit_classifier


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--train", type=int, default=8000, help="training rows (a fixed sample; 0: all ~90k)")
    p.add_argument("--valid", type=int, default=1000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64, help="the classifier's LSTM cells per direction")
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    model, meta = load_checkpoint_model(args.checkpoint)
    tok = Tokenizer.from_file(str(Path(args.checkpoint) / "tokenizer.json"))
    splits = gloss_rows()
    train, valid, test = (
        sample(splits[s], n) for s, n in (("train", args.train), ("valid", args.valid), ("test", args.test))
    )
    labels = sorted({r["label"] for r in splits["train"]})
    unk = tok.token_to_id("<unk>")
    words = [i for r in test for i in tok.encode(r["text"]).ids]
    result = {
        "checkpoint": str(args.checkpoint),
        "step": meta["step"],
        "task": "wordnet gloss -> lexicographer file",
        "classes": len(labels),
        "rows": {"train": len(train), "valid": len(valid), "test": len(test)},
        "majority": majority_accuracy(train, test),
        "test_unknown_word_rate": words.count(unk) / len(words),
    }
    for name, embedder in (("glove", CoVeEmbedder(model, glove_only=True)), ("glove+cove", CoVeEmbedder(model))):
        start, runs = time.time(), []
        for seed in args.seeds:
            runs.append(
                fit_classifier(
                    embedder,
                    tok,
                    train,
                    valid,
                    test,
                    labels=labels,
                    seed=seed,
                    epochs=args.epochs,
                    d_hidden=args.hidden,
                    lr=args.lr,
                )["test_accuracy"]
            )
        result[name] = {
            "mean": statistics.mean(runs),
            "std": statistics.stdev(runs) if len(runs) > 1 else 0.0,
            "runs": runs,
            "input_dim": embedder.dim,
            "seconds": round(time.time() - start, 1),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
