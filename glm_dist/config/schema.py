"""The typed config tree. Field docstrings (``help`` metadata) double as ``--help`` text.

Every section is a dataclass; the loader (``loader.py``) builds them strictly from YAML, so an
unknown key or a wrong type is an error naming the key and the file that set it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

from glm_dist.families.registry import FAMILIES
from glm_dist.objectives.registry import OBJECTIVES, option_keys, options_schema


def _f(default, help: str, **kw):
    """A dataclass field whose ``help`` is shown by ``glm config keys``."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class ModelConfig:
    family: str = _f("gpt", f"model family in the registry: {' | '.join(FAMILIES)}")
    flavor: str = _f("tiny", "named size of the family (tiny, gpt2-small, gpt3-175b, ...)")
    n_layer: Optional[int] = _f(None, "override the flavor's number of blocks")
    n_head: Optional[int] = _f(None, "override the flavor's attention heads")
    d_model: Optional[int] = _f(None, "override the flavor's hidden width")
    d_ff: Optional[int] = _f(None, "override the flavor's FFN width (default 4*d_model)")
    vocab_size: Optional[int] = _f(None, "override the flavor's vocabulary size")
    pad_vocab_to_multiple_of: Optional[int] = _f(
        None,
        "GPT: store the embedding/output matrix with its rows rounded up to a multiple of this (128: 50257 -> "
        "50304, tensor-core-friendly matmuls); the padding is never predicted, exports and parameter counts "
        "keep the real vocabulary (default 1: none)",
    )
    context_length: Optional[int] = _f(None, "override the flavor's context length")
    dropout: float = _f(0.0, "dropout on embeddings, attention output and MLP output")
    # the family's own keys (XLNet's mem_len, CVT's tags, ...): written under model: beside the ones above,
    # validated against the options dataclass of the family's package (families/<family>/spec.py)
    options: Any = _f(None, "the model family's own keys, set under model: (families/<family>/spec.py)")

    __extra__: ClassVar[str] = "options"

    @classmethod
    def extra_schema(cls, values: dict, extra: dict) -> tuple[type | None, dict]:
        """The family's options dataclass for the keys this schema does not name. A key that is some
        family's option left at null is no setting (``glm config show`` of an older version wrote
        every family's keys) and is dropped; an unknown family is left to the checks to name."""
        name = values.get("family", cls.family)
        if name not in FAMILIES:
            return None, extra
        every = {f.name for spec in FAMILIES.values() for f in dataclasses.fields(spec.options)}
        return FAMILIES[name].options, {k: v for k, v in extra.items() if v is not None or k not in every}

    @classmethod
    def extra_keys(cls) -> list[tuple[str, str, Any, str]]:
        """(key, type, default, help) of every family's own key, for ``glm config keys``; a key two
        families declare is listed once per meaning, with the families that take it."""
        keys: dict[tuple[str, str, str], list[str]] = {}
        for name, spec in FAMILIES.items():
            for f in dataclasses.fields(spec.options):
                keys.setdefault((f.name, str(f.type), f.metadata.get("help", "")), []).append(name)
        return [(key, typ, None, f"{', '.join(users)}: {help}") for (key, typ, help), users in keys.items()]


