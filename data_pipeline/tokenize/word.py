"""Word-level tokenization (GloVe, ELMo) and ELMo's characters of a word.

The ``word`` profile keeps the most frequent words of the training text (NFKC, lower case, split
at whitespace and between word characters and punctuation) plus ``<pad> <unk> <bos> <eos>``; it is
trained with the ``tokenizers`` library's WordLevel model, so it saves as ``tokenizer.json`` and the
shards have the same format as every other profile's.

ELMo's character CNN reads each word as at most 50 characters -- the UTF-8 bytes of the word
between begin-of-word and end-of-word marks, padded -- over a fixed vocabulary of 262 ids
(allennlp's ``ELMoCharacterMapper`` layout): 0 pads a padding *token*, 1..256 are the byte values,
257/258 spell the sentence marks ``<bos>``/``<eos>``, 259/260 begin and end a word, 261 pads a word.
The table is computed at load time from the token strings (:func:`char_table`), never stored.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

MAX_CHARS = 50  # ELMo's max_word_length: longer words keep their first 48 bytes
CHAR_VOCAB = 262
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 257, 258, 259, 260, 261  # byte b is b + 1


def _normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])


def word_level(
    specials: Sequence[str], *, unk: str, vocab_size: int, min_frequency: int = 2
) -> tuple[Tokenizer, trainers.WordLevelTrainer]:
    """An untrained WordLevel tokenizer and its trainer (the ``word`` profile's kind)."""
    tok = Tokenizer(models.WordLevel(unk_token=unk))
    tok.normalizer = _normalizer()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # \w+ | [^\w\s]+
    trainer = trainers.WordLevelTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(specials), show_progress=False
    )
    return tok, trainer


def split_words(text: str) -> list[str]:
    """The words the ``word`` profile reads in ``text``: NFKC, lower case, ``\\w+ | [^\\w\\s]+``."""
    return [w for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(_normalizer().normalize_str(text))]


def word_chars(word: str, *, max_chars: int = MAX_CHARS) -> np.ndarray:
    """(max_chars,) character ids of one word: begin-of-word, its UTF-8 bytes (cut to fit), end-of-word."""
    body = [b + 1 for b in word.encode("utf-8")[: max_chars - 2]]
    out = np.full(max_chars, PAD_CHAR, dtype=np.int16)
    out[: len(body) + 2] = [BOW_CHAR, *body, EOW_CHAR]
    return out


def mark_chars(mark: int, *, max_chars: int = MAX_CHARS) -> np.ndarray:
    """The characters of a sentence mark (``BOS_CHAR`` or ``EOS_CHAR``): begin-of-word, mark, end-of-word."""
    out = np.full(max_chars, PAD_CHAR, dtype=np.int16)
    out[:3] = [BOW_CHAR, mark, EOW_CHAR]
    return out


def char_table(
    words: Sequence[str], *, pad: int | None, bos: int | None, eos: int | None, max_chars: int = MAX_CHARS
) -> np.ndarray:
    """(vocab, max_chars) int16 character ids of every token id: the padding token all zeros, the
    sentence marks ELMo's special words, every other token spelled."""
    table = (
        np.stack([word_chars(w, max_chars=max_chars) for w in words])
        if words
        else np.zeros((0, max_chars), dtype=np.int16)
    )
    for idx, mark in ((bos, BOS_CHAR), (eos, EOS_CHAR)):
        if idx is not None:
            table[idx] = mark_chars(mark, max_chars=max_chars)
    if pad is not None:
        table[pad] = 0
    return table


def vocabulary(tok: Tokenizer) -> list[str]:
    """The token strings in id order."""
    words = [""] * tok.get_vocab_size()
    for token, idx in tok.get_vocab().items():
        words[idx] = token
    return words
