"""``glm finetune``'s options, one dataclass every task kind reads (its ``--recipe`` files set the same
names, ``transfer/recipes``), and the error for rows or a checkpoint it cannot use."""

from __future__ import annotations

from dataclasses import dataclass

from glm_dist.errors import GlmError


@dataclass
class FinetuneArgs:
    checkpoint: str
    train: str
    valid: str | None = None
    # classify | seq2seq (T5, BART) | entailment | similarity | multiple_choice (GPT) | span | tokens
    task: str = "classify"
    prefix: str = ""  # seq2seq: T5-style task prefix, e.g. "summarize: "
    text_field: str = "text"
    pair_field: str | None = None
    label_field: str = "label"  # seq2seq: the target text field
    choices_field: str = "choices"  # multiple_choice: the list of candidate answers
    epochs: int = 3
    lr: float = 5e-5
    batch_size: int = 16
    max_len: int = 128
    valid_per_mille: int = 200  # held out by row hash when no --valid file
    seed: int = 0
    out: str | None = None
    lm_weight: float = 0.5  # GPT: lambda of the auxiliary LM loss, L3 = L2 + lambda * L1
    warmup: float = 0.1  # --schedule linear: warmup as a fraction of the steps (linear decay after it)
    dropout: float | None = None  # GPT: every dropout of the model and the classifier's (None: 0.1 on W_y only)
    # every family (glm_dist/transfer/tricks.py): ULMFiT's three tricks and Houlsby adapters
    schedule: str = "linear"  # linear: warmup over --warmup, then decay to 0 | stlr: slanted triangular
    discriminative_lr: float = 0.0  # layer group l's lr = group l+1's / this (ULMFiT: 2.6); 0: one rate
    gradual_unfreezing: bool = False  # the top layer group trains first, one more group each epoch
    adapters: int = 0  # bottleneck adapters of this size after each block's attention and FFN, the rest frozen
    bptt: int = 70  # AWD-LSTM (ULMFiT's BPT3C): a document is read in windows of this many tokens
    drop_mult: float = 1.0  # AWD-LSTM: the classifier's dropouts are the LM's times this (fastai's drop_mult)


class FinetuneError(GlmError, ValueError):
    """Rows or a checkpoint that glm finetune cannot use."""