@dataclass
class DataConfig:
    source: str = _f(
        "embedded",
        "'embedded' (pydoc text of the stdlib), 'wordnet' (Debian's wordnet-base glosses and examples), "
        "'manpages' (or manpages:DIR), a JSONL/text path, glob or fsspec URL, or a glm data run output "
        "(its folder, URL or manifest.json)",
    )
    text_field: str = _f("text", "JSONL field holding the document text")
    max_record_mb: float = _f(
        10.0,
        "a JSON line or text file larger than this is skipped and counted "
        "(manifest source.skipped.record_too_large), never buffered whole",
    )
    shards_dir: str = _f("data/embedded-gpt2", "where the tokenizer, shards and manifest.json live")
    tokenizer: str = _f(
        "train", "'train' a tokenizer of data.tokenizer_profile on the source, or a tokenizer.json path"
    )
    tokenizer_profile: str = _f(
        "gpt2",
        "gpt2 | roberta | bert | albert | t5 | xlnet | word: the kind (byte BPE / "
        "WordPiece / Unigram / WordLevel) and special tokens; a family's own is its "
        "row's tokenizer_profile (families/<family>/spec.py)",
    )
    vocab_size: int = _f(8192, "vocabulary size when training the tokenizer")
    val_per_mille: int = _f(50, "documents held out for validation, per thousand (by document hash)")
    seq_len: Optional[int] = _f(None, "training sequence length (default: model context length)")
    shard_max_bytes: int = _f(64 * 2**20, "approximate size of one shard")
    encode_workers: int = _f(0, "local processes encoding input files in parallel (0: one per core)")
    shuffle_window: int = _f(
        4,
        "documents of this many shards (shards permuted per epoch) are pooled and permuted "
        "before packing: which documents share a packed unit; the units are then "
        "shuffled over the whole epoch",
    )
    num_workers: int = _f(0, "dataloader worker processes building batches ahead (0: in the training process)")
    cache_dir: str = _f(
        "",
        "node-local folder: a block cache of remote shards' byte ranges (fsspec blockcache) and "
        "the document table when data.shards_dir is not a writable path ('': none)",
    )
    read_gap_bytes: int = _f(
        0,
        "byte ranges of one shard closer than this are read in one request (0: only "
        "touching ranges; more trades bytes for fewer requests on high-latency stores)",
    )
    read_retries: int = _f(
        3,
        "a failed range read is retried this many times with exponential backoff, then its "
        "documents are skipped (filled with padding) and counted",
    )
    read_backoff_s: float = _f(0.5, "the wait before the first retry of a range read (doubled each time)")
    cooccur_window: int = _f(10, "GloVe (glm data cooccur): context words counted on each side, weighted 1/distance")
    cooccur_blocks: int = _f(4, "GloVe (glm data cooccur): reduce tasks (word id mod blocks)")
    vectors: str = _f(
        "",
        "translation pair sets (CoVe): GloVe text vectors (glm data vectors) whose words, at most "
        "data.vocab_size with the specials, are the source vocabulary and whose vectors are the "
        "encoder's frozen inputs",
    )
    target_vocab_size: int = _f(8192, "translation pair sets (CoVe): the target-side tokenizer's vocabulary size")
    labelled_pairs: int = _f(
        0,
        "translation pair sets: keep the targets of this many training pairs (drawn by "
        "message-id hash) and only the sources of the rest, as the 'unlabelled' split "
        "Cross-View Training reads (0: every pair labelled)",
    )
    mixture: list = _f(
        [],
        "sources mixed into one training stream, each a mapping: name, shards_dir (its token shard "
        "set), optionally source (raw input tokenized into shards_dir with the first source's "
        "tokenizer when missing) and weight (its share of the tokens) or epochs (passes over it); "
        "empty: the one data.source / data.shards_dir (glm data mix prints the table)",
    )
    mixing: Literal["weights", "proportional", "temperature"] = _f(
        "weights",
        "data.mixture's weights: as written (weight or epochs per source) | proportional (T5: each "
        "source's share is its size, at most data.mixing_cap) | temperature (T5: that share to the "
        "power 1/data.mixing_temperature, renormalised)",
    )
    mixing_cap: Optional[int] = _f(
        None, "T5's K: proportional and temperature mixing count a source as at most this many tokens (null: no limit)"
    )
    mixing_temperature: float = _f(
        1.0,
        "T5's T: temperature mixing's rates are proportional to size^(1/T) (1: proportional; larger: closer to equal)",
    )
    max_epochs_warning: float = _f(
        4.0,
        "glm data mix and glm train warn for a source the run repeats more often "
        "than this (repeated data starts to hurt: Muennighoff et al. 2023)",
    )
    normalize_weights: bool = _f(
        False, "divide data.mixture's weights by their sum (otherwise weights that do not sum to 1 are refused)"
    )


