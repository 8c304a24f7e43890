"""Cross-field checks that fail early with the numbers and the file to edit (torchtitan habit)."""
from __future__ import annotations

from typing import Any

from glm_dist.config.loader import ConfigError, source_of
from glm_dist.config.schema import Config
from glm_dist.models.registry import resolve_model_config

MODEL_OVERRIDES = ("n_layer", "n_head", "d_model", "d_ff", "vocab_size", "context_length", "dropout",
                   "sparse_window")


def model_config(cfg: Config) -> Any:
    """The family's model config: the flavor with the ``model.*`` overrides applied."""
    m = cfg.model
    overrides = {k: getattr(m, k) for k in MODEL_OVERRIDES if getattr(m, k) is not None}
    try:
        return resolve_model_config(m.family, m.flavor, **overrides)
    except KeyError as err:
        raise ConfigError(f"{err.args[0]} (model.family / model.flavor in {source_of(cfg, 'model.flavor')})") from None


def seq_len(cfg: Config) -> int:
    return cfg.data.seq_len or model_config(cfg).context_length


def check_launcher_agrees(cfg: Config, env: dict[str, str]) -> None:
    """Under ``accelerate launch`` with its DeepSpeed plugin, the plugin's settings must match the
    config tree (which generates the DeepSpeed JSON): two sources of truth that disagree is an error."""
    if env.get("ACCELERATE_USE_DEEPSPEED") != "true":
        return
    ours = {"zero_stage": str(cfg.parallel.zero_stage), "gradient_accumulation_steps": str(cfg.train.grad_accum_steps),
            "mixed_precision": "no" if cfg.train.precision == "fp32" else "bf16"}
    theirs = {"zero_stage": env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE"),
              "gradient_accumulation_steps": env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS"),
              "mixed_precision": env.get("ACCELERATE_MIXED_PRECISION")}
    keys = {"zero_stage": "parallel.zero_stage", "gradient_accumulation_steps": "train.grad_accum_steps",
            "mixed_precision": "train.precision"}
    for name, value in theirs.items():
        if value is not None and value != ours[name]:
            raise ConfigError(f"accelerate's DeepSpeed plugin has {name}={value} but the config gives {ours[name]} "
                              f"({keys[name]} in {source_of(cfg, keys[name])}); make the accelerate config "
                              f"file and the glm config agree")


