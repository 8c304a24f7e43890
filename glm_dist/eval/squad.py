"""SQuAD's exact match and F1, as the official evaluation script (v1.1) computes them, over a set of
predictions: each scores the best over its gold answers, the set their mean (the script reports it
x 100). The answer normalisation and the per-answer scores are the offline tasks' own
(``data_pipeline/tasks/answers.py``), so fine-tuning and zero-shot QA score alike.
"""

from __future__ import annotations

from data_pipeline.tasks.answers import exact_match as best_exact_match
from data_pipeline.tasks.answers import f1 as best_f1
from data_pipeline.tasks.answers import normalize_answer

__all__ = ["exact_match", "f1", "normalize_answer", "squad_scores"]


def exact_match(prediction: str, gold: str) -> float:
    return best_exact_match(prediction, [gold])


def f1(prediction: str, gold: str) -> float:
    return best_f1(prediction, [gold])


def squad_scores(predictions: list[str], golds: list[list[str]]) -> dict[str, float]:
    """Mean exact match and F1 (fractions) of predictions against their lists of gold answers."""
    n = max(1, len(predictions))
    return {
        "exact_match": sum(best_exact_match(p, gs) for p, gs in zip(predictions, golds)) / n,
        "f1": sum(best_f1(p, gs) for p, gs in zip(predictions, golds)) / n,
    }
