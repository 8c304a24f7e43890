"""Checkpoints of a training run: one sharded format written by every rank in parallel and in the
background, verified before use, readable at any layout, one lineage.

Layout under ``train.checkpoint_dir`` (default ``<out_dir>/checkpoints``; a path or an fsspec URL)::

    step_00000100/                          a complete checkpoint (meta.json is its commit record)
      shards/rank00003.json                 the shards rank 3 wrote: parameter, kind, TP slicing, offsets
      shards/rank00003.<kind>.safetensors   fp32 masters / each optimizer moment / buffers, no gather
      rng/rank00003.json                    each rank's RNG states
      stream_memory/rank00003.safetensors   Transformer-XL memory of the streams rank 3 held (XLNet)
      client_state.json                     step / token / skip counters, data position, optimizer step
      tokenizer.json                        the run's tokenizer (a checkpoint is self-contained)
      state/                                DeepSpeed's own files, only with train.deepspeed_checkpoint
      meta.json                             config, layout, every file's size and block SHA-256s (last)
    latest                                  name of the newest complete save
    .tmp-step_00000200.<run>/               a local save in progress (renamed when committed)
    aside/                                  checkpoints moved out of the lineage (a roll-back, or
                                            saves auto-resume found unverifiable)

A save copies this rank's shards to host memory (the only part training waits for) and writes
them on a background thread (``checkpoint/writer.py``); the next save, the end of the run or a
stop signal waits for it, and every rank then agrees on any failure. Rank 0 commits once every
rank's files are complete: meta.json last, then (locally) fsync and rename, ``latest``, rotation.
On an object store the folder is written in place and meta.json alone publishes it. A save never
replaces a committed one (another run's, in a shared folder), a process removes only its own
unfinished saves, and weights that are not finite are never saved.

Lineage: each commit record names its ``parent`` (the SHA-256 of the meta.json of the save this
run continued from, or of its own previous save), so rotation keeps the newest ``keep_last`` saves
of this run's lineage by step -- never by wall clock -- and touches nothing else.

``train.resume=auto`` follows ``latest``, then older steps, skipping (and saying so) any that fail
verification and moving those aside. Resuming from an older step while newer ones exist moves
those aside -- only with ``train.resume_overwrite=true``, else the run is refused -- so a later
auto-resume never jumps to a stale future. A checkpoint of another model family or architecture is
refused. Loading never writes into a checkpoint, and each rank reads only the slices it needs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

import torch

from glm_common.storage import Storage
from glm_dist.checkpoint.consolidate import saved_model
from glm_dist.checkpoint.errors import checkpoint_storage
from glm_dist.checkpoint.files import (
    FORMAT,
    MAX_JSON_BYTES,
    MAX_TOKENIZER_BYTES,
    CheckpointError,
    parse_json,
    read_meta,
    rng_state,
    set_rng_state,
    verify,
)
from glm_dist.checkpoint.shards import Shard, ShardIndex, data_file, index_file
from glm_dist.checkpoint.writer import DONE, AsyncSave, RankFiles, failure, hash_file
from glm_dist.train.preemption import SETTLE_S
from glm_dist.parallel import comm, fragments
from glm_dist.parallel.distributed import DistInfo

log = logging.getLogger(__name__)
ASIDE = "aside"
STEP = re.compile(r"^step_\d{8}$")
STEP_IN = re.compile(r"step_\d{8}")  # in a staging folder's name, .tmp-step_N.<run>
ABANDON_S = 5.0  # an abandoned save's file being written: how long it may take to finish
DUPLICATE_S = 2.0  # a second SIGINT this soon is the same Ctrl-C (the terminal's and a launcher's)
DS_TAG = "state"  # DeepSpeed's own files, under <checkpoint>/state (train.deepspeed_checkpoint)
ENGINE_COUNTERS = ("global_steps", "global_samples", "skipped_steps")
# model config fields a resumed run may change: regularisation and decoding, not the architecture
RESUME_MAY_CHANGE = re.compile(r"dropout|^weight_drop$|^ar_alpha$|^tar_beta$|^cvt_beam$")


def step_of(path) -> int:
    return int(path.name.split("_")[1])


class CheckpointManager:
    def __init__(self, root: str | Path, dist: DistInfo, *, keep_last: int = 0, keep_every: int = 0):
        self.storage, self.dist = checkpoint_storage(root), dist
        self.root = self.storage  # kept for messages: str(self.root) is the folder or URL
        self.keep_last, self.keep_every = keep_last, keep_every
        self.pending: AsyncSave | None = None
        self._host: dict[str, torch.Tensor] = {}  # host buffers of the shards, reused from save to save
        self.last_save: dict = {}  # timings and bytes of the last save (bench/checkpoint_scaling.py)
        self.head: str | None = None  # id of this lineage's newest save: the parent of the next one
        self._run = ""  # names this run's unfinished saves (.tmp-step_N.<run>), agreed at the first save
        self._starting: Storage | None = None  # a save's staging folder until its background writer has it

    # -- the lineage ---------------------------------------------------------------------------
    def complete(self) -> list[Storage]:
        """Complete checkpoints (meta.json written), highest step first."""
        names = [n for n in self.storage.listdir() if STEP.match(n)]
        done = [self.storage.child(n) for n in names if self.storage.exists(f"{n}/meta.json")]
        return sorted(done, key=step_of, reverse=True)

    def latest(self) -> Storage | None:
        """The checkpoint ``latest`` names, if it names one."""
        if not self.storage.isfile("latest"):
            return None
        text = self.storage.read("latest", max_bytes=64).decode("utf-8", "replace").strip()
        return self.storage.child(text) if STEP.match(text) else None

    def candidates(self) -> list[Storage]:
        """What ``resume=auto`` tries, in order: the one ``latest`` names, then by step."""
        done = self.complete()
        named = self.latest()
        return ([named] if named in done else []) + [p for p in done if p != named]

    def resolve(
        self, resume: str, *, overwrite: bool = False, family: str | None = None, model_config: Any = None
    ) -> Storage | None:
        """``train.resume`` -> the verified checkpoint to load, or None (all ranks call this). With
        ``family`` and ``model_config`` (this run's model), a checkpoint of another model is refused."""
        unfinished = [n for n in self.storage.listdir() if n.startswith(".tmp-step_")]
        if unfinished and self.dist.is_main:
            log.warning(
                "%s holds unfinished saves (a crashed run's, or another process's in progress), never resumed "
                "from: %s; delete them once no run writes there",
                self.root,
                ", ".join(unfinished[:5]),
            )
        if resume == "none":
            self._refuse_other_runs()
            return None
        skipped: list[Storage] = []
        if resume == "auto":
            path, skipped = self._newest_verified()
        else:
            path = checkpoint_storage(resume)
            if not path.isdir():
                raise CheckpointError(
                    f"train.resume={resume}: {path} is not a directory; pass a checkpoint "
                    f"directory (…/checkpoints/step_N), 'auto' or 'none'"
                )
            reason = self._verify(path)
            if reason:
                raise CheckpointError(reason)
        if path is None:
            return None
        meta_bytes = path.read("meta.json", max_bytes=MAX_JSON_BYTES)
        if family is not None:
            check_resumable(parse_json(meta_bytes, f"{path}/meta.json"), path, family, model_config)
        self._keep_lineage(path, ignore=skipped, overwrite=overwrite)
        self._move_aside(skipped, "unverified")
        self.head = save_id(meta_bytes)
        return path

    def _refuse_other_runs(self) -> None:
        """A new run (``train.resume=none``) in a folder that holds checkpoints would mix its saves
        with theirs (the same step names, ``latest`` moving between lineages)."""
        done = self.complete()
        if done:
            raise CheckpointError(
                f"train.resume=none, but {self.root} holds checkpoints of an earlier run "
                f"({', '.join(p.name for p in done[:3])}{', ...' if len(done) > 3 else ''}): use "
                f"another train.out_dir (or train.checkpoint_dir), or train.resume=auto to continue "
                f"it"
            )

    def _verify(self, path: Storage) -> str | None:
        """Why ``path`` fails verification (agreed by every rank; each hashes its share), or None."""
        try:
            verify(path, share=(self.dist.rank, self.dist.world_size))
            reason = None
        except CheckpointError as err:
            reason = str(err)
        return comm.first_error(reason)

    def _newest_verified(self) -> tuple[Storage | None, list[Storage]]:
        """The newest checkpoint that verifies, and the ones skipped on the way (moved aside by
        ``resolve``: they can never be resumed from, and a new save of their step must not meet them)."""
        skipped, reasons = [], []
        for path in self.candidates():
            reason = self._verify(path)
            if reason is None:
                return path, skipped
            skipped.append(path)
            reasons.append(reason)
            if self.dist.is_main:
                log.warning("train.resume=auto: skipping %s: %s", path.name, reason)
        if skipped:
            raise CheckpointError(
                f"train.resume=auto: none of the {len(skipped)} checkpoints under {self.root} "
                f"verifies; the newest: {reasons[0]}"
            )
        return None, []

    def _keep_lineage(self, path: Storage, *, ignore: list[Storage], overwrite: bool) -> None:
        """Newer checkpoints of this run than the one resumed from would be a stale future."""
        newer = [p for p in self.complete() if step_of(p) > step_of(path) and p != path and p not in ignore]
        if not newer:
            return
        names = ", ".join(p.name for p in reversed(newer))
        if not overwrite:
            raise CheckpointError(
                f"resuming from {path} while {self.root} holds newer checkpoints ({names}): a later "
                f"train.resume=auto would continue the old run; set train.resume_overwrite=true to "
                f"move them to {self.root}/{ASIDE}, or use another train.out_dir"
            )
        where = self._move_aside(newer, "rolled-back")
        if self.dist.is_main:
            log.warning("resuming from %s: moved the newer checkpoints %s to %s/%s", path.name, names, self.root, where)

    def _move_aside(self, paths: list[Storage], why: str) -> str:
        """Move ``paths`` to ``aside/<why>-<time>-<pid>/`` (rank 0; all ranks wait). Never deleted:
        a person can look at them. Returns the folder."""
        where = f"{ASIDE}/{why}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        if paths and self.dist.is_main:
            for p in paths:
                self.storage.rename(p.name, f"{where}/{p.name}")
        if paths:
            comm.barrier()
        return where

    def rotate(self) -> list[Storage]:
        """Delete this lineage's saves beyond its ``keep_last`` highest steps, except multiples of
        ``keep_every``; rank 0 only. The lineage runs from this run's newest save (or, before one,
        the save ``latest`` names) through each commit record's ``parent``: saves of other runs and
        copies are never touched, nor the one ``latest`` names. Returns what was deleted."""
        if not self.dist.is_main or self.keep_last < 1:
            return []
        named = self.latest()
        records = {}  # save id -> (folder, parent id)
        for path in self.complete():
            try:
                data = path.read("meta.json", max_bytes=MAX_JSON_BYTES)
                meta = parse_json(data, f"{path}/meta.json")
            except CheckpointError:
                continue  # not this run's to judge: auto-resume moves it aside if it is ever tried
            records[save_id(data)] = (path, meta.get("parent") if isinstance(meta, dict) else None)
        head = self.head or next((i for i, (p, _) in records.items() if p == named), None)
        lineage: list[Storage] = []
        while head in records and records[head][0] not in lineage:
            path, head = records[head]
            lineage.append(path)
        newest = lineage[:1]
        lineage.sort(key=step_of, reverse=True)
        doomed = [
            p
            for p in lineage[self.keep_last :]
            if p not in newest and p != named and not (self.keep_every and step_of(p) % self.keep_every == 0)
        ]
        for path in doomed:
            self.storage.remove(path.name)
        return doomed

    # -- saving ----------------------------------------------------------------------------------
    def save(
        self,
        engine,
        step: int,
        *,
        naming: fragments.Naming,
        coords: dict,
        sizes: dict,
        client_state: dict,
        meta: dict,
        extra: RankFiles | None = None,
        tokenizer: str | None = None,
        deepspeed_files: bool = False,
        wait: bool = False,
    ) -> Storage:
        """Start checkpoint ``step`` (all ranks call this): wait for the previous one, copy this
        rank's shards to host memory and hand them to a background writer; returns the final
        location. ``wait``: also wait until it is committed (end of run, stop signal). A failure on
        any rank (e.g. a full disk) stops every rank with the same error at that wait; the
        previous checkpoint stays the latest. So do a committed ``step_N`` already there (another
        run's) and weights that are not finite."""
        self.wait()
        name = f"step_{step:08d}"
        staging = self._staging(name)
        self._starting = staging
        t0 = time.perf_counter()
        self._agreed(lambda: self._start(staging), f"starting checkpoint {name}", staging)
        files = extra or RankFiles(self.dist.rank)

        def capture() -> None:
            if deepspeed_files:  # collective: every rank first
                engine.save_checkpoint(staging.root, tag=DS_TAG, client_state={}, save_latest=False)
            fragments.link_moments(engine)
            # persistent buffers: the same on every data- and tensor-parallel rank of a pipeline stage,
            # so one rank per stage writes its stage's (a buffer lives on one stage)
            writes_buffers = coords.get("data", 0) == 0 and coords.get("tensor", 0) == 0
            buffers = list(naming.buffers(engine.module)) if writes_buffers else []
            self._capture(files, fragments.pieces(engine, naming, coords, sizes), engine.device, buffers)
            files.blobs[f"rng/rank{self.dist.rank:05d}.json"] = json.dumps(rng_state(engine.device)).encode()
            if self.dist.is_main:
                run = {
                    **client_state,
                    "optimizer": fragments.optimizer_step(engine),
                    "engine": {k: getattr(engine, k) for k in ENGINE_COUNTERS if hasattr(engine, k)},
                }
                files.blobs["client_state.json"] = json.dumps(run).encode()
                if tokenizer is not None:
                    files.blobs["tokenizer.json"] = _read_small(tokenizer)

        self._agreed(capture, f"writing checkpoint {name}", staging)
        self._refuse_non_finite(files, name, staging)
        commit = (
            (lambda entries: self._commit(staging, name, step, meta, entries, deepspeed_files))
            if self.dist.is_main
            else None
        )
        self.pending = AsyncSave(
            staging,
            files,
            world=self.dist.world_size,
            what=f"writing checkpoint {name}",
            root=self.storage,
            commit=commit,
        )
        self._starting = None
        self.last_save = {"step": step, "blocking_s": time.perf_counter() - t0, "bytes": files.nbytes()}
        if wait:
            self.wait()
        return self.storage.child(name)

    def _staging(self, name: str) -> Storage:
        """Where this run writes save ``name`` before it is committed: locally ``.tmp-<name>.<run>``,
        a name no other process uses. A committed ``name`` already there is refused, on every rank."""
        taken = self.dist.is_main and self.storage.exists(f"{name}/meta.json")
        error = comm.first_error(
            f"checkpoint {self.root}/{name} already exists (another run writing into this "
            f"folder, or a copy put there) and is never replaced; give each run its own "
            f"train.out_dir"
            if taken
            else None
        )
        if error is not None:
            raise CheckpointError(error)
        if not self._run:  # one name on every rank, unique to this run
            self._run = comm.broadcast_bytes(secrets.token_hex(6).encode() if self.dist.is_main else None).decode()
        return self.storage.child(f".tmp-{name}.{self._run}" if self.storage.local else name)

    def _start(self, staging: Storage) -> None:
        if self.dist.is_main:
            staging.remove()  # locally this run's own name; remotely an uncommitted folder of this step
            staging.makedirs()

    def _refuse_non_finite(self, files: RankFiles, name: str, staging: Storage) -> None:
        """Weights with a NaN or an Inf are never saved (a loss explosion, a rate too high): one
        reduction over this rank's fp32 shards, already in host memory, and one agreement."""
        host, bad = self._host.get("fp32"), None
        if host is not None and not bool(torch.isfinite(host).all()):
            tensors = files.tensors.get(data_file(self.dist.rank, "fp32"), [])
            key = next((k for k, t in tensors if not bool(torch.isfinite(t).all())), "?")
            bad = f"{key.rsplit('@', 1)[0]} on rank {self.dist.rank}"
        bad = comm.first_error(bad)
        if bad is not None:
            self._fail(
                f"checkpoint {name} not saved: the weights are not finite (NaN or Inf in {bad}), training diverged",
                staging,
                fix="resume from it with a lower train.lr or a train.grad_clip",
            )

    def _capture(self, files: RankFiles, pieces: list, device: torch.device, buffers: list = ()) -> None:
        """Copy the slices this rank writes to host memory (pinned under CUDA, reused between saves),
        one buffer per kind, and the module's persistent ``buffers`` (key, name, value) whole; describe
        them in the rank's index."""
        plan: dict[str, list] = {}
        for piece in pieces:
            for kind in _kinds(piece):
                plan.setdefault(kind, []).append(piece)
        shards = []
        for kind, group in plan.items():
            total = sum(p.write[1] - p.write[0] for p in group)
            host = self._host_buffer(kind, total, device)
            offset, tensors = 0, []
            for piece in group:
                lo, hi = piece.write
                if hi > lo:
                    host[offset : offset + hi - lo].copy_(
                        piece.view(kind)[lo - piece.start : hi - piece.start], non_blocking=True
                    )
                    shard = Shard(piece.name, kind, piece.shape, piece.tp, lo, hi - lo)
                    tensors.append((f"{piece.name}@{lo}", host[offset : offset + hi - lo]))
                    shards.append(shard.to_json(tensors[-1][0]))
                    offset += hi - lo
            files.tensors[data_file(self.dist.rank, kind)] = tensors
        for piece in pieces:  # optimizer states of another shape than the parameter (Adafactor's factors)
            if piece.write[0] == 0 < piece.write[1]:
                for kind, value in piece.extra.items():
                    key = f"{piece.name}@extra"
                    files.tensors.setdefault(data_file(self.dist.rank, kind), []).append((key, value.float().cpu()))
                    shards.append(Shard(piece.name, kind, tuple(value.shape), None, 0, value.numel()).to_json(key))
        for _, name, value in buffers:  # in their own dtype (CoVe's GloVe table: fp32)
            key = f"{name}@buffer"
            host = value.detach().to("cpu", copy=True)
            files.tensors.setdefault(data_file(self.dist.rank, "buffer"), []).append((key, host))
            shards.append(Shard(name, "buffer", tuple(value.shape), None, 0, value.numel()).to_json(key))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        files.blobs[index_file(self.dist.rank)] = json.dumps(
            {"format": FORMAT, "rank": self.dist.rank, "shards": shards}
        ).encode()

    def _host_buffer(self, kind: str, numel: int, device: torch.device) -> torch.Tensor:
        buf = self._host.get(kind)
        if buf is None or buf.numel() != numel:
            buf = torch.empty(numel, dtype=torch.float32, pin_memory=device.type == "cuda")
            self._host[kind] = buf
        return buf

    def _commit(self, staging: Storage, name: str, step: int, meta: dict, entries: dict, deepspeed_files: bool) -> None:
        """Rank 0, once every rank's files are written: meta.json last (naming its parent), publish
        (never over an existing step folder), ``latest``, rotate."""
        staging.remove(DONE)
        if deepspeed_files:  # DeepSpeed's own files, written synchronously by several ranks
            for rel in staging.walk(DS_TAG):
                entries[rel] = hash_file(staging, rel)
        record = {
            **meta,
            "format": FORMAT,
            "step": step,
            "saved_at": time.time(),
            "parent": self.head,
            "files": dict(sorted(entries.items())),
        }
        data = json.dumps(record, indent=1).encode()
        staging.write_bytes("meta.json", data)
        if self.storage.local:
            staging.fsync_tree()
            self.storage.rename(staging.name, name)
        self.head = save_id(data)
        self.storage.write_bytes("latest", name.encode())
        self.rotate()

    def wait(self) -> None:
        """Wait for the pending save (all ranks): every rank's writes complete and agreed, rank 0's
        commit done. A failure anywhere raises the same ``CheckpointError`` on every rank."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        t0 = time.perf_counter()
        pending.wait_written()
        error = comm.first_error(pending.error)
        pending.finish(abort=error is not None)
        if error is None:
            error = comm.first_error(pending.commit_error)
        self.last_save.update(wait_s=time.perf_counter() - t0, **{f"{k}_s": v for k, v in pending.seconds.items()})
        if error is not None:
            self._fail(error, pending.staging)

    def settle(self, timeout_s: float = SETTLE_S) -> str | None:
        """After Ctrl-C (every rank is stopping, so no collective): give the save in flight ``timeout_s``
        to finish -- this rank's writes, and on rank 0 the commit, which waits for every rank's -- or
        abandon it: rank 0 removes its staging folder, so no unfinished save of this run stays behind.
        A second Ctrl-C abandons at once. What became of the save, for the log (None: there was none)."""
        pending, staging, self.pending, self._starting = self.pending, self._starting, None, None
        if pending is None and staging is None:
            return None
        name = STEP_IN.search((pending.staging if pending is not None else staging).name).group(0)
        if pending is not None:
            start = time.monotonic()
            while pending.thread.is_alive() and time.monotonic() - start < timeout_s:
                try:
                    pending.thread.join(timeout_s - (time.monotonic() - start))
                except KeyboardInterrupt:  # Ctrl-C again: abandon -- unless it is the first one delivered twice
                    if time.monotonic() - start >= DUPLICATE_S:
                        break
            if not pending.thread.is_alive() and pending.error is None and pending.commit_error is None:
                return f"checkpoint: {self.storage.child(name)} finished before stopping"
            pending.abort.set()  # rank 0's commit stops waiting; a file being written is finished, briefly
            pending.thread.join(ABANDON_S)
            staging = pending.staging
        if self.dist.is_main:
            staging.remove()
        done = self.candidates()
        return (
            f"checkpoint: the save of {name} was abandoned (interrupted); the newest complete checkpoint is "
            f"{done[0] if done else 'none'}"
        )

    def _agreed(self, part, what: str, staging: Storage) -> None:
        """Run ``part`` on every rank; if it fails anywhere, every rank raises the first failure
        (so no rank waits forever in the next collective) and the half-written save is removed."""
        try:
            part()
            error = None
        except (OSError, RuntimeError, ValueError) as err:  # torch.save reports a full disk as a RuntimeError
            error = failure(what, self.dist.rank, err, self.storage)
        error = comm.first_error(error)
        if error is not None:
            self._fail(error, staging)

    def _fail(
        self, error: str, staging: Storage, *, fix: str = "free space or fix the folder and rerun to resume from it"
    ):
        """Remove this run's unfinished save and raise ``error`` on every rank (rank 0 removes)."""
        if self.dist.is_main:
            staging.remove()
        done = self.candidates()
        newest = done[0] if done else "none"
        raise CheckpointError(f"{error}; the newest complete checkpoint is still {newest} -- {fix}")

    # -- loading ---------------------------------------------------------------------------------
    def load(self, engine, ckpt: Storage, naming: fragments.Naming, coords: dict, sizes: dict) -> dict:
        """Set this rank's fp32 masters, moments and buffers from ``ckpt`` (saved at any layout),
        reading only the slices it holds; derive the module weights; restore the RNG. Returns the
        run state (client_state.json)."""
        client = parse_json(ckpt.read("client_state.json", max_bytes=MAX_JSON_BYTES), f"{ckpt}/client_state.json")
        error = None
        try:
            self._load_tensors(engine, ckpt, client, naming, coords, sizes)
        except CheckpointError as err:
            error = str(err)
        error = comm.first_error(error)
        if error is not None:
            raise CheckpointError(error)
        fragments.refresh_weights(engine)  # collective under ZeRO-1/2 and bf16
        for attr, value in client.get("engine", {}).items():
            setattr(engine, attr, value)
        self.load_rng(ckpt, engine.device)
        return client

    @torch.no_grad()
    def _load_tensors(self, engine, ckpt: Storage, client: dict, naming, coords: dict, sizes: dict) -> None:
        index = ShardIndex(ckpt, read_meta(ckpt))
        kinds: dict[int, dict[str, tuple]] = {}
        if fragments.holder(engine) == "plain":  # a torch optimizer's state per parameter, as saved for it
            for _, name, p in naming.params(engine.module):
                own = index.shape(name, "fp32")
                kinds[id(p)] = {
                    k: tuple(p.shape) if index.shape(name, k) == own else index.shape(name, k)
                    for k in index.kinds(name)
                    if k not in ("fp32", "buffer")
                }
        fragments.init_state(engine, client.get("optimizer", {}), kinds)
        for piece in fragments.pieces(engine, naming, coords, sizes):
            for kind in ["fp32", *piece.moments]:
                buf = torch.empty(piece.numel, dtype=torch.float32)
                index.read(Shard(piece.name, kind, piece.shape, piece.tp, piece.start, piece.numel), buf)
                target = piece.view(kind)
                target.copy_(buf.to(target.device))
            for kind, value in piece.extra.items():
                value.copy_(index.whole(piece.name, kind))
        for _, name, value in naming.buffers(engine.module):
            if index.by_key.get((name, "buffer")):
                value.copy_(index.whole(name, "buffer"))

    def load_rng(self, ckpt: Storage, device) -> None:
        rel = f"rng/rank{self.dist.rank:05d}.json"
        if ckpt.exists(rel):  # absent when resuming on more ranks than saved: keep the seeded RNG
            try:
                set_rng_state(parse_json(ckpt.read(rel, max_bytes=MAX_JSON_BYTES), f"{ckpt}/{rel}"), device)
            except (KeyError, TypeError, ValueError) as err:
                raise CheckpointError(
                    f"checkpoint file {ckpt}/{rel} is corrupt ({type(err).__name__}: {err}); use an earlier checkpoint"
                ) from None


def _kinds(piece) -> list[str]:
    """The fp32 master and every optimizer moment held for this piece in the parameter's shape."""
    return ["fp32", *piece.moments]


def _read_small(location: str) -> bytes:
    """A file of the run (the tokenizer), local or remote, bounded (a local one through its real
    path: the user's own file may be a symlink)."""
    storage = checkpoint_storage(location)
    storage, name = (checkpoint_storage(os.path.realpath(storage.url)) if storage.local else storage).parent_and_name()
    return storage.read(name, max_bytes=MAX_TOKENIZER_BYTES)


def save_id(meta_json: bytes) -> str:
    """A save's identity: the SHA-256 of its commit record (meta.json), which names its parent's."""
    return hashlib.sha256(meta_json).hexdigest()


def _as_json(model_config: Any) -> dict:
    """A model config's fields as its meta.json holds them (tuples as JSON lists)."""
    return json.loads(json.dumps(dataclasses.asdict(model_config)))


def check_resumable(meta: dict, ckpt: Storage, family: str, model_config: Any) -> None:
    """A run resumes only a checkpoint of its own model: the same family (GPT-2 and GPT-1 share
    parameter names and shapes, not the architecture) and the same config but for regularisation
    (``RESUME_MAY_CHANGE``). The saved config is checked as a user's first (``saved_model``), a field
    it predates read as the family's value then (``saved_defaults``)."""
    saved = meta.get("model_family")
    if saved != family:
        raise CheckpointError(
            f"checkpoint {ckpt} was written by a {str(saved)[:40]} model, this run's model.family is "
            f"{family}: its weights would load into another architecture; set model.family="
            f"{str(saved)[:40]} to resume it, or use another train.out_dir for a new run"
        )
    theirs = _as_json(saved_model(meta, ckpt)[0])
    ours = _as_json(model_config)
    differ = [k for k, v in ours.items() if not RESUME_MAY_CHANGE.search(k) and theirs.get(k) != v]
    if differ:
        pairs = ", ".join(f"{k}={theirs.get(k)} (this run: {ours[k]})" for k in differ[:4])
        raise CheckpointError(
            f"checkpoint {ckpt} was written by a {family} model with {pairs}; resume with the model "
            f"config it was saved with, or use another train.out_dir for a new run"
        )
