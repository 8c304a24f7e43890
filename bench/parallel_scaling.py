"""Parallel layouts on the CPU (gloo): tokens/s and measured per-rank model-state memory of the same
GPT at 1, 2 and 4 ranks for each layout (data, pipeline, tensor parallelism and their products), and
the pipeline bubble measured against (p-1)/(m+p-1).

Each layout trains the same model with the same global batch for a few steps under torchrun;
tokens/s is the median over the steps after the first, and memory is what each rank holds
(``model_states_rank*.json``: parameters, gradients, optimizer states). The measured bubble of a
PP=p run is ``1 - (T1 / p) / Tp`` against the one-process step time T1: it includes the
point-to-point transfers, so it is an upper bound of the idle time. On a 2-core machine runs with
more processes than cores measure oversubscription, not scaling; the table says so.

    python bench/parallel_scaling.py [--steps 6] [--d-model 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = [  # (name, processes, overrides)
    ("1 process", 1, []),
    ("DP=2, ZeRO-1", 2, ["parallel.zero_stage=1"]),
    ("DP=2, ZeRO-3", 2, ["parallel.zero_stage=3"]),
    ("PP=2, ZeRO-1", 2, ["parallel.pipeline_stages=2", "parallel.zero_stage=1"]),
    ("DP=4, ZeRO-3", 4, ["parallel.zero_stage=3"]),
    ("DP=2 x PP=2, ZeRO-1", 4, ["parallel.pipeline_stages=2", "parallel.zero_stage=1"]),
    ("PP=4, ZeRO-1", 4, ["parallel.pipeline_stages=4", "parallel.zero_stage=1"]),
    ("TP=2, vocabulary whole", 2, ["parallel.tensor_parallel=2", "parallel.vocab_parallel=false"]),
    ("TP=2", 2, ["parallel.tensor_parallel=2"]),
    ("TP=2 + SP", 2, ["parallel.tensor_parallel=2", "parallel.sequence_parallel=true"]),
    ("TP=2 x DP=2, ZeRO-1", 4, ["parallel.tensor_parallel=2", "parallel.zero_stage=1"]),
    ("TP=2 x PP=2, ZeRO-1", 4, ["parallel.tensor_parallel=2", "parallel.pipeline_stages=2", "parallel.zero_stage=1"]),
]


def run(name: str, nproc: int, extra: list[str], shards: str, out: Path, args) -> dict:
    micro, global_batch = 2, 16
    pp = next((int(o.split("=")[1]) for o in extra if o.startswith("parallel.pipeline_stages=")), 1)
    tp = next((int(o.split("=")[1]) for o in extra if o.startswith("parallel.tensor_parallel=")), 1)
    dp = nproc // (pp * tp)
    cfg = [
        "train",
        "-c",
        str(ROOT / "configs/experiments/gpt2-tiny-cpu.yaml"),
        f"data.shards_dir={shards}",
        f"train.out_dir={out}",
        f"model.d_model={args.d_model}",
        "model.n_layer=4",
        "model.n_head=4",
        "data.seq_len=128",
        f"train.micro_batch_size={micro}",
        f"train.grad_accum_steps={global_batch // (micro * dp)}",
        f"train.max_steps={args.steps}",
        "train.warmup_steps=1",
        "train.eval_batches=1",
        "train.eval_interval=0",
        "train.save_interval=0",
        "train.plot=false",
        "logging.wandb=false",
        "logging.progress=false",
        "logging.log_interval=1",
        "train.precision=fp32",
        *extra,
    ]
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        if nproc > 1
        else [sys.executable]
    )
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // nproc)), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*launcher, "-m", "glm_dist.cli", *cfg], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    speeds = [r["tokens_per_s"] for r in rows if r["kind"] == "train"][1:]
    mem = [json.loads((out / f"model_states_rank{r}.json").read_text()) for r in range(nproc)]
    return {
        "tokens_per_s": statistics.median(speeds),
        "pp": pp,
        "micro_batches": global_batch // (micro * dp),
        "params_mb": max(m["params"] for m in mem) / 2**20,
        "states_mb": max(m["params"] + m["grads"] + m["optimizer"] for m in mem) / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    args = ap.parse_args()
    from data_pipeline.tokenize.prepare import prepare_shards

    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        shards = f"{tmp}/shards"
        prepare_shards(source="embedded", out_dir=shards, vocab_size=2048, shard_max_bytes=256 * 1024)
        results = {
            name: run(name, n, extra, shards, Path(tmp) / f"run{i}", args) for i, (name, n, extra) in enumerate(LAYOUTS)
        }
    base = results["1 process"]
    print(f"GPT d_model {args.d_model}, 4 layers, seq 128, global batch 16, fp32; {cores} CPU cores\n")
    print(
        "| layout | processes | tokens/s | vs 1 process | max per-rank model states (MB) | params (MB) "
        "| bubble measured | (p-1)/(m+p-1) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (name, n, _), r in zip(LAYOUTS, results.values()):
        if r["pp"] > 1:
            t1, tp = 1 / base["tokens_per_s"], 1 / r["tokens_per_s"]
            measured = f"{1 - (t1 / r['pp']) / tp:.0%}"
            theory = f"{(r['pp'] - 1) / (r['micro_batches'] + r['pp'] - 1):.0%}"
        else:
            measured = theory = "-"
        note = " (oversubscribed)" if n > cores else ""
        print(
            f"| {name}{note} | {n} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f}x | "
            f"{r['states_mb']:.1f} | {r['params_mb']:.1f} | {measured} | {theory} |"
        )


if __name__ == "__main__":
    main()
