"""The range of every number in a training config and a crawl recipe, in one table.

A row is a dotted key and the interval its value must lie in: ``[`` / ``]`` include the bound,
``(`` / ``)`` exclude it, ``inf`` leaves a side open. Every float must be finite as well: no knob
means anything at NaN or infinity (``train.lr=inf`` would train NaN weights, a timeout of ``inf``
never fires), so that is a rule of the table rather than a column. ``None`` (an optional key left
unset, a crawl rule disabled with ``null``) is never checked. A dict-valued key (the Gopher n-gram
thresholds) has each of its values checked.

Sizes get upper bounds a few times the largest published model's -- Llama-3.1-405B: 126 layers,
128 heads, d_model 16,384; PaLM-540B: d_ff 73,728; Llama-4-Scout: a 10M context; word-level
vocabularies: GloVe 840B (CoVe's inputs) 2.2M words, word2vec GoogleNews 3M -- so that a typo is
refused with one line instead of attempting an allocation of terabytes.
``tests/faults/test_config_bounds.py`` proves every int, float and dict key of both schemas has a row.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from numbers import Real
from typing import Any, Iterator

from glm_common.config_yaml import ConfigError, source_of

LAYERS = HEADS = 1024
WIDTH = 2**16  # d_model
FFN = 2**18  # d_ff
VOCAB = 2**23
TOKENS = 2**24  # context length, sequence length, memory, spans
BATCH = 2**16  # sequences (or rows) per micro batch
MB = 2**14  # record and row-group caps, in MB: 16 GiB
COUNT = 2**53  # steps, documents, words: exact in float64 and JSON
SEED = 2**32 - 1  # what every RNG (torch, numpy, random) takes
RETRIES = 10  # backoff doubles per retry: the 10th waits 512x the first
HOUR, WEEK = 3600, 7 * 86400

BOUNDS: dict[str, str] = {
    # -- training configs: glm_dist/config/schema.py ------------------------------------------------
    "model.n_layer": f"[1, {LAYERS}]",
    "model.n_head": f"[1, {HEADS}]",
    "model.d_model": f"[1, {WIDTH}]",
    "model.d_ff": f"[1, {FFN}]",
    "model.vocab_size": f"[1, {VOCAB}]",
    "model.context_length": f"[1, {TOKENS}]",
    "model.pad_vocab_to_multiple_of": "[1, 65536]",
    "model.dropout": "[0, 1)",
    "data.max_record_mb": f"(0, {MB}]",
    "data.vocab_size": f"[2, {VOCAB}]",
    "data.target_vocab_size": f"[2, {VOCAB}]",
    "data.val_per_mille": "[0, 1000]",
    "data.seq_len": f"[2, {TOKENS}]",
    "data.shard_max_bytes": f"[1024, {2**36}]",
    "data.encode_workers": "[0, 4096]",
    "data.num_workers": "[0, 1024]",
    "data.shuffle_window": f"[1, {2**16}]",
    "data.read_gap_bytes": f"[0, {2**30}]",
    "data.read_retries": f"[0, {RETRIES}]",
    "data.read_backoff_s": f"[0, {HOUR}]",
    "data.cooccur_window": "[1, 1024]",
    "data.cooccur_blocks": f"[1, {2**16}]",
    "data.labelled_pairs": f"[0, {COUNT}]",
    "data.mixing_cap": f"[1, {COUNT}]",
    "data.mixing_temperature": "(0, 1000]",
    "data.max_epochs_warning": "(0, inf)",
    "train.seed": f"[0, {SEED}]",
    "train.max_steps": f"[1, {COUNT}]",
    "train.micro_batch_size": f"[1, {BATCH}]",
    "train.grad_accum_steps": f"[1, {2**16}]",
    "train.global_batch_size": f"[1, {COUNT}]",
    "train.lr": "(0, inf)",
    "train.min_lr_ratio": "[0, 1]",
    "train.warmup_steps": f"[0, {COUNT}]",
    "train.stlr_cut_frac": "(0, 1)",
    "train.stlr_ratio": "[1, inf)",
    "train.discriminative_lr": "[0, inf)",
    "train.adagrad_initial_accumulator": "[0, inf)",
    "train.weight_decay": "[0, inf)",
    "train.beta1": "[0, 1)",
    "train.beta2": "[0, 1)",
    "train.eps": "(0, inf)",
    "train.grad_clip": "[0, inf)",
    "train.eval_interval": f"[0, {COUNT}]",
    "train.eval_batches": f"[1, {2**20}]",
    "train.save_interval": f"[0, {COUNT}]",
    "train.keep_last": f"[0, {COUNT}]",
    "train.keep_every": f"[0, {COUNT}]",
    "train.stop_at_step": f"[1, {COUNT}]",
    "train.max_skipped_steps": f"[0, {COUNT}]",
    "parallel.zero_stage": "[0, 3]",
    "parallel.pipeline_stages": f"[1, {LAYERS}]",
    "parallel.tensor_parallel": f"[1, {HEADS}]",
    "parallel.gpus_per_node": "[1, 1024]",
    "parallel.collective_timeout_s": f"(0, {WEEK}]",
    "logging.log_interval": f"[1, {COUNT}]",
    "eval.tasks_every": f"[0, {COUNT}]",
    "eval.num_fewshot": "[0, 1024]",
    "eval.limit": f"(0, {COUNT}]",
    "eval.batch_size": f"[1, {BATCH}]",
    "eval.timeout_s": f"(0, {WEEK}]",
    # -- crawl recipes: data_pipeline/recipe.py -----------------------------------------------------
    "workers": "[0, 4096]",
    "partitions": f"[0, {2**16}]",
    "reader.max_record_mb": f"(0, {MB}]",
    "reader.max_decompression_ratio": "[1, 1000000]",
    "reader.max_row_group_mb": f"(0, {MB}]",
    "reader.http_connect_timeout_s": f"(0, {HOUR}]",
    "reader.http_read_timeout_s": f"(0, {HOUR}]",
    "reader.http_retries": f"[0, {RETRIES}]",
    "reader.max_docs_per_file": f"[1, {COUNT}]",
    "extract.max_replacement_frac": "[0, 1]",
    "language.threshold": "[0, 1]",
    "language.max_chars": f"[1, {2**30}]",
    **{
        f"gopher_repetition.{k}": "[0, 1]"
        for k in (
            "dup_line_frac",
            "dup_line_char_frac",
            "dup_para_frac",
            "dup_para_char_frac",
            "top_ngram_char_frac",
            "dup_ngram_char_frac",
        )
    },
    "gopher_quality.min_words": f"[0, {COUNT}]",
    "gopher_quality.max_words": f"[1, {COUNT}]",
    "gopher_quality.min_mean_word_length": "[0, inf)",
    "gopher_quality.max_mean_word_length": "(0, inf)",
    "gopher_quality.max_symbol_word_ratio": "[0, inf)",
    "gopher_quality.max_bullet_lines_frac": "[0, 1]",
    "gopher_quality.max_ellipsis_lines_frac": "[0, 1]",
    "gopher_quality.min_alpha_words_frac": "[0, 1]",
    "gopher_quality.min_stop_words": f"[0, {COUNT}]",
    "c4.min_words_per_line": f"[0, {COUNT}]",
    "c4.min_sentences": f"[0, {COUNT}]",
    "c4.max_word_length": f"[1, {COUNT}]",
    "fineweb.min_terminal_punct_lines_frac": "[0, 1]",
    "fineweb.short_line_chars": f"[0, {COUNT}]",
    "fineweb.max_short_lines_frac": "[0, 1]",
    "fineweb.max_dup_line_char_frac": "[0, 1]",
    "fineweb.max_newlines_per_word": "[0, inf)",
    "classifier.alpha": "(0, 1000000]",
    "classifier.seed": f"[0, {SEED}]",
    "dedup.ngram": "[1, 64]",
    "dedup.bands": "[1, 1024]",
    "dedup.rows": "[1, 1024]",
    "dedup.seed": f"[0, {SEED}]",
    "decontam.n": "[1, 64]",
    "decontam.margin_chars": f"[0, {COUNT}]",
    "decontam.min_piece_chars": f"[0, {COUNT}]",
    "decontam.max_pieces": f"[0, {COUNT}]",
    "decontam.max_doc_freq": f"[0, {COUNT}]",
    "writer.docs_per_shard": f"[1, {2**30}]",
}

_INTERVAL = re.compile(r"^([\[(])\s*(\S+),\s*(\S+)\s*([\])])$")


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    low_closed: bool
    high_closed: bool

    @classmethod
    def parse(cls, text: str) -> "Interval":
        match = _INTERVAL.match(text)
        if not match:
            raise ValueError(f"bad interval {text!r}: write [low, high] with ( or ) for an open side")
        opening, low, high, closing = match.groups()
        return cls(float(low), float(high), opening == "[", closing == "]")

    def holds(self, value: Any) -> bool:
        if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(value):
            return False
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below

    def describe(self) -> str:
        """'> 0', '>= 0 and < 1': the rule in words a user reads without interval notation."""
        sides = []
        if math.isfinite(self.low):
            sides.append(f"{'>=' if self.low_closed else '>'} {_number(self.low)}")
        if math.isfinite(self.high):
            sides.append(f"{'<=' if self.high_closed else '<'} {_number(self.high)}")
        return " and ".join(sides)


INTERVALS: dict[str, Interval] = {key: Interval.parse(text) for key, text in BOUNDS.items()}


def check_bounds(cfg: Any) -> None:
    """Raise :class:`ConfigError` for the first value of ``cfg`` (a training config or a crawl
    recipe) outside its row, naming the key, the file or command line that set it and the range.
    Rows of the other schema are skipped: their first section is not a field of ``cfg``. Fields
    that carry their interval themselves (``metadata["bounds"]``: a model family's options, which
    the table cannot name) are checked the same way."""
    for key, interval in INTERVALS.items():
        for dotted, value, default in _values(cfg, key):
            _check_value(cfg, key, dotted, value, default, interval)
    _check_field_bounds(cfg, cfg, "")


def _check_value(cfg: Any, key: str, dotted: str, value: Any, default: Any, interval: Interval) -> None:
    if value is None or interval.holds(value):
        return
    number = (
        "a number "
        if not isinstance(value, Real) or isinstance(value, bool)
        else ("a finite number " if not math.isfinite(value) else "")
    )
    example = f", e.g. {_number(default)}" if interval.holds(default) else ""
    source = source_of(cfg, dotted)
    source = source_of(cfg, key) if source == "<default>" else source  # a dict set whole
    raise ConfigError(f"{dotted}={value!r} must be {number}{interval.describe()}{example} ({source})")


def _check_field_bounds(cfg: Any, node: Any, prefix: str) -> None:
    """Every field of ``node`` with ``metadata["bounds"]``; a section's ``__extra__`` keys are named
    as the section's own (``model.mem_len``)."""
    extra = getattr(type(node), "__extra__", None)
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _check_field_bounds(cfg, value, prefix if f.name == extra else f"{prefix}{f.name}.")
        elif "bounds" in f.metadata:
            dotted = prefix + f.name
            _check_value(cfg, dotted, dotted, value, f.default, Interval.parse(f.metadata["bounds"]))


def _values(cfg: Any, key: str) -> Iterator[tuple[str, Any, Any]]:
    """(dotted key, value, its default) of ``key`` in ``cfg``; one per entry of a dict value."""
    *sections, name = key.split(".")
    if not hasattr(cfg, (sections or [name])[0]):
        return
    node = cfg
    for section in sections:
        node = getattr(node, section)
    value, default = getattr(node, name), getattr(type(node)(), name)
    if isinstance(value, dict):
        yield from ((f"{key}.{k}", v, None) for k, v in value.items())
    else:
        yield key, value, default


def _number(value: Any) -> str:
    """6e-4 as 0.0006, 2**53 as 9007199254740992: what a user can paste back."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return str(int(value))
    return repr(value)
