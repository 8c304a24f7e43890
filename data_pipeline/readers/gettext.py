"""gettext message catalogs as translation pairs: ``(msgid, msgstr, meta)`` records.

Reads compiled catalogs (``.mo``, GNU's binary format, little- or big-endian) and source catalogs
(``.po``) with bounded parsers of our own (a file is refused past ``max_bytes`` before it is read;
every offset of a ``.mo`` is checked against the file), so a damaged catalog is counted, never
trusted. Python's ``gettext`` module is used only for what it does well: evaluating a catalog's
``Plural-Forms`` expression (``gettext.c2py``).

What is yielded and what is skipped (counted in ``skipped`` by reason):

- the header entry (``msgid ""``) is read for the charset and plural rule, never yielded;
- untranslated entries (empty ``msgstr``), fuzzy entries (``#, fuzzy``: a guess the translator has
  not confirmed; ``.mo`` files never hold them) and obsolete ones (``#~``) are skipped;
- a plural entry gives two pairs: the English singular with the form the rule picks for n = 1,
  the English plural with the form it picks for n = 2 (``meta["plural"]``: ``"one"`` / ``"other"``);
- a pair whose format placeholders differ (``%s``, ``%1$d``, ``%(name)s``, ``{name}``, compared as
  multisets with positions dropped) is skipped as a broken translation.

``meta``: ``id`` (stable: catalog name and a hash of context + msgid, ``/other`` for the plural),
``catalog``, ``context`` (``msgctxt`` or None), ``plural`` (None, ``"one"``, ``"other"``), ``flags``
(``.po`` flags such as ``c-format``), ``placeholders`` (sorted list) and ``index`` (entry number).
"""

from __future__ import annotations

import gettext as _gettext
import hashlib
import logging
import os
import re
import struct
from collections import Counter
from typing import Iterable, Iterator

log = logging.getLogger(__name__)

Record = tuple[str, str, dict]
MAX_CATALOG_BYTES = 32 << 20  # the largest Debian catalog here is ~0.5 MiB
MO_MAGIC = 0x950412DE
# printf conversions (flags, width and precision are the translator's to change; a space flag is left out: "% o"
# in prose is a percent sign and a word) and Python's brace fields ({}, {0}, {name}: lower-case names only; an
# upper-case {WORD} is a metavariable of the text, translated with it).
PLACEHOLDER = re.compile(
    r"%(\d+\$)?(\([^)]*\))?[-+#0']*(?:\d+|\*)?(?:\.\d+)?(?:hh|h|ll|l|L|q|j|z|t)?"
    r"([diouxXeEfFgGcsaAp])|\{([a-z_][a-z_0-9]*|\d*)(?:![rsa])?(?::[^{}]*)?\}"
)
PO_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", '"': '"', "\\": "\\"}


class CatalogError(ValueError):
    """A catalog that cannot be read (truncated, bad offsets, syntax); the reason is the message."""


def placeholders(text: str) -> list[str]:
    """Format placeholders as a sorted list (``%s``, ``%(name)d``, ``{name}``), positions, flags and
    widths dropped: what a translation must keep."""
    found = []
    for m in PLACEHOLDER.finditer(text.replace("%%", "")):
        _, name, conversion, field = m.groups()
        found.append(f"%{name or ''}{conversion}" if conversion else f"{{{field}}}")
    return sorted(found)


def catalog_paths(language: str = "de", roots: Iterable[str] = ("/usr/share/locale",)) -> list[str]:
    """Every ``.mo`` / ``.po`` of ``language`` under ``roots`` (``<root>/<language>/LC_MESSAGES/``,
    or anywhere below a root for a package's ``locale`` folder), sorted."""
    found = set()
    for root in roots:
        for folder, _, files in os.walk(root):
            parts = folder.split(os.sep)
            if language in parts and parts[-1] == "LC_MESSAGES" and parts[-2] == language:
                found.update(os.path.join(folder, f) for f in files if f.endswith((".mo", ".po")))
    return sorted(found)


def read_catalogs(paths: Iterable[str], *, skipped: Counter | None = None, **options) -> Iterator[Record]:
    """``read_catalog`` over several files; an unreadable file is counted and skipped."""
    skipped = Counter() if skipped is None else skipped
    for path in paths:
        try:
            yield from read_catalog(path, skipped=skipped, **options)
        except (CatalogError, OSError) as err:
            skipped[f"unreadable catalog: {type(err).__name__}"] += 1
            log.warning("skipped the unreadable catalog %s: %s", path, err)  # the count alone names no file


