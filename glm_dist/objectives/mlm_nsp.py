"""BERT's pretraining objective: masked LM + next-sentence prediction over segment pairs."""

from __future__ import annotations

from glm_dist.objectives.sentence_pairs import PAIR_SUMS, SentencePairMLM


class NextSentenceMLM(SentencePairMLM):
    swap = False


MLM_NSP = NextSentenceMLM(name="mlm_nsp", salt=1002, padded=True, sums=PAIR_SUMS)
