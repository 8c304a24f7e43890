"""The sharded checkpoint format: shards with global offsets read back at any tensor-parallel and
data-parallel split, files that safetensors itself reads, verification split over ranks by bytes,
each rank reading only its share at a layout change, asynchronous saves (a kill -9 mid-write, a
writer failing on one rank), and an S3 bucket (moto's server) as the checkpoint store."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from glm_common.storage import Storage
from glm_dist.checkpoint import tensorfile
from glm_dist.checkpoint.errors import checkpoint_storage
from glm_dist.checkpoint.files import BlockHasher, CheckpointError, verify
from glm_dist.checkpoint.shards import Shard, ShardIndex, data_file, index_file, overlaps, split_bounds
from glm_dist.parallel.tensor import _slice
from tests.conftest import FAST, ROOT, TINY, clean_env, run_glm, tagged_json, train_losses


# -- the format, without processes ---------------------------------------------------------------------
def tp_local(full: torch.Tensor, tp: tuple | None) -> torch.Tensor:
    if tp is None:
        return full
    dim, parts, rank, size = tp
    if parts == 1:  # one part: ceil(n / size) rows per rank, the last ones shorter (the vocabulary split)
        lo, hi = split_bounds(full.shape[dim], rank, size)
        return full.narrow(dim, lo, hi - lo)
    return full.index_select(dim, _slice(full.shape[dim], rank, size, parts))


def partitions(numel: int, n: int) -> list[tuple[int, int]]:
    """ZeRO-3's split of a flat tensor: ceil(numel / n) per rank, the last ones short or empty."""
    part = math.ceil(numel / n)
    return [(min(r * part, numel), max(0, min(part, numel - r * part))) for r in range(n)]


def save_layout(ckpt: Storage, tensors: dict[str, tuple[torch.Tensor, int, int]], tp_size: int, dp: int) -> dict:
    """Each (tensor rank, data rank) writes its partition of its TP slice of every tensor, as a
    run at that layout would; returns meta.json's file list."""
    files = {}
    for t in range(tp_size):
        for d in range(dp):
            rank, shards, parts = t * dp + d, [], []
            for name, (full, dim, fused) in tensors.items():
                tp = (dim, fused, t, tp_size) if tp_size > 1 and dim is not None else None
                local = tp_local(full, tp).reshape(-1)
                start, n = partitions(local.numel(), dp)[d]
                if tp is None:  # replicated over the tensor ranks: each writes a part of the fragment
                    start, n = start + n * t // tp_size, n * (t + 1) // tp_size - n * t // tp_size
                key = f"{name}@{start}"
                parts.append((key, local[start : start + n].clone()))
                shards.append(Shard(name, "fp32", tuple(full.shape), tp, start, n).to_json(key))
            files[data_file(rank, "fp32")] = tensorfile.write(ckpt, data_file(rank, "fp32"), parts)
            data = json.dumps({"rank": rank, "shards": shards}).encode()
            ckpt.write_bytes(index_file(rank), data)
            files[index_file(rank)] = {}
    return {"files": files}


@pytest.mark.parametrize("saved, wanted", [((2, 3), (4, 2)), ((4, 1), (1, 3)), ((1, 2), (2, 2)), ((2, 2), (2, 2))])
def test_any_slice_reads_back_from_the_shards_of_any_layout(saved, wanted, tmp_path):
    """Column-parallel (fused [q; k; v]), row-parallel, vocabulary-split (11 rows: uneven at every
    size) and replicated tensors saved at one (tensor, data) split and read at another: every rank
    gets exactly its slice, and reads exactly its bytes (each piece lies in one saved file run)."""
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "qkv": (torch.randn(24, 8, generator=gen), 0, 3),
        "proj": (torch.randn(8, 16, generator=gen), 1, 1),
        "vocab": (torch.randn(11, 4, generator=gen), 0, 1),
        "wte": (torch.randn(10, 4, generator=gen), None, 1),
    }
    ckpt = checkpoint_storage(tmp_path)
    index = ShardIndex(ckpt, save_layout(ckpt, tensors, *saved))
    tp_size, dp = wanted
    for t in range(tp_size):
        for name, (full, dim, fused) in tensors.items():
            tp = (dim, fused, t, tp_size) if tp_size > 1 and dim is not None else None
            local = tp_local(full, tp).reshape(-1)
            for start, n in partitions(local.numel(), dp):
                out = torch.empty(n)
                before = ckpt.bytes_read["data"]
                index.read(Shard(name, "fp32", tuple(full.shape), tp, start, n), out)
                assert torch.equal(out, local[start : start + n]), (name, t, start)
                assert ckpt.bytes_read["data"] - before <= 4 * n + (1 << 16)
        assert torch.equal(index.whole("proj"), tensors["proj"][0])
        assert torch.equal(index.whole("vocab"), tensors["vocab"][0])


