"""The third fault trial of glm's command line (docs/reliability.md): what broke, fixed, and kept fixed.

Checkpoints are the compat fixtures (tests/fixtures/compat: a one-layer model of each family, 2 steps),
so no test trains; a full disk is a real tmpfs (root only, as CI runs)."""

from __future__ import annotations

import argparse
import errno
import io
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from data_pipeline.writers.shards import ShardSetWriter
from glm_common.errors import disk_full
from glm_dist.commands.generate import add_arguments, check_options
from glm_dist.errors import GlmError
from glm_dist.eval.stream import generate_to
from glm_dist.hf.export import export_checkpoint
from tests.conftest import ROOT, clean_env, run_glm

COMPAT = ROOT / "tests/fixtures/compat"
GPT = str(COMPAT / "gpt/step_00000002")
BERT = str(COMPAT / "bert/step_00000002")


@pytest.fixture
def full_disk(tmp_path):
    """A 12 KiB tmpfs: room for a config file, not for a model's weights or a shard."""
    path = tmp_path / "full"
    path.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(path)], capture_output=True
        ).returncode
    ):
        pytest.skip("needs root to mount a tmpfs (CI runs as root)")
    yield path
    subprocess.run(["umount", str(path)], capture_output=True)


def test_export_hf_onto_a_file_is_refused_and_the_file_kept(tmp_path):
    # was: exit 0 and the path printed, transformers' warning, nothing written
    target = tmp_path / "model"
    target.write_text("mine")
    with pytest.raises(GlmError, match="is a file; give a folder"):
        export_checkpoint(GPT, target)
    assert target.read_text() == "mine"


def test_an_exported_folder_is_readable_by_whoever_can_read_a_new_file(tmp_path):
    # was: model.safetensors 0600 (as safetensors writes it), config and tokenizer 0644
    umask = os.umask(0o022)
    try:
        out = export_checkpoint(GPT, tmp_path / "hf")
    finally:
        os.umask(umask)
    modes = {path.name: path.stat().st_mode & 0o777 for path in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


def test_an_export_over_an_earlier_one_leaves_none_of_its_weight_files(tmp_path):
    # was: files of the same name replaced, the rest kept -- an earlier sharded export's index and shards
    # beside the new model.safetensors (or an earlier model.safetensors, which transformers reads first)
    out = tmp_path / "hf"
    out.mkdir()
    stale = ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "pytorch_model.bin"]
    for name in [*stale, "README.md"]:
        (out / name).write_text("earlier")
    export_checkpoint(GPT, out)
    assert not any((out / name).exists() for name in stale)
    assert (out / "README.md").read_text() == "earlier" and (out / "model.safetensors").stat().st_size > 1000


