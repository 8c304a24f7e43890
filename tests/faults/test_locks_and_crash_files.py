"""One writer per output folder, private crash files, and credentials kept out of every log, crash
file, W&B summary and cache metadata (issue 29, second trial)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from glm_common import outlock
from tests.conftest import FAST, ROOT, TINY, clean_env

HOLD = """
import sys, time
from glm_common.outlock import output_lock
with output_lock(sys.argv[1], command="glm train", key="train.out_dir"):
    print("held", flush=True)
    time.sleep(600)
"""


def glm(*args: str, env: dict | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "glm_dist.cli", *args],
        cwd=ROOT,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def glm_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("glm ")]


@pytest.fixture
def holder(tmp_path):
    """A live process holding the lock of a folder (as a running ``glm train`` does)."""
    folder = tmp_path / "busy"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    yield folder, proc
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def plant_lock(folder: Path, **fields) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / outlock.LOCK_NAME
    path.write_text(json.dumps({**outlock._identity("glm train", "planted"), **fields}))
    return path


# -- one writer per output folder ---------------------------------------------------------------
def test_a_second_glm_train_on_a_busy_out_dir_prints_one_line_and_exits_2(holder):
    folder, proc = holder
    run = glm("train", "-c", TINY, *FAST, f"train.out_dir={folder}", "train.max_steps=1")
    assert run.returncode == 2, run.stderr[-3000:]
    lines = glm_lines(run.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        f"glm train: error: train.out_dir {folder} is in use by glm train (pid {proc.pid} on this host, started "
    ), run.stderr[-3000:]
    assert "Traceback" not in run.stderr and os.listdir(folder) == [outlock.LOCK_NAME]  # nothing written
    assert proc.poll() is None and json.loads((folder / outlock.LOCK_NAME).read_text())["pid"] == proc.pid


def test_every_rank_of_a_refused_torchrun_exits_and_only_rank_0_says_why(holder):
    folder, _ = holder
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "glm_dist.cli",
        "train",
        "-c",
        TINY,
        *FAST,
        f"train.out_dir={folder}",
        "train.max_steps=1",
    ]
    run = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=240)
    assert run.returncode != 0 and "exitcode  : 2" in run.stderr, run.stderr[-3000:]  # no rank hangs
    lines = [line for line in run.stderr.splitlines() if "glm train: error:" in line]
    assert len(lines) == 1 and f"train.out_dir {folder} is in use by glm train" in lines[0], run.stderr[-3000:]


@pytest.mark.parametrize(
    "argv",
    [
        ["data", "run", "-c", "configs/data/fineweb.yaml", "output={folder}"],
        ["data", "tokenize", "-c", TINY, "data.shards_dir={folder}"],
        ["data", "index", "{folder}"],
    ],
    ids=["run", "tokenize", "index"],
)
def test_data_commands_refuse_an_output_folder_another_process_writes(holder, argv):
    folder, proc = holder
    run = glm(*[a.format(folder=folder) for a in argv])
    lines = glm_lines(run.stderr)
    assert run.returncode == 2 and len(lines) == 1, run.stderr[-3000:]
    assert f"{folder} is in use by glm train (pid {proc.pid} on this host" in lines[0]
    assert os.listdir(folder) == [outlock.LOCK_NAME]


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_line_and_released_on_error(tmp_path):
    folder = tmp_path / "shards"
    pid = dead_pid()
    plant_lock(folder, pid=pid, command="glm data index")
    run = glm("data", "index", str(folder))  # no manifest: fails after taking the lock
    assert run.returncode == 2, run.stderr[-3000:]
    lines = glm_lines(run.stderr)
    assert lines[0].startswith(
        f"glm data index: taking over the lock of DIR {folder}: it was left by glm data index (pid {pid} on this host"
    ) and lines[0].endswith("which is no longer running")
    assert lines[1].startswith("glm data index: error: ") and len(lines) == 2
    assert not (folder / outlock.LOCK_NAME).exists()


def test_a_lock_whose_pid_was_reused_or_whose_host_restarted_is_stale_and_another_hosts_is_not(tmp_path):
    me = outlock._identity("glm train", "x")
    assert outlock.stale_reason(me) is None  # this very process: alive
    assert outlock.stale_reason({**me, "pid_start": me["pid_start"] + 1}) == "whose pid now belongs to another process"
    assert outlock.stale_reason({**me, "boot_id": "another-boot"}) == "and this host has restarted since"
    assert outlock.stale_reason({**me, "pid": dead_pid()}) == "which is no longer running"
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exited, not yet reaped
    while outlock._proc_stat(zombie.pid)[0] != "Z":
        time.sleep(0.05)
    assert (
        outlock.stale_reason({**me, "pid": zombie.pid, "pid_start": outlock._proc_stat(zombie.pid)[1]})
        == "which is no longer running"
    )
    zombie.wait()
    other = plant_lock(tmp_path / "run", host="node-elsewhere", pid=dead_pid())
    with pytest.raises(outlock.FolderLocked) as err:
        outlock.acquire(tmp_path / "run", command="glm train", key="train.out_dir")
    assert "cannot be checked from" in str(err.value) and f"delete {other} and rerun" in str(err.value)


def test_two_processes_racing_for_a_stale_lock_end_with_one_holder(tmp_path):
    folder = tmp_path / "run"
    plant_lock(folder, pid=dead_pid())
    race = (
        "import sys, time\nfrom glm_common.outlock import acquire, FolderLocked\n"
        "try:\n    acquire(sys.argv[1], command='glm train', key='k', announce=lambda s: None)\n"
        "    print('got', flush=True); time.sleep(3)\nexcept FolderLocked:\n    print('refused', flush=True)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", race, str(folder)], cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outcomes = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outcomes == ["got", "refused", "refused", "refused"]


def test_the_lock_is_released_on_sigterm(tmp_path):
    folder = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held" and (folder / outlock.LOCK_NAME).exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # it still dies of the signal
    assert not (folder / outlock.LOCK_NAME).exists()


# -- crash files ---------------------------------------------------------------------------------
BUG = r"""
import os, sys, tempfile, time
import glm_dist.cli as cli

