"""Cross-field checks that fail early with the numbers and the file to edit (torchtitan habit)."""

from __future__ import annotations

import dataclasses
from typing import Any

from glm_common.config_bounds import TOKENS, check_bounds
from data_pipeline.remote import check_scheme
from data_pipeline.sources import check_source
from glm_dist.config.layout import Layout, check_layout
from glm_dist.config.loader import ConfigError, source_of
from glm_dist.config.schema import Config, ModelConfig
from glm_dist.families.registry import FAMILIES, family, resolve_model_config
from glm_dist.objectives.registry import OBJECTIVES

MODEL_OVERRIDES = (
    "n_layer",
    "n_head",
    "d_model",
    "d_ff",
    "vocab_size",
    "pad_vocab_to_multiple_of",
    "context_length",
    "dropout",
)


def model_options(m: ModelConfig) -> dict[str, Any]:
    """The family's own options the config sets (None: the flavor's value), as config-factory overrides."""
    options = m.options if m.options is not None else family(m.family).options()
    return {k: v for k, v in dataclasses.asdict(options).items() if v is not None}


def model_config(cfg: Config) -> Any:
    """The family's model config: the flavor with the ``model.*`` overrides and the family's options
    applied (a generic key the family's config does not have is refused, naming the family)."""
    m = cfg.model
    try:
        spec = family(m.family)
    except KeyError as err:
        raise ConfigError(f"{err.args[0]} (model.family in {source_of(cfg, 'model.family')})") from None
    overrides = {k: getattr(m, k) for k in MODEL_OVERRIDES if getattr(m, k) is not None}
    fields = {f.name for f in dataclasses.fields(next(iter(spec.flavors.values())).cfg)}
    # a key at its schema default is not a setting (`glm config show` writes every key out)
    defaults = {f.name: f.default for f in dataclasses.fields(type(m))}
    for key in overrides:
        if key not in fields and source_of(cfg, f"model.{key}") != "<default>" and overrides[key] != defaults.get(key):
            raise ConfigError(f"model.{key} does not apply to the {m.family} family ({source_of(cfg, 'model.' + key)})")
    overrides = {k: v for k, v in overrides.items() if k in fields} | model_options(m)
    try:
        return resolve_model_config(m.family, m.flavor, **overrides)
    except (KeyError, ValueError) as err:
        raise ConfigError(f"{err.args[0]} (model.family / model.flavor in {source_of(cfg, 'model.flavor')})") from None


def seq_len(cfg: Config) -> int:
    return cfg.data.seq_len or model_config(cfg).context_length


MAX_BATCH_TOKENS = TOKENS * 16  # a micro batch's token ids alone are 2 GiB (int64) at this size


def check_launcher_agrees(cfg: Config, env: dict[str, str]) -> None:
    """Under ``accelerate launch`` with its DeepSpeed plugin, the plugin's settings must match the
    config tree (which generates the DeepSpeed JSON): two sources of truth that disagree is an error."""
    if env.get("ACCELERATE_USE_DEEPSPEED") != "true":
        return
    ours = {
        "zero_stage": str(cfg.parallel.zero_stage),
        "gradient_accumulation_steps": str(cfg.train.grad_accum_steps),
        "mixed_precision": "no" if cfg.train.precision == "fp32" else "bf16",
    }
    theirs = {
        "zero_stage": env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE"),
        "gradient_accumulation_steps": env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS"),
        "mixed_precision": env.get("ACCELERATE_MIXED_PRECISION"),
    }
    keys = {
        "zero_stage": "parallel.zero_stage",
        "gradient_accumulation_steps": "train.grad_accum_steps",
        "mixed_precision": "train.precision",
    }
    for name, value in theirs.items():
        if value is not None and value != ours[name]:
            raise ConfigError(
                f"accelerate's DeepSpeed plugin has {name}={value} but the config gives {ours[name]} "
                f"({keys[name]} in {source_of(cfg, keys[name])}); make the accelerate config "
                f"file and the glm config agree"
            )


def check_ranges(cfg: Config) -> None:
    """Every number within what a run can use (``model.n_head=0``, ``train.lr=inf``; the one table of
    ``glm_common/config_bounds.py``) and the W&B tags within W&B's limits."""
    check_bounds(cfg)
    for tag in cfg.logging.tags:  # W&B's limit, refused here rather than by wandb.init mid-start
        if not isinstance(tag, str) or not 1 <= len(tag) <= 64:
            raise ConfigError(
                f"logging.tags: {str(tag)[:80]!r} must be a string of 1 to 64 characters "
                f"({source_of(cfg, 'logging.tags')})"
            )


# keys that name files or URLs: read through fsspec, never handed to a shell (webdataset's pipe:)
LOCATION_KEYS = (
    "data.source",
    "data.shards_dir",
    "data.tokenizer",
    "train.out_dir",
    "train.resume",
    "train.checkpoint_dir",
)


