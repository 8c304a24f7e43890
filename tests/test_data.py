"""Token shards and the CLM loader: determinism, exact and elastic resume, bad input."""

from __future__ import annotations

import gzip
import itertools
import json
import shutil

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from data_pipeline.tokenize.vocab_tables import token_byte_lengths
from data_pipeline.tokenize.prepare import prepare_shards, read_documents
from glm_dist.data.loader import Loader, validation_batches
from glm_dist.data.shards import ShardSetError, read_manifest, read_shard


def loader(shards_dir, **kw):
    args = dict(seq_len=32, micro_batch_size=2, grad_accum_steps=2, seed=7)
    args.update(kw)
    return Loader(shards_dir, **args)


def steps(ld, n):
    return [[b["input_ids"].clone() for b in ld.next_step()] for _ in range(n)]


def test_manifest_counts_match_the_shards(shards_dir):
    manifest = read_manifest(shards_dir)
    assert len(manifest["splits"]["train"]) > 3 and manifest["splits"]["validation"]
    for split in ("train", "validation"):
        for info in manifest["splits"][split]:
            docs = read_shard(f"{shards_dir}/{info['name']}")
            assert len(docs) == info["num_samples"]
            assert sum(len(d.tokens) for d in docs) == info["num_tokens"]
    tok = Tokenizer.from_file(f"{shards_dir}/tokenizer.json")
    assert manifest["tokenizer"]["eot_id"] == tok.token_to_id("<|endoftext|>")


def test_tokenizer_round_trips_text_and_counts_bytes(shards_dir):
    tok = Tokenizer.from_file(f"{shards_dir}/tokenizer.json")
    text = "Return the number of items in a container.\n    café — naïve ✓"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    lengths = token_byte_lengths(tok)
    assert sum(lengths[i] for i in ids) == len(text.encode())
    assert lengths[tok.token_to_id("<|endoftext|>")] == 0


def test_blocks_are_documents_joined_by_end_of_text(shards_dir):
    ld = loader(shards_dir, shuffle=False, grad_accum_steps=1)
    eot = read_manifest(shards_dir)["tokenizer"]["eot_id"]
    first_doc = read_shard(f"{shards_dir}/{read_manifest(shards_dir)['splits']['train'][0]['name']}")[0][1]
    stream = np.concatenate([first_doc, [eot]])
    batch = ld.next_step()[0]
    flat = torch.cat([batch["input_ids"][0], batch["labels"][0][-1:]]).numpy()
    n = min(len(flat), len(stream))
    assert (flat[:n] == stream[:n]).all()
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])  # labels are inputs shifted


def test_same_seed_same_batches_other_seed_other_order(shards_dir):
    a, b, c = steps(loader(shards_dir), 3), steps(loader(shards_dir), 3), steps(loader(shards_dir, seed=8), 3)
    assert all(torch.equal(x, y) for sa, sb in zip(a, b) for x, y in zip(sa, sb))
    assert not torch.equal(a[0][0], c[0][0])


def test_epochs_reshuffle_document_order(shards_dir):
    order = loader(shards_dir).order
    assert not np.array_equal(order.shard_order(0), order.shard_order(1))
    assert not np.array_equal(order.doc_order(0, (0,), 50), order.doc_order(1, (0,), 50))


def test_shuffle_window_mixes_documents_of_several_shards(shards_dir):
    order = loader(shards_dir, shuffle_window=4).order
    window = order.windows(0)[0]
    assert len(window) == 4
    drawn = set(order.table.shard_of(np.asarray(list(itertools.islice(order.docs(0), 40)))).tolist())
    assert len(drawn) > 1 and drawn <= set(window)  # the first 40 documents come from several of its shards


def test_exact_resume_replays_the_same_batches(shards_dir):
    straight = steps(loader(shards_dir), 8)
    first = loader(shards_dir)
    head = steps(first, 3)
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
    resumed = loader(shards_dir)
    resumed.load_state_dict(state)
    tail = steps(resumed, 5)
    for got, want in zip(head + tail, straight):
        assert all(torch.equal(x, y) for x, y in zip(got, want))


