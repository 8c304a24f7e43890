"""English -> German translation from gettext catalogs, GPT-2's ``english sentence = other
sentence`` task (Radford et al. 2019, section 3.7).

The pairs are the messages of the German catalogs Debian installs (``/usr/share/locale/de/
LC_MESSAGES/*.mo``; ``.po`` files too, read by ``data_pipeline/readers/gettext.py``, which skips
fuzzy, untranslated and placeholder-mismatched entries). A pair becomes an item when both sides
are one sentence (a capital letter first, final ``. ! ?``, 4 to 30 words, no markup, no format
placeholder, no message context) and the German differs from the English. An English sentence that
several catalogs translate is kept once (the first catalog in path order). The model reads example
pairs as ``english = german`` lines (lm-eval's few-shot examples from the train split) and then
``english =``; greedy decoding to the end of the line; BLEU (sacrebleu, lm-eval's ``bleu``).
A hash of the English sentence picks the split, so a sentence never crosses splits.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Iterable

from data_pipeline.readers.gettext import catalog_paths, read_catalogs
from data_pipeline.tasks.built import BuiltTask, stable_order

SENTENCE = re.compile(r"^[A-Z][^\n\t%{}<>`@/\\_=|*#\[\]]*[.!?]$")


def pairs(
    paths: Iterable[str], *, skipped: Counter | None = None, min_words: int = 4, max_words: int = 30
) -> list[dict]:
    """One item per distinct English sentence of the catalogs (see the module docstring)."""
    skipped = Counter() if skipped is None else skipped
    out: dict[str, dict] = {}
    for source, target, meta in read_catalogs(paths, skipped=skipped):
        en, de = source.strip(), target.strip()
        if meta["context"] is not None or meta["placeholders"]:
            skipped["context or placeholder"] += 1
        elif not (SENTENCE.match(en) and SENTENCE.match(de) and min_words <= len(en.split()) <= max_words):
            skipped["not one sentence"] += 1
        elif en == de:
            skipped["not translated (same text)"] += 1
        elif en in out:
            skipped["English sentence seen in another entry"] += 1
        else:
            out[en] = {"id": f"gettext-de:{meta['id']}", "en": en, "de": de, "catalog": meta["catalog"]}
    return list(out.values())


def _copy_baseline(rows: list[dict]) -> float:
    """BLEU of the trivial translation: the English sentence itself (names and terms survive)."""
    import sacrebleu

    return sacrebleu.corpus_bleu([r["en"] for r in rows], [[r["de"] for r in rows]]).score


def build(
    locale_roots: tuple[str, ...] = ("/usr/share/locale",),
    *,
    language: str = "de",
    test_per_mille: int = 250,
    max_test: int = 500,
) -> BuiltTask:
    paths = catalog_paths(language, locale_roots)
    skipped: Counter = Counter()
    rows = pairs(paths, skipped=skipped)
    if len(rows) < 20:
        raise ValueError(
            f"translation_de: {len(rows)} sentence pairs in {len(paths)} catalogs under "
            f"{', '.join(locale_roots)}; install the packages' German catalogs (Debian puts them in "
            f"/usr/share/locale/{language}/LC_MESSAGES)"
        )
    held = {r["id"]: int(hashlib.sha1(r["en"].encode()).hexdigest()[:8], 16) % 1000 < test_per_mille for r in rows}
    test = stable_order([r for r in rows if held[r["id"]]])[:max_test]
    train = stable_order([r for r in rows if not held[r["id"]]])
    card = f"""Source: the German (`{language}`) gettext catalogs of the installed Debian packages ({len(paths)} files
under {", ".join(locale_roots)}: coreutils, git, PostgreSQL, GLib, ...; each package's licence), read by
`data_pipeline/readers/gettext.py` (fuzzy, untranslated and placeholder-mismatched entries skipped). An item is
a message whose English and German are each one sentence of 4-30 words (capital first, final . ! ?, no markup or
format placeholders, no message context) and differ; each English sentence once. Prompt: few-shot example
pairs `english = german`, one per line, then `english =` (GPT-2, section 3.7); greedy decoding to the end of
the line; metric: BLEU (sacrebleu). A hash of the English sentence puts {test_per_mille / 10:.0f}% of the
items in the test split (at most {max_test}), the rest in the train split. Skipped on the way: {dict(skipped)}.
Item id: `gettext-de:<catalog>:<sha1 of context and msgid, 12 hex digits>[/other]`."""
    return BuiltTask(
        "translation_de",
        {"train": train, "test": test},
        {"bleu: copy the English": _copy_baseline(test)},
        card,
        {"language": language, "catalogs": len(paths), "skipped": dict(skipped)},
    )
