"""Shard index files and the document table of a split (docs/architecture.md, decision 12).

Beside each shard ``NAME.tar`` its index ``NAME.idx.json`` (data_pipeline/writers/shards.py)
records every document's token count, sentence lengths and the byte offset and size of its
members in the tar. ``glm data index DIR`` writes them for a shard set built before they existed,
and builds every split's document table (index files parsed in ``--workers`` processes).

The *document table* of a split concatenates the index files of its shards into flat arrays (token
count, byte offset of token 0, sentence lengths per document; size and document range per shard).
It is built from the index files alone -- no shard is opened -- and cached as ``.npy`` files next
to the shards (``DIR/.glm-index/``; ``data.cache_dir`` when DIR is not a local path), keyed by the
manifest's shard entries, so a restart maps it instead of reading thousands of index files. A shard
whose index is missing or wrong, or whose size no longer matches its index, holds no document in
the table: every rank skips it alike and counts it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import fsspec
import numpy as np

from data_pipeline.writers.shards import INDEX_FORMAT, ShardIndex, index_name, write_bytes, write_manifest
from glm_dist.data.shards import ShardSetError, _members, _npy, open_shard_file, read_manifest

log = logging.getLogger(__name__)
MAX_INDEX_BYTES = 256 * 2**20
TABLE_FORMAT = "glm-dist/document-table/v1"
ARRAYS = (
    "shard_bytes",
    "shard_start",
    "shard_tokens",
    "num_tokens",
    "token_offset",
    "sentence_ptr",
    "sentence_lengths",
)
READ_THREADS = 16  # index files read at once (I/O bound)


class ShardIndexError(OSError):
    """One shard's index is missing, unreadable or disagrees with the manifest (the shard is skipped)."""


@dataclass
class ParsedIndex:
    num_tokens: np.ndarray  # (D,) int64
    token_offset: np.ndarray  # (D,) int64: byte offset of token 0 in the tar
    sentence_counts: np.ndarray  # (D,) int64
    sentence_lengths: np.ndarray  # (sum of counts,) int64
    dtype: np.dtype
    tar_bytes: int


def _dtype(descr) -> np.dtype:
    descr = [tuple(field) for field in descr] if isinstance(descr, list) else descr
    dtype = np.lib.format.descr_to_dtype(descr)
    if dtype.hasobject or dtype.itemsize == 0:
        raise ValueError(f"token dtype {descr!r} is not plain data")
    return dtype


def _column(obj: dict, name: str, n: int) -> np.ndarray:
    values = np.asarray(obj[name], dtype=np.int64)
    if values.shape != (n,) or (values < 0).any():
        raise ValueError(f"column {name!r} is not {n} non-negative integers")
    return values


def parse_index(data: bytes, entry: dict) -> ParsedIndex:
    """A shard's index file, checked against itself and the manifest ``entry`` (``ValueError`` says what is wrong)."""
    obj = json.loads(data.decode("utf-8"))
    if not isinstance(obj, dict) or obj.get("format") != INDEX_FORMAT:
        raise ValueError(f"not a {INDEX_FORMAT} file")
    n, dtype, tar_bytes = obj["docs"], _dtype(obj["dtype"]), int(obj["tar_bytes"])
    if n != entry["num_samples"]:
        raise ValueError(f"lists {n} documents, manifest.json {entry['num_samples']}")
    num_tokens = _column(obj, "num_tokens", n)
    if int(num_tokens.sum()) != entry["num_tokens"]:
        raise ValueError(f"counts {int(num_tokens.sum())} tokens, manifest.json {entry['num_tokens']}")
    members = obj["members"]["tokens.npy"]
    offset, size, header = (_column(members, k, n) for k in ("offset", "size", "header"))
    if (size != header + num_tokens * dtype.itemsize).any() or (offset + size > tar_bytes).any():
        raise ValueError("token member offsets or sizes do not fit the shard")
    lengths = obj["sentence_lengths"]
    if not isinstance(lengths, list) or len(lengths) != n:
        raise ValueError(f"sentence_lengths is not {n} lists")
    counts = np.fromiter(map(len, lengths), dtype=np.int64, count=n)
    flat = np.fromiter(itertools.chain.from_iterable(lengths), dtype=np.int64, count=int(counts.sum()))
    ends = np.cumsum(counts)
    if (counts == 0).any() or (flat < 0).any() or (np.add.reduceat(flat, ends - counts) != num_tokens).any():
        raise ValueError("sentence lengths do not add up to the token counts")
    return ParsedIndex(num_tokens, offset + header, counts, flat, dtype, tar_bytes)