def validate(cfg: Config, *, world_size: int = 1) -> None:
    """Raise ``ConfigError`` for the first inconsistent combination of fields."""
    mc = model_config(cfg)
    def where(key: str) -> str:
        src = source_of(cfg, key)
        return f"flavor {cfg.model.flavor!r}" if src == "<default>" and key.startswith("model.") else src

    if mc.d_model % mc.n_head:
        raise ConfigError(
            f"model.n_head={mc.n_head} must divide model.d_model={mc.d_model} "
            f"(d_model / n_head = {mc.d_model / mc.n_head:.2f}; set in {where('model.n_head')}, "
            f"{where('model.d_model')})")
    if seq_len(cfg) > mc.context_length:
        raise ConfigError(f"data.seq_len={seq_len(cfg)} exceeds model.context_length={mc.context_length} "
                          f"({where('data.seq_len')})")
    if getattr(mc, "sparse_window", None) is not None and mc.sparse_window < 1:
        raise ConfigError(f"model.sparse_window={mc.sparse_window} must be >= 1 ({where('model.sparse_window')})")
    trainable = {"gpt": ("clm",), "bert": ("mlm_nsp", "mlm"), "roberta": ("mlm",), "albert": ("sop", "mlm"),
                 "electra": ("electra",), "t5": ("span_corruption",), "bart": ("denoising",)}
    if cfg.objective.name not in trainable.get(cfg.model.family, ()):
        raise ConfigError(f"objective.name={cfg.objective.name} ({where('objective.name')}) cannot train model family "
                          f"{cfg.model.family!r}, which trains with {', '.join(trainable.get(cfg.model.family, ()))}")
    t = cfg.train
    for key in ("micro_batch_size", "grad_accum_steps", "max_steps"):
        if getattr(t, key) < 1:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be >= 1 ({where('train.' + key)})")
    check_parallel_layout(cfg, world_size)
    dp = world_size // (cfg.parallel.pipeline_stages * cfg.parallel.tensor_parallel)
    actual = t.micro_batch_size * t.grad_accum_steps * dp
    if t.global_batch_size is not None and t.global_batch_size != actual:
        raise ConfigError(
            f"train.global_batch_size={t.global_batch_size} ({where('train.global_batch_size')}) != "
            f"micro_batch_size {t.micro_batch_size} x grad_accum_steps {t.grad_accum_steps} x "
            f"data-parallel size {dp} = {actual}; change grad_accum_steps to "
            f"{t.global_batch_size / (t.micro_batch_size * dp):g} or the batch sizes")
    if t.warmup_steps > t.max_steps and t.schedule != "inverse_sqrt":
        raise ConfigError(f"train.warmup_steps={t.warmup_steps} > train.max_steps={t.max_steps} "
                          f"({where('train.warmup_steps')})")
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        raise ConfigError(f"train.min_lr_ratio={t.min_lr_ratio} must be in [0, 1] ({where('train.min_lr_ratio')})")
    p = cfg.parallel
    if t.optimizer in ("lamb", "adafactor") and (p.zero_stage > 0 or t.precision == "bf16"):
        raise ConfigError(f"train.optimizer={t.optimizer} needs parallel.zero_stage=0 and train.precision fp32 or bf16-autocast "
                          f"(got ZeRO-{p.zero_stage}, {t.precision}): ZeRO and DeepSpeed's bf16 optimizer flatten "
                          f"parameters into one buffer, which would turn its per-matrix statistics (LAMB's trust ratio, "
                          f"Adafactor's factored moments) into one per group")
    if p.zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"parallel.zero_stage={p.zero_stage} must be 0, 1, 2 or 3 ({where('parallel.zero_stage')})")
    if p.offload_optimizer and p.zero_stage == 0:
        raise ConfigError(f"parallel.offload_optimizer needs parallel.zero_stage >= 1 "
                          f"(it is 0; {where('parallel.offload_optimizer')})")
    if p.offload_params and p.zero_stage != 3:
        raise ConfigError(f"parallel.offload_params needs parallel.zero_stage=3 (it is {p.zero_stage}; "
                          f"{where('parallel.offload_params')})")


def check_parallel_layout(cfg: Config, world_size: int) -> None:
    """The data x pipeline x tensor layout: sizes that multiply to the world size and divide the model."""
    from glm_dist.parallel.topology import Topology, check_layout

    p, mc = cfg.parallel, model_config(cfg)
    topo = Topology.for_world(world_size, p.pipeline_stages, p.tensor_parallel)
    layers = mc.n_layer * (2 if cfg.model.family in ("t5", "bart") else 1)
    check_layout(topo, n_layer=layers, n_head=mc.n_head, ffn=getattr(mc, "d_ff", None) or 4 * mc.d_model,
                 vocab=mc.vocab_size, zero_stage=p.zero_stage, gpus_per_node=p.gpus_per_node,
                 offload_params=p.offload_params)
    if topo.pipeline > 1:
        pipelined = {"gpt": ("clm",), "bert": ("mlm",), "roberta": ("mlm",)}
        if cfg.objective.name not in pipelined.get(cfg.model.family, ()):
            raise ConfigError(f"pipeline parallelism (parallel.pipeline_stages={topo.pipeline}) runs "
                              + ", ".join(f"{f} ({'/'.join(o)})" for f, o in pipelined.items())
                              + f", not {cfg.model.family} ({cfg.objective.name}); use ZeRO-3 data parallelism for it")
        if cfg.model.family != "gpt" and (getattr(mc, "share", "none") != "none" or mc.emb != mc.d_model):
            raise ConfigError("pipeline parallelism needs unshared, unfactorised encoder layers "
                              "(not ALBERT-style sharing or a factorised embedding)")
    if topo.tensor > 1:
        from glm_dist.parallel.tensor import TENSOR_PARALLEL_FAMILIES

        if cfg.model.family not in TENSOR_PARALLEL_FAMILIES:
            raise ConfigError(f"tensor parallelism (parallel.tensor_parallel={topo.tensor}) splits the "
                              f"{', '.join(TENSOR_PARALLEL_FAMILIES)} families, not {cfg.model.family}; use data "
                              f"parallelism with ZeRO-3 for it")
        if cfg.train.optimizer == "adafactor":
            raise ConfigError("train.optimizer=adafactor keeps factored moments that do not split with tensor "
                              "parallelism; use adamw or lamb, or parallel.tensor_parallel=1")
