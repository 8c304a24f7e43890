"""Text measures shared by the quality rules: words, lines, paragraphs, sentences, duplicates."""
from __future__ import annotations

import re
from collections import Counter

# Words roughly as an English word tokenizer splits them: words (with inner apostrophes), numbers
# with decimal points, and runs of one punctuation character ("...", "--") as their own tokens.
WORD_RE = re.compile(r"\d+(?:[.,]\d+)+|\w+(?:['’]\w+)*|([^\w\s])\1*")
# Sentence-final punctuation in the common scripts (Latin, CJK, Devanagari, Arabic, Armenian, ...).
TERMINAL = frozenset(".!?。！？।॥؟۔։።‼⁇⁈⁉…")
PARAGRAPH_SPLIT = re.compile(r"\n{2,}")
LINE_SPLIT = re.compile(r"\n+")
SENTENCE_END = re.compile(r"[.!?。！？।؟]+['\"”’)\]]*(?=\s|$)")


def words(text: str) -> list[str]:
    return [m.group(0) for m in WORD_RE.finditer(text)]


def is_symbol(word: str) -> bool:
    return not any(ch.isalnum() for ch in word)


def count_sentences(line: str) -> int:
    """Sentence ends in ``line``; a trailing fragment without one still counts as a sentence."""
    ends = list(SENTENCE_END.finditer(line))
    tail = line[ends[-1].end():] if ends else line
    return len(ends) + (1 if tail.strip() else 0)


def duplicates(items: list[str]) -> tuple[int, int]:
    """(elements that repeat an earlier one, their characters)."""
    seen: set[str] = set()
    n = chars = 0
    for item in items:
        if item in seen:
            n += 1
            chars += len(item)
        else:
            seen.add(item)
    return n, chars


def top_ngram_chars(ws: list[str], n: int) -> int:
    """Characters covered by the most frequent word n-gram (its length x its count)."""
    if len(ws) < n:
        return 0
    counts = Counter(" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1))
    gram, count = counts.most_common(1)[0]
    return len(gram) * count


def duplicated_ngram_chars(ws: list[str], n: int) -> int:
    """Characters in n-grams that repeat an earlier n-gram, without counting a word twice."""
    seen: set[str] = set()
    chars, i = 0, 0
    while i <= len(ws) - n:
        gram = "".join(ws[i:i + n])
        if gram in seen:
            chars += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars
