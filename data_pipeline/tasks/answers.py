"""Free-form answers scored as SQuAD's official script scores them (v1.1 ``evaluate-v1.1.py``):
lower case, punctuation and the articles a / an / the removed, whitespace folded; exact match of the
normalised strings, and F1 over their bags of tokens (best over the references)."""

from __future__ import annotations

import re
import string
from collections import Counter

PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def exact_match(prediction: str, references: list[str]) -> float:
    return float(any(normalize_answer(prediction) == normalize_answer(r) for r in references))


def f1(prediction: str, references: list[str]) -> float:
    def one(ref: str) -> float:
        pred, gold = normalize_answer(prediction).split(), normalize_answer(ref).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common == 0:
            return 0.0
        precision, recall = common / len(pred), common / len(gold)
        return 2 * precision * recall / (precision + recall)

    return max(one(r) for r in references)
