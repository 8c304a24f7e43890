"""Which locations may be opened at all: a path, or an fsspec URL of a storage protocol, never a command.

Every file the project opens (crawl inputs, ``data.source``, shards, manifests, a pipeline's output,
checkpoints) is named by a path or an fsspec URL (docs/architecture.md, decision 11). webdataset's
``pipe:cmd`` runs ``cmd`` in a shell, and fsspec knows protocols that reach far beyond storage
(``reference::``, ``ssh://``, ...); both are refused with one line.
"""

from __future__ import annotations

import re

STORAGE_SCHEMES = ("file", "local", "http", "https", "s3", "s3a", "gs", "gcs", "hf", "memory")
CACHE_SCHEMES = ("simplecache", "filecache", "blockcache")  # only in front of a storage link: CACHE::URL
ALLOWED_FORMS = (
    "a path or a file://, http(s)://, s3://, gs://, gcs://, hf:// or memory:// URL, optionally "
    "behind simplecache::, filecache:: or blockcache::"
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_BARE_PROTOCOL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")


def is_url(location: str) -> bool:
    """Whether ``location`` is an fsspec URL (``s3://...``, ``simplecache::...``) rather than a path."""
    return "://" in location or "::" in location


def check_scheme(url: str, key: str) -> None:
    """Raise ``ValueError`` (one line naming ``key`` and the URL) unless ``url`` is a plain path or
    an fsspec URL whose every ``::``-chained link uses an allowed protocol. ``pipe:`` (a shell
    command in webdataset) is refused with its own message."""
    links = url.split("::")
    for i, link in enumerate(links):
        scheme = scheme_of(link, last=i == len(links) - 1)
        if scheme is None:
            continue
        if scheme == "pipe":
            raise ValueError(
                f"{key}={url!r}: 'pipe:' runs a shell command; shard and input locations are URLs "
                f"or paths, never commands (use {ALLOWED_FORMS})"
            )
        allowed = STORAGE_SCHEMES if i == len(links) - 1 else STORAGE_SCHEMES + CACHE_SCHEMES
        if scheme not in allowed:
            raise ValueError(
                f"{key}={url!r}: scheme '{scheme}:' is not allowed; use {ALLOWED_FORMS} "
                f"(write ./ before a local file name that holds a colon)"
            )


def scheme_of(link: str, *, last: bool) -> str | None:
    """The protocol of one link of a chained URL; None for a plain path (or a Windows drive)."""
    found = _SCHEME.match(link)
    if found and len(found.group(1)) > 1:
        return found.group(1).lower()
    if not last and _BARE_PROTOCOL.match(link):  # "simplecache" in "simplecache::s3://..."
        return link.lower()
    return None
