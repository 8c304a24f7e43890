"""Main-text extraction with resiliparse (a maintained, fast HTML5 parser with main-content
heuristics that remove navigation, headers, footers and other boilerplate).

The payload is decoded with the charset the server declared; without one (or with one Python
does not know), resiliparse detects it from the bytes. XHTML pages -- served as text/html or
application/xhtml+xml, often starting with ``<?xml`` -- are ordinary HTML here. Plain-text payloads
are decoded; anything else (images, PDFs, archives) is dropped with its content type as reason.
"""

from __future__ import annotations

import codecs
import re

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.encoding import detect_encoding
from resiliparse.parse.html import HTMLTree

from data_pipeline.document import Document
from data_pipeline.recipe import ExtractCfg

HTML_TYPES = {"text/html", "application/xhtml+xml", "application/xml", "text/xml", ""}
TEXT_TYPES = {"text/plain", "text/markdown"}


def _sniff_html(payload: bytes) -> bool:
    head = payload[:512].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html", b"<?xml", b"<head", b"<body")) or b"<html" in head


def _known(charset: str | None) -> str | None:
    if not charset:
        return None
    try:
        return codecs.lookup(charset).name
    except LookupError:
        return None


_INLINE_CHARSET = re.compile(rb"""(?:charset|encoding)\s*=\s*["']?([A-Za-z0-9_.:-]+)""")


def decode(payload: bytes, declared: str | None) -> tuple[str, str, bool]:
    """(text, charset, clean): the server's charset; else one declared in the page (meta tag, XML
    declaration); else UTF-8 when the bytes are valid UTF-8 (most of the web); else resiliparse's
    detector. ``clean`` is False when bytes the charset cannot decode were replaced. The payload is
    decoded once."""
    encoding = declared
    if encoding is None:
        inline = _INLINE_CHARSET.search(payload[:2048])
        encoding = _known(inline.group(1).decode("ascii")) if inline else None
    if encoding is None:
        try:
            return payload.decode("utf-8"), "utf-8", True
        except UnicodeDecodeError:
            encoding = detect_encoding(payload)
    try:
        return payload.decode(encoding), encoding, True
    except UnicodeDecodeError:
        return payload.decode(encoding, "replace"), encoding, False


def extract(doc: Document, cfg: ExtractCfg) -> str | None:
    """Set ``doc.text`` from ``doc.payload``; return a drop reason or None."""
    payload = doc.payload or b""
    doc.payload = None
    mime = doc.meta.get("content_type") or ""
    if not payload.strip():
        return "extract: empty payload"
    declared = _known(doc.meta.get("charset"))
    is_html = mime in HTML_TYPES and (mime or _sniff_html(payload))
    if not is_html and not (mime in TEXT_TYPES or mime.startswith("text/")):
        return f"extract: unsupported content type {mime.split('/')[0]}/*"
    decoded, doc.meta["charset"], clean = decode(payload, declared)
    if not clean and decoded.count("\ufffd") > cfg.max_replacement_frac * len(decoded):
        return "extract: undecodable text"
    if is_html:
        text = extract_plain_text(
            HTMLTree.parse(decoded),
            main_content=cfg.main_content,
            alt_texts=False,
            links=False,
            form_fields=False,
            noscript=False,
            list_bullets=True,
        )
    else:
        text = decoded
    if not text.strip():
        return "extract: no text"
    doc.text = text.strip()
    return None