def read_index(root: str, entry: dict) -> ParsedIndex:
    """The index of the shard ``entry`` names, or ``ShardIndexError`` with the reason."""
    if not entry.get("index"):
        raise ShardIndexError(f"{entry['name']} has no index: run glm data index {root}")
    url = f"{root}/{entry['index']}"
    try:
        with open_shard_file(url) as f:
            data = f.read(MAX_INDEX_BYTES + 1)
        if len(data) > MAX_INDEX_BYTES:
            raise ValueError(f"larger than {MAX_INDEX_BYTES} bytes")
        if entry.get("index_sha256") and hashlib.sha256(data).hexdigest() != entry["index_sha256"]:
            raise ValueError("its SHA-256 differs from manifest.json's")
        return parse_index(data, entry)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ShardIndexError(
            f"index {url} is unusable ({type(err).__name__}: {err}); run glm data index {root}"
        ) from None


# -- the indexer: glm data index DIR ----------------------------------------------------------------
def scan_shard(url: str) -> tuple[bytes, str]:
    """Read one shard as a stream and return its index file (JSON bytes) and the index's SHA-256."""
    index = ShardIndex(url.rsplit("/", 1)[-1])
    key, members, layout = None, {}, {}
    with open_shard_file(url) as f:
        for k, ext, offset, data in _members(f):
            if key is not None and k != key:
                _add(index, key, members, layout)
                members, layout = {}, {}
            key, members[ext], layout[ext] = k, data, (offset, len(data))
        if key is not None:
            _add(index, key, members, layout)
        tar_bytes = f.seek(0, 2)
    data = index.to_json(tar_bytes)
    return data, hashlib.sha256(data).hexdigest()


def _add(index: ShardIndex, key: str, members: dict[str, bytes], layout: dict) -> None:
    if "tokens.npy" not in members:
        raise OSError(f"document {key} has no tokens.npy member")
    tokens = _npy(members["tokens.npy"])
    sentences = _npy(members["sentences.npy"]) if "sentences.npy" in members else None
    index.add(key, tokens, sentences, layout, len(members["tokens.npy"]) - tokens.nbytes)


def _index_one(root: str, name: str) -> tuple[str, str, str]:
    """(index name, its SHA-256, "") or ("", "", why the shard cannot be indexed)."""
    try:
        data, sha = scan_shard(f"{root}/{name}")
        write_bytes(f"{root}/{index_name(name)}", data)
        return index_name(name), sha, ""
    except Exception as err:  # a corrupt tar, a bad npy member: that shard is skipped, named
        return "", "", f"{type(err).__name__}: {err}"


def index_shard_set(root: str, *, workers: int = 1) -> dict:
    """Write the index file of every shard of ``root`` that lacks a usable one and record them in
    ``manifest.json`` (written last). A shard that cannot be read gets ``index_error`` instead."""
    manifest = read_manifest(root)
    todo = [
        (split, i)
        for split, entries in manifest["splits"].items()
        for i, e in enumerate(entries)
        if not _index_ok(root, e)
    ]
    names = [manifest["splits"][s][i]["name"] for s, i in todo]
    if workers > 1 and len(todo) > 1:
        with ProcessPoolExecutor(min(workers, len(todo))) as pool:
            results = list(pool.map(_index_one, [root] * len(names), names))
    else:
        results = [_index_one(root, n) for n in names]
    for (split, i), (index, sha, error) in zip(todo, results):
        entry = manifest["splits"][split][i]
        entry.pop("index_error", None)
        entry.update({"index": index, "index_sha256": sha, **({"index_error": error} if error else {})})
    manifest["index_format"] = INDEX_FORMAT
    write_manifest(root, manifest)
    for split in manifest["splits"]:  # and the document tables, so that a training start finds them cached
        load_doc_table(root, manifest, split, workers=workers)
    failed = {manifest["splits"][s][i]["name"]: r[2] for (s, i), r in zip(todo, results) if r[2]}
    return {
        "indexed": len(todo) - len(failed),
        "already": sum(map(len, manifest["splits"].values())) - len(todo),
        "failed": failed,
    }


