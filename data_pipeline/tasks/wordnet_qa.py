"""Reading comprehension over WordNet example sentences, CoQA-style (GPT-2's conversational QA,
Radford et al. 2019, section 3.5): the document, the previous question/answer pairs, then
``Q: ... A:``; greedy decoding; SQuAD's F1 and exact match.

Read from the WordNet 3.0 database of Debian's ``wordnet-base`` (``data_pipeline/wordnet.py``).
A candidate is a synset with a quoted example sentence that contains one of its single-word
lower-case lemmas as a word, and a definition (the gloss before its first ``;``) that contains none
of its words. Candidates, ordered by a hash of their id, are taken ``turns`` at a time: their
example sentences form one document and each is asked about in turn ("Which word of the text
means '<definition>'?"; the answer is the lemma, a word of the document). Item ``j`` of a document
carries the gold answers of turns 1..j-1 as its history.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter

from data_pipeline import wordnet
from data_pipeline.tasks.built import BuiltTask, stable_order
from data_pipeline.tasks.answers import exact_match, f1

LEMMA = re.compile(r"^[a-z]{3,}$")


def candidates(root: str | None = None) -> list[dict]:
    out = []
    for s in wordnet.synsets("nvar", root=root):
        definition = s.definition.split(";")[0].strip()
        words = [w.lower() for w in s.lemmas]
        if len(definition.split()) < 3 or any(w in definition.lower() for w in words):
            continue
        for example in s.examples:
            answer = next((w for w in s.lemmas if LEMMA.match(w) and re.search(rf"\b{w}\b", example)), None)
            if answer:
                sentence = example.strip()
                out.append(
                    {
                        "id": f"wn30-qa:{s.pos}{s.offset:08d}",
                        "definition": definition,
                        "answer": answer,
                        "sentence": sentence + ("" if sentence[-1] in ".?!" else "."),
                    }
                )  # case kept: the answer
                break
    return stable_order(out)


def conversations(rows: list[dict], turns: int) -> list[list[dict]]:
    """Items grouped ``turns`` at a time into documents, each item with the turns before it."""
    docs = []
    for start in range(0, len(rows) - turns + 1, turns):
        group = rows[start : start + turns]
        document = " ".join(r["sentence"] for r in group)
        history: list[dict] = []
        items = []
        for r in group:
            question = f'Which word of the text means "{r["definition"]}"?'
            items.append(
                {
                    "id": r["id"],
                    "document": document,
                    "history": list(history),
                    "question": question,
                    "answer": r["answer"],
                }
            )
            history.append({"question": question, "answer": r["answer"]})
        docs.append(items)
    return docs


def _baselines(test: list[dict]) -> dict[str, float]:
    """Trivial readers: the document's longest word; the document's most frequent word of 3+ letters."""

    def longest(r):
        return max(re.findall(r"[A-Za-z]+", r["document"]), key=len)

    def frequent(r):
        return Counter(re.findall(r"[a-z]{3,}", r["document"].lower())).most_common(1)[0][0]

    out = {}
    for name, guess in (
        ("the longest word of the document", longest),
        ("the most frequent word of the document", frequent),
    ):
        out[f"f1: {name}"] = sum(f1(guess(r), [r["answer"]]) for r in test) / len(test)
        out[f"exact_match: {name}"] = sum(exact_match(guess(r), [r["answer"]]) for r in test) / len(test)
    return out


def build(
    wordnet_dir: str | None = None,
    *,
    num_test_docs: int = 200,
    num_train_docs: int = 200,
    turns: int = 3,
    test_per_mille: int = 500,
) -> BuiltTask:
    root = str(wordnet.wordnet_dir(wordnet_dir))
    docs = conversations(candidates(root), turns)
    held = [int(hashlib.sha1(d[0]["id"].encode()).hexdigest()[:8], 16) % 1000 < test_per_mille for d in docs]
    test = [i for d, h in zip(docs, held) if h for i in d][: num_test_docs * turns]
    train = [i for d, h in zip(docs, held) if not h for i in d][: num_train_docs * turns]
    card = f"""Source: WordNet 3.0 (Princeton University; WordNet licence), the database files of Debian's
`wordnet-base` package read directly (in {root}). Construction: a synset with a quoted example sentence that
contains one of its single-word lower-case lemmas, and a definition (gloss before the first ";", 3+ words)
containing none of its words; synsets ordered by a hash of their id, {turns} at a time form a document (their
example sentences) asked about in turn: `Which word of the text means "<definition>"?`, the answer being the
lemma. Prompt (CoQA in GPT-2, section 3.5): the document, the previous turns as `Q: ... / A: ...` with their
gold answers, then `Q: <question>` / `A:`; greedy decoding to the end of the line; metrics: SQuAD's F1 and
exact match (answers lower-cased, punctuation and articles removed). A hash of a document's first id puts it
in the test or train split ({num_test_docs} and {num_train_docs} documents at most).
Item id: `wn30-qa:<part of speech><synset offset>` (the synset asked about)."""
    return BuiltTask(
        "wordnet_qa", {"train": train, "test": test}, _baselines(test), card, {"turns": turns, "wordnet_dir": root}
    )