def test_resume_across_an_epoch_boundary(shards_dir):
    kw = dict(seq_len=256, micro_batch_size=50, grad_accum_steps=8)  # 102,400 tokens a step
    train_tokens = sum(s["num_tokens"] + s["num_samples"] for s in read_manifest(shards_dir)["splits"]["train"])
    epoch_steps = -(-train_tokens // (400 * 256))
    straight = steps(loader(shards_dir, **kw), epoch_steps + 2)
    first = loader(shards_dir, **kw)
    steps(first, epoch_steps - 1)
    assert first.epoch == 0
    resumed = loader(shards_dir, **kw)
    resumed.load_state_dict(first.state_dict())
    tail = steps(resumed, 3)
    assert resumed.epoch == 1
    for got, want in zip(tail, straight[epoch_steps - 1 :]):
        assert all(torch.equal(x, y) for x, y in zip(got, want))


def test_rank_slices_partition_the_global_batch_at_any_data_parallel_size(shards_dir):
    one = loader(shards_dir, grad_accum_steps=4)
    two = [loader(shards_dir, grad_accum_steps=2, dp_rank=r, dp_size=2) for r in range(2)]
    for _ in range(3):
        whole = torch.cat([b["input_ids"] for b in one.next_step()])
        parts = [ld.next_step() for ld in two]
        union = torch.cat([parts[r][m]["input_ids"] for m in range(2) for r in range(2)])
        assert torch.equal(union, whole)


def test_elastic_resume_from_two_ranks_to_three_continues_the_global_order(shards_dir):
    reference = loader(shards_dir, grad_accum_steps=1, micro_batch_size=6)  # global batch 6
    ref_steps = [reference.next_step()[0]["input_ids"] for _ in range(5)]
    two = [loader(shards_dir, grad_accum_steps=1, micro_batch_size=3, dp_rank=r, dp_size=2) for r in range(2)]
    got = []
    for _ in range(2):
        got.append(torch.cat([ld.next_step()[0]["input_ids"] for ld in two]))
    state = two[0].state_dict()
    three = [loader(shards_dir, grad_accum_steps=1, micro_batch_size=2, dp_rank=r, dp_size=3) for r in range(3)]
    for ld in three:
        ld.load_state_dict(state)
    for _ in range(3):
        got.append(torch.cat([ld.next_step()[0]["input_ids"] for ld in three]))
    for g, r in zip(got, ref_steps):
        assert torch.equal(g, r)


def test_validation_batches_give_every_rank_the_same_count(shards_dir):
    per_rank = [
        validation_batches(shards_dir, seq_len=32, micro_batch_size=2, num_batches=5, dp_rank=r, dp_size=3)
        for r in range(3)
    ]
    assert {len(p) for p in per_rank} == {2}
    assert sum(w for p in per_rank for _, w in p) == 5


def test_corrupt_shard_is_skipped_counted_and_named(shards_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(shards_dir, broken)
    info = read_manifest(str(broken))["splits"]["train"][1]
    victim = info["name"]
    data = (broken / victim).read_bytes()
    (broken / victim).write_bytes(data[: len(data) // 3] + b"\x00garbage" * 50)
    with pytest.raises(OSError, match=victim):
        read_shard(str(broken / victim), expected=info["num_samples"])
    # every rank sees the shard's size differ from its index before it plans: all skip it alike
    ranks = [loader(str(broken), seq_len=256, micro_batch_size=50, dp_rank=r, dp_size=2) for r in range(2)]
    for ld in ranks:
        ld.next_step()
        assert [reason for reason in ld.skipped if victim in reason] == [f"unreadable_shard:{broken / victim}"]
    assert (
        ranks[0].order.num_docs
        == ranks[1].order.num_docs
        == sum(s["num_samples"] for s in read_manifest(str(broken))["splits"]["train"]) - info["num_samples"]
    )


def test_missing_manifest_says_how_to_build_it(tmp_path):
    with pytest.raises(ShardSetError, match="manifest.json not found: build the shards first"):
        loader(str(tmp_path))


def test_bad_jsonl_records_are_skipped_and_counted(tmp_path):
    src = tmp_path / "docs.jsonl.gz"
    lines = [json.dumps({"text": f"document number {i} " * 20}) for i in range(30)]
    lines[3] = "{not json"
    lines[7] = json.dumps({"body": "no text field"})
    lines[9] = json.dumps({"text": 42})
    with gzip.open(src, "wt") as f:
        f.write("\n".join(lines) + "\n")
    out = tmp_path / "shards"
    manifest = prepare_shards(source=str(src), out_dir=str(out), vocab_size=300, val_per_mille=100)
    assert manifest["source"]["skipped"] == {"bad_jsonl_record": 3}
    assert manifest["source"]["documents"] == 27
    assert sum(s["num_samples"] for split in manifest["splits"].values() for s in split) == 27
    with pytest.raises(FileNotFoundError, match="matches no file"):
        list(read_documents(str(tmp_path / "nothing-*.jsonl")))


def test_the_embedded_corpus_is_the_same_from_any_checkout(tmp_path):
    """Rendered in a clean environment: no page carries the checkout's path (cgi's default arguments
    print os.environ), so a clone at another path trains on the same documents."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    script = (
        "import hashlib, json; from data_pipeline.embedded import embedded_documents; "
        "print(hashlib.sha256(''.join(json.dumps(d) for d in embedded_documents()).encode()).hexdigest())"
    )
    copy = tmp_path / "elsewhere"
    shutil.copytree(ROOT / "data_pipeline", copy / "data_pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "glm_common", copy / "glm_common", ignore=shutil.ignore_patterns("__pycache__"))
    digests = [
        subprocess.run(
            [sys.executable, "-c", script], cwd=where, capture_output=True, text=True, check=True
        ).stdout.strip()
        for where in (ROOT, copy)
    ]
    assert digests[0] == digests[1] and len(digests[0]) == 64


def _split_ids(out) -> dict[str, set[str]]:
    """split -> the ids in the shards' member metadata."""
    import tarfile

    ids: dict[str, set[str]] = {}
    for split, shards in read_manifest(str(out))["splits"].items():
        for shard in shards:
            with tarfile.open(out / shard["name"]) as tar:
                ids.setdefault(split, set()).update(
                    json.loads(tar.extractfile(m).read())["id"] for m in tar if m.name.endswith(".json")
                )
    return ids


def test_the_split_is_the_same_wherever_the_corpus_lies_and_follows_a_records_own_id(tmp_path):
    records = [{"text": f"document number {i} " * 20} | ({"id": f"doc-{i}"} if i % 2 else {}) for i in range(60)]
    splits = []
    for where in (tmp_path / "a", tmp_path / "b/deeper/place"):
        (where / "part").mkdir(parents=True)
        with gzip.open(where / "part/docs.jsonl.gz", "wt") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
        prepare_shards(
            source=str(where / "*/docs.jsonl.gz"), out_dir=str(where / "shards"), vocab_size=300, val_per_mille=300
        )
        splits.append(_split_ids(where / "shards"))
    assert splits[0] == splits[1] and all(splits[0].get(s) for s in ("train", "validation"))
    everything = splits[0]["train"] | splits[0]["validation"]
    assert everything == {f"doc-{i}" if i % 2 else f"part/docs.jsonl.gz:{i + 1}" for i in range(60)}


def test_the_cloze_tasks_held_out_documents_are_the_embedded_pretrainings_validation_split(shards_dir):
    from pathlib import Path

    from data_pipeline.tasks.cloze import build

    ids = _split_ids(Path(shards_dir))
    assert all(i.startswith("pydoc:") for split in ids.values() for i in split)
    test = {r["id"].rsplit("/p", 1)[0] for r in build().splits["test"]}
    assert len(test) >= 10 and test <= ids["validation"] and not test & ids["train"]
