"""The training loop (``glm train``): reads top to bottom.

setup: process group -> config checks -> checkpoint to resume (validated before anything is
written) -> shards -> model -> DeepSpeed engine -> loader -> restore -> validate -> steps
(validate / checkpoint on intervals) -> validate -> final checkpoint -> loss curve.
"""

from __future__ import annotations

import contextlib
import os
import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from glm_dist.config.checks import check_launcher_agrees, model_config, seq_len, validate
from glm_dist.config.loader import ConfigError, source_of, to_dict
from glm_dist.config.schema import Config
from glm_dist.config.deepspeed_json import deepspeed_config
from glm_dist.data.loader import Loader, read_tokenizer, validation_batches
from glm_dist.data.shared import TensorShared
from glm_dist.data.workers import WorkerLoader
from glm_dist.data.mixture import run_mixture
from glm_dist.data.prepare import ensure_shards, run_shards_dir
from glm_dist.eval.perplexity import byte_length_table, evaluate, evaluate_sources
from glm_dist.models.common import count_parameters
from glm_dist.families.registry import build_model, family, resolve
from glm_dist.objectives.base import to_device
from glm_dist.objectives.registry import get_objective, options_from_config
from glm_dist.observability.device_memory import device_memory
from glm_dist.observability.flops import mfu_peak
from glm_dist.ops.cross_entropy import row_groups, vocab_split
from glm_dist.observability.plots import plot_loss_curve
from glm_dist.observability.run_logger import RunLogger
from glm_dist.checkpoint.consolidate import saved_layout
from glm_dist.checkpoint.files import CheckpointError, read_meta
from glm_dist.checkpoint.writer import RankFiles
from glm_dist.observability.redact import redact
from glm_dist.parallel import comm
from glm_dist.parallel.compile import compile_model
from glm_dist.parallel.distributed import DistInfo, init_distributed
from glm_dist.parallel.engine import build_engine, set_lr
from glm_dist.parallel import fragments, pipeline
from glm_dist.parallel.init import init_whole, partitioned_build
from glm_dist.parallel.memory import rank_model_states
from glm_dist.parallel.pipeline import NonFiniteGuard, pipeline_validate
from glm_dist.parallel.tensor import ParallelGroups, mark_for_grad_norm, model_vocab_split, shard_model
from glm_dist.parallel.topology import Topology
from glm_dist.train.checkpoint import CheckpointManager
from glm_dist.train.streams import StreamMemory
from glm_dist.train.errors import CollectiveTimeout, PeerGone, Preempted, TrainingDiverged
from glm_dist.train.preemption import SETTLE_S, StopRequest
from glm_dist.train.optim import build_optimizer
from glm_dist.train.layer_groups import discriminative_param_groups, layer_groups
from glm_dist.train.pretrained import check_same_tokenizer, load_pretrained
from glm_dist.train.schedule import lr_at


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done (applied or skipped)
    tokens: int = 0  # training tokens consumed, all ranks
    skipped_steps: int = 0  # steps skipped for a non-finite loss


def allow_tf32(device: torch.device, precision: str) -> bool:
    """fp32 runs on a GPU do their matmuls and convolutions as TF32 on the tensor cores (Megatron's
    default; ~8x the fp32 rate, 10-bit mantissa inputs, fp32 accumulation). Returns whether it did."""
    if torch.device(device).type != "cuda" or precision != "fp32":
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


