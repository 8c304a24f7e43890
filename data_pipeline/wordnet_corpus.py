"""WordNet's glosses and example sentences as documents (the ``wordnet`` source).

One line per synset -- its lemmas, part of speech, and its gloss as WordNet writes it (the
definition, then the quoted examples)::

    dog, domestic dog, Canis familiaris (noun): a member of the genus Canis ...; "the dog barked all night"

A document is a run of consecutive synsets of one lexicographer file (``noun.animal``,
``verb.motion``, ...: WordNet's 45 supersenses, each a contiguous block of its data file), cut at
about :data:`MAX_DOC_CHARS` characters and headed by the file's name. Why this grouping: a synset
alone is one line (117,659 documents of ~90 characters, most shorter than any training sequence,
each paying an end-of-text token), while a whole lexicographer file is up to 1.9 MB (noun.artifact)
and the held-out split, drawn by document, would then take or leave whole domains from 45
documents. Runs of one lexicographer file keep a document on one topic (animals beside animals,
motion verbs beside motion verbs) and give ~2,300 documents, enough for a held-out set of every
domain.

Read through :mod:`data_pipeline.wordnet` (bounded reads); a malformed synset line is skipped and
counted (``malformed_synset_line``), as is one over the line bound (``line_too_large``) and a synset
without a gloss (``empty_gloss``). ``wordnet:/path`` reads the database in another folder
(``WNSEARCHDIR`` works too).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator

from data_pipeline.wordnet import FILES, Synset, parse_line, read_lines, wordnet_dir

MAX_DOC_CHARS = 6000  # as the embedded corpus's documents (data_pipeline/embedded.py)
POS_NAMES = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def gloss_line(synset: Synset) -> str:
    """The synset as one line of text (see the module docstring)."""
    gloss = "; ".join([synset.definition] * bool(synset.definition) + [f'"{e}"' for e in synset.examples])
    return f"{', '.join(synset.lemmas)} ({POS_NAMES[synset.pos]}): {gloss}"


def _synsets(root: str | None, skipped: Counter) -> Iterator[Synset]:
    """Every synset in data-file order (nouns, verbs, adjectives, adverbs); bad lines counted."""
    base = wordnet_dir(root)
    for pos in "nvar":
        for line in read_lines(base / FILES[pos], skipped):
            try:
                synset = parse_line(line)
            except (ValueError, IndexError):
                skipped["malformed_synset_line"] += 1
                continue
            if not synset.definition and not synset.examples:
                skipped["empty_gloss"] += 1
                continue
            yield synset


def wordnet_documents(root: str | None = None, *, skipped: Counter | None = None) -> Iterator[dict]:
    """``{"id", "text"}`` documents in a fixed order; ``id`` is ``wordnet:LEXNAME#K``."""
    skipped = skipped if skipped is not None else Counter()
    counts: Counter = Counter()  # documents so far per lexicographer file: the K of the id
    lexname, lines, size = None, [], 0
    for synset in _synsets(root, skipped):
        if lines and (synset.lexname != lexname or size > MAX_DOC_CHARS):
            yield _document(lexname, lines, counts)
            lines, size = [], 0
        lexname = synset.lexname
        lines.append(gloss_line(synset))
        size += len(lines[-1]) + 1
    if lines:
        yield _document(lexname, lines, counts)


def _document(lexname: str, lines: list[str], counts: Counter) -> dict:
    counts[lexname] += 1
    return {"id": f"wordnet:{lexname}#{counts[lexname] - 1}", "text": f"{lexname}\n\n" + "\n".join(lines)}