def check_locations(cfg: Config) -> None:
    for key in LOCATION_KEYS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        try:
            if value is not None:
                (check_source if key == "data.source" else check_scheme)(value, key)  # manpages:/path is a name
        except ValueError as err:
            raise ConfigError(f"{err} ({source_of(cfg, key)})") from None
    if "://" in cfg.train.out_dir or "::" in cfg.train.out_dir:
        raise ConfigError(
            f"train.out_dir={cfg.train.out_dir!r} must be a local or shared-filesystem path (metrics and "
            f"logs are appended there; put checkpoints on an object store with train.checkpoint_dir; "
            f"{source_of(cfg, 'train.out_dir')})"
        )
    _check_checkpoint_locations(cfg)


def _check_checkpoint_locations(cfg: Config) -> None:
    """Checkpoints are written to a path or a writable object store, never through a cache chain."""
    for key in ("train.checkpoint_dir", "train.resume"):
        value = getattr(cfg.train, key.split(".")[1]) or ""
        if "::" in value or value.split("://")[0].lower() in ("http", "https", "hf"):
            raise ConfigError(
                f"{key}={value!r}: checkpoints need a path or a writable store (s3://, gs://, file://, "
                f"...), not a cache chain or a read-only URL ({source_of(cfg, key)})"
            )
    if cfg.train.deepspeed_checkpoint and "://" in (cfg.train.checkpoint_dir or ""):
        raise ConfigError(
            f"train.deepspeed_checkpoint=true writes DeepSpeed's files with local paths; "
            f"train.checkpoint_dir={cfg.train.checkpoint_dir!r} is a URL -- use a local or shared "
            f"filesystem, or leave train.deepspeed_checkpoint off "
            f"({source_of(cfg, 'train.checkpoint_dir')})"
        )


def validate(cfg: Config, *, world_size: int = 1) -> None:
    """Raise ``ConfigError`` for the first inconsistent combination of fields."""
    check_ranges(cfg)
    check_locations(cfg)
    mc = model_config(cfg)

    def where(key: str) -> str:
        src = source_of(cfg, key)
        return f"flavor {cfg.model.flavor!r}" if src == "<default>" and key.startswith("model.") else src

    if mc.d_model % mc.n_head:
        raise ConfigError(
            f"model.n_head={mc.n_head} must divide model.d_model={mc.d_model} "
            f"(d_model / n_head = {mc.d_model / mc.n_head:.2f}; set in {where('model.n_head')}, "
            f"{where('model.d_model')})"
        )
    if seq_len(cfg) > mc.context_length:
        raise ConfigError(
            f"data.seq_len={seq_len(cfg)} exceeds model.context_length={mc.context_length} ({where('data.seq_len')})"
        )
    if cfg.objective.name not in OBJECTIVES:
        raise ConfigError(
            f"objective.name={cfg.objective.name!r} ({where('objective.name')}) is not an objective; "
            f"known: {', '.join(OBJECTIVES)}"
        )
    trains = family(cfg.model.family).objectives
    if cfg.objective.name not in trains:
        raise ConfigError(
            f"objective.name={cfg.objective.name} ({where('objective.name')}) cannot train model family "
            f"{cfg.model.family!r}, which trains with {', '.join(trains)}"
        )
    refusal = OBJECTIVES[cfg.objective.name].refuse_model(mc)
    if refusal:
        raise ConfigError(f"objective.name={cfg.objective.name} ({where('objective.name')}): {refusal}")
    spec = family(cfg.model.family)
    if spec.check is not None:  # the family's own cross-field checks (families/<family>/spec.py)
        spec.check(cfg, mc, seq_len(cfg))
    t = cfg.train
    if t.micro_batch_size * seq_len(cfg) > MAX_BATCH_TOKENS:
        raise ConfigError(
            f"train.micro_batch_size={t.micro_batch_size} x data.seq_len={seq_len(cfg)} is "
            f"{t.micro_batch_size * seq_len(cfg)} tokens per micro batch, more than any device holds "
            f"(at most {MAX_BATCH_TOKENS}); lower train.micro_batch_size and raise "
            f"train.grad_accum_steps ({where('train.micro_batch_size')}, {where('data.seq_len')})"
        )
    check_parallel_layout(cfg, world_size)
    dp = world_size // (cfg.parallel.pipeline_stages * cfg.parallel.tensor_parallel)
    actual = t.micro_batch_size * t.grad_accum_steps * dp
    if t.global_batch_size is not None and t.global_batch_size != actual:
        raise ConfigError(
            f"train.global_batch_size={t.global_batch_size} ({where('train.global_batch_size')}) != "
            f"micro_batch_size {t.micro_batch_size} x grad_accum_steps {t.grad_accum_steps} x "
            f"data-parallel size {dp} = {actual}; change grad_accum_steps to "
            f"{t.global_batch_size / (t.micro_batch_size * dp):g} or the batch sizes"
        )
    if t.warmup_steps > t.max_steps and t.schedule != "inverse_sqrt":
        raise ConfigError(
            f"train.warmup_steps={t.warmup_steps} > train.max_steps={t.max_steps} ({where('train.warmup_steps')})"
        )
    p = cfg.parallel
    if t.optimizer in ("lamb", "adafactor") and (p.zero_stage > 0 or t.precision == "bf16"):
        raise ConfigError(
            f"train.optimizer={t.optimizer} needs parallel.zero_stage=0 and train.precision fp32 or "
            f"bf16-autocast (got ZeRO-{p.zero_stage}, {t.precision}): ZeRO and DeepSpeed's bf16 "
            f"optimizer flatten parameters into one buffer, which would turn its per-matrix statistics "
            f"(LAMB's trust ratio, Adafactor's factored moments) into one per group"
        )
    if p.offload_optimizer and p.zero_stage == 0:
        raise ConfigError(
            f"parallel.offload_optimizer needs parallel.zero_stage >= 1 "
            f"(it is 0; {where('parallel.offload_optimizer')})"
        )
    if p.offload_params and p.zero_stage != 3:
        raise ConfigError(
            f"parallel.offload_params needs parallel.zero_stage=3 (it is {p.zero_stage}; "
            f"{where('parallel.offload_params')})"
        )
    check_compile(cfg)
    check_eval(cfg)


