"""The typed config tree. Field docstrings (``help`` metadata) double as ``--help`` text.

Every section is a dataclass; the loader (``loader.py``) builds them strictly from YAML, so an
unknown key or a wrong type is an error naming the key and the file that set it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


def _f(default, help: str, **kw):
    """A dataclass field whose ``help`` is shown by ``glm config show --help-keys``."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class ModelConfig:
    family: str = _f("gpt", "model family in the registry (gpt)")
    flavor: str = _f("tiny", "named size of the family (tiny, gpt2-small, gpt3-175b, ...)")
    n_layer: Optional[int] = _f(None, "override the flavor's number of blocks")
    n_head: Optional[int] = _f(None, "override the flavor's attention heads")
    d_model: Optional[int] = _f(None, "override the flavor's hidden width")
    d_ff: Optional[int] = _f(None, "override the flavor's FFN width (default 4*d_model)")
    vocab_size: Optional[int] = _f(None, "override the flavor's vocabulary size")
    context_length: Optional[int] = _f(None, "override the flavor's context length")
    dropout: float = _f(0.0, "dropout on embeddings, attention output and MLP output")
    sparse_window: Optional[int] = _f(
        None, "GPT-3 sparse option: odd layers attend to a local causal band of this many tokens")


@dataclass
class DataConfig:
    source: str = _f("embedded", "'embedded' (pydoc text of the stdlib) or a JSONL/text path or glob")
    text_field: str = _f("text", "JSONL field holding the document text")
    shards_dir: str = _f("data/embedded-gpt2", "where the tokenizer, shards and manifest.json live")
    tokenizer: str = _f("train", "'train' a tokenizer of data.tokenizer_profile on the source, or a tokenizer.json path")
    tokenizer_profile: str = _f("gpt2", "gpt2 | roberta (also BART) | bert (also ELECTRA) | albert | t5 | xlnet: "
                                        "the kind (byte BPE / WordPiece / Unigram) and special tokens")
    vocab_size: int = _f(8192, "vocabulary size when training the tokenizer")
    val_per_mille: int = _f(50, "documents held out for validation, per thousand (by document hash)")
    seq_len: Optional[int] = _f(None, "training sequence length (default: model context length)")
    shard_max_bytes: int = _f(64 * 2**20, "approximate size of one shard")
    encode_workers: int = _f(0, "local processes encoding input files in parallel (0: one per core)")
    shuffle_window: int = _f(4, "shuffle buffer: documents of this many shards are shuffled together")
    num_workers: int = _f(0, "dataloader worker processes building batches ahead (0: in the training process)")


@dataclass
class ObjectiveConfig:
    name: Literal["clm", "mlm", "mlm_nsp", "sop", "span_corruption", "denoising", "electra", "plm"] = _f(
        "clm", "clm (GPT) | mlm (RoBERTa) | mlm_nsp (BERT) | sop (ALBERT) | span_corruption (T5) | "
               "denoising (BART) | electra | plm (XLNet)")
    mask_rate: float = _f(0.15, "MLM / ELECTRA: fraction of tokens selected for prediction")
    mask_frac: float = _f(0.8, "MLM: of the selected, fraction replaced by the mask token")
    random_frac: float = _f(0.1, "MLM: of the selected, fraction replaced by a random token")
    whole_word: bool = _f(False, "MLM: mask all pieces of a word together")
    max_ngram: int = _f(1, "MLM: mask spans of up to n words, p(n) ~ 1/n (ALBERT: 3; sop implies 3)")
    noise_density: float = _f(0.15, "T5: fraction of tokens in noise spans")
    mean_span: float = _f(3.0, "T5: mean noise span length")
    mask_ratio: float = _f(0.3, "BART: fraction of tokens masked by text infilling")
    poisson_lambda: float = _f(3.0, "BART: mean span length of text infilling")
    permute_sentences: bool = _f(True, "BART: permute all sentences")
    random_ratio: float = _f(0.0, "BART: fraction of mask tokens replaced by random tokens")


