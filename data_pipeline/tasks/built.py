"""A built offline task (its splits, trivial baselines and data card), its stable row order, and
writing it to a folder."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field


@dataclass
class BuiltTask:
    name: str
    splits: dict[str, list[dict]]  # split -> rows, each with a stable "id"
    baselines: dict[str, float]  # trivial scores on the test split (chance, majority, ...)
    card: str  # markdown: source, construction, sizes
    settings: dict = field(default_factory=dict)


def stable_order(rows: list[dict]) -> list[dict]:
    """Rows ordered by a hash of their id: a fixed, content-independent shuffle."""
    return sorted(rows, key=lambda r: hashlib.sha1(r["id"].encode()).hexdigest())


def write_task(task: BuiltTask, out_dir: str) -> dict[str, str]:
    """``out_dir/<split>.jsonl`` per split, ``README.md`` (the data card) and ``baselines.json``;
    returns split -> absolute path."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for split, rows in task.splits.items():
        ids = [r["id"] for r in rows]
        assert len(set(ids)) == len(ids), f"{task.name}/{split}: duplicate ids"
        paths[split] = os.path.abspath(os.path.join(out_dir, f"{split}.jsonl"))
        with open(paths[split], "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    sizes = ", ".join(f"{split} {len(rows)}" for split, rows in task.splits.items())
    baselines = "\n".join(f"| {k} | {v:.4f} |" for k, v in task.baselines.items())
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write(
            f"# {task.name}\n\n{task.card.strip()}\n\nItems: {sizes}.\n\n"
            f"| trivial baseline (test split) | score |\n|---|---|\n{baselines}\n"
        )
    with open(os.path.join(out_dir, "baselines.json"), "w") as f:
        json.dump(
            {
                "baselines": task.baselines,
                "sizes": {s: len(r) for s, r in task.splits.items()},
                "settings": task.settings,
            },
            f,
            indent=1,
        )
    return paths
