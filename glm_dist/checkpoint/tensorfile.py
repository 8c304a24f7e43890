"""Tensor files in the safetensors layout: an 8-byte little-endian header length, a JSON header
(``{key: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, padded to 8
bytes) and the raw little-endian bytes -- data, never code, and readable by key and by byte range
without reading the rest (``safetensors.safe_open`` reads these files too).

Written as a stream (each tensor's bytes go straight from its host buffer to the file, hashed on
the way), so writing a rank's shards never makes a second copy of them in memory.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import torch

from glm_dist.checkpoint.files import BlockHasher, CheckpointError, corrupt
from glm_dist.checkpoint.storage import Storage

DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 64 * 2**20


@dataclass(frozen=True)
class Entry:
    """Where one tensor's bytes are in its file."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int

    def at(self, element: int) -> int:
        """Byte offset of flat element ``element``."""
        return self.start + element * self.dtype.itemsize


def header_bytes(tensors: list[tuple[str, torch.Tensor]], metadata: dict[str, str] | None = None) -> bytes:
    header, offset = {}, 0
    for key, t in tensors:
        nbytes = t.numel() * t.element_size()
        header[key] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write(storage: Storage, rel: str, tensors: list[tuple[str, torch.Tensor]], *,
          metadata: dict[str, str] | None = None) -> dict:
    """Write ``tensors`` (contiguous CPU tensors) to ``rel``; returns its meta.json entry (size and
    block SHA-256s, computed while writing)."""
    hasher = BlockHasher()
    f = storage.open_write(rel)
    try:
        for piece in [header_bytes(tensors, metadata)] + [_raw(t) for _, t in tensors]:
            f.write(piece)
            hasher.update(piece)
    finally:
        storage.close_write(f)
    return hasher.entry()


def _raw(t: torch.Tensor):
    """The tensor's bytes without a copy (a zero-copy view of its storage)."""
    flat = t.detach().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else b""


def read_header(storage: Storage, rel: str) -> dict[str, Entry]:
    """The tensors of ``rel`` by key (only the header is read; bounded and validated against the
    file's size, so a damaged header is one clear error)."""
    size = storage.size(rel)
    head = storage.read_range(rel, 0, 8, purpose="meta")
    if len(head) < 8:
        raise corrupt(f"{storage}/{rel}", "shorter than a safetensors header")
    (n,) = struct.unpack("<Q", head)
    if n > min(MAX_HEADER, size - 8):
        raise corrupt(f"{storage}/{rel}", f"header of {n} bytes in a file of {size}")
    try:
        header = json.loads(storage.read_range(rel, 8, n, purpose="meta").decode("utf-8"))
        header.pop("__metadata__", None)
        entries = {key: _entry(spec, 8 + n) for key, spec in header.items()}
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise corrupt(f"{storage}/{rel}", err) from None
    for key, e in entries.items():
        if e.start + e.nbytes > size:
            raise corrupt(f"{storage}/{rel}", f"tensor {key} runs past the end of the file")
    return entries


def _entry(spec: dict, base: int) -> Entry:
    begin, end = (int(x) for x in spec["data_offsets"])
    dtype, shape = DTYPES[spec["dtype"]], tuple(int(d) for d in spec["shape"])
    numel = 1
    for d in shape:
        numel *= d
    if begin < 0 or end - begin != numel * dtype.itemsize:
        raise ValueError(f"offsets {begin}..{end} do not fit shape {list(shape)} of {spec['dtype']}")
    return Entry(dtype, shape, base + begin, end - begin)


def read_tensor(storage: Storage, rel: str, entry: Entry, *, purpose: str = "state") -> torch.Tensor:
    """One whole tensor (a copy that owns its memory)."""
    data = storage.read_range(rel, entry.start, entry.nbytes, purpose=purpose)
    if len(data) != entry.nbytes:
        raise CheckpointError(f"checkpoint file {storage}/{rel} is truncated; use an earlier checkpoint")
    return from_bytes(data, entry.dtype).reshape(entry.shape)


def from_bytes(data: bytes, dtype: torch.dtype) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)


def read_all(storage: Storage, rel: str, *, purpose: str = "state") -> dict[str, torch.Tensor]:
    return {key: read_tensor(storage, rel, e, purpose=purpose) for key, e in read_header(storage, rel).items()}
