"""Cross-View Training (Clark et al. 2018): supervised tagging on labelled minibatches, and on
unlabelled ones auxiliary modules with restricted views learning to match the primary modules.

The shard set is a tagging set (``glm data tagging``; data_pipeline/tasks/tagging_shards.py): one
sentence per document, each word a (token, tag, task) record. A sample is ``<bos> words <eos>``
with the words' characters (``char_ids``, for the character CNN) and ``word_mask``; a labelled
one also has ``labels`` (one tag space over the tasks; -100 at the marks) and ``task``.
The loader (glm_dist/data/alternating.py) deals whole minibatches from one split at a time:
labelled and unlabelled alternately, a labelled step's task drawn at random.

- Labelled minibatch: cross-entropy of each row's task's primary module over its words, with the
  authors' label smoothing (0.1), averaged over the words; it trains the encoder and that module.
- Unlabelled minibatch: the primary modules, run with dropout off and without gradients, give soft
  targets p (smoothed alike); every task's four auxiliary modules (``student``: dropout on) minimise
  KL(p || q_view) averaged over the words, summed over views and tasks. Gradients reach the
  auxiliary modules and the encoder, never a primary module (no graph runs through them).

Tags of a task are numbered ``O`` = 0, ``B-r`` = 2r + 1, ``I-r`` = 2r + 2. Evaluation reports the
token NLL and accuracy and, per task, span-level precision / recall / F1 of the primary module's
argmax tags (conlleval's chunk rules, as ``seqeval``'s default mode): ``f1`` is task 0's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from data_pipeline.tokenize.word import char_table
from glm_dist.objectives.base import IGNORE_INDEX, Objective, WrongDocuments, option

LABEL_SMOOTHING = 0.1  # cvt_text's label_smoothing, on the gold tags and on the teacher's targets
MAX_TASKS = 4  # tasks whose spans evaluation counts
FIELDS = ("token", "tag", "task")
NOT_TAGGED = (
    "data.shards_dir does not hold a tagging shard set (sentences of (token, tag, task) records): build "
    "one with glm data tagging -c CONFIG"
)


@dataclass(frozen=True)
class CrossViewOptions:
    """The key of ``cvt`` and ``cvt_translation`` under ``objective:``."""

    cvt_unlabelled: bool = option(
        True, "alternate labelled and unlabelled minibatches (false: labelled only, the supervised baseline)"
    )


@dataclass(frozen=True)
class TaggingOptions(CrossViewOptions):
    """What the loader reads: the options, and the CVT model config's tags per task (checked
    against the tagging shard set's tasks)."""

    tag_counts: tuple = ()  # model.tags


_TABLES: dict[int, tuple[list, np.ndarray]] = {}  # id of a vocabulary's word list -> (the list, its characters)


def chars_of(vocab) -> np.ndarray | None:
    """(V, 50) character ids of every token id (None: the tokenizer lists no words), once per word
    list: the labelled, unlabelled and validation loaders each hold one."""
    words = vocab.ids.get("words")
    if words is None:
        return None
    if _TABLES.get(id(words), (None,))[0] is not words:
        _TABLES[id(words)] = (
            words,
            char_table(words, pad=vocab.ids.get("pad"), bos=vocab.ids.get("bos"), eos=vocab.ids.get("eos")),
        )
    return _TABLES[id(words)][1]


