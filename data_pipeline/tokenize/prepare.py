"""Source documents -> tokenizer -> train/validation shards + manifest.json (``glm data tokenize``)."""
from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Iterator

import fsspec
import numpy as np
from tokenizers import Tokenizer

from data_pipeline.embedded import embedded_documents
from data_pipeline.tokenize.bpe import EOT, tokenizer_sha256, train_byte_level_bpe
from data_pipeline.writers.shards import ShardSetWriter, write_manifest

log = logging.getLogger(__name__)
ENCODE_BATCH = 256


def read_documents(source: str, *, text_field: str = "text", skipped: Counter | None = None) -> Iterator[dict]:
    """Documents from ``embedded`` or from JSONL (.gz/.zst/...) / text files matching a path or glob.

    A malformed line or a record without the text field is skipped and counted in ``skipped``.
    """
    skipped = skipped if skipped is not None else Counter()
    if source == "embedded":
        yield from embedded_documents()
        return
    files = fsspec.open_files(source, "rt", compression="infer", encoding="utf-8", errors="replace")
    if not files:
        raise FileNotFoundError(f"data.source {source!r} matches no file")
    for file in files:
        path = file.path
        with file as f:
            if ".jsonl" in path or ".json" in path:
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
            else:
                yield {"id": path, "text": f.read()}


def is_validation(doc_id: str, per_mille: int) -> bool:
    """Held out by a hash of the document id: stable across runs and machines."""
    return int(hashlib.sha1(doc_id.encode()).hexdigest()[:8], 16) % 1000 < per_mille


def prepare_shards(*, source: str, out_dir: str, tokenizer: str = "train", vocab_size: int = 8192,
                   val_per_mille: int = 50, shard_max_bytes: int = 64 * 2**20,
                   text_field: str = "text") -> dict:
    """Build the tokenized shard set in ``out_dir``; returns the manifest. Skips if complete."""
    out = Path(out_dir)
    if (out / "manifest.json").exists():
        return json.loads((out / "manifest.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    skipped: Counter = Counter()
    docs = [d for d in read_documents(source, text_field=text_field, skipped=skipped) if d["text"].strip()]
    if tokenizer == "train":
        tok = train_byte_level_bpe((d["text"] for d in docs if not is_validation(d["id"], val_per_mille)),
                                   vocab_size=vocab_size)
    else:
        tok = Tokenizer.from_file(tokenizer)
    tok.save(str(out / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    dtype = np.uint16 if tok.get_vocab_size() <= 2**16 else np.uint32
    writers = {s: ShardSetWriter(str(out), s, shard_max_bytes) for s in ("train", "validation")}
    for start in range(0, len(docs), ENCODE_BATCH):
        batch = docs[start:start + ENCODE_BATCH]
        for doc, enc in zip(batch, tok.encode_batch([d["text"] for d in batch])):
            split = "validation" if is_validation(doc["id"], val_per_mille) else "train"
            key = hashlib.sha1(doc["id"].encode()).hexdigest()[:16]
            meta = {"id": doc["id"], "n_bytes": len(doc["text"].encode())}
            writers[split].write(key, np.asarray(enc.ids, dtype=dtype), meta)
    manifest = {
        "format": "glm-dist/tokenized-documents/v1",
        "tokenizer": {"file": "tokenizer.json", "sha256": tokenizer_sha256(out / "tokenizer.json"),
                      "vocab_size": tok.get_vocab_size(), "eot_id": eot, "kind": "byte-level-bpe"},
        "splits": {s: [vars(i) for i in w.close()] for s, w in writers.items()},
        "source": {"spec": source, "documents": len(docs), "skipped": dict(skipped)},
    }
    write_manifest(str(out), manifest)
    return manifest