def test_overlaps_of_a_row_parallel_slice_are_its_rows():
    """TP=2 rank 1 of an (4, 6) row-parallel weight against the whole tensor: 4 runs of 3."""
    need = Shard("w", "fp32", (4, 6), (1, 1, 1, 2), 0, 12)
    have = Shard("w", "fp32", (4, 6), None, 0, 24)
    dst, src, n = overlaps(need, have)
    assert dst.tolist() == [0, 3, 6, 9] and src.tolist() == [3, 9, 15, 21] and n.tolist() == [3, 3, 3, 3]


def test_missing_elements_and_bad_files_are_one_clear_error(tmp_path):
    ckpt = checkpoint_storage(tmp_path)
    full = torch.arange(12.0)
    meta = save_layout(ckpt, {"w": (full, 0, 1)}, 1, 2)
    del meta["files"][index_file(1)]  # rank 1's shards are gone
    with pytest.raises(CheckpointError, match=r"holds 6 of the 12 elements of w \(fp32\)"):
        ShardIndex(ckpt, meta).read(Shard("w", "fp32", (12,), None, 0, 12), torch.empty(12))
    (tmp_path / data_file(0, "fp32")).write_bytes(b"\xff" * 64)  # not a safetensors header
    with pytest.raises(CheckpointError, match="is corrupt or not a weights file"):
        ShardIndex(ckpt, meta).read(Shard("w", "fp32", (12,), None, 0, 6), torch.empty(6))


def test_shard_files_are_safetensors_files(tmp_path):
    from safetensors import safe_open

    tensors = [
        ("a@0", torch.randn(5)),
        ("b@7", torch.arange(6, dtype=torch.int64).reshape(2, 3)),
        ("c@0", torch.randn(3).bfloat16()),
    ]
    entry = tensorfile.write(checkpoint_storage(tmp_path), "x.safetensors", tensors)
    assert entry["size"] == (tmp_path / "x.safetensors").stat().st_size
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == ["a@0", "b@7", "c@0"]
        assert all(torch.equal(f.get_tensor(k), t) for k, t in tensors)
    back = tensorfile.read_all(checkpoint_storage(tmp_path), "x.safetensors")
    assert all(torch.equal(back[k], t) for k, t in tensors)


def test_verification_splits_the_bytes_over_ranks(tmp_path):
    ckpt = checkpoint_storage(tmp_path)
    data = os.urandom(10_000)
    hasher = BlockHasher(block=1000)
    hasher.update(data)
    (tmp_path / "big.bin").write_bytes(data)
    (tmp_path / "meta.json").write_text(json.dumps({"format": 3, "files": {"big.bin": hasher.entry()}}))
    for r in range(4):
        ckpt.bytes_read.clear()
        verify(ckpt, share=(r, 4))
        assert ckpt.bytes_read["verify"] in (2000, 3000)  # 10 blocks over 4 ranks
    (tmp_path / "big.bin").write_bytes(data[:5000] + b"x" + data[5001:])
    assert sum(_fails(ckpt, (r, 4)) for r in range(4)) == 1  # one rank holds the damaged block


def _fails(ckpt: Storage, share: tuple[int, int]) -> bool:
    try:
        verify(ckpt, share=share)
        return False
    except CheckpointError as err:
        assert "big.bin does not match its SHA-256" in str(err)
        return True


