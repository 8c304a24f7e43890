"""Per-token tables derived from a tokenizer: UTF-8 byte lengths (bits per byte) and word starts
(whole-word masking), for the four tokenizer kinds."""

from __future__ import annotations

import json

import numpy as np
from tokenizers import Tokenizer


def tokenizer_kind(tok: Tokenizer) -> str:
    model = json.loads(tok.to_str())["model"]["type"]
    return {"BPE": "byte-bpe", "WordPiece": "wordpiece", "Unigram": "unigram", "WordLevel": "wordlevel"}[model]


def _special_ids(tok: Tokenizer) -> set[int]:
    return set(tok.get_added_tokens_decoder())


def token_byte_lengths(tok: Tokenizer) -> np.ndarray:
    """UTF-8 bytes each id stands for (0 for special tokens)."""
    kind, special = tokenizer_kind(tok), _special_ids(tok)
    lengths = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for token, idx in tok.get_vocab().items():
        if idx in special:
            continue
        if kind == "byte-bpe":  # one printable character per byte (GPT-2's byte map)
            lengths[idx] = len(token)
        elif kind == "wordpiece":
            lengths[idx] = len(token.removeprefix("##").encode())
        else:
            lengths[idx] = len(token.replace("\u2581", " ").encode())
    return lengths


def word_start_table(tok: Tokenizer) -> np.ndarray:
    """True where a token begins a word (whole-word masking groups a start with its continuations)."""
    kind, special = tokenizer_kind(tok), _special_ids(tok)
    starts = np.ones(tok.get_vocab_size(), dtype=bool)
    for token, idx in tok.get_vocab().items():
        if idx in special or not token:
            continue
        if kind == "wordlevel":  # every token is a word
            continue
        if kind == "wordpiece":
            starts[idx] = not token.startswith("##")
        else:
            marker = "\u0120\u010a" if kind == "byte-bpe" else "\u2581"  # Ġ (space) Ċ (newline) / ▁
            starts[idx] = token[0] in marker or not token[0].isalnum()
    return starts
