"""Documents -> tokenizer -> tokenized-document shards + manifest.json (``glm data tokenize``).

Three steps, each resumable:
1. the tokenizer: trained on the training split (a profile from ``profiles.py``) or loaded;
2. encoding, one task per input file: each task writes its own shards and then a completion
   marker (``.tasks/NNNNN.json``), so a rerun after a crash skips finished tasks; tasks run in a
   local process pool, or one per SLURM array task (``--task``);
3. merge: the markers become ``manifest.json``, written last (the completion marker of the set).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import fsspec
import numpy as np
from tokenizers import Tokenizer

from data_pipeline.embedded import embedded_documents
from data_pipeline.tokenize.profiles import PROFILES, special_ids, train_tokenizer
from data_pipeline.tokenize.sentences import sentence_char_starts, sentence_token_starts
from data_pipeline.writers.shards import ShardSetWriter, write_manifest

log = logging.getLogger(__name__)
ENCODE_BATCH = 256
EMBEDDED_FILES = 4  # the embedded corpus is materialised as this many source files (= tasks)


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


def read_documents(source: str, *, text_field: str = "text", skipped: Counter | None = None) -> Iterator[dict]:
    """Documents from ``embedded`` or from JSONL (.gz/.zst/...) / text files matching a path, glob
    or fsspec URL. A malformed line or a record without a string text field is skipped and counted."""
    skipped = skipped if skipped is not None else Counter()
    if source == "embedded":
        yield from embedded_documents()
        return
    files = fsspec.open_files(source, "rt", compression="infer", encoding="utf-8", errors="replace")
    if not files:
        raise FileNotFoundError(f"data.source {source!r} matches no file")
    for file in files:
        yield from _read_file(file, text_field, skipped)


def _read_file(file, text_field: str, skipped: Counter) -> Iterator[dict]:
    path = file.path
    with file as f:
        if ".json" not in path:
            yield {"id": path, "text": f.read()}
            return
        for lineno, line in enumerate(f, 1):
            try:
                text = json.loads(line)[text_field]
                if not isinstance(text, str):
                    raise TypeError
            except (json.JSONDecodeError, KeyError, TypeError):
                skipped["bad_jsonl_record"] += 1
                log.warning("skipping %s:%d: not a JSON object with a string %r", path, lineno, text_field)
                continue
            yield {"id": f"{path}:{lineno}", "text": text}


def is_validation(doc_id: str, per_mille: int) -> bool:
    """Held out by a hash of the document id: stable across runs and machines."""
    return int(hashlib.sha1(doc_id.encode()).hexdigest()[:8], 16) % 1000 < per_mille


def source_files(spec: ShardSpec) -> list[str]:
    """The input files, one encoding task each. The embedded corpus is written out first."""
    if spec.source != "embedded":
        files = [f.full_name if hasattr(f, "full_name") else f.path for f in fsspec.open_files(spec.source)]
        if not files:
            raise FileNotFoundError(f"data.source {spec.source!r} matches no file")
        return sorted(files)
    fs, root = fsspec.core.url_to_fs(f"{spec.out_dir}/source")
    names = [f"{root}/embedded-{i}.jsonl.gz" for i in range(EMBEDDED_FILES)]
    if not all(fs.exists(n) for n in names):
        fs.makedirs(root, exist_ok=True)
        docs = list(embedded_documents())
        for i, name in enumerate(names):
            with fs.open(name + ".tmp", "wb") as raw, gzip.open(raw, "wt") as f:
                for doc in docs[i::EMBEDDED_FILES]:
                    f.write(json.dumps(doc) + "\n")
            fs.mv(name + ".tmp", name)
    return [fs.unstrip_protocol(n) for n in names]


def ensure_tokenizer(spec: ShardSpec, files: list[str]) -> Tokenizer:
    fs, root = fsspec.core.url_to_fs(spec.out_dir)
    path = f"{root}/tokenizer.json"
    if fs.exists(path):
        return Tokenizer.from_str(fs.read_text(path))
    if spec.tokenizer == "train":
        tok = train_tokenizer(spec.profile, _training_texts(spec, files), vocab_size=spec.vocab_size)
    else:
        with fsspec.open(spec.tokenizer, "r") as f:
            tok = Tokenizer.from_str(f.read())
    fs.makedirs(root, exist_ok=True)
    fs.write_text(path + ".tmp", tok.to_str())
    fs.mv(path + ".tmp", path)
    return tok


def _training_texts(spec: ShardSpec, files: list[str]) -> Iterator[str]:
    budget = spec.tokenizer_train_chars
    for name in files:
        for doc in _read_file(fsspec.open(name, "rt", compression="infer", encoding="utf-8", errors="replace"),
                              spec.text_field, Counter()):
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
    writers = {s: ShardSetWriter(spec.out_dir, s, spec.shard_max_bytes, prefix=f"{s}-{task:05d}")
               for s in ("train", "validation")}
    skipped: Counter = Counter()
    docs = (d for d in _read_file(fsspec.open(files[task], "rt", compression="infer", encoding="utf-8",
                                              errors="replace"), spec.text_field, skipped))
    documents = 0
    for batch in _batches(docs, ENCODE_BATCH, skipped):
        for doc, enc in zip(batch, tok.encode_batch([d["text"] for d in batch], add_special_tokens=False)):
            split = "validation" if is_validation(doc["id"], spec.val_per_mille) else "train"
            sentences = sentence_token_starts(sentence_char_starts(doc["text"]), enc.offsets)
            meta = {"id": doc["id"], "n_bytes": len(doc["text"].encode())}
            writers[split].write(hashlib.sha1(doc["id"].encode()).hexdigest()[:16],
                                 np.asarray(enc.ids, dtype=dtype), meta, sentences=sentences)
            documents += 1
    result = {"task": task, "file": files[task], "documents": documents, "skipped": dict(skipped),
              "shards": {s: [vars(i) for i in w.close()] for s, w in writers.items()}}
    fs.makedirs(f"{root}/.tasks", exist_ok=True)
    fs.write_text(marker + ".tmp", json.dumps(result))
    fs.mv(marker + ".tmp", marker)
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
    ids = special_ids(tok, spec.profile)
    manifest = {
        "format": "glm-dist/tokenized-documents/v2",
        "tokenizer": {"file": "tokenizer.json", "sha256": hashlib.sha256(tok.to_str().encode()).hexdigest(),
                      "profile": spec.profile, "kind": PROFILES[spec.profile].kind,
                      "vocab_size": tok.get_vocab_size(), "eot_id": ids["eot"], "special_ids": ids},
        "splits": {s: [info for r in results for info in r["shards"][s] if info["num_samples"]]
                   for s in ("train", "validation")},
        "source": {"spec": spec.source, "files": len(files), "documents": sum(r["documents"] for r in results),
                   "skipped": dict(sum((Counter(r["skipped"]) for r in results), Counter()))},
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
            raise ValueError(f"task {task} out of range: {spec.source!r} has {len(files)} input files (tasks 0..{len(files) - 1})")
        encode_task(spec, files, task)
        return None
    pending = [t for t in range(len(files)) if not fs.exists(f"{root}/.tasks/{t:05d}.json")]
    workers = min(workers or os.cpu_count() or 1, len(pending))
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            list(_progress(pool.map(encode_task, [spec] * len(pending), [files] * len(pending), pending), len(pending)))
    else:
        list(_progress((encode_task(spec, files, t) for t in pending), len(pending)))
    return merge(spec, files, tok)


def _progress(it, total: int):
    from tqdm import tqdm

    return tqdm(it, total=total, desc="encode", unit="file", disable=total < 2 or not os.isatty(2))
