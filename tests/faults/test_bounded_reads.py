"""Bounded reads of hostile input: records far over ``max_record_mb`` through every reader, an endless
WARC header line, decompression bombs, an HTTP server that never answers, a host that does not
resolve, and locations that are commands. Each test asserts the counter or message and the exit
code, and the big-input runs assert the child's peak memory against a baseline run (a reader that
buffered a 64 MB record would exceed the margin)."""

from __future__ import annotations

import base64
import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from data_pipeline.document import Stats
from data_pipeline.readers import read
from data_pipeline.recipe import ReaderCfg
from data_pipeline.remote import RemoteReadError, check_scheme, open_url
from tests.conftest import ROOT, clean_env

FINEWEB = str(ROOT / "configs/data/fineweb.yaml")
TOKENIZE = str(ROOT / "configs/data/embedded-gpt2-bpe.yaml")
QUICK = ["benchmarks=[]", "stages=[]", "workers=1"]  # read + dedup + write only: fast
BIG = 64 << 20  # each oversized record: 64 MiB, 6x the 10 MB limit
MARGIN_MB = 40  # peak memory allowed over the baseline run: well below one record
PROSE = "The committee met on Tuesday to review the proposal for the new library building. " * 3
# The child runs the command and reports its peak memory: RUSAGE_CHILDREN of a fresh process
# covers exactly that one command, whatever other tests ran before.
MEASURE = (
    "import json, resource, subprocess, sys; r = subprocess.run(sys.argv[2:]).returncode; "
    "open(sys.argv[1], 'w').write(json.dumps({'rc': r, "
    "'mb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))"
)


class Run:
    def __init__(self, rc: int, peak_mb: float, seconds: float, stderr: str) -> None:
        self.rc, self.peak_mb, self.seconds, self.stderr = rc, peak_mb, seconds, stderr


def glm(args: list[str], tmp: Path, timeout: int = 120) -> Run:
    report, err = tmp / f"rusage-{time.monotonic_ns()}.json", tmp / f"stderr-{time.monotonic_ns()}.txt"
    start = time.monotonic()
    with open(err, "w") as stderr:
        subprocess.run(
            [sys.executable, "-c", MEASURE, str(report), sys.executable, "-m", "glm_dist.cli", *args],
            cwd=ROOT,
            env=clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            timeout=timeout,
        )
    seconds = time.monotonic() - start
    result = json.loads(report.read_text())
    return Run(result["rc"], result["mb"], seconds, err.read_text())


def jsonl(*texts: str) -> bytes:
    return b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts)


