"""The training loop (``glm train``): reads top to bottom.

setup: process group -> config checks -> checkpoint to resume (validated before anything is
written) -> shards -> model -> DeepSpeed engine -> loader -> restore -> validate -> steps
(validate / checkpoint on intervals) -> validate -> final checkpoint -> loss curve.
"""
from __future__ import annotations

import contextlib
import os
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from glm_dist.config.checks import check_launcher_agrees, model_config, seq_len, validate
from glm_dist.config.loader import ConfigError, to_dict
from glm_dist.config.schema import Config
from glm_dist.data.loader import Loader, validation_batches
from glm_dist.data.workers import WorkerLoader
from glm_dist.data.prepare import ensure_shards
from glm_dist.eval.perplexity import byte_length_table, evaluate
from glm_dist.models.registry import build_model
from glm_dist.objectives.steps import forward_loss
from glm_dist.objectives.registry import options_from_config
from glm_dist.observability.flops import measure_matmul_peak, peak_flops
from glm_dist.observability.plots import plot_loss_curve
from glm_dist.observability.run_logger import RunLogger
from glm_dist.parallel.distributed import DistInfo, all_reduce, init_distributed
from glm_dist.parallel.engine import build_engine, set_lr
from glm_dist.parallel.pipeline import pipeline_inputs
from glm_dist.parallel import universal
from glm_dist.parallel.topology import Topology
from glm_dist.train.checkpoint import CheckpointManager, saved_layout, universal_dir
from glm_dist.train.errors import Preempted, TrainingDiverged
from glm_dist.train.preemption import StopRequest
from glm_dist.train.optim import build_optimizer
from glm_dist.train.schedule import lr_at


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done (applied or skipped)
    tokens: int = 0  # training tokens consumed, all ranks
    skipped_steps: int = 0  # steps skipped for a non-finite loss


