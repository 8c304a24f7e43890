"""Data at cluster scale (docs/architecture.md, decision 12): shard index files, the global sample index,
byte-range reads of only a rank's own documents, and the determinism contract that survives them."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.loader_scaling import step_doc_bytes
from glm_dist.data.loader import Loader
from glm_dist.data.plan import BuiltPlan, SampleIndex, from_runs, unit_pieces
from glm_dist.data.shards import ShardSetError, read_manifest, read_shard
from glm_dist.objectives.plm import SegmentOptions
from tests.conftest import ROOT, clean_env, run_glm


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with HTTP Range support (as object stores do) and counts the bytes of .tar bodies."""

    counts: Counter  # set per server: "tar_bytes", "tar_requests"
    fail: dict  # file name -> requests still to answer with HTTP 503

    def send_head(self):
        name = self.path.rsplit("/", 1)[-1]
        if self.fail.get(name, 0) > 0:
            self.fail[name] -= 1
            self.send_error(503)
            return None
        found = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if not found:
            return super().send_head()
        path = self.translate_path(self.path)
        with contextlib.suppress(OSError), open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start, end = int(found[1]), min(int(found[2] or size - 1), size - 1)
            f.seek(start)
            body = f.read(end - start + 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if name.endswith(".tar"):
                self.counts["tar_bytes"] += len(body)
                self.counts["tar_requests"] += 1
            return io.BytesIO(body)
        self.send_error(404)
        return None

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(root: Path, fail: dict | None = None):
    """(URL of ``root`` over HTTP with ranges, its byte counters)."""
    counts: Counter = Counter()
    handler = type("Handler", (RangeHandler,), {"counts": counts, "fail": dict(fail or {})})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", counts
    finally:
        server.shutdown()


def shard_copy(src: str, dst: Path) -> str:
    """A copy of a shard set without its caches (their keys would still match)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".glm-index"))
    return str(dst)


def same_batches(a: list[dict], b: list[dict]) -> bool:
    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


# -- index files and the indexer ----------------------------------------------------------------------
def test_index_files_locate_every_documents_tokens_and_sentences(shards):
    d = shards("bert")
    for entry in read_manifest(d)["splits"]["train"][:3]:
        data = Path(d, entry["name"]).read_bytes()
        index = json.loads(Path(d, entry["index"]).read_text())
        assert hashlib.sha256(Path(d, entry["index"]).read_bytes()).hexdigest() == entry["index_sha256"]
        tokens = index["members"]["tokens.npy"]
        assert index["tar_bytes"] == len(data) and index["keys"] == [
            doc.key for doc in read_shard(f"{d}/{entry['name']}")
        ]
        for i, doc in enumerate(read_shard(f"{d}/{entry['name']}")):
            at = tokens["offset"][i] + tokens["header"][i]
            assert np.array_equal(np.frombuffer(data[at : at + doc.tokens.nbytes], dtype=index["dtype"]), doc.tokens)
            assert index["sentence_lengths"][i] == np.diff(np.append(doc.sentences, len(doc.tokens))).tolist()


def test_glm_data_index_gives_an_old_shard_set_the_same_index_files(shards, tmp_path):
    new = shards("gpt2")
    old = shard_copy(new, tmp_path / "old")
    manifest = read_manifest(old)
    for split in manifest["splits"].values():
        for entry in split:
            Path(old, entry.pop("index")).unlink()
            entry.pop("index_sha256")
    manifest.pop("index_format")
    Path(old, "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardSetError, match=f"run glm data index {old}"):
        Loader(old, seq_len=32, micro_batch_size=2).next_step()
    victim = manifest["splits"]["train"][2]["name"]
    Path(old, victim).write_bytes(b"not a tar file" * 100)
    proc = run_glm(["data", "index", old, "--workers", "2"], check=False)
    assert json.loads(proc.stdout)["failed"].keys() == {victim}
    assert proc.returncode == 2 and proc.stderr.strip().endswith(
        "training skips them; rebuild them with glm data tokenize"
    )
    for entry in read_manifest(new)["splits"]["train"]:
        if entry["name"] != victim:  # byte-identical to what the writer wrote
            assert Path(old, entry["index"]).read_bytes() == Path(new, entry["index"]).read_bytes()
    tables = sorted(p.name.split("-")[0] for p in Path(old, ".glm-index").iterdir())
    assert tables == ["train", "validation"]  # the document tables too: a training start parses no index file
    ld = Loader(old, seq_len=32, micro_batch_size=2)
    ld.next_step()
    assert [k for k in ld.skipped if victim in k] == [f"unreadable_shard:{old}/{victim}"]


# -- the sample index ---------------------------------------------------------------------------------
@pytest.mark.parametrize("objective, profile", [("clm", "gpt2"), ("span_corruption", "t5")])
def test_the_closed_form_plan_is_the_token_packers_rule(objective, profile, shards):
    ld = Loader(shards(profile), objective=objective, seq_len=128, micro_batch_size=2, seed=3, shuffle_window=2)
    packed = ld._setup().plan
    built = BuiltPlan(ld.order, ld._builders, lambda e: None, seed=3, shuffle=True)
    for epoch in range(2):  # the unit that straddles the two is the first of epoch 1
        assert packed.start(epoch) == built.start(epoch)
        for i in range(packed.start(epoch + 1) - packed.start(epoch)):
            a, b = packed.unit(epoch, i), built.unit(epoch, i)
            assert np.array_equal(from_runs(a.leaves[0]), from_runs(b.leaves[0])), (epoch, i)


def test_a_global_batch_is_the_same_at_any_data_parallel_size_and_each_rank_reads_its_share(shards):
    d = shards("gpt2")
    kw = dict(objective="clm", seq_len=64, micro_batch_size=2, seed=1)
    one = Loader(d, grad_accum_steps=8, **kw)
    eight = [Loader(d, grad_accum_steps=1, dp_rank=r, dp_size=8, **kw) for r in range(8)]
    step_bytes = 0
    for _ in range(4):
        step_bytes += step_doc_bytes(one)
        whole = torch.cat([b["input_ids"] for b in one.next_step()])
        assert torch.equal(torch.cat([ld.next_step()[0]["input_ids"] for ld in eight]), whole)
    for ld in eight:  # the reads happen at the read layer: only this rank's pieces, plus rounding
        assert 0 < ld.read_stats.bytes <= 1.1 * step_bytes / 8, (ld.read_stats, step_bytes)
    assert sum(ld.read_stats.bytes for ld in eight) <= 1.02 * one.read_stats.bytes


@pytest.mark.parametrize("objective, profile", [("clm", "gpt2"), ("mlm", "roberta")])
@pytest.mark.parametrize("micro_after", [2, 3])  # the same global batch of 6, and one of 9
def test_a_run_resumed_from_two_ranks_on_three_sees_each_sample_of_the_epoch_once(
    objective, profile, micro_after, shards
):
    d = shards(profile)
    kw = dict(objective=objective, seq_len=256, grad_accum_steps=1, seed=4)
    two = [Loader(d, micro_batch_size=3, dp_rank=r, dp_size=2, **kw) for r in range(2)]
    seen = []
    for _ in range(7):
        for ld in two:
            ld.next_step()
            seen += ld.last_samples
    three = [Loader(d, micro_batch_size=micro_after, dp_rank=r, dp_size=3, **kw) for r in range(3)]
    for ld in three:
        ld.load_state_dict(json.loads(json.dumps(two[1].state_dict())))
    while three[0].epoch == 0:
        for ld in three:
            ld.next_step()
            seen += ld.last_samples
    epoch0 = sorted(unit for sample, epoch, unit in seen if epoch == 0)
    ids = [sample for sample, _, _ in seen]
    assert len(ids) == len(set(ids)) and sorted(ids) == list(range(len(ids)))  # no gap, no repeat
    count = three[0]._index.plan.start(1)
    assert epoch0 == list(range(count)) and count > 30  # every unit of the epoch exactly once


def test_a_global_batch_draws_from_many_shards(shards):
    d = shards("gpt2")
    ld = Loader(d, seq_len=64, micro_batch_size=32, seed=2, shuffle_window=1)
    plan, table = ld._setup().plan, ld.order.table
    shares = {}
    for name, index in (("packing order", SampleIndex(plan, seed=2, shuffle=False)), ("shuffled", ld._index)):
        batches = [[unit_pieces(index.locate(32 * s + r).unit)[0, 0] for r in range(32)] for s in range(10)]
        shares[name] = np.mean([np.bincount(table.shard_of(np.asarray(b))).max() / 32 for b in batches])
    assert shares["packing order"] > 0.9 and shares["shuffled"] < 0.4, shares  # measured 1.0 and ~0.2


def test_xlnet_streams_continue_their_rows_and_get_new_regions_each_epoch(shards):
    d = shards("xlnet")
    kw = dict(objective="plm", seq_len=32, grad_accum_steps=1, seed=6, streams=True)
    two = [Loader(d, micro_batch_size=4, dp_rank=r, dp_size=2, **kw) for r in range(2)]
    four = [Loader(d, micro_batch_size=2, dp_rank=r, dp_size=4, **kw) for r in range(4)]
    eot = two[0].vocab.id("eot")
    previous = None
    for _ in range(12):
        rows = [from_runs(ld.locate(row).unit.leaves[0]) for ld in two[:1] for row in range(8)]
        assert all(np.array_equal(a, from_runs(four[0].locate(row).unit.leaves[0])) for row, a in enumerate(rows))
        if previous is not None:  # each row goes on where it stopped: the next token, or a new document
            for before, after in zip(previous, rows):
                assert after[0] == before[-1] + 1 or eot in (before[-1], after[0]), (before[-3:], after[:3])
        previous = rows
        for ld in two + four:
            ld.next_step(build=False)
    plan = two[0]._index.plan
    assert not np.array_equal(plan.region_order(0), plan.region_order(1))


# -- the plan cache ---------------------------------------------------------------------------------------
PLANNED = [
    ("mlm_nsp", "bert", {}),
    ("sop", "bert", {}),
    ("denoising", "roberta", {}),
    ("plm", "xlnet", {"streams": True, "seq_len": 128, "options": SegmentOptions(plm_layout="paper", reuse_len=64)}),
    ("bilm", "word", {}),
]


@pytest.mark.parametrize("objective, profile, extra", PLANNED, ids=[p[0] for p in PLANNED])
def test_every_planned_objectives_epochs_are_read_from_the_cache_at_the_next_start(
    objective, profile, extra, shards, tmp_path, monkeypatch, caplog
):
    """NSP/SOP pairs (dict units), BART's spans, XLNet's paper streams and ELMo's windows: the second
    loader runs no builder and yields the same batches; a damaged cache is ignored with a warning."""
    d = shard_copy(shards(profile), tmp_path / "shards")
    manifest = json.loads(Path(d, "manifest.json").read_text())
    manifest["splits"]["train"] = manifest["splits"]["train"][:1]  # ~45 documents: planned in a second
    Path(d, "manifest.json").write_text(json.dumps(manifest))
    kw = dict(objective=objective, seq_len=64, micro_batch_size=4, seed=5) | extra
    first = Loader(d, **kw)
    steps = [first.next_step() for _ in range(3)]
    (record,) = Path(d, ".glm-index", "plans").rglob("epoch-0.json")

    def planned_again(*args):
        raise AssertionError("the builder ran: the cached plan was not used")

    with monkeypatch.context() as m:
        m.setattr(BuiltPlan, "_run", planned_again)
        second = Loader(d, **kw)
        assert all(same_batches(a, second.next_step()) for a in steps)
    npz = record.with_suffix(".npz")
    data = bytearray(npz.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte changed
    npz.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="glm_dist.data.plan_cache"):
        third = Loader(d, **kw)
        assert same_batches(steps[0], third.next_step())
    assert "ignoring the cached plan of epoch 0" in caplog.text and "SHA-256" in caplog.text
    with monkeypatch.context() as m:  # planned again and cached again
        m.setattr(BuiltPlan, "_run", planned_again)
        assert same_batches(steps[0], Loader(d, **kw).next_step())


def test_a_cached_epoch_keeps_units_of_several_shapes_and_their_shared_tables(shards, tmp_path):
    from glm_dist.data.plan import encode
    from glm_dist.data.plan_cache import PlanCache

    docs = [
        doc.tokens.astype(np.int64)
        for doc in read_shard(f"{shards('bert')}/{read_manifest(shards('bert'))['splits']['train'][0]['name']}")
    ]
    table = np.stack([docs[0][:8], docs[1][:8]])  # a (2, 8) table shared by units, as plan.consts holds
    consts: list = []
    shapes = [
        lambda a, b: (a, b),
        lambda a, b: {"tokens": a, "label": bool(len(b) % 2), "n": len(a)},
        lambda a, b: a,
        lambda a, b: (a, table, None),
    ]
    streams = [[encode(shapes[i // 2 % 4](docs[i], docs[i + 1]), consts) for i in range(s, 40, 2)] for s in range(2)]
    assert len({u.tree for stream in streams for u in stream}) == 4 and len(consts) == 1
    cache = PlanCache(str(tmp_path / "plan"))
    cache.save(0, streams, [{"tail": [1, 2]}, {}], consts)
    running = [np.zeros(3), table.copy()]  # a later process: its own tables, one equal to the saved one
    units, ends = cache.load(0, running)
    assert ends == [{"tail": [1, 2]}, {}] and len(running) == 2
    for got, want in zip(units, streams):
        assert [u.tree for u in got] == [_renumbered(u.tree) for u in want]
        assert all(
            len(a.leaves) == len(b.leaves) and all(np.array_equal(x, y) for x, y in zip(a.leaves, b.leaves))
            for a, b in zip(got, want)
        )


def _renumbered(tree):
    """Shared table 0 of the saving process is table 1 of the loading one."""
    return tuple(_renumbered(t) if isinstance(t, tuple) else t for t in tree) if tree != ("c", 0) else ("c", 1)


# -- reading -----------------------------------------------------------------------------------------------
def test_a_middle_pipeline_stage_reads_nothing_yet_gets_the_batch_shapes(shards):
    d = shards("roberta")
    kw = dict(objective="mlm", seq_len=64, micro_batch_size=4, seed=3)
    reading, idle = Loader(d, **kw), Loader(d, reads=False, **kw)
    for a, b in zip(reading.next_step(), idle.next_step()):
        assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
    assert idle.read_stats.bytes == 0 < reading.read_stats.bytes


def test_http_range_reads_are_what_the_server_sends_and_a_node_cache_serves_them_again(shards, tmp_path):
    local = shards("gpt2")
    kw = dict(objective="clm", seq_len=64, micro_batch_size=4, seed=9, read_gap_bytes=0)
    expected = [Loader(local, **kw).next_step() for _ in range(1)]
    with serve(Path(local)) as (url, counts):
        remote = Loader(url, **kw)
        got = [remote.next_step()]
        assert same_batches(got[0], expected[0])
        assert counts["tar_bytes"] == remote.read_stats.bytes and counts["tar_requests"] == remote.read_stats.requests
        cached = [Loader(url, cache_dir=str(tmp_path / "cache"), **kw) for _ in range(2)]
        first = cached[0].next_step()
        served = counts["tar_bytes"]
        second = cached[1].next_step()
        assert counts["tar_bytes"] == served and same_batches(first, expected[0]) and same_batches(second, first)


def test_failing_range_reads_are_retried_then_skipped_and_counted_with_every_batch_kept(shards):
    local = shards("gpt2")
    entries = read_manifest(local)["splits"]["train"]
    kw = dict(objective="clm", seq_len=64, micro_batch_size=16, seed=9, read_backoff_s=0.01)
    expected = Loader(local, **kw).next_step()
    flaky, dead = entries[0]["name"], entries[1]["name"]
    with serve(Path(local), fail={flaky: 2, dead: 10**6}) as (url, _):
        ld = Loader(url, **kw)
        got = ld.next_step()
    assert [tuple(v.shape) for v in got[0].values()] == [tuple(v.shape) for v in expected[0].values()]
    skipped = {k: n for k, n in ld.skipped.items() if n}
    assert list(skipped) == [f"unreadable_document:{url}/{dead}"] and skipped[f"unreadable_document:{url}/{dead}"] > 0
    differ = (got[0]["input_ids"] != expected[0]["input_ids"]).any(1)
    assert 0 < int(differ.sum()) < 16  # the rows with the dead shard's documents, padded; the flaky one was read
    assert (got[0]["input_ids"][differ] == ld.pad_id).any(1).all()


@pytest.mark.slow
def test_documents_no_rank_could_read_are_summed_over_ranks_into_the_run_log(shards_dir, tmp_path):
    """DP = 2 over HTTP with one train shard gone after indexing: each rank pads the documents it
    could not read, and the run's ``data`` rows add both ranks' counts (dataloader workers included)."""
    from tests.conftest import FAST

    local = shard_copy(shards_dir, tmp_path / "shards")
    dead = read_manifest(local)["splits"]["train"][1]["name"]
    with serve(Path(local), fail={dead: 10**6}) as (url, counts):
        proc = run_glm(
            [
                "train",
                "-c",
                str(ROOT / "configs/experiments/gpt2-tiny-cpu.yaml"),
                *FAST,
                f"data.shards_dir={url}",
                f"train.out_dir={tmp_path / 'run'}",
                "train.max_steps=3",
                "train.grad_accum_steps=4",
                "data.read_backoff_s=0.01",
                "data.read_retries=1",
                "data.num_workers=1",
            ],
            nproc=2,
        )
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    data = [r for r in rows if r["kind"] == "data"]
    assert [r["step"] for r in data] == [0, 3] and data[0]["skipped_documents"] == 0
    assert data[-1]["skipped_documents"] > 0  # (validation reads its own shards: not in the counts)
    assert 0 < data[-1]["bytes_read"] < counts["tar_bytes"] and data[-1]["read_requests"] > 0
    assert "document read(s) failed after retries on all ranks" in proc.stderr


def test_torchrun_ranks_read_at_most_their_share_of_the_documents(shards, tmp_path):
    d = shards("gpt2")
    for nproc in (2, 4):
        out = tmp_path / f"dp{nproc}"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            str(ROOT / "bench/loader_scaling.py"),
            "--worker",
            d,
            "--out",
            str(out),
            "--steps",
            "4",
        ]
        proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nproc)]
        for r in ranks:  # the global batch's document bytes / DP, + 10%, + what planning reads
            assert 0 < r["bytes"] <= 1.1 * r["doc_bytes"] / nproc + r["index_bytes"], r
            assert r["bytes"] <= 1.1 * r["doc_bytes"] / nproc, r  # (the index is read from the table's cache)
        samples = sorted(s[0] for r in ranks for s in r["samples"])
        assert samples == list(range(samples[0], samples[-1] + 1))  # the ranks' rows partition the global batches