def write_repeated(f, chunk: bytes, total: int) -> None:
    for _ in range(total // len(chunk)):
        f.write(chunk)


def warc_response(url: str, body: bytes, length: int | None = None) -> bytes:
    """A response record's header and HTTP head; the body follows when ``length`` is not given."""
    http = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n"
    size = len(http) + (len(body) if length is None else length)
    head = (
        f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: {url}\r\n"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    return head + http + (body + b"\r\n\r\n" if length is None else b"")


def oversized_inputs(folder: Path) -> None:
    """One file per reader with a 64 MiB record between normal ones, an endless WARC header line
    and a gzip bomb (1 GiB of zeros in 1 MB)."""
    folder.mkdir()
    with open(folder / "a-plain.jsonl", "wb") as f:
        f.write(jsonl(PROSE) + b'{"text": "')
        write_repeated(f, b"x" * (1 << 20), BIG)
        f.write(b'"}\n' + jsonl(PROSE + " after"))
    with open(folder / "b-packed.jsonl.gz", "wb") as f:  # random text: gzip cannot shrink it (no bomb)
        block = base64.b64encode(os.urandom(3 << 18))
        packed = gzip.compress(block, 1, mtime=0)
        f.write(gzip.compress(jsonl(PROSE) + b'{"text": "', mtime=0))
        write_repeated(f, packed, BIG // len(block) * len(packed))
        f.write(gzip.compress(b'"}\n' + jsonl(PROSE + " after"), mtime=0))
    with open(folder / "c-record.warc", "wb") as f:
        f.write(warc_response("https://big.example/", b"", length=BIG))
        write_repeated(f, b"y" * (1 << 20), BIG)
        f.write(b"\r\n\r\n" + warc_response("https://ok.example/", f"<p>{PROSE}</p>".encode()))
    with open(folder / "d-header.warc", "wb") as f:
        f.write(warc_response("https://first.example/", f"<p>{PROSE}</p>".encode()))
        f.write(b"WARC/1.0\r\nWARC-Type: response\r\nX-Endless: ")
        write_repeated(f, b"z" * (1 << 20), BIG)
    with open(folder / "e-book.txt", "wb") as f:
        write_repeated(f, b"word " * (1 << 18), BIG)
    member = gzip.compress(bytes(BIG), 9, mtime=0)
    with open(folder / "f-bomb.jsonl.gz", "wb") as f:
        write_repeated(f, member, 16 * len(member))  # 16 members: 1 GiB of zeros, no newline


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Run:
    """``glm data run`` on a small normal input: the memory and time every other run is held to."""
    tmp = tmp_path_factory.mktemp("baseline")
    (tmp / "small.jsonl").write_bytes(jsonl(PROSE, PROSE + " two"))
    run = glm(["data", "run", "-c", FINEWEB, f"input={tmp}/small.jsonl", f"output={tmp}/out", *QUICK], tmp)
    assert run.rc == 0, run.stderr[-3000:]
    return run


def filter_stats(out: Path) -> dict[str, dict]:
    """Input file name -> its filter task's stats (one task per input)."""
    markers = sorted((out / "work/markers/filter").glob("*.json"))
    return {Path(m["input"]).name: m["stats"] for m in (json.loads(p.read_text()) for p in markers)}


def test_oversized_records_in_every_reader_are_skipped_counted_and_never_buffered(baseline, tmp_path):
    oversized_inputs(tmp_path / "in")
    run = glm(["data", "run", "-c", FINEWEB, f"input={tmp_path}/in", f"output={tmp_path}/out", *QUICK], tmp_path)
    assert run.rc == 0, run.stderr[-3000:]
    stats = filter_stats(tmp_path / "out")
    too_big = "record larger than 10 MB"
    for name in ("a-plain.jsonl", "b-packed.jsonl.gz"):
        read_stage = stats[name]["stages"]["read"]
        assert read_stage["dropped"] == {too_big: 1} and read_stage["kept"] == 2, (name, read_stage)
        assert read_stage["bytes_in"] > BIG and not stats[name]["input_errors"], (name, stats[name])
    record = stats["c-record.warc"]["stages"]["read"]
    assert record["dropped"] == {too_big: 1} and record["kept"] == 1 and not stats["c-record.warc"]["input_errors"]
    header = stats["d-header.warc"]
    assert header["stages"]["read"]["kept"] == 1 and header["input_errors"] == {"malformed WARC record": 1}
    example = header["input_error_examples"][0]
    assert example["detail"].startswith("WARC headers longer than 1048576 bytes") and example["offset"] > 0
    book = stats["e-book.txt"]["stages"]["read"]
    assert book["dropped"] == {too_big: 1} and book["kept"] == 0
    bomb = stats["f-bomb.jsonl.gz"]
    assert bomb["input_errors"] == {"decompression ratio above the limit": 1}, bomb
    example = bomb["input_error_examples"][0]
    assert "reader.max_decompression_ratio=100 " in example["detail"] and example["file"].endswith("f-bomb.jsonl.gz")
    inflated = int(example["detail"].split()[1])  # "DecompressionRatioError: N bytes inflated from ..."
    assert inflated < 64 << 20  # stopped within the first tens of MB of the 1 GiB
    card = json.loads((tmp_path / "out/stats.json").read_text())
    assert card["stages"]["read"]["dropped"] == {too_big: 4}
    assert run.peak_mb < baseline.peak_mb + MARGIN_MB, (run.peak_mb, baseline.peak_mb)


def test_tokenize_skips_and_counts_a_60mb_line_garbage_and_a_truncated_file_in_bounded_memory(tmp_path):
    def tokenize(source: str, out: str) -> Run:
        return glm(
            [
                "data",
                "tokenize",
                "-c",
                TOKENIZE,
                f"data.source={source}",
                f"data.shards_dir={out}",
                "data.vocab_size=300",
                "data.encode_workers=1",
            ],
            tmp_path,
        )

    normal = [f"{PROSE} number {i}" for i in range(20)]
    (tmp_path / "small").mkdir()
    (tmp_path / "small/docs.jsonl").write_bytes(jsonl(*normal))
    base = tokenize(f"{tmp_path}/small/*.jsonl*", f"{tmp_path}/base")
    assert base.rc == 0, base.stderr[-3000:]
    (tmp_path / "big").mkdir()
    with open(tmp_path / "big/docs.jsonl", "wb") as f:
        f.write(jsonl(*normal[:10]) + b'{"text": "')
        write_repeated(f, b"x" * (1 << 20), 60 << 20)
        f.write(b'"}\n{not json\n' + bytes(range(128, 256)) * 64 + b"\n" + jsonl(*normal[10:]))
    cut = gzip.compress(jsonl(*[f"{t} (compressed)" for t in normal]), mtime=0)
    (tmp_path / "big/cut.jsonl.gz").write_bytes(cut[: len(cut) * 2 // 3])
    run = tokenize(f"{tmp_path}/big/*.jsonl*", f"{tmp_path}/shards")
    assert run.rc == 0, run.stderr[-3000:]
    source = json.loads((tmp_path / "shards/manifest.json").read_text())["source"]
    assert source["skipped"] == {
        "record_too_large": 1,
        "bad_jsonl_record": 2,
        "truncated_or_corrupt_compressed_stream": 1,
    }, source
    assert 20 <= source["documents"] < 40  # every normal line, and the compressed ones before the cut
    assert run.peak_mb < base.peak_mb + MARGIN_MB, (run.peak_mb, base.peak_mb)


class SilentServer:
    """Accepts connections and never answers (what a wedged host looks like)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:  # closed
                return

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_silent_http_input_times_out_is_retried_and_counted(baseline, tmp_path):
    server = SilentServer()
    url = f"http://127.0.0.1:{server.port}/crawl.jsonl"
    timeout_s, retries = 0.5, 1
    try:
        run = glm(
            [
                "data",
                "run",
                "-c",
                FINEWEB,
                f"input={url}",
                f"output={tmp_path}/out",
                *QUICK,
                f"reader.http_connect_timeout_s={timeout_s}",
                f"reader.http_read_timeout_s={timeout_s}",
                f"reader.http_retries={retries}",
            ],
            tmp_path,
        )
    finally:
        server.close()
    assert run.rc == 0, run.stderr[-3000:]
    card = json.loads((tmp_path / "out/stats.json").read_text())
    assert card["input_errors"] == {"input unreadable": 1}
    example = card["input_error_examples"][0]
    assert example["file"] == url and "no answer in time" in example["detail"]
    assert "gave up after 2 attempt(s) (connect timeout 0.5 s, read timeout 0.5 s)" in example["detail"]
    assert "retry 1 of 1" in run.stderr
    # Each attempt waits at most twice the read timeout (fsspec asks HEAD, then GET), plus the backoff;
    # the slack absorbs a busy machine (the default timeouts would wait 2 x 60 s per attempt).
    budget = (retries + 1) * 2 * timeout_s + 1.0
    assert run.seconds < baseline.seconds + budget + 30, (run.seconds, baseline.seconds)


def test_an_unresolvable_input_host_stops_the_run_with_one_line(tmp_path):
    url = "http://nonexistent.invalid/x.jsonl"
    run = glm(["data", "run", "-c", FINEWEB, f"input={url}", f"output={tmp_path}/out", *QUICK], tmp_path)
    assert run.rc == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if url in line]
    assert len(lines) == 1 and lines[0].startswith(
        f"glm data run: error: input {url}: host 'nonexistent.invalid' does not resolve"
    ), run.stderr
    assert not (tmp_path / "out/documents").exists()


# -- in-process: fast unit tests of the same guards --------------------------------------------------
def test_a_zstd_bomb_ends_the_file_as_an_input_error(tmp_path):
    import zstandard

    path = tmp_path / "bomb.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(jsonl(PROSE) + bytes(BIG)))
    stats = Stats()
    docs = list(read(str(path), ReaderCfg(), stats))
    assert [d.text for d in docs] == [PROSE]
    assert stats.error_count == {"decompression ratio above the limit": 1}
    assert stats.errors[0]["offset"] == 2 and stats.errors[0]["file"] == str(path)


def test_an_http_read_that_stalls_once_is_retried_and_succeeds(tmp_path):
    import http.server

    body = jsonl(PROSE, PROSE + " two")
    gets = []

    class Stalls(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

        def do_GET(self) -> None:
            gets.append(self.headers.get("Range"))
            if len(gets) == 1:
                time.sleep(1.5)  # past the read timeout: the client gives up on this answer
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stalls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        stats = Stats()
        cfg = ReaderCfg(http_read_timeout_s=0.5, http_retries=2)
        docs = list(read(f"http://127.0.0.1:{server.server_port}/stall.jsonl", cfg, stats))
    finally:
        server.shutdown()
    assert [d.text for d in docs] == [PROSE, PROSE + " two"] and not stats.errors
    assert len(gets) == 2


def test_http_5xx_is_retried_then_reported_in_one_line():
    import http.server

    answers = []

    class Unavailable(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            answers.append(self.command)
            self.send_error(503)

        do_GET = do_HEAD

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/x.jsonl"
    try:
        with pytest.raises(RemoteReadError) as err:
            open_url(url, retries=1)
    finally:
        server.shutdown()
    assert str(err.value).startswith(f"{url}: HTTP 503 ") and "gave up after 2 attempt(s)" in str(err.value)
    assert answers == ["HEAD", "GET"] * 2  # fsspec asks HEAD then GET; each attempt once


def test_open_url_names_an_unresolvable_host_at_once_without_retrying():
    start = time.monotonic()
    with pytest.raises(RemoteReadError, match=r"^http://nonexistent\.invalid/x\.jsonl: the host does not resolve"):
        open_url("http://nonexistent.invalid/x.jsonl", retries=3)
    assert time.monotonic() - start < 1.0  # the first backoff alone would take 1 s


@pytest.mark.parametrize(
    "url",
    [
        "data/docs.jsonl",
        "/abs/path/x.warc.gz",
        "",
        "embedded",
        "./a:b.txt",
        "file:///tmp/x",
        "https://h.example/a.jsonl",
        "s3://bucket/k",
        "gs://b/k",
        "gcs://b/k",
        "hf://datasets/org/name/x.parquet",
        "memory://x",
        "simplecache::s3://bucket/k",
        "filecache::https://h.example/shard.tar",
    ],
)
def test_check_scheme_allows_paths_and_storage_urls(url):
    check_scheme(url, "data.source")


@pytest.mark.parametrize(
    "url,said",
    [
        ("pipe:cat x", "'pipe:' runs a shell command"),
        ("pipe:touch X;cat s", "'pipe:' runs a shell command"),
        ("simplecache::pipe:cat s", "'pipe:' runs a shell command"),
        ("PIPE:cat s", "'pipe:' runs a shell command"),
        ("ssh://host/x", "scheme 'ssh:' is not allowed"),
        ("reference::s3://b/k", "scheme 'reference:' is not allowed"),
        ("simplecache::ftp://h/x", "scheme 'ftp:' is not allowed"),
        ("simplecache://x", "scheme 'simplecache:'"),
    ],
)
def test_check_scheme_refuses_commands_and_other_protocols_in_one_line(url, said):
    with pytest.raises(ValueError) as err:
        check_scheme(url, "data.shards_dir")
    message = str(err.value)
    assert message.startswith(f"data.shards_dir={url!r}: ") and said in message and "\n" not in message
    if "pipe" in url.lower():
        assert "never commands" in message


PARQUET_CHILD = """
import json, sys
from data_pipeline.document import Stats
from data_pipeline.readers.jsonl import read_parquet
from data_pipeline.recipe import ReaderCfg
out = {}
for path in sys.argv[1:]:
    stats = Stats()
    docs = [d.id for d in read_parquet(path, ReaderCfg(max_record_mb=10, max_row_group_mb=64), stats)]
    out[path.rsplit("/", 1)[1]] = {"ids": docs, "dropped": dict(stats.stage("read").dropped),
                                   "errors": dict(stats.error_count)}
print(json.dumps(out))
"""


def test_parquet_rows_and_row_groups_are_bounded_from_the_metadata_before_decoding(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def table(texts):
        return pa.table({"text": texts, "id": [f"r{i}" for i in range(len(texts))]})

    big = base64.b64encode(os.urandom(12 << 20)).decode()  # 16 MiB of incompressible text per row
    rows = [PROSE, big, PROSE + " two", big + "x", PROSE + " three"]
    pq.write_table(table(rows), tmp_path / "rows.parquet", row_group_size=5)
    pq.write_table(table([PROSE] + [big + str(i) for i in range(8)]), tmp_path / "group.parquet")  # 128 MiB group
    pq.write_table(
        table(["a" * (20 << 20) + str(i) for i in range(10)]), tmp_path / "bomb.parquet", compression="zstd"
    )  # 200 MiB that zstd packs into kilobytes
    files = [str(tmp_path / f"{n}.parquet") for n in ("rows", "group", "bomb")]
    report = tmp_path / "rusage.json"  # the child's peak, measured by a small parent (not this big one)
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(report), sys.executable, "-c", PARQUET_CHILD, *files],
        capture_output=True,
        text=True,
        env=clean_env(threads=1),
        cwd=ROOT,
    )
    assert proc.returncode == 0 and json.loads(report.read_text())["rc"] == 0, proc.stderr[-3000:]
    out, peak_mb = json.loads(proc.stdout), json.loads(report.read_text())["mb"]
    assert out["rows.parquet"]["ids"] == ["r0", "r2", "r4"]  # ids of the kept rows are their own
    assert out["rows.parquet"]["dropped"] == {"record larger than 10 MB": 2}
    assert out["group.parquet"] == {"ids": [], "dropped": {"Parquet row group larger than 64 MB": 9}, "errors": {}}
    assert out["bomb.parquet"]["errors"] == {"decompression ratio above the limit": 1}, out["bomb.parquet"]
    assert peak_mb < 400, peak_mb  # 280 MB measured; decoding the 128 MiB group alone takes 700 MB
