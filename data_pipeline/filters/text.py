"""Text measures shared by the quality rules: words, lines, paragraphs, sentences, duplicates."""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

# Words as an English word tokenizer (spaCy's rules, which datatrove uses) splits them: text is cut
# at whitespace; punctuation at either end of a chunk comes off one character at a time ("..." and
# "--" whole); clitics ('s, n't, 'll, ...) and hyphens or slashes between letters split; what is
# left ("3.5", "x=1", "a.b.c", "U.S.") stays one word.
_CLITICS = ("n't", "n’t", "'s", "’s", "'m", "’m", "'ll", "’ll", "'re", "’re", "'ve", "’ve", "'d", "’d")
_L = r"[^\W\d_]"  # a letter
_INFIX = re.compile(
    r"((?<=[0-9])[+\-*^](?=[0-9-])"  # 0-9, 2*3
    rf"|(?<=[a-z])\.(?=[A-Z])|(?<={_L}),(?={_L})"  # io.BufferedIOBase, a,b
    rf"|(?<=[^\W_])(?:---|--|-|–|—|~)(?={_L})"  # well-known, 311-x86
    rf"|(?<=[^\W_])[:<>=/](?={_L})"  # a/b, format=XZ
    r"|\.\.+|…)"
)
_SINGLE = re.compile(r"^(?:[A-Za-z]\.)+$")  # x.  U.S.  e.g.
_NOT_PREFIX = frozenset("/-@~^|\\")
_NOT_SUFFIX = frozenset("/-@~^|\\")
_UNITS = ("...", "''", "--")


def _peel(chunk: str, out: list[str]) -> None:
    if _SINGLE.match(chunk):
        out.append(chunk)
        return
    head = []
    while chunk and not chunk[0].isalnum() and chunk[0] not in _NOT_PREFIX:
        n = next((len(u) for u in _UNITS if chunk.startswith(u)), 1)
        head.append(chunk[:n])
        chunk = chunk[n:]
    tail = []
    while chunk and not chunk[-1].isalnum() and chunk[-1] not in _NOT_SUFFIX and not _SINGLE.match(chunk):
        n = next((len(u) for u in _UNITS if chunk.endswith(u)), 1)
        tail.append(chunk[-n:])
        chunk = chunk[:-n]
    out.extend(head)
    if chunk:
        clitic = None
        lower = chunk.lower()
        for c in _CLITICS:
            if lower.endswith(c) and len(chunk) > len(c):
                clitic, chunk = chunk[-len(c) :], chunk[: -len(c)]
                break
        if chunk.isalnum():
            out.append(chunk)
        else:
            out.extend(p for p in _INFIX.split(chunk) if p)
        if clitic:
            out.append(clitic)
    out.extend(reversed(tail))


@lru_cache(maxsize=8)
def _words(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for chunk in text.split():
        if chunk.isalnum():
            out.append(chunk)
        else:
            _peel(chunk, out)
    return tuple(out)


def words(text: str) -> list[str]:
    return list(_words(text))


# Sentence-final punctuation in the common scripts (Latin, CJK, Devanagari, Arabic, Armenian, ...).
TERMINAL = frozenset(".!?。！？।॥؟۔։።‼⁇⁈⁉…")
PARAGRAPH_SPLIT = re.compile(r"\n{2,}")
LINE_SPLIT = re.compile(r"\n+")


def is_symbol(word: str) -> bool:
    return not any(ch.isalnum() for ch in word)


_FINAL = frozenset(".!?。！？।؟…")


def count_sentences(line: str) -> int:
    """Sentences as a rule-based sentencizer counts them: a sentence ends at a word made of
    sentence-final punctuation ("." "?!" "..."), so "e.g." or "3.5" end nothing; a trailing
    fragment without an end still counts."""
    toks = _words(line)
    ends, open_tail = 0, False
    for i, tok in enumerate(toks):
        final = all(ch in _FINAL for ch in tok)
        if final and open_tail and (i + 1 == len(toks) or not all(ch in _FINAL for ch in toks[i + 1])):
            ends += 1
            open_tail = False
        elif not final:
            open_tail = True
    return ends + open_tail


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
    counts = Counter(" ".join(ws[i : i + n]) for i in range(len(ws) - n + 1))
    gram, count = counts.most_common(1)[0]
    return len(gram) * count


def duplicated_ngram_chars(ws: list[str], n: int) -> int:
    """Characters in n-grams that repeat an earlier n-gram, without counting a word twice."""
    seen: set[str] = set()
    chars, i = 0, 0
    while i <= len(ws) - n:
        gram = "".join(ws[i : i + n])
        if gram in seen:
            chars += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars
