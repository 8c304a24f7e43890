"""gettext catalogs as translation pairs (data_pipeline/readers/gettext.py), read from the German
catalogs Debian installs in /usr/share/locale/de/LC_MESSAGES."""

from __future__ import annotations

import gettext
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from data_pipeline.readers.gettext import CatalogError, catalog_paths, placeholders, read_catalog, read_catalogs

GERMAN = catalog_paths("de")
pytestmark = pytest.mark.skipif(len(GERMAN) < 10, reason="no German gettext catalogs in /usr/share/locale/de")


def test_mo_pairs_are_what_pythons_gettext_translates_every_message_to():
    skipped, checked, plurals, beyond_stdlib = Counter(), 0, 0, []
    for path in GERMAN:
        records = list(read_catalog(path, skipped=skipped))
        try:
            with open(path, "rb") as f:
                ref = gettext.GNUTranslations(f)
        except UnicodeDecodeError:  # a Latin-1 header: Python's parser gives up on the whole file
            beyond_stdlib.append((path, len(records)))
            continue
        singular = {m["id"].removesuffix("/other"): s for s, _, m in records if m["plural"] == "one"}
        for source, target, meta in records:
            ctx = meta["context"]
            if meta["plural"] is None:
                want = ref.pgettext(ctx, source) if ctx is not None else ref.gettext(source)
            else:
                one, plural = singular.get(meta["id"].removesuffix("/other")), source
                if meta["plural"] == "one" or one is None:
                    continue  # checked with its plural below (where both forms were kept)
                want = ref.npgettext(ctx, one, plural, 2) if ctx is not None else ref.ngettext(one, plural, 2)
                assert ref.ngettext(one, plural, 1) == next(t for s, t, m in records if s == one and m["plural"])
                plurals += 1
            assert target == want, (path, source)
            assert placeholders(source) == placeholders(target)
            checked += 1
    assert checked > 50_000 and plurals > 100
    assert all(n > 0 for _, n in beyond_stdlib), beyond_stdlib
    assert skipped["placeholder mismatch"] > 0 and set(skipped) <= {"placeholder mismatch", "untranslated"}
    ids = [m["id"] for _, _, m in read_catalogs(GERMAN)]
    assert len(ids) == len(set(ids))  # stable ids, one per pair


def test_placeholders_compare_conversions_not_positions_or_widths():
    assert placeholders("%1$s has %2$d files") == placeholders("%2$d Dateien in %1$s") == ["%d", "%s"]
    assert placeholders("%12s %(name)s {0} {user} 100%% {COUNT}") == ["%(name)s", "%s", "{0}", "{user}"]


@pytest.mark.skipif(shutil.which("msgunfmt") is None, reason="msgunfmt (Debian's gettext) is not installed")
def test_po_source_catalogs_read_as_their_compiled_form_and_skip_fuzzy_obsolete_and_empty(tmp_path):
    mo = next(Path(p) for p in GERMAN if p.endswith("/grep.mo"))  # plurals, contexts and c-format messages
    po = tmp_path / "grep.po"
    subprocess.run(["msgunfmt", str(mo), "-o", str(po)], check=True)
    from_mo = list(read_catalog(str(mo)))
    assert list(read_catalog(str(po))) == from_mo and len(from_mo) > 100
    entries = po.read_text(encoding="utf-8").split("\n\n")
    header, body = entries[0], entries[1:]
    body[0] = "#, fuzzy, c-format\n" + body[0]  # a translator's unconfirmed guess
    body[1] = "\n".join("#~ " + line for line in body[1].splitlines())  # a message the program dropped
    lines = body[2].splitlines()  # an untranslated message: msgstr ""
    body[2] = "\n".join(lines[: next(i for i, line in enumerate(lines) if line.startswith("msgstr"))]) + '\nmsgstr ""'
    po.write_text("\n\n".join([header, *body]), encoding="utf-8")
    skipped = Counter()
    edited = [(s, t) for s, t, _ in read_catalog(str(po), skipped=skipped)]
    assert skipped == Counter({"fuzzy": 1, "obsolete": 1, "untranslated": 1})
    assert edited == [(s, t) for s, t, _ in from_mo][3:]
    assert len(list(read_catalog(str(po), keep_fuzzy=True))) == len(edited) + 1


def test_a_damaged_or_oversized_catalog_is_refused_and_counted(tmp_path, caplog):
    data = Path(GERMAN[0]).read_bytes()
    (tmp_path / "cut.mo").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.mo").write_bytes(b"not a catalog at all" * 4)
    (tmp_path / "bad.po").write_text('msgid "a"\nmsgstr "b\\q"\n')
    for name in ("cut.mo", "junk.mo", "bad.po"):
        with pytest.raises(CatalogError):
            list(read_catalog(str(tmp_path / name)))
    with pytest.raises(CatalogError, match="more than the 100 allowed"):
        list(read_catalog(GERMAN[0], max_bytes=100))
    skipped = Counter()
    kept = list(
        read_catalogs([str(tmp_path / n) for n in ("cut.mo", "junk.mo", "bad.po")] + GERMAN[:1], skipped=skipped)
    )
    assert skipped["unreadable catalog: CatalogError"] == 3 and kept == list(read_catalog(GERMAN[0]))
    named = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped the unreadable catalog")]
    assert [line.split()[4].rstrip(":") for line in named] == [
        str(tmp_path / n) for n in ("cut.mo", "junk.mo", "bad.po")
    ]
