"""Credentials never leave the process: URLs lose their user:password part and secret query
parameters, ``Authorization``/bearer tokens lose their value, and mappings lose the values of
secret-named keys (``password``, ``token``, ``secret``, ``key``, ...) before anything is saved
(meta.json, crash files, fsspec's cache metadata), logged (log records, warnings) or uploaded (W&B).

``redact_process_output`` puts the log records, the warnings and fsspec's cache metadata of the
process under these rules; the ``glm`` command calls it first.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any

HIDDEN = "REDACTED"
SECRET_PARAMS = re.compile(
    r"(token|sig|signature|secret|password|passwd|pwd|key|credential|auth|x-amz-[a-z-]*)", re.IGNORECASE
)
# a mapping's key whose value is a secret: the last word of the key (storage options' key/secret/token)
SECRET_KEY = re.compile(
    r"(?:.*[_\-.])?(password|passwd|pwd|secret|token|auth|authorization|credentials?|key|"
    r"api_?key|access_?key|secret_?key|private_?key|session_?token|sig|signature)",
    re.IGNORECASE,
)
# a URL, without the punctuation of the sentence around it ("reading URL: ...", "(URL)")
URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]*[^\s\"'<>.,:;!?)\]}]")
# user:password@ of a URL: everything after :// up to its last @ before the path, query or fragment
USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/?#]*@")
QUERY_PARAM = re.compile(r"([?&;])([^=&;#\s]+)=([^&;#\s]*)")
# "Authorization: Bearer x", "authorization=Basic x", '"Authorization": "token x"'; a bare "Bearer x"
AUTH_HEADER = re.compile(
    r"(\bauthorization[\"']?\s*[:=]\s*[\"']?)(?:(bearer|basic|token|digest)\s+)?[^\s\"',;}]+", re.IGNORECASE
)
BEARER = re.compile(r"\b(bearer)\s+(?!REDACTED)[A-Za-z0-9\-._~+/]{8,}=*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``https://user:token@host/p?sig=abc&x=1`` -> ``https://REDACTED@host/p?sig=REDACTED&x=1``;
    every other byte of the URL is kept."""
    url = USERINFO.sub(lambda m: f"{m.group(1)}{HIDDEN}@", url)
    return QUERY_PARAM.sub(
        lambda m: f"{m.group(1)}{m.group(2)}={HIDDEN}" if SECRET_PARAMS.search(m.group(2)) else m.group(0), url
    )


def redact_text(text: str) -> str:
    """``text`` with every URL redacted and every authorization header's or bearer token's value hidden."""
    text = URL.sub(lambda m: redact_url(m.group(0)), text)
    text = AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) + ' ' if m.group(2) else ''}{HIDDEN}", text)
    return BEARER.sub(lambda m: f"{m.group(1)} {HIDDEN}", text)


def redact(value: Any) -> Any:
    """``value`` with every string inside (nested dicts, lists, fsspec chains) redacted, and the value
    of every secret-named key of a mapping hidden."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            k: HIDDEN
            if isinstance(k, str) and SECRET_KEY.fullmatch(k) and isinstance(v, (str, bytes)) and v
            else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value


class RedactingFilter(logging.Filter):
    """A handler filter: the record's message (and its traceback) redacted before it is formatted."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return True


def redact_process_output() -> None:
    """Redact what this process logs (every handler of the root logger), warns and writes as fsspec
    cache metadata. Idempotent."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
    if not getattr(warnings.showwarning, "redacts", False):
        warnings.showwarning = _redacting_showwarning(warnings.showwarning)
    _redact_cache_metadata()


def _redacting_showwarning(show):
    def showwarning(message, category, filename, lineno, file=None, line=None):
        show(redact_text(str(message)), category, filename, lineno, file, line)

    showwarning.redacts = True
    return showwarning


def _redact_cache_metadata() -> None:
    """fsspec's filecache and blockcache keep a ``cache`` JSON file beside the cached bytes, keyed by
    the original URL -- a presigned URL's signature or a user:password would sit on the node's disk.
    The file is written with every URL redacted. A redacted key no longer matches its URL when another
    process loads the file, so a URL with credentials is fetched again by each process (its cached
    bytes keep the name fsspec derives from the whole URL); URLs without credentials are unchanged."""
    try:
        from fsspec.implementations.cache_metadata import CacheMetadata
    except ImportError:
        return
    save = CacheMetadata._save
    if getattr(save, "redacts", False):
        return

    def _save(self, metadata_to_save: dict, fn: str) -> None:
        clean = {
            redact_text(k): {**d, "original": redact_text(d["original"])} if isinstance(d.get("original"), str) else d
            for k, d in metadata_to_save.items()
        }
        save(self, clean, fn)

    _save.redacts = True
    CacheMetadata._save = _save
