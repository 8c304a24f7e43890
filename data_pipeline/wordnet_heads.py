"""Rows for ``glm finetune --task span`` and ``--task tokens`` from WordNet's example sentences
(``data_pipeline/wordnet.py``: the database files of Debian's ``wordnet-base``).

- Span extraction (SQuAD's format): the context is an example sentence of a synset, the question
  "Which word means: <definition>?", the answer every whole-word occurrence of one of the synset's
  single-word lemmas in the sentence (``answers: {text, answer_start}``). Synsets whose definition
  contains one of their lemmas are left out.
- Token classification: the words of the example sentences, each tagged with the part of speech
  WordNet lists that word form under (NOUN VERB ADJ ADV) when it lists it under exactly one, ``O``
  when it lists it under none (function words, punctuation, most inflected forms); a form listed
  under several has no tag (null: not trained on, not scored).

Row ids are ``wn30:<pos><synset offset>/e<example number>``; rows come in the order of a hash of
their id (``stable_order``).
"""

from __future__ import annotations

import re
from typing import Iterator

from data_pipeline import wordnet
from data_pipeline.tasks.built import stable_order

LEMMA = re.compile(r"^[a-z]{3,}$")
WORD = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*|\d+|[^\sA-Za-z\d]")
TAGS = {"n": "NOUN", "v": "VERB", "a": "ADJ", "r": "ADV"}


def _examples(root: str | None, parts: str) -> Iterator[tuple[str, wordnet.Synset, int, str]]:
    for pos in parts:
        for s in wordnet.synsets(pos, root=root):
            for k, example in enumerate(s.examples):
                yield f"wn30:{pos}{s.offset:08d}/e{k}", s, k, example.strip()


def span_rows(root: str | None = None, *, parts: str = "nvar", limit: int | None = None) -> list[dict]:
    """The span rows of the synsets of ``parts`` (``n v a r``), the first ``limit`` in id-hash order."""
    rows = []
    for row_id, s, _, example in _examples(root, parts):
        definition = s.definition.split(";")[0].strip()
        lemmas = [w.lower() for w in s.lemmas if LEMMA.match(w.lower())]
        if len(definition.split()) < 3 or any(w.lower() in definition.lower() for w in s.lemmas):
            continue
        found = sorted(
            {
                (m.start(), m.group())
                for w in lemmas
                for m in re.finditer(rf"\b{re.escape(w)}\b", example, re.IGNORECASE)
            }
        )
        if found:
            rows.append(
                {
                    "id": row_id,
                    "context": example,
                    "question": f"Which word means: {definition}?",
                    "answers": {"text": [t for _, t in found], "answer_start": [a for a, _ in found]},
                }
            )
    return stable_order(rows)[:limit]


def pos_rows(root: str | None = None, *, parts: str = "nvar", limit: int | None = None) -> list[dict]:
    """The tagged example sentences of the synsets of ``parts`` (tags from all four index files)."""
    listed: dict[str, set[str]] = {}
    for lemma, pos in wordnet.senses(root=root):
        listed.setdefault(lemma, set()).add(TAGS[pos])
    rows, seen = [], set()
    for row_id, _, _, example in _examples(root, parts):
        words = WORD.findall(example)
        if len(words) < 3 or example in seen:
            continue
        seen.add(example)
        tags = [None if len(listed.get(w.lower(), ())) > 1 else next(iter(listed.get(w.lower(), {"O"}))) for w in words]
        rows.append({"id": row_id, "tokens": words, "tags": tags})
    return stable_order(rows)[:limit]
