"""XLNet's permutation language modelling: ~1/6 of each segment predicted in a random
factorisation order, through the query stream.

Two layouts (``objective.plm_layout``):
- ``collator`` (default; transformers' DataCollatorForPermutationLanguageModeling): blocks of
  ``seq_len`` tokens, one permutation each (``permutation_lm.plm_inputs``).
- ``paper`` (zihangdai/xlnet data_utils.py): each segment is the ``reuse_len`` tokens that continue
  the stream -- which the next segment keeps as memory -- then sentences A and B (B the text that
  follows A, or with p = 0.5 text from the previous document) as ``A <sep> B <sep> <cls>`` with
  segment ids 0 / 1 / 2; the two parts are permuted separately
  (``permutation_lm.two_part_inputs``), and the stream advances by ``reuse_len``. With
  ``model.bi_data`` every odd stream reads its documents backwards, and each micro batch puts its
  forward rows first, as the model's relative positions expect.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Iterator, Literal

import numpy as np

from glm_dist.objectives.base import IGNORE_INDEX, Objective, option, token_sums
from glm_dist.objectives.clm import TokenPacker
from glm_dist.objectives.permutation_lm import plm_inputs, two_part_inputs
from glm_dist.ops.cross_entropy import cross_entropy

MODEL_INPUTS = ("perm_mask", "target_mapping", "token_type_ids", "attention_mask", "mems")
RANDOM_B = 0.5


@dataclass(frozen=True)
class PLMOptions:
    """The key of ``plm`` under ``objective:``."""

    plm_layout: Literal["collator", "paper"] = option(
        "collator",
        "'collator' = one permuted block per row (transformers' collator); 'paper' = the paper's "
        "segments (model.reuse_len continued tokens, then A <sep> B <sep> <cls>, parts permuted "
        "separately; needs model.mem_len and model.reuse_len)",
    )


@dataclass(frozen=True)
class SegmentOptions(PLMOptions):
    """What the builder reads: the layout, and the segment memory the XLNet model config fixes."""

    reuse_len: int = 0  # model.reuse_len: the tokens of a segment the next one keeps as memory
    bi_data: bool = False  # model.bi_data: odd streams read backwards


class PaperSegments:
    """One stream of XLNet's pretraining segments (the ``paper`` layout)."""

    def __init__(self, seq_len: int, reuse_len: int, *, sep_id: int, cls_id: int, backward: bool = False):
        self.seq_len, self.reuse, self.sep, self.cls, self.backward = seq_len, reuse_len, sep_id, cls_id, backward
        self.tail = np.zeros(0, dtype=np.int64)  # the stream's tokens not yet passed by
        self.starts = np.zeros(0, dtype=bool)  # whether each of them starts a sentence
        self.previous = np.zeros(0, dtype=np.int64)  # the last document read (B's random text)
        self.count = 0

    def units(self, docs: Iterable, rng_for: Callable[[int], np.random.Generator]) -> Iterator:
        docs = iter(docs)
        while True:
            while len(self.tail) < self.seq_len:
                self._push(next(docs))
            rng = rng_for(self.count)
            self.count += 1
            yield self._segment(rng)

    def _push(self, doc) -> None:
        tokens = doc.tokens.astype(np.int64)
        n = len(tokens)
        bounds = [int(b) for b in doc.sentences if 0 <= b < n]
        if self.backward:  # sentence [s_k, s_k+1) read backwards starts at n - s_k+1
            tokens, bounds = tokens[::-1].copy(), [n - b for b in bounds[1:]] + [0]
        starts = np.zeros(n, dtype=bool)
        starts[[b for b in bounds if b < n]] = True
        starts[:1] = True
        self.previous = tokens
        self.tail, self.starts = np.concatenate([self.tail, tokens]), np.concatenate([self.starts, starts])

    def _segment(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        r, room = self.reuse, self.seq_len - self.reuse - 3  # 3: <sep> <sep> <cls>
        region = self.tail[r : r + room]
        cuts = np.flatnonzero(self.starts[r + 1 : r + room]) + 1  # A ends where a sentence starts
        cut = int(rng.choice(cuts)) if len(cuts) else int(rng.integers(1, room))
        b = region[cut:]
        if rng.random() < RANDOM_B and len(self.previous) >= room - cut:
            start = int(rng.integers(0, len(self.previous) - (room - cut) + 1))
            b = self.previous[start : start + room - cut]
        tokens = np.concatenate([self.tail[:r], region[:cut], [self.sep], b, [self.sep], [self.cls]])
        segments = np.concatenate([np.zeros(r + cut + 1, dtype=np.int64), np.ones(len(b) + 1, dtype=np.int64), [2]])
        self.tail, self.starts = self.tail[r:], self.starts[r:]  # the next segment reuses what follows
        return tokens, segments

    def state_dict(self) -> dict:
        return {
            "tail": self.tail.tolist(),
            "starts": self.starts.astype(int).tolist(),
            "previous": self.previous.tolist(),
            "count": self.count,
        }

    def load_state_dict(self, state: dict) -> None:
        self.tail = np.asarray(state["tail"], dtype=np.int64)
        self.starts = np.asarray(state["starts"], dtype=bool)
        self.previous = np.asarray(state["previous"], dtype=np.int64)
        self.count = state["count"]


class PermutationLM(Objective):
    """The loss over the predicted positions only (partial prediction, K = 6). With a memory
    (``mem_len`` > 0) the batch carries each row's memory in ``mems`` and the new one comes back in
    the sums (the trainer keeps them per stream)."""

    Options = PLMOptions

    def options(self, own=None, model_cfg=None) -> SegmentOptions:
        """The layout, with the XLNet model config's ``reuse_len`` and ``bi_data``."""
        memory = (
            {} if model_cfg is None else {"reuse_len": model_cfg.reuse_len or 0, "bi_data": bool(model_cfg.bi_data)}
        )
        return SegmentOptions(**asdict(own or PLMOptions()), **memory)

    def backward_streams(self, opts) -> bool:
        return opts.bi_data

    def builder(self, *, seq_len, vocab, opts, stream=0):
        if opts.plm_layout == "paper":
            return PaperSegments(
                seq_len,
                opts.reuse_len,
                sep_id=vocab.id("sep"),
                cls_id=vocab.id("cls"),
                backward=self.backward_streams(opts) and stream % 2 == 1,
            )
        return TokenPacker(seq_len, sep=vocab.id("eot"))

    def sample(self, unit, rng, *, vocab, opts):
        if opts.plm_layout == "paper":
            tokens, segments = unit
            return two_part_inputs(tokens, segments, opts.reuse_len, rng, special_ids=vocab.specials)
        return plm_inputs(unit, rng, special_ids=vocab.specials)

    def loss(self, model, batch, *, metrics):
        out = model(batch["input_ids"], **{k: batch[k] for k in MODEL_INPUTS if batch.get(k) is not None})
        logits, targets = out["logits"].flatten(0, 1), batch["target_labels"].flatten()  # (B*K, V), (B*K,)
        # fp32 a chunk at a time; inside row_groups it also sums per source (a mixture's per-source loss)
        nll = cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
        loss = nll / (targets != IGNORE_INDEX).sum().clamp(min=1)
        sums = token_sums(nll, logits, targets) if metrics else {}
        if out.get("mems") is not None:
            sums["mems"] = out["mems"]
        return loss, sums


PLM = PermutationLM(name="plm", salt=1007)
