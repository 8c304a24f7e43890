"""``glm checkpoint convert``: a format-2 checkpoint (DeepSpeed's files + ``universal/``) as format 3.

Format 2 saved, beside DeepSpeed's own files, a universal copy: per parameter of the unsplit model
a ``universal/<name>.pt`` holding the whole fp32 master and optimizer moments, ``index-*.json``
(shapes, moment names, the optimizer's step) and ``buffers-*.pt``. Those are exactly the
sharded format's content for a run of one process, so conversion writes each tensor as one whole
shard (no tensor-parallel slicing, offset 0) and the run state as it was; the result resumes at any
layout, exports and evaluates like any format-3 checkpoint. The ``.pt`` files are read
weights-only (``load_tensors``): no pickled code runs. DeepSpeed's own files are not needed.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from glm_common.storage import Storage
from glm_dist.checkpoint import tensorfile
from glm_dist.checkpoint.errors import checkpoint_storage
from glm_dist.checkpoint.files import FORMAT, MAX_JSON_BYTES, CheckpointError, corrupt, load_tensors, parse_json
from glm_dist.checkpoint.shards import Shard, data_file, index_file
from glm_dist.checkpoint.writer import hash_file

OLD_FORMAT = 2
UNIVERSAL = "universal"
STREAMS = "stream_memory"


def convert(src: str | Path, out: str | Path) -> dict:
    """Write the format-3 form of the format-2 checkpoint ``src`` to the new folder ``out``."""
    src, out = Path(src), Path(out)
    meta = _verified_meta(src)
    if out.exists():
        raise CheckpointError(f"{out} exists; give a new folder for the converted checkpoint")
    uni = src / UNIVERSAL
    parts = sorted(uni.glob("index-*.json")) if uni.is_dir() else []
    if not parts:
        raise CheckpointError(
            f"{src} was saved without its universal form (train.universal_checkpoint=false): "
            f"only DeepSpeed's own files are there; export it with glm-dist at commit 75b9408"
        )
    shapes, moments, step = {}, [], None
    for part in parts:
        index = parse_json(part.read_bytes()[:MAX_JSON_BYTES], str(part))
        shapes.update({str(k): tuple(v) for k, v in index["params"].items()})
        moments = sorted(set(moments) | set(index.get("moments") or []))
        step = index.get("step", step)
    tmp = checkpoint_storage(out.parent / f".tmp-{out.name}")
    tmp.remove()
    entries, shards = {}, []
    tensors: dict[str, list[tuple[str, torch.Tensor]]] = {k: [] for k in ["fp32", *moments]}
    for name, shape in sorted(shapes.items()):
        saved = load_tensors(uni / f"{name}.pt")
        for kind in tensors:
            value = saved.get(kind) if isinstance(saved, dict) else None
            if not torch.is_tensor(value) or tuple(value.shape) != shape:
                raise corrupt(uni / f"{name}.pt", f"no {kind} tensor of shape {list(shape)}")
            tensors[kind].append(_whole(name, kind, value, shards))
    buffers = {}
    for part in sorted(uni.glob("buffers-*.pt")):
        buffers.update(load_tensors(part))
    if buffers:
        tensors["buffer"] = [_whole(str(name), "buffer", value, shards) for name, value in sorted(buffers.items())]
    for kind, items in tensors.items():
        entries[data_file(0, kind)] = tensorfile.write(tmp, data_file(0, kind), items)
    tmp.write_bytes(index_file(0), json.dumps({"format": FORMAT, "rank": 0, "shards": shards}).encode())
    _copy_state(src, tmp, step, moments, meta)
    _copy_streams(src, tmp)
    for rel in tmp.walk():
        entries.setdefault(rel, hash_file(tmp, rel))
    record = {k: v for k, v in meta.items() if k not in ("files", "format")}
    record.update(
        format=FORMAT,
        saved_at=meta.get("saved_at", time.time()),
        converted_from=str(src),
        files=dict(sorted(entries.items())),
    )
    tmp.write_bytes("meta.json", json.dumps(record, indent=1).encode())  # last: the commit record
    tmp.fsync_tree()
    checkpoint_storage(out.parent).rename(tmp.name, out.name)
    return {
        "out": str(out),
        "step": record.get("step"),
        "parameters": len(shapes),
        "elements": sum(int(torch.Size(s).numel()) for s in shapes.values()),
        "moments": moments,
    }


def _whole(name: str, kind: str, value: torch.Tensor, shards: list) -> tuple[str, torch.Tensor]:
    value = value.detach().float().contiguous()
    key = f"{name}@0"
    shards.append(Shard(name, kind, tuple(value.shape), None, 0, value.numel()).to_json(key))
    return key, value.reshape(-1)


def _verified_meta(src: Path) -> dict:
    """Format 2's meta.json, every listed file checked against its size and SHA-256."""
    path = src / "meta.json"
    if not path.is_file():
        raise CheckpointError(f"{src} is not a complete checkpoint (no meta.json)")
    meta = parse_json(path.read_bytes()[:MAX_JSON_BYTES], str(path))
    if not isinstance(meta, dict) or meta.get("format") != OLD_FORMAT:
        raise CheckpointError(
            f"{src} has format {meta.get('format') if isinstance(meta, dict) else '?'}; "
            f"glm checkpoint convert reads format {OLD_FORMAT}"
        )
    for rel, entry in sorted(meta.get("files", {}).items()):
        f = src / rel
        if not f.is_file() or f.stat().st_size != entry["size"]:
            raise CheckpointError(
                f"checkpoint file {f} is missing or is not {entry['size']} bytes; use an earlier checkpoint"
            )
        digest = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                digest.update(block)
        if digest.hexdigest() != entry["sha256"]:
            raise CheckpointError(
                f"checkpoint file {f} does not match its SHA-256 in meta.json; use an earlier checkpoint"
            )
    return meta


def _copy_state(src: Path, tmp: Storage, step, moments: list[str], meta: dict) -> None:
    """The run state: counters and the data position as saved, plus what format 2 kept in
    DeepSpeed's files (the optimizer's step, the engine's counters); RNG states as they were."""
    client = parse_json((src / "client_state.json").read_bytes()[:MAX_JSON_BYTES], f"{src}/client_state.json")
    train = client.get("train_state", {})
    cfg = meta.get("config", {}).get("train", {})
    batch = cfg.get("global_batch_size") or (
        cfg.get("micro_batch_size", 0) * cfg.get("grad_accum_steps", 1) * meta.get("layout", {}).get("data", 1)
    )
    client["optimizer"] = {"moments": moments, "step": step, "step_tensor": True}
    client["engine"] = {
        "global_steps": train.get("step", 0) - train.get("skipped_steps", 0),
        "global_samples": train.get("step", 0) * batch,
        "skipped_steps": train.get("skipped_steps", 0),
    }
    tmp.write_bytes("client_state.json", json.dumps(client).encode())
    if (src / "tokenizer.json").is_file():
        tmp.write_bytes("tokenizer.json", (src / "tokenizer.json").read_bytes())
    for rng in sorted((src / "rng").glob("rank*.json")):
        tmp.write_bytes(f"rng/{rng.name}", rng.read_bytes()[:MAX_JSON_BYTES])


def _copy_streams(src: Path, tmp: Storage) -> None:
    """XLNet's stream memory: format 2's ``stream_memory/rank*.pt`` as safetensors."""
    for old in sorted((src / STREAMS).glob("rank*.pt")):
        saved = load_tensors(old)
        if not isinstance(saved, dict) or "rows" not in saved:
            raise corrupt(old, "no stream rows")
        layers = sorted((k for k in saved if k.startswith("layer")), key=lambda k: int(k[5:]))
        items = [("rows", saved["rows"])] + [(k, saved[k].contiguous()) for k in layers]
        tensorfile.write(tmp, f"{STREAMS}/{old.stem}.safetensors", items)