def _index_ok(root: str, entry: dict) -> bool:
    try:
        read_index(root, entry)
        return True
    except ShardIndexError:
        return False


# -- the document table ---------------------------------------------------------------------------
@dataclass
class DocTable:
    """Every document of a split as flat arrays; shards that cannot be used hold no document."""

    root: str
    names: list[str]
    dtype: np.dtype
    shard_bytes: np.ndarray  # (S,) tar size the index was made for
    shard_start: np.ndarray  # (S + 1,) first document of each shard
    shard_tokens: np.ndarray  # (S,)
    num_tokens: np.ndarray  # (N,)
    token_offset: np.ndarray  # (N,) byte offset of the document's token 0 in its tar
    sentence_ptr: np.ndarray  # (N + 1,) where each document's sentence lengths start
    sentence_lengths: np.ndarray  # (sum,)
    problems: dict[int, str] = field(default_factory=dict)  # shard -> why it holds no document
    digest: str = ""  # of the manifest's shard entries: what the cached table (and plans) are keyed by

    @property
    def num_shards(self) -> int:
        return len(self.names)

    @property
    def usable(self) -> np.ndarray:
        ok = np.ones(self.num_shards, dtype=bool)
        ok[list(self.problems)] = False
        return ok

    def url(self, shard: int) -> str:
        return f"{self.root}/{self.names[shard]}"

    def shard_of(self, docs: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.shard_start, docs, side="right") - 1

    def sentence_starts(self, doc: int) -> np.ndarray:
        lengths = self.sentence_lengths[self.sentence_ptr[doc] : self.sentence_ptr[doc + 1]]
        return np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.int64)


def table_digest(entries: list[dict], split: str) -> str:
    return hashlib.sha256(
        json.dumps({"format": TABLE_FORMAT, "split": split, "shards": entries}, sort_keys=True).encode()
    ).hexdigest()[:24]


def cache_root(root: str, cache_dir: str = "") -> str | None:
    """Where the table is cached: next to local shards, else under ``cache_dir`` (else nowhere)."""
    local = root[len("file://") :] if root.startswith("file://") else root
    if "://" not in local and "::" not in local:
        if os.access(local, os.W_OK):
            return f"{local}/.glm-index"
    if cache_dir:
        return f"{cache_dir}/{hashlib.sha256(root.encode()).hexdigest()[:16]}"
    return None


def load_doc_table(root: str, manifest: dict, split: str, *, cache_dir: str = "", workers: int = 1) -> DocTable:
    """The split's document table (from the cache, else from the index files, then cached), with
    shards whose file size no longer matches their index marked unusable. ``workers`` > 1 parses the
    index files in that many processes (``glm data index``; a training rank reads them in threads)."""
    entries = manifest["splits"][split]
    if entries and not any(e.get("index") for e in entries):
        raise ShardSetError(
            f"{root} has no shard index files (written before glm-dist indexed its shards): run glm data index {root}"
        )
    where, digest = cache_root(root, cache_dir), table_digest(entries, split)
    folder = f"{where}/{split}-{digest}" if where else None
    table = _load_cached(folder, root) if folder else None
    if table is None:
        table = _build(root, entries, workers)
        if folder:
            _save(folder, table)
    table.digest = digest
    _check_sizes(table)
    return table