class Sentences:
    """One unit per document (a sentence), cut to ``max_words``; stateless."""

    def __init__(self, max_words: int):
        self.max_words = max_words

    def units(self, docs, rng_for=None):
        for doc in docs:
            if len(doc.tokens):
                yield doc.tokens[: self.max_words]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def spans(tags: list[int]) -> set[tuple[int, int, int]]:
    """(role, first, end) chunks of one sentence's tag ids (O = 0, B-r = 2r + 1, I-r = 2r + 2): a
    chunk starts at a B, or at an I whose role differs from the open chunk's (conlleval's rules)."""
    out, role, first = set(), None, 0
    for i, tag in enumerate([*tags, 0]):
        r, begin = ((tag - 1) // 2, (tag - 1) % 2 == 0) if tag > 0 else (None, False)
        if role is not None and (r != role or begin):
            out.add((role, first, i))
            role = None
        if r is not None and role is None:
            role, first = r, i
    return out


def span_counts(pred: torch.Tensor, gold: torch.Tensor) -> tuple[int, int, int]:
    """(true positive, predicted, gold) chunks of (B, T) local tag ids, -100 where not scored."""
    tp = npred = ngold = 0
    for p_row, g_row in zip(pred.tolist(), gold.tolist()):
        keep = [i for i, g in enumerate(g_row) if g != IGNORE_INDEX]
        p, g = spans([p_row[i] for i in keep]), spans([g_row[i] for i in keep])
        tp, npred, ngold = tp + len(p & g), npred + len(p), ngold + len(g)
    return tp, npred, ngold


def task_targets(labels: torch.Tensor, task: torch.Tensor, logits: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per task, its rows' labels in its own tag numbering, -100 elsewhere (no host sync)."""
    out, offset = [], 0
    for k, lg in enumerate(logits):
        mine = (task[:, None] == k) & (labels != IGNORE_INDEX)
        out.append(torch.where(mine, labels - offset, IGNORE_INDEX))
        offset += lg.size(-1)
    return out


def soft_targets(logits: torch.Tensor) -> torch.Tensor:
    n = logits.size(-1)
    return F.softmax(logits.float(), dim=-1) * (1 - LABEL_SMOOTHING) + LABEL_SMOOTHING / n


class CrossViewTraining(Objective):
    loader = "glm_dist.data.alternating:AlternatingLoader"  # labelled and unlabelled minibatches in turn
    Options = CrossViewOptions

    def options(self, own=None, model_cfg=None) -> TaggingOptions:
        """The options, with the CVT model config's tags per task."""
        tags = {} if model_cfg is None else {"tag_counts": tuple(model_cfg.tags)}
        return TaggingOptions(**asdict(own or CrossViewOptions()), **tags)

    def builder(self, *, seq_len, vocab, opts, stream=0):
        return Sentences(seq_len - 2)

    def check_documents(self, dtype):
        if dtype.names != FIELDS:
            raise WrongDocuments(NOT_TAGGED)

    def sample(self, unit, rng, *, vocab, opts):
        if unit.dtype.names != FIELDS:
            raise WrongDocuments(NOT_TAGGED)
        ids = np.concatenate([[vocab.id("bos")], unit["token"].astype(np.int64), [vocab.id("eos")]])
        out = {"input_ids": ids, "word_mask": np.concatenate([[0], np.ones(len(unit), np.int64), [0]])}
        chars = chars_of(vocab)
        if chars is not None:
            out["char_ids"] = chars[ids]
        if unit["task"][0] >= 0:
            out["labels"] = np.concatenate([[IGNORE_INDEX], unit["tag"].astype(np.int64), [IGNORE_INDEX]])
            out["task"] = np.int64(unit["task"][0])
        return out

    def loss(self, model, batch, *, metrics):
        kw = dict(char_ids=batch.get("char_ids"), attention_mask=batch.get("attention_mask"))
        if "labels" not in batch:
            return self._consistency(model, batch, kw), {}
        logits = model(batch["input_ids"], mode="supervised", **kw)["primary"]
        targets = task_targets(batch["labels"], batch["task"], logits)
        count = (batch["labels"] != IGNORE_INDEX).sum()
        smoothed = sum(
            F.cross_entropy(
                lg.float().flatten(0, 1),
                t.flatten(),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
                label_smoothing=LABEL_SMOOTHING,
            )
            for lg, t in zip(logits, targets)
        )
        loss = smoothed / count.clamp(min=1)
        if not metrics:
            return loss, {}
        sums = {
            "nll": sum(
                F.cross_entropy(lg.float().flatten(0, 1), t.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
                for lg, t in zip(logits, targets)
            ).item(),
            "targets": int(count),
            "correct": 0,
        }
        for k, (lg, t) in enumerate(zip(logits, targets)):
            pred = lg.argmax(-1)
            sums["correct"] += int(((pred == t) & (t != IGNORE_INDEX)).sum())
            if k < MAX_TASKS:
                sums[f"tp{k}"], sums[f"pred{k}"], sums[f"gold{k}"] = span_counts(pred, t)
        return loss, sums

    def _consistency(self, model, batch, kw) -> torch.Tensor:
        """Sum over tasks and views of the mean KL(teacher || auxiliary view) over the words."""
        with torch.no_grad():  # the primary modules' soft targets: a constant for the student
            teachers = [soft_targets(lg) for lg in model(batch["input_ids"], mode="teacher", **kw)["primary"]]
        students = model(batch["input_ids"], mode="student", **kw)["auxiliary"]
        words = batch["word_mask"].float()
        loss = words.new_zeros(())
        for p, views in zip(teachers, students):
            for q in views.values():
                kl = (p * (p.log() - F.log_softmax(q.float(), dim=-1))).sum(-1)  # (B, T)
                loss = loss + (kl * words).sum() / words.sum().clamp(min=1)
        return loss

    def report(self, totals):
        """Token loss / perplexity / accuracy over the labelled held-out words, and per task span
        precision, recall and F1 (``f1`` = task 0's; ``f1_task<k>`` for the others)."""
        n = max(totals["targets"], 1)
        out = {
            "loss": totals["nll"] / n,
            "perplexity": math.exp(min(totals["nll"] / n, 50)),
            "accuracy": totals["correct"] / n,
            "tokens": int(totals["targets"]),
        }
        for k in range(MAX_TASKS):
            tp, pred, gold = totals[f"tp{k}"], totals[f"pred{k}"], totals[f"gold{k}"]
            if not gold and not pred:
                continue
            p, r = tp / max(pred, 1), tp / max(gold, 1)
            suffix = "" if k == 0 else f"_task{k}"
            out.update({f"precision{suffix}": p, f"recall{suffix}": r, f"f1{suffix}": 2 * p * r / max(p + r, 1e-12)})
        return out


CVT = CrossViewTraining(
    name="cvt",
    salt=1050,
    sums=("nll", "targets", "correct", *(f"{s}{k}" for k in range(MAX_TASKS) for s in ("tp", "pred", "gold"))),
)
