"""T5 span corruption (t5/data/preprocessors.py: random_spans_helper, random_spans_noise_mask).

noise = round(L * density) tokens in round(noise / mean_span) spans; spans alternate with
non-noise spans, starting with non-noise; span lengths are a uniformly random composition (so
their mean is exactly noise / spans). Inputs keep the non-noise tokens with one sentinel per noise
span, targets the noise tokens with one sentinel before each span; both end with EOS. Sentinels
count down from the top of the vocabulary (``<extra_id_0>`` is the highest id).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from glm_common.config_bounds import TOKENS
from glm_dist.objectives.base import Objective, option, seq2seq_loss
from glm_dist.objectives.clm import TokenPacker


@dataclass(frozen=True)
class SpanOptions:
    """The keys of ``span_corruption`` under ``objective:`` (T5's values by default)."""

    noise_density: float = option(0.15, "fraction of tokens in noise spans", bounds="(0, 1)")
    mean_span: float = option(3.0, "mean noise span length", bounds=f"(0, {TOKENS}]")


def _lengths(raw_len: int, density: float, mean_span: float) -> tuple[int, int]:
    noise = int(round(raw_len * density))
    spans = int(round(noise / mean_span))
    return raw_len - noise + spans + 1, noise + spans + 1  # inputs, targets (each + EOS)


def raw_length_for(inputs_length: int, *, density: float = 0.15, mean_span: float = 3.0) -> tuple[int, int]:
    """The raw token count whose corrupted inputs are exactly ``inputs_length`` long, and the
    targets' length (512 -> 568 raw, 114 targets; 128 -> 141, 29)."""
    raw = inputs_length - 1
    while _lengths(raw + 1, density, mean_span)[0] <= inputs_length:
        raw += 1
    return raw, _lengths(raw, density, mean_span)[1]


def _composition(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random split of ``total`` items into ``parts`` positive lengths."""
    first = np.zeros(total, dtype=bool)
    first[1:] = rng.permutation(np.arange(total - 1) < parts - 1)
    first[0] = True
    return np.bincount(np.cumsum(first) - 1, minlength=parts)


def noise_mask(length: int, rng: np.random.Generator, *, density: float = 0.15, mean_span: float = 3.0) -> np.ndarray:
    noise = min(max(int(round(length * density)), 1), length - 1)
    spans = max(int(round(noise / mean_span)), 1)
    noise_lens, keep_lens = _composition(noise, spans, rng), _composition(length - noise, spans, rng)
    interleaved = np.stack([keep_lens, noise_lens], axis=1).reshape(-1)
    starts = np.zeros(length, dtype=bool)
    starts[np.cumsum(interleaved)[:-1]] = True
    return np.cumsum(starts) % 2 == 1


def corrupt(
    tokens: np.ndarray,
    rng: np.random.Generator,
    *,
    sentinels: list[int],
    eos_id: int,
    density: float = 0.15,
    mean_span: float = 3.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) for one raw example."""
    is_noise = noise_mask(len(tokens), rng, density=density, mean_span=mean_span)
    return _replace_spans(tokens, is_noise, sentinels, eos_id), _replace_spans(tokens, ~is_noise, sentinels, eos_id)


def _replace_spans(tokens: np.ndarray, drop: np.ndarray, sentinels: list[int], eos_id: int) -> np.ndarray:
    """Each run of ``drop`` positions becomes the next sentinel; EOS appended."""
    span_start = drop & ~np.concatenate([[False], drop[:-1]])
    sentinel_ids = np.asarray(sentinels)[np.cumsum(span_start) - 1]
    out = np.where(span_start, sentinel_ids, tokens)[~drop | span_start]
    return np.concatenate([out, [eos_id]])


def shift_right(labels: np.ndarray, start_id: int) -> np.ndarray:
    """Decoder inputs: targets shifted right, starting with ``start_id`` (T5: pad; BART: eos)."""
    return np.concatenate([[start_id], labels[:-1]])


class SpanCorruption(Objective):
    """T5: raw blocks sized so the corrupted input is exactly ``seq_len``; targets are the spans."""

    Options = SpanOptions

    def builder(self, *, seq_len, vocab, opts, stream=0):
        raw, _ = raw_length_for(seq_len, density=opts.noise_density, mean_span=opts.mean_span)
        return TokenPacker(raw, sep=None)

    def sample(self, unit, rng, *, vocab, opts):
        inputs, targets = corrupt(
            unit,
            rng,
            sentinels=vocab.ids["sentinels"],
            eos_id=vocab.id("eos"),
            density=opts.noise_density,
            mean_span=opts.mean_span,
        )
        return {"input_ids": inputs, "labels": targets, "decoder_input_ids": shift_right(targets, vocab.id("pad"))}

    def loss(self, model, batch, *, metrics):
        return seq2seq_loss(model, batch, metrics=metrics)


SPAN_CORRUPTION = SpanCorruption(name="span_corruption", salt=1004)
