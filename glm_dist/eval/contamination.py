"""Contamination-aware scores (GPT-3's analysis): every score on all items, on the clean subset and
on the dirty subset (``glm eval --tasks ... --contamination PATH/contamination.json``).

Which items are dirty is the crawl pipeline's decision, read from its ``contamination.json``
(``data_pipeline/stages/card.py``): its n-gram size, text normalisation and frequency rule are the
ones that cleaned the training data, so one lineage runs from crawl to score. Items are matched by
their ``id`` field, which every offline task item has (``data_pipeline/tasks``). Each subset's
score is the task's own lm-eval aggregation over that subset's per-item values.
"""

from __future__ import annotations

import json
from pathlib import Path

from glm_dist.config.schema import EvalConfig
from glm_dist.eval.harness import GlmLM, HarnessError
from glm_dist.eval.in_loop import task_manager

MAX_REPORT_BYTES = 256 * 2**20
SUBSETS = ("all", "clean", "dirty")


def dirty_ids(path: str | Path) -> tuple[set[str], dict]:
    """The ids of every dirty item in a pipeline run's contamination.json, and its settings."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size > MAX_REPORT_BYTES:
        raise HarnessError(
            f"--contamination {path}: not a contamination.json of at most {MAX_REPORT_BYTES} bytes "
            f"(glm data run writes one beside its documents when the recipe names benchmarks)"
        )
    try:
        report = json.loads(path.read_text())
        benchmarks = report["benchmarks"]
        ids = {str(i) for b in benchmarks.values() for i in b["dirty_ids"]}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise HarnessError(
            f"--contamination {path}: no per-benchmark dirty_ids ({type(err).__name__}: {err}); "
            f"rerun glm data run (it records each dirty item's id)"
        ) from None
    return ids, {"file": str(path), "n": report.get("n"), "benchmarks": sorted(benchmarks)}


def split_scores(samples: list[dict], aggregation: dict, dirty: set[str], task: str) -> dict:
    """``{"all" | "clean" | "dirty": {"items": n, "metric,filter": score}}`` of one task's logged samples."""
    missing = [s["doc_id"] for s in samples if s["doc"].get("id") is None]
    if missing:
        raise HarnessError(
            f"task {task}: document {missing[0]} has no 'id' field, so it cannot be matched with "
            f"the pipeline's dirty items"
        )
    subsets = {
        "all": samples,
        "clean": [s for s in samples if str(s["doc"]["id"]) not in dirty],
        "dirty": [s for s in samples if str(s["doc"]["id"]) in dirty],
    }
    out = {}
    for name, rows in subsets.items():
        scores = {"items": len({s["doc_id"] for s in rows})}
        for metric, aggregate in aggregation.items():
            for filt in sorted({s["filter"] for s in rows if metric in s}):
                values = [s[metric] for s in rows if s["filter"] == filt and metric in s]
                scores[f"{metric},{filt}"] = float(aggregate(values))
        out[name] = scores
    return out


def run_contamination(
    checkpoint: str,
    tasks: list[str],
    *,
    contamination: str,
    include_path: str | None = None,
    num_fewshot: int | None = None,
    limit: float | None = None,
    batch_size: int = 8,
    out: str | None = None,
) -> dict | None:
    """lm-eval's ``simple_evaluate`` with per-item results, split by the pipeline's dirty items;
    prints lm-eval's table and the split, writes both as JSON to ``out`` (rank 0; others: None)."""
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable, make_table

    dirty, source = dirty_ids(contamination)
    manager, names = task_manager(EvalConfig(tasks=tasks, include_path=include_path))
    results = simple_evaluate(
        model=GlmLM(checkpoint, batch_size=batch_size),
        tasks=names,
        num_fewshot=num_fewshot,
        limit=limit,
        task_manager=manager,
        log_samples=True,
    )
    if results is None:
        return None
    loaded = manager.load(names)["tasks"]
    split = {
        task: split_scores(samples, loaded[task].aggregation(), dirty, task)
        for task, samples in results["samples"].items()
    }
    print(make_table(results))
    print(format_split(split))
    report = {"results": results["results"], "contamination": {"source": source, "tasks": split}}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2, default=handle_non_serializable))
        print(f"results: {out}")
    return report


def format_split(split: dict) -> str:
    """A markdown table: task, metric, then the score and item count on all, clean and dirty items."""
    lines = ["|Task|Metric|All|Clean|Dirty|Items (all/clean/dirty)|", "|---|---|--:|--:|--:|--:|"]
    for task, subsets in split.items():
        counts = "/".join(str(subsets[s]["items"]) for s in SUBSETS)
        for metric in (k for k in subsets["all"] if k != "items"):
            cells = [f"{subsets[s][metric]:.4f}" if metric in subsets[s] else "-" for s in SUBSETS]
            lines.append(f"|{task}|{metric}|{'|'.join(cells)}|{counts}|")
    return "\n".join(lines)
