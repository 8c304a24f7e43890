"""card (one task): the tasks' markers -> stats.json, contamination.json, the data card (README.md),
funnel.png and, last, manifest.json, which makes the run's documents visible (``manifest.py``).
Reads markers only (one per task) and the benchmark index: bounded by tasks and benchmarks."""

from __future__ import annotations

import json

from data_pipeline.document import Stats
from data_pipeline.pipeline import Pipeline


def plan(pipe: Pipeline) -> list[tuple[str, int]]:
    return [("card", 1)]


def _dedup(pipe: Pipeline) -> dict:
    from data_pipeline.stages.clusters import rounds

    removals = pipe.markers("removals", len(pipe.inputs))
    return {
        "clusters_with_duplicates": rounds(pipe).final()["centers"] if pipe.dedup_on() else 0,
        "documents": sum(m["documents"] for m in removals),
        "exact_removed": sum(m["exact_removed"] for m in removals),
        "near_removed": sum(m["near_removed"] for m in removals),
    }


def _contamination(pipe: Pipeline) -> dict:
    """contamination.json (per benchmark: items, dirty items by line and by ``id`` where items have
    one, and the documents that matched each); returns {benchmark: {items, dirty}}."""
    from data_pipeline.stages.benchmarks import load_index

    index, cfg = load_index(pipe), pipe.recipe.decontam
    if index is None:
        return {}
    partials = pipe.markers("decontam", pipe.partitions)
    report: dict = {
        "n": cfg.n,
        "mode": cfg.mode,
        "ignored_frequent_ngrams": sum(m["ignored_frequent_ngrams"] for m in partials),
        "benchmarks": {},
    }
    for item in index.items:
        b = report["benchmarks"].setdefault(
            item["benchmark"],
            {"items": 0, "checkable": 0, "dirty": 0, "dirty_items": [], "dirty_ids": [], "matched_documents": {}},
        )
        b["items"] += 1
        b["checkable"] += item["words"] >= cfg.n
    ids: dict[tuple[str, str], str | None] = {}  # (benchmark, line) -> the item's id
    for partial in partials:
        for i, docs in partial["matched"].items():
            item = index.items[int(i)]
            found = report["benchmarks"][item["benchmark"]]["matched_documents"]
            found.setdefault(str(item["item"]), set()).update(docs)
            ids[item["benchmark"], str(item["item"])] = item.get("id")
    for name, b in report["benchmarks"].items():
        found = sorted(b["matched_documents"].items(), key=lambda kv: int(kv[0]))
        b["matched_documents"] = {k: sorted(v) for k, v in found}
        b["dirty_items"] = [int(k) for k in b["matched_documents"]]
        b["dirty_ids"] = [ids[name, k] for k in b["matched_documents"] if ids[name, k] is not None]
        b["dirty"] = len(b["dirty_items"])
        b["clean"] = b["items"] - b["dirty"]
    pipe.store.write_bytes("contamination.json", json.dumps(report, indent=1).encode())
    return {k: {"dirty": v["dirty"], "items": v["items"]} for k, v in report["benchmarks"].items()}


def run(pipe: Pipeline, name: str, task: int) -> dict:
    from data_pipeline.card import write_card
    from data_pipeline.manifest import write_output_manifest

    n = len(pipe.inputs)
    merged = Stats()
    for stage, tasks in (("benchmarks", 1), ("filter", n), ("write", n)):
        for marker in pipe.markers(stage, tasks):
            merged.merge(Stats.from_dict(marker["stats"]))
    writes = pipe.markers("write", n)
    shards = [s for m in writes for s in m["shards"]]
    counts = [c for m in writes for c in m["counts"]]
    write_card(
        pipe.store, pipe.recipe, merged, _dedup(pipe), _contamination(pipe), shards, pipe.inputs, pipe.benchmarks
    )
    write_output_manifest(pipe.store, recipe=pipe.recipe.name, shards=shards, counts=counts)
    return {"shards": len(shards), "documents": sum(counts)}
