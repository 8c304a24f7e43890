"""A last-word cloze over documentation paragraphs (LAMBADA-style; Paperno et al. 2016).

Paragraphs of prose from the embedded pydoc corpus (``data_pipeline/embedded.py``): the pydoc
gutter and indentation are removed and a paragraph's lines joined. Every sentence that ends in a
lower-case word of three or more letters, after at least ``min_context`` words of the paragraph,
gives one item: the paragraph up to that word is the context, the word is the target (scored as
`` word``: accuracy of greedy decoding and perplexity, lm-eval's LAMBADA metrics).

The test split comes only from the documents held out of pretraining by our data configs
(``is_validation(id, 50)``: the 5% validation split), so a model trained on the embedded corpus
never saw them; the train split (few-shot examples) comes from the other documents.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Iterator

from data_pipeline.errors import PipelineError
from data_pipeline.tasks.built import BuiltTask, stable_order
from data_pipeline.tokenize.prepare import is_validation

PROSE_WORD = re.compile(r"^[A-Za-z][A-Za-z'-]*[,;:.]?$")
TARGET = re.compile(r"^([a-z]{3,})\.$")


def paragraphs(text: str) -> Iterator[str]:
    """Blank-line separated paragraphs, pydoc's ``|`` gutter and indentation removed."""
    lines: list[str] = []
    for line in text.splitlines():
        s = line.strip().lstrip("|").strip()
        if s:
            lines.append(s)
        elif lines:
            yield " ".join(lines)
            lines = []
    if lines:
        yield " ".join(lines)


def items(doc: dict, *, min_context: int = 12, prose_share: float = 0.8) -> Iterator[dict]:
    """One item per sentence-final word of a prose paragraph (mostly plain words, not code)."""
    for k, para in enumerate(paragraphs(doc["text"])):
        words = para.split()
        if sum(bool(PROSE_WORD.match(w)) for w in words) < prose_share * len(words):
            continue
        for i, word in enumerate(words[min_context:], min_context):
            m = TARGET.match(word)
            if m:
                yield {"id": f"{doc['id']}/p{k}/w{i}", "context": " ".join(words[:i]), "target": m.group(1)}


def _context_guess(context: str) -> str:
    """A trivial reader: the context's most frequent word of three or more letters."""
    words = re.findall(r"[a-z]{3,}", context)
    return Counter(words).most_common(1)[0][0] if words else ""


def build(
    documents: Iterable[dict] | None = None,
    *,
    per_mille: int = 50,
    max_train: int = 1000,
    max_test: int | None = None,
    min_context: int = 12,
) -> BuiltTask:
    if documents is None:
        from data_pipeline.embedded import embedded_documents

        documents = embedded_documents()
    test, train = [], []
    for doc in documents:
        (test if is_validation(doc["id"], per_mille) else train).extend(items(doc, min_context=min_context))
    test, train = stable_order(test)[:max_test], stable_order(train)[:max_train]
    if not test or not train:
        raise PipelineError(f"pydoc_cloze: {len(test)} test and {len(train)} train items; give more documents")
    majority = Counter(r["target"] for r in train).most_common(1)[0][0]
    baselines = {
        "acc: the train split's most frequent target": sum(r["target"] == majority for r in test) / len(test),
        "acc: the context's most frequent word": sum(r["target"] == _context_guess(r["context"]) for r in test)
        / len(test),
    }
    card = f"""Source: the Python standard library's documentation as rendered by `pydoc` (the embedded corpus,
`data_pipeline/embedded.py`; it ships with every Python, no download). Construction: prose paragraphs
(>= {100 * 0.8:.0f}% plain words), one item per sentence ending in a lower-case word of 3+ letters after at least
{min_context} words of its paragraph; context = the paragraph up to that word, target = the word (scored as
" word"). Test items come only from the documents of the 5% validation split of our data configs
(`is_validation(id, {per_mille})`), never seen in pretraining; train items (few-shot examples) from the rest.
Item id: `<document id>/p<paragraph>/w<word index>`."""
    return BuiltTask(
        "pydoc_cloze",
        {"train": train, "test": test},
        baselines,
        card,
        {"per_mille": per_mille, "min_context": min_context},
    )