@dataclass
class ObjectiveConfig:
    name: str = _f(
        "clm",
        "the objective (objectives/registry.py): clm (GPT) | mlm (RoBERTa) | mlm_nsp (BERT) | "
        "sop (ALBERT) | span_corruption (T5) | denoising (BART) | electra | plm (XLNet) | "
        "glove (co-occurrence counts) | bilm (ELMo) | translation (CoVe) | awd_lm (AWD-LSTM) | "
        "cvt (CVT tagging) | cvt_translation (CVT on CoVe)",
    )
    # the objective's own keys (mask_rate, noise_density, ...): written under objective: beside name,
    # validated against the options dataclass of the objective's file (objectives/<name>.py)
    options: Any = _f(None, "the objective's own keys, set under objective: (objectives/<name>.py)")

    __extra__: ClassVar[str] = "options"

    def __post_init__(self) -> None:
        if self.options is None and self.name in OBJECTIVES:  # built in code: the objective's defaults
            self.options = OBJECTIVES[self.name].Options()

    @classmethod
    def extra_schema(cls, values: dict, extra: dict) -> tuple[type | None, dict]:
        """The objective's options dataclass for the keys this schema does not name."""
        return options_schema(values.get("name", cls.name), extra)

    @classmethod
    def extra_keys(cls) -> list[tuple[str, str, Any, str]]:
        """(key, type, default, help) of every objective's own key, for ``glm config keys``."""
        return [
            (key, str(f.type), f.default, f"{', '.join(users)}: {f.metadata.get('help', '')}")
            for key, (f, users) in option_keys().items()
        ]


