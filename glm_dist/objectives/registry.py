"""Objectives by name: how documents become units (packing) and units become samples (noising).

Each entry pairs a *builder* -- stateful, deterministic, turns the document stream into units --
with a *make* step that noises one unit with an RNG keyed by (seed, objective, epoch, sample
number). Builders are cheap and run on every rank over the global order; ``make`` runs only for
the rank's own samples.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator

import numpy as np
import torch

from glm_dist.objectives import denoising, electra, mlm, permutation_lm, span_corruption
from glm_dist.objectives.clm import TokenPacker
from glm_dist.objectives.packing import SentencePacker
from glm_dist.objectives.sentence_pairs import PairBuilder

OBJECTIVES = ("clm", "mlm", "mlm_nsp", "sop", "span_corruption", "denoising", "electra", "plm")
# Distinct RNG streams per objective (so two objectives over one corpus draw independently).
SALT = {name: 1000 + i for i, name in enumerate(OBJECTIVES)}


@dataclass(frozen=True)
class ObjectiveOptions:
    masking: mlm.MaskingConfig = mlm.MaskingConfig()
    noise_density: float = 0.15  # T5
    mean_span: float = 3.0  # T5
    denoising: denoising.DenoisingConfig = denoising.DenoisingConfig()
    plm_probability: float = 1 / 6
    max_span: int = 5  # XLNet


@dataclass
class Vocab:
    """What objectives need from the tokenizer (manifest ``special_ids`` + derived tables)."""

    size: int
    ids: dict
    word_starts: np.ndarray | None = None

    @property
    def specials(self) -> np.ndarray:
        return np.asarray(self.ids["all_specials"])

    def id(self, role: str) -> int:
        if self.ids.get(role) is None:
            raise ValueError(f"this tokenizer has no {role!r} token; use a tokenizer profile that has one "
                             f"(data.tokenizer_profile)")
        return self.ids[role]


class UnitSource:
    """The builder for one objective: ``units(docs, rng_for)`` yields units; exact ``state_dict``."""

    def __init__(self, name: str, *, seq_len: int, vocab: Vocab, opts: ObjectiveOptions):
        self.name, self.seq_len, self.vocab, self.opts = name, seq_len, vocab, opts
        if name == "clm":
            self.builder = TokenPacker(seq_len + 1, stride=seq_len, sep=vocab.id("eot"))
        elif name in ("mlm", "electra"):
            self.builder = SentencePacker(seq_len - 2, doc_sep=vocab.id("sep"))
        elif name in ("mlm_nsp", "sop"):
            self.builder = PairBuilder(seq_len, cls_id=vocab.id("cls"), sep_id=vocab.id("sep"),
                                       mode="nsp" if name == "mlm_nsp" else "sop")
        elif name == "span_corruption":
            raw, _ = span_corruption.raw_length_for(seq_len, density=opts.noise_density, mean_span=opts.mean_span)
            self.builder = TokenPacker(raw, sep=None)
        elif name == "denoising":
            self.builder = SentencePacker(seq_len - 2, doc_sep=None)
        elif name == "plm":
            self.builder = TokenPacker(seq_len, sep=vocab.id("eot"))
        else:
            raise KeyError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVES)}")

    def units(self, docs, rng_for: Callable[[int], np.random.Generator]) -> Iterator:
        if isinstance(self.builder, PairBuilder):
            return self.builder.pairs(docs, rng_for)
        if isinstance(self.builder, SentencePacker):
            return self.builder.units(docs)
        return self.builder.blocks(docs)

    def state_dict(self) -> dict:
        return self.builder.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.builder.load_state_dict(state)


def make_sample(name: str, unit, rng: np.random.Generator, *, vocab: Vocab, opts: ObjectiveOptions) -> dict[str, np.ndarray]:
    """Noise one unit into model inputs and targets (numpy, unpadded)."""
    if name == "clm":
        return {"input_ids": unit[:-1], "labels": unit[1:]}
    if name == "span_corruption":
        inputs, targets = span_corruption.corrupt(unit, rng, sentinels=vocab.ids["sentinels"], eos_id=vocab.id("eos"),
                                                  density=opts.noise_density, mean_span=opts.mean_span)
        return {"input_ids": inputs, "labels": targets,
                "decoder_input_ids": span_corruption.shift_right(targets, vocab.id("pad"))}
    if name == "denoising":
        tokens, starts = unit
        return denoising.noise(tokens, starts, rng, mask_id=vocab.id("mask"), bos_id=vocab.id("bos"),
                               eos_id=vocab.id("eos"), cfg=opts.denoising, vocab_size=vocab.size,
                               special_ids=vocab.specials)
    if name == "plm":
        return permutation_lm.plm_inputs(unit, rng, special_ids=vocab.specials,
                                         plm_probability=opts.plm_probability, max_span=opts.max_span)
    masking = _masking_for(name, opts)
    if name in ("mlm_nsp", "sop"):
        inputs, labels = mlm.mask_tokens(unit["tokens"], rng, cfg=masking, mask_id=vocab.id("mask"),
                                         vocab_size=vocab.size, special_ids=vocab.specials, word_starts=vocab.word_starts)
        return {"input_ids": inputs, "labels": labels, "token_type_ids": unit["token_type_ids"],
                "sentence_label": np.asarray(unit["sentence_label"])}
    tokens, _ = unit  # mlm / electra: FULL-SENTENCES unit framed as [CLS] ... [SEP]
    framed = np.concatenate([[vocab.id("cls")], tokens, [vocab.id("sep")]])
    inputs, labels = mlm.mask_tokens(framed, rng, cfg=masking, mask_id=vocab.id("mask"), vocab_size=vocab.size,
                                     special_ids=vocab.specials, word_starts=vocab.word_starts)
    return {"input_ids": inputs, "labels": labels}


def _masking_for(name: str, opts: ObjectiveOptions) -> mlm.MaskingConfig:
    if name == "electra":
        return replace(electra.GENERATOR_MASKING, rate=opts.masking.rate, whole_word=opts.masking.whole_word)
    if name == "sop":  # ALBERT: n-gram masking, n <= 3
        return replace(opts.masking, max_ngram=max(opts.masking.max_ngram, 3))
    return opts.masking


def options_from_config(o) -> ObjectiveOptions:
    """``ObjectiveOptions`` from the config tree's ``objective`` section."""
    return ObjectiveOptions(
        masking=mlm.MaskingConfig(rate=o.mask_rate, mask_frac=o.mask_frac, random_frac=o.random_frac,
                                  max_ngram=o.max_ngram, whole_word=o.whole_word),
        noise_density=o.noise_density, mean_span=o.mean_span,
        denoising=denoising.DenoisingConfig(mask_ratio=o.mask_ratio, poisson_lambda=o.poisson_lambda,
                                            permute_sentences=o.permute_sentences, random_ratio=o.random_ratio))


