"""The embedded sample crawl: WARC files built from text that ships with Python.

Pages are the documentation of standard-library modules (module, class and function docstrings)
as HTML with site navigation, a cookie banner and a footer around the main text, served the way a
crawl stores them (gzip-per-record WARC with request, response and metadata records). Planted in
it, so that every stage has something to do:

- an exact copy and a lightly edited copy of two pages, each in a different file (dedup);
- a page quoting one item of the sample benchmark (decontamination), which ships alongside;
- junk: lorem ipsum, a navigation-only page, a script-only page, a spam page repeating itself,
  German and French pages, a 404, a PNG image, a page on ``spam.example`` (for a URL block list);
- awkward but good pages: XHTML served as text/html starting with ``<?xml``, and a page in
  ISO-8859-1 declared only in the HTTP header.

Everything is deterministic (fixed dates, record ids from URLs, gzip mtime 0), so the same Python
writes the same bytes.
"""

from __future__ import annotations

import base64
import gzip
import html
import importlib
import inspect
import io
import json
import uuid
import warnings

from data_pipeline.embedded import clean_render
from glm_common.storage import Storage

N_FILES = 4
DATE = "2024-01-01T00:00:00Z"
CRAWL_MODULES = (
    "abc argparse ast asyncio base64 bisect bz2 calendar cmd codecs collections colorsys configparser contextlib "
    "copy csv dataclasses datetime decimal difflib dis email enum filecmp fileinput fnmatch fractions ftplib "
    "functools getopt gettext glob graphlib gzip hashlib heapq hmac html http imaplib inspect io ipaddress "
    "itertools json keyword linecache locale logging lzma mailbox mimetypes netrc numbers operator optparse "
    "pathlib pickle pkgutil platform plistlib poplib pprint queue quopri random re reprlib secrets "
    "selectors shelve shlex shutil signal socket sqlite3 ssl stat string struct subprocess symtable "
    "tarfile tempfile threading timeit token tokenize trace traceback types typing unittest uuid wave "
    "weakref webbrowser xml zipfile zipimport zlib"
).split()
BENCHMARK_MODULE = "statistics"  # its docstrings are the sample benchmark, not crawl pages
EXACT_COPY_OF, NEAR_COPY_OF, LEAK_INTO = "itertools", "configparser", "subprocess"
LEAKED_ITEM = 3  # benchmark line (1-based) planted into the LEAK_INTO page

NAV = (
    '<header><nav class="menu"><a href="/">Home</a> | <a href="/docs/">Docs</a> | <a href="/blog/">Blog</a> | '
    '<a href="/about/">About us</a> | <a href="/contact/">Contact</a></nav></header>'
)
COOKIE = '<div class="cookie-banner">This site uses cookies. <a href="/privacy/">Privacy policy</a></div>'
FOOTER = (
    '<footer><p>Copyright 2024 Example Docs. All rights reserved.</p><p><a href="/terms/">Terms of use</a> | '
    '<a href="/privacy/">Privacy policy</a> | <a href="/sitemap/">Sitemap</a></p></footer>'
)


def _doc_paragraphs(obj) -> list[str]:
    doc = inspect.getdoc(obj) or ""
    paras = []
    for block in doc.split("\n\n"):
        lines = block.strip().splitlines()
        if not lines:
            continue
        if lines[0].startswith((">>>", "    ")) or any(line.startswith("    ") for line in lines):
            continue  # examples and tables: not prose
        para = " ".join(line.strip() for line in lines)
        if len(para.split()) >= 8 and para.endswith((".", "!", "?")):  # prose, not "Methods:" headings
            paras.append(para)
    return paras


def _module_sections(name: str) -> list[tuple[str, list[str]]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = importlib.import_module(name)
    sections = [(f"The {name} module", _doc_paragraphs(module))]
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj):
            paras = _doc_paragraphs(obj)
            if paras:
                sections.append((attr, paras[:3]))
    sections = [(h, p) for h, p in sections if p][:25]
    return sections if sum(len(p.split()) for _, ps in sections for p in ps) >= 150 else []


def _page(title: str, sections: list[tuple[str, list[str]]], extra: str = "") -> str:
    body = "".join(f"<h2>{html.escape(h)}</h2>" + "".join(f"<p>{html.escape(p)}</p>" for p in ps) for h, ps in sections)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>'
        f"<body>{NAV}{COOKIE}<main><article><h1>{html.escape(title)}</h1>{body}{extra}</article></main>"
        f"{FOOTER}</body></html>"
    )