def read_catalog(
    path: str, *, skipped: Counter | None = None, keep_fuzzy: bool = False, max_bytes: int = MAX_CATALOG_BYTES
) -> Iterator[Record]:
    """The translation pairs of one ``.mo`` or ``.po`` file (see the module docstring); raises
    ``CatalogError`` for a file that is too large or not a catalog."""
    skipped = Counter() if skipped is None else skipped
    size = os.path.getsize(path)
    if size > max_bytes:
        raise CatalogError(f"{path}: {size} bytes, more than the {max_bytes} allowed")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    entries = _mo_entries(data, path) if path.endswith(".mo") else _po_entries(data, path)
    catalog = os.path.splitext(os.path.basename(path))[0]
    header, entries = _split_header(entries)
    charset, rule = _header_fields(header)
    for index, entry in enumerate(entries):
        yield from _pairs(entry, index, catalog, charset, rule, skipped, keep_fuzzy)


def _split_header(entries: list[dict]) -> tuple[bytes, list[dict]]:
    header = next((e["msgstr"][0] for e in entries if e["msgid"] == b"" and e["context"] is None), b"")
    return header, [e for e in entries if not (e["msgid"] == b"" and e["context"] is None)]


def _header_fields(header: bytes) -> tuple[str, callable]:
    text = header.decode("utf-8", "replace")
    charset = re.search(r"charset=([A-Za-z0-9_.:-]+)", text)
    plural = re.search(r"Plural-Forms:.*?plural=([^;\n]+)", text)
    try:
        rule = _gettext.c2py(plural.group(1)) if plural else _gettext.c2py("n != 1")
    except (ValueError, SyntaxError, RecursionError):
        rule = None  # plural entries of this catalog are skipped (counted)
    name = charset.group(1) if charset and charset.group(1).upper() != "CHARSET" else "utf-8"
    try:
        "".encode(name)
    except LookupError:
        name = "utf-8"
    return name, rule


def _pairs(
    entry: dict, index: int, catalog: str, charset: str, rule, skipped: Counter, keep_fuzzy: bool
) -> Iterator[Record]:
    if entry.get("obsolete"):
        skipped["obsolete"] += 1
        return
    if "fuzzy" in entry["flags"] and not keep_fuzzy:
        skipped["fuzzy"] += 1
        return
    try:
        ids = [entry["msgid"].decode(charset)] + ([entry["plural"].decode(charset)] if entry["plural"] else [])
        forms = [s.decode(charset) for s in entry["msgstr"]]
        context = entry["context"].decode(charset) if entry["context"] is not None else None
    except UnicodeDecodeError:
        skipped["undecodable"] += 1
        return
    if not any(forms):
        skipped["untranslated"] += 1
        return
    key = hashlib.sha1(((context or "") + "\x04" + ids[0]).encode()).hexdigest()[:12]
    if len(ids) == 1:
        wanted = [(ids[0], forms[0], None)]
    elif rule is None:
        skipped["plural rule unreadable"] += 1
        return
    else:
        wanted = [(ids[0], _form(forms, rule(1)), "one"), (ids[1], _form(forms, rule(2)), "other")]
    for source, target, plural in wanted:
        if not target:
            skipped["untranslated"] += 1
        elif placeholders(source) != placeholders(target):
            skipped["placeholder mismatch"] += 1
        else:
            meta = {
                "id": f"{catalog}:{key}" + ("/other" if plural == "other" else ""),
                "catalog": catalog,
                "context": context,
                "plural": plural,
                "flags": sorted(entry["flags"]),
                "placeholders": placeholders(source),
                "index": index,
            }
            yield source, target, meta


def _form(forms: list[str], k: int) -> str:
    return forms[k] if 0 <= k < len(forms) else ""


