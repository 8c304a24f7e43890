"""The docstring classification task (``glm data docstring-task``) as multiple choice: "which
standard-library module is this docstring from?", the module names as the candidates."""

from __future__ import annotations

import hashlib
from collections import Counter

from data_pipeline.embedded import TASK_MODULES, docstring_task
from data_pipeline.tasks.built import BuiltTask, stable_order


def build(*, test_per_mille: int = 750) -> BuiltTask:
    modules = sorted(TASK_MODULES)
    rows = [
        {
            "id": f"docstring:{r['label']}:{hashlib.sha1(r['text'].encode()).hexdigest()[:12]}",
            "text": r["text"],
            "choices": modules,
            "label": modules.index(r["label"]),
        }
        for r in docstring_task()
    ]
    held = {r["id"]: int(hashlib.sha1(r["id"].encode()).hexdigest()[:8], 16) % 1000 < test_per_mille for r in rows}
    test = stable_order([r for r in rows if held[r["id"]]])
    train = stable_order([r for r in rows if not held[r["id"]]])
    label, count = Counter(r["label"] for r in test).most_common(1)[0]
    baselines = {"acc: chance": 1 / len(modules), f"acc: majority ({modules[label]})": count / len(test)}
    card = f"""Source: the first paragraph of the docstrings of the functions, classes and methods of the
standard-library modules {", ".join(modules)} (`data_pipeline/embedded.py: docstring_task`, read with
`inspect` from this Python; no download). Each item asks which module a docstring comes from, the module names
as the choices. A hash of the item id puts {test_per_mille / 10:.0f}% of the items in the test split, the rest
in the train split (few-shot examples). Item id: `docstring:<module>:<sha1 of the text, 12 hex digits>`."""
    return BuiltTask(
        "docstring_mc", {"train": train, "test": test}, baselines, card, {"test_per_mille": test_per_mille}
    )