def test_export_hf_on_a_full_disk_is_one_line_and_leaves_no_half_folder(full_disk):
    # was: an internal error (SafetensorError) and config.json left without weights
    proc = subprocess.run(
        [sys.executable, "-m", "glm_dist.cli", "export-hf", "--checkpoint", GPT, "--out", str(full_disk / "hf")],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("glm ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("glm export-hf: error: the disk is full (")
    assert list(full_disk.iterdir()) == []


def test_a_shard_writer_aborted_on_a_full_disk_leaves_no_temporary_file(full_disk):
    # was: abort() re-raised ENOSPC from close() before unlinking NAME.tmp.PID (a rerun then found the
    # disk still full), and the other split's writer was never aborted ("Exception ignored" traceback)
    writer = ShardSetWriter(str(full_disk), "train", max_bytes=1 << 20)
    tokens = np.arange(4096, dtype=np.uint16)
    with pytest.raises(OSError) as err:
        for i in range(16):
            writer.write(f"doc{i}", tokens, {"id": i, "n_bytes": 8192})
        writer.close()
    assert disk_full(err.value) and err.value.errno == errno.ENOSPC
    writer.abort()  # does not raise
    assert list(full_disk.iterdir()) == []


def _options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--checkpoint", GPT, "--prompt", "x", *argv])


@pytest.mark.parametrize(
    "argv",
    [
        ("--max-new-tokens", "-3"),  # was: exit 0, nothing written
        ("--temperature", "0"),  # was: internal error, probability tensor contains inf
        ("--top-p", "0"),  # was: the same
        ("--top-k", "-5"),  # was: internal error, selected index k out of range
        ("--num-beams", "0"),  # was: internal error in index_select
    ],
)
def test_generation_options_out_of_range_are_one_line_naming_the_option(argv):
    with pytest.raises(GlmError, match=f"^{argv[0]} .* must be "):
        check_options(_options(*argv))


def test_generate_refuses_a_family_that_does_not_generate_and_a_prompt_longer_than_the_context():
    with pytest.raises(GlmError, match="is a bert model, which does not generate text .*gpt, gpt1, t5, bart"):
        generate_to(io.StringIO(), BERT, "def f")  # was: internal TypeError in embedding()
    with pytest.raises(GlmError, match="--prompt is .* tokens; this model reads at most 15 .*shorten it"):
        generate_to(io.StringIO(), GPT, "x " * 64)  # was: internal ValueError from the model's forward


def test_an_empty_prompt_samples_unconditionally_from_end_of_text():
    # was: internal error (an empty float tensor of ids); GPT-2's unconditional samples start from <|endoftext|>
    out = io.StringIO()
    text = generate_to(out, GPT, "", max_new_tokens=4)
    assert out.getvalue() == text + "\n" and text


def test_a_tokenizer_json_that_is_not_one_is_one_line_naming_the_file_and_the_fix(tmp_path):
    # was: an internal error (tokenizers' bare Exception "expected ident at line 1 column 2")
    from data_pipeline.tokenize.prepare import _load_tokenizer
    from glm_dist.data.loader import read_tokenizer

    (tmp_path / "tokenizer.json").write_text("not json at all")
    with pytest.raises(GlmError, match=r"tokenizer.json is not a tokenizer.json \(.*\); rebuild the shard set"):
        read_tokenizer(str(tmp_path), {"tokenizer": {"file": "tokenizer.json"}})
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(GlmError, match=r"data.tokenizer='.*binary.json' is not a tokenizer.json \('utf-8' codec"):
        _load_tokenizer(str(tmp_path / "binary.json"))


def test_ctrl_c_on_glm_launch_stops_the_workers_and_is_one_line_not_an_internal_error(tmp_path):
    """And the save in flight (one every step) finishes or is removed: no half-written save stays.
    was: "glm launch: internal error: SignalException: Process N got signal: 2" (exit 1, a crash file);
    the interrupted save's .tmp-step_N.<run> folder left behind after its "writing in the background" line."""
    from tests.conftest import FAST, TINY

    argv = ["launch", "--nproc-per-node", "1", "train", "-c", TINY, *FAST, f"train.out_dir={tmp_path}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "glm_dist.cli", *argv, "train.max_steps=100000", "train.save_interval=1"],
        cwd=ROOT,
        env=clean_env() | {"GLM_CRASH_DIR": str(tmp_path / "crashes")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stderr:  # the worker is training and saving
            if "writing in the background" in line:
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert "glm train: interrupted" in err and err.strip().endswith(
        "glm launch: stopped by SIGINT; the workers got it too (their last lines say where they were)"
    )
    assert not (tmp_path / "crashes").exists() and not (tmp_path / ".glm.lock").exists()
    saves = tmp_path / "checkpoints"
    assert not list(saves.glob(".tmp-*")), sorted(p.name for p in saves.iterdir())
    assert re.search(r"checkpoint: \S+/step_\d{8} finished before stopping|the save of step_\d{8} was abandoned", err)
    assert all((step / "meta.json").exists() for step in saves.glob("step_*"))


def test_sigterm_to_glm_launch_is_a_stop_request_checkpointed_and_requeueable(tmp_path):
    # was: torchrun's own SIGTERM handling -- the workers terminated (SIGKILL after 30 s, mid-save if the
    # save is slow), "glm launch: stopped by SIGTERM" and exit 143, which slurm/train.sbatch does not requeue
    from tests.conftest import FAST, TINY

    argv = ["launch", "--nproc-per-node", "1", "train", "-c", TINY, *FAST, f"train.out_dir={tmp_path}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "glm_dist.cli", *argv, "train.max_steps=100000"],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stderr:  # the worker is training
            if "validation loss" in line:
                break
        proc.send_signal(signal.SIGTERM)  # to the launcher only, as a scheduler's kill of the job step does
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 75, err[-2000:]
    stopped = int(re.search(r"stop signal \(SIGTERM\) at step (\d+)", err).group(1))
    assert (tmp_path / f"checkpoints/step_{stopped:08d}/meta.json").exists()


def test_a_mixture_weight_written_5e_1_is_the_number_it_is(tmp_path):
    # was: "data.mixture[0].weight = '5e-1' must be a number > 0" (YAML 1.1 reads it as a string;
    # train.lr: 3e-3 was accepted)
    from glm_dist.config.loader import load_config
    from glm_dist.config.mixture import mixture_sources

    config = tmp_path / "mix.yaml"
    config.write_text(
        "data:\n  mixture:\n"
        "    - {name: a, shards_dir: a, weight: 5e-1}\n"
        "    - {name: b, shards_dir: b, weight: 2.5e-1}\n"
        "    - {name: c, shards_dir: c, weight: 25e-2}\n"
    )
    assert [s.weight for s in mixture_sources(load_config(str(config)).data)] == [0.5, 0.25, 0.25]
    config.write_text(config.read_text().replace("25e-2", "nan"))
    with pytest.raises(GlmError, match=r"data.mixture\[2\].weight = nan \('c'\) must be a number > 0"):
        load_config(str(config))


def test_a_folder_given_where_a_file_belongs_is_one_line_with_exit_code_2(tmp_path):
    # was: glm finetune --train DIR ended in an internal IsADirectoryError
    proc = run_glm(["finetune", "--checkpoint", GPT, "--train", str(tmp_path)], check=False, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0] == f"glm finetune: error: [Errno 21] Is a directory: '{tmp_path}'"


@pytest.mark.parametrize(
    "argv, line",
    [
        # was: exit 0 and an empty table headed "0 GPUs x 80 GB" / "8 GPUs x 0 GB"
        (["plan", "--gpus", "0"], "glm plan: error: --gpus 0 must be >= 1"),
        (["plan", "--gpus", "8", "--gpu-mem", "0"], "glm plan: error: --gpu-mem 0.0 must be a number of GB > 0"),
        # was: exit 0, all held-out documents but the last 3 scored (a Python slice)
        (["eval", "--checkpoint", GPT, "--documents", "-3"], "glm eval: error: --documents -3 must be >= 0"),
    ],
)
def test_counts_no_cluster_or_evaluation_can_have_are_refused_in_one_line(argv, line):
    from tests.conftest import TINY

    proc = subprocess.run(
        [sys.executable, "-m", "glm_dist.cli", argv[0], "-c", TINY, *argv[1:]],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == line, proc.stderr[-2000:]