def benchmark_items() -> list[dict]:
    """A small reading-comprehension style benchmark from ``statistics``' docstrings."""
    module = importlib.import_module(BENCHMARK_MODULE)
    items = []
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_") or not inspect.isfunction(obj) or obj.__module__ != module.__name__:
            continue
        passage = " ".join(_doc_paragraphs(obj)[:2])
        if len(passage.split()) >= 13:
            items.append(
                {
                    "passage": passage,
                    "question": f"Which function of the {BENCHMARK_MODULE} module is described?",
                    "answer": attr,
                }
            )
    return items


def _junk_pages() -> list[tuple[str, str, bytes]]:
    lorem = (
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et "
        "dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris. "
    ) * 6
    german = (
        "Die Stadtbibliothek hat am Montag ihre neuen Räume eröffnet. Nach zwei Jahren Bauzeit stehen den Lesern "
        "nun mehr als hunderttausend Bücher, Zeitschriften und Filme zur Verfügung. "
        "Der Bürgermeister dankte allen "
        "Beteiligten und betonte, wie wichtig ein offener Ort für Bildung und Begegnung in der Stadt sei. "
    ) * 3
    french = (
        "La bibliothèque municipale a ouvert ses nouveaux locaux lundi. Après deux ans de travaux, les lecteurs "
        "disposent désormais de plus de cent mille livres, revues et films. "
        "Le maire a remercié tous ceux qui ont "
        "participé au projet et a rappelé l'importance d'un lieu ouvert pour l'éducation et la rencontre. "
    ) * 3
    spam = "Buy cheap watches online now. Best prices on cheap watches. " * 40

    def doc(title: str, text: str) -> bytes:
        return _page(title, [(title, [text])]).encode()

    return [
        ("http://lorem.example.org/", "text/html; charset=utf-8", doc("Lorem", lorem)),
        (
            "http://nav.example.org/",
            "text/html; charset=utf-8",
            (
                f"<html><body>{NAV}<ul><li><a href='/a'>A</a></li><li><a href='/b'>B</a></li></ul>"
                f"{FOOTER}</body></html>"
            ).encode(),
        ),
        (
            "http://script.example.org/",
            "text/html; charset=utf-8",
            b"<html><head><script>var x = {a: 1}; document.write(x);</script></head><body><noscript>Please enable "
            b"JavaScript to view this site.</noscript></body></html>",
        ),
        ("http://shop.spam.example/watches", "text/html; charset=utf-8", doc("Watches", spam)),
        ("http://bibliothek.example.de/", "text/html; charset=utf-8", doc("Bibliothek", german)),
        ("http://bibliotheque.example.fr/", "text/html; charset=utf-8", doc("Bibliothèque", french)),
    ]


