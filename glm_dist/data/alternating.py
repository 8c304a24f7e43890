"""Whole minibatches from one split at a time: labelled and unlabelled in turn (Cross-View Training).

A tagging shard set (data_pipeline/tasks/tagging_shards.py) has one split per task's labelled
sentences (``labelled-<k>``) and one of unlabelled sentences (``train``); a translation pair set
built with ``data.labelled_pairs`` (data_pipeline/tokenize/pairs.py) has its labelled pairs
(``train``) and the other pairs' sources (``unlabelled``). Each is read by its own
``Loader`` (or ``WorkerLoader``), with everything that gives a loader: each rank reads only its
share, deterministic order, epochs, elastic resume. Step s is labelled when s is even, unlabelled
when odd (``objective.cvt_unlabelled=false``: always labelled, the supervised baseline); a labelled
step's task is drawn from ``default_rng([seed, TASK_DRAW, s])``, the same on every rank. The state
is the step counter and each split's loader position, so a resumed run sees the same batches.
"""

from __future__ import annotations

import numpy as np

from glm_dist.data.loader import Loader
from glm_dist.data.shards import ShardSetError, read_manifest
from glm_dist.data.workers import WorkerLoader
from glm_dist.errors import GlmError

STATE_FORMAT = "glm-dist/alternating/v1"
TASK_DRAW = 0x7A5C  # the RNG domain of the labelled steps' task draws


class TagsMismatch(GlmError, ValueError):
    """The model's prediction modules do not match the shard set's tasks."""


def splits(shards_dir: str, manifest: dict, options) -> tuple[list[str], str]:
    """(the labelled splits, one per task; the unlabelled split) of a tagging set or a pair set."""
    if "unlabelled" in manifest.get("splits", {}):  # a pair set with unlabelled sources: one task
        return ["train"], "unlabelled"
    tasks = (manifest.get("tagging") or {}).get("tasks")
    if not tasks:
        raise ShardSetError(
            f"{shards_dir} is neither a tagging shard set (its manifest lists no tasks; glm data "
            f"tagging -c CONFIG) nor a pair set with unlabelled sources (glm data tokenize -c CONFIG "
            f"with data.labelled_pairs=N)"
        )
    counts = [len(t["tags"]) for t in tasks]
    if options is not None and list(options.tag_counts) != counts:
        raise TagsMismatch(
            f"model.tags={list(options.tag_counts)} but {shards_dir} has tasks "
            + ", ".join(f"{t['name']} ({len(t['tags'])} tags)" for t in tasks)
            + f": set model.tags={counts}"
        )
    return [f"labelled-{k}" for k in range(len(tasks))], "train"


class AlternatingLoader:
    def __init__(self, shards_dir: str, *, num_workers: int = 0, seed: int = 0, options=None, **loader_kwargs):
        labelled, unlabelled = splits(shards_dir, read_manifest(shards_dir), options)
        self.seed, self.steps = seed, 0
        self.unlabelled_steps = options is None or options.cvt_unlabelled

        def make(split: str):
            kw = dict(split=split, seed=seed, options=options, **loader_kwargs)
            return WorkerLoader(shards_dir, num_workers=num_workers, **kw) if num_workers else Loader(shards_dir, **kw)

        self.labelled = [make(split) for split in labelled]
        self.unlabelled = make(unlabelled) if self.unlabelled_steps else None

    @property
    def global_batch_size(self) -> int:
        return self.labelled[0].global_batch_size

    @property
    def epoch(self) -> int:
        """The epoch of task 0's labelled sentences."""
        return self.labelled[0].epoch

    def source(self, step: int):
        """The loader step ``step`` takes its minibatches from."""
        if self.unlabelled_steps and step % 2 == 1:
            return self.unlabelled
        draw = np.random.default_rng([self.seed, TASK_DRAW, step]).integers(len(self.labelled))
        return self.labelled[int(draw)]

    def next_step(self):
        batches = self.source(self.steps).next_step()
        self.steps += 1
        return batches

    def read_counts(self) -> dict[str, int]:
        """Its loaders' read counts, summed."""
        loaders = self.labelled + ([self.unlabelled] if self.unlabelled is not None else [])
        counts = [lo.read_counts() for lo in loaders]
        return {k: sum(c[k] for c in counts) for k in counts[0]}

    def state_dict(self) -> dict:
        return {
            "format": STATE_FORMAT,
            "steps": self.steps,
            "labelled": [lo.state_dict() for lo in self.labelled],
            "unlabelled": self.unlabelled.state_dict() if self.unlabelled is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"the data position was not saved by the alternating loader (format "
                f"{state.get('format')!r}): resume a run of the same objective"
            )
        if len(state["labelled"]) != len(self.labelled) or (state["unlabelled"] is None) != (self.unlabelled is None):
            raise ValueError(
                f"the data position was saved for {len(state['labelled'])} labelled splits "
                f"{'with' if state['unlabelled'] is not None else 'without'} unlabelled steps; "
                f"this run has {len(self.labelled)} "
                f"{'with' if self.unlabelled is not None else 'without'}: resume with "
                f"the same shard set and objective.cvt_unlabelled"
            )
        for loader, saved in zip(self.labelled, state["labelled"]):
            loader.load_state_dict(saved)
        if self.unlabelled is not None:
            self.unlabelled.load_state_dict(state["unlabelled"])
        self.steps = state["steps"]
