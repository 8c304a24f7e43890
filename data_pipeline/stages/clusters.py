"""clusters (rounds of ``partitions`` tasks): connected components of the candidate pairs.

Round r is stage ``clusters-RRR``: even rounds are large-star steps, odd rounds small-star steps
(``dedup/components.py``). Task q of a round reads the pairs keyed by the nodes of partition q from
every task of the round before (the buckets stage for round 0), rewires them and writes its output
grouped by the partition each pair goes to next. A round is planned only when the one before has
finished: after a large-star round in which no task found a node that is not yet a star, the
components are stars around their first document and the rounds end; that round's tasks have also
written their pairs (member, first document) grouped by input file, for the removals stage.

Memory per task: the pairs of its partition (~48 bytes a pair while it sorts them); reported in
each marker. The rounds run under the same executors as every stage (``Pipeline.stages`` lists them
as far as they are known; ``executors/slurm.py`` submits them one array per round).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from data_pipeline.dedup.components import large_star, small_star
from data_pipeline.dedup.shuffle import EDGE, as_edges, file_of, node_partition, read_routed, write_routed
from data_pipeline.executors.tasks import done_tasks, read_marker, run_once
from data_pipeline.errors import PipelineError
from glm_common.storage import Storage

if TYPE_CHECKING:  # the pipeline imports the stages
    from data_pipeline.pipeline import Pipeline

FINAL = "clusters/final.json"
MAX_ROUNDS = 400  # log(diameter) rounds in practice (a 200k-node path in random order: 29)


def round_name(r: int) -> str:
    return f"clusters-{r:03d}"


class Rounds:
    """The clusters rounds over the pairs in ``sources`` (objects under ``work`` routed to ``parts``
    node partitions), for documents of ``files`` input files; how far they have got is read from
    their markers."""

    def __init__(self, work: Storage, parts: int, files: int, sources: list[str]) -> None:
        self.work, self.parts, self.files, self.sources = work, parts, files, sources
        self._outcomes: dict[int, dict] = {}

    def outcome(self, r: int) -> dict | None:
        """Round r's summed markers, or None while any of its tasks is unfinished."""
        if r not in self._outcomes:
            if len(done_tasks(self.work, round_name(r))) < self.parts:
                return None
            markers = [read_marker(self.work, round_name(r), q) for q in range(self.parts)]
            self._outcomes[r] = {k: sum(m.get(k, 0) for m in markers) for k in ("unconverged", "centers", "pairs_in")}
        return self._outcomes[r]

    def plan(self) -> list[tuple[str, int]]:
        out, r = [], 0
        while True:
            out.append((round_name(r), self.parts))
            done = self.outcome(r)
            if done is None or (r % 2 == 0 and done["unconverged"] == 0):
                return out
            r += 1
            if r == MAX_ROUNDS:
                raise PipelineError(f"clusters: no convergence after {MAX_ROUNDS} rounds ({self.work.path('markers')})")

    def final(self) -> dict:
        """The large-star round that found every component a star, and its number of stars
        (``clusters/final.json``, written once by whoever first sees the rounds finished)."""
        if self.work.exists(FINAL):
            return json.loads(self.work.read(FINAL, max_bytes=1 << 20))
        last = len(self.plan()) - 1
        done = self.outcome(last)
        if done is None or last % 2 or done["unconverged"]:
            raise PipelineError(f"clusters: round {last} has not finished; run the clusters rounds first")
        final = {"round": last, "centers": done["centers"]}
        self.work.write_bytes(FINAL, json.dumps(final).encode())
        return final

    def labels(self) -> list[str]:
        """The objects holding (member, first document of its component) for every document that is
        not the first of its component, grouped by input file."""
        r = self.final()["round"]
        return [f"clusters/r{r:03d}/{q:05d}.labels" for q in range(self.parts)]

    def inputs(self, r: int) -> list[str]:
        return self.sources if r == 0 else [f"clusters/r{r - 1:03d}/{q:05d}" for q in range(self.parts)]

    def run(self, r: int, q: int) -> dict:
        records, _ = read_routed(self.work, self.inputs(r), q, EDGE)
        pairs = as_edges(records)
        key = f"clusters/r{r:03d}/{q:05d}"
        if r % 2 == 0:
            out, counts = large_star(pairs)  # (v, m), v > m: small-star groups by v
            write_routed(self.work, key, out, node_partition(out[:, 0], self.parts), self.parts)
            if counts["unconverged"] == 0:  # stars here: (member, first) pairs, should the round be the last
                write_routed(self.work, key + ".labels", out, file_of(out[:, 0]), self.files)
            return {"pairs_in": int(len(pairs)), "pairs_out": int(len(out)), **counts}
        out = small_star(pairs)
        both = np.concatenate([out, out[:, ::-1]])  # large-star groups by both ends
        write_routed(self.work, key, both, node_partition(both[:, 0], self.parts), self.parts)
        return {"pairs_in": int(len(pairs)), "pairs_out": int(len(both))}

    def run_task(self, name: str, task: int) -> None:
        run_once(self.work, name, task, lambda: self.run(int(name.rsplit("-", 1)[1]), task))


def rounds(pipe: Pipeline) -> Rounds:
    from data_pipeline.stages.buckets import edges_key

    return Rounds(pipe.work, pipe.partitions, len(pipe.inputs), [edges_key(p) for p in range(pipe.partitions)])


def plan(pipe: Pipeline) -> list[tuple[str, int]]:
    return rounds(pipe).plan() if pipe.dedup_on() else []


def run(pipe: Pipeline, name: str, task: int) -> dict:
    return rounds(pipe).run(int(name.rsplit("-", 1)[1]), task)


class ComponentsJob:
    """The clusters rounds alone, over pairs already routed to ``parts`` partitions (tests, benchmarks):
    a job for the executors, like a :class:`Pipeline`."""

    def __init__(self, work_url: str, parts: int, files: int, sources: list[str]) -> None:
        self.work = Storage(work_url)
        self.rounds = Rounds(self.work, parts, files, sources)

    def stages(self) -> list[tuple[str, int]]:
        return self.rounds.plan()

    def run_task(self, stage: str, task: int) -> None:
        self.rounds.run_task(stage, task)
