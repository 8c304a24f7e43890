"""Words in context from WordNet's example sentences: part of speech and supersense, labelled by people.

Every synset's gloss quotes example sentences that use one of its lemmas in that sense ("he ran
the dishwasher" for run, verb, *operate*). Each sentence becomes one item: its words (the ``word``
profile's split, ``data_pipeline/tokenize/word.py``), the position of the synset's lemma, and the
synset's part of speech (``n v a r``; satellites are adjectives) and lexicographer file -- its
supersense, one of 45 (``wordnet.LEXNAMES``: noun.animal, verb.motion, adj.pert, ...).

Sentences often hold an inflected form, not the lemma ("ran", "mice", "happier"). A word matches a
lemma as WordNet's own morphology (Morphy) finds base forms: the word itself, its entries in the
part of speech's exception list (``verb.exc``: ran -> run), or the detachment rules (``wordnet.DETACH``:
ies -> y, ed -> e, ...; nouns ending in ``ss`` keep their s). Only one-word lemmas are located;
every sentence is counted by how its lemma was found, or why it was not (``Counts``).

``split`` holds items out by lemma (a lemma's every sentence on one side: a probe cannot score by
memorising words) or by synset, keyed by a seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from data_pipeline import wordnet
from data_pipeline.wordnet import Morphy
from data_pipeline.tokenize.word import split_words


@dataclass
class Counts:
    sentences: int = 0
    found: dict[str, int] = field(default_factory=lambda: {"exact": 0, "exception": 0, "rule": 0})
    not_found: int = 0  # no one-word lemma of the synset in the sentence, in any form
    multiword_only: int = 0  # the synset's one-word lemmas absent, a multi-word one present as written

    def as_dict(self) -> dict:
        return {
            "sentences": self.sentences,
            "found": dict(self.found),
            "not_found": self.not_found,
            "multiword_only": self.multiword_only,
            "items": sum(self.found.values()),
        }


def locate(words: list[str], lemmas: tuple[str, ...], pos: str, morphy: Morphy) -> tuple[int, str, str] | None:
    """(position, lemma, how) of the first word that is one of ``lemmas`` in some form, else None."""
    one_word = [lemma.lower() for lemma in lemmas if len(split_words(lemma)) == 1]
    for k, word in enumerate(words):
        forms = morphy.base_forms(word, pos)
        for lemma in one_word:
            if lemma in forms:
                return k, lemma, forms[lemma]
    return None


def _contains(words: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    return any(words[k : k + n] == phrase for k in range(len(words) - n + 1))


def items(root: str | None = None) -> tuple[list[dict], Counts]:
    """Every located example sentence as ``{id, words, position, lemma, pos, supersense, synset}``."""
    morphy, counts, out = Morphy(root), Counts(), []
    for pos in wordnet.FILES:
        for s in wordnet.synsets(pos, root=root):
            for e, sentence in enumerate(s.examples):
                counts.sentences += 1
                words = split_words(sentence)
                hit = locate(words, s.lemmas, s.pos, morphy)
                if hit is None:
                    multi = [split_words(lemma) for lemma in s.lemmas if len(split_words(lemma)) > 1]
                    if any(_contains(words, m) for m in multi):
                        counts.multiword_only += 1
                    else:
                        counts.not_found += 1
                    continue
                k, lemma, how = hit
                counts.found[how] += 1
                out.append(
                    {
                        "id": f"wn30:{pos}{s.offset:08d}:{e}",
                        "words": words,
                        "position": k,
                        "lemma": lemma,
                        "pos": "a" if s.pos == "s" else s.pos,
                        "supersense": s.lexname,
                        "synset": f"{pos}{s.offset:08d}",
                    }
                )
    return out, counts


def _bucket(key: str, seed: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, key)."""
    return int(hashlib.sha1(f"{seed}:{key}".encode()).hexdigest()[:12], 16) / 16**12


def split(
    rows: list[dict], *, seed: int = 0, by: str = "lemma", valid: float = 0.1, test: float = 0.1
) -> dict[str, list[dict]]:
    """train / valid / test, every value of ``rows[i][by]`` (``lemma`` or ``synset``) on one side only."""
    out: dict[str, list[dict]] = {"train": [], "valid": [], "test": []}
    for row in rows:
        u = _bucket(row[by], seed)
        out["test" if u < test else "valid" if u < test + valid else "train"].append(row)
    return out
