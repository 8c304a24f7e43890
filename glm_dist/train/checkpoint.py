"""Checkpoints: DeepSpeed engine state + our own state, written atomically.

Layout under ``<out_dir>/checkpoints``::

    step_00000100/            a complete checkpoint (renamed into place when complete)
      state/                  DeepSpeed's files (model, optimizer partitions, ...)
      rng/rank00000.pt        each rank's RNG states
      tokenizer.json          the run's tokenizer (a checkpoint is self-contained)
      meta.json               step, config, and every file with its size (the completion marker)
    latest                    name of the newest complete checkpoint
    .tmp-step_00000200/       a save in progress (a crash leaves only this; it is never loaded)

The client state (step, token and skip counters, data-loader position) rides in DeepSpeed's
``client_state``. A checkpoint is validated (meta.json, every file present with its recorded size)
before anything is loaded, and loading never writes.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from glm_dist.parallel.distributed import DistInfo, barrier

TAG = "state"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message says which file and what to do."""


class CheckpointManager:
    def __init__(self, root: str | Path, dist: DistInfo):
        self.root, self.dist = Path(root), dist

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        pointer = self.root / "latest"
        if pointer.exists():
            path = self.root / pointer.read_text().strip()
            if (path / "meta.json").exists():
                return path
        complete = sorted(p for p in self.root.glob("step_*") if (p / "meta.json").exists())
        return complete[-1] if complete else None

    def resolve(self, resume: str) -> Path | None:
        """``train.resume`` -> the checkpoint to load (validated) or None."""
        if resume == "none":
            return None
        path = self.latest() if resume == "auto" else Path(resume)
        if path is None:
            return None
        if not path.exists():
            raise CheckpointError(f"train.resume={resume}: {path} does not exist; pass an existing "
                                  f"checkpoint directory, 'auto' or 'none'")
        verify(path)
        return path

    def save(self, engine, step: int, client_state: dict, meta: dict, *,
             extra_files: dict[str, Path] | None = None, also=None) -> Path:
        """Write checkpoint ``step`` (all ranks call this); returns its final path.
        ``extra_files`` (name -> source) are copied in by rank 0, e.g. the tokenizer; ``also(tmp)``
        writes more into the checkpoint before it is completed (the universal form)."""
        name = f"step_{step:08d}"
        final, tmp = self.root / name, self.root / f".tmp-{name}"
        if self.dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # debris of a crashed save
            tmp.mkdir(parents=True)
        barrier()
        engine.save_checkpoint(str(tmp), tag=TAG, client_state=client_state, save_latest=False)
        (tmp / "rng").mkdir(exist_ok=True)
        torch.save(rng_state(), tmp / "rng" / f"rank{self.dist.rank:05d}.pt")
        if also is not None:
            also(tmp)
        barrier()
        if self.dist.is_main:
            for name, src in (extra_files or {}).items():
                shutil.copyfile(src, tmp / name)
            files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
            _write_atomic(tmp / "meta.json", json.dumps({**meta, "step": step, "files": files}, indent=2))
            if final.exists():  # re-saving a step (e.g. after a resume): replace as a whole
                shutil.rmtree(final)
            os.replace(tmp, final)
            _write_atomic(self.root / "latest", name)
        barrier()
        return final

    def rotate(self, *, keep_last: int, keep_every: int = 0) -> list[Path]:
        """Delete complete checkpoints beyond the newest ``keep_last``, except multiples of
        ``keep_every``; rank 0 only. Returns what was deleted."""
        if not self.dist.is_main or keep_last < 1:
            return []
        complete = sorted(p for p in self.root.glob("step_*") if (p / "meta.json").exists())
        doomed = [p for p in complete[:-keep_last]
                  if not (keep_every and int(p.name.split("_")[1]) % keep_every == 0)]
        for path in doomed:
            shutil.rmtree(path)
        return doomed

    def load(self, engine, path: Path) -> dict:
        """Load engine state and this rank's RNG; returns the client state."""
        try:
            load_path, client_state = engine.load_checkpoint(str(path), tag=TAG, load_optimizer_states=True,
                                                             load_lr_scheduler_states=False)
        except Exception as err:
            raise CheckpointError(f"checkpoint {path} could not be loaded ({err!r}); it may be corrupt "
                                  f"-- resume from an earlier one with train.resume=DIR") from err
        if load_path is None:
            raise CheckpointError(f"checkpoint {path} holds no DeepSpeed state under {path / TAG}")
        rng_file = path / "rng" / f"rank{self.dist.rank:05d}.pt"
        if rng_file.exists():  # absent when resuming on more ranks than saved: keep the seeded RNG
            set_rng_state(torch.load(rng_file, weights_only=False))
        return client_state


