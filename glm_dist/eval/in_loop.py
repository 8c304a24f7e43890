"""lm-eval tasks on the live model during ``glm train`` (the ``eval`` config section).

Every ``eval.tasks_every`` steps each data-parallel rank scores its share of the documents of
``eval.tasks`` with the harness's ``GlmLM`` (lm-eval splits them by rank and gathers the metrics on
rank 0, as ``glm eval --tasks`` does under torchrun). A rank that would get no document of some
task (fewer documents than ranks) stays out of lm-eval: the ranks with work evaluate in their own
process group, and every rank then meets at one barrier that waits at most ``eval.timeout_s``; a
rank that does not arrive stops the run with a message naming it, instead of a hang. The
evaluation runs between optimizer steps, so the steps' tokens/s never include it; its seconds are
reported in its own row of metrics.jsonl (``kind: tasks``) and in W&B (``tasks/...``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import yaml
from tokenizers import Tokenizer

from data_pipeline.tokenize.profiles import special_ids
from glm_dist.config.schema import EvalConfig
from glm_dist.errors import GlmError
from glm_dist.eval.harness import GlmLM, HarnessError, _from_json, _to_json
from glm_dist.eval.perplexity import gives_next_token_logits
from glm_dist.parallel import comm

MAX_YAML_BYTES = 1 << 20


class EvalTimeout(GlmError, RuntimeError):
    """Some rank did not finish an in-loop evaluation within ``eval.timeout_s``."""


class _GroupLM(GlmLM):
    """``GlmLM`` whose collectives run over the ranks that have documents (``group``, None: all)."""

    def __init__(self, *, rank: int, world_size: int, group, **kwargs):
        super().__init__(**kwargs)
        self._rank, self._world_size, self.group = rank, world_size, group

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.stack(comm.all_gather(tensor, group=self.group))

    def gather_object(self, obj, dst: int = 0):
        parts = comm.all_gather_bytes(json.dumps(_to_json(obj)).encode(), group=self.group)
        return [_from_json(json.loads(p)) for p in parts] if self.rank == dst else None

    def barrier(self) -> None:
        comm.barrier(self.group)


def task_names(cfg: EvalConfig) -> tuple[list[str], list[str]]:
    """``eval.tasks`` as lm-eval task names, and the folders to search for them: a task YAML path
    stands for its ``task`` name, found in its folder."""
    names, folders = [], [cfg.include_path] if cfg.include_path else []
    for entry in cfg.tasks:
        if not entry.endswith((".yaml", ".yml")):
            names.append(entry)
            continue
        path = Path(entry)
        if not path.is_file() or path.stat().st_size > MAX_YAML_BYTES:
            raise HarnessError(f"eval.tasks: {entry} is not a task YAML file (of at most {MAX_YAML_BYTES} bytes)")
        config = yaml.load(path.read_text(), Loader=_DataLoader)
        if not isinstance(config, dict) or not isinstance(config.get("task"), str):
            raise HarnessError(f"eval.tasks: {entry} has no 'task: NAME' line")
        names.append(config["task"])
        folders.append(str(path.parent))
    if cfg.include_path and not Path(cfg.include_path).is_dir():
        raise HarnessError(
            f"eval.include_path={cfg.include_path} is not a folder (build one: glm data eval-tasks --out DIR)"
        )
    return names, folders


class _DataLoader(yaml.SafeLoader):
    """Reads a task YAML's keys; lm-eval's tags (``!function``) are left unresolved here."""


_DataLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def task_manager(cfg: EvalConfig):
    """lm-eval's tasks: only the given folders' when they have them all (lm-eval's own are ~15k YAMLs)."""
    from lm_eval.tasks import TaskManager

    names, folders = task_names(cfg)
    manager = TaskManager(include_path=folders, include_defaults=False) if folders else None
    if manager is None or not all(manager.match_tasks([t]) for t in names):
        manager = TaskManager(include_path=folders or None)
    unknown = [t for t in names if not manager.match_tasks([t])]
    if unknown:
        raise HarnessError(
            f"eval.tasks: unknown task {unknown[0]!r}: build the offline tasks with glm data "
            f"eval-tasks --out DIR and set eval.include_path=DIR, or name one of lm-eval's tasks"
        )
    return manager, names


def documents_per_task(spec: str, cfg: EvalConfig, manager) -> dict[str, int]:
    """How many documents lm-eval scores of each task of ``spec`` (a group has several; ``eval.limit`` applied)."""
    from lm_eval.evaluator_utils import get_sample_size

    tasks = manager.load([spec])["tasks"]
    return {
        name: min(len(task.eval_docs), get_sample_size(task, cfg.limit) or len(task.eval_docs))
        for name, task in tasks.items()
    }


class InLoopEval:
    """Built once by every rank (``rank`` / ``world_size``: its data-parallel place). Each entry of
    ``eval.tasks`` is scored by the ranks 0..n-1 that get documents of all its tasks (n <= world size)."""

    def __init__(
        self,
        cfg: EvalConfig,
        *,
        model: torch.nn.Module,
        family_name: str,
        tokenizer: Tokenizer,
        profile: str,
        rank: int,
        world_size: int,
    ):
        if not gives_next_token_logits(family_name):
            raise HarnessError(
                f"eval.tasks scores decoder-only language models; this run trains a "
                f"{family_name} model, whose forward gives no next-token logits"
            )
        ids = special_ids(tokenizer, profile)
        self.cfg, self.tok, self.eot, self.rank = cfg, tokenizer, ids.get("eot", ids.get("eos")), rank
        if self.eot is None:
            raise HarnessError(f"eval.tasks: the {profile} tokenizer has no end-of-text token")
        self.manager, self.specs = task_manager(cfg)
        self.documents = [documents_per_task(spec, cfg, self.manager) for spec in self.specs]
        empty = [name for docs in self.documents for name, n in docs.items() if n == 0]
        if empty:
            raise HarnessError(f"eval.tasks: task {empty[0]!r} has no documents to score")
        self.working = [min(world_size, *docs.values()) for docs in self.documents]
        # every rank makes every group, in the same order
        self.groups = {n: comm.new_group(range(n)) for n in sorted(set(self.working)) if n < world_size}

    def due(self, step: int) -> bool:
        return step % self.cfg.tasks_every == 0

    def run(self, model: torch.nn.Module, step: int) -> dict | None:
        """Score the tasks with ``model``; rank 0 returns the metrics row, the others None."""
        t0, was_training = time.perf_counter(), model.training
        row = {}
        for spec, working, docs in zip(self.specs, self.working, self.documents):
            if self.rank < working:
                row.update(flat_metrics(self._evaluate(model, spec, working)))
            row.update({f"{name}/ranks": working for name in docs})  # the ranks that scored it
        model.train(was_training)
        missing = comm.wait_for_ranks(self.cfg.timeout_s)  # ranks with less (or no) work wait here
        if missing != []:
            who = f"rank(s) {', '.join(map(str, missing))} did not arrive" if missing else "rank 0 did not answer"
            names = ", ".join(name for docs in self.documents for name in docs)
            raise EvalTimeout(
                f"step {step}: the in-loop evaluation of {names} timed out after "
                f"eval.timeout_s={self.cfg.timeout_s:g} s: {who}; raise eval.timeout_s or lower "
                f"eval.limit"
            )
        return {"seconds": time.perf_counter() - t0, **row} if self.rank == 0 else None

    def _evaluate(self, model: torch.nn.Module, spec: str, working: int) -> dict | None:
        from lm_eval import simple_evaluate

        lm = _GroupLM(
            model=model,
            tokenizer=self.tok,
            eot_id=self.eot,
            batch_size=self.cfg.batch_size,
            rank=self.rank,
            world_size=working,
            group=self.groups.get(working),
            device=str(next(model.parameters()).device),
        )
        return simple_evaluate(
            model=lm,
            tasks=[spec],
            num_fewshot=self.cfg.num_fewshot,
            limit=self.cfg.limit,
            task_manager=self.manager,
            log_samples=False,
            bootstrap_iters=0,
            verbosity="ERROR",
            random_seed=None,
            numpy_random_seed=None,
            torch_random_seed=None,
        )  # the run's RNG


def flat_metrics(results: dict | None) -> dict[str, float]:
    """lm-eval's ``results`` as ``task/metric`` numbers (``acc,none`` -> ``acc``; other filters kept);
    {} on the ranks other than the first of the group."""
    row = {}
    if results is None:
        return row
    for task, metrics in results["results"].items():
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and "," in key:
                metric, filt = key.split(",", 1)
                row[f"{task}/{metric if filt == 'none' else key}"] = float(value)
    return row


def in_loop_eval(cfg, model: torch.nn.Module, tokenizer: Tokenizer, rank: int, world_size: int) -> InLoopEval:
    """The trainer's hook (``cfg``: the run's config tree; ``rank`` / ``world_size``: data parallel)."""
    return InLoopEval(
        cfg.eval,
        model=model,
        family_name=cfg.model.family,
        tokenizer=tokenizer,
        profile=cfg.data.tokenizer_profile,
        rank=rank,
        world_size=world_size,
    )