@dataclass
class TrainConfig:
    out_dir: str = _f("runs/gpt2-tiny", "run directory: checkpoints, metrics, plots, W&B files")
    seed: int = _f(1234, "seed of the data order and of model init")
    max_steps: int = _f(300, "optimizer steps to train")
    micro_batch_size: int = _f(8, "sequences per rank per forward pass")
    grad_accum_steps: int = _f(1, "micro batches per optimizer step")
    global_batch_size: Optional[int] = _f(
        None, "optional check: must equal micro_batch_size * grad_accum_steps * data-parallel size"
    )
    lr: float = _f(6e-4, "peak learning rate")
    min_lr_ratio: float = _f(0.1, "final LR as a fraction of the peak")
    warmup_steps: int = _f(30, "linear warmup steps")
    schedule: Literal["cosine", "linear", "constant", "inverse_sqrt", "stlr"] = _f(
        "cosine",
        "decay after warmup; inverse_sqrt (T5): lr / sqrt(max(step, warmup_steps)), constant during warmup; "
        "stlr (ULMFiT): slanted triangular over max_steps (train.stlr_cut_frac, train.stlr_ratio; "
        "no warmup_steps)",
    )
    stlr_cut_frac: float = _f(0.1, "stlr: the fraction of max_steps the rate rises for")
    stlr_ratio: float = _f(32.0, "stlr: how much smaller the lowest rate is than the peak")
    discriminative_lr: float = _f(
        0.0,
        "ULMFiT's discriminative fine-tuning: each layer group below the top "
        "learns at the rate of the group above / this factor (2.6; 0: one rate for all)",
    )
    init_from: Optional[str] = _f(
        None,
        "start from this checkpoint's weights (same family and tokenizer) with a new "
        "optimizer, schedule and data position: fine-tuning an LM on a target "
        "task's text (ULMFiT's second stage); train.resume still continues this run",
    )
    optimizer: Literal["adamw", "lamb", "adafactor", "adagrad"] = _f(
        "adamw",
        "adamw (fused) | lamb (ALBERT's recipe) | adafactor (T5's recipe, torch.optim.Adafactor) | "
        "adagrad (GloVe's and ELMo's recipes; element-wise, so any ZeRO stage)",
    )
    adagrad_initial_accumulator: float = _f(0.0, "adagrad: starting sum of squared gradients (bilm-tf: 1.0)")
    weight_decay: float = _f(0.1, "AdamW decay on matrices and embeddings (not biases or norms)")
    beta1: float = _f(0.9, "AdamW beta1")
    beta2: float = _f(0.95, "AdamW beta2")
    eps: float = _f(1e-8, "AdamW epsilon")
    grad_clip: float = _f(1.0, "clip the global gradient norm (0 disables)")
    precision: Literal["fp32", "bf16", "bf16-autocast", "auto"] = _f(
        "fp32",
        "fp32; bf16 = DeepSpeed bf16 (bf16 weights, fp32 master); bf16-autocast = torch.autocast; "
        "auto = bf16 where the device multiplies bf16 in hardware (a CUDA GPU from Ampere on, a CPU with "
        "AMX or AVX512-BF16), else fp32 (resolved when the config loads; the run's config.yaml records it)",
    )
    activation_checkpointing: bool = _f(False, "recompute each block in the backward pass")
    compile: Literal[False, True, "blocks", "model"] = _f(
        False,
        "torch.compile, in place (parallel/compile.py): blocks (or true) = each transformer block (regional: "
        "with activation checkpointing, ZeRO 0-2 and pipelines); model = the whole model's forward, with the "
        "loss where the objective computes it inside the forward (CLM's fused loss; ZeRO 0-2, no pipeline); "
        "neither with ZeRO-3 or tensor parallelism; false: eager",
    )
    compile_backend: Literal["inductor", "aot_eager", "eager"] = _f(
        "inductor",
        "train.compile's backend: inductor (generated kernels) | aot_eager | eager (graph capture "
        "only, no code generation: quick checks)",
    )
    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = _f(
        "default",
        "train.compile's mode (torch.compile's): reduce-overhead replays the compiled graphs as CUDA graphs "
        "(a small model whose step is bound by kernel launches; CUDA and inductor only, refused elsewhere)",
    )
    eval_interval: int = _f(100, "validate every N steps (0: only before and after)")
    eval_batches: int = _f(20, "validation batches (micro_batch_size sequences each, per rank)")
    save_interval: int = _f(0, "checkpoint every N steps (0: only at the end)")
    keep_last: int = _f(3, "keep the newest N checkpoints (older ones are deleted after a save)")
    init: Literal["whole", "local"] = _f(
        "whole",
        "'whole': every rank builds the whole model from the seed and keeps its part (pipelined runs "
        "start exactly as one process); 'local': each parameter drawn from its own seeded generator, the same at "
        "every layout -- a pipeline stage builds only its own layers, ZeRO-3 builds the model partitioned "
        "(deepspeed.zero.Init) -- for sizes whose whole model does not fit a host",
    )
    checkpoint_dir: Optional[str] = _f(
        None,
        "where checkpoints go: a path or an fsspec URL (s3://bucket/prefix, gs://...); default out_dir/checkpoints",
    )
    deepspeed_checkpoint: bool = _f(
        False,
        "also write DeepSpeed's own checkpoint files (state/) beside the sharded "
        "format (a local checkpoint_dir only; resume always reads the sharded format)",
    )
    keep_every: int = _f(0, "also keep every checkpoint whose step is a multiple of M (0: none)")
    stop_signals: list = _f(
        ["SIGUSR1", "SIGTERM"],
        "on these signals: finish the step, checkpoint, "
        "exit 75 (SLURM's --signal / preemption; slurm/train.sbatch requeues)",
    )
    stop_at_step: Optional[int] = _f(
        None,
        "checkpoint and exit once this step is reached (the schedule still runs to max_steps); "
        "for jobs cut into time slots -- rerun the same command to continue",
    )
    resume: str = _f("auto", "'auto' (the latest checkpoint in out_dir that verifies), 'none', or a checkpoint dir")
    resume_overwrite: bool = _f(
        False,
        "resuming from an older step than out_dir's newest checkpoint moves the newer "
        "ones to checkpoints/aside/ (without this the run is refused: a later auto-resume "
        "would continue the old run)",
    )
    max_skipped_steps: int = _f(10, "stop after this many steps with a non-finite loss")
    plot: bool = _f(True, "write loss_curve.png in out_dir at the end")

    def __post_init__(self) -> None:
        if self.compile is True:  # the boolean key's meaning before scopes: configs and checkpoints that say true
            self.compile = "blocks"


