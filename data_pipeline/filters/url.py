"""URL block list: domains (and their subdomains) and banned substrings."""

from __future__ import annotations

from urllib.parse import urlsplit


from data_pipeline.recipe import UrlCfg
from data_pipeline.remote import read_limited

MAX_LIST_BYTES = 256 * 2**20  # a block list of a few million domains


class UrlFilter:
    def __init__(self, cfg: UrlCfg) -> None:
        domains = {d.strip().lower().lstrip(".") for d in cfg.blocklist if d.strip()}
        for path in cfg.blocklist_files:
            lines = read_limited(path, MAX_LIST_BYTES).decode("utf-8", "replace").splitlines()
            domains.update(
                line.strip().lower().lstrip(".") for line in lines if line.strip() and not line.startswith("#")
            )
        self.domains = frozenset(domains)
        self.substrings = tuple(s.lower() for s in cfg.banned_substrings if s)

    def __call__(self, url: str | None) -> str | None:
        if not url:
            return None
        try:
            host = (urlsplit(url).hostname or "").lower()
        except ValueError:
            return "url: unparsable"
        parts = host.split(".")
        if any(".".join(parts[i:]) in self.domains for i in range(len(parts))):
            return "url: blocked domain"
        lower = url.lower()
        if any(s in lower for s in self.substrings):
            return "url: banned substring"
        return None