def verify(path: Path) -> dict:
    """Check that ``path`` is a complete checkpoint: meta.json and every file at its size."""
    meta_file = path / "meta.json"
    if not meta_file.exists():
        raise CheckpointError(f"{path} is not a complete checkpoint (no meta.json): a save was "
                              f"interrupted or this is not a checkpoint directory")
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{meta_file} is corrupt ({err}); use an earlier checkpoint") from None
    for rel, size in meta["files"].items():
        f = path / rel
        if not f.exists():
            raise CheckpointError(f"checkpoint {path} is missing {rel}; use an earlier checkpoint")
        if f.stat().st_size != size:
            raise CheckpointError(f"checkpoint {path}: {rel} is {f.stat().st_size} bytes, expected "
                                  f"{size} (truncated or overwritten); use an earlier checkpoint")
    return meta


def consolidated_state_dict(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """fp32 model weights of any checkpoint (any ZeRO stage, any world size) + its meta.json."""
    path = Path(path)
    meta = verify(path)
    state_dir = path / TAG
    if (path / "universal").is_dir():  # whole tensors under the unsplit names, whatever the layout
        from glm_dist.parallel.universal import state_dict

        return {k: v.float() for k, v in _with_tied(state_dict(path / "universal"), meta).items()}, meta
    if meta.get("config", {}).get("parallel", {}).get("pipeline_stages", 1) > 1:
        from glm_dist.parallel.pipeline import pipeline_state_dict

        return {k: v.float() for k, v in pipeline_state_dict(state_dir, meta["model_config"]["n_layer"]).items()}, meta
    if meta.get("zero_stage", 0) >= 1:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        sd = get_fp32_state_dict_from_zero_checkpoint(str(path), tag=TAG)
    else:
        sd = torch.load(state_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    return {k: v.float() for k, v in sd.items()}, meta


def _with_tied(sd: dict[str, torch.Tensor], meta: dict) -> dict[str, torch.Tensor]:
    """Add the names a tied weight also goes by (GPT's ``head.lm_head.weight`` is the token
    embedding), as a full ``state_dict()`` lists them."""
    from glm_dist.models.registry import build_model, model_config_from_dict

    with torch.device("meta"):
        model = build_model(meta["model_family"], model_config_from_dict(meta["model_family"], meta["model_config"]))
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), name)
        if name not in sd and first[id(p)] in sd:
            sd[name] = sd[first[id(p)]]
    return sd


def saved_layout(path: Path) -> dict:
    """The (data, pipeline, tensor, ZeRO) layout a checkpoint was saved at."""
    meta = json.loads((Path(path) / "meta.json").read_text())
    if "layout" in meta:
        return meta["layout"]
    p = meta.get("config", {}).get("parallel", {})
    pp, tp = p.get("pipeline_stages", 1), p.get("tensor_parallel", 1)
    return {"data": meta["world_size"] // (pp * tp), "pipeline": pp, "tensor": tp, "zero_stage": meta.get("zero_stage", 0)}


def universal_dir(path: Path) -> Path:
    """The checkpoint's universal form (whole fp32 weights and moments per parameter)."""
    from glm_dist.parallel.universal import DIR

    d = Path(path) / DIR
    if not d.is_dir():
        raise CheckpointError(f"{path} was saved at layout {saved_layout(path)} without a universal form "
                              f"(train.universal_checkpoint=false); resume it at that layout")
    return d


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
