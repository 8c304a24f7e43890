"""Sequence labelling from WordNet 3.0 (Debian's ``wordnet-base``): in each example sentence of a
synset, the occurrence of one of the synset's lemmas, tagged with the synset's part of speech.

WordNet's glosses quote example sentences (``"he ran away from home"`` for *run away*, a verb). The
words of an example (``\\w+ | [^\\w\\s]+``, as the ``word`` tokenizer profile splits) are matched
against the synset's lemmas, each word of a lemma equal to the example's word or to one of its base
forms (WordNet's morphology, ``wordnet.Morphy``: the exception lists, then the detachment rules);
the first match is ``B-<POS>`` then ``I-<POS>`` (``NOUN VERB ADJ ADV``; satellites are ``ADJ``), the
other words ``O``. Examples with no match are left out. Synsets are held out whole by a hash of
their offset and part of speech: ``test`` 20%, ``labelled`` 80%.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from data_pipeline import wordnet
from data_pipeline.tasks.pydoc_xref import MAX_WORDS, MIN_WORDS, WORD, TaggedSentence

POS = {"n": "NOUN", "v": "VERB", "a": "ADJ", "s": "ADJ", "r": "ADV"}
TAGS = ("O", *(f"{bio}-{pos}" for pos in ("NOUN", "VERB", "ADJ", "ADV") for bio in "BI"))


@lru_cache(maxsize=8)
def _morphy(root: str | None) -> wordnet.Morphy:
    return wordnet.Morphy(root)


def base_forms(word: str, pos: str, *, root: str | None = None) -> set[str]:
    """The word itself, its irregular base forms and what the detachment rules leave of it."""
    return set(_morphy(root).base_forms(word, pos))


def tag_example(example: str, synset: wordnet.Synset, *, root: str | None = None) -> tuple[list[str], list[str]] | None:
    words = WORD.findall(example)
    lower = [w.lower() for w in words]
    for lemma in synset.lemmas:
        parts = WORD.findall(lemma.lower())
        for start in range(len(words) - len(parts) + 1):
            if all(p in base_forms(lower[start + k], synset.pos, root=root) for k, p in enumerate(parts)):
                tags = ["O"] * len(words)
                pos = POS[synset.pos]
                tags[start : start + len(parts)] = [f"B-{pos}"] + [f"I-{pos}"] * (len(parts) - 1)
                return words, tags
    return None


def synset_split(synset: wordnet.Synset) -> str:
    bucket = int(hashlib.sha1(f"{synset.pos}{synset.offset}".encode()).hexdigest()[:8], 16) % 100
    return "test" if bucket < 20 else "labelled"


def wordnet_pos_splits(root: str | None = None, *, limit: int | None = None) -> dict[str, list[TaggedSentence]]:
    """``test`` / ``labelled`` tagged examples (at most ``limit`` in all, in file order)."""
    out: dict[str, list[TaggedSentence]] = {"test": [], "labelled": []}
    count = 0
    for synset in wordnet.synsets(root=root):
        for example in synset.examples:
            tagged = tag_example(example, synset, root=root)
            if tagged is None or not MIN_WORDS <= len(tagged[0]) <= MAX_WORDS:
                continue
            out[synset_split(synset)].append(
                TaggedSentence(tuple(tagged[0]), tuple(tagged[1]), f"{synset.pos}{synset.offset:08d}")
            )
            count += 1
            if limit is not None and count >= limit:
                return out
    return out
