"""Launching for real: a two-node SLURM cluster on this machine, preemption and requeue, torchrun
via ``glm launch``, the DeepSpeed launcher, ``accelerate launch``, and the W&B offline run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAST, ROOT, TINY, clean_env, job_info, run_glm, train_losses
from tests.wandb_records import read_run

pytestmark = pytest.mark.slow


def overrides(shards_dir: str, out_dir: Path, *extra: str) -> list[str]:
    return [*FAST, f"data.shards_dir={shards_dir}", f"train.out_dir={out_dir}", *extra]


# -- SLURM --------------------------------------------------------------------------------------
def sbatch(args: list[str], cwd: Path) -> str:
    env = clean_env(threads=1) | {"GLM_VENV": sys.prefix, "GLM_PROCS_PER_NODE": "1"}  # CPU processes, on purpose
    proc = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def wait_for(job: str, log: Path, *, restarts: int = 0, timeout: float = 400) -> dict[str, str]:
    """Wait until the job ends. A requeued job waits out the credential lifetime (5 s on the
    local cluster, ``AuthInfo=cred_expire``) and runs again by itself; its requeue shows CANCELLED for
    a moment before the job is PENDING again, so an end is confirmed 3 s later -- unless it is the
    COMPLETED run after the ``restarts`` requeues the caller expects, which is final."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = job_info(job)
        state = info.get("JobState", "")
        if state == "COMPLETED" and int(info.get("Restarts", 0)) >= restarts:
            return info
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            time.sleep(3)
            again = job_info(job)
            if again.get("JobState") == state:
                return again
            continue
        time.sleep(0.5)
    subprocess.run(["scancel", job])
    pytest.fail(f"job {job} did not finish in {timeout}s; log:\n{log.read_text() if log.exists() else '(none)'}")


# Long enough that a signal sent after step 8 always lands mid-run: 72 steps left, 4-9 s at the
# 60-120 ms a step takes on an idle to a busy machine, where SLURM delivered the signal within a step.
SLURM_RUN = ["train.max_steps=80", "train.save_interval=20", "parallel.zero_stage=2", "logging.wandb=true"]


@pytest.fixture(scope="module")
def two_node_run(slurm_cluster, shards_dir, tmp_path_factory):
    """`sbatch -N 2 slurm/train.sbatch CONFIG ...`: two SLURM nodes, one torchrun each, c10d rendezvous."""
    work = tmp_path_factory.mktemp("slurm-2node")
    log = work / "job.out"
    job = sbatch(
        [
            "-N",
            "2",
            f"--output={log}",
            str(ROOT / "slurm/train.sbatch"),
            TINY,
            *overrides(shards_dir, work / "run", *SLURM_RUN),
        ],
        cwd=work,
    )
    info = wait_for(job, log)
    return job, info, log, work / "run"


def test_two_node_sbatch_job_trains_and_checkpoints(two_node_run):
    job, info, log, out = two_node_run
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert "2 nodes x 1 processes, rendezvous node1:" in text
    assert "world size 2, ZeRO-2" in text
    losses = train_losses(out)
    assert len(losses) == 80 and losses[-1] < losses[0]
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == [
        "step_00000040",
        "step_00000060",
        "step_00000080",
    ]  # keep_last=3 rotated 20 away


def test_preempted_job_checkpoints_requeues_and_resumes_with_the_same_losses(two_node_run, shards_dir, tmp_path):
    _, _, _, reference = two_node_run
    log, out = tmp_path / "job.out", tmp_path / "run"
    job = sbatch(
        ["-N", "2", f"--output={log}", str(ROOT / "slurm/train.sbatch"), TINY, *overrides(shards_dir, out, *SLURM_RUN)],
        cwd=tmp_path,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 9):  # validation + >= 8 steps
        assert time.time() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.1)
    # What SLURM does at --signal time or on preemption: SIGUSR1 to every process of the job's steps.
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    info = wait_for(job, log, restarts=1)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", text[-4000:]
    assert "preempted: checkpoint written, requeueing job" in text
    stopped_at = int(text.split("stop signal (SIGUSR1) at step ")[1].split(":")[0])
    assert 8 <= stopped_at < 80
    assert f"resumed from {out}/checkpoints/step_{stopped_at:08d} at step {stopped_at}" in text
    assert train_losses(out) == train_losses(reference)  # the same trajectory as the uninterrupted job
    run_id = (out / "wandb_run_id").read_text().strip()
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)  # one W&B run, resumed


# -- single-node launchers ------------------------------------------------------------------------
def test_glm_launch_runs_torchrun_standalone_with_two_processes(shards_dir, tmp_path):
    proc = run_glm(
        ["launch", "--nproc-per-node", "2", "train", "-c", TINY, *overrides(shards_dir, tmp_path, "train.max_steps=6")]
    )
    assert "world size 2" in proc.stderr
    assert len(train_losses(tmp_path)) == 6


