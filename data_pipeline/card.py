"""stats.json, the data card (README.md) and the funnel chart (funnel.png) of a pipeline run."""

from __future__ import annotations

import dataclasses
import io
import json

from data_pipeline.document import Stats, ranked
from data_pipeline.recipe import STAGES, Recipe
from glm_common.storage import Storage


def funnel(stats: Stats) -> list[dict]:
    """Documents and bytes left after each stage, in pipeline order (read counts pages)."""
    rows = []
    order = ["read", *STAGES, "dedup", "decontam"]
    for name, st in sorted(stats.stages.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99):
        rows.append({"stage": name, "documents": st.kept, "bytes": st.bytes_kept, "dropped": st.seen - st.kept})
    return rows


def _relative(path: str, out: str) -> str:
    """Paths inside the output (the materialised sample) are written relative to it."""
    return path[len(out) + 1 :] if path.startswith(out + "/") else path


def write_card(
    store: Storage,
    recipe: Recipe,
    stats: Stats,
    dedup: dict,
    contamination: dict,
    shards: list[str],
    inputs: list[str],
    benchmarks: list[str],
) -> None:
    rows = funnel(stats)
    inputs = [_relative(p, store.url) for p in inputs]
    benchmarks = [_relative(p, store.url) for p in benchmarks]
    reasons = sorted(
        ((r, n) for st in stats.stages.values() for r, n in st.dropped.items()), key=lambda x: (-x[1], x[0])
    )
    summary = {
        "recipe": recipe.name,
        "inputs": inputs,
        "benchmarks": benchmarks,
        "funnel": rows,
        "stages": stats.to_dict()["stages"],
        "input_errors": dict(sorted(stats.error_count.items())),
        "input_error_examples": stats.errors,
        "other_warc_records": dict(sorted(stats.records.items())),
        "languages": dict(ranked(stats.languages)),
        "dedup": dedup,
        "contamination": contamination,
        "shards": shards,
        "settings": {
            k: v for k, v in dataclasses.asdict(recipe).items() if k not in ("output", "workers", "input", "benchmarks")
        },
    }
    store.write_bytes("stats.json", json.dumps(summary, indent=1, default=str).encode())
    store.write_bytes("funnel.png", _plot(rows, ranked(stats.languages, 12), reasons[:12]))
    lines = [
        f"# Data card: {recipe.name}",
        "",
        f"{len(inputs)} input file(s) -> {rows[-1]['documents'] if rows else 0} documents in "
        f"{len(shards)} shard(s) "
        "(`documents/*.jsonl.gz`, one JSON object per line: id, text and metadata).",
        "",
        "## Funnel",
        "",
        "![funnel](funnel.png)",
        "",
        "| stage | documents left | MB left | dropped |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {r['stage']} | {r['documents']} | {r['bytes'] / 1e6:.3f} | {r['dropped']} |" for r in rows]
    lines += ["", "## Top drop reasons", "", "| reason | documents |", "|---|---:|"]
    lines += [f"| {r} | {n} |" for r, n in reasons[:20]]
    lines += ["", "## Languages (identified, before the language filter)", "", "| language | documents |", "|---|---:|"]
    lines += [f"| {lang} | {n} |" for lang, n in ranked(stats.languages, 15)]
    lines += ["", "## Deduplication", ""]
    lines += [f"- {k.replace('_', ' ')}: {v}" for k, v in dedup.items()]
    lines += ["", "## Decontamination", ""]
    if contamination:
        lines += ["| benchmark | items | dirty |", "|---|---:|---:|"]
        lines += [f"| {b} | {v['items']} | {v['dirty']} |" for b, v in contamination.items()]
        lines += ["", "Per-item details (which items are dirty, which documents matched): `contamination.json`."]
    else:
        lines.append("No benchmark files given.")
    lines += ["", "## Input errors (skipped and counted)", ""]
    if stats.error_count:
        lines += [f"- {r}: {n}" for r, n in sorted(stats.error_count.items())]
        lines += ["", "The first ones with file and offset are listed in `stats.json` (input_error_examples)."]
    else:
        lines.append("None.")
    store.write_bytes("README.md", ("\n".join(lines) + "\n").encode())


def _plot(rows: list[dict], languages: list[tuple[str, int]], reasons: list[tuple[str, int]]) -> bytes:
    """Four panels: documents and MB left after each stage, languages, top drop reasons (PNG bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 0.4 * max(len(rows), len(reasons), len(languages), 4) + 1.5
    fig, axes = plt.subplots(2, 2, figsize=(13, 2 * height))
    names = [r["stage"] for r in rows][::-1]
    panels = [
        (axes[0][0], names, [r["documents"] for r in rows][::-1], "documents left after each stage"),
        (axes[0][1], names, [r["bytes"] / 1e6 for r in rows][::-1], "MB left after each stage"),
        (
            axes[1][0],
            [k for k, _ in languages][::-1],
            [n for _, n in languages][::-1],
            "documents by language (identified)",
        ),
        (axes[1][1], [k[:48] for k, _ in reasons][::-1], [n for _, n in reasons][::-1], "top drop reasons (documents)"),
    ]
    for ax, labels, values, title in panels:
        ax.barh(labels, values, color="#4c72b0")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle("glm-dist data pipeline funnel")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
