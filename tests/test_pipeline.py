"""The crawl pipeline (data_pipeline/): rules on hand-checked cases, readers on damaged input,
dedup and decontamination on the embedded sample crawl, resumption after a kill, SLURM arrays."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import ROOT, clean_env, job_info
from data_pipeline.document import Document, Stats
from data_pipeline.filters import quality
from data_pipeline.filters.url import UrlFilter
from data_pipeline.recipe import (
    C4Cfg,
    DecontamCfg,
    FineWebCfg,
    GopherQualityCfg,
    GopherRepetitionCfg,
    ReaderCfg,
    UrlCfg,
)
from data_pipeline.sample_crawl import response_records

FINEWEB = str(ROOT / "configs/data/fineweb.yaml")
PROSE = (
    "The committee met on Tuesday to review the proposal for the new library. Members agreed that the "
    "building should have more space for children and a quiet room for study. The architect will present "
    "revised plans next month, and the public will be invited to comment on them before work begins. "
    "Funding has been approved by the council, which expects the project to be finished within two years."
)


# -- quality rules on hand-written cases ------------------------------------------------------------
def drop(fn, text, cfg, *extra):
    return fn(text, cfg, *extra)[0]


def test_gopher_quality_keeps_prose_and_drops_each_kind_of_junk():
    cfg = GopherQualityCfg()
    assert drop(quality.gopher_quality, PROSE, cfg) is None
    assert drop(quality.gopher_quality, "Too short a page.", cfg) == "gopher_quality: too few words"
    long_words = " ".join(["the internationalization of characteristically incomprehensible administrations"] * 15)
    assert drop(quality.gopher_quality, long_words, cfg) == "gopher_quality: mean word length too long"
    assert drop(quality.gopher_quality, PROSE + " #tag" * 12, cfg) == "gopher_quality: too many #"
    bullets = "\n".join(f"- item number {i} of the list with the things" for i in range(60))
    assert drop(quality.gopher_quality, bullets, cfg) == "gopher_quality: too many bullet lines"
    trailing = "\n".join(f"Line {i} goes on and on and never quite ends ..." for i in range(40))
    assert drop(quality.gopher_quality, trailing, cfg) == "gopher_quality: too many lines ending in an ellipsis"
    numbers = " ".join(str(i) for i in range(200)) + " the and of"
    assert drop(quality.gopher_quality, numbers, cfg) == "gopher_quality: mean word length too short"
    no_stop = " ".join(["purple elephants dance quietly"] * 20)
    assert drop(quality.gopher_quality, no_stop, cfg) == "gopher_quality: too few stop words"
    symbols = PROSE + " " + " ".join(["( ) [ ] = ; : ! ?"] * 30)
    assert drop(quality.gopher_quality, symbols, cfg) == "gopher_quality: too few words with a letter"
    # Each rule can be switched off on its own.
    assert drop(quality.gopher_quality, no_stop, GopherQualityCfg(min_stop_words=None)) is None


def test_gopher_repetition_rules():
    cfg = GopherRepetitionCfg()
    assert drop(quality.gopher_repetition, PROSE, cfg) is None
    lines = "\n".join(["Click here to subscribe to our newsletter today."] * 5 + PROSE.split(". "))
    assert drop(quality.gopher_repetition, lines, cfg) == "gopher_rep: duplicate lines"
    paragraphs = "\n\n".join([PROSE, "Subscribe now.", "Subscribe now.", "Subscribe now.", "Read more."])
    assert drop(quality.gopher_repetition, paragraphs, cfg) == "gopher_rep: duplicate paragraphs"
    bigram = PROSE + " " + "buy now " * 60
    assert drop(quality.gopher_repetition, bigram, cfg) == "gopher_rep: top 2-gram"
    repeated = PROSE + " " + PROSE.replace("committee", "board")
    assert drop(quality.gopher_repetition, repeated, cfg).startswith("gopher_rep: duplicated")


def test_c4_removes_bad_lines_and_drops_bad_pages(tmp_path):
    cfg = C4Cfg()
    page = "\n".join(
        [
            "Home | About | Contact",  # no terminal punctuation
            "Please enable JavaScript in your browser to continue.",  # javascript
            "By using this site you agree to our terms of use.",  # policy
            "Too short.",  # < 5 words
            "The first real sentence of the article is here.[1] It goes on for a while.",
            "The second line of the article also ends properly.",
            "A third line, with more words, closes the article!",
        ]
    )
    reason, text = quality.c4(page, cfg)
    assert reason is None
    assert text.splitlines() == [
        "The first real sentence of the article is here. It goes on for a while.",
        "The second line of the article also ends properly.",
        "A third line, with more words, closes the article!",
    ]
    assert (
        drop(quality.c4, page + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit.", cfg) == "c4: lorem ipsum"
    )
    assert drop(quality.c4, page + "\nThe function body is { return x; } in this example.", cfg) == "c4: curly bracket"
    assert drop(quality.c4, "Only one sentence here in this short page.", cfg) == "c4: too few sentences"
    words = tmp_path / "bad.txt"
    words.write_text("Tuesday\n")
    assert drop(quality.c4, PROSE, cfg, quality.load_bad_words(str(words))) == "c4: bad word"
    assert drop(quality.c4, PROSE.replace("Tuesday", "Monday"), cfg, quality.load_bad_words(str(words))) is None


def test_fineweb_rules():
    cfg = FineWebCfg()
    assert drop(quality.fineweb, PROSE, cfg) is None
    menu = "\n".join(["Home", "Products", "Prices", "About us", "Contact"] * 3 + [PROSE])
    assert drop(quality.fineweb, menu, cfg) in (
        "fineweb: too many short lines",
        "fineweb: too few lines ending in punctuation",
    )
    no_punct = "\n".join(f"this line number {i} has no final punctuation at all and is long enough" for i in range(20))
    assert drop(quality.fineweb, no_punct, cfg) == "fineweb: too few lines ending in punctuation"
    dup = PROSE + "\n" + "\n".join(["Share this article with your friends and family today."] * 3)
    assert drop(quality.fineweb, dup, cfg) == "fineweb: duplicated line chars"
    listing = "\n".join(f"Step{i}." for i in range(100)) + "\n" + PROSE
    assert (
        drop(quality.fineweb, listing, FineWebCfg(max_short_lines_frac=None))
        == "fineweb: too many newlines per word (list-like)"
    )


def test_url_block_list_covers_subdomains_and_substrings(tmp_path):
    listed = tmp_path / "domains.txt"
    listed.write_text("# comment\nbad.example\n")
    f = UrlFilter(UrlCfg(blocklist=["spam.example"], blocklist_files=[str(listed)], banned_substrings=["casino"]))
    assert f("http://spam.example/x") == "url: blocked domain"
    assert f("https://shop.spam.example/watches") == "url: blocked domain"
    assert f("https://www.bad.example/") == "url: blocked domain"
    assert f("https://good.example/online-casino-tips") == "url: banned substring"
    assert f("https://notspam.example/") is None and f(None) is None


def test_language_identification_ships_its_model():
    from data_pipeline.filters.language import identify

    assert identify(PROSE)[0] == "en" and identify(PROSE)[1] > 0.99
    german = "Die Stadtbibliothek hat am Montag ihre neuen Räume eröffnet, und viele Leser kamen zur Feier."
    assert identify(german)[0] == "de"


# -- readers and bad input ------------------------------------------------------------------------------
def html_page(title: str, text: str = PROSE) -> bytes:
    return f"<html><head><title>{title}</title></head><body><nav>Home | About</nav><p>{text}</p></body></html>".encode()


def read_all(path: str, **cfg) -> tuple[list[Document], Stats]:
    from data_pipeline.readers import read

    stats = Stats()
    return list(read(path, ReaderCfg(**cfg), stats)), stats


def test_warc_reader_keeps_metadata_and_counts_non_page_records(tmp_path):
    path = tmp_path / "a.warc.gz"
    path.write_bytes(response_records("https://a.example/", "text/html; charset=ISO-8859-1", html_page("A")))
    docs, stats = read_all(str(path))
    assert len(docs) == 1
    assert docs[0].meta["url"] == "https://a.example/" and docs[0].meta["date"] == "2024-01-01T00:00:00Z"
    assert docs[0].meta["content_type"] == "text/html" and docs[0].meta["charset"] == "iso-8859-1"
    assert dict(stats.records) == {"request": 1, "metadata": 1}


def test_truncated_gzip_keeps_the_records_before_and_reports_the_offset(tmp_path):
    fetches = [response_records(f"https://p{i}.example/", "text/html", html_page(str(i))) for i in range(3)]
    path = tmp_path / "cut.warc.gz"
    path.write_bytes(fetches[0] + fetches[1] + fetches[2][: len(fetches[2]) // 2])  # into the third response
    docs, stats = read_all(str(path))
    assert len(docs) == 2
    assert stats.error_count["truncated or corrupt compressed stream"] == 1
    assert all(e["file"] == str(path) and e["offset"] > 0 for e in stats.errors)


def test_malformed_record_is_reported_and_the_next_one_read(tmp_path):
    first = response_records("https://one.example/", "text/html", html_page("one"))
    bad = gzip.compress(b"WARC/1.0\r\nWARC-Type: response\r\nContent-Length: many\r\n\r\ngarbage\r\n\r\n", mtime=0)
    junk = gzip.compress(b"this is not a warc record at all\r\n", mtime=0)
    last = response_records("https://two.example/", "text/html", html_page("two"))
    path = tmp_path / "bad.warc.gz"
    path.write_bytes(first + junk + bad + last)
    docs, stats = read_all(str(path))
    assert [d.meta["url"] for d in docs] == ["https://one.example/", "https://two.example/"]
    assert stats.error_count["malformed WARC record"] == 2
    assert all(e["offset"] is not None for e in stats.errors)


def test_oversized_and_empty_pages_are_counted_not_fatal(tmp_path):
    huge = b"<html><body><p>" + b"word " * (11 * 2**20 // 5) + b"</p></body></html>"  # > 10 MB
    path = tmp_path / "big.warc.gz"
    path.write_bytes(
        response_records("https://huge.example/", "text/html", huge)
        + response_records("https://empty.example/", "text/html", b"")
        + response_records("https://ok.example/", "text/html", html_page("ok"))
    )
    docs, stats = read_all(str(path))
    assert stats.stage("read").dropped["record larger than 10 MB"] == 1
    assert [d.meta["url"] for d in docs] == ["https://empty.example/", "https://ok.example/"]
    from data_pipeline.extract.html import extract
    from data_pipeline.recipe import ExtractCfg

    assert extract(docs[0], ExtractCfg()) == "extract: empty payload"
    assert extract(docs[1], ExtractCfg()) is None and "committee" in docs[1].text and "Home" not in docs[1].text


def test_xhtml_served_as_html_and_declared_charsets_are_extracted(tmp_path):
    from data_pipeline.extract.html import extract
    from data_pipeline.recipe import ExtractCfg

    xhtml = (
        b'<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml"><body><p>'
        + "Caf\u00e9 society. ".encode()
        + PROSE.encode()
        + b"</p></body></html>"
    )
    latin = b"<html><body><p>Caf\xe9 society. " + PROSE.encode() + b"</p></body></html>"
    path = tmp_path / "x.warc.gz"
    path.write_bytes(
        response_records("https://x.example/", "text/html", xhtml)
        + response_records("https://l.example/", "text/html; charset=iso-8859-1", latin)
        + response_records("https://i.example/a.png", "image/png", b"\x89PNG.....")
    )
    docs, _ = read_all(str(path))
    reasons = [extract(d, ExtractCfg()) for d in docs]
    assert reasons == [None, None, "extract: unsupported content type image/*"]
    assert docs[0].text.startswith("Café society.") and docs[1].text.startswith("Café society.")


def test_undecodable_pages_are_dropped_with_their_reason():
    from data_pipeline.extract.html import extract
    from data_pipeline.recipe import ExtractCfg

    noise = np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    doc = Document("x", "", {"content_type": "text/html", "charset": "utf-8"}, payload=b"<p>" + noise + b"</p>")
    assert extract(doc, ExtractCfg()) == "extract: undecodable text"
    one_bad = b"<p>" + PROSE.encode() + b" \xff " + PROSE.encode() + b"</p>"  # a stray byte is tolerated
    doc = Document("y", "", {"content_type": "text/html", "charset": "utf-8"}, payload=one_bad)
    assert extract(doc, ExtractCfg()) is None and "\ufffd" in doc.text


def test_inputs_over_http(tmp_path):
    import functools
    import http.server
    import threading

    (tmp_path / "crawl.warc.gz").write_bytes(response_records("https://h.example/", "text/html", html_page("h")))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        from data_pipeline.readers import expand_inputs

        url = f"http://127.0.0.1:{server.server_port}/crawl.warc.gz"
        assert expand_inputs([url]) == [url]
        docs, stats = read_all(url)
        assert [d.meta["url"] for d in docs] == ["https://h.example/"] and not stats.errors
    finally:
        server.shutdown()


def test_jsonl_zst_parquet_and_bad_lines(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    lines = [
        json.dumps({"id": "a", "text": PROSE, "url": "u"}).encode(),
        b"{not json",
        json.dumps({"id": "b", "body": "no text field"}).encode(),
        b'{"id": "c", "text": "bad \xff bytes"}',
        json.dumps({"text": "no id"}).encode(),
    ]
    path = tmp_path / "d.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(lines) + b"\n"))
    docs, stats = read_all(str(path))
    assert [d.id for d in docs] == ["a", "d.jsonl.zst:5"] and docs[0].meta["url"] == "u"
    assert stats.error_count == {"malformed JSON": 1, "missing text field": 1, "undecodable bytes": 1}
    assert [e["offset"] for e in stats.errors] == [2, 3, 4]
    table = pa.table({"text": [PROSE, None], "lang": ["en", "en"]})
    pq.write_table(table, tmp_path / "p.parquet")
    docs, stats = read_all(str(tmp_path / "p.parquet"))
    assert len(docs) == 1 and docs[0].meta["lang"] == "en" and stats.error_count["missing text field"] == 1


def test_missing_input_and_unknown_recipe_key_stop_at_once(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "data",
            "run",
            "-c",
            FINEWEB,
            f"input={tmp_path}/nothing-*.warc.gz",
            f"output={tmp_path}/o",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "matches no file" in proc.stderr
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "data",
            "run",
            "-c",
            FINEWEB,
            "gopher_quality.min_wrds=3",
            f"output={tmp_path}/o",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "unknown key 'gopher_quality.min_wrds'" in proc.stderr
    assert not (tmp_path / "o").exists()


# -- dedup and decontamination ------------------------------------------------------------------------
def test_minhash_estimates_jaccard_like_datasketch_style_minhash():
    from data_pipeline.dedup.hashing import normalize, window_hashes
    from data_pipeline.dedup.minhash import MinHasher

    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(500)]
    errors = []
    for trial in range(40):
        a = list(rng.choice(vocab, 400))
        b = list(a)
        for i in rng.choice(400, int(rng.integers(5, 80)), replace=False):
            b[i] = "edited"
        sa, sb = (set(window_hashes(normalize(" ".join(x), "minhash"), 5).tolist()) for x in (a, b))
        true = len(sa & sb) / len(sa | sb)
        h = MinHasher(seed=trial)
        est = float((h.signature(" ".join(a)) == h.signature(" ".join(b))).mean())
        errors.append(est - true)
    # 112 permutations: standard error <= 0.047; the estimator is unbiased.
    assert abs(np.mean(errors)) < 0.02 and np.sqrt(np.mean(np.square(errors))) < 0.06


def test_decontamination_cuts_the_span_with_margins_and_drops_fragmented_documents():
    from data_pipeline.decontam.ngrams import cut, doc_ngrams

    leak = "the quick brown fox jumps over the lazy dog while the farmer watches from his porch"
    bad = np.unique(doc_ngrams(leak, 13))
    before, after = "A" * 500 + " intro words here. ", " closing words. " + "B" * 500
    text = before + leak.upper() + "!" + after
    pieces, reason = cut(text, bad, DecontamCfg())
    assert reason is None
    # The 13-grams span the leak (its last one ends at "porch"); 200 characters go on each side.
    start, end = text.index("THE QUICK"), text.index("PORCH!") + len("PORCH!")
    assert pieces == [text[: start - 200].strip(), text[end + 200 :].strip()]
    text = (leak + ". " + "x" * 450 + " ") * 12
    assert cut(text, bad, DecontamCfg())[1] == "decontam: cut into more than 10 pieces"
    assert cut(PROSE, bad, DecontamCfg()) == ([PROSE], None)


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("crawl") / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "data",
            "run",
            "-c",
            FINEWEB,
            f"output={out}",
            "writer.write_dropped=true",
            "url.blocklist=[spam.example]",
            "workers=2",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc.stdout


def documents(out: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((out / "documents").glob("*.jsonl.gz")) for line in gzip.open(p)]


def dropped(out: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((out / "dropped").glob("*.jsonl.gz")) for line in gzip.open(p)]


def test_sample_crawl_dedup_finds_planted_copies_across_files(sample_run):
    out, _ = sample_run
    kept = {d["url"] for d in documents(out)}
    gone = {d["url"]: d["reason"] for d in dropped(out)}
    # The first of each cluster (input order) stays; its copies in other files go.
    assert "https://docs.example.com/itertools.html" in kept and "https://docs.example.com/configparser.html" in kept
    assert gone["https://mirror.example.net/itertools.html"] == "dedup: exact duplicate"
    assert gone["https://copycat.example.org/configparser"] == "dedup: near duplicate"
    stats = json.loads((out / "stats.json").read_text())
    assert stats["dedup"]["exact_removed"] == 1 and stats["dedup"]["near_removed"] == 1


def test_sample_crawl_decontamination_reports_the_dirty_item_and_cuts_the_leak(sample_run):
    from data_pipeline.sample_crawl import LEAKED_ITEM, benchmark_items

    out, _ = sample_run
    report = json.loads((out / "contamination.json").read_text())["benchmarks"]["sample-qa"]
    assert report["dirty_items"] == [LEAKED_ITEM] and report["clean"] == report["items"] - 1
    (doc_ids,) = report["matched_documents"].values()
    leak = benchmark_items()[LEAKED_ITEM - 1]["passage"]
    docs = documents(out)
    assert not any(leak[:80] in d["text"] for d in docs)
    pieces = [d for d in docs if d.get("decontaminated")]
    assert pieces and all(d["id"].split("#piece")[0] == doc_ids[0] for d in pieces)
    assert "This module allows you to spawn processes" in pieces[0]["text"]  # the rest of the page stays
    # Clean documents are left exactly as the filters produced them.
    assert all(not d.get("decontaminated") for d in docs if not d["id"].startswith(doc_ids[0]))


def test_sample_crawl_accounts_for_every_page(sample_run):
    out, stdout = sample_run
    stats = json.loads((out / "stats.json").read_text())
    for name, st in stats["stages"].items():
        assert st["seen"] == st["kept"] + sum(st["dropped"].values()), name
    order = [row["stage"] for row in stats["funnel"]]
    assert order == [
        "read",
        "url",
        "extract",
        "language",
        "gopher_repetition",
        "gopher_quality",
        "c4",
        "fineweb",
        "dedup",
        "decontam",
    ]
    for a, b in zip(stats["funnel"], stats["funnel"][1:]):
        assert b["documents"] <= a["documents"] or b["stage"] == "decontam"
    read = stats["stages"]["read"]
    assert read["dropped"] == {"HTTP status 4xx": 1}
    assert stats["other_warc_records"] == {"metadata": read["seen"], "request": read["seen"]}
    reasons = {d["url"]: d["reason"] for d in dropped(out)}
    assert reasons["http://shop.spam.example/watches"] == "url: blocked domain"
    assert reasons["http://lorem.example.org/"] == "language: la"  # lorem ipsum is (pseudo-)Latin
    assert reasons["http://bibliothek.example.de/"] == "language: de"
    assert reasons["https://docs.example.com/logo.png"] == "extract: unsupported content type image/*"
    kept = {d["url"] for d in documents(out)}
    assert {"https://xhtml.example.com/sched.xhtml", "https://latin1.example.com/cafe"} <= kept
    assert (out / "funnel.png").stat().st_size > 1000 and "## Funnel" in (out / "README.md").read_text()
    assert "# Data card: fineweb-like" in stdout
    doc = documents(out)[0]
    assert {"url", "date", "language", "language_score", "content_type", "charset"} <= set(doc)


def run_files(out: Path) -> dict[str, bytes]:
    names = ["contamination.json", "stats.json", "README.md", "funnel.png"]
    files = {n: (out / n).read_bytes() for n in names}
    files.update({str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "documents").glob("*"))})
    return files


def test_a_run_killed_midway_and_rerun_gives_byte_identical_output(sample_run, tmp_path):
    reference, _ = sample_run
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "glm_dist.cli",
        "data",
        "run",
        "-c",
        FINEWEB,
        f"output={out}",
        "workers=1",
        "writer.write_dropped=true",
        "url.blocklist=[spam.example]",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = out / "work/markers/filter/00001.json"
    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline, (
            proc.stderr.read().decode()[-3000:] if proc.poll() else "timeout"
        )
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(p.name for p in (out / "work/markers/filter").glob("*.json"))
    assert "00003.json" not in done and not (out / "stats.json").exists()
    # What a writer killed mid-file leaves beside whatever this kill left: NAME.tmp.PID, never committed.
    (out / "documents").mkdir(exist_ok=True)
    (out / "documents/00003.jsonl.gz.tmp.4242").write_bytes(b"\x1f\x8b half a file")
    rerun = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert run_files(out) == run_files(reference)
    assert not [p for p in out.rglob("*") if ".tmp." in p.name]  # the orphans removed before the manifest
    # A finished run is not redone, and a different recipe in the same output is refused.
    again = subprocess.run(cmd[:-1] + ["url.blocklist=[]"], cwd=ROOT, env=clean_env(), capture_output=True, text=True)
    assert again.returncode == 2 and "holds a run with other inputs or settings" in again.stderr


def test_sample_crawl_clusters_equal_one_process_components(sample_run):
    """The clusters rounds (one node partition per task) give every document the first document of
    its component, exactly as connected components of all the buckets' pairs in one process."""
    from data_pipeline.dedup.components import components
    from data_pipeline.dedup.shuffle import EDGE, as_edges, packed_ids, read_routed
    from data_pipeline.executors.tasks import read_marker
    from data_pipeline.pipeline import Pipeline
    from data_pipeline.recipe import Recipe
    from data_pipeline.stages.buckets import edges_key
    from data_pipeline.stages.clusters import rounds

    out, _ = sample_run
    pipe = Pipeline(Recipe(output=str(out)))
    files, parts = len(pipe.inputs), pipe.partitions
    ids = np.concatenate([packed_ids(t, read_marker(pipe.work, "filter", t)["documents"]) for t in range(files)])
    sources = [edges_key(p) for p in range(parts)]
    pairs = np.concatenate([as_edges(read_routed(pipe.work, sources, q, EDGE)[0]) for q in range(parts)])
    expected = ids[components(len(ids), np.searchsorted(ids, pairs))]
    labels = ids.copy()
    for t in range(files):
        member_first = as_edges(read_routed(pipe.work, rounds(pipe).labels(), t, EDGE)[0])
        labels[np.searchsorted(ids, member_first[:, 0])] = member_first[:, 1]
    assert parts == files == 4 and (labels != ids).sum() == 2  # the planted exact and near copies
    assert np.array_equal(labels, expected)


