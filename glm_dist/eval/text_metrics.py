"""Scores of generated text against one reference each, for text-to-text fine-tuning (T5, BART):
exact match, SQuAD's token F1 (the official normalisation, ``data_pipeline/tasks/answers.py``),
ROUGE-L F-measure (Google's ``rouge-score``, with stemming, as the T5 and BART papers report it) and
corpus BLEU (``sacrebleu``'s 13a tokenisation). All are fractions in [0, 1] except BLEU (0-100, as
sacrebleu and the papers print it)."""

from __future__ import annotations

from data_pipeline.tasks.answers import f1 as best_f1


def text_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    import sacrebleu
    from rouge_score import rouge_scorer

    if len(predictions) != len(references) or not predictions:
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    n = len(predictions)
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return {
        "exact_match": sum(p.strip() == r.strip() for p, r in zip(predictions, references)) / n,
        "f1": sum(best_f1(p, [r]) for p, r in zip(predictions, references)) / n,
        "rougeL": sum(scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(predictions, references)) / n,
        "bleu": sacrebleu.corpus_bleu(predictions, [references]).score,
    }
