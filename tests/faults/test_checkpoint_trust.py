"""A checkpoint folder is untrusted input, and two runs may share one: crafted tensor headers,
configs and file names in meta.json, a FIFO where a file belongs, a save over another run's, rotation
with a skewed clock, non-finite weights at a save, a checkpoint of another model family. Most tests
call the loaders on small crafted files; the few that need ``glm`` share one tiny run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from glm_common.storage import Storage
from glm_dist.checkpoint import tensorfile
from glm_dist.checkpoint.consolidate import consolidated_state_dict
from glm_dist.checkpoint.errors import checkpoint_storage
from glm_dist.checkpoint.files import FORMAT, CheckpointError, verify
from glm_dist.checkpoint.shards import ShardIndex
from glm_dist.config.checks import model_config
from glm_dist.config.loader import load_config
from glm_dist.parallel.distributed import DistInfo
from glm_dist.train.checkpoint import CheckpointManager, save_id
from tests.conftest import FAST, ROOT, TINY, clean_env, run_glm

STEP2 = "checkpoints/step_00000002"
FP32 = "shards/rank00000.fp32.safetensors"


def args(shards_dir: str, out: Path, *extra: str) -> list[str]:
    return ["train", "-c", TINY, *FAST, f"data.shards_dir={shards_dir}", f"train.out_dir={out}", *extra]


@pytest.fixture(scope="module")
def run2(shards_dir, tmp_path_factory) -> Path:
    """One tiny run (fp32, ZeRO-0), 2 steps, its checkpoint at step 2; tests work on copies."""
    out = tmp_path_factory.mktemp("run2")
    run_glm(args(shards_dir, out, "train.max_steps=2"))
    return out


@pytest.fixture
def ckpt(run2, tmp_path) -> Path:
    """A copy of the run's step-2 checkpoint."""
    return Path(shutil.copytree(run2 / STEP2, tmp_path / "step_00000002"))


def refresh_meta(ckpt: Path, **changes) -> None:
    """Make meta.json agree with the files again (and apply ``changes``), as whoever edits a
    checkpoint folder can."""
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"] = {
        str(p.relative_to(ckpt)): {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and p.name != "meta.json"
    }
    meta.update(changes)
    (ckpt / "meta.json").write_text(json.dumps(meta))


