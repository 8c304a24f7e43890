"""Byte-level BPE tokenizers (GPT-2 / RoBERTa / BART style) with the ``tokenizers`` library.

Saved as ``tokenizer.json``, which transformers' ``PreTrainedTokenizerFast`` loads directly.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"


def train_byte_level_bpe(texts: Iterable[str], *, vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """GPT-2's scheme: BPE over bytes (no unknown token), ``<|endoftext|>`` as the only special."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def token_byte_lengths(tok: Tokenizer) -> list[int]:
    """UTF-8 bytes each token id stands for (0 for special tokens): the denominator of
    bits-per-byte, so that it compares across tokenizers."""
    lengths = [0] * tok.get_vocab_size()
    byte_decoder = {c: b for b, c in _bytes_to_unicode().items()}
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    for token, idx in tok.get_vocab().items():
        if token not in special:
            lengths[idx] = sum(1 for ch in token if ch in byte_decoder)
    return lengths


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