victim = sys.argv[1]
for ahead in range(5):  # an attacker's links at the names the crash file used to get
    stamp = time.strftime('%Y%m%d-%H%M%S', time.localtime(time.time() + ahead))
    for folder in {tempfile.gettempdir(), os.environ.get("GLM_CRASH_DIR") or tempfile.gettempdir()}:
        try:
            os.symlink(victim, os.path.join(folder, f"glm-config-{stamp}-{os.getpid()}.log"))
        except OSError:
            pass

def dispatch(argv):
    raise RuntimeError("cannot read https://alice:hunter2@example.com/x.tar?sig=s3cr3t&part=1")
cli._dispatch = dispatch
sys.exit(cli.main(["config", "show"]))
"""


def crash(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    tmp = tmp_path / "tmp"  # the planted links land here, never in the machine's /tmp
    tmp.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", BUG, str(victim)],
        cwd=ROOT,
        env=clean_env() | {"TMPDIR": str(tmp)} | env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert victim.read_text() == "precious\n"
    path = Path(lines[0].split("full traceback in ")[1].split(" (")[0])
    return proc, path


def assert_private(path: Path) -> None:
    info = os.lstat(path)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert "Traceback (most recent call last)" in path.read_text()


def test_a_link_planted_at_a_crash_files_name_is_never_followed(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc, path = crash(tmp_path, TMPDIR=str(tmp))
    assert path.parent == tmp / f"glm-crash-{os.getuid()}" and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert_private(path)


def test_a_planted_per_user_crash_folder_is_not_used(tmp_path):
    tmp, attacker = tmp_path / "tmp", tmp_path / "attacker"
    tmp.mkdir()
    attacker.mkdir(mode=0o777)
    (tmp / f"glm-crash-{os.getuid()}").symlink_to(attacker)
    proc, path = crash(tmp_path, TMPDIR=str(tmp))
    assert list(attacker.iterdir()) == [] and path.parent.parent == tmp
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert_private(path)


def test_an_unwritable_crash_dir_falls_back_and_says_so_in_the_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc, path = crash(tmp_path, GLM_CRASH_DIR=str(blocker / "crashes"), TMPDIR=str(tmp))
    assert f"(not written to GLM_CRASH_DIR {blocker / 'crashes'}: " in proc.stderr and path.parent.parent == tmp
    assert "Traceback" not in proc.stderr
    assert_private(path)


def test_credentials_are_redacted_in_the_crash_file_and_its_line(tmp_path):
    proc, path = crash(tmp_path, GLM_CRASH_DIR=str(tmp_path / "crashes"))
    assert path.parent == tmp_path / "crashes"
    for text in (proc.stderr, path.read_text()):
        assert "hunter2" not in text and "s3cr3t" not in text
        assert "https://REDACTED@example.com/x.tar?sig=REDACTED&part=1" in text


# -- credentials ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, clean",
    [
        ("https://alice:hunter2@host/p.tar", "https://REDACTED@host/p.tar"),
        ("s3://AKIA:pa@ss@bucket/k", "s3://REDACTED@bucket/k"),
        *[
            (f"https://host/p?x=1&{name}=hunter2#f", f"https://host/p?x=1&{name}=REDACTED#f")
            for name in (
                "pwd",
                "passwd",
                "password",
                "secret",
                "key",
                "token",
                "auth",
                "sig",
                "api_key",
                "X-Amz-Signature",
            )
        ],
        ("simplecache::https://u:hunter2@host/a?token=hunter2", "simplecache::https://REDACTED@host/a?token=REDACTED"),
        ("Authorization: Bearer eyJhbGciOi.hunter2.sig", "Authorization: Bearer REDACTED"),
        ('{"authorization": "Basic aHVudGVyMg=="}', '{"authorization": "Basic REDACTED"}'),
        ("curl -H 'bearer hunter2hunter2'", "curl -H 'bearer REDACTED'"),
    ],
)
def test_each_credential_form_is_redacted(raw, clean):
    from glm_dist.observability.redact import redact_text

    assert redact_text(raw) == clean


def test_secret_named_keys_of_a_mapping_are_hidden_and_other_keys_kept():
    from glm_dist.observability.redact import redact

    options = {
        "s3": {"key": "AKIA", "secret": "hunter2", "token": "t", "endpoint_url": "http://u:p@minio:9000"},
        "headers": {"Authorization": "Bearer hunter2hunter2"},
        "tokenizer": "gpt2",
        "stop_signals": ["SIGTERM"],
    }
    assert redact(options) == {
        "s3": {
            "key": "REDACTED",
            "secret": "REDACTED",
            "token": "REDACTED",
            "endpoint_url": "http://REDACTED@minio:9000",
        },
        "headers": {"Authorization": "REDACTED"},
        "tokenizer": "gpt2",
        "stop_signals": ["SIGTERM"],
    }


LOGS = r"""
import logging, sys, warnings
import glm_dist.cli as cli

