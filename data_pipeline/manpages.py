"""Manual pages as documents (the ``manpages`` source): one document per page, roff stripped.

``manpages`` reads the pages of Debian's ``manpages`` package (Linux's own manual: the kernel and C
library interfaces, file formats, conventions -- sections 1, 4, 5, 7 and 8; about 210 pages of
prose once its aliases are set aside), found through the package's file list
(``/var/lib/dpkg/info/manpages.list``). Why the list rather than all of ``/usr/share/man``: that
folder holds every installed package's pages (some 20,000 on a developer machine, mostly tools'
option lists), so the corpus would change with what else is installed. ``manpages:/path`` reads
every page under ``/path/man*/`` instead (or under ``/path`` when it has no section folders).

Each page is read with bounds: at most :data:`MAX_FILE_BYTES` from disk and at most
:data:`MAX_PAGE_BYTES` once decompressed (a larger page -- a gzip bomb, or not a page -- is skipped
and counted). Skipped and counted by reason, never fatal: ``alias_symlink`` (a link to a page read
under its own name), ``so_redirect`` (a page that only says ``.so other-page``), ``file_too_large``,
``page_too_large``, ``corrupt_gzip``, ``undecodable_bytes`` (not UTF-8), ``unsupported_compression``
(.bz2, .xz ...), ``empty_page``. Pages are read in sorted order, so the corpus is the same on every
machine with the same package version.

Install: ``apt-get install -y --no-install-recommends manpages`` (``launch/setup_env.sh`` does,
where it can). Docker images that exclude ``/usr/share/man`` (``dpkg --path-exclude``) install the
list but not the pages: the error says so.
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import Iterator

from data_pipeline.errors import PipelineError
from data_pipeline.roff import roff_to_text

DEFAULT_ROOT = "/usr/share/man"
PACKAGE_LIST = "/var/lib/dpkg/info/manpages.list"  # dpkg's record of the files the package installed
MAX_FILE_BYTES = 4 * 2**20  # compressed bytes read per page (the largest real pages are ~300 kB)
MAX_PAGE_BYTES = 16 * 2**20  # decompressed bytes per page: more is a gzip bomb or not a page
PAGE_NAME = re.compile(r"\.\d[A-Za-z0-9_]*(\.gz)?$")  # intro.1.gz, queue.3.gz, sigevent.3type.gz
SO_REQUEST = re.compile(r"^[.']\s*so\s")


class ManPagesMissing(PipelineError):
    """No manual pages where they were looked for."""


def page_paths(root: str | None = None) -> list[Path]:
    """The pages the source reads, sorted: the ``manpages`` package's (``root`` None) or every page
    under ``root/man*/`` (``root`` itself when it has no section folders)."""
    if root is None:
        return _package_pages()
    base = Path(root)
    if not base.is_dir():
        raise ManPagesMissing(f"data.source manpages:{root}: {root} is not a folder of manual pages")
    sections = sorted(p for p in base.glob("man*") if p.is_dir())
    files = [f for d in sections or [base] for f in sorted(d.rglob("*")) if f.is_file() or f.is_symlink()]
    pages = [f for f in files if PAGE_NAME.search(f.name) or f.suffix in (".bz2", ".xz", ".zst")]
    if not pages:
        raise ManPagesMissing(f"data.source manpages:{root}: no manual pages (NAME.SECTION[.gz]) under {root}")
    return pages


def _package_pages() -> list[Path]:
    listing = Path(PACKAGE_LIST)
    if not listing.is_file():
        raise ManPagesMissing(
            f"Debian's manpages package is not installed ({PACKAGE_LIST} is missing): "
            f"apt-get install -y manpages (launch/setup_env.sh does), or name a folder of pages "
            f"with data.source: manpages:/path"
        )
    with listing.open("rb") as f:
        names = f.read(MAX_FILE_BYTES).decode("utf-8", errors="replace").splitlines()
    pages = sorted(Path(n) for n in names if n.startswith(f"{DEFAULT_ROOT}/man") and PAGE_NAME.search(n))
    present = [p for p in pages if p.is_file() or p.is_symlink()]
    if not present:
        raise ManPagesMissing(
            f"the manpages package lists {len(pages)} pages but none is in {DEFAULT_ROOT} (an image "
            f"that excludes /usr/share/man?): reinstall it with the pages, or use manpages:/path"
        )
    return present


def read_page(path: Path, skipped: Counter) -> str | None:
    """The roff source of one page, or None with the reason counted in ``skipped``."""
    if path.is_symlink():
        skipped["alias_symlink"] += 1
        return None
    if path.suffix in (".bz2", ".xz", ".zst", ".Z"):
        skipped["unsupported_compression"] += 1
        return None
    with path.open("rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        skipped["file_too_large"] += 1
        return None
    data = _gunzip(raw, skipped) if path.suffix == ".gz" else raw
    if data is None:
        return None
    if len(data) > MAX_PAGE_BYTES:
        skipped["page_too_large"] += 1
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        skipped["undecodable_bytes"] += 1
        return None


def _gunzip(raw: bytes, skipped: Counter) -> bytes | None:
    """At most MAX_PAGE_BYTES + 1 decompressed bytes (enough to tell a page that is too large)."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
            return f.read(MAX_PAGE_BYTES + 1)
    except (OSError, EOFError, zlib.error):
        skipped["corrupt_gzip"] += 1
        return None


def is_redirect(source: str) -> bool:
    """A page whose first request is ``.so`` only points at another page."""
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")) or not line.strip() or line.strip() == ".":
            continue
        return bool(SO_REQUEST.match(line))
    return False


def manpage_documents(root: str | None = None, *, skipped: Counter | None = None) -> Iterator[dict]:
    """``{"id", "text"}`` per page in sorted order; ``id`` is ``manpages:SECTION_DIR/NAME.SECTION``."""
    skipped = skipped if skipped is not None else Counter()
    base = Path(root) if root is not None else Path(DEFAULT_ROOT)
    for path in page_paths(root):
        source = read_page(path, skipped)
        if source is None:
            continue
        if is_redirect(source):
            skipped["so_redirect"] += 1
            continue
        text = roff_to_text(source)
        if not text:
            skipped["empty_page"] += 1
            continue
        name = path.relative_to(base).as_posix() if path.is_relative_to(base) else path.name
        yield {"id": f"manpages:{name.removesuffix('.gz')}", "text": text}
