"""Sequence labelling from Python's HTML documentation (Debian's ``python3-doc``): BIO tags of the
references to Python objects, as the authors marked them up.

Sphinx renders a cross-reference role (``:func:`dump```, ``:class:`dict```, ...) as
``<code class="xref py py-func">``; the pages of ``/usr/share/doc/python3-doc/html`` hold eight such
roles in running text (counts over the 530 pages): ``class`` 8,057, ``mod`` 7,601, ``func`` 6,365,
``meth`` 6,193, ``exc`` 2,572, ``attr`` 2,147, ``const`` 1,698, ``data`` 1,352 -- the label set.

A page's paragraphs (``<p>`` outside the sidebar, header and footer; code blocks never) are split
into words -- ``\\w+ | [^\\w\\s]+`` inside each piece of text, as the ``word`` tokenizer profile
splits -- and into sentences (after a ``.``, ``?``, ``!`` or ``:`` word outside a reference when the
next word starts with a capital letter, and at the end of a paragraph). A reference's first word is
``B-<role>``, its others ``I-<role>``, every other word ``O``. Pages are held out whole by a hash of
their path: ``test`` (20%), ``labelled`` (30%: the training pool) and ``unlabelled`` (50%: their
words only, for semi-supervised learning). Reads are bounded: a page over ``MAX_PAGE_BYTES`` is
skipped and counted.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator

from data_pipeline.errors import PipelineError

DEFAULT_DIR = "/usr/share/doc/python3-doc/html"
ROLES = ("func", "class", "mod", "exc", "meth", "attr", "data", "const")
TAGS = ("O", *(f"{bio}-{role}" for role in ROLES for bio in "BI"))
MAX_PAGE_BYTES = 4 * 2**20
WORD = re.compile(r"\w+|[^\w\s]+")
XREF = re.compile(r"\bxref py py-(\w+)\b")
SKIPPED_DIVS = ("sphinxsidebar", "related", "footer", "highlight")
ENDS = (".", "?", "!", ":")
MIN_WORDS, MAX_WORDS = 3, 70  # sentences outside this length are dropped


@dataclass(frozen=True)
class TaggedSentence:
    words: tuple[str, ...]
    tags: tuple[str, ...]  # one per word: O, B-<label>, I-<label>
    source: str  # the page (or synset) it comes from


class PydocMissing(PipelineError):
    """The python3-doc HTML pages are not where they were looked for."""


class _Paragraphs(HTMLParser):
    """A page's ``<p>`` elements as lists of (text, role or None) pieces."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[list[tuple[str, str | None, int]]] = []
        self._divs: list[bool] = []  # per open <div>: skipped?
        self._codes: list[tuple[str | None, int]] = []  # per open <code>: its xref role and number
        self._count = 0
        self._in_p = False
        self._pre = 0

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        if tag == "div":
            self._divs.append(any(name in cls for name in SKIPPED_DIVS))
        elif tag == "pre":
            self._pre += 1
        elif tag == "p" and not any(self._divs) and not self._pre:
            self._in_p = True
            self.paragraphs.append([])
        elif tag == "code":
            match = XREF.search(cls)
            self._count += 1
            self._codes.append((match.group(1) if match and match.group(1) in ROLES else None, self._count))

    def handle_endtag(self, tag):
        if tag == "div" and self._divs:
            self._divs.pop()
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)
        elif tag == "p":
            self._in_p = False
        elif tag == "code" and self._codes:
            self._codes.pop()

    def handle_data(self, data):
        if self._in_p:
            role, span = next(((r, n) for r, n in reversed(self._codes) if r), (None, 0))
            self.paragraphs[-1].append((data, role, span))


def paragraph_words(pieces: list[tuple[str, str | None, int]]) -> tuple[list[str], list[str]]:
    """Words and BIO tags of one paragraph: a reference (one ``<code>`` element, ``span`` > 0) is
    one span however many pieces of text it holds."""
    words, tags, last_span = [], [], 0
    for text, role, span in pieces:
        for word in WORD.findall(text):
            tags.append("O" if role is None else f"I-{role}" if span == last_span else f"B-{role}")
            words.append(word)
            last_span = span if role else 0
    return words, tags


def sentences(words: list[str], tags: list[str]) -> Iterator[tuple[list[str], list[str]]]:
    """A paragraph cut after each sentence end (see the module docstring)."""
    start = 0
    for i, (word, tag) in enumerate(zip(words, tags)):
        last = i + 1 == len(words)
        if last or (tag == "O" and word in ENDS and words[i + 1][:1].isupper()):
            yield words[start : i + 1], tags[start : i + 1]
            start = i + 1


def pydoc_dir(root: str | None = None) -> Path:
    path = Path(root or DEFAULT_DIR)
    if not (path / "library").is_dir():
        raise PydocMissing(
            f"Python's HTML documentation is not in {path}: apt-get install -y python3-doc (launch/setup_env.sh does)"
        )
    return path


def page_split(page: str) -> str:
    """``test`` | ``labelled`` | ``unlabelled`` by a hash of the page's path (20 / 30 / 50%)."""
    bucket = int(hashlib.sha1(page.encode()).hexdigest()[:8], 16) % 100
    return "test" if bucket < 20 else "labelled" if bucket < 50 else "unlabelled"


def read_pages(
    root: str | None = None, *, pattern: str = "**/*.html", max_pages: int | None = None, skipped: Counter | None = None
) -> Iterator[tuple[str, list[TaggedSentence]]]:
    """(page path relative to the root, its tagged sentences), for the pages ``pattern`` matches in
    sorted order."""
    base = pydoc_dir(root)
    pages = sorted(p for p in base.glob(pattern) if "_static" not in p.parts)
    for path in pages[:max_pages]:
        page = path.relative_to(base).as_posix()
        if path.stat().st_size > MAX_PAGE_BYTES:
            if skipped is not None:
                skipped["page_too_large"] += 1
            continue
        parser = _Paragraphs()
        parser.feed(path.read_text(encoding="utf-8", errors="replace"))
        parser.close()
        out = []
        for pieces in parser.paragraphs:
            for words, tags in sentences(*paragraph_words(pieces)):
                if MIN_WORDS <= len(words) <= MAX_WORDS:
                    out.append(TaggedSentence(tuple(words), tuple(tags), page))
        yield page, out


def xref_splits(
    root: str | None = None, *, pattern: str = "**/*.html", max_pages: int | None = None
) -> dict[str, list[TaggedSentence]]:
    """``test`` / ``labelled`` / ``unlabelled`` sentences (pages held out whole)."""
    out: dict[str, list[TaggedSentence]] = {"test": [], "labelled": [], "unlabelled": []}
    for page, tagged in read_pages(root, pattern=pattern, max_pages=max_pages):
        out[page_split(page)].extend(tagged)
    return out
