"""Co-occurrence counts (Pennington et al. 2014) as a shard set that ``glm train`` reads like any other.

Input: a word-level token shard set (``<out>/tokens``, the ``word`` profile). Output, in ``<out>``:
count shards (webdataset tars) whose samples are blocks of (word, context, count) triples -- a
block's ``tokens.npy`` member is a structured array of ``TRIPLE`` (the member name every shard
reader takes) -- and ``manifest.json``, written last, whose tokenizer is the token set's.

X_ij sums 1/d over every occurrence of word j at distance d <= ``window`` on either side of word i
inside one document, so X is symmetric. Special and unknown tokens leave the stream before counting,
as GloVe's cooccur drops out-of-vocabulary words.

Map/reduce, every task resumable (completion marker under ``.tasks/`` written last, outputs renamed
into place, a rerun skips finished tasks), so it scales like the rest of the data path:
- map, one task per token shard: count its documents ``CHUNK_TOKENS`` at a time (bounded memory)
  and write the task's sums split by word block (word id mod ``blocks``) under ``.map/``;
- reduce, one task per word block: sum the block's pieces over all map tasks, shuffle the triples
  (seeded by the block: reruns write the same bytes) and write them ``block_triples`` per sample;
- merge: ``manifest.json``. GloVe fits the counts it trains on, so the ``validation`` split is a
  fixed sample of them (the first shard of each block), the objective's value on known counts.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import fsspec
import numpy as np

from data_pipeline.cooccur import TRIPLE
from data_pipeline.executors.cpus import available_cpus
from data_pipeline.errors import PipelineError
from data_pipeline.remote import open_url
from data_pipeline.writers.shards import ShardSetWriter, write_manifest

log = logging.getLogger(__name__)
FORMAT = "glm-dist/cooccurrence/v1"
TOKENS = "tokens"  # the word-level token set, under the count set
CHUNK_TOKENS = 1 << 19  # tokens counted at once by a map task (~20 pairs each, 16 bytes a pair)
MAX_JSON_BYTES = 256 * 2**20
MAX_PART_BYTES = 8 * 2**30  # one map task's sums for one block


@dataclass(frozen=True)
class CooccurSpec:
    out_dir: str
    reader: Callable[[str, int | None], Sequence]  # (shard url, expected docs) -> docs with ``.tokens``
    window: int = 10
    blocks: int = 4
    block_triples: int = 4096
    shard_max_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
        for name in ("window", "blocks", "block_triples"):
            if getattr(self, name) < 1:
                raise PipelineError(f"co-occurrence {name}={getattr(self, name)} must be >= 1")


def window_pairs(ids: np.ndarray, docs: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(words, contexts, weights) of every ordered pair at distance d <= window within a document:
    ``ids`` (N,) the concatenated documents, ``docs`` (N,) which document each id is in."""
    rows, cols, weights = [], [], []
    for d in range(1, window + 1):
        same = docs[:-d] == docs[d:]
        left, right = ids[:-d][same], ids[d:][same]
        rows += [left, right]
        cols += [right, left]
        weights.append(np.full(2 * len(left), 1.0 / d))
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(rows).astype(np.int64), np.concatenate(cols).astype(np.int64), np.concatenate(weights)


