"""Data-side faults of issue 29 ("Reliability, second trial"): shards served by an HTTP server that
ignores range requests, range reads that keep failing (training) or fail once (validation), a WARC
Content-Length that runs over the next record, an input whose name tells no format, batch sizes and
retry counts no loader can honour, and a manifest naming files outside its shard set. Each test fails
without its fix; all but two (a ``glm train`` and a ``glm data index`` run) are in-process."""

from __future__ import annotations

import contextlib
import functools
import gzip
import http.server
import json
import os
import shutil
import threading
import types
from pathlib import Path

import pytest

from data_pipeline.document import Stats
from data_pipeline.errors import PipelineError
from data_pipeline.readers import read
from data_pipeline.readers.warc import WRONG_LENGTH
from data_pipeline.recipe import ReaderCfg
from glm_dist.data import reader as range_reader
from glm_dist.data.index import index_shard_set
from glm_dist.data.loader import Loader, validation_batches
from glm_dist.data.reader import DataUnreachable, RangeReader, RangeUnsupported
from glm_dist.data.shards import ShardSetError, read_manifest
from glm_dist.data.workers import WorkerLoader
from glm_dist.errors import GlmError
from tests.conftest import FAST, TINY, run_glm

KW = dict(objective="clm", seq_len=64, micro_batch_size=4)


class _NoRanges(http.server.SimpleHTTPRequestHandler):
    """Python's file server: it answers a ``Range`` request with HTTP 200 and the whole file."""

    def log_message(self, *args) -> None:
        pass


class _ShardsUnavailable(_NoRanges):
    """Serves the manifest and index files; every shard request gets HTTP 503."""

    def send_head(self):
        if self.path.endswith(".tar"):
            self.send_error(503)
            return None
        return super().send_head()


@contextlib.contextmanager
def serve(root: str, handler=_NoRanges):
    """``root`` over HTTP on 127.0.0.1 (the URL), for the test's duration."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=root))
    server.timeout = 10
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def shard_copy(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".glm-index"))
    return dst


def failing_opens(monkeypatch, fails) -> list[str]:
    """Shard opens fail (a connection reset) where ``fails(url)``; retries do not sleep. The opened URLs."""
    opened, real_open = [], RangeReader._open

    def _open(self, shard):
        url = self.table.url(shard)
        opened.append(url)
        if fails(url):
            raise OSError(f"{url}: connection reset by peer")
        return real_open(self, shard)

    monkeypatch.setattr(RangeReader, "_open", _open)
    monkeypatch.setattr(range_reader, "time", types.SimpleNamespace(sleep=lambda s: None))
    return opened


# -- 1. reads that cannot work are never padding ------------------------------------------------------
def test_a_server_that_ignores_range_requests_stops_training_and_validation_reads_at_once(shards_dir):
    with serve(shards_dir) as url:
        with pytest.raises(RangeUnsupported) as train:
            Loader(url, read_backoff_s=5.0, **KW).next_step()  # a retry would wait 5 s: none is made
        with pytest.raises(RangeUnsupported) as held_out:
            validation_batches(url, seq_len=64, micro_batch_size=4, num_batches=2)
    for err in (train, held_out):
        message = str(err.value)
        assert message.startswith(f"{url}/") and ".tar: the server ignores HTTP range requests" in message
        assert "the server must support range requests" in message and "\n" not in message


@pytest.mark.slow
def test_glm_train_on_a_server_without_range_requests_exits_2_with_one_line_and_scores_nothing(shards_dir, tmp_path):
    with serve(shards_dir) as url:
        proc = run_glm(
            [
                "train",
                "-c",
                TINY,
                *FAST,
                f"data.shards_dir={url}",
                f"train.out_dir={tmp_path / 'run'}",
                "train.max_steps=2",
            ],
            check=False,
            timeout=300,
        )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("glm train: error:")]
    assert len(errors) == 1 and url in errors[0] and "must support range requests" in errors[0], proc.stderr[-3000:]
    metrics = tmp_path / "run/metrics.jsonl"
    assert not metrics.exists() or '"bits_per_byte"' not in metrics.read_text()


def test_validation_that_cannot_read_a_held_out_document_fails_instead_of_scoring_padding(shards_dir, monkeypatch):
    first = read_manifest(shards_dir)["splits"]["validation"][0]["name"]
    failing_opens(monkeypatch, lambda url: url.endswith(first))
    with pytest.raises(GlmError) as err:
        validation_batches(shards_dir, seq_len=64, micro_batch_size=4, num_batches=4)
    message = str(err.value)
    assert message.startswith("validation: ") and "held-out document(s)" in message and first in message, message
    assert "connection reset by peer" in message and "score padding" in message and "\n" not in message


def test_training_stops_when_the_reads_of_several_shards_in_a_row_fail(shards_dir, monkeypatch):
    opened = failing_opens(monkeypatch, lambda url: True)
    loader = Loader(shards_dir, read_retries=1, **KW)
    with pytest.raises(DataUnreachable) as err:
        for _ in range(50):
            loader.next_step()
    assert "3 different shard(s)" in str(err.value) and "connection reset by peer" in str(err.value)
    assert len(set(opened)) == 3  # three shards failed, each request tried twice (one retry): then the stop


def test_a_stop_in_a_dataloader_worker_reaches_the_trainer_as_one_line(shards_dir):
    with serve(shards_dir, _ShardsUnavailable) as url:
        loader = WorkerLoader(url, num_workers=1, read_retries=0, read_backoff_s=0.0, **KW)
        with pytest.raises(DataUnreachable) as err:
            for _ in range(50):
                loader.next_step()
    message = str(err.value)
    assert message.startswith(f"the reads of 3 different shard(s) of {url} failed in a row") and "\n" not in message
    assert "HTTP 503" in message, message


def test_one_unreadable_shard_is_padded_counted_and_training_goes_on(shards_dir, monkeypatch):
    dead = read_manifest(shards_dir)["splits"]["train"][1]["name"]
    failing_opens(monkeypatch, lambda url: url.endswith(dead))
    loader = Loader(shards_dir, read_retries=0, shuffle_window=4, **{**KW, "micro_batch_size": 16})
    for _ in range(20):
        loader.next_step()
    assert loader.read_counts()["skipped_documents"] > 0 and loader.read_counts()["bytes_read"] > 0


# -- 2. a WARC Content-Length that lies --------------------------------------------------------------
def record(url: str, text: str) -> tuple[bytes, bytes]:
    """A response record's WARC header and its block (HTTP head and page)."""
    block = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n" + f"<p>{text}</p>".encode()
    head = (
        f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: {url}\r\n"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(block)}\r\n\r\n"
    ).encode()
    return head, block


