"""The offline sources a data mixture draws on (manual pages, WordNet glosses) read from the installed
Debian packages, and the published mixture recipes."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from data_pipeline.errors import PipelineError
from data_pipeline.manpages import MAX_PAGE_BYTES, manpage_documents
from data_pipeline.sources import check_source, named_source
from data_pipeline.tokenize.prepare import prepare_shards
from data_pipeline.wordnet_corpus import MAX_DOC_CHARS, wordnet_documents
from glm_dist.config.loader import ConfigError, load_config
from glm_dist.data.mix_report import mix_table

ROOT = Path(__file__).resolve().parents[1]

# a roff request or escape left in the text (man(7) macros and the requests pages use)
ROFF_REQUEST = re.compile(
    r"^[.'](TH|SH|SS|B|I|BR|IR|RB|RI|BI|IB|PP|LP|P|TP|IP|RS|RE|EX|EE|nf|fi|in|sp|br|UR|UE"
    r"|de|if|ie|el|ds|nr|TS|TE|ft|ad|PD)(\s|$)",
    re.M,
)
ROFF_ESCAPE = re.compile(r"\\f[BIRP]|\\\([a-z][a-z]|\\\*[(\[]")  # a font, special character or string
# pages whose text rightly starts lines with a dot: the two that teach the markup, and the list of file suffixes
QUOTES_MARKUP = ("manpages:man7/man.7", "manpages:man7/man-pages.7", "manpages:man7/suffixes.7")


@pytest.fixture(scope="module")
def man_docs():
    skipped = Counter()
    return list(manpage_documents(skipped=skipped)), skipped


def test_manpages_source_is_every_page_of_the_package_as_plain_text(man_docs):
    docs, skipped = man_docs
    by_id = {d["id"]: d["text"] for d in docs}
    assert len(docs) > 150 and len(by_id) == len(docs)
    assert skipped["alias_symlink"] > 0 and skipped["so_redirect"] > 0  # aliases are read once, under their name
    for doc_id, text in by_id.items():
        if doc_id not in QUOTES_MARKUP:
            assert not ROFF_REQUEST.search(text), (doc_id, ROFF_REQUEST.search(text)[0])
            assert not ROFF_ESCAPE.search(text), (doc_id, ROFF_ESCAPE.search(text)[0])
    assert by_id["manpages:man1/intro.1"].startswith("NAME\n\nintro - introduction to user commands\n\nDESCRIPTION")
    # a tbl(1) table: one line per row, cells apart; escapes inside cells printed
    assert "012  10  0A  LF  '\\n' (new line)  112  74  4A  J" in by_id["manpages:man7/ascii.7"].splitlines()
    # a macro the page defines (.de q) expands with its arguments and the page's strings (.ds lq)
    assert "The magic four-byte ASCII sequence \u201cTZif\u201d identifies" in by_id["manpages:man5/tzfile.5"]


def test_manpages_gzip_bomb_redirect_and_alias_are_skipped_and_counted(tmp_path):
    section = tmp_path / "man1"
    section.mkdir()
    shutil.copy("/usr/share/man/man1/intro.1.gz", section / "intro.1.gz")
    (section / "bomb.1.gz").write_bytes(gzip.compress(b"\0" * (MAX_PAGE_BYTES + 1)))
    (section / "broken.1.gz").write_bytes(gzip.compress(b".TH BROKEN 1\n")[:-6])
    (section / "alias.1.gz").write_bytes(gzip.compress(b".so man1/intro.1\n"))
    os.symlink("intro.1.gz", section / "link.1.gz")
    skipped = Counter()
    docs = list(manpage_documents(str(tmp_path), skipped=skipped))
    assert [d["id"] for d in docs] == ["manpages:man1/intro.1"]
    assert skipped == {"page_too_large": 1, "corrupt_gzip": 1, "so_redirect": 1, "alias_symlink": 1}


def test_wordnet_source_is_runs_of_one_lexicographer_file():
    skipped = Counter()
    docs = list(wordnet_documents(skipped=skipped))
    assert len(docs) > 1000 and not skipped
    assert len({d["id"] for d in docs}) == len(docs)
    for doc in docs:
        lexname, _, body = doc["text"].partition("\n\n")
        assert doc["id"].startswith(f"wordnet:{lexname}#")
        assert len(body) < MAX_DOC_CHARS + 1000 and "|" not in body  # no database fields left
    animals = "\n".join(d["text"] for d in docs if d["id"].startswith("wordnet:noun.animal#"))
    assert (
        "dog, domestic dog, Canis familiaris (noun): a member of the genus Canis (probably descended from the "
        "common wolf) that has been domesticated by man since prehistoric times; occurs in many breeds; "
        '"the dog barked all night"\n'
    ) in animals


def test_named_sources_refuse_what_they_do_not_take():
    assert named_source("manpages") == ("manpages", None)
    assert named_source("wordnet:/srv/wn") == ("wordnet", "/srv/wn")
    assert named_source("./manpages") is None and named_source("data/x.jsonl") is None
    with pytest.raises(PipelineError, match="embedded takes no argument"):
        named_source("embedded:/x")
    check_source("manpages:/usr/share/man", "data.source")  # a name, not the URL scheme 'manpages:'
    with pytest.raises(ValueError, match="scheme 'ssh:' is not allowed"):
        check_source("ssh://host/x", "data.source")
    with pytest.raises(PipelineError, match="not a folder of manual pages"):
        list(manpage_documents("/nonexistent/man"))
    mixture = [{"name": "wn", "shards_dir": "data/wn", "source": "wordnet:/usr/share/wordnet", "weight": 1.0}]
    cfg = load_config(
        ROOT / "configs/experiments/mixture-tiny-cpu.yaml",
        ["data.source=manpages:/usr/share/man", f"data.mixture={json.dumps(mixture)}"],
    )
    assert cfg.data.source == "manpages:/usr/share/man" and cfg.data.mixture[0]["source"].startswith("wordnet:")


def test_manpages_source_tokenizes_into_a_shard_set_with_its_skips(tmp_path, man_docs):
    manifest = prepare_shards(source="manpages", out_dir=str(tmp_path / "man"), vocab_size=1024, workers=1)
    assert manifest["source"]["documents"] == len(man_docs[0])
    assert manifest["source"]["skipped"] == dict(man_docs[1])
    assert json.loads((tmp_path / "man" / "source" / "skipped.json").read_text()) == dict(man_docs[1])


# GPT-3's mixture (Brown et al. 2020, table 2.2): weight in the training mix, as printed (they sum to 101%)
GPT3_TABLE = {"common-crawl": 0.60, "webtext2": 0.22, "books1": 0.08, "books2": 0.08, "wikipedia": 0.03}


def test_every_gpt3_recipe_mixes_the_papers_five_sources_at_their_rates():
    recipes = sorted((ROOT / "configs/experiments/published").glob("gpt3-*.yaml"))
    assert len(recipes) == 8
    for path in recipes:
        data = load_config(path).data
        assert {s["name"]: s["weight"] for s in data.mixture} == GPT3_TABLE, path
        assert all(s["shards_dir"] == f"data/gpt3/{s['name']}" for s in data.mixture)
        assert data.normalize_weights and data.vocab_size == 50257 and data.seq_len == 2048
    with pytest.raises(ConfigError, match="weights sum to 1.01, not 1"):
        load_config(recipes[0], ["data.normalize_weights=false"])
    tiny = load_config(ROOT / "configs/experiments/mixture-tiny-cpu.yaml").data
    assert [(s["name"], s["source"], s["weight"]) for s in tiny.mixture] == [
        ("embedded", "embedded", 0.5),
        ("wordnet", "wordnet", 0.2),
        ("manpages", "manpages", 0.3),
    ]


def test_gpt3_recipe_mix_table_on_tiny_stand_ins(shards):
    """glm data mix's rows for the 175B recipe with each placeholder replaced by a tiny shard set."""
    cfg = load_config(ROOT / "configs/experiments/published/gpt3-175b.yaml")
    stand_in = shards("gpt2")
    mixture = [{**s, "shards_dir": stand_in} for s in cfg.data.mixture]
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, mixture=mixture, vocab_size=3000))
    rows = mix_table(cfg)
    total = sum(GPT3_TABLE.values())
    assert [r["source"] for r in rows] == list(GPT3_TABLE)
    for row in rows:
        assert row["weight"] == pytest.approx(GPT3_TABLE[row["source"]] / total)
        assert row["drawn"] / (95367 * 1536 * 2048) == pytest.approx(row["weight"], abs=1e-6)
