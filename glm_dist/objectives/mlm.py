"""Masked language modelling (BERT, RoBERTa; ALBERT's n-gram variant; whole-word masking).

Select ``mask_rate`` of the maskable tokens; of those, ``mask_frac`` become the mask token,
``random_frac`` a random token, the rest stay (BERT: 15%, 80/10/10). Masks are drawn at load time
from an RNG keyed by (seed, epoch, sample), so they change every epoch (RoBERTa's dynamic masking)
and replay exactly on resume. Special tokens are never selected.

Selection works on *words* when ``word_starts`` is given (whole-word masking: a word's pieces are
masked together) and on spans of ``1..max_ngram`` words with p(n) ∝ 1/n when ``max_ngram > 1``
(ALBERT). The number of selected tokens is ``round(mask_rate * maskable)`` (google-research/bert's
``num_to_predict``), so the rate holds for every sequence, not just on average.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from glm_dist.objectives.base import (
    IGNORE_INDEX,
    Objective,
    encoder_inputs,
    masked_positions,
    option,
    selected_nll,
    token_sums,
)
from glm_dist.objectives.packing import SentencePacker
from glm_dist.ops.cross_entropy import cross_entropy


@dataclass(frozen=True)
class MaskingOptions:
    """The keys of ``mlm``, ``mlm_nsp`` and ``sop`` under ``objective:`` (BERT's values by default)."""

    mask_rate: float = option(0.15, "fraction of the maskable tokens selected for prediction", bounds="(0, 1]")
    mask_frac: float = option(0.8, "of the selected, fraction replaced by the mask token", bounds="[0, 1]")
    random_frac: float = option(0.1, "of the selected, fraction replaced by a random token", bounds="[0, 1]")
    whole_word: bool = option(False, "mask all pieces of a word together")
    max_ngram: int = option(1, "mask spans of up to n words, p(n) ~ 1/n (ALBERT: 3; sop implies 3)", bounds="[1, 64]")


def ngram_probabilities(max_ngram: int) -> np.ndarray:
    """p(n) ∝ 1/n for n = 1..max_ngram (ALBERT: 6/11, 3/11, 2/11)."""
    p = 1.0 / np.arange(1, max_ngram + 1)
    return p / p.sum()


def draw_ngram_lengths(rng: np.random.Generator, count: int, max_ngram: int) -> np.ndarray:
    """``count`` span lengths in words, p(n) ∝ 1/n."""
    return rng.choice(max_ngram, size=count, p=ngram_probabilities(max_ngram)) + 1


def word_spans(tokens: np.ndarray, maskable: np.ndarray, word_starts: np.ndarray | None) -> list[tuple[int, int]]:
    """[start, end) of each maskable word (a single token each without ``word_starts``)."""
    idx = np.flatnonzero(maskable)
    if word_starts is None or idx.size == 0:
        return [(int(i), int(i) + 1) for i in idx]
    starts = word_starts[tokens[idx]] | np.concatenate([[True], np.diff(idx) != 1])
    cut = np.flatnonzero(starts)
    ends = np.concatenate([cut[1:], [idx.size]])
    return [(int(idx[a]), int(idx[b - 1]) + 1) for a, b in zip(cut, ends)]


def select_positions(
    tokens: np.ndarray,
    maskable: np.ndarray,
    rng: np.random.Generator,
    cfg: MaskingOptions,
    word_starts: np.ndarray | None = None,
) -> np.ndarray:
    """Boolean mask of the positions to predict."""
    selected = np.zeros(len(tokens), dtype=bool)
    budget = int(round(cfg.mask_rate * int(maskable.sum())))
    if not cfg.whole_word and cfg.max_ngram == 1:  # token-level: one vectorised draw
        selected[rng.choice(np.flatnonzero(maskable), size=budget, replace=False)] = True
        return selected
    words = word_spans(tokens, maskable, word_starts if (cfg.whole_word or cfg.max_ngram > 1) else None)
    if not words or budget == 0:
        return selected
    order = rng.permutation(len(words))
    ngrams = draw_ngram_lengths(rng, len(words), cfg.max_ngram)
    count = 0
    for w, n in zip(order, ngrams):
        if count >= budget:
            break
        # A span is the longest contiguous run of up to n words from word w (it never crosses a
        # special token) and may not overshoot the budget (BERT's rule).
        span_words = [words[w]]
        for nxt in words[w + 1 : w + n]:
            if nxt[0] != span_words[-1][1]:
                break
            span_words.append(nxt)
        start, end = span_words[0][0], span_words[-1][1]
        while end - start + count > budget and len(span_words) > 1:
            span_words = span_words[:-1]
            end = span_words[-1][1]
        if end - start + count > budget or selected[start:end].any():
            continue
        selected[start:end] = True
        count += end - start
    return selected


def mask_tokens(
    tokens: np.ndarray,
    rng: np.random.Generator,
    *,
    cfg: MaskingOptions,
    mask_id: int,
    vocab_size: int,
    special_ids: np.ndarray,
    word_starts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels): labels hold the original token at selected positions, -100 elsewhere."""
    maskable = ~np.isin(tokens, special_ids)
    selected = select_positions(tokens, maskable, rng, cfg, word_starts)
    labels = np.where(selected, tokens, IGNORE_INDEX)
    inputs = tokens.copy()
    u = rng.random(len(tokens))
    to_mask = selected & (u < cfg.mask_frac)
    to_random = selected & (u >= cfg.mask_frac) & (u < cfg.mask_frac + cfg.random_frac)
    inputs[to_mask] = mask_id
    inputs[to_random] = _random_ordinary(rng, int(to_random.sum()), vocab_size, special_ids)
    return inputs, labels


def _random_ordinary(rng: np.random.Generator, n: int, vocab_size: int, special_ids: np.ndarray) -> np.ndarray:
    """``n`` random token ids that are not special tokens."""
    out = rng.integers(0, vocab_size, size=n)
    bad = np.isin(out, special_ids)
    while bad.any():
        out[bad] = rng.integers(0, vocab_size, size=int(bad.sum()))
        bad = np.isin(out, special_ids)
    return out


def encoder_stage_inputs(batch: dict[str, torch.Tensor], device) -> tuple:
    """A pipelined encoder's first stage takes (ids, attention mask) -- all ones when nothing was
    padded, so every micro batch sends the same tensors between stages -- and its last the labels."""
    ids, labels = batch["input_ids"].to(device), batch["labels"].to(device)
    mask = batch.get("attention_mask")
    return (ids, torch.ones_like(ids) if mask is None else mask.to(device).long()), labels


class MaskedLM(Objective):
    """RoBERTa: FULL-SENTENCES units ``[CLS] ... [SEP]``, dynamically masked."""

    Options = MaskingOptions

    def builder(self, *, seq_len, vocab, opts, stream=0):
        return SentencePacker(seq_len - 2, doc_sep=vocab.id("sep"))

    def masking(self, opts) -> MaskingOptions:
        return opts

    def needs_word_starts(self, opts) -> bool:
        return opts.whole_word

    def sample(self, unit, rng, *, vocab, opts):
        tokens, _ = unit
        framed = np.concatenate([[vocab.id("cls")], tokens, [vocab.id("sep")]])
        inputs, labels = mask_tokens(
            framed,
            rng,
            cfg=self.masking(opts),
            mask_id=vocab.id("mask"),
            vocab_size=vocab.size,
            special_ids=vocab.specials,
            word_starts=vocab.word_starts,
        )
        return {"input_ids": inputs, "labels": labels, **masked_positions(labels)}

    def loss(self, model, batch, *, metrics):
        out = model(**encoder_inputs(batch))
        nll, count, picked, targets = selected_nll(out["logits"], batch)
        return nll / count.clamp(min=1), token_sums(nll, picked, targets) if metrics else {}

    def stage_inputs(self, batch, device):
        return encoder_stage_inputs(batch, device)

    def stage_loss(self, logits, labels):
        """Mean over the masked positions; the others cost a chunk's log-sum-exp and get no gradient."""
        return cross_entropy(logits, labels, reduction="mean")


MLM = MaskedLM(name="mlm", salt=1001, padded=True)