def _record(rtype: str, url: str, payload: bytes, content_type: str) -> bytes:
    rid = uuid.uuid5(uuid.NAMESPACE_URL, f"{rtype}:{url}")
    head = (
        f"WARC/1.0\r\nWARC-Type: {rtype}\r\nWARC-Target-URI: {url}\r\nWARC-Date: {DATE}\r\n"
        f"WARC-Record-ID: <urn:uuid:{rid}>\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload + b"\r\n\r\n"


def _http(status: str, content_type: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def response_records(url: str, content_type: str, body: bytes, status: str = "200 OK") -> bytes:
    """request + response + metadata records for one fetch, each its own gzip member."""
    out = io.BytesIO()
    for rtype, payload, ctype in (
        (
            "request",
            f"GET / HTTP/1.1\r\nHost: {url.split('/')[2]}\r\n\r\n".encode(),
            "application/http; msgtype=request",
        ),
        ("response", _http(status, content_type, body), "application/http; msgtype=response"),
        ("metadata", b"fetchTimeMs: 12\r\n", "application/warc-fields"),
    ):
        out.write(gzip.compress(_record(rtype, url, payload, ctype), mtime=0))
    return out.getvalue()


def pages() -> list[list[tuple[str, str, bytes, str]]]:
    """(url, content type, body, status) per file."""
    files: list[list[tuple[str, str, bytes, str]]] = [[] for _ in range(N_FILES)]
    items = benchmark_items()
    leak = items[LEAKED_ITEM - 1]["passage"]
    placed = {}
    modules = [(name, _module_sections(name)) for name in CRAWL_MODULES]
    for i, (name, sections) in enumerate((n, s) for n, s in modules if s):
        extra = ""
        if name == LEAK_INTO:
            extra = f"<h2>From a quiz we liked</h2><p>{html.escape(leak)}</p>"
        body = _page(f"{name} - Python module notes", sections, extra)
        url = f"https://docs.example.com/{name}.html"
        files[i % N_FILES].append((url, "text/html; charset=utf-8", body.encode(), "200 OK"))
        placed[name] = (i % N_FILES, sections)
    # An exact copy (same text, another site) and a lightly edited copy, in other files.
    f, sections = placed[EXACT_COPY_OF]
    files[(f + 1) % N_FILES].append(
        (
            f"https://mirror.example.net/{EXACT_COPY_OF}.html",
            "text/html; charset=utf-8",
            _page(f"{EXACT_COPY_OF} - Python module notes", sections).encode(),
            "200 OK",
        )
    )
    f, sections = placed[NEAR_COPY_OF]
    edited = [
        (h, [p.replace(" the ", " this ", 1) if k % 3 == 0 else p for k, p in enumerate(ps)]) for h, ps in sections
    ]
    files[(f + 2) % N_FILES].append(
        (
            f"https://copycat.example.org/{NEAR_COPY_OF}",
            "text/html; charset=utf-8",
            _page(f"{NEAR_COPY_OF} - Python module notes", edited).encode(),
            "200 OK",
        )
    )
    # Awkward but good pages.
    x_sections = _module_sections("sched")
    xhtml = (
        '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Strict//EN" '
        '"http://www.w3.org/TR/xhtml1/DTD/xhtml1-strict.dtd">\n'
        + _page("sched", x_sections)
        .split("<!DOCTYPE html>", 1)[1]
        .replace('<html lang="en">', '<html xmlns="http://www.w3.org/1999/xhtml" lang="en">')
    )
    files[0].append(("https://xhtml.example.com/sched.xhtml", "text/html", xhtml.encode(), "200 OK"))
    latin = _page(
        "Café notes",
        _module_sections("smtplib")
        + [
            (
                "Café",
                [
                    "The café on the corner serves a crème brûlée that regulars describe as the best in the "
                    "whole town, and the owner says the recipe has not changed in thirty years."
                ],
            )
        ],
    ).replace('<meta charset="utf-8">', "")
    files[1].append(
        ("https://latin1.example.com/cafe", "text/html; charset=iso-8859-1", latin.encode("latin-1"), "200 OK")
    )
    # Junk.
    for k, (url, ctype, body) in enumerate(_junk_pages()):
        files[k % N_FILES].append((url, ctype, body, "200 OK"))
    files[2].append(
        ("https://docs.example.com/missing.html", "text/html", b"<html><body>Not found</body></html>", "404 Not Found")
    )
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    files[3].append(("https://docs.example.com/logo.png", "image/png", png, "200 OK"))
    return files


def _print_files() -> None:
    """In a clean interpreter: the sample's files, one JSON line each (name, base64 bytes)."""

    files = {
        f"crawl-{i}.warc.gz": b"".join(response_records(u, c, b, s) for u, c, b, s in recs)
        for i, recs in enumerate(pages())
    }
    files["sample-qa.jsonl"] = "".join(json.dumps(item) + "\n" for item in benchmark_items()).encode()
    for name, data in files.items():
        print(json.dumps({"name": name, "data": base64.b64encode(data).decode()}))


def _rendered() -> dict[str, bytes]:
    """The sample's files, built in a clean interpreter: the pages are made of the docstrings and
    attributes of imported stdlib modules, which whatever the calling process imported before can
    change (``glm data run`` and a bare ``run()`` wrote different pages), and of nothing else."""
    rows = [json.loads(line) for line in clean_render("data_pipeline.sample_crawl:_print_files", timeout=300)]
    return {r["name"]: base64.b64decode(r["data"]) for r in rows}


def write_sample(store: Storage) -> dict[str, list[str]]:
    """Write the sample crawl (``crawl-N.warc.gz``) and benchmark (``sample-qa.jsonl``) into ``store``
    once; returns their full paths or URLs."""
    crawl = [f"crawl-{i}.warc.gz" for i in range(N_FILES)]
    bench = ["sample-qa.jsonl"]
    if not all(store.exists(key) for key in crawl + bench):
        files = _rendered()
        for key in crawl + bench:
            store.write_bytes(key, files[key])
    return {"crawl": [store.path(k) for k in crawl], "benchmarks": [store.path(k) for k in bench]}
