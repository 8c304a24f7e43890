"""Fault injection on checkpoints and runs: crafted pickles, corrupt and truncated files, a roll-back
followed by auto-resume, unreadable shards, a crash mid-append, a full disk, a rank that hangs and a
rank killed mid-step. Every test asserts the message and the exit code, not just a failure."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import FAST, ROOT, TINY, clean_env, run_glm, train_losses

pytestmark = pytest.mark.slow
CKPT2, CKPT4 = "checkpoints/step_00000002", "checkpoints/step_00000004"


def args(shards_dir: str, out: Path, *extra: str) -> list[str]:
    return ["train", "-c", TINY, *FAST, f"data.shards_dir={shards_dir}", f"train.out_dir={out}", *extra]


@pytest.fixture(scope="module")
def run4(shards_dir, tmp_path_factory) -> Path:
    """ZeRO-1 for 4 steps, checkpoints at 2 and 4 (sharded: fp32 masters and moments per rank)."""
    out = tmp_path_factory.mktemp("run4")
    run_glm(args(shards_dir, out, "train.max_steps=4", "train.save_interval=2", "parallel.zero_stage=1"))
    return out


def copy_run(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    return dest


def refresh_meta(ckpt: Path) -> None:
    """Make meta.json agree with the files again, as whoever edits a checkpoint folder can."""
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"] = {
        str(p.relative_to(ckpt)): {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and p.name != "meta.json"
    }
    (ckpt / "meta.json").write_text(json.dumps(meta))


class Payload:
    """Unpickling this runs a shell command (what a crafted checkpoint file would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plant(path: Path, marker: Path) -> None:
    torch.save({"module": Payload(marker), "fp32": Payload(marker)}, path)


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("kind", ["fp32", "exp_avg"])
def test_crafted_pickle_in_a_checkpoint_file_is_refused_and_never_runs(kind, run4, shards_dir, tmp_path):
    """A pickle in place of a shard file (meta.json fixed up): no command unpickles anything --
    the shards are read as safetensors (a JSON header and raw bytes), and the file is refused."""
    run = copy_run(run4, tmp_path / "run")
    ckpt = run / CKPT4
    marker = tmp_path / "PWNED"
    target = ckpt / f"shards/rank00000.{kind}.safetensors"
    plant(target, marker)
    refresh_meta(ckpt)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"text {i}", "label": str(i % 2)}) + "\n" for i in range(8)))
    commands = {
        "resume": args(shards_dir, run, "train.max_steps=6", "parallel.zero_stage=1"),
        "resume on another layout": args(shards_dir, run, "train.max_steps=6", "parallel.zero_stage=0"),
        "eval": ["eval", "-c", TINY, *FAST, f"data.shards_dir={shards_dir}", "--checkpoint", str(ckpt)],
        "export-hf": ["export-hf", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")],
        "finetune": ["finetune", "--checkpoint", str(ckpt), "--train", str(rows)],
    }
    wanted = {"fp32": ["resume", "eval", "export-hf", "finetune"], "exp_avg": ["resume", "resume on another layout"]}[
        kind
    ]
    for name in wanted:
        proc = run_glm(commands[name], check=False)
        assert proc.returncode == 2, (name, proc.stderr[-3000:])
        assert "Traceback" not in proc.stderr, (name, proc.stderr[-3000:])
        assert f"{target.name} is corrupt or not a weights file" in proc.stderr, (name, proc.stderr[-2000:])
        assert not marker.exists(), f"{name}: the payload in {target.name} ran"


def test_pipe_shard_location_is_refused_before_anything_runs(shards_dir, tmp_path):
    marker = tmp_path / "X"
    proc = run_glm(args(f"pipe:touch {marker};cat s", tmp_path / "run"), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "data.shards_dir" in proc.stderr and "pipe:" in proc.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_roll_back_then_auto_resume_follows_the_new_lineage_and_skips_a_corrupt_save(run4, shards_dir, tmp_path):
    run = copy_run(run4, tmp_path / "run")
    first = train_losses(run)
    common = ["train.max_steps=4", "train.save_interval=1", "parallel.zero_stage=1", "train.keep_last=10"]
    proc = run_glm(args(shards_dir, run, *common, f"train.resume={run / CKPT2}"), check=False)
    assert proc.returncode == 2 and "holds newer checkpoints (step_00000004)" in proc.stderr
    assert "train.resume_overwrite=true" in proc.stderr and "Traceback" not in proc.stderr

    run_glm(
        args(
            shards_dir,
            run,
            *common,
            f"train.resume={run / CKPT2}",
            "train.resume_overwrite=true",
            "train.stop_at_step=3",
        )
    )
    assert (run / "checkpoints/latest").read_text() == "step_00000003"
    assert not (run / CKPT4).exists() and list((run / "checkpoints/aside").glob("rolled-back-*/step_00000004"))
    # the newest save is now damaged, and a crash left half a row in metrics.jsonl
    truncated = run / "checkpoints/step_00000003/client_state.json"
    truncated.write_bytes(truncated.read_bytes()[:10])
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "train", "st')
    proc = run_glm(args(shards_dir, run, *common))
    assert "skipping step_00000003" in proc.stderr and "client_state.json is 10 bytes" in proc.stderr
    assert "not a complete JSON row" in proc.stderr
    assert "resumed from" in proc.stderr and "step_00000002 at step 2" in proc.stderr
    assert train_losses(run) == first  # steps 3 and 4 again, exactly as the first time


def test_garbage_checkpoint_files_give_one_line_and_write_nothing(run4, shards_dir, tmp_path):
    run = copy_run(run4, tmp_path / "run")
    ckpt = run / CKPT4
    (ckpt / "rng/rank00000.json").write_bytes(b"\x80\x04garbage")
    refresh_meta(ckpt)
    before = tree_digest(run)
    proc = run_glm(args(shards_dir, run, "train.max_steps=6", "parallel.zero_stage=1"), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "rng/rank00000.json is corrupt" in proc.stderr
    assert tree_digest(run) == before

    (ckpt / "meta.json").write_bytes(os.urandom(300))
    proc = run_glm(args(shards_dir, run, "train.max_steps=6", f"train.resume={ckpt}"), check=False)
    assert proc.returncode == 2 and "meta.json is corrupt" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_glm(["export-hf", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")], check=False)
    assert proc.returncode == 2 and "meta.json is corrupt" in proc.stderr


def test_every_shard_unreadable_is_one_line_with_the_count(shards_dir, tmp_path):
    bad = Path(shutil.copytree(shards_dir, tmp_path / "shards"))
    manifest = json.loads((bad / "manifest.json").read_text())
    for shard in manifest["splits"]["train"]:
        (bad / shard["name"]).write_bytes(b"not a tar file" * 100)
    proc = run_glm(args(str(bad), tmp_path / "run"), check=False)
    n = len(manifest["splits"]["train"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"no readable document in any of the {n} shards ({n} skipped:" in proc.stderr


def test_bad_config_values_are_refused_with_the_key(shards_dir, tmp_path):
    for override, message in [
        ("model.n_head=0", "model.n_head=0 must be >= 1"),
        ("model.d_model=-64", "model.d_model=-64 must be >= 1"),
        ("data.seq_len=-1", "data.seq_len=-1 must be >= 2"),
        ("model.n_layer=0", "model.n_layer=0 must be >= 1"),
    ]:
        proc = run_glm(args(shards_dir, tmp_path / "run", override), check=False)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(os.urandom(512) + b"\xff\xfe")
    for config, message in [(str(ROOT / "configs"), "is not a file"), (str(binary), "is not UTF-8 text")]:
        proc = run_glm(["train", "-c", config], check=False)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def _tmpfs(path: Path, size: str) -> bool:
    """Mount a tmpfs of ``size`` at ``path`` (root only, as CI runs)."""
    path.mkdir(parents=True)
    return (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def test_disk_full_during_a_save_keeps_the_last_checkpoint(run4, shards_dir, tmp_path):
    size = sum(p.stat().st_size for p in (run4 / CKPT4).rglob("*") if p.is_file())
    out = tmp_path / "small"
    if not _tmpfs(out, f"{int(size * 1.6) // 1024}k"):
        pytest.skip("needs root to mount a tmpfs (CI runs as root)")
    try:
        proc = run_glm(
            args(
                shards_dir,
                out,
                "train.max_steps=4",
                "train.save_interval=2",
                "parallel.zero_stage=1",
                "train.keep_last=5",
            ),
            check=False,
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert "writing checkpoint step_00000004 failed on rank 0" in proc.stderr and "MiB free under" in proc.stderr
        assert "the newest complete checkpoint is still" in proc.stderr and "step_00000002" in proc.stderr
        assert (out / "checkpoints/latest").read_text() == "step_00000002"
        assert not list((out / "checkpoints").glob(".tmp-*"))  # the half-written save was removed
        from glm_dist.checkpoint.files import verify

        assert verify(out / "checkpoints/step_00000002")["step"] == 2  # the last good one is intact
    finally:
        subprocess.run(["umount", str(out)], capture_output=True)


def _torchrun(argv: list[str]) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "glm_dist.cli",
        *argv,
    ]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=clean_env(1),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _rank_pids(launcher: int) -> dict[int, int]:
    """Worker pid of each rank under a torchrun process (its children that set RANK)."""
    out = {}
    for child in Path("/proc").iterdir():
        if not child.name.isdigit():
            continue
        try:
            stat = (child / "stat").read_text().split()
            env = (child / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[3]) == launcher:
            rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
            if rank is not None:
                out[rank] = int(child.name)
    return out


def _kill_all(proc: subprocess.Popen, workers: list[int]) -> None:
    """The launcher and its workers (torchrun starts each worker in a session of its own, and an
    orphaned, stopped worker outlives the launcher)."""
    for pid in workers:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_for(predicate, timeout: float) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_a_rank_that_hangs_is_named_by_the_others(shards_dir, tmp_path):
    proc = _torchrun(args(shards_dir, tmp_path, "train.max_steps=500", "parallel.collective_timeout_s=10"))
    workers, seen = [], []
    try:
        assert _wait_for(
            lambda: (
                (tmp_path / "metrics.jsonl").exists()
                and len((tmp_path / "metrics.jsonl").read_text().splitlines()) >= 3
            ),
            180,
        )
        workers = list(_rank_pids(proc.pid).values())
        os.kill(_rank_pids(proc.pid)[1], signal.SIGSTOP)
        started = time.time()
        for line in proc.stderr:  # rank 0's message, without waiting for torchrun's teardown
            seen.append(line)
            if "did not reach it" in line or time.time() - started > 120:
                break
    finally:
        _kill_all(proc, workers)
    stderr = "".join(seen)
    assert "a collective timed out after 10 s" in stderr, stderr[-3000:]
    assert "rank(s) 1 did not reach it" in stderr, stderr[-3000:]
    assert time.time() - started < 60  # the timeout (10 s) and the diagnosis (10 s), not a silent hang


def test_a_rank_killed_mid_step_resumes_on_the_uninterrupted_loss_curve(shards_dir, tmp_path):
    # 12 steps: the kill comes after step 4, and at 8 a run whose start no longer waits on a long
    # peak measurement had finished all of them first (seen in a clean-clone run)
    common = ["train.max_steps=12", "train.save_interval=3", "parallel.zero_stage=2", "train.global_batch_size=8"]
    straight = tmp_path / "straight"
    run_glm(args(shards_dir, straight, *common), nproc=2)
    broken = tmp_path / "broken"
    proc = _torchrun(args(shards_dir, broken, *common))
    workers = []
    try:
        assert _wait_for(
            lambda: (broken / "checkpoints/step_00000003/meta.json").exists() and len(train_losses(broken)) >= 4, 240
        )
        workers = list(_rank_pids(proc.pid).values())
        os.kill(_rank_pids(proc.pid)[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        _kill_all(proc, workers)
    assert proc.returncode != 0 and len(train_losses(broken)) < 12
    # the survivor says what happened in one line: no "internal error", no crash file to report
    assert "internal error" not in err and "glm train: error: step " in err, err[-3000:]
    assert "another rank's process is gone (" in err and "rerun to resume from it" in err
    run_glm(args(shards_dir, broken, *common), nproc=2)
    assert train_losses(broken) == train_losses(straight)


def test_tokenizing_killed_mid_shard_write_reruns_byte_identical(corpus, tmp_path):
    import gzip

    src = tmp_path / "src"
    src.mkdir()
    lines = gzip.open(corpus, "rt").read().splitlines()
    for i in range(4):  # four input files: four encoding tasks
        (src / f"part{i}.jsonl").write_text("\n".join(lines[i::4] * 3) + "\n")
    cfg = [
        "-c",
        TINY,
        f"data.source={src}/*.jsonl",
        "data.vocab_size=2048",
        "data.shard_max_bytes=65536",
        "data.encode_workers=1",
    ]
    run_glm(["data", "tokenize", *cfg, f"data.shards_dir={tmp_path / 'straight'}"])
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "glm_dist.cli", "data", "tokenize", *cfg, f"data.shards_dir={killed}"],
        cwd=ROOT,
        env=clean_env(2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Killed while a later task's shard is half written: its NAME.tmp.PID file is on disk.
        assert _wait_for(
            lambda: (killed / ".tasks/00000.json").exists() and any(killed.glob("*-0000[1-3]-*.tar.tmp.*")), 180
        )
        proc.kill()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert not (killed / "manifest.json").exists()
    assert any(killed.glob("*.tmp.*"))
    run_glm(["data", "tokenize", *cfg, f"data.shards_dir={killed}"])
    assert tree_digest(killed) == tree_digest(tmp_path / "straight")


def test_credentials_in_urls_never_reach_meta_json_or_wandb(shards_dir, tmp_path):
    from glm_dist.observability.redact import redact

    assert redact({"a": ["s3://bucket/x", "https://user:tok3n@host/p?sig=abc&part=2"]}) == {
        "a": ["s3://bucket/x", "https://REDACTED@host/p?sig=REDACTED&part=2"]
    }
    secret = "https://al:hunter2@example.org/d?token=s3cr3t&shard=1"
    run_glm(args(shards_dir, tmp_path, "train.max_steps=2", "logging.wandb=true", f"logging.tags=['{secret}']"))
    meta = (tmp_path / "checkpoints/step_00000002/meta.json").read_text()
    assert "REDACTED@example.org" in meta and "shard=1" in meta
    leaked = [
        p for p in tmp_path.rglob("*") if p.is_file() and any(s in p.read_bytes() for s in (b"hunter2", b"s3cr3t"))
    ]
    assert not leaked, leaked
