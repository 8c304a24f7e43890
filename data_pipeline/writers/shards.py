"""Tokenized-document shards in webdataset's tar format, their index files, and the ``manifest.json``
that lists them.

A shard holds whole documents (docs/architecture.md, decision 5): packing happens at load time. Each
sample is ``{__key__, tokens.npy, sentences.npy, json}``. Beside each shard ``NAME.tar`` an index
``NAME.idx.json`` records, per document, its token count, its sentence lengths and the byte offset
and size of each of its members in the tar, so a loader reads any token range of any document with
one byte-range read (decision 12) without opening the shard first. Shards and indexes appear whole
or not at all (``glm_common/storage.py``: a local file is written under a temporary name, synced
and renamed; an object store's object is uploaded straight to its key and appears when the upload
completes -- no copy-and-delete rename); ``manifest.json`` is written last and is the completion
marker of the set: readers find the shards through it, never through a listing. The shards stay
plain webdataset tars.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import posixpath
import tarfile
from dataclasses import dataclass, field

import numpy as np
import webdataset as wds

from glm_common.storage import AtomicFile, Storage

INDEX_FORMAT = "glm-dist/shard-index/v1"
TAR_BLOCK = 512  # a USTAR header, and the unit tar pads member data to


@dataclass
class ShardInfo:
    name: str
    num_samples: int = 0
    num_tokens: int = 0
    num_bytes: int = 0
    index: str = ""  # the index file beside the shard (NAME.idx.json)
    index_sha256: str = ""


def index_name(shard_name: str) -> str:
    """``train-0000.tar`` -> ``train-0000.idx.json``."""
    return (shard_name[:-4] if shard_name.endswith(".tar") else shard_name) + ".idx.json"


def _padded(size: int) -> int:
    return -(-size // TAR_BLOCK) * TAR_BLOCK


def _npy_header_bytes(data: bytes, array: np.ndarray) -> int:
    """The header length of an ``.npy`` member: its data follows, C-ordered (what np.save writes)."""
    return len(data) - array.nbytes


@dataclass
class ShardIndex:
    """The index of one shard, built document by document (``add``) and written as JSON."""

    shard: str
    dtype: object = None  # np.lib.format descr of the token arrays (one per shard)
    keys: list[str] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    sentence_lengths: list[list[int]] = field(default_factory=list)
    members: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # ext -> offset / size (/ header)

    def add(
        self,
        key: str,
        tokens: np.ndarray,
        sentences: np.ndarray | None,
        layout: dict[str, tuple[int, int]],
        header: int,
    ) -> None:
        """One document: its arrays and ``layout`` = ext -> (data offset in the tar, size)."""
        descr = np.lib.format.dtype_to_descr(tokens.dtype)
        if self.dtype is None:
            self.dtype = descr
        elif descr != self.dtype:
            raise ValueError(f"{self.shard}: document {key} has token dtype {descr}, the shard {self.dtype}")
        self.keys.append(key)
        self.num_tokens.append(int(tokens.size))
        self.sentence_lengths.append(sentence_lengths(sentences, int(tokens.size)))
        for ext, (offset, size) in layout.items():
            member = self.members.setdefault(ext, {"offset": [], "size": []})
            member["offset"].append(int(offset))
            member["size"].append(int(size))
        self.members["tokens.npy"].setdefault("header", []).append(int(header))

    def to_json(self, tar_bytes: int) -> bytes:
        return json.dumps(
            {
                "format": INDEX_FORMAT,
                "shard": self.shard,
                "tar_bytes": int(tar_bytes),
                "dtype": self.dtype,
                "docs": len(self.keys),
                "keys": self.keys,
                "num_tokens": self.num_tokens,
                "sentence_lengths": self.sentence_lengths,
                "members": self.members,
            },
            separators=(",", ":"),
        ).encode()


def sentence_lengths(starts: np.ndarray | None, n: int) -> list[int]:
    """Sentence starts ``[0, s1, s2, ...]`` as lengths (one sentence when unknown or malformed)."""
    if starts is None or len(starts) == 0:
        return [n]
    bounds = np.concatenate([np.asarray(starts, dtype=np.int64), [n]])
    lengths = np.diff(bounds)
    if bounds[0] != 0 or (n > 0 and (lengths <= 0).any()):
        return [n]
    return lengths.tolist()


@dataclass
class ShardSetWriter:
    """Writes one split's documents into size-capped shards named ``{prefix}-{index:04d}.tar``,
    each with its index file."""

    root: str
    split: str
    max_bytes: int
    prefix: str = ""
    shards: list[ShardInfo] = field(default_factory=list)
    _writer: wds.TarWriter | None = None
    _stream: AtomicFile | None = None
    _index: ShardIndex | None = None
    _size: int = 0

    def write(self, key: str, tokens: np.ndarray, meta: dict, *, sentences: np.ndarray | None = None) -> None:
        """One document: its token ids, its sentence start indices, and metadata."""
        if self._writer is None or self._size >= self.max_bytes:
            self._roll()
        sample = {"__key__": key, "tokens.npy": _npy(tokens), "json": json.dumps(meta).encode()}
        if sentences is not None:
            sample["sentences.npy"] = _npy(sentences)
        start = self._writer.tarstream.offset
        self._writer.write(sample)
        self._index.add(
            key, tokens, sentences, self._layout(sample, start), _npy_header_bytes(sample["tokens.npy"], tokens)
        )
        payload = sample["tokens.npy"]
        info = self.shards[-1]
        info.num_samples += 1
        info.num_tokens += int(tokens.size)
        info.num_bytes += int(meta.get("n_bytes", 0))
        self._size += len(payload) + 1024  # tar headers and the json member

    def _layout(self, sample: dict, start: int) -> dict[str, tuple[int, int]]:
        """Where each member's data landed: TarWriter writes the members in sorted order, each a
        512-byte USTAR header then its data padded to 512 bytes."""
        layout, pos = {}, start
        for ext in sorted(k for k in sample if k != "__key__"):
            size = len(sample[ext])
            layout[ext] = (pos + TAR_BLOCK, size)
            pos += TAR_BLOCK + _padded(size)
        if pos != self._writer.tarstream.offset:
            raise RuntimeError(
                f"unexpected tar layout writing {sample['__key__']}: members end at "
                f"{self._writer.tarstream.offset}, computed {pos}"
            )
        return layout

    def close(self) -> list[ShardInfo]:
        self._finish()
        return self.shards

    def abort(self) -> None:
        """Drop the shard being written (a failed task): nothing of it appears."""
        if self._stream is not None:
            with contextlib.suppress(OSError, ValueError, tarfile.TarError):
                self._writer.close()  # the tar stream's buffer goes into the file dropped next, not to a closed one
            self._stream.abort()
        self._writer = self._stream = self._index = None

    def _roll(self) -> None:
        self._finish()
        name = f"{self.prefix or self.split}-{len(self.shards):04d}.tar"
        self.shards.append(ShardInfo(name, index=index_name(name)))
        self._stream = AtomicFile(Storage(self.root), name)
        self._writer = wds.TarWriter(self._stream, mtime=0)  # fixed mtime: reproducible shards
        self._index = ShardIndex(name)
        self._size = 0

    def _finish(self) -> None:
        if self._writer is None:
            return
        self._writer.close()  # the tar's end blocks; the stream stays open
        tar_bytes = self._stream.tell()
        info = self.shards[-1]
        index = self._index.to_json(tar_bytes)
        info.index_sha256 = hashlib.sha256(index).hexdigest()
        write_bytes(f"{self.root}/{info.index}", index)
        self._stream.commit()
        self._writer = self._stream = self._index = None


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def write_bytes(url: str, data: bytes) -> None:
    """Write a small file whole or not at all (readers never see half of it)."""
    base = url.rstrip("/")
    Storage(posixpath.dirname(base) or ".").write_bytes(posixpath.basename(base), data)


def write_manifest(root: str, manifest: dict) -> None:
    """The shard set's manifest, written last; what killed writers left goes first (``storage``)."""
    Storage(root).remove_orphans()
    write_bytes(f"{root}/manifest.json", json.dumps(manifest, indent=2).encode())
