"""Shared fixtures: the embedded corpus tokenized once per session, and a ``glm`` runner."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_pipeline.embedded import embedded_documents
from data_pipeline.tokenize.prepare import prepare_shards

ROOT = Path(__file__).resolve().parents[1]
# MFU's denominator given rather than measured (about a 2-core CPU's fp32 rate): a run's main rank
# otherwise times matmuls for up to 2 s as it starts (observability/flops.py), in each of the suite's
# few hundred runs, in process or not (clean_env copies it). The W&B test measures it end to end.
os.environ.setdefault("GLM_PEAK_TFLOPS", "0.1")
TINY = str(ROOT / "configs/experiments/gpt2-tiny-cpu.yaml")

# A smaller tiny model and short runs: fast enough for many multi-process tests on 2 cores.
FAST = [
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=4",
    "data.seq_len=64",
    "train.micro_batch_size=4",
    "train.warmup_steps=2",
    "train.eval_batches=4",
    "train.eval_interval=0",
    "train.save_interval=0",
    "train.plot=false",
    "logging.wandb=false",
    "logging.progress=false",
    "train.precision=fp32",
    "parallel.zero_stage=0",
    "train.lr=3e-3",
]


@pytest.fixture(scope="session")
def shards_dir(tmp_path_factory) -> str:
    """The embedded pydoc corpus as token shards (small shards, so there are several)."""
    out = tmp_path_factory.mktemp("shards") / "embedded"
    prepare_shards(source="embedded", out_dir=str(out), vocab_size=2048, shard_max_bytes=256 * 1024)
    return str(out)


N_DOCS = 500  # the corpus of the objective and shard tests: the first pydoc documents


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for doc in list(embedded_documents())[:N_DOCS]:
            f.write(json.dumps(doc) + "\n")
    return str(path)


@pytest.fixture(scope="session")
def shards(corpus, tmp_path_factory):
    """profile -> shard set (built once per session)."""
    built = {}

    def get(profile: str) -> str:
        if profile not in built:
            out = tmp_path_factory.mktemp(f"shards-{profile}")
            prepare_shards(
                source=corpus, out_dir=str(out), profile=profile, vocab_size=3000, shard_max_bytes=128 * 1024, workers=1
            )
            built[profile] = str(out)
        return built[profile]

    return get


@pytest.fixture(scope="session")
def docstring_task(tmp_path_factory) -> str:
    """The built-in fine-tuning task (docstring -> module) as ``glm data docstring-task`` writes it, once
    for the tests that fine-tune on it (read only)."""
    out = tmp_path_factory.mktemp("docstring-task") / "task.jsonl"
    run_glm(["data", "docstring-task", "--out", str(out)])
    return str(out)


@pytest.fixture(scope="session")
def glove_text(corpus, tmp_path_factory) -> str:
    """GloVe text vectors (50-d, as the tiny GloVe) of the 500-document corpus: counts (window 10), then
    five passes of AdaGrad (lr 0.05) over them with the glove objective's weighted squares, in this
    process -- real vectors, in seconds."""
    import numpy as np
    import torch
    from tokenizers import Tokenizer

    from data_pipeline.cooccur.counts import CooccurSpec, prepare_cooccurrence
    from data_pipeline.cooccur.vectors import write_text
    from data_pipeline.tokenize.word import vocabulary
    from glm_dist.data.shards import read_manifest, read_shard
    from glm_dist.families.glove.model import GloVe, glove_config
    from glm_dist.objectives.glove import weighted_squares

    root = tmp_path_factory.mktemp("glove")
    counts = str(root / "counts")
    prepare_cooccurrence(
        CooccurSpec(out_dir=counts, reader=read_shard, window=10, blocks=2),
        dict(source=corpus, profile="word", vocab_size=3000, shard_max_bytes=128 * 1024),
        workers=1,
    )
    triples = np.concatenate(
        [d.tokens for s in read_manifest(counts)["splits"]["train"] for d in read_shard(f"{counts}/{s['name']}")]
    )
    word, context = (torch.from_numpy(triples[k].astype(np.int64)) for k in ("word", "context"))
    count = torch.from_numpy(triples["count"].astype(np.float32))
    tok = Tokenizer.from_file(f"{counts}/tokens/tokenizer.json")
    torch.manual_seed(0)
    model = GloVe(glove_config("glove-tiny", vocab_size=tok.get_vocab_size()))
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    for _ in range(5):
        for batch in torch.randperm(len(triples)).split(8192):
            loss = weighted_squares(model(word[batch], context[batch]), count[batch]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    specials = set(tok.get_added_tokens_decoder())
    words = [w if i not in specials else "" for i, w in enumerate(vocabulary(tok))]
    write_text(str(root / "vectors.txt"), words, model.vectors().numpy())
    return str(root / "vectors.txt")


def clean_env(threads: int = 1) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
    }
    env.update(
        OMP_NUM_THREADS=str(threads),
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(ROOT),
    )
    return env


def run_glm(
    args: list[str], *, nproc: int = 1, check: bool = True, timeout: int = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run ``glm ARGS`` as one process or under torchrun with ``nproc`` CPU processes (gloo), with
    ``env`` over the clean environment."""
    if nproc == 1:
        cmd = [sys.executable, "-m", "glm_dist.cli", *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "glm_dist.cli",
            *args,
        ]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env=clean_env(threads=max(1, 2 // nproc)) | (env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n--- stderr ---\n{proc.stderr[-6000:]}")
    return proc


def tagged_json(out: str, tag: str) -> list:
    """Every JSON value printed right after ``tag`` in ``out``. Ranks of one torchrun share its
    stdout, and one rank's print may land mid-line of another's, so this scans for the tag rather
    than splitting lines."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(out, i + len(tag))[0] for i in range(len(out)) if out.startswith(tag, i)]


def results_by_combo(script: str, args: list[str], combos: list[tuple[str, int]]) -> dict[tuple[str, int], dict]:
    """Run ``script`` once for every (precision, ZeRO stage) in ``combos`` (passed last as
    ``precision:stage``) and return its tagged ``RESULT`` rows by combination."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args, *(f"{p}:{z}" for p, z in combos)],
        cwd=ROOT,
        env=clean_env(1),
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = {(r["combo"].split(":")[0], int(r["combo"].split(":")[1])): r for r in tagged_json(proc.stdout, "RESULT")}
    assert proc.returncode == 0 and len(found) == len(combos), proc.stderr[-4000:]
    return found


def train_losses(out_dir: str | Path) -> list[float]:
    rows = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


# -- the local SLURM cluster (tests/test_launch.py, tests/test_pipeline.py) -------------------------
def _nodes_up() -> bool:
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=20)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
    return out.returncode == 0 and all(
        states.get(n, "down").rstrip("*") in ("idle", "mix", "alloc") for n in ("node1", "node2")
    )


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local two-node cluster (.ci/run starts it; started here if it is not up). Never skipped:
    if the daemons cannot start, the test fails with their logs."""
    if not _nodes_up():
        start = subprocess.run(["bash", str(ROOT / "slurm/local-cluster.sh"), "start"], capture_output=True, text=True)
        if start.returncode != 0 or not _nodes_up():
            pytest.fail(f"the local SLURM cluster did not start:\n{start.stdout}\n{start.stderr}")


def job_info(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)
