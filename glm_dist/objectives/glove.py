"""GloVe's weighted least squares over co-occurrence triples (Pennington et al. 2014):

    J = sum_ij f(X_ij) (w_i . w~_j + b_i + b~_j - log X_ij)^2,   f(x) = min(1, (x / x_max)^0.75), x_max = 100

The shard set is a count set (``glm data cooccur``): each "document" is a block of (word, context,
count) triples. The builder takes the blocks in the loader's global order (shards shuffled per
epoch, blocks shuffled within the shuffle window), permutes each block's triples with the RNG of
its sample number, and cuts samples of ``seq_len`` triples; its state is the triples not yet
emitted, so a resumed run sees exactly the batches it would have seen. The loss is the mean over a
batch's triples: AdaGrad (the paper's optimizer, ``train.optimizer=adagrad``) is invariant to that
scale, and a mean keeps the step the same at any data-parallel size.
"""

from __future__ import annotations

import numpy as np
import torch

from data_pipeline.cooccur import TRIPLE
from glm_dist.errors import GlmError
from glm_dist.objectives.base import Objective

X_MAX, ALPHA = 100.0, 0.75
FIELDS = TRIPLE.names


class NotCountShards(GlmError, ValueError):
    """The shard set holds token documents, not co-occurrence counts."""


def weight(counts: torch.Tensor) -> torch.Tensor:
    """f(x) = min(1, (x / x_max)^alpha); 0 for a padded (zero) count."""
    return (counts / X_MAX).clamp(min=0.0).pow(ALPHA).clamp(max=1.0)


def weighted_squares(pred: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """f(X) (pred - log X)^2 per triple, in fp32 (a zero count weighs 0)."""
    counts = counts.float()
    return weight(counts) * (pred.float() - counts.clamp(min=1e-30).log()) ** 2


class TripleStream:
    """Count blocks -> samples of ``size`` triples (see the module docstring)."""

    def __init__(self, size: int):
        self.size, self.blocks = size, 0  # blocks: count blocks taken so far (keys their permutation)
        # the triples (as the loader plans them: their addresses) not yet emitted
        self.tail = np.zeros(0, dtype=np.int64)

    def units(self, docs, rng_for):
        docs = iter(docs)
        while True:
            while len(self.tail) < self.size:
                block = next(docs).tokens
                self.tail = np.concatenate([self.tail, block[rng_for(self.blocks).permutation(len(block))]])
                self.blocks += 1
            unit, self.tail = self.tail[: self.size], self.tail[self.size :]  # advance before yielding: exact state
            yield unit

    def state_dict(self) -> dict:
        return {"blocks": self.blocks, "tail": self.tail.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.blocks, self.tail = state["blocks"], np.asarray(state["tail"], dtype=np.int64)


class GloVeObjective(Objective):
    counts = True  # trains on a count set: glm data tokenize builds it (glm data cooccur)

    def builder(self, *, seq_len, vocab, opts, stream=0):
        return TripleStream(seq_len)

    def check_documents(self, dtype):
        if dtype.names != FIELDS:
            raise NotCountShards(
                "data.shards_dir holds token documents, not co-occurrence counts: build the "
                "count set with glm data cooccur -c CONFIG (into an empty data.shards_dir)"
            )

    def sample(self, unit, rng, *, vocab, opts):
        if unit.dtype.names != FIELDS:
            raise NotCountShards(
                "data.shards_dir holds token documents, not co-occurrence counts: build the count "
                "set with glm data cooccur -c CONFIG (into an empty data.shards_dir)"
            )
        return {
            "word_ids": unit["word"].astype(np.int64),
            "context_ids": unit["context"].astype(np.int64),
            "counts": unit["count"],
        }

    def loss(self, model, batch, *, metrics):
        squares = weighted_squares(model(batch["word_ids"], batch["context_ids"]), batch["counts"])
        real = batch["counts"] > 0
        loss = squares.sum() / real.sum().clamp(min=1)
        if not metrics:
            return loss, {}
        return loss, {"cost": squares.sum().item(), "triples": int(real.sum())}

    def report(self, totals):
        """The weighted squared error per triple (GloVe's cost); no perplexity to speak of."""
        return {"loss": totals["cost"] / max(totals["triples"], 1), "tokens": int(totals["triples"])}


GLOVE = GloVeObjective(name="glove", salt=1020, sums=("cost", "triples"))