def sum_by_key(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys and the sum of the values of each."""
    unique, inverse = np.unique(keys, return_inverse=True)
    return unique, np.bincount(inverse.ravel(), weights=values, minlength=len(unique))


def _read_bytes(url: str, limit: int) -> bytes:
    with open_url(url, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise PipelineError(f"{url} is larger than {limit} bytes: not a file of this step; delete it and rerun")
    return data


def _read_json(url: str) -> dict:
    return json.loads(_read_bytes(url, MAX_JSON_BYTES).decode("utf-8"))


def _write_bytes(url: str, data: bytes) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path + ".tmp", "wb") as f:
        f.write(data)
    fs.mv(path + ".tmp", path)


def token_manifest(spec: CooccurSpec) -> dict:
    url = f"{spec.out_dir}/{TOKENS}/manifest.json"
    try:
        manifest = _read_json(url)
    except FileNotFoundError:
        raise PipelineError(
            f"{url} not found: tokenize the corpus with the word profile first (glm data cooccur does both)"
        ) from None
    if manifest.get("tokenizer", {}).get("kind") != "wordlevel":
        raise PipelineError(
            f"{url}: co-occurrence counts need a word-level token set (data.tokenizer_profile=word), "
            f"not {manifest.get('tokenizer', {}).get('kind')!r}"
        )
    return manifest


def _chunks(docs: Iterable, keep: np.ndarray) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """(ids, document numbers) of about ``CHUNK_TOKENS`` kept tokens at a time, whole documents."""
    ids, owners, size = [], [], 0
    for n, doc in enumerate(docs):
        tokens = np.asarray(doc.tokens, dtype=np.int64)
        tokens = tokens[keep[tokens]]
        ids.append(tokens)
        owners.append(np.full(len(tokens), n, dtype=np.int64))
        size += len(tokens)
        if size >= CHUNK_TOKENS:
            yield np.concatenate(ids), np.concatenate(owners)
            ids, owners, size = [], [], 0
    if ids:
        yield np.concatenate(ids), np.concatenate(owners)


def _part_url(spec: CooccurSpec, task: int, block: int) -> str:
    return f"{spec.out_dir}/.map/train-{task:05d}-{block:03d}.npz"


def _marker(spec: CooccurSpec, stage: str, task: int) -> str:
    return f"{spec.out_dir}/.tasks/{stage}-{task:05d}.json"


def _done(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return fs.exists(path)


def map_task(spec: CooccurSpec, task: int) -> dict:
    """Count token shard ``task`` of the train split; write its sums per word block. Idempotent."""
    marker = _marker(spec, "map", task)
    if _done(marker):
        return _read_json(marker)
    manifest = token_manifest(spec)
    vocab, shard = manifest["tokenizer"]["vocab_size"], manifest["splits"]["train"][task]
    keep = np.ones(vocab, dtype=bool)
    keep[manifest["tokenizer"]["special_ids"]["all_specials"]] = False
    docs = spec.reader(f"{spec.out_dir}/{TOKENS}/{shard['name']}", shard["num_samples"])
    pieces: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(spec.blocks)]
    tokens = 0
    for ids, owners in _chunks(docs, keep):
        tokens += len(ids)
        rows, cols, weights = window_pairs(ids, owners, spec.window)
        keys, sums = sum_by_key(rows * vocab + cols, weights)
        block_of = (keys // vocab) % spec.blocks
        for b in range(spec.blocks):
            pieces[b].append((keys[block_of == b], sums[block_of == b]))
    for b in range(spec.blocks):
        keys, sums = _merge_pieces(pieces[b])
        buf = io.BytesIO()
        np.savez(buf, keys=keys, counts=sums)
        _write_bytes(_part_url(spec, task, b), buf.getvalue())
    result = {"task": task, "shard": shard["name"], "documents": len(docs), "tokens": tokens}
    _write_bytes(marker, json.dumps(result).encode())
    return result


def _merge_pieces(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not pieces:
        return np.zeros(0, np.int64), np.zeros(0)
    return sum_by_key(np.concatenate([k for k, _ in pieces]), np.concatenate([v for _, v in pieces]))


def _read_part(url: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO(_read_bytes(url, MAX_PART_BYTES)), allow_pickle=False) as part:
        return part["keys"], part["counts"]


def reduce_task(spec: CooccurSpec, block: int) -> dict:
    """Sum word block ``block`` over every map task and write its count shards. Idempotent."""
    marker = _marker(spec, "reduce", block)
    if _done(marker):
        return _read_json(marker)
    manifest = token_manifest(spec)
    vocab, tasks = manifest["tokenizer"]["vocab_size"], len(manifest["splits"]["train"])
    keys, counts = _merge_pieces([_read_part(_part_url(spec, t, block)) for t in range(tasks)])
    order = np.random.default_rng([block]).permutation(len(keys))  # SGD wants mixed rows in a batch
    triples = np.empty(len(keys), dtype=TRIPLE)
    triples["word"], triples["context"], triples["count"] = keys[order] // vocab, keys[order] % vocab, counts[order]
    writer = ShardSetWriter(spec.out_dir, "train", spec.shard_max_bytes, prefix=f"train-b{block:03d}")
    for n, start in enumerate(range(0, len(triples), spec.block_triples)):
        writer.write(f"b{block:03d}-{n:08d}", triples[start : start + spec.block_triples], {"n_bytes": 0})
    result = {"block": block, "triples": int(len(triples)), "shards": [vars(s) for s in writer.close()]}
    _write_bytes(marker, json.dumps(result).encode())
    return result


def merge(spec: CooccurSpec) -> dict:
    """``manifest.json`` of the count set (written last: the set's completion marker)."""
    tokens = token_manifest(spec)
    maps = [_read_json(_marker(spec, "map", t)) for t in range(len(tokens["splits"]["train"]))]
    reduces = [_read_json(_marker(spec, "reduce", b)) for b in range(spec.blocks)]
    tokenizer = {**tokens["tokenizer"], "file": f"{TOKENS}/{tokens['tokenizer']['file']}"}
    manifest = {
        "format": FORMAT,
        "tokenizer": tokenizer,
        "splits": {
            "train": [s for r in reduces for s in r["shards"]],
            "validation": [r["shards"][0] for r in reduces if r["shards"]],
        },
        "cooccurrence": {
            "window": spec.window,
            "weighting": "1/d",
            "symmetric": True,
            "blocks": spec.blocks,
            "block_triples": spec.block_triples,
            "triples": sum(r["triples"] for r in reduces),
            "tokens_counted": sum(m["tokens"] for m in maps),
            "documents": sum(m["documents"] for m in maps),
            "validation": "a fixed sample of train",
        },
        "source": {
            **tokens.get("source", {}),
            "token_set": TOKENS,
            "token_manifest_sha256": hashlib.sha256(json.dumps(tokens, sort_keys=True).encode()).hexdigest(),
        },
    }
    write_manifest(spec.out_dir, manifest)
    return manifest


def _run(fn: Callable[[CooccurSpec, int], dict], spec: CooccurSpec, tasks: list[int], workers: int) -> None:
    workers = min(workers or available_cpus(), len(tasks))
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(fn, [spec] * len(tasks), tasks))
    else:
        for t in tasks:
            fn(spec, t)


def prepare_cooccurrence(
    spec: CooccurSpec, tokenize: dict, *, workers: int = 0, stage: str | None = None, task: int | None = None
) -> dict | None:
    """Tokenize the corpus into ``<out_dir>/tokens`` (``tokenize``: ``prepare_shards``' arguments but
    ``out_dir``), then :func:`build_counts`."""
    from data_pipeline.tokenize.prepare import prepare_shards

    if not _done(f"{spec.out_dir}/manifest.json"):
        prepare_shards(out_dir=f"{spec.out_dir}/{TOKENS}", workers=workers, **tokenize)
    return build_counts(spec, workers=workers, stage=stage, task=task)


def build_counts(
    spec: CooccurSpec, *, workers: int = 0, stage: str | None = None, task: int | None = None
) -> dict | None:
    """The count set over ``<out_dir>/tokens`` (all stages), or one ``stage`` (``map`` | ``reduce``),
    or one ``task`` of it (SLURM arrays). Returns the manifest when complete."""
    fs, root = fsspec.core.url_to_fs(spec.out_dir)
    if fs.exists(f"{root}/manifest.json"):
        manifest = _read_json(f"{spec.out_dir}/manifest.json")
        if manifest.get("format") != FORMAT:
            raise PipelineError(
                f"{spec.out_dir} holds a {manifest.get('format')!r} shard set, not co-occurrence "
                f"counts: point data.shards_dir at an empty directory (the count set keeps "
                f"its token shards in {TOKENS}/)"
            )
        return manifest
    stages = {"map": (map_task, len(token_manifest(spec)["splits"]["train"])), "reduce": (reduce_task, spec.blocks)}
    if stage is not None and stage not in stages:
        raise PipelineError(f"unknown co-occurrence stage {stage!r}: map | reduce")
    for name, (fn, count) in stages.items():
        if stage not in (None, name):
            continue
        if name == "reduce":
            missing = [t for t in range(stages["map"][1]) if not _done(_marker(spec, "map", t))]
            if missing:
                raise PipelineError(f"the reduce stage needs every map task finished; map tasks {missing[:10]} are not")
        if task is not None and not 0 <= task < count:
            raise PipelineError(f"task {task} out of range: stage {name} has {count} tasks (0..{count - 1})")
        _run(fn, spec, [task] if task is not None else list(range(count)), workers)
    return merge(spec) if stage is None else None
