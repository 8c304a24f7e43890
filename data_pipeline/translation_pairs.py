"""Parallel text from gettext catalogs: (English source, translation) pairs as JSONL (``glm data gettext``).

Catalogs are translations by people (data_pipeline/readers/gettext.py reads them: plural forms by
each catalog's rule, fuzzy / obsolete / untranslated / placeholder-mismatched entries skipped and
counted). Here the pairs of many catalogs become one corpus:

- a catalog reached twice (Debian links ``iso_639_3.mo`` to ``iso_639-3.mo``) is read once;
- a pair whose source or target is blank after stripping is dropped (``blank``), and an exact
  repeat of a (source, target) pair already written -- "invalid option" is in a dozen catalogs --
  is dropped as ``duplicate``, so the corpus holds each translation once;
- the held-out split is decided by a hash of the message id (the English source text, as gettext
  looks it up): every translation of one message lands in the same split, so no held-out source
  sentence was seen in training; ``with_placeholders`` counts the kept pairs that hold format
  placeholders (kept in the text, ``%s`` and ``{name}`` as written).

Output in ``out_dir``: ``train.jsonl`` and ``validation.jsonl`` (one ``{id, source, target,
catalog, plural}`` per line, catalog order) and ``stats.json`` (what was read, kept and dropped).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Iterable

from data_pipeline.readers.gettext import read_catalogs
from data_pipeline.tokenize.prepare import is_validation

SPLITS = ("train", "validation")


def unique_catalogs(paths: Iterable[str]) -> list[str]:
    """``paths`` without a second path to a file already listed (symbolic links), in order."""
    seen, out = set(), []
    for path in paths:
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            out.append(path)
    return out


def write_pairs(paths: Iterable[str], out_dir: str | Path, *, val_per_mille: int = 50) -> dict:
    """Read the catalogs at ``paths`` and write the pair files of ``out_dir``; returns the stats."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    catalogs = unique_catalogs(paths)
    skipped, kept, placeholders, seen = Counter(), Counter(), 0, set()
    files = {s: open(out / f"{s}.jsonl.tmp", "w", encoding="utf-8") for s in SPLITS}
    try:
        for source, target, meta in read_catalogs(catalogs, skipped=skipped):
            if not source.strip() or not target.strip():
                skipped["blank"] += 1
                continue
            if (source, target) in seen:
                skipped["duplicate"] += 1
                continue
            seen.add((source, target))
            split = "validation" if is_validation(source, val_per_mille) else "train"
            row = {
                "id": meta["id"],
                "source": source,
                "target": target,
                "catalog": meta["catalog"],
                "plural": meta["plural"],
            }
            files[split].write(json.dumps(row, ensure_ascii=False) + "\n")
            kept[split] += 1
            placeholders += bool(meta["placeholders"])
    finally:
        for f in files.values():
            f.close()
    for s in SPLITS:
        os.replace(out / f"{s}.jsonl.tmp", out / f"{s}.jsonl")
    stats = {
        "catalogs": len(catalogs),
        "pairs": dict(kept),
        "with_placeholders": placeholders,
        "skipped": dict(sorted(skipped.items())),
        "val_per_mille": val_per_mille,
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats
