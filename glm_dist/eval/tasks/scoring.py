"""Per-document scoring of the generated answers, for task YAMLs (``process_results: !function
scoring.<name>``). ``glm data eval-tasks`` copies this file beside the YAMLs that name it: lm-eval
imports a ``!function`` module from the YAML's own folder."""

from __future__ import annotations

from data_pipeline.tasks.answers import exact_match, f1
from data_pipeline.tasks.summarize import sentences

SUMMARY_SENTENCES = 3  # GPT-2 kept the first 3 generated sentences as the summary


def summary_rouge(doc: dict, results: list[str]) -> dict[str, float]:
    """ROUGE-1/2/L F1 (stemmed) of the first sentences of the generated summary."""
    from rouge_score import rouge_scorer

    summary = " ".join(sentences(results[0])[:SUMMARY_SENTENCES])
    scores = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True).score(doc["summary"], summary)
    return {key: value.fmeasure for key, value in scores.items()}


def answer_f1_em(doc: dict, results: list[str]) -> dict[str, float]:
    """SQuAD's F1 and exact match of the first line of the generated answer."""
    answer = results[0].strip().split("\n")[0]
    return {"f1": f1(answer, [doc["answer"]]), "exact_match": exact_match(answer, [doc["answer"]])}
