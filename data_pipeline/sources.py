"""Named offline sources: corpora read from what is installed on the machine, named instead of a path.

``data.source`` (and a mixture source) may be one of these names instead of a path or URL:

- ``embedded``: the standard library's documentation rendered by pydoc (data_pipeline/embedded.py);
- ``manpages`` or ``manpages:/path``: manual pages, roff stripped (data_pipeline/manpages.py);
- ``wordnet`` or ``wordnet:/path``: WordNet's glosses and examples (data_pipeline/wordnet_corpus.py).

A local file that happens to carry one of these names is read as ``./manpages``. Each yields
``{"id", "text"}`` documents in a fixed order and adds what it skipped, by reason, to ``skipped``.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterator

from data_pipeline.embedded import embedded_documents
from data_pipeline.errors import PipelineError
from data_pipeline.manpages import manpage_documents
from data_pipeline.remote import check_scheme
from data_pipeline.wordnet_corpus import wordnet_documents

Reader = Callable[[str | None, Counter], Iterator[dict]]
NAMED: dict[str, Reader] = {
    "embedded": lambda arg, skipped: embedded_documents(),
    "manpages": lambda arg, skipped: manpage_documents(arg, skipped=skipped),
    "wordnet": lambda arg, skipped: wordnet_documents(arg, skipped=skipped),
}
TAKES_PATH = ("manpages", "wordnet")


def named_source(source: str) -> tuple[str, str | None] | None:
    """``(name, path or None)`` for a named source, None for a path or URL."""
    name, sep, arg = source.partition(":")
    if name not in NAMED:
        return None
    if sep and (name not in TAKES_PATH or not arg or arg.startswith("//")):
        raise PipelineError(
            f"data.source={source!r}: {name} takes "
            + (f"an optional local folder ({name}:/path)" if name in TAKES_PATH else "no argument")
        )
    return name, arg or None


def named_documents(source: str, skipped: Counter) -> Iterator[dict]:
    """The documents of the named source ``source`` (see :func:`named_source`)."""
    found = named_source(source)
    if found is None:
        raise PipelineError(f"data.source={source!r} is not one of the named sources {sorted(NAMED)}")
    name, arg = found
    return NAMED[name](arg, skipped)


def check_source(source: str, key: str) -> None:
    """:func:`data_pipeline.remote.check_scheme` for a key that names a source (``data.source``, a
    mixture's ``source``): a named source passes -- ``manpages:/path`` is a name and a local folder,
    not a URL scheme -- and anything else must be an allowed location. ``ValueError``: one line."""
    try:
        named = named_source(source)
    except PipelineError as err:
        raise ValueError(f"{key}: {err}") from None
    if named is None:
        check_scheme(source, key)
