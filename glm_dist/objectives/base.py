"""What every objective is: one object per file under ``objectives/`` (docs/architecture.md, decision 10).

An objective turns the document stream into units (``builder``: stateful, deterministic, run by
every rank over the global order), a unit into a sample (``sample``: noised with an RNG keyed by
(seed, ``salt``, epoch, sample number), only for the rank's own samples), a batch into a loss
(``loss``: the model's forward and the loss, with metric sums when evaluating), sums into
evaluation metrics (``report``), and a batch into what a pipeline's first stage takes and its
last stage scores (``stage_inputs`` / ``stage_loss``). ``stream`` numbers a builder when the
loader deals the batch as parallel streams (one builder each).

An objective owns its options: ``Options`` is a dataclass in its own file whose fields are the keys
a config sets under ``objective:`` beside ``name`` (each with its help and its interval), and
``options(...)`` is what its builder and samples read as ``opts`` -- those keys, plus what its data
takes from the model config (XLNet's segment memory, CVT's tags), which the caller passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Iterator, Protocol

import numpy as np
import torch

from glm_dist.errors import GlmError
from glm_dist.ops.cross_entropy import IGNORE_INDEX, cross_entropy, predicted


def option(default: Any, help: str, *, bounds: str | None = None) -> Any:
    """A field of an objective's options: a key set under ``objective:``. ``help`` is shown by
    ``glm config keys``; ``bounds`` is its interval (glm_common/config_bounds.py's notation),
    checked when the config loads."""
    return field(default=default, metadata={"help": help} | ({"bounds": bounds} if bounds else {}))


@dataclass(frozen=True)
class NoOptions:
    """The options of an objective that has none of its own."""


@dataclass
class Vocab:
    """What objectives need from the tokenizer (manifest ``special_ids`` + derived tables)."""

    size: int
    ids: dict
    word_starts: np.ndarray | None = None

    @property
    def specials(self) -> np.ndarray:
        return np.asarray(self.ids["all_specials"])

    def id(self, role: str) -> int:
        if self.ids.get(role) is None:
            raise ValueError(
                f"this tokenizer has no {role!r} token; use a tokenizer profile that has one (data.tokenizer_profile)"
            )
        return self.ids[role]


class WrongDocuments(GlmError, ValueError):
    """The shard set holds documents of another kind than the objective reads."""


class Builder(Protocol):
    """Documents -> units: the objective's one unit rule, with an exact ``state_dict``. The loader
    plans with it (data/plan.py): it runs over documents whose tokens are token *addresses*, so it
    must only slice, concatenate, reverse and permute tokens and insert special tokens -- never
    look at their values."""

    def units(self, docs: Iterable, rng_for: Callable[[int], np.random.Generator]) -> Iterator: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass(frozen=True)
class Objective:
    name: str
    salt: int  # the RNG stream of this objective's noise: fixed forever, or resumed runs change
    padded: bool = False  # samples right-padded to seq_len (fixed shapes)
    sums: tuple[str, ...] = ("nll", "targets", "correct")  # what ``loss(metrics=True)`` adds up
    # what ``glm data tokenize`` writes for it: token shards, or a translation pair set, or co-occurrence counts
    pairs: ClassVar[bool] = False
    counts: ClassVar[bool] = False
    Options: ClassVar[type] = NoOptions  # its keys under ``objective:`` (a frozen dataclass of ``option`` fields)
    loader: ClassVar[str | None] = None  # "module:Class" of its own batch schedule (CVT's alternating loader)

    def options(self, own=None, model_cfg=None):
        """What the builder and ``sample`` read as ``opts``: the config's options of this objective
        (``own``, an ``Options``; None: the defaults), with what its data takes from ``model_cfg``
        (the built model config of a family it trains; None: nothing)."""
        return own if own is not None else self.Options()

    def needs_word_starts(self, opts) -> bool:
        """Whether ``Vocab.word_starts`` must be loaded (whole-word masking)."""
        return False

    def backward_streams(self, opts) -> bool:
        """Whether odd streams read their documents backwards (the loader puts forward rows first)."""
        return False

    def builder(self, *, seq_len: int, vocab: Vocab, opts, stream: int = 0) -> Builder:
        raise NotImplementedError

    def check_documents(self, dtype: np.dtype) -> None:
        """Refuse a shard set whose documents this objective cannot read (``dtype``: their tokens')."""
        if dtype.names is not None:
            raise WrongDocuments(
                f"data.shards_dir holds records ({', '.join(dtype.names)}), not token documents: "
                f"point it at a token shard set (glm data tokenize -c CONFIG)"
            )

    def refuse_model(self, model_cfg) -> str | None:
        """Why this objective cannot train a model of this config (None: it can); validation says it."""
        return None

    def sample(self, unit, rng: np.random.Generator, *, vocab: Vocab, opts) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def loss(self, model: Callable, batch: dict[str, torch.Tensor], *, metrics: bool) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def report(self, totals: dict[str, float]) -> dict[str, float]:
        """Loss and perplexity over the predicted tokens, and their accuracy."""
        out = token_report(totals)
        out["accuracy"] = totals["correct"] / max(totals["targets"], 1)
        return out

    def checkpoint_metrics(self, model, *, shards_dir: str, num_sequences: int, seq_len: int, device) -> dict:
        """What ``glm eval`` reports beside the validation sums, from the whole model (translation:
        held-out BLEU of decoded sentences); ``num_sequences`` as many as the validation batches hold."""
        return {}

    def stage_inputs(self, batch: dict[str, torch.Tensor], device) -> tuple:
        raise NotImplementedError(f"objective {self.name} does not run in a pipeline")

    def stage_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"objective {self.name} does not run in a pipeline")


def token_report(totals: dict[str, float]) -> dict[str, float]:
    loss = totals["nll"] / max(totals["targets"], 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50)), "tokens": int(totals["targets"])}


