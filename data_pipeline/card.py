"""stats.json, the data card (README.md) and the funnel chart (funnel.png) of a pipeline run."""
from __future__ import annotations

import dataclasses
import json
import os

from data_pipeline.document import Stats
from data_pipeline.executors.tasks import atomic_write_bytes
from data_pipeline.recipe import STAGES, Recipe


def funnel(stats: Stats) -> list[dict]:
    """Documents and bytes left after each stage, in pipeline order (read counts pages)."""
    rows = []
    order = ["read", *STAGES, "dedup", "decontam"]
    for name, st in sorted(stats.stages.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99):
        rows.append({"stage": name, "documents": st.kept, "bytes": st.bytes_kept, "dropped": st.seen - st.kept})
    return rows


def write_card(out: str, recipe: Recipe, stats: Stats, clusters: dict, shards: list[str], inputs: list[str],
               benchmarks: list[str]) -> None:
    rows = funnel(stats)
    # Paths inside the output (the materialised sample) are written relative to it.
    inputs = [os.path.relpath(p, out) if p.startswith(out + os.sep) else p for p in inputs]
    benchmarks = [os.path.relpath(p, out) if p.startswith(out + os.sep) else p for p in benchmarks]
    reasons = sorted(((r, n) for st in stats.stages.values() for r, n in st.dropped.items()), key=lambda x: -x[1])
    summary = {"recipe": recipe.name, "inputs": inputs, "benchmarks": benchmarks, "funnel": rows,
               "stages": stats.to_dict()["stages"], "input_errors": dict(stats.error_count),
               "input_error_examples": stats.errors, "other_warc_records": dict(stats.records),
               "languages": dict(stats.languages.most_common()), "dedup": {k: v for k, v in clusters.items() if k != "contamination"},
               "contamination": clusters.get("contamination", {}), "shards": shards,
               "settings": {k: v for k, v in dataclasses.asdict(recipe).items() if k not in ("output", "workers", "input", "benchmarks")}}
    atomic_write_bytes(os.path.join(out, "stats.json"), json.dumps(summary, indent=1, default=str).encode())
    _plot(rows, stats.languages.most_common(12), reasons[:12], os.path.join(out, "funnel.png"))
    lines = [f"# Data card: {recipe.name}", "",
             f"{len(inputs)} input file(s) -> {rows[-1]['documents'] if rows else 0} documents in {len(shards)} shard(s) "
             "(`documents/*.jsonl.gz`, one JSON object per line: id, text and metadata).", "",
             "## Funnel", "", "![funnel](funnel.png)", "",
             "| stage | documents left | MB left | dropped |", "|---|---:|---:|---:|"]
    lines += [f"| {r['stage']} | {r['documents']} | {r['bytes'] / 1e6:.3f} | {r['dropped']} |" for r in rows]
    lines += ["", "## Top drop reasons", "", "| reason | documents |", "|---|---:|"]
    lines += [f"| {r} | {n} |" for r, n in reasons[:20]]
    lines += ["", "## Languages (identified, before the language filter)", "", "| language | documents |", "|---|---:|"]
    lines += [f"| {lang} | {n} |" for lang, n in stats.languages.most_common(15)]
    lines += ["", "## Deduplication", ""]
    lines += [f"- {k.replace('_', ' ')}: {v}" for k, v in clusters.items() if k != "contamination"]
    lines += ["", "## Decontamination", ""]
    if clusters.get("contamination"):
        lines += ["| benchmark | items | dirty |", "|---|---:|---:|"]
        lines += [f"| {b} | {v['items']} | {v['dirty']} |" for b, v in clusters["contamination"].items()]
        lines += ["", "Per-item details (which items are dirty, which documents matched): `contamination.json`."]
    else:
        lines.append("No benchmark files given.")
    lines += ["", "## Input errors (skipped and counted)", ""]
    if stats.error_count:
        lines += [f"- {r}: {n}" for r, n in sorted(stats.error_count.items())]
        lines += ["", "The first ones with file and offset are listed in `stats.json` (input_error_examples)."]
    else:
        lines.append("None.")
    atomic_write_bytes(os.path.join(out, "README.md"), ("\n".join(lines) + "\n").encode())


def _plot(rows: list[dict], languages: list[tuple[str, int]], reasons: list[tuple[str, int]], path: str) -> None:
    """Four panels: documents and MB left after each stage, languages, top drop reasons."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 0.4 * max(len(rows), len(reasons), len(languages), 4) + 1.5
    fig, axes = plt.subplots(2, 2, figsize=(13, 2 * height))
    names = [r["stage"] for r in rows][::-1]
    panels = [(axes[0][0], names, [r["documents"] for r in rows][::-1], "documents left after each stage"),
              (axes[0][1], names, [r["bytes"] / 1e6 for r in rows][::-1], "MB left after each stage"),
              (axes[1][0], [k for k, _ in languages][::-1], [n for _, n in languages][::-1], "documents by language (identified)"),
              (axes[1][1], [k[:48] for k, _ in reasons][::-1], [n for _, n in reasons][::-1], "top drop reasons (documents)")]
    for ax, labels, values, title in panels:
        ax.barh(labels, values, color="#4c72b0")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle("glm-dist data pipeline funnel")
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=80, metadata={"Software": None})
    plt.close(fig)
    os.replace(tmp, path)