@dataclass
class ParallelConfig:
    zero_stage: int = _f(0, "DeepSpeed ZeRO stage 0-3")
    offload_optimizer: bool = _f(False, "ZeRO-Offload: optimizer state on the CPU (stage >= 1)")
    offload_params: bool = _f(False, "ZeRO-Infinity: parameters on the CPU too (stage 3)")
    pipeline_stages: int = _f(1, "pipeline-parallel size (model depth split into this many stages)")
    pipeline_partition: Literal["blocks", "parameters"] = _f(
        "blocks", "cut stages at equal numbers of transformer blocks, or at balanced parameter counts"
    )
    tensor_parallel: int = _f(1, "tensor-parallel size (attention heads and FFN width split across ranks)")
    vocab_parallel: bool = _f(
        True,
        "under tensor parallelism, split the token embedding, its tied output layer and "
        "the loss over the vocabulary too (families that support it; false: keep them whole "
        "on every tensor rank)",
    )
    sequence_parallel: bool = _f(
        False,
        "under tensor parallelism, cut the LayerNorm / dropout / residual regions "
        "along the sequence (Korthikanti et al. 2022): activations there 1/tensor_parallel "
        "per rank, all-gather + reduce-scatter instead of all-reduce",
    )
    gpus_per_node: Optional[int] = _f(
        None, "for layout checks and glm plan: ranks per node (tensor parallelism stays inside a node)"
    )
    collective_timeout_s: float = _f(
        1800.0,
        "a collective that some rank does not join within this many seconds "
        "stops the run, naming the missing ranks (gloo; NCCL's watchdog aborts)",
    )


@dataclass
class LoggingConfig:
    wandb: bool = _f(True, "log to Weights & Biases (rank 0)")
    wandb_mode: Literal["offline", "online", "disabled", "auto"] = _f(
        "auto", "'auto' is online when WANDB_API_KEY is set, otherwise offline"
    )
    project: str = _f("glm-dist", "W&B project")
    entity: Optional[str] = _f(None, "W&B entity")
    run_name: Optional[str] = _f(None, "W&B run name (default: the out_dir's name)")
    group: Optional[str] = _f(None, "W&B group")
    tags: list = _f([], "W&B tags")
    log_interval: int = _f(10, "print and log metrics every N steps")
    progress: bool = _f(True, "show a progress bar (rank 0)")


@dataclass
class EvalConfig:
    tasks: list = _f(
        [],
        "lm-eval tasks scored on the live model during glm train: task names (with "
        "eval.include_path for the offline ones) or task YAML paths",
    )
    tasks_every: int = _f(
        0, "score eval.tasks every N optimizer steps (0: never); train.eval_interval stays the validation loss"
    )
    num_fewshot: Optional[int] = _f(None, "examples in each prompt (default: each task's own, usually 0)")
    limit: Optional[float] = _f(None, "documents per task (a fraction if < 1; default: all)")
    include_path: Optional[str] = _f(None, "a folder of task YAMLs (glm data eval-tasks --out DIR)")
    batch_size: int = _f(8, "requests per forward pass")
    timeout_s: float = _f(
        600.0,
        "ranks wait at most this long for each other after an evaluation (ranks with no "
        "documents wait there from the start); then the run stops naming the missing ranks",
    )


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
