"""Reading the tokenized-document shard set: ``manifest.json`` and the webdataset tar shards.

Shards are plain webdataset tars (other tools read them as they are), but they are read here as
data only: opened through fsspec (a path or a URL, never a ``pipe:`` command), streamed with
``tarfile`` member by member, regular files only (links, devices and directories are skipped; a
member's name is never used as a path), each member bounded in size before it is buffered. Every
file the manifest names stays inside the set's folder: no ``..``, no absolute path, no URL, and in a
local folder no shard or index behind a symlink that leads out of it (``glm data index`` writes
beside the shards).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import tarfile
from typing import Iterator, NamedTuple

import numpy as np

from glm_dist.errors import GlmError

log = logging.getLogger(__name__)
MAX_MEMBER_BYTES = 1 << 30  # one document's tokens: far above any real document, far below a bomb
MAX_MANIFEST_BYTES = 256 * 2**20
KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's rule: the key ends at the basename's first dot


class Doc(NamedTuple):
    key: str
    tokens: np.ndarray  # token ids
    sentences: np.ndarray  # token index where each sentence starts (int32; [0] when unknown)


class ShardSetError(GlmError, RuntimeError):
    """The shard set cannot be used at all (missing manifest, unknown split, no readable shard)."""


def open_shard_file(url: str):
    from data_pipeline.remote import check_scheme, open_url

    try:
        check_scheme(url, "data.shards_dir")
    except ValueError as err:
        raise ShardSetError(str(err)) from None
    return open_url(url, "rb")


def read_manifest(root: str) -> dict:
    url = f"{root}/manifest.json"
    try:
        with open_shard_file(url) as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise ShardSetError(
            f"{url} not found: build the shards first (glm data tokenize -c CONFIG), or point data.shards_dir at them"
        ) from None
    except OSError as err:
        raise ShardSetError(f"{url} cannot be read: {err}") from None
    try:
        if len(data) > MAX_MANIFEST_BYTES:
            raise ValueError(f"larger than {MAX_MANIFEST_BYTES} bytes")
        manifest = json.loads(data.decode("utf-8"))
        if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
            raise ValueError("no 'splits' mapping")
        entries = [e for split in manifest["splits"].values() for e in (split if isinstance(split, list) else [None])]
        if not all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries):
            raise ValueError("a split is not a list of shard entries with a name")
    except (UnicodeDecodeError, ValueError) as err:
        raise ShardSetError(f"{url} is corrupt ({err}); rebuild the shard set with glm data tokenize") from None
    check_confined(root, manifest)
    return manifest


def check_confined(root: str, manifest: dict) -> None:
    """Refuse a manifest that names a file outside ``root`` (``ShardSetError``, one line): every name
    is relative and has no ``..``; in a local folder the shards and their index files are not reached
    through a symlink that leads out of it (the tokenizer may be: a counts set shares its token set's)."""
    split_names = [
        (e[k], k) for split in manifest["splits"].values() for e in split for k in ("name", "index") if e.get(k)
    ]
    others = [
        (t["file"], f"{key}.file")
        for key in ("tokenizer", "target_tokenizer")
        if isinstance(t := manifest.get(key), dict) and "file" in t
    ]
    for name, key in split_names + others:
        parts = name.replace("\\", "/").split("/") if isinstance(name, str) else [""]
        if not parts[0] or ".." in parts or ":" in parts[0]:
            raise ShardSetError(
                f"{root}/manifest.json: {key} {name!r} is not a file inside the shard set (absolute, "
                f"'..', a URL or empty); fix the manifest or rebuild the set with glm data tokenize"
            )
    local = root[len("file://") :] if root.startswith("file://") else root
    if "://" in local or "::" in local:
        return
    top = os.path.realpath(local)
    for name, key in split_names:
        real = os.path.realpath(os.path.join(local, name))
        if os.path.commonpath([top, real]) != top:
            raise ShardSetError(
                f"{root}/manifest.json: {key} {name!r} leads out of the shard set through a "
                f"symlink (to {real}); copy the file into {root} or fix the manifest"
            )


def shard_urls(root: str, manifest: dict, split: str) -> list[str]:
    if split not in manifest["splits"]:
        raise ShardSetError(f"split {split!r} not in {root}/manifest.json (has: {', '.join(manifest['splits'])})")
    return [f"{root}/{s['name']}" for s in manifest["splits"][split]]


def shard_sizes(manifest: dict, split: str) -> list[int]:
    return [s["num_samples"] for s in manifest["splits"][split]]


def _npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def _members(stream) -> Iterator[tuple[str, str, int, bytes]]:
    """The regular members of a tar stream as (key, ext, data offset in the tar, data), each bounded."""
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            found = KEY.match(member.name)
            if found is None:
                continue
            if member.size > MAX_MEMBER_BYTES:
                raise OSError(f"member {member.name} is {member.size} bytes (limit {MAX_MEMBER_BYTES})")
            key, ext = found.groups()
            yield key, ext, member.offset_data, tar.extractfile(member).read()


def _samples(stream) -> Iterator[dict[str, bytes]]:
    """Consecutive members with one key, as webdataset groups them: ``{"__key__", ext: bytes}``."""
    sample: dict[str, bytes] = {}
    for key, ext, _, data in _members(stream):
        if sample and sample["__key__"] != key:
            yield sample
            sample = {}
        sample["__key__"] = key
        sample[ext] = data
    if sample:
        yield sample


def read_shard(url: str, expected: int | None = None) -> list[Doc]:
    """All documents of one shard, in stored order.

    A truncated or corrupt shard raises ``OSError`` naming the shard; the caller decides to skip
    and count it. ``expected`` (the manifest's count) catches what tar alone does not: Python's
    tarfile takes a garbled header after the first member for the end of the archive.
    """
    docs = []
    try:
        with open_shard_file(url) as f:
            for sample in _samples(f):
                sentences = _npy(sample["sentences.npy"]) if "sentences.npy" in sample else np.zeros(1, dtype=np.int32)
                docs.append(Doc(sample["__key__"], _npy(sample["tokens.npy"]), sentences))
    except ShardSetError:
        raise
    except Exception as err:  # tarfile.ReadError, EOFError, zlib errors, a missing or bad npy member
        raise OSError(f"shard {url} is unreadable after {len(docs)} documents: {err!r}") from err
    if expected is not None and len(docs) != expected:
        raise OSError(
            f"shard {url} holds {len(docs)} documents but manifest.json lists {expected}: truncated or corrupt"
        )
    return docs