def test_glm_launch_passes_a_signal_on_and_exits_75_after_a_checkpoint(shards_dir, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "glm_dist.cli",
        "launch",
        "--nproc-per-node",
        "2",
        "train",
        "-c",
        TINY,
        *overrides(shards_dir, tmp_path, "train.max_steps=400"),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=clean_env(1),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 4):
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGUSR1)  # to the launcher only: it passes the signal on to its workers
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    steps = len(train_losses(tmp_path))
    assert 3 <= steps < 400
    assert (tmp_path / f"checkpoints/step_{steps:08d}/meta.json").exists()


def test_deepspeed_launcher_with_a_localhost_hostfile(shards_dir, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    cmd = [
        str(Path(sys.prefix) / "bin/deepspeed"),
        f"--hostfile={hostfile}",
        "--no_ssh_check",
        "--master_addr=127.0.0.1",
        "--master_port=29631",
        "--module",
        "glm_dist.cli",
        "train",
        "-c",
        TINY,
        *overrides(shards_dir, tmp_path / "run", "train.max_steps=6"),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(1), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "world size 2" in proc.stdout + proc.stderr
    assert len(train_losses(tmp_path / "run")) == 6


def accelerate(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [
        str(Path(sys.prefix) / "bin/accelerate"),
        "launch",
        "--config_file",
        str(ROOT / "launch/accelerate-deepspeed.yaml"),
        "--main_process_port=29641",
        "-m",
        "glm_dist.cli",
        *args,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=clean_env(1), capture_output=True, text=True, timeout=300)


def test_accelerate_launch_with_the_deepspeed_plugin(shards_dir, tmp_path):
    proc = accelerate(
        ["train", "-c", TINY, *overrides(shards_dir, tmp_path, "train.max_steps=6", "parallel.zero_stage=2")]
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "world size 2, ZeRO-2" in proc.stderr
    assert len(train_losses(tmp_path)) == 6
    # The plugin says ZeRO-2; a config that says ZeRO-3 is refused before training starts.
    proc = accelerate(["train", "-c", TINY, *overrides(shards_dir, tmp_path / "x", "parallel.zero_stage=3")])
    assert proc.returncode != 0
    assert "accelerate's DeepSpeed plugin has zero_stage=2 but the config gives 3" in proc.stderr


# -- W&B --------------------------------------------------------------------------------------------
def test_wandb_offline_run_holds_the_metrics_config_and_manifest(shards_dir, tmp_path):
    run_glm(
        [
            "train",
            "-c",
            TINY,
            *overrides(
                shards_dir,
                tmp_path,
                "train.max_steps=12",
                "logging.wandb=true",
                "logging.log_interval=4",
                "train.eval_interval=6",
                "logging.project=glm-test",
                "logging.tags=[ci, tiny]",
            ),
        ],
        env={"GLM_PEAK_TFLOPS": ""},  # unset: the run measures its CPU's matmul peak
    )
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    run = read_run(run_file)
    keys = set().union(*run["history"])
    for key in (
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/tokens_per_s",
        "train/mfu",
        "train/tokens",
        "train/epoch",
        "val/loss",
        "val/perplexity",
        "val/bits_per_byte",
    ):
        assert key in keys, key
    train_rows = [h for h in run["history"] if "train/loss" in h]
    assert [h["_step"] for h in train_rows] == [4, 8, 12]
    assert 0 < train_rows[-1]["train/mfu"] < 1
    assert run["config"]["train"]["max_steps"] == 12 and run["config"]["model"]["n_layer"] == 2
    assert "data_manifest.json" in run["files"]
    assert json.loads((tmp_path / "data_manifest.json").read_text())["tokenizer"]["vocab_size"] == 2048


def test_tokenization_as_a_slurm_array_matches_the_local_run(slurm_cluster, corpus, tmp_path):
    import filecmp
    import gzip

    from data_pipeline.tokenize.prepare import prepare_shards

    src = tmp_path / "src"
    src.mkdir()
    docs = gzip.decompress(Path(corpus).read_bytes()).decode().splitlines()
    for i in range(3):
        (src / f"part-{i}.jsonl").write_text("\n".join(docs[i::3]) + "\n")
    data = [f"data.source={src}/part-*.jsonl", "data.vocab_size=1000", "data.shard_max_bytes=65536"]
    local = prepare_shards(
        source=f"{src}/part-*.jsonl", out_dir=str(tmp_path / "local"), vocab_size=1000, shard_max_bytes=65536
    )
    env = clean_env(threads=1) | {"GLM_VENV": sys.prefix}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "slurm",
            "submit-data",
            "-c",
            TINY,
            *data,
            f"data.shards_dir={tmp_path / 'slurm'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    array_job, merge_job = proc.stdout.split()
    log = tmp_path / "slurm-logs"
    info = wait_for(merge_job, log / "merge.out")
    assert info["JobState"] == "COMPLETED", "\n".join(p.read_text() for p in log.glob("*.out"))
    assert len(list(log.glob(f"glm-data-{array_job}_*.out"))) == 3  # one log per array task
    manifest = read_manifest_json(tmp_path / "slurm")
    assert manifest["splits"] == local["splits"]
    for info in local["splits"]["train"] + local["splits"]["validation"]:
        assert filecmp.cmp(tmp_path / "local" / info["name"], tmp_path / "slurm" / info["name"], shallow=False)


def read_manifest_json(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())
