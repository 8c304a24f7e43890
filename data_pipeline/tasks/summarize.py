"""Summarisation of documentation entries, GPT-2's ``TL;DR:`` task (Radford et al. 2019, section 3.6).

An entry of the embedded pydoc corpus (``data_pipeline/embedded.py``) is a signature line followed
by its docstring, indented below it. A docstring's first sentence is, by the convention of PEP 257,
a summary of what the rest says: the rest (at least ``min_words`` words) is the article, the first
sentence the reference summary. The model reads ``<rest>\\nTL;DR:`` and writes a summary, scored
with ROUGE-1/2/L F1 against the first sentence (rouge-score, stemmed) after the first three
generated sentences are kept (the paper's decoding: 100 tokens, top-k sampling with k = 2).

Like the cloze, the test split comes only from documents held out of pretraining (``is_validation``)
and keeps only entries whose text no pretraining document repeats (pydoc prints inherited methods
again under every subclass); the train split (few-shot examples) comes from the other documents.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

from data_pipeline.errors import PipelineError
from data_pipeline.tasks.built import BuiltTask, stable_order
from data_pipeline.tokenize.prepare import is_validation

SIGNATURE = re.compile(r"^[A-Za-z_][\w.]*\(.*\)(?: from [\w.]+)?$")
# A sentence ends at . ! ? followed by space, except after the abbreviations e.g. i.e. etc. and an initial
# (one capital letter).
SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\betc\.)(?<!\b[A-Z]\.)(?<=[.!?])\s+")
WORD = re.compile(r"[A-Za-z]{2,}")


def sentences(text: str) -> list[str]:
    """``text`` cut into sentences (whitespace folded)."""
    return [s for s in SENTENCE_END.split(" ".join(text.split())) if s]


def entries(text: str) -> Iterator[tuple[str, list[list[str]]]]:
    """(signature, docstring paragraphs as lists of lines) for each entry of a pydoc page: a
    signature line and the lines indented deeper below it (pydoc's ``|`` gutters removed)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        body = lines[i].lstrip(" |")
        indent = len(lines[i]) - len(body)
        i += 1
        if not SIGNATURE.match(body.strip()):
            continue
        paragraphs: list[list[str]] = [[]]
        while i < len(lines):
            inner = lines[i].lstrip(" |")
            if inner.strip() and len(lines[i]) - len(inner) <= indent:
                break
            if inner.strip():
                paragraphs[-1].append(inner.strip())
            elif paragraphs[-1]:
                paragraphs.append([])
            i += 1
        yield body.strip(), [p for p in paragraphs if p]


def items(doc: dict, *, min_words: int = 10) -> Iterator[dict]:
    """One item per entry whose first sentence (4+ words, ending in . ! ?) is followed by
    ``min_words``+ words of prose."""
    for k, (signature, paragraphs) in enumerate(entries(doc["text"])):
        if not paragraphs:
            continue
        first = sentences(" ".join(paragraphs[0]))
        rest = " ".join(" ".join(first[1:] + [" ".join(p) for p in paragraphs[1:]]).split())
        words = rest.split()
        prose = sum(bool(WORD.match(w)) for w in words) >= 0.6 * len(words)
        if first[0][-1] not in ".!?" or len(first[0].split()) < 4 or len(words) < min_words or not prose:
            continue
        yield {"id": f"{doc['id']}/e{k}", "signature": signature, "article": rest, "summary": first[0]}


def _lead_baseline(rows: list[dict]) -> dict[str, float]:
    """ROUGE of the trivial summary: the article's first sentence (the lead baseline)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for r in rows:
        scores = scorer.score(r["summary"], sentences(r["article"])[0])
        for key in totals:
            totals[key] += scores[key].fmeasure
    return {f"{key}: the article's first sentence": v / len(rows) for key, v in totals.items()}


def build(
    documents: Iterable[dict] | None = None,
    *,
    per_mille: int = 50,
    max_train: int = 500,
    max_test: int | None = None,
    min_words: int = 10,
) -> BuiltTask:
    if documents is None:
        from data_pipeline.embedded import embedded_documents

        documents = embedded_documents()
    test, train, seen = [], [], set()
    for doc in documents:
        held = is_validation(doc["id"], per_mille)
        rows = list(items(doc, min_words=min_words))
        (test if held else train).extend(rows)
        if not held:
            seen.update(r["article"] for r in rows)
    test = [r for r in test if r["article"] not in seen]  # text a pretraining document repeats is not held out
    unique = {r["article"]: r for r in reversed(test)}  # one item per text (the first document's)
    test = stable_order(list(unique.values()))[:max_test]
    train = stable_order(list({r["article"]: r for r in reversed(train)}.values()))[:max_train]
    if not test or not train:
        raise PipelineError(f"doc_summary: {len(test)} test and {len(train)} train items; give more documents")
    card = f"""Source: the Python standard library's documentation as rendered by `pydoc` (the embedded corpus,
`data_pipeline/embedded.py`; no download). Construction: each entry (a signature line and the docstring
indented below it) whose docstring's first sentence has 4+ words, ends in . ! ? and is followed by {min_words}+ words of
prose; article = the docstring after its first sentence, summary = the first sentence (PEP 257's summary
line). Prompt: `<article>` + `\\nTL;DR:` (GPT-2, section 3.6); decoding: 100 tokens, top-k sampling with
k = 2, the first 3 generated sentences kept; metrics: ROUGE-1/2/L F1 (rouge-score, Porter stemmer).
Test items come only from the documents of the 5% validation split of our data configs
(`is_validation(id, {per_mille})`) and only where no other document repeats the text; train items
(few-shot examples) from the rest, one per distinct text. Item id: `<document id>/e<entry index>`."""
    return BuiltTask(
        "doc_summary",
        {"train": train, "test": test},
        _lead_baseline(test),
        card,
        {"per_mille": per_mille, "min_words": min_words},
    )