def _mo_entries(data: bytes, path: str) -> list[dict]:
    """Entries of a compiled catalog: a header of seven 32-bit words, then two tables of
    (length, offset) pairs for the original and the translated strings."""
    if len(data) < 28:
        raise CatalogError(f"{path}: {len(data)} bytes, too short for a .mo header")
    for order in "<>":
        magic, revision, count, originals, translations = struct.unpack(order + "5I", data[:20])
        if magic == MO_MAGIC:
            break
    else:
        raise CatalogError(f"{path}: not a .mo file (magic number {data[:4].hex()})")
    if revision >> 16 > 1:
        raise CatalogError(f"{path}: .mo major revision {revision >> 16} is not one this reader knows")
    if max(originals, translations) + 8 * count > len(data):
        raise CatalogError(f"{path}: string tables run past the end of the file")

    def string(table: int, i: int) -> bytes:
        length, offset = struct.unpack_from(order + "2I", data, table + 8 * i)
        if offset + length > len(data):
            raise CatalogError(f"{path}: string {i} runs past the end of the file")
        return data[offset : offset + length]

    entries = []
    for i in range(count):
        original, translated = string(originals, i), string(translations, i)
        context, _, original = original.rpartition(b"\x04") if b"\x04" in original else (None, b"", original)
        msgid, _, plural = original.partition(b"\x00")
        entries.append(
            {
                "context": context,
                "msgid": msgid,
                "plural": plural or None,
                "msgstr": translated.split(b"\x00"),
                "flags": set(),
            }
        )
    return entries


def _po_entries(data: bytes, path: str) -> list[dict]:
    """Entries of a source catalog: keywords (``msgctxt msgid msgid_plural msgstr msgstr[N]``)
    followed by quoted strings that continue on the next lines; ``#,`` flag comments; ``#~``
    marks an obsolete entry. Strings stay bytes until the header names the charset."""
    entries: list[dict] = []
    entry, field = _new_entry(), None
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        line = raw.strip()
        obsolete = line.startswith(b"#~")
        if obsolete:
            line = line[2:].strip()
        elif line.startswith(b"#"):
            if entry["msgstr"]:
                entries.append(entry)
                entry, field = _new_entry(), None
            if line.startswith(b"#,"):
                entry["flags"].update(f.strip().decode("ascii", "replace") for f in line[2:].split(b","))
            continue
        if not line:
            continue
        keyword, _, rest = line.partition(b" ") if not line.startswith(b'"') else (b"", b"", line)
        if keyword:
            if keyword in (b"msgctxt", b"msgid") and entry["msgstr"]:
                entries.append(entry)
                entry = _new_entry()
            field = _po_field(keyword, entry, path, lineno)
        if field is None:
            raise CatalogError(f"{path}:{lineno}: a string outside any msgid / msgstr")
        entry["obsolete"] |= obsolete
        field.append(_po_string(rest.strip(), path, lineno))
    if entry["msgstr"]:
        entries.append(entry)
    for e in entries:
        e["context"] = None if e["context"] is None else b"".join(e["context"])
        e["msgid"], e["plural"] = b"".join(e["msgid"]), (b"".join(e["plural"]) if e["plural"] else None)
        e["msgstr"] = [b"".join(e["msgstr"][k]) for k in sorted(e["msgstr"])]
    return entries


def _new_entry() -> dict:
    return {"context": None, "msgid": [], "plural": None, "msgstr": {}, "flags": set(), "obsolete": False}


def _po_field(keyword: bytes, entry: dict, path: str, lineno: int) -> list:
    if keyword == b"msgctxt":
        entry["context"] = []
        return entry["context"]
    if keyword == b"msgid":
        return entry["msgid"]
    if keyword == b"msgid_plural":
        entry["plural"] = []
        return entry["plural"]
    form = re.fullmatch(rb"msgstr(?:\[(\d{1,3})\])?", keyword)
    if form is None:
        raise CatalogError(f"{path}:{lineno}: unknown keyword {keyword[:40].decode('ascii', 'replace')!r}")
    return entry["msgstr"].setdefault(int(form.group(1) or 0), [])


def _po_string(quoted: bytes, path: str, lineno: int) -> bytes:
    """A C string literal of a .po line: its escapes resolved, still bytes."""
    if len(quoted) < 2 or not quoted.startswith(b'"') or not quoted.endswith(b'"'):
        raise CatalogError(f"{path}:{lineno}: expected a quoted string")
    body, out, i = quoted[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i : i + 1]
        if ch != b"\\":
            out += ch
            i += 1
            continue
        nxt = body[i + 1 : i + 2].decode("ascii", "replace")
        octal = re.match(rb"[0-7]{1,3}", body[i + 1 : i + 4])
        if octal:
            out.append(int(octal.group(), 8) & 0xFF)
            i += 1 + len(octal.group())
        elif nxt in PO_ESCAPES:
            out += PO_ESCAPES[nxt].encode()
            i += 2
        else:
            raise CatalogError(f"{path}:{lineno}: unknown escape \\{nxt}")
    return bytes(out)
