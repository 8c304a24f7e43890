"""Sentence classification from WordNet 3.0 (Debian's ``wordnet-base``): a synset's gloss -> its
lexicographer file, the supersense the lexicographers filed it under (45 classes: noun.animal,
verb.motion, adj.pert, ...; ``wordnet.LEXNAMES``).

"a domesticated carnivorous mammal ..." is ``noun.animal``: the class follows from what the gloss
says, not from any one word, so a sentence encoder's context helps. Every synset with a definition
of at least ``min_words`` words is a row (``text``: the definition, ``label``: the lexicographer
file); rows are split by a hash of the synset's offset and part of speech into ``train`` (80%),
``valid`` (10%) and ``test`` (10%), and ``limit`` keeps a fixed, content-independent sample of each.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from data_pipeline import wordnet


def gloss_rows(*, min_words: int = 3, root: str | None = None) -> dict[str, list[dict]]:
    """split -> rows ``{id, text, label}`` (see the module docstring)."""
    splits: dict[str, list[dict]] = {"train": [], "valid": [], "test": []}
    for s in wordnet.synsets(root=root):
        if len(s.definition.split()) < min_words:
            continue
        key = f"{s.offset:08d}-{s.pos}"
        bucket = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % 10
        split = "test" if bucket == 0 else "valid" if bucket == 1 else "train"
        splits[split].append({"id": key, "text": s.definition, "label": s.lexname})
    return splits


def sample(rows: list[dict], limit: int) -> list[dict]:
    """At most ``limit`` rows, chosen by a hash of their id (the same rows on every machine)."""
    return sorted(rows, key=lambda r: hashlib.sha1(r["id"].encode()).hexdigest())[:limit] if limit else rows


def majority_accuracy(train: list[dict], test: list[dict]) -> float:
    """The accuracy of always answering the training set's most frequent class."""
    top = Counter(r["label"] for r in train).most_common(1)[0][0]
    return sum(r["label"] == top for r in test) / max(len(test), 1)
