"""Crawl-pipeline scaling: the whole pipeline on 1, 2 and 4 workers, and dedup's corpus-wide steps
(buckets + clusters) at 100k and 1M documents beside one process with scipy.

- **Workers**: the same generated crawl -- ``--copies`` WARC files, each every page of the embedded
  sample crawl with a paragraph and a URL of its own (so each page has near duplicates in every
  other file) -- through ``configs/data/fineweb.yaml`` with ``workers`` = 1, 2, 4: documents/s
  (response records read / wall time) and the largest peak memory of one task per stage, from
  the completion markers (``memory.task_mb``: what the task added to its worker process).
- **Dedup at scale**: generated LSH band keys (14 bands) of N documents over 16 input files, half
  of them in planted near-duplicate clusters (each member shares some bands with the previous
  member and others with the first: chains, as edited pages make), written as the filter stage
  writes them. Ours: the buckets stage and the clusters rounds under the local executor, 8 hash
  partitions; each task's peak memory from its marker. One process: every band at once -> star
  edges -> scipy's connected components (what the clusters step was before). The labels must agree.

    python bench/pipeline_scaling.py [--copies 8] [--docs 100000 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from data_pipeline.dedup.components import components, unique_pairs  # noqa: E402
from data_pipeline.dedup.shuffle import EDGE, as_edges, key_partition, read_routed, write_routed  # noqa: E402
from data_pipeline.executors.local import run as run_recipe, run_job  # noqa: E402
from data_pipeline.executors.tasks import TaskMemory, done_tasks, read_marker, run_once  # noqa: E402
from data_pipeline.recipe import load_recipe  # noqa: E402
from data_pipeline.sample_crawl import pages, response_records  # noqa: E402
from data_pipeline.stages import buckets  # noqa: E402
from data_pipeline.stages.clusters import Rounds  # noqa: E402
from data_pipeline.stages.filter import BAND  # noqa: E402
from glm_common.storage import Storage  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINEWEB = os.path.join(ROOT, "configs/data/fineweb.yaml")
BANDS, FILES, PARTS = 14, 16, 8


# -- the pipeline on 1, 2, 4 workers ------------------------------------------------------------------
def generated_crawl(folder: str, copies: int) -> int:
    """``copies`` WARC files of every sample-crawl page, each copy with its own paragraph and URL;
    returns the number of response records."""
    os.makedirs(folder, exist_ok=True)
    every = [page for file in pages() for page in file]
    for i in range(copies):
        records = []
        for url, ctype, body, status in every:
            if b"</body>" in body:
                body = body.replace(
                    b"</body>",
                    f"<p>Mirror {i} of this page, kept on server {i * 7 + 3} since "
                    f"day {i * 11 + 5} of the crawl.</p></body>".encode(),
                    1,
                )
            records.append(response_records(f"{url}?mirror={i}", ctype, body, status))
        with open(os.path.join(folder, f"crawl-{i:03d}.warc.gz"), "wb") as f:
            f.write(b"".join(records))
    return copies * len(every)


def stage_memory(work: Storage, stages: list[tuple[str, int]]) -> dict[str, float]:
    """The largest ``task_mb`` of one task per stage (the clusters rounds together)."""
    out: dict[str, float] = {}
    for name, n in stages:
        key = name.split("-", 1)[0]
        for t in range(n):
            out[key] = max(out.get(key, 0.0), read_marker(work, name, t)["memory"]["task_mb"])
    return out


def pipeline_rows(root: str, copies: int, workers: list[int]) -> list[str]:
    crawl = f"{root}/crawl"
    records = generated_crawl(crawl, copies)
    rows = [
        "| workers | wall s | docs/s | kept | largest task MB: filter / buckets / clusters / removals / write |",
        "|---:|---:|---:|---:|---|",
    ]
    for w in workers:
        out = f"{root}/out-{w}"
        shutil.rmtree(out, ignore_errors=True)
        recipe = load_recipe(FINEWEB, [f"input={crawl}/crawl-*.warc.gz", f"output={out}", f"workers={w}"])
        start = time.perf_counter()
        pipe = run_recipe(recipe, progress=False)
        wall = time.perf_counter() - start
        mem = stage_memory(pipe.work, pipe.stages())
        kept = json.loads(Path(out, "manifest.json").read_text())["documents"]
        rows.append(
            f"| {w} | {wall:.1f} | {records / wall:.1f} | {kept} | "
            + " / ".join(f"{mem.get(s, 0):.0f}" for s in ("filter", "buckets", "clusters", "removals", "write"))
            + " |"
        )
    return rows


# -- buckets + clusters at scale -------------------------------------------------------------------------
def planted_keys(n: int, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """(packed ids of ``n`` documents over FILES files, each file's band keys as (docs, BANDS) u64)."""
    rng = np.random.default_rng(seed)
    per_file = np.bincount(rng.integers(0, FILES, n), minlength=FILES)
    ids = np.concatenate([(np.int64(f) << np.int64(32)) | np.arange(k, dtype=np.int64) for f, k in enumerate(per_file)])
    keys = rng.integers(0, 2**63, (n, BANDS), dtype=np.int64).astype(np.uint64)
    order = rng.permutation(n)
    sizes = np.minimum(200, 2 + rng.pareto(1.5, n // 2)).astype(np.int64)
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), n // 2) + 1]
    members = order[: sizes.sum()]
    cluster = np.repeat(np.arange(len(sizes)), sizes)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    for b in range(BANDS):  # in band b a member takes the key of its predecessor (a chain) or of its cluster's first
        take = rng.random(len(members)) < 0.15
        chain = rng.random(len(members)) < 0.5
        at = np.arange(len(members))
        not_first = at != first[cluster]
        src = np.where(chain, at - 1, first[cluster])
        sel = take & not_first
        keys[members[at[sel]], b] = keys[members[src[sel]], b]
    files = [keys[(ids >> np.int64(32)) == f] for f in range(FILES)]
    return ids, files


def write_band_keys(work: Storage, files: list[np.ndarray]) -> None:
    for f, k in enumerate(files):
        band = np.empty(k.size, BAND)
        band["band"] = np.tile(np.arange(BANDS, dtype=np.uint32), len(k))
        band["key"] = k.reshape(-1)
        band["doc"] = np.repeat(np.arange(len(k), dtype=np.uint32), BANDS)
        write_routed(work, f"keys/{f:05d}.band", band, key_partition(band["key"], PARTS), PARTS)


class DedupJob:
    """The buckets stage and the clusters rounds alone, for the local executor."""

    def __init__(self, work_url: str):
        self.work = Storage(work_url)
        self.pipe = SimpleNamespace(
            recipe=SimpleNamespace(dedup=SimpleNamespace(minhash=True, exact=False)),
            inputs=[""] * FILES,
            work=self.work,
            partitions=PARTS,
        )
        self.rounds = Rounds(self.work, PARTS, FILES, [buckets.edges_key(p) for p in range(PARTS)])

    def stages(self) -> list[tuple[str, int]]:
        done = len(done_tasks(self.work, "buckets")) == PARTS
        return [("buckets", PARTS)] + (self.rounds.plan() if done else [])

    def run_task(self, stage: str, task: int) -> None:
        if stage == "buckets":
            run_once(self.work, stage, task, lambda: buckets.run(self.pipe, stage, task))
        else:
            self.rounds.run_task(stage, task)


def one_process(work: Storage, n: int, ids: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Every band of every file in one process -> star edges -> scipy: (labels, seconds, peak MB)."""
    memory, start = TaskMemory(), time.perf_counter()
    parts = [read_routed(work, [f"keys/{f:05d}.band" for f in range(FILES)], p, BAND) for p in range(PARTS)]
    band = np.concatenate([records for records, _ in parts])
    owners = np.concatenate([np.repeat(np.arange(FILES, dtype=np.int64), c) for _, c in parts])
    packed = (owners << np.int64(32)) | band["doc"].astype(np.int64)
    edges = unique_pairs(buckets.star_edges([band["band"], band["key"]], packed))
    del band, owners, packed
    labels = ids[components(n, np.searchsorted(ids, edges))]
    return labels, time.perf_counter() - start, memory.report()["task_mb"]


def dedup_rows(root: str, sizes: list[int], workers: int) -> list[str]:
    rows = [
        "| documents | band keys | ours: wall s | rounds | largest task MB (buckets / a round) | "
        "one process + scipy: wall s | its peak MB | same clusters |",
        "|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for n in sizes:
        base = f"{root}/dedup-{n}"
        shutil.rmtree(base, ignore_errors=True)
        ids, files = planted_keys(n)
        work = Storage(base)
        write_band_keys(work, files)
        del files
        job = DedupJob(base)
        start = time.perf_counter()
        run_job(job, workers=workers, progress=False)
        wall = time.perf_counter() - start
        labels = ids.copy()
        for f in range(FILES):
            member_first = as_edges(read_routed(work, job.rounds.labels(), f, EDGE)[0])
            labels[np.searchsorted(ids, member_first[:, 0])] = member_first[:, 1]
        stages = job.stages()
        mem = stage_memory(work, stages)
        reference, ref_wall, ref_mb = one_process(work, n, ids)
        clustered = int((reference != ids).sum())
        rows.append(
            f"| {n:,} | {n * BANDS:,} | {wall:.1f} | {len(stages) - 1} | {mem['buckets']:.0f} / "
            f"{mem['clusters']:.0f} | {ref_wall:.1f} | {ref_mb:.0f} | "
            f"{'yes' if np.array_equal(labels, reference) else 'NO'} ({clustered:,} duplicates) |"
        )
        shutil.rmtree(base, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/tmp/glm-bench-pipeline")
    ap.add_argument("--copies", type=int, default=8, help="generated crawl: copies of the sample crawl's pages")
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--docs", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--dedup-workers", type=int, default=2)
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPU cores")
    print("\n".join(pipeline_rows(args.root, args.copies, args.workers)), flush=True)
    print()
    print("\n".join(dedup_rows(args.root, args.docs, args.dedup_workers)))


if __name__ == "__main__":
    main()
