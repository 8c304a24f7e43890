"""Tensor files in the safetensors layout: an 8-byte little-endian header length, a JSON header
(``{key: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, padded to 8
bytes) and the raw little-endian bytes -- data, never code, and readable by key and by byte range
without reading the rest (``safetensors.safe_open`` reads these files too).

Written as a stream (each tensor's bytes go straight from its host buffer to the file, hashed on
the way), so writing a rank's shards never makes a second copy of them in memory.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import torch

from glm_common.storage import Storage
from glm_dist.checkpoint.files import BlockHasher, CheckpointError, corrupt

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 64 * 2**20
MAX_DIMS = 8
MAX_NUMEL = 2**38  # elements of one tensor: beyond any model of the plan (GPT-3 175B has 1.75e11 in all)


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


def write(
    storage: Storage, rel: str, tensors: list[tuple[str, torch.Tensor]], *, metadata: dict[str, str] | None = None
) -> dict:
    """Write ``tensors`` (contiguous CPU tensors) to ``rel``; returns its meta.json entry (size and
    block SHA-256s, computed while writing)."""
    hasher = BlockHasher()
    with storage.open_write(rel) as f:
        for piece in [header_bytes(tensors, metadata)] + [_raw(t) for _, t in tensors]:
            f.write(piece)
            hasher.update(piece)
    return hasher.entry()


def _raw(t: torch.Tensor):
    """The tensor's bytes without a copy (a zero-copy view of its storage)."""
    flat = t.detach().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else b""


def read_header(storage: Storage, rel: str) -> dict[str, Entry]:
    """The tensors of ``rel`` by key. Only the header is read, and checked as untrusted input before
    anything is allocated from it: bounded, strict JSON types, known dtypes, non-negative shapes of
    at most ``MAX_NUMEL`` elements, and data offsets that tile the data section exactly -- contiguous,
    non-overlapping, from its start to the end of the file (the safetensors rules)."""
    where = f"{storage}/{rel}"
    size = storage.size(rel)
    head = storage.read_range(rel, 0, 8, purpose="meta")
    if len(head) < 8:
        raise corrupt(where, "shorter than a safetensors header")
    (n,) = struct.unpack("<Q", head)
    if n > min(MAX_HEADER, size - 8):
        raise corrupt(where, f"header of {n} bytes in a file of {size}")
    try:
        header = json.loads(storage.read_range(rel, 8, n, purpose="meta").decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        header.pop("__metadata__", None)
        entries = {key: _entry(spec, 8 + n) for key, spec in header.items()}
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise corrupt(where, err) from None
    end = 8 + n
    for key, e in sorted(entries.items(), key=lambda item: (item[1].start, item[1].nbytes)):
        if e.start != end:
            raise corrupt(
                where,
                f"tensor {key} starts at byte {e.start - 8 - n} of the data, not at {end - 8 - n} "
                f"(overlapping or a gap)",
            )
        end = e.start + e.nbytes
    if end != size:
        raise corrupt(where, f"the tensors end at byte {end} of a file of {size}")
    return entries


def _entry(spec: dict, base: int) -> Entry:
    if not isinstance(spec, dict) or spec.get("dtype") not in DTYPES:
        raise ValueError(
            f"dtype {str(spec.get('dtype') if isinstance(spec, dict) else spec)[:40]!r} is not one "
            f"of {', '.join(DTYPES)}"
        )
    offsets, shape = spec.get("data_offsets"), spec.get("shape")
    if not (counts(offsets) and len(offsets) == 2 and counts(shape) and len(shape) <= MAX_DIMS):
        raise ValueError("data_offsets or shape is not a list of non-negative integers")
    begin, end = offsets
    dtype, numel = DTYPES[spec["dtype"]], math.prod(shape)
    if numel > MAX_NUMEL or end - begin != numel * dtype.itemsize:
        raise ValueError(f"offsets {begin}..{end} do not fit shape {shape[:MAX_DIMS]} of {spec['dtype']}")
    return Entry(dtype, tuple(shape), base + begin, end - begin)


def counts(values) -> bool:
    """Whether ``values`` is a JSON list of non-negative integers."""
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


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