def check_compile(cfg: Config) -> None:
    """``train.compile``'s layouts (parallel/compile.py). ZeRO-3's parameter gathering and the tensor-parallel
    all-reduces run inside each block and would break its graph; a pipeline stage's layers run under
    DeepSpeed's schedule, one call per layer, so there is no whole model to compile there."""
    t, p = cfg.train, cfg.parallel
    if t.compile and (p.zero_stage == 3 or p.tensor_parallel > 1):
        raise ConfigError(
            f"train.compile={t.compile} ({source_of(cfg, 'train.compile')}) runs with ZeRO 0-2 and no tensor "
            f"parallelism (got parallel.zero_stage={p.zero_stage}, parallel.tensor_parallel={p.tensor_parallel}): "
            f"ZeRO-3's parameter gathering and the tensor-parallel all-reduces run inside each block and "
            f"would break its graph; set train.compile=false or change the layout"
        )
    if t.compile == "model" and p.pipeline_stages > 1:
        raise ConfigError(
            f"train.compile=model ({source_of(cfg, 'train.compile')}) compiles the whole model, which a pipeline "
            f"(parallel.pipeline_stages={p.pipeline_stages}) runs as separate layers under DeepSpeed's schedule; "
            f"set train.compile=blocks"
        )
    if t.compile_mode != "default" and t.compile_backend != "inductor":
        raise ConfigError(
            f"train.compile_mode={t.compile_mode} ({source_of(cfg, 'train.compile_mode')}) is inductor's: "
            f"set train.compile_backend=inductor or train.compile_mode=default"
        )


def check_eval(cfg: Config) -> None:
    """In-loop lm-eval tasks score the whole live model on each data-parallel rank: no stage or
    tensor split of it, and no ZeRO-3 (whose forward gathers parameters on every rank at once)."""
    e, p = cfg.eval, cfg.parallel
    if bool(e.tasks) != bool(e.tasks_every):
        raise ConfigError(
            f"eval.tasks={list(e.tasks)} and eval.tasks_every={e.tasks_every} go together: give both "
            f"or neither ({source_of(cfg, 'eval.tasks')}, {source_of(cfg, 'eval.tasks_every')})"
        )
    if e.tasks and not family(cfg.model.family).next_token_logits:
        able = [name for name, spec in FAMILIES.items() if spec.next_token_logits]
        raise ConfigError(
            f"eval.tasks scores decoder-only language models ({', '.join(able)}); model.family="
            f"{cfg.model.family} is not one -- score its checkpoints with glm eval "
            f"({source_of(cfg, 'eval.tasks')})"
        )
    if e.tasks and (p.pipeline_stages > 1 or p.tensor_parallel > 1 or p.zero_stage == 3):
        raise ConfigError(
            f"eval.tasks runs on whole models on each data-parallel rank; this run has "
            f"parallel.pipeline_stages={p.pipeline_stages}, "
            f"parallel.tensor_parallel={p.tensor_parallel}, "
            f"parallel.zero_stage={p.zero_stage} -- score its checkpoints with glm eval --tasks instead "
            f"({source_of(cfg, 'eval.tasks')})"
        )


