"""Documents -> tokenizer -> tokenized-document shards + manifest.json (``glm data tokenize``).

Three steps, each resumable:
1. the tokenizer: trained on the training split (a profile from ``profiles.py``) or loaded;
2. encoding, one task per input file: each task writes its own shards and then a completion
   marker (``.tasks/NNNNN.json``), so a rerun after a crash skips finished tasks; tasks run in a
   local process pool, or one per SLURM array task (``--task``);
3. merge: the markers become ``manifest.json``, written last (the completion marker of the set).

``data.source`` naming a crawl-pipeline output (its folder or URL, or its ``manifest.json``) is read
through that run's manifest, never a listing: what a crashed or unfinished run left is not read.
The output may be an object store (``s3://...``): every file appears whole (writers/shards.py), and
the token set becomes visible through its manifest, written last.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import posixpath
import re
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import fsspec
import numpy as np
from tokenizers import Tokenizer

from data_pipeline.document import Stats
from data_pipeline.executors.cpus import available_cpus
from data_pipeline.manifest import finished_run_shards
from data_pipeline.errors import PipelineError
from data_pipeline.readers import read
from data_pipeline.recipe import ReaderCfg
from data_pipeline.remote import RemoteReadError, check_host, check_scheme, open_url, storage_options
from data_pipeline.sources import named_documents, named_source
from data_pipeline.tokenize.tokenizer_file import parse_tokenizer
from data_pipeline.tokenize.profiles import PROFILES, special_ids, train_tokenizer
from data_pipeline.tokenize.sentences import sentence_char_starts, sentence_token_starts
from data_pipeline.writers.shards import INDEX_FORMAT, ShardSetWriter, write_bytes, write_manifest

log = logging.getLogger(__name__)
ENCODE_BATCH = 256
NAMED_SOURCE_FILES = 4  # a named source (embedded, manpages, wordnet) is materialised as this many files (= tasks)
MAX_TOKENIZER_BYTES = 256 * 2**20  # a tokenizer.json of a 250k vocabulary is ~20 MB


@dataclass(frozen=True)
class ShardSpec:
    source: str
    out_dir: str
    profile: str = "gpt2"
    tokenizer: str = "train"
    vocab_size: int = 8192
    val_per_mille: int = 50
    shard_max_bytes: int = 64 * 2**20
    text_field: str = "text"
    tokenizer_train_chars: int = 500_000_000  # train the tokenizer on at most this much text
    max_record_mb: float = 10.0  # a larger JSON line or text file is skipped and counted (record_too_large)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:  # before the source is read or rendered
            raise PipelineError(
                f"data.tokenizer_profile={self.profile!r} is not a tokenizer profile; known: {', '.join(PROFILES)}"
            )


def read_documents(
    source: str, *, text_field: str = "text", max_record_mb: float = 10.0, skipped: Counter | None = None
) -> Iterator[dict]:
    """Documents from a named source (``embedded``, ``manpages``, ``wordnet``: data_pipeline/sources.py)
    or from JSONL (.gz/.zst/...) / text files matching a path, glob or fsspec URL, read by the crawl
    pipeline's readers: a malformed line, a record without a string text field, one over
    ``max_record_mb``, a damaged file are skipped and counted."""
    skipped = skipped if skipped is not None else Counter()
    if named_source(source):
        yield from named_documents(source, skipped)
        return
    urls = _source_urls(source)
    root = source_root(source)
    for url in urls:
        yield from _read_file(url, text_field=text_field, max_record_mb=max_record_mb, skipped=skipped, root=root)


def _source_urls(source: str) -> list[str]:
    """The files ``data.source`` names, sorted, as full URLs: a crawl-pipeline run's document shards
    as its manifest lists them, else the files a path, glob or URL matches."""
    try:
        check_scheme(source, "data.source")
    except ValueError as err:
        raise PipelineError(str(err)) from None
    try:
        check_host(source)
    except RemoteReadError as err:
        raise PipelineError(f"data.source {err}") from None
    shards = finished_run_shards(source)
    if shards is not None:
        return shards
    files = [f.full_name for f in fsspec.open_files(source, **storage_options(source))]
    if not files:
        raise FileNotFoundError(f"data.source {source!r} matches no file")
    return sorted(files)


def _read_file(
    url: str, *, text_field: str, max_record_mb: float, skipped: Counter | None, root: str
) -> Iterator[dict]:
    """The documents of one file (``.json`` in the name: JSONL, else one text document) as
    ``{"id", "place", "text"}``. ``place`` is where the document is -- ``PATH:LINE`` for JSONL,
    ``PATH`` for text, with PATH relative to ``root`` (the source's folder, :func:`source_root`) --
    and keys the shard member; ``id`` is a JSONL record's own non-empty string ``id`` field, else the
    place. The split and the tasks' held-out sets hash the id, so neither moves when the corpus is
    copied elsewhere or read from another working directory. What the reader skips is added to
    ``skipped`` under :func:`_skip_key` names and logged (``skipped=None``: neither, for the
    tokenizer-training pass over the same files)."""
    path = fsspec.core.url_to_fs(url)[1]
    rel = _relative(path, root)
    fmt = "jsonl" if ".json" in path else "text"
    cfg = ReaderCfg(format=fmt, text_field=text_field, id_field=None, max_record_mb=max_record_mb)
    stats = Stats()
    try:
        for doc in read(url, cfg, stats):
            if fmt == "jsonl":  # with id_field=None the reader's id is NAME:LINE and the record's id is in meta
                place = f"{rel}:{doc.id.rpartition(':')[2]}"
                own = doc.meta.get("id")
                yield {"id": own if isinstance(own, str) and own else place, "place": place, "text": doc.text}
            else:  # universal newlines, as the text-mode reads before the shared readers
                yield {"id": rel, "place": rel, "text": doc.text.replace("\r\n", "\n").replace("\r", "\n")}
    finally:
        if skipped is not None:
            _count_skips(url, stats, skipped)


def _relative(path: str, root: str) -> str:
    root = root.rstrip("/")
    return path[len(root) + 1 :] if root and path.startswith(root + "/") else posixpath.basename(path)


def source_root(source: str) -> str:
    """The folder a source's relative document places start from: the source itself when it is a
    folder (a crawl-pipeline run, say), else the folder above its first wildcard or above the file."""
    if named_source(source):
        return ""
    path = fsspec.core.url_to_fs(source)[1]
    wild = re.search(r"[*?\[]", path)
    if wild:
        return posixpath.dirname(path[: wild.start()])
    if posixpath.basename(path) == "manifest.json":
        return posixpath.dirname(path)
    fs = fsspec.core.url_to_fs(source, **storage_options(source))[0]
    try:
        return path.rstrip("/") if fs.isdir(path) else posixpath.dirname(path)
    except OSError:
        return posixpath.dirname(path)


def _count_skips(url: str, stats: Stats, skipped: Counter) -> None:
    """Add what the reader dropped (per record) and the file-level input errors to ``skipped`` by
    skip key, and log them with the first error's place."""
    read_stage = stats.stage("read")
    counts: Counter = Counter()
    for reason, n in read_stage.dropped.items():
        counts[_skip_key(reason)] += n
    for reason, n in stats.error_count.items():
        if reason not in read_stage.dropped:  # record-level errors are in dropped already
            counts[_skip_key(reason)] += n
    skipped.update(counts)
    if counts:
        first = stats.errors[0] if stats.errors else None
        log.warning(
            "%s: skipped %s%s",
            url,
            dict(counts),
            f"; first: {first['reason']} at {first['offset']}: {first['detail']}" if first else "",
        )


def _skip_key(reason: str) -> str:
    """``bad_jsonl_record``, ``record_too_large``, or the reader's reason in snake case
    (``truncated_or_corrupt_compressed_stream``, ``input_unreadable``, ...)."""
    if reason in ("malformed JSON", "missing text field", "undecodable bytes"):
        return "bad_jsonl_record"
    if reason.startswith("record larger than"):
        return "record_too_large"
    return re.sub(r"\W+", "_", reason).strip("_").lower()


def is_validation(doc_id: str, per_mille: int) -> bool:
    """Held out by a hash of the document id: stable across runs and machines."""
    return int(hashlib.sha1(doc_id.encode()).hexdigest()[:8], 16) % 1000 < per_mille


def source_files(spec: ShardSpec) -> list[str]:
    """The input files, one encoding task each. A named source is written out first, as
    NAMED_SOURCE_FILES JSONL files under ``out_dir/source`` with what its reader skipped beside them
    (``skipped.json``, added to the manifest's counts by :func:`merge`)."""
    found = named_source(spec.source)
    if found is None:
        return _source_urls(spec.source)
    fs, root = fsspec.core.url_to_fs(f"{spec.out_dir}/source")
    names = [f"{root}/{found[0]}-{i}.jsonl.gz" for i in range(NAMED_SOURCE_FILES)]
    if not all(fs.exists(n) for n in names):
        skipped: Counter = Counter()
        docs = list(named_documents(spec.source, skipped))
        if not docs:
            raise PipelineError(f"data.source={spec.source!r} has no documents (skipped: {dict(skipped) or 'none'})")
        if skipped:
            log.warning("%s: skipped %s", spec.source, dict(skipped))
        write_bytes(fs.unstrip_protocol(f"{root}/skipped.json"), json.dumps(dict(skipped)).encode())
        for i, name in enumerate(names):
            text = "".join(json.dumps(doc) + "\n" for doc in docs[i::NAMED_SOURCE_FILES])
            write_bytes(fs.unstrip_protocol(name), gzip.compress(text.encode(), mtime=0))
    return [fs.unstrip_protocol(n) for n in names]


def _named_source_skips(spec: ShardSpec) -> Counter:
    """What a named source's reader skipped while :func:`source_files` wrote it out."""
    if named_source(spec.source) is None:
        return Counter()
    fs, root = fsspec.core.url_to_fs(f"{spec.out_dir}/source/skipped.json")
    return Counter(json.loads(fs.read_text(root))) if fs.exists(root) else Counter()


def files_root(spec: ShardSpec) -> str:
    """The folder :func:`source_files`' document places are relative to."""
    if named_source(spec.source):
        return fsspec.core.url_to_fs(f"{spec.out_dir}/source")[1]
    return source_root(spec.source)


def ensure_tokenizer(spec: ShardSpec, files: list[str]) -> Tokenizer:
    fs, root = fsspec.core.url_to_fs(spec.out_dir)
    path = f"{root}/tokenizer.json"
    if fs.exists(path):
        with fs.open(path, "rb") as f:
            data = f.read(MAX_TOKENIZER_BYTES)
        return parse_tokenizer(data, where=path, fix=f"delete it (or {spec.out_dir}) to train or load it again")
    if spec.tokenizer == "train":
        tok = train_tokenizer(spec.profile, _training_texts(spec, files), vocab_size=spec.vocab_size)
        if tok.get_vocab_size() < spec.vocab_size:
            log.warning(
                "the tokenizer has %d tokens, not data.vocab_size=%d: %s has too little text for more",
                tok.get_vocab_size(),
                spec.vocab_size,
                spec.source,
            )
    else:
        tok = _load_tokenizer(spec.tokenizer)
    write_bytes(fs.unstrip_protocol(path), tok.to_str().encode())
    return tok


def _load_tokenizer(url: str) -> Tokenizer:
    """The tokenizer.json ``data.tokenizer`` names, read with a size bound."""
    with open_url(url, "rb") as f:
        data = f.read(MAX_TOKENIZER_BYTES + 1)
    if len(data) > MAX_TOKENIZER_BYTES:
        raise PipelineError(
            f"data.tokenizer={url!r} is larger than {MAX_TOKENIZER_BYTES >> 20} MiB, so not a "
            f"tokenizer.json; point data.tokenizer at one, or set data.tokenizer=train"
        )
    return parse_tokenizer(
        data,
        where=f"data.tokenizer={url!r}",
        fix="point data.tokenizer at a tokenizer.json, or set data.tokenizer=train",
    )


def _training_texts(spec: ShardSpec, files: list[str]) -> Iterator[str]:
    budget = spec.tokenizer_train_chars
    root = files_root(spec)
    for name in files:
        for doc in _read_file(
            name, text_field=spec.text_field, max_record_mb=spec.max_record_mb, skipped=None, root=root
        ):
            if not is_validation(doc["id"], spec.val_per_mille):
                budget -= len(doc["text"])
                yield doc["text"]
                if budget <= 0:
                    return


def encode_task(spec: ShardSpec, files: list[str], task: int) -> dict:
    """Encode input file ``task`` into its own shards; write its completion marker. Idempotent."""
    fs, root = fsspec.core.url_to_fs(spec.out_dir)
    marker = f"{root}/.tasks/{task:05d}.json"
    if fs.exists(marker):
        return json.loads(fs.read_text(marker))
    tok = Tokenizer.from_str(fs.read_text(f"{root}/tokenizer.json"))
    dtype = np.uint16 if tok.get_vocab_size() <= 2**16 else np.uint32
    writers = {
        s: ShardSetWriter(spec.out_dir, s, spec.shard_max_bytes, prefix=f"{s}-{task:05d}")
        for s in ("train", "validation")
    }
    skipped: Counter = Counter()
    docs = _read_file(
        files[task],
        text_field=spec.text_field,
        max_record_mb=spec.max_record_mb,
        skipped=skipped,
        root=files_root(spec),
    )
    documents = 0
    try:
        for batch in _batches(docs, ENCODE_BATCH, skipped):
            for doc, enc in zip(batch, tok.encode_batch([d["text"] for d in batch], add_special_tokens=False)):
                split = "validation" if is_validation(doc["id"], spec.val_per_mille) else "train"
                sentences = sentence_token_starts(sentence_char_starts(doc["text"]), enc.offsets)
                meta = {"id": doc["id"], "n_bytes": len(doc["text"].encode())}
                writers[split].write(
                    hashlib.sha1(doc["place"].encode()).hexdigest()[:16],
                    np.asarray(enc.ids, dtype=dtype),
                    meta,
                    sentences=sentences,
                )
                documents += 1
        shards = {s: [vars(i) for i in w.close()] for s, w in writers.items()}
    except BaseException:
        for w in writers.values():  # a half-written shard never appears (a rerun writes the task again)
            w.abort()
        raise
    result = {"task": task, "file": files[task], "documents": documents, "skipped": dict(skipped), "shards": shards}
    write_bytes(fs.unstrip_protocol(marker), json.dumps(result).encode())
    return result


def _batches(docs: Iterator[dict], size: int, skipped: Counter) -> Iterator[list[dict]]:
    batch = []
    for doc in docs:
        if not doc["text"].strip():
            skipped["empty_document"] += 1
            continue
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def merge(spec: ShardSpec, files: list[str], tok: Tokenizer) -> dict:
    fs, root = fsspec.core.url_to_fs(spec.out_dir)
    results = [json.loads(fs.read_text(f"{root}/.tasks/{t:05d}.json")) for t in range(len(files))]
    documents = sum(r["documents"] for r in results)
    if not any(info["num_samples"] for r in results for info in r["shards"]["train"]):
        skipped = dict(sum((Counter(r["skipped"]) for r in results), Counter()))
        held = f"data.val_per_mille={spec.val_per_mille} held every one out, " if documents else ""
        raise PipelineError(
            f"data.source={spec.source!r} has no training documents ({documents} in {len(files)} file(s), "
            f"skipped: {skipped or 'none'}): {held}fix the source (or data.text_field) and delete {spec.out_dir}"
        )
    ids = special_ids(tok, spec.profile)
    manifest = {
        "format": "glm-dist/tokenized-documents/v2",
        "index_format": INDEX_FORMAT,  # each shard's NAME.idx.json (writers/shards.py): random access
        "tokenizer": {
            "file": "tokenizer.json",
            "sha256": hashlib.sha256(tok.to_str().encode()).hexdigest(),
            "profile": spec.profile,
            "kind": PROFILES[spec.profile].kind,
            "vocab_size": tok.get_vocab_size(),
            "eot_id": ids["eot"],
            "special_ids": ids,
        },
        "splits": {
            s: [info for r in results for info in r["shards"][s] if info["num_samples"]]
            for s in ("train", "validation")
        },
        "source": {
            "spec": spec.source,
            "files": len(files),
            "documents": documents,
            "skipped": dict(sum((Counter(r["skipped"]) for r in results), _named_source_skips(spec))),
        },
    }
    write_manifest(spec.out_dir, manifest)
    return manifest


def prepare_tokenizer(**kwargs) -> int:
    """Step 1 alone (before a SLURM array): the source files and the tokenizer. Returns the number
    of encoding tasks."""
    spec = ShardSpec(**kwargs)
    files = source_files(spec)
    ensure_tokenizer(spec, files)
    return len(files)


def prepare_shards(*, workers: int = 0, task: int | None = None, **kwargs) -> dict | None:
    """Build the shard set (all steps), or with ``task`` only that encoding task (SLURM arrays).
    ``workers``: local processes for the encoding tasks (0: one per core, at most the task count)."""
    spec = ShardSpec(**kwargs)
    fs, root = fsspec.core.url_to_fs(spec.out_dir)
    if fs.exists(f"{root}/manifest.json"):
        return json.loads(fs.read_text(f"{root}/manifest.json"))
    files = source_files(spec)
    tok = ensure_tokenizer(spec, files)
    if task is not None:
        if not 0 <= task < len(files):
            raise ValueError(
                f"task {task} out of range: {spec.source!r} has {len(files)} input files (tasks 0..{len(files) - 1})"
            )
        encode_task(spec, files, task)
        return None
    pending = [t for t in range(len(files)) if not fs.exists(f"{root}/.tasks/{t:05d}.json")]
    workers = min(workers or available_cpus(), len(pending))
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            list(_progress(pool.map(encode_task, [spec] * len(pending), [files] * len(pending), pending), len(pending)))
    else:
        list(_progress((encode_task(spec, files, t) for t in pending), len(pending)))
    return merge(spec, files, tok)


def _progress(it, total: int):
    from tqdm import tqdm

    return tqdm(it, total=total, desc="encode", unit="file", disable=total < 2 or not os.isatty(2))