def lying(head: bytes, block: bytes, length: int) -> bytes:
    return head.replace(b"Content-Length: %d\r\n" % len(block), b"Content-Length: %d\r\n" % length)


PAGES = [record(f"https://p{i}.example/", f"page {i} of the crawl") for i in range(4)]
WHOLE = [head + block + b"\r\n\r\n" for head, block in PAGES]
STRETCH = {  # record 1's Content-Length -> how far past its own block it claims
    "to the end of the next record": len(WHOLE[2]),
    "into the next record's block": len(PAGES[2][0]) + 4 + 5,
    "short of its own block": -9,
}


@pytest.mark.parametrize("gz", [False, True], ids=["warc", "warc.gz"])
@pytest.mark.parametrize("stretch", STRETCH)
def test_a_warc_record_whose_length_lies_is_skipped_counted_and_the_next_ones_read(stretch, gz, tmp_path):
    head, block = PAGES[1]
    data = WHOLE[0] + lying(head, block, len(block) + STRETCH[stretch]) + block + b"\r\n\r\n" + WHOLE[2] + WHOLE[3]
    path = tmp_path / ("crawl.warc.gz" if gz else "crawl.warc")
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    stats = Stats()
    docs = list(read(str(path), ReaderCfg(), stats))
    assert [d.meta["url"] for d in docs] == ["https://p0.example/", "https://p2.example/", "https://p3.example/"]
    assert not any(b"WARC/" in d.payload for d in docs)  # no header landed in a page
    assert stats.error_count == {WRONG_LENGTH: 1}, stats.errors
    assert stats.errors[0]["offset"] == len(WHOLE[0]) and "record skipped" in stats.errors[0]["detail"]


def test_a_warc_length_running_past_the_end_over_a_record_recovers_that_record(tmp_path):
    head, block = PAGES[1]
    path = tmp_path / "cut.warc"
    past_the_end = len(block) + 4 + len(WHOLE[2]) + 100
    path.write_bytes(WHOLE[0] + lying(head, block, past_the_end) + block + b"\r\n\r\n" + WHOLE[2])
    stats = Stats()
    docs = list(read(str(path), ReaderCfg(), stats))
    assert [d.meta["url"] for d in docs] == ["https://p0.example/", "https://p2.example/"]
    assert stats.error_count == {WRONG_LENGTH: 1}, stats.errors


def test_a_page_that_holds_a_whole_warc_file_is_one_page(tmp_path):
    archived = b"".join(WHOLE[:3])  # ends in CRLF CRLF: not records run over, content
    block = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n\r\n\r\n" + archived
    head = (
        f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: https://archive.example/\r\n"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(block)}\r\n\r\n"
    ).encode()
    path = tmp_path / "nested.warc"
    path.write_bytes(head + block + b"\r\n\r\n" + WHOLE[3])
    stats = Stats()
    docs = list(read(str(path), ReaderCfg(), stats))
    assert [d.meta["url"] for d in docs] == ["https://archive.example/", "https://p3.example/"]
    assert docs[0].payload.endswith(archived) and not stats.errors