PAD_VALUES = {"labels": mlm.IGNORE_INDEX}


VARIABLE_LENGTH = {"mlm", "electra", "mlm_nsp", "sop", "denoising"}  # padded to seq_len: fixed shapes


def collate(samples: list[dict[str, np.ndarray]], *, pad_id: int, width: int | None = None) -> dict[str, torch.Tensor]:
    """Stack samples, right-padding sequences to ``width`` (or the longest) -- ids with ``pad_id``,
    labels with -100, the rest with 0 -- and adding ``attention_mask`` when inputs were padded."""
    batch: dict[str, torch.Tensor] = {}
    for key in samples[0]:
        arrays = [np.asarray(s[key]) for s in samples]
        if arrays[0].ndim == 0:
            batch[key] = torch.from_numpy(np.stack(arrays).astype(np.int64))
            continue
        longest = max(a.shape[0] for a in arrays)
        to = max(width or 0, longest) if arrays[0].ndim == 1 else longest
        fill = PAD_VALUES.get(key, pad_id if key.endswith("input_ids") else 0)
        padded = [np.pad(a, [(0, to - a.shape[0])] + [(0, 0)] * (a.ndim - 1), constant_values=fill) for a in arrays]
        out = np.stack(padded)
        batch[key] = torch.from_numpy(out.astype(np.float32 if out.dtype.kind == "f" else np.int64))
        if key == "input_ids" and any(a.shape[0] < to for a in arrays):
            batch["attention_mask"] = torch.from_numpy(
                np.stack([np.arange(to) < a.shape[0] for a in arrays]).astype(np.int64))
    return batch
