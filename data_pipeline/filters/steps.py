"""The filter steps of a recipe as a list: one builder per stage name, in the recipe's order.

A step is a function ``Document -> reason | None`` (None keeps the document); it may rewrite the
document's text (C4's line rules) or add metadata (language, quality score). :func:`apply` runs a
document through the list, counts what every step saw, kept and dropped (documents and bytes), and
turns an exception inside a step into a counted drop, so one bad page never ends a long job.
"""

from __future__ import annotations

import traceback
from typing import Callable

from data_pipeline.document import Document, Stats, nbytes
from data_pipeline.filters import quality
from data_pipeline.recipe import Recipe

Step = Callable[[Document], "str | None"]
Builder = Callable[[Recipe, Stats], Step]


def _url(r: Recipe, stats: Stats) -> Step:
    from data_pipeline.filters.url import UrlFilter

    url_filter = UrlFilter(r.url)
    return lambda doc: url_filter(doc.meta.get("url"))


def _extract(r: Recipe, stats: Stats) -> Step:
    from data_pipeline.extract.html import extract

    return lambda doc: extract(doc, r.extract) if doc.payload is not None else None


def _language(r: Recipe, stats: Stats) -> Step:
    from data_pipeline.filters.language import identify

    cfg = r.language

    def language(doc: Document) -> str | None:
        lang, score = identify(doc.text, cfg.max_chars)
        doc.meta["language"], doc.meta["language_score"] = lang, round(score, 4)
        stats.languages[lang] += 1
        if cfg.languages and lang not in cfg.languages:
            return f"language: {lang}"
        if score < cfg.threshold:
            return f"language: score below {cfg.threshold:g}"
        return None

    return language


def _rewriting(fn: Callable, cfg: object, *extra: object) -> Step:
    """A rule set of ``filters/quality.py``, ``(text, cfg, *extra) -> (reason, text)``, as a step that
    keeps the text the rules return (C4's line rules remove lines)."""

    def step(doc: Document) -> str | None:
        reason, text = fn(doc.text, cfg, *extra)
        if reason is None:
            doc.text = text
        return reason

    return step


def _classifier(r: Recipe, stats: Stats) -> Step:
    from data_pipeline.filters.classifier import QualityClassifier

    clf, cfg = QualityClassifier.load(r.classifier.model), r.classifier
    return lambda doc: clf.decide(doc, cfg.alpha, cfg.seed)


BUILDERS: dict[str, Builder] = {
    "url": _url,
    "extract": _extract,
    "language": _language,
    "gopher_repetition": lambda r, stats: _rewriting(quality.gopher_repetition, r.gopher_repetition),
    "gopher_quality": lambda r, stats: _rewriting(quality.gopher_quality, r.gopher_quality),
    "c4": lambda r, stats: _rewriting(quality.c4, r.c4, quality.load_bad_words(r.c4.bad_words_file)),
    "fineweb": lambda r, stats: _rewriting(quality.fineweb, r.fineweb),
    "classifier": _classifier,
}


def build_steps(recipe: Recipe, stats: Stats) -> list[tuple[str, Step]]:
    """The recipe's enabled stages, in its order, each as (name, step)."""
    return [(name, BUILDERS[name](recipe, stats)) for name in recipe.stages if getattr(recipe, name).enabled]


def apply(doc: Document, steps: list[tuple[str, Step]], stats: Stats, path: str) -> tuple[str | None, str | None]:
    """(reason, step name) of the step that drops ``doc``, or (None, None) when every step keeps it."""
    size = len(doc.payload) if doc.payload is not None else nbytes(doc.text)
    for name, step in steps:
        st = stats.stage(name)
        st.seen += 1
        st.bytes_in += size
        text = doc.text
        try:
            reason = step(doc)
        except Exception as err:  # one bad page must not end a long job: count it and go on
            detail = f"{doc.id}: {err}\n{traceback.format_exc(limit=3)}"
            stats.error(f"{name}: {type(err).__name__}", path, None, detail)
            reason = f"{name}: processing error ({type(err).__name__})"
        if reason is not None:
            st.dropped[reason] += 1
            doc.payload = None
            return reason, name
        st.kept += 1
        if doc.payload is None and doc.text is not text:
            size = nbytes(doc.text)  # measured again only when a stage changed the text
        st.bytes_kept += size
    return None, None
