"""Reading the tokenized-document shard set: ``manifest.json`` and the webdataset tar shards."""
from __future__ import annotations

import io
import json
import logging
from typing import NamedTuple

import fsspec
import numpy as np
import webdataset as wds

log = logging.getLogger(__name__)


class Doc(NamedTuple):
    key: str
    tokens: np.ndarray  # token ids
    sentences: np.ndarray  # token index where each sentence starts (int32; [0] when unknown)


class ShardSetError(RuntimeError):
    """The shard set cannot be used at all (missing manifest, unknown split)."""


def read_manifest(root: str) -> dict:
    try:
        with fsspec.open(f"{root}/manifest.json", "r") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ShardSetError(f"{root}/manifest.json not found: build the shards first "
                            f"(glm data tokenize -c CONFIG), or point data.shards_dir at them") from None


def shard_urls(root: str, manifest: dict, split: str) -> list[str]:
    if split not in manifest["splits"]:
        raise ShardSetError(f"split {split!r} not in {root}/manifest.json "
                            f"(has: {', '.join(manifest['splits'])})")
    return [f"{root}/{s['name']}" for s in manifest["splits"][split]]


def _every_shard(urls):
    return urls


def shard_sizes(manifest: dict, split: str) -> list[int]:
    return [s["num_samples"] for s in manifest["splits"][split]]


def read_shard(url: str, expected: int | None = None) -> list[Doc]:
    """All documents of one shard, in stored order.

    A truncated or corrupt shard raises ``OSError`` naming the shard; the caller decides to skip
    and count it. ``expected`` (the manifest's count) catches what tar alone does not: Python's
    tarfile takes a garbled header after the first member for the end of the archive.
    """
    docs = []
    try:
        # Our loader owns the order and the split by rank/worker: webdataset reads exactly this shard.
        dataset = wds.WebDataset([url], shardshuffle=False, empty_check=False, nodesplitter=_every_shard,
                                 workersplitter=_every_shard)
        for sample in dataset:
            tokens = np.load(io.BytesIO(sample["tokens.npy"]), allow_pickle=False)
            sentences = (np.load(io.BytesIO(sample["sentences.npy"]), allow_pickle=False)
                         if "sentences.npy" in sample else np.zeros(1, dtype=np.int32))
            docs.append(Doc(sample["__key__"], tokens, sentences))
    except Exception as err:  # tarfile.ReadError, EOFError, zlib errors, bad npy payloads
        raise OSError(f"shard {url} is unreadable after {len(docs)} documents: {err!r}") from err
    if expected is not None and len(docs) != expected:
        raise OSError(f"shard {url} holds {len(docs)} documents but manifest.json lists {expected}: "
                      f"truncated or corrupt")
    return docs
