"""The output manifest of a crawl-pipeline run: ``OUTPUT/manifest.json``, written last.

Object stores have no rename, so a run's output cannot appear at once by renaming a folder.
Instead every task writes its objects under task-unique keys, and the card stage writes this
manifest after everything else: it lists the document shards of the finished run. Readers open
the manifest, never a listing: a run that crashed or is still going has no manifest (its shards,
possibly a part of them, are invisible), and a listing could hold leftovers.

``glm data tokenize`` reads a run's documents through :func:`finished_run_shards`.
"""

from __future__ import annotations

import json
import posixpath

from glm_common.storage import Storage

MANIFEST = "manifest.json"
FORMAT = "glm-dist/crawl-documents/v1"
MAX_MANIFEST_BYTES = 256 * 2**20


def write_output_manifest(store: Storage, *, recipe: str, shards: list[str], counts: list[int]) -> None:
    manifest = {
        "format": FORMAT,
        "recipe": recipe,
        "documents": sum(counts),
        "shards": [{"path": s, "documents": n} for s, n in zip(shards, counts)],
        "stats": "stats.json",
        "card": "README.md",
    }
    store.remove_orphans()  # a killed attempt's half-written files, never in the manifest
    store.write_bytes(MANIFEST, json.dumps(manifest, indent=1).encode())


def read_output_manifest(url: str) -> list[str]:
    """The document shards (full paths or URLs, in order) of the finished run at ``url``: its
    output directory, or its ``manifest.json``. A run without a manifest has not finished:
    ``FileNotFoundError`` with a one-line message."""
    from data_pipeline.errors import PipelineError

    base = url.rstrip("/")
    if posixpath.basename(base) == MANIFEST:
        base = posixpath.dirname(base) or "."
    store = Storage(base)
    if not store.exists(MANIFEST):
        raise FileNotFoundError(
            f"{store.path(MANIFEST)} does not exist: {base} holds no finished crawl-pipeline "
            "run (glm data run writes the manifest last)"
        )
    manifest = json.loads(store.read(MANIFEST, max_bytes=MAX_MANIFEST_BYTES))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PipelineError(f"{store.path(MANIFEST)} is not a crawl-pipeline manifest (format {FORMAT!r})")
    return [store.path(shard["path"]) for shard in manifest["shards"]]


def finished_run_shards(location: str) -> list[str] | None:
    """The document shards of the crawl-pipeline run that ``location`` names -- its output folder or
    URL (holding ``manifest.json``, or ``work/run.json`` while unfinished) or its ``manifest.json``
    -- read from its manifest; None when ``location`` is no run's output (a file, a glob)."""
    if any(c in location for c in "*?["):
        return None
    base = location.rstrip("/")
    if posixpath.basename(base) == MANIFEST:
        return read_output_manifest(base)
    store = Storage(base)
    if store.exists(MANIFEST) or store.exists("work/run.json"):
        return read_output_manifest(base)
    return None