class Trainer:
    def __init__(self, cfg: Config, dist: DistInfo | None = None):
        self.cfg, self.dist = cfg, dist or init_distributed(timeout_s=cfg.parallel.collective_timeout_s)
        validate(cfg, world_size=self.dist.world_size)
        check_launcher_agrees(cfg, dict(os.environ))
        self.ckpts = CheckpointManager(
            cfg.train.checkpoint_dir or Path(cfg.train.out_dir) / "checkpoints",
            self.dist,
            keep_last=cfg.train.keep_last,
            keep_every=cfg.train.keep_every,
        )
        # fails before anything is written (a checkpoint that does not verify, a stale lineage, another model)
        self.resume_from = self.ckpts.resolve(
            cfg.train.resume,
            overwrite=cfg.train.resume_overwrite,
            family=cfg.model.family,
            model_config=model_config(cfg),
        )
        self.resume_meta = read_meta(self.resume_from) if self.resume_from else None
        self.manifest = ensure_shards(cfg.data, self.dist)
        self.shards_dir = run_shards_dir(cfg.data)  # data.shards_dir, or a mixture's first source: the tokenizer's
        if self.resume_from is not None:  # same shapes, other tokens: the weights would go on meaning the old ones
            check_same_tokenizer(
                str(self.resume_from),
                self.resume_meta,
                self.manifest["tokenizer"]["sha256"],
                key=f"train.resume={cfg.train.resume}"
                + (f" ({self.resume_from})" if cfg.train.resume != str(self.resume_from) else ""),
            )
        self.model_cfg = model_config(cfg)
        vocab = self.manifest["tokenizer"]["vocab_size"]
        if vocab > self.model_cfg.vocab_size:
            raise ConfigError(
                f"the tokenizer in {self.shards_dir} has {vocab} tokens but "
                f"model.vocab_size is {self.model_cfg.vocab_size}; set model.vocab_size >= {vocab}"
            )
        self.seq_len = seq_len(cfg)
        self.objective = get_objective(cfg.objective.name)
        torch.manual_seed(cfg.train.seed)
        # train.init=local: only this pipeline stage's layers are ever built; unpipelined, each
        # parameter drawn by its own seeded rule, and under ZeRO-3 built partitioned (parallel/init.py)
        self.local_init = cfg.train.init == "local" and cfg.parallel.pipeline_stages > 1
        model = self._build_model()
        model.activation_checkpointing = cfg.train.activation_checkpointing
        prepare = family(cfg.model.family).prepare  # inputs read from the data set, never trained (CoVe's GloVe)
        if prepare and not self.local_init:
            resolve(prepare)(model, self.manifest, cfg.data.shards_dir)
        if cfg.train.init_from and self.resume_from is None:  # a new run from pretrained weights (ULMFiT's stage 2)
            load_pretrained(
                model,
                cfg.train.init_from,
                family=cfg.model.family,
                tokenizer_sha256=self.manifest["tokenizer"]["sha256"],
            )
        self.flops_per_token = model.num_flops_per_token(self.seq_len)
        p = cfg.parallel
        self.topo = Topology.for_world(self.dist.world_size, p.pipeline_stages, p.tensor_parallel)
        self.coords = self.topo.coords(self.dist.rank)
        self.pipelined = self.topo.pipeline > 1
        # A checkpoint of any layout is read once the engine exists: each rank reads the slices of
        # the fp32 masters and moments it holds (train/checkpoint.py).
        self.resharded = self.resume_from is not None and saved_layout(self.resume_meta) != self.layout
        self.mpu, self.naming, self.tensor_group = None, fragments.Naming(), None
        self.vocab_split = None  # this rank's vocabulary columns: losses are computed under it
        if self.pipelined:
            model = self._pipeline(model)
        elif self.topo.tensor > 1:
            model = self._tensor_parallel(model)
        t = cfg.train
        if t.compile:  # each transformer block or the whole model, compiled in place (parallel/compile.py)
            compile_model(model, scope=t.compile, backend=t.compile_backend, mode=t.compile_mode)
        dp_rank, dp_size = self.coords["data"], self.topo.data
        groups = None  # discriminative fine-tuning: one rate per layer group (train/layer_groups.py)
        if cfg.train.discriminative_lr:
            groups = discriminative_param_groups(
                layer_groups(model), factor=cfg.train.discriminative_lr, weight_decay=cfg.train.weight_decay
            )
        self.optimizer = build_optimizer(model, cfg.train, groups)
        self.engine = build_engine(model, self.optimizer, cfg, dp_size=dp_size, mpu=self.mpu)
        if self.pipelined:
            self.guard = NonFiniteGuard(self.engine, self.optimizer, stop=lambda: self.stop.received is not None)
        # Transformer-XL memory: the batch becomes parallel streams, each with its memory (train/streams.py)
        self.memory = StreamMemory() if family(cfg.model.family).streams(self.model_cfg) else None
        global_batch = cfg.train.micro_batch_size * cfg.train.grad_accum_steps * dp_size
        self.mixture = run_mixture(
            cfg.data,
            samples=cfg.train.max_steps * global_batch,
            seq_len=self.seq_len,
            own_loader=self.objective.loader is not None,
            where=source_of(cfg, "data.mixture"),
        )
        data = self.mixture or cfg.data.shards_dir  # what the loaders read: the mixture's sources or one shard set
        self._source_sums = [[0.0, 0.0] for _ in (self.mixture.names if self.mixture else ())]  # _source_losses
        loader_args = dict(
            objective=cfg.objective.name,
            options=options_from_config(cfg.objective, self.model_cfg),
            streams=self.memory is not None,
            seq_len=self.seq_len,
            micro_batch_size=cfg.train.micro_batch_size,
            grad_accum_steps=cfg.train.grad_accum_steps,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=cfg.train.seed,
            shuffle_window=cfg.data.shuffle_window,
            cache_dir=cfg.data.cache_dir,
            read_gap_bytes=cfg.data.read_gap_bytes,
            read_retries=cfg.data.read_retries,
            read_backoff_s=cfg.data.read_backoff_s,
            # a middle pipeline stage takes no batch from the loader: it reads nothing
            reads=not self.pipelined or self.coords["pipeline"] in (0, self.topo.pipeline - 1),
        )
        # the tensor ranks of a replica share one read: tensor rank 0's, broadcast (data/shared.py)
        shared = self.topo.tensor > 1 and loader_args["reads"]
        if shared and self.coords["tensor"] > 0:
            self.loader = Loader(data, **{**loader_args, "reads": False})
        elif self.objective.loader:  # an objective's own batch schedule (CVT: data/alternating.py)
            self.loader = resolve(self.objective.loader)(data, num_workers=cfg.data.num_workers, **loader_args)
        else:
            self.loader = (
                WorkerLoader(data, num_workers=cfg.data.num_workers, **loader_args)
                if cfg.data.num_workers
                else Loader(data, **loader_args)
            )
        if shared:
            self.loader = TensorShared(self.loader, self.tensor_group, lead=self.coords["tensor"] == 0)
        self.state = TrainState()
        if self.resume_from is not None:
            self._restore(self.resume_from)
        self.val_batches = validation_batches(
            data,
            seq_len=self.seq_len,
            objective=cfg.objective.name,
            options=loader_args["options"],
            micro_batch_size=cfg.train.micro_batch_size,
            num_batches=cfg.train.eval_batches,
            dp_rank=dp_rank,
            dp_size=dp_size,
        )
        tok = read_tokenizer(self.shards_dir, self.manifest)
        self.byte_lengths = byte_length_table(tok, self.model_cfg.vocab_size)
        self.autocast = (
            torch.autocast(self.engine.device.type, dtype=torch.bfloat16)
            if cfg.train.precision == "bf16-autocast"
            else contextlib.nullcontext()
        )
        self.log = RunLogger(
            cfg,
            is_main=self.dist.is_main,
            start_step=self.state.step,
            attachments={"data_manifest.json": self.manifest},
        )
        self.tasks = None  # in-loop lm-eval tasks (eval/in_loop.py); lm-eval is imported only when asked for
        if cfg.eval.tasks:
            from glm_dist.eval.in_loop import in_loop_eval  # lazy: lm-eval is an optional extra

            self.tasks = in_loop_eval(cfg, self.engine.module, tok, dp_rank, dp_size)
        self.stop = StopRequest(cfg.train.stop_signals)
        self.stop_agreed = False  # set by each step's all-reduce
        self._pending: tuple | None = None  # the last step's metrics row, written at the next sync
        allow_tf32(self.engine.device, cfg.train.precision)
        # MFU's denominator: a known GPU's datasheet peak, else the matmul peak measured on the run's device
        self.peak_flops = mfu_peak(self.engine.device, cfg.train.precision, measure=self.dist.is_main)

    @property
    def layout(self) -> dict:
        return {
            "data": self.topo.data,
            "pipeline": self.topo.pipeline,
            "tensor": self.topo.tensor,
            "zero_stage": self.cfg.parallel.zero_stage,
        }

    def _tensor_parallel(self, model):
        """Attention heads and FFN width split over the tensor-parallel group (no pipeline); the
        vocabulary too, and the sequence, where the config and the family ask for it."""
        self.mpu = ParallelGroups(self.topo, self.dist.rank)
        self.tensor_group = self.mpu.get_model_parallel_group()
        shard_model(
            model,
            self.coords["tensor"],
            self.topo.tensor,
            self.tensor_group,
            **self._plans,
            sequence=self.cfg.parallel.sequence_parallel,
        )
        self.vocab_split = model_vocab_split(model)
        mark_for_grad_norm(model, self.coords["tensor"])
        return model

    @property
    def _plans(self) -> dict:
        """``shard_model``'s plans: the family's tensor plans, and its vocabulary plans where the config and
        the family split the vocabulary."""
        spec = family(self.cfg.model.family)
        vocab = self.cfg.parallel.vocab_parallel and spec.vocab_parallel
        return {"plans": spec.tensor_plans, "vocab_plans": spec.vocab_plans if vocab else None}

    def _stage_loss(self, logits, labels):
        """A pipeline's last stage: the objective's loss, on this rank's vocabulary columns."""
        with vocab_split(self.vocab_split):
            return self.objective.stage_loss(logits, labels)

    def _build_model(self):
        cfg = self.cfg
        if cfg.train.init != "local" or cfg.parallel.pipeline_stages > 1:
            with torch.device("meta") if self.local_init else contextlib.nullcontext():
                return build_model(cfg.model.family, self.model_cfg)
        rule = dict(std=family(cfg.model.family).init_std(self.model_cfg), seed=cfg.train.seed)
        if cfg.parallel.zero_stage == 3:  # parameters partitioned as they are made (deepspeed.zero.Init)
            dp = self.dist.world_size // cfg.parallel.tensor_parallel
            return partitioned_build(
                lambda: build_model(cfg.model.family, self.model_cfg), deepspeed_config(cfg, dp_size=dp), **rule
            )
        model = build_model(cfg.model.family, self.model_cfg)
        init_whole(model, **rule)
        return model

    def _pipeline(self, model):
        """The model cut into ``parallel.pipeline_stages`` DeepSpeed pipeline stages (each split
        over ``parallel.tensor_parallel`` ranks when that is > 1)."""
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        cfg, n_layer = self.cfg, self.model_cfg.n_layer
        topology = PipeModelDataParallelTopology(
            num_pp=self.topo.pipeline, num_mp=self.topo.tensor, num_dp=self.topo.data
        )
        spec = family(cfg.model.family).pipeline
        build, rename = resolve(spec.build), resolve(spec.rename)
        try:
            pipe = build(
                model,
                stages=self.topo.pipeline,
                loss_fn=self._stage_loss,
                topology=topology,
                partition=cfg.parallel.pipeline_partition,
                checkpoint_interval=1 if cfg.train.activation_checkpointing else 0,
                local_seed=cfg.train.seed if self.local_init else None,
            )
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if self.topo.tensor > 1:
            self.tensor_group = pipe._grid.get_slice_parallel_group()
            shard_model(pipe, self.coords["tensor"], self.topo.tensor, self.tensor_group, **self._plans)
            self.vocab_split = model_vocab_split(pipe)
        pipeline.mark_for_grad_norm(pipe, tensor_rank=self.coords["tensor"])
        # the tied embedding's copies on the first and the last stage each write half of it
        self.naming = fragments.Naming(
            rename=lambda key: rename(key, n_layer), tied=fragments.pipeline_tied(pipe, self.dist.rank)
        )
        return pipe

    # -- the loop -------------------------------------------------------------------------
    def fit(self) -> dict:
        t, start = self.cfg.train, self.state.step
        self.log.message(
            f"model: {self.cfg.model.family}/{self.cfg.model.flavor}, "
            f"{count_parameters(self.engine.module):,} parameters; "
            f"world size {self.dist.world_size}, ZeRO-{self.cfg.parallel.zero_stage}, {t.precision}"
            + (f"; {self.topo.describe()}" if self.topo.world_size > self.topo.data else "")
            + (f"; resumed from {self.resume_from} at step {start}" if self.resume_from else "")
            + (f" (saved at {saved_layout(self.resume_meta)}: resharded)" if self.resharded else "")
            + self._batch_change()
        )
        try:
            before = self.validate()
            end = min(t.max_steps, t.stop_at_step or t.max_steps)
            while self.state.step < end:
                self.train_step()
                step = self.state.step
                if t.eval_interval and step % t.eval_interval == 0 and step < end:
                    self.validate()
                if self.tasks and self.tasks.due(step):  # between steps: no step's tokens/s includes it
                    self.log.tasks(step, self.tasks.run(self.engine.module, step))
                if t.save_interval and step % t.save_interval == 0 and step < end:
                    self.save()
                if self.stop_agreed and step < end:
                    self._preempt()
            after = self.validate()
            if self.state.step > start or self.resume_from is None:
                self.save()
        except RuntimeError as err:
            if comm.is_timeout(err):
                raise self._timed_out(err) from None
            if comm.is_peer_gone(err):
                self.log.close()
                said = re.sub(r"^\[[^\]]*\]\s*", "", str(err).splitlines()[0])[:160]  # gloo's [file.cc:line]
                raise PeerGone(
                    f"step {self.state.step + 1}: another rank's process is gone ({said}) -- "
                    f"its log says why (killed, out of memory, crashed); the last complete checkpoint under "
                    f"{self.ckpts.root} is untouched: rerun to resume from it"
                ) from None
            raise
        except KeyboardInterrupt:  # Ctrl-C: the save in flight finishes or is removed, never left half-written
            self._settle_on_interrupt()
            raise
        self._write_memory()
        summary = {
            **{f"val_{k}_before": before[k] for k in ("loss", "perplexity") if k in before},
            **{f"val_{k}": v for k, v in after.items() if k.split("/")[0] != "tokens"},
            **asdict(self.state),
        }
        metric = "perplexity" if "perplexity" in after else "loss"  # GloVe's loss is no likelihood
        digits = 2 if metric == "perplexity" else 4
        self.log.message(
            f"validation {metric}: {before[metric]:.{digits}f} before -> "
            f"{after[metric]:.{digits}f} after {self.state.step} steps"
            + (
                ""
                if self.state.step >= t.max_steps
                else f" (stopped at train.stop_at_step; rerun to continue to {t.max_steps})"
            )
        )
        if self.dist.is_main and t.plot:
            png = plot_loss_curve(
                self.log.metrics_file,
                Path(t.out_dir) / "loss_curve.png",
                title=f"{self.cfg.model.flavor} ({self.cfg.objective.name})",
            )
            self.log.message(f"loss curve: {png}")
        self.log.close(summary)
        return summary

    def _batch_change(self) -> str:
        """What the log says when a resume trains with another global batch than the checkpoint's (allowed:
        the schedule goes on by step, the data by sequence), so a changed curve has its reason in the log."""
        if self.resume_meta is None:
            return ""
        saved = self.resume_meta["config"]["train"]
        before = saved["micro_batch_size"] * saved["grad_accum_steps"] * saved_layout(self.resume_meta)["data"]
        t = self.cfg.train
        now = t.micro_batch_size * t.grad_accum_steps * self.topo.data
        return (
            f"; global batch {before} -> {now} sequences (micro batch x accumulation x data-parallel size): the "
            f"schedule goes on by step, the data by sequence"
            if before != now
            else ""
        )

    def _settle_on_interrupt(self) -> None:
        if self.ckpts.pending is not None:
            self.log.message(
                f"interrupted: waiting up to {SETTLE_S:g} s for the checkpoint in flight (Ctrl-C again: abandon it)"
            )
        outcome = self.ckpts.settle()
        if outcome is not None:
            self.log.message(outcome)
        self.log.close()

    def _timed_out(self, err: RuntimeError) -> CollectiveTimeout:
        """A collective some rank never joined: name the missing ranks (rank 0 asks them all)."""
        missing = comm.diagnose_timeout()
        limit = self.cfg.parallel.collective_timeout_s
        who = (
            f"rank(s) {', '.join(map(str, missing))} did not reach it"
            if missing
            else "rank 0 names the missing ranks"
            if missing is None
            else "every rank answers now"
        )
        self.log.close()
        return CollectiveTimeout(
            f"step {self.state.step + 1}: a collective timed out after {limit:g} s "
            f"(parallel.collective_timeout_s); {who} -- a hung or dead process: look at its "
            f"log, or its stack with py-spy dump --pid; the last complete checkpoint under "
            f"{self.ckpts.root} is untouched"
        )

    def train_step(self) -> None:
        """One optimizer step over ``grad_accum_steps`` micro batches on every rank, with one
        all-reduce and one host sync: the loss, the bad-step flag and the stop flag, agreed just
        before the optimizer steps (DeepSpeed steps it at the last micro batch)."""
        t0 = time.perf_counter()
        set_lr(self.engine, lr_at(self.state.step, self.cfg.train))
        if self.pipelined:  # DeepSpeed runs the micro batches through the stages (1F1B) and steps
            dev = self.engine.device
            batches = [self.objective.stage_inputs(b, dev) for b in self.loader.next_step()]
            mean_loss = float(self.engine.train_batch(iter(batches)))  # the mean over all micro batches and replicas
            self.stop_agreed, skipped = self.guard.stop_requested, self.guard.skipped
        else:
            mean_loss, skipped = self._accumulate_and_step(self.loader.next_step())
        self.state.step += 1
        self.state.tokens += self.loader.global_batch_size * self.seq_len
        if skipped:
            self._count_skip(mean_loss)
        self._log_step(mean_loss, time.perf_counter() - t0)

    def _accumulate_and_step(self, batches: list[dict]) -> tuple[float, bool]:
        dev = self.engine.device
        stats = torch.zeros(3, dtype=torch.float64, device=dev)  # [loss sum, non-finite losses, stop]
        per_source = None  # a mixture's (sources, 2) [NLL sum, tokens]: reduced in the same all-reduce
        for i, batch in enumerate(batches):
            rows = batch.pop("rows", None)
            batch = to_device(batch, dev)
            if self.memory is not None:
                batch["mems"] = self.memory.take(rows, dev)
            groups = (
                row_groups(batch.pop("source"), len(self.mixture.names))
                if self.mixture is not None
                else contextlib.nullcontext()
            )
            with self.autocast, vocab_split(self.vocab_split), groups as sums_by_source:
                loss, sums = self.objective.loss(self.engine, batch, metrics=False)
            if self.memory is not None:
                self.memory.put(rows, sums["mems"])
            if sums_by_source is not None:
                per_source = sums_by_source if per_source is None else per_source + sums_by_source
            stats[0] += loss.detach().double()
            stats[1] += (~torch.isfinite(loss.detach())).double()
            self.engine.backward(loss)
            if i == len(batches) - 1:  # every rank agrees, or their weights diverge
                stats[2] = float(self.stop.received is not None)
                pending = self._pending[2] if self._pending else None  # the previous step's grad norm
                extra = [pending.detach().reshape(1).to(stats)] if torch.is_tensor(pending) else []
                reduced = comm.all_reduce_(stats if per_source is None else torch.cat([stats, per_source.flatten()]))
                loss_sum, bad, stop, *rest = torch.cat([reduced, *extra]).tolist()  # the one host sync
                if per_source is not None:
                    self._add_source_sums(rest[: per_source.numel()])
                    rest = rest[per_source.numel() :]
                self._flush_log(*rest)  # the previous step's row, its grad norm read in the same sync
                self.optimizer.skip_next = bad > 0  # read by the optimizer step at the boundary
            self.engine.step()
        self.optimizer.skip_next = False
        self.stop_agreed = stop > 0
        return loss_sum / (len(batches) * self.dist.world_size), bad > 0

    def _add_source_sums(self, flat: list[float]) -> None:
        """A step's all-reduced per-source [NLL sum, tokens], added to those since the last log line."""
        for sums, nll, tokens in zip(self._source_sums, flat[0::2], flat[1::2]):
            sums[0] += nll
            sums[1] += tokens

    def _write_memory(self) -> None:
        """This rank's measured model-state bytes (``glm plan`` predicts them; tests compare)."""
        path = Path(self.cfg.train.out_dir) / f"model_states_rank{self.dist.rank}.json"
        path.write_text(
            json.dumps(
                {
                    "rank": self.dist.rank,
                    "world_size": self.dist.world_size,
                    "zero_stage": self.cfg.parallel.zero_stage,
                    **rank_model_states(self.engine),
                }
            )
        )

    def _preempt(self) -> None:
        """Checkpoint and leave with ``Preempted`` (exit code 75: requeue me)."""
        path = self.save()
        self.log.message(
            f"stop signal ({self.stop.received or 'on another rank'}) at step {self.state.step}: "
            f"checkpoint {path} written; exiting with code {Preempted.exit_code} so the job is requeued"
        )
        self.log.close()
        raise Preempted(f"stopped by a signal at step {self.state.step}; resume from {path}")

    def _count_skip(self, loss: float) -> None:
        self.state.skipped_steps += 1
        limit = self.cfg.train.max_skipped_steps
        self.log.message(
            f"step {self.state.step}: non-finite loss ({loss}); step skipped "
            f"({self.state.skipped_steps} of at most {limit})"
        )
        if self.state.skipped_steps > limit:
            self._flush_log()
            self.log.close()
            raise TrainingDiverged(
                f"{self.state.skipped_steps} steps had a non-finite loss (train.max_skipped_steps={limit}); "
                f"stopping without saving. The last good checkpoint is untouched under {self.ckpts.root}; "
                f"lower train.lr, check the data, or raise train.max_skipped_steps"
            )

    def _log_step(self, loss: float, seconds: float) -> None:
        """Queue this step's row; it is written at the next step's sync (or before a validation,
        a save or the end), when reading the grad norm costs no extra device sync."""
        tokens_per_s = self.loader.global_batch_size * self.seq_len / seconds
        metrics = {
            "loss": loss,
            "lr": lr_at(self.state.step - 1, self.cfg.train),
            "grad_norm": None,
            "tokens_per_s": tokens_per_s,
            "tokens": self.state.tokens,
            "epoch": self.loader.epoch,
            "skipped_steps": self.state.skipped_steps,
        }
        if self.peak_flops:
            metrics["mfu"] = self.flops_per_token * tokens_per_s / (self.peak_flops * self.dist.world_size)
        if self.mixture is not None:  # tokens and epochs drawn per source, exact (from the data position)
            position = self.loader.state_dict()
            drawn = self.mixture.drawn(position["samples"], self.seq_len, streams=position["streams"])
            metrics.update({f"{k}/{name}": row[k] for name, row in drawn.items() for k in ("tokens", "epochs")})
        if self.state.step % self.cfg.logging.log_interval == 0:  # the peaks since the last log line
            metrics.update(device_memory(self.engine.device) or {})
            metrics.update(self._source_losses())
        self._flush_log()
        self._pending = (self.state.step, metrics, self.engine.get_global_grad_norm())

    def _source_losses(self) -> dict[str, float]:
        """``loss/<source>``: a mixture's train loss per source over the steps since the last log line
        (per predicted token; a source no row of those steps came from is left out), then reset. Taken
        from the same per-token NLL as the loss (ops/cross_entropy.py row_groups), so over one step the
        sources' losses weighted by their predicted tokens give the step's loss where every micro batch
        predicts as many tokens (packed CLM). Objectives with a loss beside the token one (ELECTRA's
        replaced-token detection, NSP/SOP's sentence loss) report their token-level LM part here. A
        pipelined run, whose last stage's loss never sees the rows' sources, reports none."""
        out = (
            {
                f"loss/{name}": nll / tokens
                for name, (nll, tokens) in zip(self.mixture.names, self._source_sums)
                if tokens
            }
            if self.mixture is not None
            else {}
        )
        self._source_sums = [[0.0, 0.0] for _ in self._source_sums]
        return out

    def _flush_log(self, grad_norm: float | None = None) -> None:
        """Write the queued row; ``grad_norm``: its grad norm when the step's sync has read it already."""
        if self._pending is not None:
            step, metrics, norm = self._pending
            self._pending = None
            if grad_norm is None and norm is not None:
                grad_norm = float(norm)
            metrics["grad_norm"] = grad_norm
            self.log.train_step(step, metrics)

    def validate(self) -> dict:
        """The validation metrics (a mixture: per source and the mixture's, eval/perplexity.py
        evaluate_sources), logged."""
        self._flush_log()
        self._log_reads()
        if self.mixture is not None:
            metrics = evaluate_sources(
                self._evaluate, self.val_batches, names=self.mixture.names, weights=self.mixture.weights
            )
        else:
            metrics = self._evaluate(self.val_batches)
        self.log.validation(self.state.step, metrics)
        return metrics

    def _evaluate(self, batches: list[tuple[dict, float]]) -> dict:
        if self.pipelined:
            metrics = pipeline_validate(self.engine, batches, self.byte_lengths, self.objective)
            metrics["tokens"] //= self.topo.pipeline * self.topo.tensor
            return metrics
        self.engine.eval()
        with self.autocast, vocab_split(self.vocab_split):
            metrics = evaluate(
                self.engine,
                batches,
                byte_lengths=self.byte_lengths,
                device=self.engine.device,
                objective=self.objective,
            )
        metrics["tokens"] //= self.topo.tensor  # tensor ranks of a replica evaluate the same batches
        self.engine.train()
        return metrics

    def _log_reads(self) -> None:
        """Every rank's data reads so far, summed (one host round trip per validation, never per
        step): bytes, requests and skipped documents; shards are skipped on every rank alike."""
        counts = self.loader.read_counts()
        keys = ("bytes_read", "read_requests", "skipped_documents")
        summed = comm.all_reduce_values([float(counts[k]) for k in keys])
        self.log.data(
            self.state.step, {**{k: int(v) for k, v in zip(keys, summed)}, "skipped_shards": counts["skipped_shards"]}
        )

    # -- state ----------------------------------------------------------------------------
    def save(self) -> str:
        """Checkpoint now: the shards are copied to host memory and written in the background; the
        end of the run and a stop signal wait until the checkpoint is committed."""
        self._flush_log()
        t = self.cfg.train
        client = {"train_state": asdict(self.state), "data": self.loader.state_dict()}
        meta = {
            "config": redact(to_dict(self.cfg)),
            "zero_stage": self.cfg.parallel.zero_stage,
            "layout": self.layout,
            "world_size": self.dist.world_size,
            "model_family": self.cfg.model.family,
            "model_config": asdict(self.model_cfg),
            "tokenizer_sha256": self.manifest["tokenizer"]["sha256"],
            "shards_dir": redact(str(Path(self.shards_dir).resolve()))
            if "://" not in self.shards_dir
            else redact(self.shards_dir),
            "resumed_from": str(self.resume_from) if self.resume_from else None,
        }
        extra = RankFiles(self.dist.rank)
        if self.memory is not None and self.coords["tensor"] == 0:
            self.memory.capture(extra)
        last = self.stop_agreed or self.state.step >= min(t.max_steps, t.stop_at_step or t.max_steps)
        path = self.ckpts.save(
            self.engine,
            self.state.step,
            naming=self.naming,
            coords=self.coords,
            sizes={"data": self.topo.data, "tensor": self.topo.tensor},
            client_state=client,
            meta=meta,
            extra=extra,
            tokenizer=f"{self.shards_dir}/{self.manifest['tokenizer']['file']}",
            deepspeed_files=t.deepspeed_checkpoint,
            wait=last,
        )
        self.log.message(
            f"checkpoint: {path}"
            + ("" if last else f" ({self.ckpts.last_save['blocking_s']:.2f} s blocking; writing in the background)")
        )
        if self.mixture is not None:
            self.log.data_card(self._data_card())
        return str(path)

    def _data_card(self) -> dict:
        """A mixture's sources at this position: tokens available, weight, tokens drawn and epochs
        (GPT-3's Table 2.2, as drawn so far; exact, from the data position)."""
        m = self.mixture
        position = self.loader.state_dict()
        drawn = m.drawn(position["samples"], self.seq_len, streams=position["streams"])
        return {
            "step": self.state.step,
            "tokens": self.state.tokens,
            "mixing": self.cfg.data.mixing,
            "sources": [
                {"name": name, "shards_dir": path, "tokens_available": size, "weight": weight, **drawn[name]}
                for name, path, size, weight in zip(m.names, m.shards_dirs, m.sizes, m.weights)
            ],
        }

    def _restore(self, path) -> None:
        """Masters, moments, buffers and RNG from a checkpoint of any layout, then the run's position."""
        self._set_position(
            self.ckpts.load(
                self.engine, path, self.naming, self.coords, {"data": self.topo.data, "tensor": self.topo.tensor}
            )
        )

    def _set_position(self, client: dict) -> None:
        if self.memory is not None:
            self.memory.load(self.resume_from, self.resume_meta)
        try:
            self.state = TrainState(**client["train_state"])
            self.loader.load_state_dict(client["data"])
        except (KeyError, TypeError) as err:
            raise CheckpointError(
                f"{self.resume_from}/client_state.json is corrupt ({type(err).__name__}: {err}); "
                f"use an earlier checkpoint"
            ) from None


def train(cfg: Config) -> dict:
    return Trainer(cfg).fit()


def read_metrics(out_dir: str | Path, kind: str = "train") -> list[dict]:
    """Rows of ``metrics.jsonl`` of one kind (``train`` or ``val``)."""
    lines = (Path(out_dir) / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["kind"] == kind]
