"""Opening inputs by URL: which locations may be opened at all, and reads that end in bounded time.

Every file the project reads (crawl inputs, ``data.source``, shards, manifests) is named by a path
or an fsspec URL. Two rules hold for all of them (docs/architecture.md, decision 11):

- :func:`check_scheme` (``glm_common/locations.py``, named here for the readers): a location is a
  path or a URL of an allowed storage protocol, never a command.
- :func:`open_url`: http(s) reads have a connect and a read timeout (aiohttp's ``ClientTimeout``
  through fsspec's ``client_kwargs``), transient failures (connection refused or reset, timeouts,
  HTTP 5xx/408/429) are retried with exponential backoff a bounded number of times, and what still
  fails raises :class:`RemoteReadError`: an ``OSError`` whose one-line message names the URL and the
  reason. A host that does not resolve raises it at once (no retries, no aiohttp traceback).

Both names and signatures are stable: ``glm_dist`` opens shard files with them.
"""

from __future__ import annotations

import io
import logging
import math
import socket
import time
from typing import IO, Any, Callable, TypeVar
from urllib.parse import urlsplit

import fsspec

from glm_common.locations import check_scheme, scheme_of

log = logging.getLogger(__name__)
T = TypeVar("T")

CONNECT_TIMEOUT_S = 10.0  # DNS + TCP (+ TLS) connect to an input host
READ_TIMEOUT_S = 60.0  # the longest wait for the next bytes of an answer
RETRIES = 3  # further attempts after a transient failure
BACKOFF_S = 1.0  # the wait before the first retry; doubled before each next one

_GIVE_UP_STATUS = (404, 410)  # left to fsspec, which raises FileNotFoundError


class RemoteReadError(OSError):
    """A URL that could not be read: its host does not resolve, it answered with an error that
    retrying does not fix, or it failed on every attempt. The message is one line: URL, reason."""


def _http_schemes(url: str) -> list[str]:
    links = url.split("::")
    schemes = [scheme_of(link, last=i == len(links) - 1) for i, link in enumerate(links)]
    return [s for s in schemes if s in ("http", "https")]


def storage_options(
    url: str, *, connect_timeout_s: float = CONNECT_TIMEOUT_S, read_timeout_s: float = READ_TIMEOUT_S
) -> dict[str, Any]:
    """fsspec keyword arguments for ``url``: aiohttp timeouts for its http(s) link, flat for a plain
    URL and keyed by protocol for a chained one (``simplecache::https://...``); {} otherwise."""
    schemes = _http_schemes(url)
    if not schemes:
        return {}
    import aiohttp

    timeout = aiohttp.ClientTimeout(
        total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s, sock_read=read_timeout_s
    )
    options = {"client_kwargs": {"timeout": timeout}}
    return options if "::" not in url else {scheme: options for scheme in schemes}


def open_url(
    url: str,
    mode: str = "rb",
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    read_timeout_s: float = READ_TIMEOUT_S,
    retries: int = RETRIES,
    **kw: Any,
) -> IO:
    """Open a path or URL (checked with :func:`check_scheme`, key ``"url"``) through fsspec; ``kw``
    go to ``fsspec.open``. Opening and, for http(s) in ``"rb"`` mode, every read are retried on
    transient failures; then :class:`RemoteReadError`. A missing file raises ``FileNotFoundError``
    (HTTP 404 included). Use the result as a context manager or close it."""
    check_scheme(url, "url")
    if not (retries >= 0 and all(0 < t < math.inf for t in (connect_timeout_s, read_timeout_s))):
        raise ValueError(
            f"{url}: retries ({retries}) must be >= 0 and the timeouts ({connect_timeout_s}, "
            f"{read_timeout_s} s) finite and > 0 -- aiohttp reads 0 as no timeout at all"
        )
    options = {**storage_options(url, connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s), **kw}
    http = bool(_http_schemes(url))
    limits = f" (connect timeout {connect_timeout_s:g} s, read timeout {read_timeout_s:g} s)" if http else ""
    f = retrying(lambda: fsspec.open(url, mode, **options).open(), url, retries=retries, limits=limits)
    if not http or mode != "rb":
        return f
    return io.BufferedReader(_RetryingReader(f, url, retries, limits), 1 << 16)


def check_host(url: str) -> None:
    """For an http(s) URL: raise :class:`RemoteReadError` when its host does not resolve (a typo
    must fail before a long run starts, not as one counted error per file). Nothing is fetched."""
    if not _http_schemes(url):
        return
    host = urlsplit(url.split("::")[-1]).hostname
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise RemoteReadError(f"{url}: host {host!r} does not resolve ({err}); check the URL") from None


def retrying(
    fn: Callable[[], T], url: str, *, retries: int = RETRIES, backoff_s: float = BACKOFF_S, limits: str = ""
) -> T:
    """``fn()``, called again after a transient network failure (at most ``retries`` more times,
    waiting ``backoff_s``, then twice as long each time). A failure that retrying cannot fix, or
    the last one, raises :class:`RemoteReadError` naming ``url``; other errors pass unchanged."""
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as err:
            failure = _network_failure(err)
            if failure is None:
                raise
            reason, transient = failure
            if not transient:
                raise RemoteReadError(f"{url}: {reason}") from None
            if attempt >= retries:
                raise RemoteReadError(f"{url}: {reason}; gave up after {attempt + 1} attempt(s){limits}") from None
        wait = backoff_s * 2**attempt
        attempt += 1
        log.warning("%s: %s; retry %d of %d in %g s", url, reason, attempt, retries, wait)
        time.sleep(wait)


def _network_failure(err: BaseException) -> tuple[str, bool] | None:
    """(reason, worth retrying) when a network failure is anywhere in ``err``'s chain (fsspec wraps
    them, e.g. a timeout into FileNotFoundError); None when there is none."""
    from aiohttp import ClientConnectionError, ClientPayloadError, ClientResponseError  # fsspec[http]

    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, socket.gaierror) or isinstance(getattr(err, "os_error", None), socket.gaierror):
            return f"the host does not resolve ({err})", False
        if isinstance(err, ClientResponseError) and err.status not in _GIVE_UP_STATUS:
            return f"HTTP {err.status} {err.message}", err.status >= 500 or err.status in (408, 429)
        if isinstance(err, TimeoutError):
            return f"no answer in time ({type(err).__name__}{': ' + str(err) if str(err) else ''})", True
        if isinstance(err, (ConnectionError, ClientConnectionError, ClientPayloadError)):
            return f"connection failed ({type(err).__name__}: {err})", True
        err = err.__cause__ or err.__context__
    return None


class _RetryingReader(io.RawIOBase):
    """A binary fsspec file whose reads are retried on transient failures. fsspec's HTTP files move
    their position only after a successful read, so a retry asks for the same bytes again."""

    def __init__(self, f, url: str, retries: int, limits: str) -> None:
        self.f, self.url, self.retries, self.limits = f, url, retries, limits

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        data = retrying(lambda: self.f.read(len(buf)), self.url, retries=self.retries, limits=self.limits)
        buf[: len(data)] = data
        return len(data)

    def seekable(self) -> bool:
        return self.f.seekable()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()

    def close(self) -> None:
        if not self.closed:
            self.f.close()
        super().close()


def read_limited(url: str, max_bytes: int) -> bytes:
    """A small file (a block list, a word list, a model) whole, refused past ``max_bytes``."""
    with open_url(url, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{url} is larger than {max_bytes} bytes: not the small file expected here")
    return data