def dispatch(argv):
    logging.getLogger("glm_dist.data.reader").warning(
        "%s: %s; retry %d of %d", "https://alice:hunter2@host/shard-0.tar?pwd=s3cr3t", "HTTP 503", 1, 3)
    warnings.warn("fetching https://host/x?token=t0ken with Authorization: Bearer b3arerb3arer")
    raise FileNotFoundError("https://alice:hunter2@host/shard-1.tar is missing")
cli._dispatch = dispatch
sys.exit(cli.main(["config", "show"]))
"""


def test_log_records_warnings_and_error_lines_carry_no_credentials():
    proc = subprocess.run(
        [sys.executable, "-c", LOGS], cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    for secret in ("hunter2", "s3cr3t", "t0ken", "b3arerb3arer"):
        assert secret not in proc.stderr, proc.stderr
    assert "https://REDACTED@host/shard-0.tar?pwd=REDACTED: HTTP 503; retry 1 of 3" in proc.stderr
    assert "Authorization: Bearer REDACTED" in proc.stderr
    assert "glm config show: error: https://REDACTED@host/shard-1.tar is missing" in proc.stderr


def test_the_wandb_summary_is_redacted():
    from glm_dist.config.loader import load_config
    from glm_dist.observability.run_logger import RunLogger

    class Run:
        def __init__(self):
            self.summary = {}

        def finish(self):
            pass

    log = RunLogger(load_config(TINY), is_main=False, start_step=0)
    log.wandb_run = Run()
    log.close({"data": "https://alice:hunter2@host/s?sig=abc", "loss": 1.5})
    assert log.wandb_run.summary == {"data": "https://REDACTED@host/s?sig=REDACTED", "loss": 1.5}


def test_fsspec_cache_metadata_keeps_no_credentials(tmp_path):
    import fsspec

    from glm_dist.observability.redact import redact_process_output

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "shard.bin").write_bytes(b"x" * 1000)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "site"))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    redact_process_output()
    try:
        url = f"http://alice:hunter2@127.0.0.1:{server.server_address[1]}/shard.bin?sig=s3cr3t&pwd=pw0rd"
        with fsspec.open(f"filecache::{url}", "rb", filecache={"cache_storage": str(tmp_path / "cache")}) as f:
            assert f.read() == b"x" * 1000
    finally:
        server.shutdown()
    metadata = (tmp_path / "cache" / "cache").read_text()
    assert "127.0.0.1" in metadata and "REDACTED" in metadata
    for secret in ("hunter2", "s3cr3t", "pw0rd"):
        assert secret not in metadata
