"""What a user sees when glm fails: their mistake in one line (exit 2), our bug in one line plus the
path of its full traceback (exit 1) -- never a bare traceback on the terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, clean_env

BUG = r"""
import sys
import glm_dist.cli as cli

def dispatch(argv):
    return {}["no such key"]  # a bug deep in a command
cli._dispatch = dispatch
sys.exit(cli.main(["config", "show"]))
"""


def test_an_unexpected_error_is_one_line_and_its_traceback_goes_to_a_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", BUG],
        cwd=ROOT,
        env=clean_env() | {"GLM_CRASH_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("glm config show: internal error: KeyError: 'no such key' at <string>:")
    log = Path(lines[0].split("full traceback in ")[1].split(" (please report it)")[0])
    assert log.parent == tmp_path and "Traceback (most recent call last)" in log.read_text()
    assert 'return {}["no such key"]' in log.read_text() or "dispatch" in log.read_text()


def test_a_users_mistake_is_one_line_with_exit_code_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "glm_dist.cli", "train", "-c", str(tmp_path)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("glm train: error: "), proc.stderr
    assert str(tmp_path) in lines[0] and "Traceback" not in proc.stderr


def test_glm_launch_refuses_a_layout_before_any_worker_starts():
    from tests.conftest import TINY

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "launch",
            "--nproc-per-node",
            "2",
            "train",
            "-c",
            TINY,
            "parallel.tensor_parallel=3",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "glm launch: error: world size 2 is not divisible" in proc.stderr and "tensor_parallel 3" in proc.stderr
    assert "torch.distributed" not in proc.stderr and "Traceback" not in proc.stderr  # no worker ran


def test_checkpoint_locations_given_on_the_command_line_are_checked_like_config_keys(tmp_path):
    for argv in (
        ["export-hf", "--checkpoint", "ssh://host/ckpt", "--out", str(tmp_path / "hf")],
        ["finetune", "--checkpoint", "reference::s3://b/ckpt", "--train", str(tmp_path / "rows.jsonl")],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "glm_dist.cli", *argv],
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2 and "is not allowed; use a path or a file://" in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
