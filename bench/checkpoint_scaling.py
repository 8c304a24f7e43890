"""Checkpoint cost on this machine: the sharded, asynchronous format against the scheme it replaced
(DeepSpeed's own files + the universal form of whole fp32 weights and moments, written
synchronously and hashed after writing; commit 228a0e2, loaded from git), for GPT-2 124M and 350M
at 1 process, DP=2 (ZeRO-1 and ZeRO-3), PP=2 and TP=2, bf16 (DeepSpeed's bf16 mode).

Per layout: bytes per parameter of one save, the most any rank writes against an equal share,
the time training waits (blocking) and the time until the checkpoint is complete (total), and the
time to resume it at another layout (verification included) with the most bytes a rank reads
against its share. Each layout runs once under torchrun after one training step (so the optimizer
moments exist); the old scheme's save runs in the same processes right after the new one.

    python bench/checkpoint_scaling.py [--models 124M,350M] [--layouts ...] [--json out.json]
    python bench/checkpoint_scaling.py --project      # GPT-3 175B at DP 4 x PP 16 x TP 8
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OLD_COMMIT = "228a0e2"  # the last commit with the universal form
TINY = str(ROOT / "configs/experiments/gpt2-tiny-cpu.yaml")
MODELS = {"124M": "gpt2-small", "350M": "gpt2-medium"}
LAYOUTS = {  # name: (processes, overrides); every layout bf16 with an fp32 master (ZeRO >= 1)
    "1 process": (1, ["parallel.zero_stage=1"]),
    "DP=2 ZeRO-1": (2, ["parallel.zero_stage=1"]),
    "DP=2 ZeRO-3": (2, ["parallel.zero_stage=3"]),
    "PP=2": (2, ["parallel.pipeline_stages=2", "parallel.zero_stage=1"]),
    # the vocabulary stays whole under TP: the scheme compared against predates the vocabulary split
    "TP=2": (2, ["parallel.tensor_parallel=2", "parallel.zero_stage=1", "parallel.vocab_parallel=false"]),
}
RESUME_AT = {
    "1 process": "DP=2 ZeRO-1",
    "DP=2 ZeRO-1": "DP=2 ZeRO-3",
    "DP=2 ZeRO-3": "PP=2",
    "PP=2": "TP=2",
    "TP=2": "1 process",
}


# -- the scheme it replaced, from git ------------------------------------------------------------------
def old_universal():
    """``glm_dist/parallel/universal.py`` as of ``OLD_COMMIT`` (its imports still exist)."""
    path = Path(tempfile.gettempdir()) / f"glm_old_universal_{OLD_COMMIT}.py"
    if not path.exists():
        path.write_text(
            subprocess.run(
                ["git", "show", f"{OLD_COMMIT}:glm_dist/parallel/universal.py"],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
    spec = importlib.util.spec_from_file_location("old_universal", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def count_torch_saves() -> dict:
    """Bytes this process writes through ``torch.save`` (DeepSpeed's files and the universal form)."""
    import torch

    written = {"bytes": 0}
    save = torch.save

    def counted(obj, f, *args, **kwargs):
        save(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)):
            written["bytes"] += os.path.getsize(f)

    torch.save = counted
    return written


def old_naming(trainer, old):
    pipe = trainer.engine.module
    if not trainer.pipelined:
        return old.Naming()
    return old.Naming(
        rename=trainer.naming.rename, owned=lambda key: not key.startswith("tied_modules.") or pipe.stage_id == 0
    )


def old_save(trainer, old, directory: Path, written: dict) -> dict:
    """What a save was: DeepSpeed's files, the universal form (gathered over the data and tensor
    ranks), the RNG, then every file hashed (split over the ranks) -- all before training goes on."""
    from glm_dist.checkpoint.files import rng_state
    from glm_dist.parallel import comm

    rank, world = trainer.dist.rank, trainer.dist.world_size
    comm.barrier()
    before, t0 = written["bytes"], time.perf_counter()
    trainer.engine.save_checkpoint(str(directory), tag="state", client_state={}, save_latest=False)
    (directory / "rng").mkdir(exist_ok=True)
    (directory / "rng" / f"rank{rank:05d}.json").write_text(json.dumps(rng_state(trainer.engine.device)))
    writer = trainer.coords["data"] == 0 and trainer.coords["tensor"] == 0
    old.save(
        trainer.engine,
        directory / "universal",
        old_naming(trainer, old),
        writer=writer,
        tensor_group=trainer.tensor_group,
        tensor_size=trainer.topo.tensor,
    )
    comm.barrier()
    hashed = hash_share(directory, rank, world)
    comm.barrier()
    return {
        "blocking_s": time.perf_counter() - t0,
        "total_s": time.perf_counter() - t0,
        "written": written["bytes"] - before,
        "hashed": hashed,
    }


