"""Loader scaling (docs/architecture.md, decision 12): what one data-parallel rank reads and how fast.

- bytes read and tokens/s per rank at DP = 1, 2, 4, 8, 64 (simulated ranks: this process computes
  rank r's reads), beside what every rank read before (every shard, whole);
- start-up time to the first batch over generated metadata of 100,000 shards x 1,000 documents,
  warm (the cached document table of 10^8 documents; every shard a hard link to one real shard),
  and cold (the index files parsed into the table) at fewer shards, by a rank and by glm data index;
- shuffle quality: the share of a global batch's samples that come from its most common shard,
  with the units in packing order (the streaming loader's order) and after the global shuffle.

    python bench/loader_scaling.py                   # docs/benchmarks.md#loader (embedded corpus shards under /tmp)
    torchrun --nproc_per_node=N bench/loader_scaling.py --worker DIR --out OUT   # one JSON per rank (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from data_pipeline.writers.shards import ShardSetWriter, index_name
from glm_dist.data.index import DocTable, load_doc_table, parse_index, save_doc_table, table_digest
from glm_dist.data.loader import Loader
from glm_dist.data.plan import SampleIndex, unit_pieces
from glm_dist.data.shards import read_manifest

MAX_LINKS = 60_000


def step_doc_bytes(ld: Loader) -> int:
    """Bytes of the document pieces the whole next global batch packs (every rank's rows)."""
    itemsize = ld.order.table.dtype.itemsize
    return sum(int(unit_pieces(ld.locate(row).unit)[:, 2].sum()) for row in range(ld.global_batch_size)) * itemsize


def index_bytes(shards_dir: str) -> int:
    """What a rank reads to plan from cold: the manifest and every index file."""
    manifest = read_manifest(shards_dir)
    names = ["manifest.json"] + [e["index"] for split in manifest["splits"].values() for e in split if e.get("index")]
    return sum(os.path.getsize(f"{shards_dir}/{n}") for n in names)


def rank_reads(
    shards_dir: str,
    *,
    dp_rank: int,
    dp_size: int,
    steps: int,
    objective: str = "clm",
    seq_len: int = 128,
    micro: int = 4,
    seed: int = 0,
) -> dict:
    """Rank ``dp_rank``'s reads over ``steps`` steps, beside the global batches' document bytes."""
    ld = Loader(
        shards_dir,
        objective=objective,
        seq_len=seq_len,
        micro_batch_size=micro,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=seed,
    )
    ld.next_step(build=False)  # start-up (document table, plan) is not throughput
    doc_bytes, seconds, samples, tokens = 0, 0.0, [], 0
    for _ in range(steps):
        doc_bytes += step_doc_bytes(ld)
        start = time.perf_counter()
        batches = ld.next_step()
        seconds += time.perf_counter() - start
        tokens += sum(int(b["input_ids"].numel()) for b in batches)
        samples += [list(s) for s in ld.last_samples]
    stats = ld.read_stats
    return {
        "rank": dp_rank,
        "dp": dp_size,
        "steps": steps,
        "bytes": stats.bytes,
        "requests": stats.requests,
        "doc_bytes": doc_bytes,
        "tokens": tokens,
        "seconds": seconds,
        "samples": samples,
        "index_bytes": index_bytes(shards_dir),
    }


def worker(shards_dir: str, out: str, steps: int, objective: str) -> None:
    """One torchrun rank: its reads, written to OUT/rank-R.json."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    result = rank_reads(shards_dir, dp_rank=rank, dp_size=world, steps=steps, objective=objective)
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, f"rank-{rank}.json").write_text(json.dumps(result))


def scaling_table(shards_dir: str, *, steps: int, seq_len: int, micro: int) -> list[str]:
    manifest = read_manifest(shards_dir)
    train = manifest["splits"]["train"]
    tar_bytes = sum(os.path.getsize(f"{shards_dir}/{e['name']}") for e in train)
    tokens = sum(e["num_tokens"] for e in train)
    rows = [
        "| DP | ranks measured | bytes read per rank per step | of the global batch's document bytes | "
        "requests per rank per step | tokens/s per rank | before: bytes per rank per step |",
        "|---|---|---|---|---|---|---|",
    ]
    for dp in (1, 2, 4, 8, 64):
        ranks = list(range(dp)) if dp <= 8 else [0, 21, 42, 63]
        res = [rank_reads(shards_dir, dp_rank=r, dp_size=dp, steps=steps, seq_len=seq_len, micro=micro) for r in ranks]
        per_step = np.mean([r["bytes"] / steps for r in res])
        share = np.mean([r["bytes"] / r["doc_bytes"] for r in res])
        before = tar_bytes / tokens * micro * seq_len * dp  # every rank streamed the shards the global batch came from
        rows.append(
            f"| {dp} | {len(ranks)} | {per_step / 1024:,.1f} KiB | {share:.3f} (1/DP = {1 / dp:.3f}) | "
            f"{np.mean([r['requests'] / steps for r in res]):.1f} | "
            f"{np.mean([r['tokens'] / r['seconds'] for r in res]):,.0f} | {before / 1024:,.1f} KiB |"
        )
    return rows


def generated_set(template: str, root: str, *, shards: int, docs_per_shard: int) -> tuple[Path, list[dict], object]:
    """``shards`` x ``docs_per_shard`` generated documents: one real shard of random documents and its
    index file, each hard-linked ``shards`` times under its own name, and their manifest."""
    base = Path(root)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    writer = ShardSetWriter(str(base), "one", 1 << 40, prefix="shard")
    for i in range(docs_per_shard):
        tokens = rng.integers(5, 8000, int(rng.integers(200, 1800))).astype(np.uint16)
        writer.write(f"{i:08d}", tokens, {}, sentences=np.zeros(1, dtype=np.int32))
    info = vars(writer.close()[0])
    one = parse_index(Path(base, info["index"]).read_bytes(), info)
    entries, tar, index = [], base / info["name"], base / info["index"]
    for i in range(shards):
        if i and i % MAX_LINKS == 0:  # a file system caps the links to one file (ext4: 65,000)
            tar, index = (shutil.copy(f, base / f"copy-{i}-{f.name}") for f in (tar, index))
        name = f"train-{i:06d}.tar"
        os.link(tar, base / name)
        os.link(index, base / index_name(name))
        entries.append({**info, "name": name, "index": index_name(name)})
    src = read_manifest(template)
    (base / "manifest.json").write_text(json.dumps({**src, "splits": {"train": entries, "validation": []}}))
    shutil.copy(f"{template}/tokenizer.json", base / "tokenizer.json")
    return base, entries, one


def first_batch_seconds(base: Path, *, seq_len: int, micro: int, dp: int) -> tuple[float, int]:
    start = time.perf_counter()
    ld = Loader(str(base), objective="clm", seq_len=seq_len, micro_batch_size=micro, dp_size=dp, seed=0)
    ld.next_step()
    return time.perf_counter() - start, ld.read_stats.bytes


def generated_startup(
    template: str, root: str, *, shards: int, docs_per_shard: int, seq_len: int, micro: int, dp: int
) -> dict:
    """Warm start-up to rank 0's first batch over generated metadata: the document table is already
    cached beside the shards (what ``glm data index`` or a first start leaves), built here in
    closed form from the one real index rather than parsed ``shards`` times."""
    base, entries, one = generated_set(template, root, shards=shards, docs_per_shard=docs_per_shard)
    d = docs_per_shard
    generated = DocTable(
        root=str(base),
        names=[e["name"] for e in entries],
        dtype=one.dtype,
        shard_bytes=np.full(shards, one.tar_bytes, dtype=np.int64),
        shard_start=np.arange(shards + 1, dtype=np.int64) * d,
        shard_tokens=np.full(shards, int(one.num_tokens.sum()), dtype=np.int64),
        num_tokens=np.tile(one.num_tokens, shards),
        token_offset=np.tile(one.token_offset, shards),
        sentence_ptr=np.arange(shards * d + 1, dtype=np.int64),
        sentence_lengths=np.tile(one.num_tokens.astype(np.int32), shards),
    )
    save_doc_table(f"{base}/.glm-index/train-{table_digest(entries, 'train')}", generated)
    del generated
    seconds, read = first_batch_seconds(base, seq_len=seq_len, micro=micro, dp=dp)
    return {"documents": shards * d, "shards": shards, "seconds": seconds, "bytes": read}


def cold_startup(
    template: str, root: str, *, shards: int, docs_per_shard: int, seq_len: int, micro: int, dp: int, workers: int
) -> dict:
    """Cold start-up: no cached table, so the index files are read and parsed (index files ->
    document table -> sample index -> first batch), as a training rank does it (threads); and the
    same table built by ``glm data index`` with ``workers`` processes."""
    base, entries, _ = generated_set(template, root, shards=shards, docs_per_shard=docs_per_shard)
    seconds, read = first_batch_seconds(base, seq_len=seq_len, micro=micro, dp=dp)
    shutil.rmtree(base / ".glm-index")
    start = time.perf_counter()
    load_doc_table(str(base), read_manifest(str(base)), "train", workers=workers)
    indexer = time.perf_counter() - start
    index_bytes = sum(os.path.getsize(base / e["index"]) for e in entries)
    return {
        "documents": shards * docs_per_shard,
        "shards": shards,
        "seconds": seconds,
        "bytes": read,
        "indexer_seconds": indexer,
        "workers": workers,
        "index_bytes": index_bytes,
    }


def shuffle_quality(shards_dir: str, *, global_batch: int, steps: int, seq_len: int) -> tuple[float, float]:
    """Mean share of a global batch's samples from its most common shard: packing order, then shuffled."""
    ld = Loader(shards_dir, objective="clm", seq_len=seq_len, micro_batch_size=global_batch, seed=0, shuffle_window=4)
    ld._setup()
    table = ld.order.table
    out = []
    for index in (SampleIndex(ld._plan, seed=0, shuffle=False), ld._index):
        shares = []
        for s in range(steps):
            units = [index.locate(s * global_batch + row).unit for row in range(global_batch)]
            shards = table.shard_of(np.asarray([unit_pieces(u)[0, 0] for u in units]))
            shares.append(np.bincount(shards).max() / global_batch)
        out.append(float(np.mean(shares)))
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", metavar="DIR", help="torchrun mode: this rank's reads of the shard set DIR")
    ap.add_argument("--out", help="--worker: the folder for rank-R.json")
    ap.add_argument("--objective", default="clm")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--root", default="/tmp/glm-bench-scaling")
    ap.add_argument("--shards", type=int, default=100_000, help="warm start-up: generated shards")
    ap.add_argument(
        "--cold-shards",
        type=int,
        nargs="*",
        default=[1_000, 4_000],
        help="cold start-up: generated shards (time grows linearly: the index files are parsed)",
    )
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.out, args.steps, args.objective)
        return
    from data_pipeline.tokenize.prepare import prepare_shards

    shards_dir = f"{args.root}/embedded"
    prepare_shards(source="embedded", out_dir=shards_dir, vocab_size=8192, shard_max_bytes=1 << 20)
    print("\n".join(scaling_table(shards_dir, steps=args.steps, seq_len=512, micro=4)))
    small = f"{args.root}/embedded-64k"  # the same corpus in 64 KiB shards: enough shards to tell
    prepare_shards(source="embedded", out_dir=small, vocab_size=8192, shard_max_bytes=64 << 10)
    before, after = shuffle_quality(small, global_batch=256, steps=8, seq_len=512)
    print(
        f"\nshuffle quality ({len(read_manifest(small)['splits']['train'])} shards of 64 KiB), share of a global "
        f"batch of 256 from its most common shard: packing order with a window of 4 shards (the streaming "
        f"loader) {before:.3f}, sample index {after:.3f}"
    )
    up = generated_startup(
        shards_dir, f"{args.root}/generated", shards=args.shards, docs_per_shard=1000, seq_len=2048, micro=8, dp=64
    )
    print(
        f"\nstart-up to rank 0's first batch (DP = 64, seq 2048), warm (document table cached): "
        f"{up['documents']:,} documents in {up['shards']:,} shards: {up['seconds']:.2f} s, "
        f"{up['bytes'] / 1024:,.1f} KiB read"
    )
    shutil.rmtree(f"{args.root}/generated", ignore_errors=True)
    for shards in args.cold_shards:
        cold = cold_startup(
            shards_dir,
            f"{args.root}/cold",
            shards=shards,
            docs_per_shard=1000,
            seq_len=2048,
            micro=8,
            dp=64,
            workers=os.cpu_count() or 1,
        )
        print(
            f"cold (index files parsed): {cold['documents']:,} documents in {cold['shards']:,} shards "
            f"({cold['index_bytes'] / 2**20:,.0f} MiB of index files): first batch {cold['seconds']:.2f} s; "
            f"glm data index's table with {cold['workers']} processes {cold['indexer_seconds']:.2f} s"
        )
        shutil.rmtree(f"{args.root}/cold", ignore_errors=True)


if __name__ == "__main__":
    main()