def selected_nll(
    logits: torch.Tensor, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed NLL over the predicted positions in fp32, its count, their logits (N, V), their
    targets (N,) with -100 where padded). MLM-style batches list the positions
    (``masked_positions``): those rows are gathered and only they are scored, with no
    device-to-host sync; others score every labelled position. The fp32 softmax exists a chunk of
    rows at a time (ops/cross_entropy.py)."""
    if "masked_positions" in batch:
        positions = batch["masked_positions"]  # (B, K), padded with 0 where masked_labels is -100
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
        picked, targets = logits[rows, positions].flatten(0, 1), batch["masked_labels"].flatten()  # (B*K, V), (B*K,)
    else:
        picked, targets = logits.flatten(0, -2), batch["labels"].flatten()
    nll = cross_entropy(picked, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return nll, (targets != IGNORE_INDEX).sum(), picked, targets


def token_sums(nll: torch.Tensor, picked: torch.Tensor, targets: torch.Tensor) -> dict:
    """Evaluation's sums of the predicted tokens (host syncs: never in a training step)."""
    real = targets != IGNORE_INDEX  # predicted: the argmax over every rank's columns under a vocabulary split
    return {"nll": nll.item(), "targets": int(real.sum()), "correct": int((predicted(picked) == targets)[real].sum())}


def masked_positions(labels: np.ndarray) -> dict[str, np.ndarray]:
    """The predicted positions and their targets as a short list, so the loss gathers those rows of
    the logits on the device without a boolean mask (which needs a device-to-host sync)."""
    positions = np.flatnonzero(labels != IGNORE_INDEX)
    return {"masked_positions": positions, "masked_labels": labels[positions]}


MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def encoder_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: batch[k] for k in MODEL_INPUTS if k in batch}


def seq2seq_loss(model: Callable, batch: dict[str, torch.Tensor], *, metrics: bool) -> tuple[torch.Tensor, dict]:
    """Encoder-decoder: cross entropy over the target tokens (T5, BART)."""
    out = model(batch["input_ids"], batch["decoder_input_ids"], attention_mask=batch.get("attention_mask"))
    nll, count, picked, targets = selected_nll(out["logits"], batch)
    return nll / count.clamp(min=1), token_sums(nll, picked, targets) if metrics else {}


def to_device(batch: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """A loader batch on the training device. To a GPU the copy is asynchronous: from pinned memory
    (the worker loader pins its batches; an in-process loader's are pinned here, from torch's
    caching host allocator), so the host goes on while the copy runs."""
    device = torch.device(device)
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: (v if v.is_pinned() else v.pin_memory()).to(device, non_blocking=True) for k, v in batch.items()}