def rewrite_header(path: Path, edit) -> None:
    """Apply ``edit`` to the JSON header of a safetensors file, keeping the header's length (so
    every offset still means the same bytes)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n, "the edit must not lengthen the header"
    path.write_bytes(data[:8] + text + b" " * (n - len(text)) + data[8 + n :])


def header_of(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])


def tensors_by_offset(header: dict) -> list[str]:
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


# -- 3: tensor files are parsed as untrusted input ----------------------------------------------------------
def test_overlapping_gapped_or_out_of_file_offsets_are_refused(tmp_path):
    storage = checkpoint_storage(tmp_path)
    tensorfile.write(storage, "x.safetensors", [("a", torch.arange(4.0)), ("b", torch.arange(4.0) + 10)])
    path = tmp_path / "x.safetensors"
    good = path.read_bytes()
    cases = {
        "overlapping": lambda h: h["b"].update(data_offsets=[8, 24]),  # b re-reads half of a, same length
        "a gap": lambda h: h["a"].update(data_offsets=[0, 8], shape=[2]),
        "past the end": lambda h: h["b"].update(data_offsets=[32, 48]),
    }
    for what, edit in cases.items():
        path.write_bytes(good)
        rewrite_header(path, edit)
        with pytest.raises(CheckpointError, match="is corrupt or not a weights file"):
            tensorfile.read_header(storage, "x.safetensors")
    path.write_bytes(good + b"\0" * 8)  # trailing bytes no tensor accounts for
    with pytest.raises(CheckpointError, match="the tensors end at byte"):
        tensorfile.read_header(storage, "x.safetensors")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda h, k: h[k].update(dtype="I32"), "is I32, its index says fp32"),  # same bytes, other meaning
        (lambda h, k: h[k].update(shape=[1, h[k]["shape"][0]]), "has shape"),  # same elements, another shape
        (lambda h, k: h[k].update(shape=[-1, -h[k]["shape"][0]]), "is corrupt"),  # negative dims, positive product
    ],
)
def test_a_shard_of_another_dtype_or_shape_than_its_index_says_is_refused(edit, message, ckpt):
    """The resume path's reader (``ShardIndex.read``) and consolidation refuse it before a byte
    of it lands in a weight."""
    key = tensors_by_offset(header_of(ckpt / FP32))[0]
    rewrite_header(ckpt / FP32, lambda h: edit(h, key))
    refresh_meta(ckpt)
    with pytest.raises(CheckpointError, match=message):
        consolidated_state_dict(ckpt)
    index = ShardIndex(checkpoint_storage(ckpt), verify(ckpt))
    shard = next(s for s, rel, k in index.by_key[(key.rsplit("@", 1)[0], "fp32")] if k == key)
    with pytest.raises(CheckpointError, match=message):
        index.read(shard, torch.empty(shard.length))


def test_an_index_claiming_more_elements_than_its_file_holds_allocates_nothing(ckpt):
    """A shard index with a 2^36-element tensor: refused from the index and the verified file size,
    before any allocation (this would be 256 GiB)."""
    index_path = ckpt / "shards/rank00000.json"
    index = json.loads(index_path.read_text())
    first = index["shards"][0]
    first.update(shape=[2**36], tp=None, offset=0, length=2**36)
    index_path.write_text(json.dumps(index))
    refresh_meta(ckpt)
    with pytest.raises(CheckpointError, match=r"rank00000.fp32.safetensors is corrupt .* fewer than the \d+ its index"):
        ShardIndex(checkpoint_storage(ckpt), verify(ckpt))
    first.update(shape=[2**40], length=1)
    index_path.write_text(json.dumps(index))
    refresh_meta(ckpt)
    with pytest.raises(CheckpointError, match="more elements than any model holds"):
        consolidated_state_dict(ckpt)


# -- 4: the model config read back from a checkpoint is checked like a user's ---------------------------------
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("n_layer", 10**12, "is not a gpt config field"),
        ("d_model", 2**40, "is not a gpt config field"),
        ("n_layer", 2000, "counts up to 1024"),
        ("d_model", 65, "does not divide d_model=65"),
        ("n_head", 0, "model.n_head=0 must be"),
        ("vocab_size", "8192", "is not a gpt config field"),
        ("dropout", float("inf"), "is not a gpt config field"),
        ("layers", 4, "model_config.layers=4 is not a gpt config field"),
        ("vocab_size", 2**23, "more than the largest the plan publishes"),  # 2^23 x 2^16 > GPT-3 175B
    ],
)
def test_a_crafted_model_config_in_meta_json_is_refused_before_anything_is_built(field, value, message, ckpt):
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["model_config"][field] = value
    if field == "vocab_size" and value == 2**23:
        meta["model_config"]["d_model"] = 2**16
        meta["model_config"]["n_head"] = 2**8
    (ckpt / "meta.json").write_text(json.dumps(meta))
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=message):
        consolidated_state_dict(ckpt)
    assert time.monotonic() - started < 30


def test_glm_generate_on_a_checkpoint_claiming_a_trillion_layers_is_one_line(ckpt):
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["model_config"]["n_layer"] = 10**12
    (ckpt / "meta.json").write_text(json.dumps(meta))
    proc = run_glm(["generate", "--checkpoint", str(ckpt), "--prompt", "def"], check=False, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "model_config.n_layer=1000000000000" in proc.stderr


# -- 5 and 6: names from meta.json stay in the folder; only regular files are opened ---------------------------
@pytest.mark.parametrize("name", ["../../outside.bin", "/etc/hostname", "shards/../../outside.bin", "./tokenizer.json"])
def test_a_file_name_leading_out_of_the_checkpoint_is_refused_before_it_is_read(name, ckpt):
    outside = ckpt.parent.parent / "outside.bin"
    outside.write_bytes(b"secret" * 1000)
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"][name] = {"size": 6000, "sha256": hashlib.sha256(outside.read_bytes()).hexdigest()}
    (ckpt / "meta.json").write_text(json.dumps(meta))
    storage = checkpoint_storage(ckpt)
    with pytest.raises(CheckpointError, match="not a relative name inside the checkpoint folder"):
        verify(storage)
    assert storage.bytes_read["verify"] == 0


def test_a_symlink_leading_out_of_the_checkpoint_is_refused(ckpt):
    outside = ckpt.parent / "outside.json"
    outside.write_bytes(b"{}" * 3000)
    (ckpt / "client_state.json").unlink()
    (ckpt / "client_state.json").symlink_to(outside)
    refresh_meta(ckpt)
    storage = checkpoint_storage(ckpt)
    with pytest.raises(CheckpointError, match="leads outside"):
        verify(storage)
    assert storage.bytes_read["verify"] == 0


def _in_a_thread(fn, timeout: float):
    """``fn()`` in a daemon thread: (finished, result or exception)."""
    box = {}

    def run():
        try:
            box["result"] = fn()
        except Exception as err:  # noqa: BLE001 -- handed back to the test
            box["result"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), box.get("result")


def test_a_fifo_named_meta_json_is_skipped_by_auto_resume_not_waited_on(run2, tmp_path):
    root = Path(shutil.copytree(run2 / "checkpoints", tmp_path / "checkpoints"))
    newer = root / "step_00000004"
    shutil.copytree(root / "step_00000002", newer)
    (newer / "meta.json").unlink()
    os.mkfifo(newer / "meta.json")
    (root / "latest").write_text("step_00000004")
    manager = CheckpointManager(root, DistInfo(0, 1, 0))
    try:
        finished, result = _in_a_thread(lambda: manager.resolve("auto"), timeout=60)
    finally:  # a reader blocked on the FIFO (the fault) is released: a writer opens it
        os.close(os.open(_fifo(root), os.O_RDWR | os.O_NONBLOCK))
    assert finished, "auto-resume blocked on a FIFO"
    assert isinstance(result, Storage) and result.name == "step_00000002", result
    with pytest.raises(CheckpointError, match="is not a regular file \\(a FIFO\\)"):
        checkpoint_storage(_fifo(root).parent).read("meta.json", max_bytes=100)


def _fifo(root: Path) -> Path:
    return next(p for p in root.rglob("meta.json") if p.is_fifo())


# -- 1 and 2: a shared folder, lineage and rotation ------------------------------------------------------------
def test_publishing_never_replaces_a_committed_step_folder(ckpt, tmp_path):
    other = Path(shutil.copytree(ckpt, tmp_path / "other"))
    (other / "client_state.json").write_text('{"mine": "run B"}')
    before = (ckpt / "client_state.json").read_bytes()
    with pytest.raises(CheckpointError, match="already exists and is never replaced"):
        checkpoint_storage(tmp_path).rename("other", ckpt.name)
    assert (ckpt / "client_state.json").read_bytes() == before and other.exists()
    manager = CheckpointManager(tmp_path, DistInfo(0, 1, 0))
    with pytest.raises(CheckpointError, match="step_00000002 already exists"):
        manager._staging("step_00000002")  # a save of a step another run committed is refused at its start


def test_a_save_leaves_another_process_unfinished_save_alone(tmp_path):
    """Another run's save of the same step in progress (its staging folder): this run's save
    starts, fails and cleans up without touching it."""
    root = tmp_path / "checkpoints"
    theirs = root / ".tmp-step_00000004"  # the name every run used before staging names were per run
    (theirs / "shards").mkdir(parents=True)
    (theirs / "shards/rank00000.fp32.safetensors").write_bytes(b"half written by run B")
    manager = CheckpointManager(root, DistInfo(0, 1, 0))
    staging = manager._staging("step_00000004")
    manager._start(staging)
    assert Path(staging.root).is_dir() and Path(staging.root) != theirs
    with pytest.raises(CheckpointError, match="disk full"):
        manager._fail("disk full", staging)
    assert not Path(staging.root).exists()
    assert (theirs / "shards/rank00000.fp32.safetensors").read_bytes() == b"half written by run B"


def test_a_new_run_in_a_folder_with_checkpoints_is_refused(run2, tmp_path):
    root = Path(shutil.copytree(run2 / "checkpoints", tmp_path / "checkpoints"))
    with pytest.raises(CheckpointError, match="train.resume=none, but .* holds checkpoints of an earlier run"):
        CheckpointManager(root, DistInfo(0, 1, 0)).resolve("none")


def write_save(root: Path, step: int, parent: str | None, saved_at: float) -> str:
    """A committed save (meta.json only) of ``step`` whose parent is ``parent``; returns its id."""
    folder = root / f"step_{step:08d}"
    folder.mkdir(parents=True)
    data = json.dumps({"format": FORMAT, "step": step, "saved_at": saved_at, "parent": parent, "files": {}}).encode()
    (folder / "meta.json").write_bytes(data)
    return save_id(data)


def test_rotation_follows_the_lineage_by_step_not_the_clock(tmp_path):
    """keep_last=1 after committing step 8: the older saves of its lineage go, whatever their
    clocks say (step 6 was saved on a clock an hour ahead); a copied-in folder of another run and
    the one ``latest`` names stay."""
    root = tmp_path / "checkpoints"
    s2 = write_save(root, 2, None, 1000.0)
    s4 = write_save(root, 4, s2, 1010.0)
    s6 = write_save(root, 6, s4, 4600.0)  # clock skew: "newer" than step 8
    s8 = write_save(root, 8, s6, 1030.0)
    write_save(root, 10, None, 9999.0)  # another run's save copied in: not this lineage
    (root / "latest").write_text("step_00000008")
    manager = CheckpointManager(root, DistInfo(0, 1, 0), keep_last=1)
    manager.head = s8  # as _commit sets it
    deleted = sorted(p.name for p in manager.rotate())
    assert deleted == ["step_00000002", "step_00000004", "step_00000006"]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == ["step_00000008", "step_00000010"]


def test_rotation_never_deletes_the_save_latest_names(tmp_path):
    root = tmp_path / "checkpoints"
    s2 = write_save(root, 2, None, 1.0)
    s4 = write_save(root, 4, s2, 2.0)
    (root / "latest").write_text("step_00000002")  # e.g. written by a run that resumed from it
    manager = CheckpointManager(root, DistInfo(0, 1, 0), keep_last=1)
    manager.head = s4
    assert manager.rotate() == []


def test_auto_resume_moves_an_unverifiable_save_aside_instead_of_deleting_it(run2, tmp_path):
    root = Path(shutil.copytree(run2 / "checkpoints", tmp_path / "checkpoints"))
    broken = root / "step_00000004"
    shutil.copytree(root / "step_00000002", broken)
    meta = json.loads((broken / "meta.json").read_text())
    meta["step"] = 4
    (broken / "meta.json").write_text(json.dumps(meta))
    (broken / FP32).write_bytes(b"\0" * 10)  # truncated
    (root / "latest").write_text("step_00000004")
    manager = CheckpointManager(root, DistInfo(0, 1, 0))
    assert manager.resolve("auto").name == "step_00000002"
    assert not broken.exists()
    moved = list((root / "aside").glob("unverified-*/step_00000004"))
    assert len(moved) == 1 and (moved[0] / FP32).read_bytes() == b"\0" * 10


# -- 8: a checkpoint of another family -------------------------------------------------------------------------
def test_resuming_a_gpt2_checkpoint_as_gpt1_is_refused_naming_both(run2, shards_dir, tmp_path):
    root = Path(shutil.copytree(run2 / "checkpoints", tmp_path / "checkpoints"))
    gpt1 = load_config(TINY, [*FAST, "model.family=gpt1", "model.flavor=gpt1-tiny"])
    manager = CheckpointManager(root, DistInfo(0, 1, 0))
    with pytest.raises(CheckpointError, match="written by a gpt model, this run's model.family is gpt1"):
        manager.resolve("auto", family="gpt1", model_config=model_config(gpt1))
    gpt2 = model_config(load_config(TINY, FAST))
    with pytest.raises(CheckpointError, match="layer_norm_eps=1e-05 \\(this run: 0.001\\)"):
        manager.resolve("auto", family="gpt", model_config=dataclasses.replace(gpt2, layer_norm_eps=1e-3))
    resumed = manager.resolve("auto", family="gpt", model_config=dataclasses.replace(gpt2, dropout=0.1))
    assert resumed.name == "step_00000002"  # regularisation may change on resume

    run = Path(shutil.copytree(run2, tmp_path / "run"))
    proc = run_glm(
        args(shards_dir, run, "train.max_steps=4", "model.family=gpt1", "model.flavor=gpt1-tiny"), check=False
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "written by a gpt model, this run's model.family is gpt1" in proc.stderr


# -- 7: non-finite weights are never saved ---------------------------------------------------------------------
POISON = r"""
import sys
from glm_dist.cli import main
from glm_dist.train import loop

step = loop.Trainer.train_step
def poisoned(self):  # a loss explosion: the weights turn NaN after step 4
    step(self)
    if self.state.step == 4:
        next(self.engine.module.parameters()).data.fill_(float("nan"))
loop.Trainer.train_step = poisoned
sys.exit(main(["train", "-c", *sys.argv[1:]]))
"""


def test_non_finite_weights_at_a_save_stop_the_run_and_keep_the_last_good_checkpoint(run2, shards_dir, tmp_path):
    run = Path(shutil.copytree(run2, tmp_path / "run"))
    cmd = [sys.executable, "-c", POISON, *args(shards_dir, run, "train.max_steps=4")[2:]]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(2), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "checkpoint step_00000004 not saved: the weights are not finite" in proc.stderr
    assert "the newest complete checkpoint is still" in proc.stderr
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_00000002"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000002"]  # no step 4, no staging left
