"""BART denoising: sentence permutation + text infilling (fairseq data/denoising_dataset.py; the
BART paper's setting by default: 30% of tokens in spans with Poisson(3) lengths, one mask per span,
zero-length spans insert a mask, all sentences permuted).

The decoder reconstructs the original text: labels are the unit as packed, decoder inputs are the
labels shifted right starting with EOS (BART's decoder_start_token_id).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from glm_common.config_bounds import TOKENS
from glm_dist.objectives.base import Objective, option, seq2seq_loss
from glm_dist.objectives.packing import SentencePacker


@dataclass(frozen=True)
class DenoisingOptions:
    """The keys of ``denoising`` under ``objective:`` (the BART paper's values by default)."""

    mask_ratio: float = option(0.3, "fraction of tokens masked by text infilling", bounds="[0, 1]")
    poisson_lambda: float = option(3.0, "mean span length of text infilling", bounds=f"(0, {TOKENS}]")
    permute_sentences: bool = option(True, "permute all sentences")
    random_ratio: float = option(
        0.0, "fraction of mask tokens replaced by random tokens (the authors' command: 0.1)", bounds="[0, 1]"
    )


def permute_sentences(tokens: np.ndarray, starts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    bounds = list(starts) + [len(tokens)]
    pieces = [tokens[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    return np.concatenate([pieces[i] for i in rng.permutation(len(pieces))]) if pieces else tokens


def span_lengths(num_to_mask: int, rng: np.random.Generator, lam: float) -> np.ndarray:
    """Poisson(lam) lengths until they cover ``num_to_mask`` tokens; the last one is trimmed."""
    lengths: list[int] = []
    total = 0
    while total < num_to_mask:
        draw = rng.poisson(lam, size=max(8, int(2 * (num_to_mask - total) / lam) + 1))
        for n in draw:
            lengths.append(int(min(n, num_to_mask - total)))
            total += lengths[-1]
            if total >= num_to_mask:
                break
    return np.asarray(lengths, dtype=np.int64)


def infill(
    tokens: np.ndarray,
    rng: np.random.Generator,
    *,
    mask_id: int,
    cfg: DenoisingOptions,
    vocab_size: int,
    special_ids: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Text infilling. Returns (noised tokens, span lengths drawn) -- the lengths for statistics."""
    n = len(tokens)
    lengths = span_lengths(int(round(cfg.mask_ratio * n)), rng, cfg.poisson_lambda)
    spans = lengths[lengths > 0]
    inserts = int((lengths == 0).sum())
    # Place the spans in a random order with a random composition of the kept tokens between them.
    kept = n - int(spans.sum())
    cuts = np.sort(rng.integers(0, kept + 1, size=len(spans)))
    gaps = np.diff(np.concatenate([[0], cuts, [kept]]))
    out, pos = [], 0
    for gap, span in zip(gaps[:-1], spans):
        out.append(tokens[pos : pos + gap])
        out.append(np.array([mask_id]))
        pos += gap + span
    out.append(tokens[pos:])
    noised = np.concatenate(out)
    if inserts:  # zero-length spans: a mask inserted at random positions
        at = np.sort(rng.integers(0, len(noised) + 1, size=inserts))
        noised = np.insert(noised, at, mask_id)
    if cfg.random_ratio:
        masks = np.flatnonzero(noised == mask_id)
        swap = masks[rng.random(len(masks)) < cfg.random_ratio]
        noised[swap] = rng.integers(0, vocab_size, size=len(swap))
        noised[swap] = np.where(np.isin(noised[swap], special_ids), mask_id, noised[swap])
    return noised, lengths


def noise(
    tokens: np.ndarray,
    starts: np.ndarray,
    rng: np.random.Generator,
    *,
    mask_id: int,
    bos_id: int,
    eos_id: int,
    cfg: DenoisingOptions,
    vocab_size: int,
    special_ids: np.ndarray,
) -> dict[str, np.ndarray]:
    """One example: encoder input ``<s> noised </s>``, labels ``<s> original </s>``."""
    source = permute_sentences(tokens, starts, rng) if cfg.permute_sentences else tokens
    noised, _ = infill(source, rng, mask_id=mask_id, cfg=cfg, vocab_size=vocab_size, special_ids=special_ids)
    labels = np.concatenate([[bos_id], tokens, [eos_id]])
    return {
        "input_ids": np.concatenate([[bos_id], noised, [eos_id]]),
        "labels": labels,
        "decoder_input_ids": np.concatenate([[eos_id], labels[:-1]]),
    }


class Denoising(Objective):
    """BART: sentence permutation + text infilling; the decoder reconstructs the original."""

    Options = DenoisingOptions

    def builder(self, *, seq_len, vocab, opts, stream=0):
        return SentencePacker(seq_len - 2, doc_sep=None)

    def sample(self, unit, rng, *, vocab, opts):
        tokens, starts = unit
        return noise(
            tokens,
            starts,
            rng,
            mask_id=vocab.id("mask"),
            bos_id=vocab.id("bos"),
            eos_id=vocab.id("eos"),
            cfg=opts,
            vocab_size=vocab.size,
            special_ids=vocab.specials,
        )

    def loss(self, model, batch, *, metrics):
        return seq2seq_loss(model, batch, metrics=metrics)


DENOISING = Denoising(name="denoising", salt=1005, padded=True)
