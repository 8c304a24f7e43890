"""Closed-book question answering from the Python FAQ (GPT-2's Natural Questions setting, Radford
et al. 2019, section 3.5): ``Q: <question>`` / ``A:`` after a few question/answer pairs of the
training split; greedy decoding to the end of the line; SQuAD's F1 and exact match against the
first sentence of the FAQ's own answer.

Read from Python's HTML documentation in Debian's ``python3-doc`` (``faq/*.html``): each
``<h3>`` of a page is a question, the first paragraph after it its answer; both reduced to text
(tags dropped, entities decoded, whitespace folded), each page read with a size bound; the pages'
navigation headings are not in question sections and are not read. Questions
are held out by a hash of their id (the page and the heading's anchor).
"""

from __future__ import annotations

import hashlib
import html
import re
from pathlib import Path

from data_pipeline.tasks.built import BuiltTask, stable_order
from data_pipeline.tasks.answers import exact_match, f1

DEFAULT_DIR = "/usr/share/doc/python3-doc/html"
MAX_PAGE_BYTES = 4 << 20
SECTION = re.compile(
    r'<section id="(?P<anchor>[^"]+)">\s*<h3>(?P<question>.*?)</h3>\s*'
    r"(?P<body>.*?)(?=<section|</section>)",
    re.S,
)
PARAGRAPH = re.compile(r"<p>(.*?)</p>", re.S)
TAG = re.compile(r"<[^>]+>")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


class FaqMissing(FileNotFoundError):
    """python3-doc's FAQ pages are not where they were looked for."""


def _text(fragment: str) -> str:
    return " ".join(html.unescape(TAG.sub("", fragment)).replace("¶", "").split())


def first_sentence(text: str) -> str:
    return SENTENCE_END.split(text, maxsplit=1)[0]


def questions(root: str | None = None) -> tuple[list[dict], dict[str, int]]:
    """Every FAQ question with a one-paragraph-or-more answer, and the counts of what was skipped."""
    faq = Path(root or DEFAULT_DIR) / "faq"
    pages = sorted(p for p in faq.glob("*.html") if p.name != "index.html") if faq.is_dir() else []
    if not pages:
        raise FaqMissing(f"the Python FAQ is not in {faq}: apt-get install -y python3-doc (launch/setup_env.sh does)")
    rows, skipped = [], {"page too large": 0, "no answer paragraph": 0}
    for page in pages:
        if page.stat().st_size > MAX_PAGE_BYTES:
            skipped["page too large"] += 1
            continue
        for m in SECTION.finditer(page.read_text(encoding="utf-8", errors="replace")):
            question, paragraph = _text(m["question"]), PARAGRAPH.search(m["body"])
            if paragraph is None or not _text(paragraph[1]):
                skipped["no answer paragraph"] += 1
                continue
            answer = _text(paragraph[1])
            rows.append(
                {
                    "id": f"pyfaq:{page.stem}#{m['anchor']}",
                    "question": question,
                    "answer": first_sentence(answer),
                    "paragraph": answer,
                }
            )
    return stable_order(rows), skipped


def _baselines(test: list[dict]) -> dict[str, float]:
    """Trivial answers: the question itself; the most common first sentence's opening words."""
    out = {}
    for name, guess in (("the question repeated", lambda r: r["question"]), ('"Yes."', lambda r: "Yes.")):
        out[f"f1: {name}"] = sum(f1(guess(r), [r["answer"]]) for r in test) / len(test)
        out[f"exact_match: {name}"] = sum(exact_match(guess(r), [r["answer"]]) for r in test) / len(test)
    return out


def build(pydoc_dir: str | None = None, *, test_per_mille: int = 500) -> BuiltTask:
    rows, skipped = questions(pydoc_dir)
    held = [int(hashlib.sha1(r["id"].encode()).hexdigest()[:8], 16) % 1000 < test_per_mille for r in rows]
    test = [r for r, h in zip(rows, held) if h]
    train = [r for r, h in zip(rows, held) if not h]
    where = Path(pydoc_dir or DEFAULT_DIR) / "faq"
    card = f"""Source: the Python FAQ of Python's documentation (Python Software Foundation; PSF licence), the HTML
pages of Debian's `python3-doc` package (in {where}). Construction: each question's `<h3>` heading (some are
statements: "My class defines __del__ but it is not called ...") is a question; the first paragraph after
it, reduced to text, is its answer; the gold answer is that paragraph's
first sentence (the whole paragraph is kept in `paragraph`). Skipped: {skipped}. A hash of the id puts a
question in the test or the train split. Prompt (closed-book QA as GPT-2's Natural Questions, section 3.5):
few-shot `Q: ... / A: ...` pairs of the train split, then `Q: <question>` / `A:`; greedy decoding to the end of
the line; metrics: SQuAD's F1 and exact match. Item id: `pyfaq:<page>#<heading anchor>`."""
    return BuiltTask(
        "python_faq",
        {"train": train, "test": test},
        _baselines(test),
        card,
        {"skipped": skipped, "pydoc_dir": str(where.parent)},
    )