def _build(root: str, entries: list[dict], workers: int = 1) -> DocTable:
    if workers > 1 and len(entries) > 1:  # JSON parsing holds the GIL: processes, a block of shards each
        blocks = [entries[i::workers] for i in range(workers)]
        with ProcessPoolExecutor(workers) as pool:
            done = list(pool.map(_read_block, [root] * workers, blocks))
        parsed = [done[i % workers][i // workers] for i in range(len(entries))]
    else:
        parsed = _read_block(root, entries)
    problems = {i: p for i, p in enumerate(parsed) if isinstance(p, str)}
    good = [p for p in parsed if not isinstance(p, str)]
    dtypes = {p.dtype.str if p.dtype.names is None else str(p.dtype.descr) for p in good}
    if len(dtypes) > 1:
        raise ShardSetError(f"the shards of {root} mix token dtypes ({', '.join(sorted(dtypes))}); rebuild them")
    empty = np.zeros(0, dtype=np.int64)
    cols = [
        p if not isinstance(p, str) else ParsedIndex(empty, empty, empty, empty, np.dtype("<u2"), 0) for p in parsed
    ]
    counts = np.asarray([len(c.num_tokens) for c in cols], dtype=np.int64)
    sentence_counts = np.concatenate([empty] + [c.sentence_counts for c in cols])
    return DocTable(
        root=root,
        names=[e["name"] for e in entries],
        dtype=good[0].dtype if good else np.dtype("<u2"),
        shard_bytes=np.asarray([c.tar_bytes for c in cols], dtype=np.int64),
        shard_start=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        shard_tokens=np.asarray([int(c.num_tokens.sum()) for c in cols], dtype=np.int64),
        num_tokens=np.concatenate([empty] + [c.num_tokens for c in cols]),
        token_offset=np.concatenate([empty] + [c.token_offset for c in cols]),
        sentence_ptr=np.concatenate([[0], np.cumsum(sentence_counts)]).astype(np.int64),
        sentence_lengths=np.concatenate([empty] + [c.sentence_lengths for c in cols]).astype(np.int32),
        problems=problems,
    )


def _read_block(root: str, entries: list[dict]) -> list[ParsedIndex | str]:
    """Each entry's parsed index, or why it is unusable (index files read in threads: I/O bound)."""
    with ThreadPoolExecutor(READ_THREADS) as pool:
        return list(pool.map(lambda e: _try_read(root, e), entries))


def _try_read(root: str, entry: dict) -> ParsedIndex | str:
    if entry.get("index_error"):
        return f"{root}/{entry['name']} could not be indexed: {entry['index_error']}"
    try:
        return read_index(root, entry)
    except ShardIndexError as err:
        return str(err)


def _check_sizes(table: DocTable) -> None:
    """Mark shards whose listed size differs from their index's (changed, truncated, missing). One
    listing of the folder; skipped where the store cannot list (http)."""
    from data_pipeline.remote import storage_options

    if table.root.split("::")[-1].startswith(("http://", "https://")):
        return
    try:
        fs, path = fsspec.core.url_to_fs(table.root, **storage_options(table.root))
        listed = {Path(e["name"]).name: e.get("size") for e in fs.ls(path, detail=True)}
    except (OSError, ValueError) as err:
        log.warning("cannot list %s to check shard sizes: %s", table.root, err)
        return
    for i, name in enumerate(table.names):
        if i in table.problems:
            continue
        size = listed.get(name)
        if size != table.shard_bytes[i]:
            table.problems[i] = (
                f"{table.url(i)} is missing"
                if size is None
                else f"{table.url(i)} is {size} bytes but its index was made for "
                f"{table.shard_bytes[i]}: truncated, corrupt or replaced"
            )


def _save(folder: str, table: DocTable) -> None:
    """Write the cache folder under a temporary name and rename it (another rank may win: fine)."""
    parent = Path(folder).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=parent, prefix=".tmp-"))
        for name in ARRAYS:
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(getattr(table, name)), allow_pickle=False)
        meta = {
            "format": TABLE_FORMAT,
            "names": table.names,
            "dtype": np.lib.format.dtype_to_descr(table.dtype),
            "problems": {str(k): v for k, v in table.problems.items()},
        }
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(tmp, folder)
        except OSError:  # already there (another rank) or a stale one: keep what is there
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as err:
        log.warning("cannot cache the document table in %s: %s", folder, err)


def _load_cached(folder: str, root: str) -> DocTable | None:
    try:
        meta = json.loads(Path(folder, "meta.json").read_text())
        if meta.get("format") != TABLE_FORMAT:
            return None
        arrays = {n: np.load(Path(folder, f"{n}.npy"), mmap_mode="r", allow_pickle=False) for n in ARRAYS}
        table = DocTable(
            root=root,
            names=list(meta["names"]),
            dtype=_dtype(meta["dtype"]),
            **arrays,
            problems={int(k): v for k, v in meta["problems"].items()},
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    s, n = table.num_shards, len(table.num_tokens)
    consistent = (
        len(table.shard_start) == s + 1
        and table.shard_start[-1] == n
        and len(table.token_offset) == n
        and len(table.sentence_ptr) == n + 1
        and table.sentence_ptr[-1] == len(table.sentence_lengths)
    )
    return table if consistent else None


def save_doc_table(folder: str, table: DocTable) -> None:
    """Write ``table`` as a cache folder (benchmarks generate large tables without index files)."""
    _save(folder, table)