@dataclass
class TrainConfig:
    out_dir: str = _f("runs/gpt2-tiny", "run directory: checkpoints, metrics, plots, W&B files")
    seed: int = _f(1234, "seed of the data order and of model init")
    max_steps: int = _f(300, "optimizer steps to train")
    micro_batch_size: int = _f(8, "sequences per rank per forward pass")
    grad_accum_steps: int = _f(1, "micro batches per optimizer step")
    global_batch_size: Optional[int] = _f(
        None, "optional check: must equal micro_batch_size * grad_accum_steps * data-parallel size")
    lr: float = _f(6e-4, "peak learning rate")
    min_lr_ratio: float = _f(0.1, "final LR as a fraction of the peak")
    warmup_steps: int = _f(30, "linear warmup steps")
    schedule: Literal["cosine", "linear", "constant", "inverse_sqrt"] = _f(
        "cosine", "decay after warmup; inverse_sqrt (T5): lr / sqrt(max(step, warmup_steps)), constant during warmup")
    optimizer: Literal["adamw", "lamb", "adafactor"] = _f(
        "adamw", "adamw (fused) | lamb (ALBERT's recipe) | adafactor (T5's recipe, torch.optim.Adafactor)")
    weight_decay: float = _f(0.1, "AdamW decay on matrices and embeddings (not biases or norms)")
    beta1: float = _f(0.9, "AdamW beta1")
    beta2: float = _f(0.95, "AdamW beta2")
    eps: float = _f(1e-8, "AdamW epsilon")
    grad_clip: float = _f(1.0, "clip the global gradient norm (0 disables)")
    precision: Literal["fp32", "bf16", "bf16-autocast"] = _f(
        "fp32", "fp32; bf16 = DeepSpeed bf16 (bf16 weights, fp32 master); bf16-autocast = torch.autocast")
    activation_checkpointing: bool = _f(False, "recompute each block in the backward pass")
    eval_interval: int = _f(100, "validate every N steps (0: only before and after)")
    eval_batches: int = _f(20, "validation batches (micro_batch_size sequences each, per rank)")
    save_interval: int = _f(0, "checkpoint every N steps (0: only at the end)")
    keep_last: int = _f(3, "keep the newest N checkpoints (older ones are deleted after a save)")
    init: Literal["whole", "local"] = _f(
        "whole", "'whole': every rank builds the whole model from the seed and keeps its part (pipelined runs "
        "start exactly as one process); 'local': a pipeline stage builds and initialises only its own layers, "
        "each parameter from its own seeded generator (sizes whose whole model does not fit a host)")
    universal_checkpoint: bool = _f(True, "also save each checkpoint in universal form (whole fp32 weights and "
                                    "optimizer moments per parameter, +12 bytes/param on disk) so it resumes on any layout")
    keep_every: int = _f(0, "also keep every checkpoint whose step is a multiple of M (0: none)")
    stop_signals: list = _f(["SIGUSR1", "SIGTERM"], "on these signals: finish the step, checkpoint, "
                            "exit 75 (SLURM's --signal / preemption; slurm/train.sbatch requeues)")
    stop_at_step: Optional[int] = _f(
        None, "checkpoint and exit once this step is reached (the schedule still runs to max_steps); "
              "for jobs cut into time slots -- rerun the same command to continue")
    resume: str = _f("auto", "'auto' (latest checkpoint in out_dir), 'none', or a checkpoint dir")
    max_skipped_steps: int = _f(10, "stop after this many steps with a non-finite loss")
    plot: bool = _f(True, "write loss_curve.png in out_dir at the end")


@dataclass
class ParallelConfig:
    zero_stage: int = _f(0, "DeepSpeed ZeRO stage 0-3")
    offload_optimizer: bool = _f(False, "ZeRO-Offload: optimizer state on the CPU (stage >= 1)")
    offload_params: bool = _f(False, "ZeRO-Infinity: parameters on the CPU too (stage 3)")
    pipeline_stages: int = _f(1, "pipeline-parallel size (model depth split into this many stages)")
    pipeline_partition: Literal["blocks", "parameters"] = _f(
        "blocks", "cut stages at equal numbers of transformer blocks, or at balanced parameter counts")
    tensor_parallel: int = _f(1, "tensor-parallel size (attention heads and FFN width split across ranks)")
    gpus_per_node: Optional[int] = _f(None, "for layout checks and glm plan: ranks per node (tensor parallelism stays inside a node)")


@dataclass
class LoggingConfig:
    wandb: bool = _f(True, "log to Weights & Biases (rank 0)")
    wandb_mode: Literal["offline", "online", "disabled", "auto"] = _f(
        "auto", "'auto' is online when WANDB_API_KEY is set, otherwise offline")
    project: str = _f("glm-dist", "W&B project")
    entity: Optional[str] = _f(None, "W&B entity")
    run_name: Optional[str] = _f(None, "W&B run name (default: the out_dir's name)")
    group: Optional[str] = _f(None, "W&B group")
    tags: list = _f([], "W&B tags")
    log_interval: int = _f(10, "print and log metrics every N steps")
    progress: bool = _f(True, "show a progress bar (rank 0)")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