def check_parallel_layout(cfg: Config, world_size: int) -> None:
    """The data x pipeline x tensor layout: sizes that multiply to the world size and divide the model."""
    p, mc = cfg.parallel, model_config(cfg)
    topo = Layout.for_world(world_size, p.pipeline_stages, p.tensor_parallel)
    spec = family(cfg.model.family)
    check_family_layout(cfg, spec, topo)  # what the family cannot split, named, before any size check
    check_layout(
        topo,
        n_layer=mc.n_layer * spec.stacks,
        n_head=mc.n_head,
        ffn=mc.ffn_width if spec.tensor_parallel else 1,  # a family that does not tensor-split: TP=1 (refused above)
        vocab=mc.vocab_size,
        zero_stage=p.zero_stage,
        gpus_per_node=p.gpus_per_node,
        offload_params=p.offload_params,
    )


def check_family_layout(cfg: Config, spec, topo) -> None:
    mc = model_config(cfg)
    if topo.pipeline > 1:
        pipelined = {name: f.pipeline.objectives for name, f in FAMILIES.items() if f.pipeline}
        if cfg.objective.name not in pipelined.get(cfg.model.family, ()):
            raise ConfigError(
                f"pipeline parallelism (parallel.pipeline_stages={topo.pipeline}) runs "
                + ", ".join(f"{f} ({'/'.join(o)})" for f, o in pipelined.items())
                + f", not {cfg.model.family} ({cfg.objective.name}); use ZeRO-3 data parallelism for it"
            )
        refusal = spec.pipeline.refuse(mc)
        if refusal:
            raise ConfigError(f"pipeline parallelism (parallel.pipeline_stages={topo.pipeline}): {refusal}")
    if topo.tensor > 1:
        splits = [name for name, f in FAMILIES.items() if f.tensor_parallel]
        if not spec.tensor_parallel:
            raise ConfigError(
                f"tensor parallelism (parallel.tensor_parallel={topo.tensor}) splits the "
                f"{', '.join(splits)} families, not {cfg.model.family}; use data "
                f"parallelism with ZeRO-3 for it"
            )
        if cfg.train.optimizer == "adafactor":
            raise ConfigError(
                "train.optimizer=adafactor keeps factored moments that do not split with tensor "
                "parallelism; use adamw or lamb, or parallel.tensor_parallel=1"
            )
    if cfg.parallel.sequence_parallel:
        check_sequence_parallel(cfg, spec, topo)
    if cfg.train.init == "local":
        check_local_init(cfg, spec, topo)


def check_local_init(cfg: Config, spec, topo) -> None:
    """train.init=local draws each parameter by its family's rule (parallel/init.py, the registry's init_std)."""
    where = source_of(cfg, "train.init")
    if not spec.local_init:
        able = [name for name, f in FAMILIES.items() if f.local_init]
        raise ConfigError(
            f"train.init=local ({where}) draws the weights of the {', '.join(able)} families by their "
            f"rules, and {cfg.model.family} has none; use train.init=whole"
        )
    if cfg.train.init_from:
        raise ConfigError(
            f"train.init=local ({where}) draws new weights, train.init_from loads {cfg.train.init_from}'s: give one"
        )
    if topo.pipeline == 1 and topo.tensor > 1 and cfg.parallel.zero_stage == 3:
        raise ConfigError(
            f"train.init=local ({where}) with ZeRO-3 builds the model partitioned over the data ranks, "
            f"which tensor slicing (parallel.tensor_parallel={topo.tensor}) cannot cut afterwards; use "
            f"ZeRO-1/2 with tensor parallelism, or train.init=whole"
        )


def check_sequence_parallel(cfg: Config, spec, topo) -> None:
    """Sequence parallelism cuts a tensor-parallel group's residual stream along the sequence."""
    where = source_of(cfg, "parallel.sequence_parallel")
    if topo.tensor == 1:
        raise ConfigError(
            f"parallel.sequence_parallel=true ({where}) splits the sequence inside a tensor-parallel "
            f"group: set parallel.tensor_parallel > 1, or leave sequence_parallel off"
        )
    if not spec.sequence_parallel:
        cut = [name for name, f in FAMILIES.items() if f.sequence_parallel]
        raise ConfigError(
            f"parallel.sequence_parallel=true ({where}) cuts the {', '.join(cut)} families, not "
            f"{cfg.model.family}; leave it off for {cfg.model.family}"
        )
    if topo.pipeline > 1:
        raise ConfigError(
            f"parallel.sequence_parallel=true ({where}) runs without pipeline stages "
            f"(parallel.pipeline_stages={topo.pipeline}); use one or the other"
        )
    if seq_len(cfg) % topo.tensor:
        raise ConfigError(
            f"parallel.sequence_parallel=true ({where}) cuts data.seq_len={seq_len(cfg)} into "
            f"parallel.tensor_parallel={topo.tensor} equal pieces; use a multiple of {topo.tensor}"
        )
