"""Tokenizer profiles, resumable parallel shard writing, remote shards, every objective's resume."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from data_pipeline.tokenize.prepare import prepare_shards
from data_pipeline.tokenize.profiles import PROFILES
from glm_dist.data.loader import Loader
from glm_dist.data.shards import read_manifest, read_shard
from glm_dist.objectives.registry import OBJECTIVES

TEXT = "Return the number of items in a container. Hello, World!"
PROFILE_FOR = {
    "clm": "gpt2",
    "mlm": "roberta",
    "mlm_nsp": "bert",
    "sop": "albert",
    "span_corruption": "t5",
    "denoising": "roberta",
    "electra": "bert",
    "plm": "xlnet",
    "bilm": "word",
}  # glove: tests/test_glove.py


@pytest.mark.parametrize("profile", list(PROFILES))
def test_tokenizer_profile_loads_in_transformers_with_its_special_tokens(profile, shards, tmp_path):
    from transformers import PreTrainedTokenizerFast

    d = shards(profile)
    manifest = read_manifest(d)
    tok = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json")
    ids = manifest["tokenizer"]["special_ids"]
    for role, token in PROFILES[profile].roles.items():
        assert tok.convert_tokens_to_ids(token) == ids[role], (role, token)
    assert ids["all_specials"][: len(PROFILES[profile].specials)] == list(range(len(PROFILES[profile].specials)))
    plain = tok(TEXT, add_special_tokens=False).input_ids
    if PROFILES[profile].kind == "wordlevel":  # lower-cased words; a word outside the vocabulary is <unk>
        from data_pipeline.tokenize.word import split_words

        vocab = tok.get_vocab()
        expected = " ".join(w if w in vocab else "<unk>" for w in split_words(TEXT))
        assert "<unk>" in expected and "number" in expected  # both cases occur in TEXT
    else:
        expected = TEXT.lower() if PROFILES[profile].kind == "wordpiece" else TEXT
    assert tok.decode(plain) == expected
    if profile == "t5":
        assert len(ids["sentinels"]) == 100 and ids["sentinels"][0] == manifest["tokenizer"]["vocab_size"] - 1
        assert tok.convert_ids_to_tokens(ids["sentinels"][:2]) == ["<extra_id_0>", "<extra_id_1>"]
    framed = tok(TEXT, "Second one.").input_ids  # the family's pair template
    if profile in ("bert", "albert"):
        assert framed[0] == ids["cls"] and framed.count(ids["sep"]) == 2
    if profile == "roberta":
        assert framed[0] == ids["bos"] and framed.count(ids["eos"]) == 3
    if profile == "xlnet":
        assert framed[-1] == ids["cls"]


def test_shards_hold_documents_with_sentence_starts_and_counts(shards):
    d = shards("bert")
    manifest = read_manifest(d)
    total = 0
    for split in ("train", "validation"):
        for info in manifest["splits"][split]:
            docs = read_shard(f"{d}/{info['name']}")
            assert len(docs) == info["num_samples"] and sum(len(x.tokens) for x in docs) == info["num_tokens"]
            for doc in docs:
                assert doc.sentences[0] == 0 and np.all(np.diff(doc.sentences) > 0)
                assert doc.sentences[-1] < max(len(doc.tokens), 1)
            total += len(docs)
    assert total == manifest["source"]["documents"] == 500
    assert sum(len(read_shard(f"{d}/{s['name']}")[0].sentences) for s in manifest["splits"]["train"]) > 20


def test_interrupted_encoding_resumes_to_byte_identical_shards(corpus, tmp_path):
    kw = dict(source=corpus, profile="gpt2", vocab_size=1000, shard_max_bytes=64 * 1024)
    # Split the corpus in 3 files so there are 3 tasks.
    lines = Path(corpus).read_bytes()
    import gzip

    docs = gzip.decompress(lines).decode().splitlines()
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"part-{i}.jsonl").write_text("\n".join(docs[i::3]) + "\n")
    kw["source"] = str(src / "part-*.jsonl")
    straight = prepare_shards(out_dir=str(tmp_path / "a"), workers=2, **kw)
    assert prepare_shards(out_dir=str(tmp_path / "b"), task=1, **kw) is None  # one array task, no manifest yet
    assert not (tmp_path / "b/manifest.json").exists() and (tmp_path / "b/.tasks/00001.json").exists()
    (tmp_path / "b/train-00000-0000.tar.tmp").write_bytes(b"debris of a killed task")
    resumed = prepare_shards(out_dir=str(tmp_path / "b"), workers=1, **kw)
    assert resumed["splits"] == straight["splits"]
    for info in straight["splits"]["train"] + straight["splits"]["validation"]:
        assert filecmp.cmp(tmp_path / "a" / info["name"], tmp_path / "b" / info["name"], shallow=False)


@pytest.mark.parametrize("objective", [o for o in OBJECTIVES if o in PROFILE_FOR])
def test_every_objective_resumes_exactly(objective, shards):
    d = shards(PROFILE_FOR[objective])
    kw = dict(objective=objective, seq_len=64, micro_batch_size=4, grad_accum_steps=2, seed=5)
    straight = Loader(d, **kw)
    expected = [straight.next_step() for _ in range(6)]
    first = Loader(d, **kw)
    for _ in range(2):
        first.next_step()
    resumed = Loader(d, **kw)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for want in expected[2:]:
        got = resumed.next_step()
        for g, w in zip(got, want):
            assert g.keys() == w.keys()
            assert all(torch.equal(g[k], w[k]) for k in g), objective


def test_uneven_shards_give_every_rank_the_same_batches_and_shapes(corpus, tmp_path):
    import gzip

    docs = gzip.decompress(Path(corpus).read_bytes()).decode().splitlines()
    for i, (a, b) in enumerate([(0, 300), (300, 330), (330, 500)]):  # 300, 30 and 170 documents
        (tmp_path / f"part-{i}.jsonl").write_text("\n".join(docs[a:b]) + "\n")
    d = str(tmp_path / "shards")
    prepare_shards(source=f"{tmp_path}/part-*.jsonl", out_dir=d, profile="roberta", vocab_size=2000, workers=1)
    sizes = [s["num_samples"] for s in read_manifest(d)["splits"]["train"]]
    assert len(sizes) == 3 and max(sizes) > 5 * min(sizes)
    ranks = [Loader(d, objective="mlm", seq_len=64, micro_batch_size=3, dp_rank=r, dp_size=3, seed=2) for r in range(3)]
    for _ in range(40):  # past the end of the epoch
        shapes = {tuple(ld.next_step()[0]["input_ids"].shape) for ld in ranks}
        assert shapes == {(3, 64)}
    assert {ld.epoch for ld in ranks} == {ranks[0].epoch}


@pytest.fixture
def http_server(shards):
    from tests.test_loader_scale import serve

    root = Path(shards("gpt2"))
    with serve(root) as (url, _):
        yield url, str(root)


def test_remote_shards_over_http_give_the_same_samples_as_local(http_server):
    url, local = http_server
    kw = dict(objective="clm", seq_len=64, micro_batch_size=4, seed=9)
    remote, here = Loader(url, **kw), Loader(local, **kw)
    for _ in range(5):
        assert torch.equal(remote.next_step()[0]["input_ids"], here.next_step()[0]["input_ids"])


def test_worker_processes_deliver_the_same_batches_and_resume_exactly(shards):
    from glm_dist.data.workers import WorkerLoader

    d = shards("roberta")
    kw = dict(objective="mlm", seq_len=64, micro_batch_size=4, grad_accum_steps=2, seed=4)
    plain, workers = Loader(d, **kw), WorkerLoader(d, num_workers=2, **kw)
    for _ in range(5):
        for a, b in zip(plain.next_step(), workers.next_step()):
            assert all(torch.equal(a[k], b[k]) for k in a)
    resumed = WorkerLoader(d, num_workers=2, **kw)
    resumed.load_state_dict(json.loads(json.dumps(workers.state_dict())))
    for _ in range(3):
        for a, b in zip(plain.next_step(), resumed.next_step()):
            assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_shard_and_its_index_reach_the_disk_before_the_renames_that_publish_them(tmp_path, monkeypatch):
    """A power loss after a rename must never leave a published name over unwritten data: each file
    is fsync'ed before its rename, and its folder after it."""
    import os

    from data_pipeline.writers import shards as writer_module
    from glm_common import durable, storage

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("fsync", os.path.basename(target)))
        return real_fsync(fd)

    def replace(tmp, path):
        events.append(("rename", os.path.basename(path)))
        return real_replace(tmp, path)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(storage.os, "replace", replace)
    w = writer_module.ShardSetWriter(str(tmp_path), "train", max_bytes=1 << 20)
    w.write("doc0", np.arange(50, dtype=np.uint16), {"id": 0})
    w.close()
    writer_module.write_manifest(str(tmp_path), {"shards": ["train-0000.tar"]})
    for name in ("train-0000.tar", "train-0000.idx.json", "manifest.json"):
        published = events.index(("rename", name))
        assert ("fsync", f"{name}.tmp.{os.getpid()}") in events[:published], (name, events)
        assert events[published + 1] == ("fsync", tmp_path.name), (name, events)  # the folder, after the rename
    assert (tmp_path / "train-0000.tar").stat().st_size > 0 and not list(tmp_path.glob("*.tmp*"))