S3_RUN = (
    "import sys; from data_pipeline.executors.local import run; from data_pipeline.recipe import load_recipe; "
    "run(load_recipe(sys.argv[1], sys.argv[2:]), progress=False)"
)


@pytest.fixture(scope="module")
def s3_server():
    """A local S3 server (moto) and the environment that points boto at it."""
    import os
    import socket

    import s3fs
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
    fs.mkdir("glm-test")
    yield env, fs
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    server.stop()


def test_output_to_object_storage_is_visible_through_its_manifest_and_resumes_after_kill(sample_run, s3_server):
    from data_pipeline.manifest import read_output_manifest

    reference, _ = sample_run
    env, fs = s3_server
    url = "s3://glm-test/fineweb"
    cmd = [
        sys.executable,
        "-c",
        S3_RUN,
        FINEWEB,
        f"output={url}",
        "writer.write_dropped=true",
        "url.blocklist=[spam.example]",
    ]
    proc = subprocess.Popen(
        cmd + ["workers=1"], cwd=ROOT, env=clean_env() | env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 180
    while not fs.exists(f"{url}/work/markers/filter/00001.json"):
        assert proc.poll() is None and time.time() < deadline, (
            proc.stderr.read().decode()[-3000:] if proc.poll() else "timeout"
        )
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Killed mid-run: no manifest, so no output, whatever objects the finished tasks left.
    assert not fs.exists(f"{url}/work/markers/filter/00003.json") and not fs.exists(f"{url}/manifest.json")
    with pytest.raises(FileNotFoundError, match="holds no finished crawl-pipeline run"):
        read_output_manifest(url)
    rerun = subprocess.run(
        cmd + ["workers=2"], cwd=ROOT, env=clean_env() | env, capture_output=True, text=True, timeout=600
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    shards = read_output_manifest(url)
    assert [s.rsplit("/", 1)[1] for s in shards] == [Path(p).name for p in read_output_manifest(str(reference))]
    remote = {f"documents/{s.rsplit('/', 1)[1]}": fs.cat(s) for s in shards}
    remote.update(
        {name: fs.cat(f"{url}/{name}") for name in ("contamination.json", "stats.json", "README.md", "funnel.png")}
    )
    assert remote == run_files(reference)  # byte-identical to the local run


def crawl_copy_with_leftover(reference: Path, dest: Path) -> int:
    """A copy of a finished crawl output plus a document file its manifest does not list (what a
    crashed rerun can leave); returns the number of documents the manifest counts."""
    import shutil

    shutil.copytree(reference, dest, ignore=shutil.ignore_patterns("work"))
    stray = {"id": "stray", "text": PROSE, "url": "https://leftover.example/"}
    (dest / "documents" / "zz-leftover.jsonl.gz").write_bytes(gzip.compress((json.dumps(stray) + "\n").encode()))
    return json.loads((dest / "manifest.json").read_text())["documents"]


def test_tokenize_reads_a_crawl_output_through_its_manifest_never_a_listing(sample_run, tmp_path):
    from data_pipeline.tokenize.prepare import prepare_shards

    reference, _ = sample_run
    crawl = tmp_path / "crawl"
    listed = crawl_copy_with_leftover(reference, crawl)
    manifest = prepare_shards(source=str(crawl), out_dir=str(tmp_path / "tokens"), vocab_size=400, workers=1)
    assert manifest["source"]["files"] == len(list((reference / "documents").glob("*.jsonl.gz")))
    assert manifest["source"]["documents"] == listed > 0  # the leftover file was not read
    (crawl / "work").mkdir()
    (crawl / "work" / "run.json").write_text("{}")
    (crawl / "manifest.json").unlink()  # a run that has not finished: nothing to tokenize yet
    with pytest.raises(FileNotFoundError, match="holds no finished crawl-pipeline run"):
        prepare_shards(source=str(crawl), out_dir=str(tmp_path / "tokens2"), vocab_size=400, workers=1)


def test_a_crawl_output_is_a_data_mixture_source(sample_run, shards_dir, tmp_path):
    """glm data run's output feeds a data mixture (issue 32): tokenized through its manifest on first
    use with the first source's tokenizer, then drawn beside the pydoc shards at its weight."""
    from glm_dist.config.schema import DataConfig
    from glm_dist.data.loader import Loader
    from glm_dist.data.mixture import build_missing, resolve_mixture

    reference, _ = sample_run
    crawl = tmp_path / "crawl"
    listed = crawl_copy_with_leftover(reference, crawl)
    tokens = tmp_path / "crawl-tokens"
    data = DataConfig(
        mixture=[
            {"name": "pydoc", "shards_dir": shards_dir, "weight": 0.75},
            {"name": "crawl", "shards_dir": str(tokens), "source": str(crawl), "weight": 0.25},
        ]
    )
    build_missing(data)
    assert json.loads((tokens / "manifest.json").read_text())["source"]["documents"] == listed
    mixture = resolve_mixture(data, total_tokens=1)
    batches = Loader(mixture, seq_len=32, micro_batch_size=8, seed=3).next_step()
    sources = torch.cat([b["source"] for b in batches]).tolist()
    assert sources.count(1) == 2 and sources.count(0) == 6  # 25 % of the 8 rows


def test_token_shards_on_object_storage_from_a_crawl_output_there_appear_whole_through_their_manifest(
    sample_run, s3_server, tmp_path
):
    import torch

    from data_pipeline.tokenize.prepare import prepare_shards
    from data_pipeline.writers.shards import ShardSetWriter
    from glm_dist.data.loader import Loader

    reference, _ = sample_run
    _, fs = s3_server
    listed = crawl_copy_with_leftover(reference, tmp_path / "crawl")
    fs.put(str(tmp_path / "crawl"), "glm-test/tok-src", recursive=True)
    half = ShardSetWriter("s3://glm-test/half", "train", 1 << 20)  # a task that fails mid-shard
    half.write("k", np.arange(50, dtype=np.uint16), {"id": "k"})
    half.abort()
    assert fs.find("glm-test/half") == []
    manifest = prepare_shards(source="s3://glm-test/tok-src", out_dir="s3://glm-test/tokens", vocab_size=400, workers=1)
    assert manifest["source"]["documents"] == listed
    objects = [p.rsplit("/", 1)[1] for p in fs.find("glm-test/tokens")]
    assert not [o for o in objects if ".tmp" in o]  # written straight to their keys: no copy-and-delete
    names = [i["name"] for split in manifest["splits"].values() for i in split]
    assert set(names) | {i["index"] for split in manifest["splits"].values() for i in split} <= set(objects)
    fs.get("glm-test/tokens", str(tmp_path / "local"), recursive=True)
    kw = dict(objective="clm", seq_len=32, micro_batch_size=4, seed=1)
    remote, local = Loader("s3://glm-test/tokens", **kw), Loader(str(tmp_path / "local"), **kw)
    for _ in range(2):  # range reads from the bucket give the batches of the downloaded copy
        a, b = remote.next_step(), local.next_step()
        assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))
    assert remote.read_stats.bytes > 0 and not any(remote.skipped.values())


