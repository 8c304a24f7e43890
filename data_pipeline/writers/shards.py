"""Tokenized-document shards in webdataset's tar format, plus the ``manifest.json`` that lists them.

A shard holds whole documents (ARCHITECTURE.md decision 5): packing happens at load time. Each
sample is ``{__key__, tokens.npy, json}``. Shards are written under a temporary name and renamed
when complete; ``manifest.json`` is written last and is the completion marker of the set.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import fsspec
import numpy as np
import webdataset as wds


@dataclass
class ShardInfo:
    name: str
    num_samples: int = 0
    num_tokens: int = 0
    num_bytes: int = 0


@dataclass
class ShardSetWriter:
    """Writes one split's documents into size-capped shards named ``{prefix}-{index:04d}.tar``."""

    root: str
    split: str
    max_bytes: int
    prefix: str = ""
    shards: list[ShardInfo] = field(default_factory=list)
    _writer: wds.TarWriter | None = None
    _stream: io.BufferedWriter | None = None
    _size: int = 0

    def write(self, key: str, tokens: np.ndarray, meta: dict, *, sentences: np.ndarray | None = None) -> None:
        """One document: its token ids, its sentence start indices, and metadata."""
        if self._writer is None or self._size >= self.max_bytes:
            self._roll()
        sample = {"__key__": key, "tokens.npy": _npy(tokens), "json": json.dumps(meta).encode()}
        if sentences is not None:
            sample["sentences.npy"] = _npy(sentences)
        self._writer.write(sample)
        payload = sample["tokens.npy"]
        info = self.shards[-1]
        info.num_samples += 1
        info.num_tokens += int(tokens.size)
        info.num_bytes += int(meta.get("n_bytes", 0))
        self._size += len(payload) + 1024  # tar headers and the json member

    def close(self) -> list[ShardInfo]:
        self._finish()
        return self.shards

    def _roll(self) -> None:
        self._finish()
        name = f"{self.prefix or self.split}-{len(self.shards):04d}.tar"
        self.shards.append(ShardInfo(name))
        self._stream = fsspec.open(f"{self.root}/{name}.tmp", "wb").open()
        self._writer = wds.TarWriter(self._stream, mtime=0)  # fixed mtime: reproducible shards
        self._size = 0

    def _finish(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._stream.close()
        fs, path = fsspec.core.url_to_fs(f"{self.root}/{self.shards[-1].name}")
        fs.mv(path + ".tmp", path)
        self._writer = self._stream = None


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def write_manifest(root: str, manifest: dict) -> None:
    fs, path = fsspec.core.url_to_fs(f"{root}/manifest.json")
    with fs.open(path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=2)
    fs.mv(path + ".tmp", path)