# -- 3. an input whose name tells no format --------------------------------------------------------------
def test_an_input_without_an_extension_is_one_line_naming_it_and_the_accepted_formats(tmp_path):
    path = tmp_path / "crawl"
    path.write_text(json.dumps({"text": "a document"}) + "\n")
    with pytest.raises(PipelineError) as err:
        list(read(str(path), ReaderCfg(), Stats()))
    message = str(err.value)
    assert message.startswith(f"input {path}: cannot tell its format") and "\n" not in message
    assert ".warc" in message and ".jsonl" in message and ".parquet" in message and "reader.format=" in message
    assert [d.text for d in read(str(path), ReaderCfg(format="jsonl"), Stats())] == ["a document"]


# -- 4. sizes no loader can honour ------------------------------------------------------------------------
def test_a_micro_batch_no_rank_can_build_is_refused_before_anything_is_allocated(shards_dir):
    with pytest.raises(GlmError, match=r"^train\.micro_batch_size=1000000000000 x .* more than a rank can build"):
        Loader(shards_dir, seq_len=64, micro_batch_size=10**12)
    with pytest.raises(GlmError, match=r"^train\.micro_batch_size=0 must be a whole number, 1 or more"):
        Loader(shards_dir, seq_len=64, micro_batch_size=0)


@pytest.mark.parametrize(
    "retries, backoff, said",
    [
        (-1, 0.5, "data.read_retries=-1"),
        (2.5, 0.5, "data.read_retries=2.5"),
        (3, -1.0, "data.read_backoff_s=-1.0"),
        (3, float("nan"), "data.read_backoff_s=nan"),
    ],
)
def test_read_retries_and_backoff_out_of_range_are_refused_in_one_line(shards_dir, retries, backoff, said):
    with pytest.raises(GlmError) as err:
        Loader(shards_dir, read_retries=retries, read_backoff_s=backoff, **KW).next_step()
    assert str(err.value).startswith(f"{said} must be")


def test_the_wait_between_retries_is_capped_however_many_retries(shards_dir, monkeypatch):
    waits = []
    failing_opens(monkeypatch, lambda url: True)
    monkeypatch.setattr(range_reader, "time", types.SimpleNamespace(sleep=waits.append))
    loader = Loader(shards_dir, read_retries=2000, read_backoff_s=1.0, **KW)
    with pytest.raises(DataUnreachable):
        loader.next_step()  # 2 ** 1999 s would overflow a float
    assert max(waits) == range_reader.MAX_BACKOFF_S


# -- 5. manifest names stay inside the shard set -----------------------------------------------------------
def _rename_first_shard(root: Path, name: str) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    entry = manifest["splits"]["train"][0]
    entry["name"] = name
    entry.pop("index"), entry.pop("index_sha256")  # glm data index would write its index beside it
    (root / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("kind", ["dot-dot", "absolute", "symlink"])
def test_a_manifest_name_outside_the_shard_set_is_refused_and_nothing_is_written_there(kind, shards_dir, tmp_path):
    root = shard_copy(shards_dir, tmp_path / "set")
    victim = tmp_path / "victim"
    victim.mkdir()
    shutil.copy(root / read_manifest(str(root))["splits"]["train"][0]["name"], victim / "other.tar")
    if kind == "symlink":
        os.symlink(victim, root / "linked")
    name = {"dot-dot": "../victim/other.tar", "absolute": str(victim / "other.tar"), "symlink": "linked/other.tar"}[
        kind
    ]
    _rename_first_shard(root, name)
    with pytest.raises(ShardSetError) as err:
        index_shard_set(str(root))
    message = str(err.value)
    assert message.startswith(f"{root}/manifest.json: name {name!r} ") and "\n" not in message
    assert ("symlink" in message) == (kind == "symlink")
    assert sorted(p.name for p in victim.iterdir()) == ["other.tar"]
    with pytest.raises(ShardSetError):
        Loader(str(root), **KW)


def test_glm_data_index_refuses_a_dot_dot_shard_name_with_one_line(shards_dir, tmp_path):
    root = shard_copy(shards_dir, tmp_path / "set")
    (tmp_path / "victim").mkdir()
    _rename_first_shard(root, "../victim/other.tar")
    proc = run_glm(["data", "index", str(root)], check=False, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if "error" in line.lower()] == [
        f"glm data index: error: {root}/manifest.json: name '../victim/other.tar' is not a file inside the shard set "
        "(absolute, '..', a URL or empty); fix the manifest or rebuild the set with glm data tokenize"
    ]
    assert list((tmp_path / "victim").iterdir()) == []