def test_frequent_benchmark_ngrams_are_ignored_and_missing_fields_reported(tmp_path):
    boiler = "all rights reserved by the publishers of this fine website and its many partners around the world"
    docs = [{"id": f"d{i}", "text": f"{PROSE} Page {i} says: {boiler}. " + PROSE} for i in range(12)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "bench.jsonl").write_text(json.dumps({"question": boiler}) + "\n" + json.dumps({"other": "x"}) + "\n")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "data",
            "run",
            "-c",
            FINEWEB,
            f"input={tmp_path}/in.jsonl",
            f"benchmarks={tmp_path}/bench.jsonl",
            f"output={out}",
            "stages=[]",
            "dedup.exact=false",
            "dedup.minhash=false",
            "workers=1",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "contamination.json").read_text())
    assert report["ignored_frequent_ngrams"] > 0 and report["benchmarks"]["bench"]["dirty"] == 0
    assert len(documents(out)) == 12
    stats = json.loads((out / "stats.json").read_text())
    assert stats["input_errors"] == {"benchmark item without any configured field": 1}
    (example,) = stats["input_error_examples"]
    assert example["file"].endswith("bench.jsonl") and example["offset"] == 2
    # Below the frequency limit the same n-grams are contamination: Dolma mode drops the documents.
    out2 = tmp_path / "out2"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "data",
            "run",
            "-c",
            FINEWEB,
            f"input={tmp_path}/in.jsonl",
            f"benchmarks={tmp_path}/bench.jsonl",
            f"output={out2}",
            "stages=[]",
            "dedup.exact=false",
            "dedup.minhash=false",
            "workers=1",
            "decontam.max_doc_freq=20",
            "decontam.mode=drop_document",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        documents(out2) == []
        and json.loads((out2 / "contamination.json").read_text())["benchmarks"]["bench"]["dirty"] == 1
    )