def test_format_2_checkpoints_are_refused_with_the_conversion_command(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"format": 2, "files": {}}))
    with pytest.raises(CheckpointError, match="has format 2 .* universal/ .* convert it with `glm checkpoint convert"):
        verify(tmp_path)


def _as_format_2(ckpt: Path, old: Path) -> None:
    """What glm-dist wrote before the sharded format, for the same state: whole fp32 masters and
    moments per parameter in universal/<name>.pt, JSON run state without the optimizer's step and
    the engine's counters (DeepSpeed's files held those), SHA-256 per file."""
    import hashlib

    from glm_dist.checkpoint.files import read_meta

    meta = read_meta(checkpoint_storage(ckpt))
    index = ShardIndex(checkpoint_storage(ckpt), meta)
    client = json.loads((ckpt / "client_state.json").read_text())
    uni = old / "universal"
    uni.mkdir(parents=True)
    moments = client["optimizer"]["moments"]
    shapes = {}
    for name in index.names("fp32"):
        torch.save({k: index.whole(name, k) for k in ["fp32", *moments]}, uni / f"{name}.pt")
        shapes[name] = list(index.shape(name, "fp32"))
    buffers = {name: index.whole(name, "buffer") for name in index.names("buffer")}
    if buffers:
        torch.save(buffers, uni / "buffers-00000.pt")
    (uni / "index-00000.json").write_text(
        json.dumps({"params": shapes, "moments": moments, "step": client["optimizer"]["step"]})
    )
    (old / "client_state.json").write_text(json.dumps({k: client[k] for k in ("train_state", "data")}))
    (old / "rng").mkdir()
    (old / "rng/rank00000.json").write_bytes((ckpt / "rng/rank00000.json").read_bytes())
    (old / "tokenizer.json").write_bytes((ckpt / "tokenizer.json").read_bytes())
    files = {
        str(p.relative_to(old)): {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(old.rglob("*"))
        if p.is_file()
    }
    (old / "meta.json").write_text(
        json.dumps({**{k: v for k, v in meta.items() if k != "files"}, "format": 2, "files": files})
    )


def test_a_format_2_checkpoint_converts_and_resumes_on_the_losses_of_the_run_that_saved_it(shards_dir, tmp_path):
    run = ["train.max_steps=4", "train.save_interval=2", "parallel.zero_stage=1"]
    run_glm(["train", "-c", *fast(shards_dir, tmp_path / "a", *run)])
    saved = tmp_path / "a/checkpoints/step_00000002"
    _as_format_2(saved, tmp_path / "old")
    proc = run_glm(
        [
            "checkpoint",
            "convert",
            "--checkpoint",
            str(tmp_path / "old"),
            "--out",
            str(tmp_path / "b/checkpoints/step_00000002"),
        ]
    )
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["step"] == 2 and report["moments"] == ["exp_avg", "exp_avg_sq"]
    converted = json.loads((tmp_path / "b/checkpoints/step_00000002/client_state.json").read_text())
    original = json.loads((saved / "client_state.json").read_text())
    assert converted["engine"] == original["engine"] and converted["optimizer"] == original["optimizer"]
    verify(tmp_path / "b/checkpoints/step_00000002")
    run_glm(["train", "-c", *fast(shards_dir, tmp_path / "b", *run, "parallel.zero_stage=0", "train.resume=auto")])
    resumed, reference = train_losses(tmp_path / "b"), train_losses(tmp_path / "a")[2:]  # steps 3, 4 at ZeRO-0
    assert len(resumed) == 2 and max(abs(x - y) for x, y in zip(resumed, reference)) < 1e-5, (resumed, reference)
    proc = run_glm(["checkpoint", "convert", "--checkpoint", str(saved), "--out", str(tmp_path / "c")], check=False)
    assert proc.returncode == 2 and "has format 3; glm checkpoint convert reads format 2" in proc.stderr


# -- runs ---------------------------------------------------------------------------------------------
def fast(shards_dir: str, out: Path, *extra: str) -> list[str]:
    return [TINY, *FAST, f"data.shards_dir={shards_dir}", f"train.out_dir={out}", *extra]


def launch(script: str, argv: list[str], *, where: Path, nproc: int = 2, **popen) -> subprocess.Popen:
    """``script`` (written to ``where``) with ``argv``, under torchrun with ``nproc`` CPU processes."""
    path = where / "script.py"
    path.write_text(script)
    runner = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    return subprocess.Popen([sys.executable, *runner, str(path), *argv], cwd=ROOT, env=clean_env(1), text=True, **popen)


READ_SHARE = r"""
import json, sys
from glm_dist.config.loader import load_config
from glm_dist.parallel import fragments
from glm_dist.train.loop import Trainer

trainer = Trainer(load_config(sys.argv[1], sys.argv[2:]))
pieces = fragments.pieces(trainer.engine, trainer.naming, trainer.coords,
                          {"data": trainer.topo.data, "tensor": trainer.topo.tensor})
share = sum(4 * p.numel * (1 + len(p.moments)) for p in pieces)
print("REPORT" + json.dumps({"read": dict(trainer.ckpts.storage.bytes_read), "share": share}), flush=True)
"""


@pytest.mark.slow
def test_each_rank_reads_only_its_share_at_a_layout_change(shards_dir, tmp_path):
    """Saved by one process (ZeRO-0), resumed on two ranks at ZeRO-3: each rank reads exactly the
    bytes of the fp32 and moment slices it holds -- half the shard data -- and hashes about half
    of the checkpoint to verify it."""
    run_glm(["train", "-c", *fast(shards_dir, tmp_path, "train.max_steps=2")])
    proc = launch(
        READ_SHARE,
        fast(shards_dir, tmp_path, "train.max_steps=4", "parallel.zero_stage=3"),
        where=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    reports = tagged_json(out, "REPORT")
    saved = sum(p.stat().st_size for p in (tmp_path / "checkpoints/step_00000002/shards").glob("*.safetensors"))
    assert len(reports) == 2
    for r in reports:
        assert r["read"]["data"] == r["share"], r  # exactly the slices it holds
        assert abs(r["share"] / saved - 0.5) < 0.02, (r, saved)
    assert sum(r["read"]["verify"] for r in reports) >= saved  # every byte verified once, split over the ranks


SLOW_WRITER = r"""
import os, sys, time
from glm_dist.checkpoint import tensorfile
from glm_dist.cli import main

write = tensorfile.write
def slow(storage, rel, tensors, **kw):  # the save at step 4 never finishes writing
    if "step_00000004" in str(storage):
        open(os.environ["GLM_TEST_MARKER"], "w").close()
        time.sleep(3600)
    return write(storage, rel, tensors, **kw)
tensorfile.write = slow
sys.exit(main(["train", "-c", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_kill_9_during_an_asynchronous_write_leaves_the_previous_checkpoint_latest(shards_dir, tmp_path):
    """Training goes on while the step-4 save is being written (steps 5 and 6 are logged); a
    kill -9 then leaves step 2 the latest, and auto-resume continues from it on the losses of a run
    that was never killed."""
    marker = tmp_path / "writing"
    env = clean_env(2) | {"GLM_TEST_MARKER": str(marker)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, *fast(shards_dir, tmp_path, "train.max_steps=8", "train.save_interval=2")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 240
        while not (marker.exists() and (tmp_path / "metrics.jsonl").exists() and len(train_losses(tmp_path)) >= 5):
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "timeout"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    ckpts = tmp_path / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_00000002"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000002"]
    assert not (ckpts / ".tmp-step_00000004/meta.json").exists()
    rest = ["train.max_steps=8", "train.save_interval=2", "train.stop_at_step=4"]
    resumed = run_glm(["train", "-c", *fast(shards_dir, tmp_path, *rest)])
    assert "step_00000002 at step 2" in resumed.stderr
    assert (ckpts / "latest").read_text() == "step_00000004" and not (ckpts / ".tmp-step_00000004").exists()
    run_glm(["train", "-c", *fast(shards_dir, tmp_path / "uninterrupted", *rest)])
    assert train_losses(tmp_path) == train_losses(tmp_path / "uninterrupted")  # steps 3 and 4 as if never killed


FAILING_WRITER = r"""
import os, sys
from glm_dist.checkpoint import tensorfile
from glm_dist.cli import main

write = tensorfile.write
def failing(storage, rel, tensors, **kw):  # rank 1's disk is full at step 4
    if os.environ["RANK"] == "1" and "step_00000004" in str(storage):
        raise OSError(28, "No space left on device")
    return write(storage, rel, tensors, **kw)
tensorfile.write = failing
sys.exit(main(["train", "-c", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_a_background_write_failing_on_one_rank_stops_every_rank_with_one_message(shards_dir, tmp_path):
    proc = launch(
        FAILING_WRITER,
        fast(shards_dir, tmp_path, "train.max_steps=6", "train.save_interval=2", "parallel.zero_stage=1"),
        where=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "internal error" not in err, err[-3000:]
    message = "writing checkpoint step_00000004 failed on rank 1 (OSError: [Errno 28] No space left on device"
    assert err.count(f"glm train: error: {message}") == 2, err[-3000:]  # the same line on both ranks
    assert "the newest complete checkpoint is still" in err and "step_00000002 --" in err
    ckpts = tmp_path / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_00000002"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000002"]


@pytest.fixture
def s3_bucket(monkeypatch):
    """A local S3 server (moto) with one bucket; glm processes reach it through fsspec's config."""
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": f"http://{host}:{port}",
    }.items():
        monkeypatch.setenv(key, value)
    import fsspec.config
    import s3fs

    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": f"http://{host}:{port}"})  # this process
    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem(endpoint_url=f"http://{host}:{port}").mkdir("ckpt")
    yield "s3://ckpt"
    server.stop()


@pytest.mark.slow
def test_checkpoints_on_s3_save_resume_and_export(s3_bucket, shards_dir, tmp_path):
    url = f"{s3_bucket}/run"
    common = ["train.max_steps=4", "train.save_interval=2", f"train.checkpoint_dir={url}"]
    run_glm(["train", "-c", *fast(shards_dir, tmp_path / "split", *common, "train.stop_at_step=2")])
    proc = run_glm(["train", "-c", *fast(shards_dir, tmp_path / "split", *common)])
    assert f"resumed from {url}/step_00000002 at step 2" in proc.stderr
    run_glm(["train", "-c", *fast(shards_dir, tmp_path / "straight", "train.max_steps=4")])
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "straight")  # exact resume from S3
    assert not (tmp_path / "split/checkpoints").exists()

    from glm_dist.checkpoint.consolidate import consolidated_state_dict

    remote, _ = consolidated_state_dict(f"{url}/step_00000004")
    local, _ = consolidated_state_dict(tmp_path / "straight/checkpoints/step_00000004")
    assert all(torch.equal(remote[k], local[k]) for k in local)
    run_glm(["export-hf", "--checkpoint", f"{url}/step_00000004", "--out", str(tmp_path / "hf")])
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    assert torch.equal(model.transformer.wte.weight.detach(), local["embed.wte.weight"])
    # the tokenizer travels with it from the bucket, and glm eval reads the checkpoint there too
    exported = json.loads((tmp_path / "hf/tokenizer.json").read_text())
    saved = json.loads((tmp_path / "straight/checkpoints/step_00000004/tokenizer.json").read_text())
    assert (
        exported["model"]["vocab"] == saved["model"]["vocab"]
        and exported["model"]["merges"] == saved["model"]["merges"]
    )
    proc = run_glm(["eval", "-c", TINY, *FAST, f"data.shards_dir={shards_dir}", "--checkpoint", f"{url}/step_00000004"])
    remote_eval = json.loads(proc.stdout[proc.stdout.index("{") :])
    proc = run_glm(
        [
            "eval",
            "-c",
            TINY,
            *FAST,
            f"data.shards_dir={shards_dir}",
            "--checkpoint",
            str(tmp_path / "straight/checkpoints/step_00000004"),
        ]
    )
    local_eval = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert remote_eval.pop("checkpoint") != local_eval.pop("checkpoint") and remote_eval == local_eval
