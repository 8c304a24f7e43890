"""ALBERT's pretraining objective: n-gram masked LM (n <= 3) + sentence-order prediction."""

from __future__ import annotations

from glm_dist.objectives.sentence_pairs import PAIR_SUMS, SentencePairMLM


class SentenceOrderMLM(SentencePairMLM):
    swap = True
    min_ngram = 3


SOP = SentenceOrderMLM(name="sop", salt=1003, padded=True, sums=PAIR_SUMS)
