"""``glm finetune``: a task head on a pretrained checkpoint -- classification, GPT's input transformations,
spans, token tags or text-to-text -- with the transfer tricks as options (``glm_dist/transfer/``)."""

from __future__ import annotations

import argparse
import json

from glm_dist.transfer.finetune import finetune
from glm_dist.transfer.recipes import finetune_args

HELP = "classification from an encoder or GPT checkpoint, or text-to-text (JSONL/CSV)"
TASKS = ["classify", "seq2seq", "entailment", "similarity", "multiple_choice", "span", "tokens"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--train", required=True, help="JSONL or CSV rows with text (and text pair) and label")
    p.add_argument("--valid", help="held-out rows (default: 20%% of --train by row hash)")
    p.add_argument(
        "--task",
        choices=TASKS,
        default="classify",
        help="classify: [CLS] / extract token + one matrix; seq2seq: text -> target text (t5, bart); "
        "entailment, similarity, multiple_choice: GPT's input transformations; span: SQuAD-style answer "
        "spans (context, question, answers; exact match and F1); tokens: a tag per word (tokens, tags) -- "
        "both from encoders and XLNet",
    )
    p.add_argument(
        "--recipe", help="named option values (gpt: GPT's fine-tuning recipe) or a YAML file; options given here win"
    )
    p.add_argument("--prefix", help="seq2seq: a T5-style task prefix, e.g. 'summarize: '")
    p.add_argument("--text-field", help="the text, premise or multiple-choice context field (default text)")
    p.add_argument("--pair-field", help="second text of a pair task (e.g. text_b)")
    p.add_argument("--choices-field", help="multiple_choice: the field listing the candidates (default choices)")
    p.add_argument(
        "--label-field",
        help="the label (classify), answer index (multiple_choice) or target text (seq2seq) field (default label)",
    )
    _training_options(p)
    p.add_argument("--seed", type=int)
    p.add_argument("--out", help="write finetune.json and the classifier weights here")


def _training_options(p: argparse.ArgumentParser) -> None:
    """The optimisation options and the transfer tricks (unset: the recipe's value, else the default named)."""
    p.add_argument("--epochs", type=int, help="default 3")
    p.add_argument("--lr", type=float, help="default 5e-5")
    p.add_argument("--batch-size", type=int, help="default 16")
    p.add_argument("--max-len", type=int, help="default 128")
    p.add_argument("--lm-weight", type=float, help="GPT: weight of the auxiliary LM loss (default 0.5)")
    p.add_argument("--warmup", type=float, help="--schedule linear: warmup as a fraction of the steps (default 0.1)")
    p.add_argument("--dropout", type=float, help="GPT: dropout of the model and the classifier")
    p.add_argument(
        "--schedule",
        choices=["linear", "stlr"],
        help="linear: warmup over --warmup then decay to 0 "
        "(default); stlr: ULMFiT's slanted triangular rates (cut_frac 0.1, ratio 32)",
    )
    p.add_argument(
        "--discriminative-lr",
        type=float,
        help="ULMFiT: each layer group learns at the rate of the one above / this factor (2.6); default off",
    )
    p.add_argument(
        "--gradual-unfreezing",
        action="store_true",
        default=None,
        help="ULMFiT: train the top layer group first, one more group each epoch",
    )
    p.add_argument(
        "--adapters",
        type=int,
        help="Houlsby adapters of this bottleneck size (e.g. 64) after every "
        "transformer block's attention and FFN; the pretrained weights frozen but the layer norms",
    )
    p.add_argument("--bptt", type=int, help="AWD-LSTM: tokens per window of a long document (BPT3C, default 70)")
    p.add_argument(
        "--drop-mult",
        type=float,
        help="AWD-LSTM: the classifier's dropouts are the LM's times this (fastai's drop_mult; default 1)",
    )


def run(args: argparse.Namespace) -> int:
    result = finetune(finetune_args({k: v for k, v in vars(args).items() if k != "command"}))
    print(json.dumps(result, indent=2))
    return 0