class Trainer:
    def __init__(self, cfg: Config, dist: DistInfo | None = None):
        self.cfg, self.dist = cfg, dist or init_distributed()
        validate(cfg, world_size=self.dist.world_size)
        check_launcher_agrees(cfg, dict(os.environ))
        self.ckpts = CheckpointManager(Path(cfg.train.out_dir) / "checkpoints", self.dist)
        self.resume_from = self.ckpts.resolve(cfg.train.resume)  # fails before anything is written
        self.manifest = ensure_shards(cfg.data, self.dist)
        self.model_cfg = model_config(cfg)
        vocab = self.manifest["tokenizer"]["vocab_size"]
        if vocab > self.model_cfg.vocab_size:
            raise ConfigError(f"the tokenizer in {cfg.data.shards_dir} has {vocab} tokens but "
                              f"model.vocab_size is {self.model_cfg.vocab_size}; set model.vocab_size >= {vocab}")
        self.seq_len = seq_len(cfg)
        torch.manual_seed(cfg.train.seed)
        # train.init=local: only this pipeline stage's layers are ever built (parallel/init.py)
        self.local_init = cfg.train.init == "local" and cfg.parallel.pipeline_stages > 1
        with torch.device("meta") if self.local_init else contextlib.nullcontext():
            model = build_model(cfg.model.family, self.model_cfg)
        model.activation_checkpointing = cfg.train.activation_checkpointing
        self.flops_per_token = model.num_flops_per_token(self.seq_len)
        p = cfg.parallel
        self.topo = Topology.for_world(self.dist.world_size, p.pipeline_stages, p.tensor_parallel)
        self.coords = self.topo.coords(self.dist.rank)
        self.pipelined = self.topo.pipeline > 1
        # Resuming on another layout reads the universal checkpoint: the whole model's weights now
        # (stages and tensor slices are cut from them below), the optimizer moments once the
        # engine exists.
        self.universal = self.resume_from is not None and saved_layout(self.resume_from) != self.layout
        if self.universal and not self.local_init:
            universal.load_weights(model, universal_dir(self.resume_from))
        self.mpu, self.naming, self.tensor_group = None, universal.Naming(), None
        if self.pipelined:
            model = self._pipeline(model)
        elif self.topo.tensor > 1:
            model = self._tensor_parallel(model)
        dp_rank, dp_size = self.coords["data"], self.topo.data
        self.optimizer = build_optimizer(model, cfg.train)
        self.engine = build_engine(model, self.optimizer, cfg, dp_size=dp_size, mpu=self.mpu)
        if self.pipelined:
            from glm_dist.parallel.pipeline import NonFiniteGuard

            self.guard = NonFiniteGuard(self.engine, self.optimizer)
        loader_args = dict(objective=cfg.objective.name, options=options_from_config(cfg.objective),
                           seq_len=self.seq_len, micro_batch_size=cfg.train.micro_batch_size,
                           grad_accum_steps=cfg.train.grad_accum_steps, dp_rank=dp_rank,
                           dp_size=dp_size, seed=cfg.train.seed, shuffle_window=cfg.data.shuffle_window)
        self.loader = (WorkerLoader(cfg.data.shards_dir, num_workers=cfg.data.num_workers, **loader_args)
                       if cfg.data.num_workers else Loader(cfg.data.shards_dir, **loader_args))
        self.state = TrainState()
        if self.resume_from is not None:
            (self._restore_universal if self.universal else self._restore)(self.resume_from)
        self.val_batches = validation_batches(cfg.data.shards_dir, seq_len=self.seq_len, objective=cfg.objective.name,
                                              micro_batch_size=cfg.train.micro_batch_size,
                                              num_batches=cfg.train.eval_batches, dp_rank=dp_rank,
                                              dp_size=dp_size)
        tok = Tokenizer.from_file(f"{cfg.data.shards_dir}/{self.manifest['tokenizer']['file']}")
        self.byte_lengths = byte_length_table(tok, self.model_cfg.vocab_size)
        self.autocast = (torch.autocast(self.engine.device.type, dtype=torch.bfloat16)
                         if cfg.train.precision == "bf16-autocast" else contextlib.nullcontext())
        self.log = RunLogger(cfg, is_main=self.dist.is_main, start_step=self.state.step,
                             attachments={"data_manifest.json": self.manifest})
        self.stop = StopRequest(cfg.train.stop_signals)
        # MFU's denominator: a known GPU's datasheet peak, else this process's measured matmul peak.
        self.peak_flops = peak_flops() or (measure_matmul_peak(
            torch.float32 if cfg.train.precision == "fp32" else torch.bfloat16, seconds=0.5) if self.dist.is_main else None)

    @property
    def layout(self) -> dict:
        return {"data": self.topo.data, "pipeline": self.topo.pipeline, "tensor": self.topo.tensor,
                "zero_stage": self.cfg.parallel.zero_stage}

    def _tensor_parallel(self, model):
        """Attention heads and FFN width split over the tensor-parallel group (no pipeline)."""
        from glm_dist.parallel.tensor import ParallelGroups, mark_for_grad_norm, shard_model

        self.mpu = ParallelGroups(self.topo, self.dist.rank)
        self.tensor_group = self.mpu.get_model_parallel_group()
        shard_model(model, self.coords["tensor"], self.topo.tensor, self.tensor_group)
        mark_for_grad_norm(model, self.coords["tensor"])
        return model

    def _pipeline(self, model):
        """The model cut into ``parallel.pipeline_stages`` DeepSpeed pipeline stages (each split
        over ``parallel.tensor_parallel`` ranks when that is > 1)."""
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        from glm_dist.parallel import pipeline
        from glm_dist.parallel.tensor import shard_model

        cfg, n_layer = self.cfg, self.model_cfg.n_layer
        topology = PipeModelDataParallelTopology(num_pp=self.topo.pipeline, num_mp=self.topo.tensor, num_dp=self.topo.data)
        build, rename = {"gpt": (pipeline.gpt_pipeline, pipeline._source_name),
                         **{f: (pipeline.encoder_pipeline, pipeline.encoder_source_name)
                            for f in pipeline.PIPELINE_ENCODERS}}[cfg.model.family]
        try:
            pipe = build(model, stages=self.topo.pipeline, topology=topology, partition=cfg.parallel.pipeline_partition,
                         checkpoint_interval=1 if cfg.train.activation_checkpointing else 0,
                         local_seed=cfg.train.seed if self.local_init else None)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if self.universal and self.local_init:  # the stage's weights from the universal checkpoint
            universal.load_stage(pipe, universal_dir(self.resume_from), lambda key: rename(key, n_layer))
        if self.topo.tensor > 1:
            self.tensor_group = pipe._grid.get_slice_parallel_group()
            shard_model(pipe, self.coords["tensor"], self.topo.tensor, self.tensor_group)
        pipeline.mark_for_grad_norm(pipe, tensor_rank=self.coords["tensor"])
        self.naming = universal.Naming(rename=lambda key: rename(key, n_layer),
                                       owned=lambda key: not key.startswith("tied_modules.") or pipe.stage_id == 0)
        return pipe

    # -- the loop -------------------------------------------------------------------------
    def fit(self) -> dict:
        t, start = self.cfg.train, self.state.step
        self.log.message(f"model: {self.cfg.model.family}/{self.cfg.model.flavor}, "
                         f"{sum(p.numel() for p in self.engine.module.parameters()):,} parameters; "
                         f"world size {self.dist.world_size}, ZeRO-{self.cfg.parallel.zero_stage}, {t.precision}"
                         + (f"; {self.topo.describe()}" if self.topo.world_size > self.topo.data else "")
                         + (f"; resumed from {self.resume_from} at step {start}" if self.resume_from else "")
                         + (f" (universal checkpoint saved at {saved_layout(self.resume_from)})" if self.universal else ""))
        before = self.validate()
        end = min(t.max_steps, t.stop_at_step or t.max_steps)
        while self.state.step < end:
            self.train_step()
            step = self.state.step
            if t.eval_interval and step % t.eval_interval == 0 and step < end:
                self.validate()
            if t.save_interval and step % t.save_interval == 0 and step < end:
                self.save()
            if self.stop.agreed() and step < end:
                self._preempt()
        after = self.validate()
        if self.state.step > start or self.resume_from is None:
            self.save()
        self._write_memory()
        summary = {"val_loss_before": before["loss"], "val_perplexity_before": before["perplexity"],
                   "val_loss": after["loss"], "val_perplexity": after["perplexity"],
                   **{f"val_{k}": v for k, v in after.items() if k not in ("loss", "perplexity", "tokens")},
                   **asdict(self.state)}
        self.log.message(f"validation perplexity: {before['perplexity']:.2f} before -> "
                         f"{after['perplexity']:.2f} after {self.state.step} steps"
                         + ("" if self.state.step >= t.max_steps else
                            f" (stopped at train.stop_at_step; rerun to continue to {t.max_steps})"))
        if self.dist.is_main and t.plot:
            png = plot_loss_curve(self.log.metrics_file, Path(t.out_dir) / "loss_curve.png",
                                  title=f"{self.cfg.model.flavor} ({self.cfg.objective.name})")
            self.log.message(f"loss curve: {png}")
        self.log.close(summary)
        return summary

    def train_step(self) -> None:
        """One optimizer step over ``grad_accum_steps`` micro batches on every rank."""
        t0 = time.perf_counter()
        step = self.state.step
        set_lr(self.engine, lr_at(step, self.cfg.train))
        if self.pipelined:  # DeepSpeed runs the micro batches through the stages (1F1B) and steps
            dev = self.engine.device
            batches = [pipeline_inputs(self.cfg.objective.name, b, dev) for b in self.loader.next_step()]
            mean_loss = float(self.engine.train_batch(iter(batches)))  # the mean over all micro batches and replicas
            self.state.step += 1
            self.state.tokens += self.loader.global_batch_size * self.seq_len
            if self.guard.skipped:
                self._count_skip(mean_loss)
            self._log_step(mean_loss, time.perf_counter() - t0)
            return
        losses, bad = [], False
        for batch in self.loader.next_step():
            with self.autocast:
                loss, _ = forward_loss(self.cfg.objective.name, self.engine, batch, self.engine.device)
            # Every rank must agree that the step is bad, or their weights diverge.
            bad = bad or all_reduce([float(not torch.isfinite(loss))], "max")[0] > 0
            self.engine.backward(loss)
            losses.append(loss.item())
            self.optimizer.skip_next = bad  # read by the optimizer step at the accumulation boundary
            self.engine.step()
        self.optimizer.skip_next = False
        self.state.step += 1
        self.state.tokens += self.loader.global_batch_size * self.seq_len
        mean_loss = all_reduce([sum(losses) / len(losses)])[0] / self.dist.world_size
        if bad:
            self._count_skip(mean_loss)
        self._log_step(mean_loss, time.perf_counter() - t0)

    def _write_memory(self) -> None:
        """This rank's measured model-state bytes (``glm plan`` predicts them; tests compare)."""
        from glm_dist.parallel.memory import rank_model_states

        path = Path(self.cfg.train.out_dir) / f"model_states_rank{self.dist.rank}.json"
        path.write_text(json.dumps({"rank": self.dist.rank, "world_size": self.dist.world_size,
                                    "zero_stage": self.cfg.parallel.zero_stage, **rank_model_states(self.engine)}))

    def _preempt(self) -> None:
        """Checkpoint and leave with ``Preempted`` (exit code 75: requeue me)."""
        path = self.save()
        self.log.message(f"stop signal ({self.stop.received or 'on another rank'}) at step {self.state.step}: "
                         f"checkpoint {path} written; exiting with code {Preempted.exit_code} so the job is requeued")
        self.log.close()
        raise Preempted(f"stopped by a signal at step {self.state.step}; resume from {path}")

    def _count_skip(self, loss: float) -> None:
        self.state.skipped_steps += 1
        limit = self.cfg.train.max_skipped_steps
        self.log.message(f"step {self.state.step}: non-finite loss ({loss}); step skipped "
                         f"({self.state.skipped_steps} of at most {limit})")
        if self.state.skipped_steps > limit:
            self.log.close()
            raise TrainingDiverged(
                f"{self.state.skipped_steps} steps had a non-finite loss (train.max_skipped_steps={limit}); "
                f"stopping without saving. The last good checkpoint is untouched under {self.ckpts.root}; "
                f"lower train.lr, check the data, or raise train.max_skipped_steps")

    def _log_step(self, loss: float, seconds: float) -> None:
        tokens_per_s = self.loader.global_batch_size * self.seq_len / seconds
        grad_norm = self.engine.get_global_grad_norm()
        metrics = {"loss": loss, "lr": lr_at(self.state.step - 1, self.cfg.train),
                   "grad_norm": float(grad_norm) if grad_norm is not None else None,
                   "tokens_per_s": tokens_per_s, "tokens": self.state.tokens,
                   "epoch": self.loader.epoch, "skipped_steps": self.state.skipped_steps}
        if self.peak_flops:
            metrics["mfu"] = self.flops_per_token * tokens_per_s / (self.peak_flops * self.dist.world_size)
        self.log.train_step(self.state.step, metrics)

    def validate(self) -> dict:
        if self.pipelined:
            from glm_dist.parallel.pipeline import pipeline_validate

            metrics = pipeline_validate(self.engine, self.val_batches, self.byte_lengths, self.cfg.objective.name)
            metrics["tokens"] //= self.topo.pipeline * self.topo.tensor
            self.log.validation(self.state.step, metrics)
            return metrics
        self.engine.eval()
        with self.autocast:
            metrics = evaluate(self.engine, self.val_batches, byte_lengths=self.byte_lengths,
                               device=self.engine.device, objective=self.cfg.objective.name)
        metrics["tokens"] //= self.topo.tensor  # tensor ranks of a replica evaluate the same batches
        self.engine.train()
        self.log.validation(self.state.step, metrics)
        return metrics

    # -- state ----------------------------------------------------------------------------
    def save(self) -> Path:
        client = {"train_state": asdict(self.state), "data": self.loader.state_dict()}
        meta = {"config": to_dict(self.cfg), "zero_stage": self.cfg.parallel.zero_stage, "layout": self.layout,
                "world_size": self.dist.world_size, "model_family": self.cfg.model.family,
                "model_config": asdict(self.model_cfg), "tokenizer_sha256": self.manifest["tokenizer"]["sha256"],
                "shards_dir": str(Path(self.cfg.data.shards_dir).resolve())}
        tokenizer = Path(self.cfg.data.shards_dir) / self.manifest["tokenizer"]["file"]
        writer = self.coords["data"] == 0 and self.coords["tensor"] == 0  # one rank per pipeline stage
        also = (lambda tmp: universal.save(self.engine, tmp / universal.DIR, self.naming, writer=writer,
                                           tensor_group=self.tensor_group, tensor_size=self.topo.tensor,
                                           client_state=client if self.dist.is_main else None)
                ) if self.cfg.train.universal_checkpoint else None
        path = self.ckpts.save(self.engine, self.state.step, client, meta,
                               extra_files={"tokenizer.json": tokenizer}, also=also)
        self.ckpts.rotate(keep_last=self.cfg.train.keep_last, keep_every=self.cfg.train.keep_every)
        self.log.message(f"checkpoint: {path}")
        return path

    def _restore_universal(self, path: Path) -> None:
        """Optimizer moments and the run's position from a checkpoint saved on another layout."""
        universal.load_optimizer(self.engine, universal_dir(path), self.naming, tensor_rank=self.coords["tensor"],
                                 tensor_size=self.topo.tensor)
        client = torch.load(universal_dir(path) / "client_state.pt", weights_only=False)
        self.state = TrainState(**client["train_state"])
        self.loader.load_state_dict(client["data"])

    def _restore(self, path: Path) -> None:
        client = self.ckpts.load(self.engine, path)
        self.state = TrainState(**client["train_state"])
        self.loader.load_state_dict(client["data"])


def train(cfg: Config) -> dict:
    return Trainer(cfg).fit()


def read_metrics(out_dir: str | Path, kind: str = "train") -> list[dict]:
    """Rows of ``metrics.jsonl`` of one kind (``train`` or ``val``)."""
    lines = (Path(out_dir) / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["kind"] == kind]

