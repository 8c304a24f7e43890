"""Translation (CoVe's pretraining, McCann et al. 2017): the NLL of the target sentence given the
source, teacher-forced, over a pair shard set (data_pipeline/tokenize/pairs.py).

A unit is one pair document -- its ``PAIR_TOKEN`` array, the source's tokens then the target's --
and a sample cuts each side to ``seq_len`` tokens: ``input_ids`` the source, ``decoder_input_ids``
``<bos>`` + target, ``labels`` target + ``<eos>`` (padded with -100, so padding is never scored).
Both vocabularies are ``word`` profile tokenizers, whose special ids agree. ``glm eval`` adds held-out
BLEU of greedy and beam-search translations (``checkpoint_metrics``).
"""

from __future__ import annotations

import numpy as np

from data_pipeline.tokenize.pairs import PAIR_TOKEN, TARGET
from glm_dist.objectives.base import Objective, WrongDocuments, seq2seq_loss
from glm_dist.objectives.bleu import held_out_bleu


class PairUnits:
    """One unit per pair document, as the loader's order gives them (nothing carries over): the
    document's tokens and the length each side is cut to."""

    def __init__(self, seq_len: int):
        self.seq_len = seq_len

    def units(self, docs, rng_for=None):
        for doc in docs:
            yield doc.tokens, self.seq_len

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Translation(Objective):
    pairs = True  # trains on a pair set: glm data tokenize builds it (data_pipeline/tokenize/pairs.py)

    def builder(self, *, seq_len, vocab, opts, stream=0):
        return PairUnits(seq_len)

    def check_documents(self, dtype):
        if dtype.names != PAIR_TOKEN.names:
            raise WrongDocuments(
                "data.shards_dir is not a translation pair set: build one with glm data tokenize -c "
                "CONFIG (data.source: a glm data gettext folder, data.vectors: GloVe text vectors)"
            )

    def sample(self, unit, rng, *, vocab, opts):
        pair, limit = unit
        target = pair["side"] == TARGET
        source, tgt = pair["token"][~target].astype(np.int64), pair["token"][target].astype(np.int64)
        bos, eos = vocab.id("bos"), vocab.id("eos")
        return {
            "input_ids": source[:limit],
            "decoder_input_ids": np.concatenate([[bos], tgt[: limit - 1]]),
            "labels": np.concatenate([tgt[: limit - 1], [eos]]),
        }

    def loss(self, model, batch, *, metrics):
        return seq2seq_loss(model, batch, metrics=metrics)

    def checkpoint_metrics(self, model, *, shards_dir, num_sequences, seq_len, device):
        return held_out_bleu(model, shards_dir, num_pairs=num_sequences, max_len=seq_len, device=device)


TRANSLATION = Translation(name="translation", salt=1040)
