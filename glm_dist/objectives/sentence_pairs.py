"""Segment pairs for BERT's next-sentence prediction and ALBERT's sentence-order prediction
(google-research/bert and albert create_pretraining_data.py).

From each document, sentences are accumulated into a chunk up to a target length (the maximum,
or with probability 0.1 a random shorter one); the chunk is split at a random sentence into A and
B. NSP: with p = 0.5, B is replaced by text from another document (label 1 = random). SOP: A and B
are always consecutive; with p = 0.5 they are swapped (label 1 = swapped). The pair is trimmed to
fit, from a random end, and framed as ``[CLS] A [SEP] B [SEP]`` with segment ids 0/1.

The "other document" is the previous one in the (shuffled) stream; the builder keeps it, and the
document it is working through, as its state -- so a resumed run builds the same pairs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Iterator

import numpy as np
import torch.nn.functional as F

from glm_dist.objectives.base import Objective, encoder_inputs, masked_positions, selected_nll, token_report, token_sums
from glm_dist.objectives.mlm import MaskingOptions, mask_tokens

SHORT_SEQ_PROB = 0.1


class PairBuilder:
    def __init__(self, seq_len: int, *, cls_id: int, sep_id: int, swap: bool = False):
        """``swap``: ALBERT's sentence order (B always follows A, swapped half the time); else
        BERT's next sentence (B from another document half the time)."""
        self.max_tokens, self.cls_id, self.sep_id, self.swap = seq_len - 3, cls_id, sep_id, swap
        self.current: list[np.ndarray] = []  # sentences of the document being consumed, not yet used
        self.whole: list[np.ndarray] = []  # all sentences of that document
        self.previous: list[np.ndarray] = []  # all sentences of the document before it
        self.count = 0  # pairs built (the sample id of the next pair)

    def units(self, docs: Iterable, rng_for: Callable[[int], np.random.Generator]) -> Iterator[dict]:
        docs = iter(docs)
        while True:
            while len(self.current) < 2 and not (self.current and not self.swap):
                self._next_doc(next(docs))
            rng = rng_for(self.count)
            self.count += 1
            yield self._pair(rng)

    def _next_doc(self, doc) -> None:
        if self.whole:
            self.previous = self.whole
        bounds = list(doc.sentences) + [len(doc.tokens)]
        self.whole = [doc.tokens[a:b].astype(np.int64) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        self.current = list(self.whole)

    def _pair(self, rng: np.random.Generator) -> dict:
        target = self.max_tokens if rng.random() >= SHORT_SEQ_PROB else int(rng.integers(2, self.max_tokens + 1))
        chunk, size = [], 0
        while self.current and (size < target or len(chunk) < 2):
            chunk.append(self.current.pop(0))
            size += len(chunk[-1])
            if size >= target and len(chunk) >= 2:
                break
        a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
        a, b = np.concatenate(chunk[:a_end]), chunk[a_end:]
        label = 0
        if not self.swap and (not b or rng.random() < 0.5) and self.previous:
            label = 1
            self.current = chunk[a_end:] + self.current  # put the unused sentences back
            other = np.concatenate(self.previous)
            start = int(rng.integers(0, max(1, len(other) - 1)))
            b = [other[start : start + max(1, target - len(a))]]
        b = np.concatenate(b) if b else np.zeros(0, dtype=np.int64)
        if self.swap and rng.random() < 0.5:
            a, b, label = b, a, 1
        a, b = _truncate_pair(a, b, self.max_tokens, rng)
        tokens = np.concatenate([[self.cls_id], a, [self.sep_id], b, [self.sep_id]])
        segments = np.concatenate([np.zeros(len(a) + 2, dtype=np.int64), np.ones(len(b) + 1, dtype=np.int64)])
        return {"tokens": tokens, "token_type_ids": segments, "sentence_label": label}

    def state_dict(self) -> dict:
        return {
            "current": [s.tolist() for s in self.current],
            "whole": [s.tolist() for s in self.whole],
            "previous": [s.tolist() for s in self.previous],
            "count": self.count,
        }

    def load_state_dict(self, state: dict) -> None:
        self.current = [np.asarray(s, dtype=np.int64) for s in state["current"]]
        self.whole = [np.asarray(s, dtype=np.int64) for s in state["whole"]]
        self.previous = [np.asarray(s, dtype=np.int64) for s in state["previous"]]
        self.count = state["count"]


def _truncate_pair(
    a: np.ndarray, b: np.ndarray, max_tokens: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Trim the longer segment, one token at a time from a random end, until both fit."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        trimmed = longer[1:] if rng.random() < 0.5 else longer[:-1]
        a, b = (trimmed, b) if longer is a else (a, trimmed)
    return a, b


class SentencePairMLM(Objective):
    """Masked LM over segment pairs plus the pair task: mean MLM + mean NSP (BERT) or SOP (ALBERT,
    with n-gram masking, n <= 3)."""

    Options = MaskingOptions
    swap: bool = False  # set by the subclass: sentence order (SOP) instead of next sentence (NSP)
    min_ngram: int = 1

    def builder(self, *, seq_len, vocab, opts, stream=0):
        return PairBuilder(seq_len, cls_id=vocab.id("cls"), sep_id=vocab.id("sep"), swap=self.swap)

    def masking(self, opts) -> MaskingOptions:
        return replace(opts, max_ngram=max(opts.max_ngram, self.min_ngram))

    def needs_word_starts(self, opts) -> bool:
        return opts.whole_word

    def sample(self, unit, rng, *, vocab, opts):
        inputs, labels = mask_tokens(
            unit["tokens"],
            rng,
            cfg=self.masking(opts),
            mask_id=vocab.id("mask"),
            vocab_size=vocab.size,
            special_ids=vocab.specials,
            word_starts=vocab.word_starts,
        )
        return {
            "input_ids": inputs,
            "labels": labels,
            "token_type_ids": unit["token_type_ids"],
            "sentence_label": np.asarray(unit["sentence_label"]),
            **masked_positions(labels),
        }

    def loss(self, model, batch, *, metrics):
        out = model(**encoder_inputs(batch))
        nll, count, picked, targets = selected_nll(out["logits"], batch)
        sentence = F.cross_entropy(out["sentence_logits"].float(), batch["sentence_label"])
        loss = nll / count.clamp(min=1) + sentence
        if not metrics:
            return loss, {}
        n = len(batch["sentence_label"])
        return loss, {
            **token_sums(nll, picked, targets),
            "sentence_nll": sentence.item() * n,
            "sentences": n,
            "sentence_correct": int((out["sentence_logits"].argmax(-1) == batch["sentence_label"]).sum()),
        }

    def report(self, totals):
        out = {**token_report(totals), "accuracy": totals["correct"] / max(totals["targets"], 1)}
        out["sentence_loss"] = totals["sentence_nll"] / max(totals["sentences"], 1)
        out["sentence_accuracy"] = totals["sentence_correct"] / max(totals["sentences"], 1)
        return out


PAIR_SUMS = ("nll", "targets", "correct", "sentence_nll", "sentences", "sentence_correct")
