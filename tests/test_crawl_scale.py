"""The crawl pipeline at cluster scale: connected components one partition per task (equal to the
one-process components on generated graphs with planted clusters), per-task memory in the markers,
the filter steps as a list built from the recipe, and data_pipeline standing below glm_dist."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from data_pipeline.dedup.components import components
from data_pipeline.dedup.shuffle import EDGE, as_edges, node_partition, read_routed, write_routed
from data_pipeline.executors.local import run_job
from data_pipeline.stages.clusters import ComponentsJob, round_name
from glm_common.storage import Storage

ROOT = Path(__file__).resolve().parents[1]


def planted_clusters(n: int, files: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` documents spread over ``files`` input files (packed ids), half of them in planted
    clusters of 2 to 200 members wired as an LSH bucket graph would be (stars around a random member,
    chained to each other), plus one long chain of near-duplicates (a page edited many times).
    Returns (packed ids in input order, pairs of packed ids)."""
    rng = np.random.default_rng(seed)
    per_file = np.bincount(rng.integers(0, files, n), minlength=files)
    ids = np.concatenate([(np.int64(f) << np.int64(32)) | np.arange(k, dtype=np.int64) for f, k in enumerate(per_file)])
    order = rng.permutation(n)
    chain = order[:2000]  # diameter 1999: the rounds' worst case here
    sizes = np.minimum(200, 2 + rng.pareto(1.5, n // 2)).astype(np.int64)
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), n // 2 - len(chain)) + 1]  # clusters up to n / 2 members
    members = order[len(chain) : len(chain) + sizes.sum()]
    cluster = np.repeat(np.arange(len(sizes)), sizes)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])[cluster]  # each member's cluster's first position
    hubs = members[first + (rng.random(len(members)) * sizes[cluster]).astype(np.int64)]  # several stars per cluster
    linked = (cluster[1:] == cluster[:-1]) & (rng.random(len(members) - 1) < 0.3)
    dense = np.concatenate(
        [
            np.stack([chain[:-1], chain[1:]], axis=1),
            np.stack([hubs, members], axis=1),
            np.stack([members[:-1], members[1:]], axis=1)[linked],
        ]
    )
    dense = dense[dense[:, 0] != dense[:, 1]]
    return ids, ids[dense]


def connected_by_rounds(
    tmp_path: Path, ids: np.ndarray, pairs: np.ndarray, files: int, parts: int, workers: int
) -> tuple[np.ndarray, ComponentsJob]:
    """Route the pairs as the buckets stage does (4 producers, both directions), run the rounds with
    the local executor, and read back each document's label (its component's first document)."""
    work = Storage(str(tmp_path / "work"))
    sources = []
    for k, chunk in enumerate(np.array_split(pairs, 4)):
        both = np.concatenate([chunk, chunk[:, ::-1]])
        write_routed(work, f"in/{k}", both, node_partition(both[:, 0], parts), parts)
        sources.append(f"in/{k}")
    job = ComponentsJob(work.url, parts, files, sources)
    run_job(job, workers=workers, progress=False)
    labels = ids.copy()  # sorted: files, then positions
    for f in range(files):
        member_first = as_edges(read_routed(work, job.rounds.labels(), f, EDGE)[0])
        labels[np.searchsorted(ids, member_first[:, 0])] = member_first[:, 1]
    return labels, job


def test_partitioned_components_equal_one_process_components_on_planted_clusters(tmp_path):
    n, files, parts = 1_000_000, 16, 8
    ids, pairs = planted_clusters(n, files, seed=0)
    labels, job = connected_by_rounds(tmp_path, ids, pairs, files, parts, workers=2)
    dense = np.searchsorted(ids, pairs)
    assert np.array_equal(labels, ids[components(n, dense)])
    rounds = job.stages()
    assert 3 <= len(rounds) < 60 and len(rounds) % 2 == 1  # ends on a large-star round
    # Memory per task is bounded by its partition: no task reads more than its share (hash ranges,
    # with room for the hubs), and every marker reports the task's peak memory.
    from data_pipeline.executors.tasks import read_marker

    first = [read_marker(job.work, round_name(0), q) for q in range(parts)]
    total = sum(m["pairs_in"] for m in first)
    assert total == 2 * len(pairs) and max(m["pairs_in"] for m in first) < 1.5 * total / parts
    assert all(m["memory"]["peak_rss_mb"] > 0 and "task_mb" in m["memory"] for m in first)


def test_components_of_a_corpus_without_pairs_and_of_one_partition(tmp_path):
    ids = np.arange(10, dtype=np.int64)
    labels, job = connected_by_rounds(tmp_path / "none", ids, np.zeros((0, 2), np.int64), 1, 3, workers=1)
    assert np.array_equal(labels, ids) and len(job.stages()) == 1
    pairs = np.array([[3, 7], [7, 9], [0, 1], [9, 2]], dtype=np.int64)
    labels, _ = connected_by_rounds(tmp_path / "one", ids, pairs, 1, 1, workers=1)
    assert labels.tolist() == [0, 0, 2, 2, 4, 5, 6, 2, 8, 2]


def test_filter_steps_are_a_list_built_from_the_recipe_in_its_order():
    from data_pipeline.document import Document, Stats
    from data_pipeline.filters.steps import BUILDERS, apply, build_steps
    from data_pipeline.recipe import STAGES, Recipe

    assert set(BUILDERS) == set(STAGES)
    recipe = Recipe(stages=["fineweb", "gopher_quality", "url"])
    recipe.url.banned_substrings = ["casino"]
    recipe.gopher_quality.enabled = False
    stats = Stats()
    steps = build_steps(recipe, stats)
    assert [name for name, _ in steps] == ["fineweb", "url"]
    doc = Document("d", "One line only without an end", {"url": "https://casino.example/"})
    assert apply(doc, steps, stats, "f") == ("fineweb: too few lines ending in punctuation", "fineweb")
    assert stats.stages["fineweb"].dropped == {"fineweb: too few lines ending in punctuation": 1}


def test_data_pipeline_does_not_import_glm_dist():
    offenders = []
    for path in sorted((ROOT / "data_pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {name}"
                for name in names
                if name == "glm_dist" or name.startswith("glm_dist.")
            ]
    assert not offenders, "data_pipeline must not import glm_dist (arrows point down):\n" + "\n".join(offenders)


def test_store_writes_are_whole_or_nothing(tmp_path):
    store = Storage(str(tmp_path / "s"))
    with pytest.raises(RuntimeError):
        with store.open_write("a/b.bin") as f:
            f.write(b"half")
            raise RuntimeError("killed mid-write")
    assert not store.exists("a/b.bin") and store.listdir("a") == []
    store.write_bytes("a/b.bin", b"whole")
    assert store.read("a/b.bin", max_bytes=10) == b"whole" and store.read_ranges(["a/b.bin"], [1], [3]) == [b"ho"]
    with pytest.raises(ValueError, match="more than the 3 allowed"):
        store.read("a/b.bin", max_bytes=3)
