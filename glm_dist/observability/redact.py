"""Credentials never leave the process: URLs in configs and manifests lose their user:password
part and secret query parameters before they are saved (meta.json) or uploaded (W&B)."""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

SECRET_PARAMS = re.compile(r"(token|sig|signature|secret|password|passwd|key|credential|auth|x-amz-[a-z-]*)",
                           re.IGNORECASE)
URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]+")
HIDDEN = "REDACTED"


def redact_url(url: str) -> str:
    """``https://user:token@host/p?sig=abc&x=1`` -> ``https://REDACTED@host/p?sig=REDACTED&x=1``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{HIDDEN}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, HIDDEN if SECRET_PARAMS.search(k) else v) for k, v in pairs], safe="/:")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact(value: Any) -> Any:
    """``value`` with every URL inside (nested dicts, lists, strings, fsspec chains) redacted."""
    if isinstance(value, str):
        return URL.sub(lambda m: redact_url(m.group(0)), value)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value