def hash_share(directory: Path, rank: int, world: int) -> int:
    import hashlib

    files = sorted(p for p in directory.rglob("*") if p.is_file())
    done = 0
    for i, f in enumerate(files):
        if i % world == rank:
            h = hashlib.sha256()
            with f.open("rb") as fh:
                while block := fh.read(1 << 22):
                    h.update(block)
            done += f.stat().st_size
    return done


def old_resume(trainer, old, directory: Path) -> dict:
    """A resume on another layout was: verify (each rank hashes every n-th file), load the whole
    model's weights from the universal form, then set each rank's masters and moments."""
    from glm_dist.families.registry import build_model
    from glm_dist.parallel import comm

    comm.barrier()
    t0 = time.perf_counter()
    hashed = hash_share(directory, trainer.dist.rank, trainer.dist.world_size)
    model = build_model(trainer.cfg.model.family, trainer.model_cfg)
    old.load_weights(model, directory / "universal")
    old.load_optimizer(
        trainer.engine,
        directory / "universal",
        old_naming(trainer, old),
        tensor_rank=trainer.coords["tensor"],
        tensor_size=trainer.topo.tensor,
    )
    del model
    comm.barrier()
    whole = sum(p.stat().st_size for p in (directory / "universal").glob("*.pt"))
    return {"resume_s": time.perf_counter() - t0, "read": whole + hashed}


# -- one layout, inside torchrun ---------------------------------------------------------------------
def worker(args) -> None:
    from glm_dist.config.loader import load_config
    from glm_dist.parallel import comm, fragments
    from glm_dist.families.registry import family
    from glm_dist.parallel.plan import model_shape
    from glm_dist.train.loop import Trainer

    written = count_torch_saves()
    old = old_universal()
    trainer = Trainer(load_config(TINY, args.overrides))
    sizes = {"data": trainer.topo.data, "tensor": trainer.topo.tensor}
    report = {"rank": trainer.dist.rank, "world": trainer.dist.world_size}
    if args.worker == "save":
        trainer.train_step()
        comm.barrier()
        t0 = time.perf_counter()
        trainer.save()  # max_steps is 2: the save is asynchronous
        blocking = trainer.ckpts.last_save["blocking_s"]
        trainer.ckpts.wait()
        report["new"] = {
            "blocking_s": blocking,
            "total_s": time.perf_counter() - t0,
            "written": trainer.ckpts.last_save["bytes"],
        }
        report["old"] = old_save(trainer, old, Path(args.old_dir), written)
        report["params"] = model_shape(family(trainer.cfg.model.family), trainer.model_cfg).params
    else:
        ckpts = trainer.ckpts
        comm.barrier()
        t0 = time.perf_counter()
        ckpt = ckpts.resolve(args.resume_from)  # its own byte counter: verification and loading
        verified = time.perf_counter() - t0
        ckpts.load(trainer.engine, ckpt, trainer.naming, trainer.coords, sizes)
        comm.barrier()
        pieces = fragments.pieces(trainer.engine, trainer.naming, trainer.coords, sizes)
        report["new"] = {
            "resume_s": time.perf_counter() - t0,
            "verify_s": verified,
            "read": sum(ckpt.bytes_read.values()),
            "data_read": ckpt.bytes_read["data"],
            "holds": sum(4 * p.numel * (1 + len(p.moments)) for p in pieces),
        }
        report["old"] = old_resume(trainer, old, Path(args.old_dir))
    print("REPORT" + json.dumps(report), flush=True)