# -- SLURM job arrays (the local two-node cluster: tests/conftest.py) --------------------------------


@pytest.mark.slow
def test_slurm_arrays_produce_the_same_output_as_the_local_pool(slurm_cluster, sample_run, tmp_path):
    reference, _ = sample_run
    out = tmp_path / "out"
    env = clean_env() | {"GLM_VENV": sys.prefix}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "slurm",
            "submit-pipeline",
            "-c",
            FINEWEB,
            f"output={out}",
            "writer.write_dropped=true",
            "url.blocklist=[spam.example]",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    jobs = proc.stdout.split()
    assert len(jobs) == 8  # benchmarks, filter, buckets, the clusters rounds' driver, removals, decontam, write, card
    assert "stage filter: 4 task(s)" in proc.stderr and "stage buckets: 4 task(s)" in proc.stderr  # 4 partitions
    assert "stage clusters: driver of the rounds" in proc.stderr
    deadline = time.time() + 600
    while not (out / "work/markers/card/00000.json").exists():
        states = {j: job_info(j).get("JobState") for j in jobs}
        failed = {j: s for j, s in states.items() if s in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")}
        logs = "\n".join(p.read_text()[-2000:] for p in sorted((tmp_path / "slurm-logs").glob("*.out")))
        assert not failed and time.time() < deadline, f"{states}\n{logs}"
        time.sleep(1)
    logs = sorted((tmp_path / "slurm-logs").glob("glm-filter-*.out"))
    assert len(logs) == 4  # one log per array task
    assert sorted((tmp_path / "slurm-logs").glob("glm-clusters-000-*.out"))  # a round, submitted by the driver
    assert run_files(out) == run_files(reference)


# -- GPT-3 quality classifier -------------------------------------------------------------------------
def classifier_data():
    from data_pipeline.embedded import docstring_task

    good = [r["text"] for r in docstring_task()]
    rng = np.random.default_rng(0)
    junk_vocab = (
        "buy cheap click here login cart price free shipping casino win deal offer now best sale "
        "discount subscribe follow like share bonus jackpot online order today limited"
    ).split()
    good_vocab = " ".join(good).split()
    bad = [
        " ".join(rng.choice(junk_vocab if rng.random() < 0.7 else good_vocab) for _ in range(int(rng.integers(15, 40))))
        for _ in range(len(good))
    ]
    return good, bad


def test_quality_classifier_separates_curated_text_from_junk_and_samples_by_pareto(tmp_path):
    from data_pipeline.filters.classifier import QualityClassifier, keep, train

    good, bad = classifier_data()
    clf = train(good, bad, seed=0)
    assert clf.info["heldout_accuracy"] > 0.9
    clf.save(str(tmp_path / "m.npz"))
    again = QualityClassifier.load(str(tmp_path / "m.npz"))
    assert np.allclose(again.scores(good[:20]), clf.scores(good[:20]), atol=1e-5)
    # GPT-3's rule: keep iff pareto(9) > 1 - score, i.e. P(keep) = (2 - score)^-9; seeded by document id.
    for score in (1.0, 0.9, 0.5):
        rate = np.mean([keep(f"doc{i}", score, 9.0, 0) for i in range(20000)])
        assert abs(rate - (2 - score) ** -9) < 0.01
    assert keep("doc1", 0.7, 9.0, 0) == keep("doc1", 0.7, 9.0, 0)


def test_classifier_stage_in_a_recipe(tmp_path):
    good, bad = classifier_data()
    (tmp_path / "good.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in good[::2]))
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in bad[::2]))
    model = tmp_path / "quality.npz"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "data",
            "train-classifier",
            "--positive",
            str(tmp_path / "good.jsonl"),
            "--negative",
            str(tmp_path / "bad.jsonl"),
            "--out",
            str(model),
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    mixed = [{"id": f"g{i}", "text": t} for i, t in enumerate(good[1::2])] + [
        {"id": f"b{i}", "text": t} for i, t in enumerate(bad[1::2])
    ]
    (tmp_path / "crawl.jsonl").write_text("".join(json.dumps(d) + "\n" for d in mixed))
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "data",
            "run",
            "-c",
            str(ROOT / "configs/data/gpt3.yaml"),
            f"input={tmp_path}/crawl.jsonl",
            f"output={out}",
            "benchmarks=[]",
            "stages=[classifier]",
            "classifier.enabled=true",
            f"classifier.model={model}",
            "workers=1",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = documents(out)
    good_kept = sum(d["id"].startswith("g") for d in kept) / len(good[1::2])
    bad_kept = sum(d["id"].startswith("b") for d in kept) / len(bad[1::2])
    assert good_kept > 0.5 and bad_kept < 0.1, (good_kept, bad_kept)
    assert all("quality_score" in d for d in kept)


def test_pipeline_output_feeds_tokenization(sample_run, tmp_path):
    out, _ = sample_run
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "data",
            "tokenize",
            "-c",
            str(ROOT / "configs/data/embedded-gpt2-bpe.yaml"),
            f"data.source={out}/documents/*.jsonl.gz",
            f"data.shards_dir={tmp_path}/shards",
            "data.vocab_size=1000",
            "data.encode_workers=1",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "shards/manifest.json").read_text())
    assert manifest["source"]["documents"] == len(documents(out)) and not manifest["source"]["skipped"]
