"""Checkpoint files are data, never code (docs/architecture.md, decision 11).

- Tensors are safetensors files (``checkpoint/tensorfile.py``): a JSON header and raw bytes, read
  by offset; nothing is unpickled. Where a ``.pt`` file is still read (``load_tensors``: DeepSpeed's
  own files), the load is weights-only: ``enforce_weights_only`` makes that hold for DeepSpeed's
  loads too (``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` wins over its explicit request for a full unpickle).
- Everything else (RNG states, the run's position, shard indexes, meta.json) is JSON, read with a
  size bound; every file name meta.json lists is a relative name inside the checkpoint folder.
- ``meta.json`` lists every file with its size and the SHA-256 of each 32 MiB block, checked
  before anything is loaded (ranks split the blocks): that detects truncation and corruption
  (not an attack -- whoever can edit the folder can edit meta.json; reading only data is the
  security boundary).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glm_common.storage import Storage
from glm_dist.checkpoint.errors import CheckpointError, checkpoint_storage

# 1: pickled RNG and client state; 2: DeepSpeed's files + universal/ (both refused);
# 3: sharded safetensors with global offsets, JSON state, SHA-256 per file block
FORMAT = 3
MAX_JSON_BYTES = 64 * 2**20
MAX_TOKENIZER_BYTES = 256 * 2**20  # a tokenizer.json (a 250k-entry vocabulary with merges is ~20 MB)
BLOCK = 32 * 2**20  # bytes per verified piece of a file


def force_weights_only() -> None:
    """Make every ``torch.load`` of this process weights-only, even where a caller asks for a full
    unpickle (a process-wide switch: the CLI sets it first thing)."""
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)


def enforce_weights_only() -> None:
    """``force_weights_only``, and allow-list the plain types DeepSpeed's own files hold (before
    a DeepSpeed checkpoint is read)."""
    force_weights_only()
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    # plain records (an enum, a dataclass, a class whose state is numbers): no code on load
    torch.serialization.add_safe_globals([LossScaler, ZeroStageEnum, fragment_address])


LOAD_ERRORS = (
    pickle.UnpicklingError,
    RuntimeError,
    EOFError,
    zipfile.BadZipFile,
    OSError,
    ValueError,
    AttributeError,
    TypeError,
    KeyError,
    IndexError,
)


def corrupt(path: str | Path, err: BaseException | str) -> CheckpointError:
    reason = err if isinstance(err, str) else f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return CheckpointError(
        f"checkpoint file {path} is corrupt or not a weights file ({reason}); use an earlier checkpoint"
    )


def load_tensors(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """A tensor file, weights-only; anything else raises ``CheckpointError`` naming the file."""
    enforce_weights_only()
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except LOAD_ERRORS as err:
        raise corrupt(Path(path), err) from None


def parse_json(data: bytes, where: str | Path) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise corrupt(where, err) from None


class BlockHasher:
    """SHA-256 of each ``block``-byte piece of a stream, computed as it is written: a file's
    verification record (``meta.json``) lists them, so ranks can verify a large file in parallel,
    each a share of its blocks."""

    def __init__(self, block: int = BLOCK):
        self.block, self.size, self.digests = block, 0, []
        self._h, self._filled = hashlib.sha256(), 0

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(self.block - self._filled, len(view))
            self._h.update(view[:take])
            self._filled += take
            self.size += take
            view = view[take:]
            if self._filled == self.block:
                self.digests.append(self._h.hexdigest())
                self._h, self._filled = hashlib.sha256(), 0

    def entry(self) -> dict:
        """``{"size", "block", "sha256": [one digest per block]}`` (an empty file: one digest)."""
        digests = self.digests + ([self._h.hexdigest()] if self._filled or not self.digests else [])
        return {"size": self.size, "block": self.block, "sha256": digests}


def entry_of(data: bytes) -> dict:
    hasher = BlockHasher()
    hasher.update(data)
    return hasher.entry()


def read_meta(ckpt: Storage) -> dict:
    """``meta.json`` of a checkpoint folder, with its format checked."""
    if not ckpt.exists("meta.json"):
        raise CheckpointError(
            f"{ckpt} is not a complete checkpoint (no meta.json): a save was interrupted or "
            f"this is not a checkpoint directory"
        )
    meta = parse_json(ckpt.read("meta.json", max_bytes=MAX_JSON_BYTES), f"{ckpt}/meta.json")
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
        raise corrupt(f"{ckpt}/meta.json", "no file list")
    for rel, entry in meta["files"].items():
        reason = _bad_name(rel) or _bad_entry(entry)
        if reason:
            raise corrupt(f"{ckpt}/meta.json", f"file {rel[:200]!r}: {reason}")
    if meta.get("format") == 2:
        raise CheckpointError(
            f"checkpoint {ckpt} has format 2 (DeepSpeed's own files + a universal/ folder of "
            f"pickled tensors); this glm-dist reads format {FORMAT} (sharded safetensors with "
            f"global offsets): convert it with "
            f"`glm checkpoint convert --checkpoint {ckpt} --out NEW_DIR` "
            f"and use NEW_DIR"
        )
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {ckpt} has format {meta.get('format', 1)}, this glm-dist reads format "
            f"{FORMAT} (format 1 stored RNG and run state as pickles, which are never loaded); "
            f"start a new run, or export its weights with the release that wrote it"
        )
    return meta


def _bad_name(rel: str) -> str | None:
    """Why ``rel`` is not a file name inside a checkpoint folder (None if it is)."""
    parts = rel.split("/")
    if rel.startswith("/") or "\\" in rel or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        return "not a relative name inside the checkpoint folder"
    return None


def _bad_entry(entry) -> str | None:
    """Why a file's record ({"size", "block", "sha256"}) is malformed (None if it is not)."""

    def count(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(entry, dict) or not count(entry.get("size")):
        return "no size"
    digests, block = entry.get("sha256"), entry.get("block")
    if isinstance(digests, str):
        return None
    if not (isinstance(digests, list) and all(isinstance(d, str) for d in digests) and count(block) and block > 0):
        return "no SHA-256 list with its block size"
    if len(digests) != max(1, -(-entry["size"] // block)):
        return f"{len(digests)} SHA-256s for {entry['size']} bytes in blocks of {block}"
    return None


def _units(meta: dict, only) -> list[tuple[str, int, int, str]]:
    """Every (file, offset, length, SHA-256) piece that meta.json records, in a fixed order."""
    units = []
    for rel, entry in sorted(meta["files"].items()):
        if only is not None and not only(rel):
            continue
        digests, block = entry["sha256"], entry.get("block")
        if isinstance(digests, str):  # one digest for the whole file
            units.append((rel, 0, entry["size"], digests))
            continue
        for i, digest in enumerate(digests):
            units.append((rel, i * block, min(block, entry["size"] - i * block), digest))
    return units


def verify(ckpt: Storage | str | Path, *, share: tuple[int, int] = (0, 1), only=None) -> dict:
    """Check that ``ckpt`` (a folder, URL or ``Storage``) is a complete checkpoint: every listed
    file present at its size, and the SHA-256 of each piece meta.json records. ``share=(r, n)``:
    hash only the r-th of n equal shares of the bytes (ranks split the work; sizes are checked in
    full). ``only(rel)``: verify only those files (consolidation reads only the fp32 shards).
    Returns meta.json."""
    ckpt = checkpoint_storage(ckpt)
    meta = read_meta(ckpt)
    units = _units(meta, only)
    for rel, entry in sorted(meta["files"].items()):
        if only is not None and not only(rel):
            continue
        try:
            size = ckpt.size(rel)  # a name leading out of the folder, or a FIFO, is refused here
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {ckpt} is missing {rel}; use an earlier checkpoint") from None
        if size != entry["size"]:
            raise CheckpointError(
                f"checkpoint {ckpt}: {rel} is {size} bytes, expected {entry['size']} "
                f"(truncated or overwritten); use an earlier checkpoint"
            )
    total = sum(u[2] for u in units) or 1
    done = 0
    for rel, offset, length, digest in units:
        mine = done * share[1] // total == share[0]  # the share this piece starts in
        done += length
        if mine and _sha256(ckpt, rel, offset, length) != digest:
            raise CheckpointError(
                f"checkpoint {ckpt}: {rel} does not match its SHA-256 in meta.json (corrupt or "
                f"modified); use an earlier checkpoint"
            )
    return meta


def _sha256(ckpt: Storage, rel: str, offset: int, length: int) -> str:
    h = hashlib.sha256()
    for block in ckpt.chunks(rel, offset, length, purpose="verify"):
        h.update(block)
    return h.hexdigest()


# -- RNG state as JSON --------------------------------------------------------------------------
def rng_state(device: torch.device | None = None) -> dict:
    """Python, NumPy and torch RNG states; the CUDA state of ``device`` only (a resume where a
    process sees fewer GPUs still works)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state(device).numpy().tobytes()).decode()
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_bytes_tensor(state["torch"]))
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(_bytes_tensor(state["cuda"]), device)


def _bytes_tensor(b64: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.uint8)