# -- the driver ---------------------------------------------------------------------------------------
def launch(nproc: int, argv: list[str]) -> list[dict]:
    runner = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // nproc)),
        "PYTHONPATH": str(ROOT),
        "GLM_PEAK_TFLOPS": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
    }
    proc = subprocess.run([sys.executable, *runner, __file__, *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed:\n{proc.stderr[-4000:]}")
    decoder, out = json.JSONDecoder(), proc.stdout
    return [decoder.raw_decode(out, i + len("REPORT"))[0] for i in range(len(out)) if out.startswith("REPORT", i)]


def overrides(flavor: str, layout: str, shards: str, out: Path) -> list[str]:
    nproc, extra = LAYOUTS[layout]
    micro = 2 if "PP" in layout else 1
    return [
        f"model.flavor={flavor}",
        "model.vocab_size=50257",
        f"data.shards_dir={shards}",
        f"train.out_dir={out}",
        "data.seq_len=64",
        "train.micro_batch_size=1",
        f"train.grad_accum_steps={micro}",
        "train.max_steps=2",
        "train.warmup_steps=1",
        "train.eval_batches=1",
        "train.eval_interval=0",
        "train.save_interval=0",
        "train.plot=false",
        "logging.wandb=false",
        "logging.progress=false",
        "train.precision=bf16",
        "train.keep_last=5",
        *extra,
    ]


def measure(model: str, layout: str, shards: str, work: Path) -> dict:
    flavor = MODELS[model]
    out, old_dir = work / f"{model}-{layout}".replace(" ", "_").replace("=", ""), work / "old"
    for d in (out, old_dir):
        subprocess.run(["rm", "-rf", str(d)])
    old_dir.mkdir(parents=True)
    saved = launch(
        LAYOUTS[layout][0],
        ["--worker", "save", "--old-dir", str(old_dir), "--", *overrides(flavor, layout, shards, out)],
    )
    ckpt = out / "checkpoints/step_00000001"
    new_bytes = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    old_bytes = sum(p.stat().st_size for p in old_dir.rglob("*") if p.is_file())
    other = RESUME_AT[layout]
    resumed = launch(
        LAYOUTS[other][0],
        [
            "--worker",
            "resume",
            "--resume-from",
            str(ckpt),
            "--old-dir",
            str(old_dir),
            "--",
            *overrides(flavor, other, shards, work / "resume"),
        ],
    )
    params = saved[0]["params"]
    row = {"model": model, "layout": layout, "params": params, "resume_at": other}
    for scheme, total in (("new", new_bytes), ("old", old_bytes)):
        written = [r[scheme]["written"] for r in saved]
        row[scheme] = {
            "bytes_per_param": total / params,
            "max_written_over_share": max(written) / (sum(written) / len(written)),
            "blocking_s": max(r[scheme]["blocking_s"] for r in saved),
            "total_s": max(r[scheme]["total_s"] for r in saved),
            "resume_s": max(r[scheme]["resume_s"] for r in resumed),
            "max_read_over_share": max(r[scheme]["read"] for r in resumed) / (total / len(resumed)),
        }
    row["new"]["data_read_over_held"] = max(r["new"]["data_read"] / r["new"]["holds"] for r in resumed)
    subprocess.run(["rm", "-rf", str(out), str(old_dir), str(work / "resume")])
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| model | layout | scheme | bytes/param | max rank writes / share | blocking s | total s | "
        "resume at | resume s | max rank reads / share |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        for scheme, label in (("old", "universal + DeepSpeed (sync)"), ("new", "sharded (async)")):
            s = r[scheme]
            lines.append(
                f"| {r['model']} | {r['layout']} | {label} | {s['bytes_per_param']:.1f} | "
                f"{s['max_written_over_share']:.2f} | {s['blocking_s']:.2f} | {s['total_s']:.2f} | "
                f"{r['resume_at']} | {s['resume_s']:.2f} | {s['max_read_over_share']:.2f} |"
            )
    return "\n".join(lines)


def projection(pcie_gbs: float, node_write_gbs: float, writer_gbs: float) -> str:
    """GPT-3 175B at DP 4 x PP 16 x TP 8 (512 GPUs, 8 per node), ZeRO-1, bf16: what each rank
    writes and how long training waits, from the per-stage parameter counts ``glm plan`` uses."""
    from glm_dist.config.checks import model_config
    from glm_dist.config.loader import load_config
    from glm_dist.families.registry import family
    from glm_dist.parallel.plan import model_shape, stage_params_by_layers

    cfg = load_config(str(ROOT / "configs/experiments/published/gpt3-175b.yaml"))
    shape = model_shape(family("gpt"), model_config(cfg))
    dp, pp, tp, gpus_per_node = 4, 16, 8, 8
    embed, head = shape.units[0], shape.units[-1]
    layers = stage_params_by_layers([0, *shape.units[1:-1], 0], pp, tp)  # sliced blocks per tensor rank
    wte = shape.vocab * shape.d_model
    new = []  # elements each rank of a stage writes (fp32 master + 2 moments)
    for s, blocks in enumerate(layers):
        replicated = (embed - wte / 2 if s == 0 else 0) + (head - wte / 2 if s == pp - 1 else 0)
        new.append(blocks / dp + replicated / (dp * tp))  # tied wte: half on each end stage
    new_rank = 12 * max(new)
    stage_whole = [
        blocks * tp + (embed if s == 0 else 0) + (head - wte if s == pp - 1 else 0) for s, blocks in enumerate(layers)
    ]
    old_writer = 12 * max(stage_whole)  # one rank per stage wrote the universal form of its stage
    old_ds_rank = 12 * max(layers) / dp + 2 * max(layers)  # + DeepSpeed's files (partition + bf16 weights)
    lines = [
        f"GPT-3 175B ({shape.params / 1e9:.1f}B parameters), DP {dp} x PP {pp} x TP {tp} = 512 ranks, ZeRO-1, bf16",
        f"new: {12 * shape.params / 1e12:.2f} TB per save; each rank writes <= {new_rank / 1e9:.2f} GB "
        f"(an equal share is {12 * shape.params / 512 / 1e9:.2f} GB: "
        f"x{new_rank / (12 * shape.params / 512):.2f}); "
        f"blocking = device-to-host copy at {pcie_gbs:g} GB/s = {new_rank / 1e9 / pcie_gbs:.2f} s; "
        f"in the background a node writes {gpus_per_node * new_rank / 1e9:.0f} GB at {node_write_gbs:g} GB/s = "
        f"{gpus_per_node * new_rank / 1e9 / node_write_gbs:.0f} s",
        f"old: {(12 + 14) * shape.params / 1e12:.2f} TB per save; the busiest rank writes "
        f"{(old_writer + old_ds_rank) / 1e9:.0f} GB (universal form of its stage {old_writer / 1e9:.0f} GB, one "
        f"writer per stage) at {writer_gbs:g} GB/s = {(old_writer + old_ds_rank) / 1e9 / writer_gbs:.0f} s of "
        f"blocking, before the gathers over the data and tensor ranks and the hashing",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["save", "resume"])
    parser.add_argument("--old-dir")
    parser.add_argument("--resume-from")
    parser.add_argument("--models", default="124M,350M")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--json")
    parser.add_argument("--project", action="store_true")
    parser.add_argument("--pcie-gbs", type=float, default=25.0, help="device-to-host copy into pinned memory")
    parser.add_argument("--node-write-gbs", type=float, default=5.0, help="a node's write bandwidth to storage")
    parser.add_argument("--writer-gbs", type=float, default=2.0, help="one process's torch.save write bandwidth")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.project:
        print(projection(args.pcie_gbs, args.node_write_gbs, args.writer_gbs))
        return
    from data_pipeline.tokenize.prepare import prepare_shards

    with tempfile.TemporaryDirectory(dir=os.environ.get("GLM_BENCH_DIR")) as tmp:
        work = Path(tmp)
        shards = str(work / "shards")
        prepare_shards(source="embedded", out_dir=shards, vocab_size=2048, shard_max_bytes=256 * 1024)
        rows = []
        for model in args.models.split(","):
            for layout in args.layouts.split(","):
                rows.append(measure(model, layout, shards, work))
                print(json.dumps(rows[-1]), flush=True)
        print(table(rows))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
